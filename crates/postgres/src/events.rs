//! The `events` and `images` tables, and the conversation and token counters of the runs
//! API. An event is committed with its run's patch (and, for a model answer, the owner's
//! daily token count) in one statement, a function of schema_v9.sql that holds the run's row
//! lock, so each seq is committed once, in order, and a reader that sees `last_seq = n`
//! finds events 1..n.

use deadpool_postgres::GenericClient;

use crate::runs::{PatchArgs, big};
use crate::{col, corrupt, execute, query, query_opt, unsigned, utc_day, wakes};
use sandboxd_core::store::{Appended, RunPatch, StoreError, StoredEvent};

/// Commits the event and the patch, and wakes the run's followers on every replica; the seq
/// must follow the run's last one, and the run must be in flight and driven by `driver`,
/// whose lease is live. One statement, so one round trip: `sandboxd_append_event`
/// (schema_v9.sql) takes the run's row lock, checks the fence and the seq, inserts, patches
/// (`sandboxd_patch_run`, as `patch_run` does), counts the owner's tokens when the patch
/// says so, and notifies, in the statement's transaction; a racing writer (or a takeover)
/// waits on the row lock and then sees the new `last_seq` (or driver). Its answer names the
/// check that refused, mapped here to the errors the separate statements gave.
pub(crate) async fn append(
    c: &impl GenericClient,
    run_id: &str,
    driver: &str,
    ev: &StoredEvent,
    p: &RunPatch,
) -> Result<Appended, StoreError> {
    let a = PatchArgs::of(p)?;
    let row = query_opt(
        c,
        "SELECT o_status, o_last, o_owner_tokens FROM sandboxd_append_event(
            $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
        &[
            &run_id,
            &driver,
            &big(ev.seq),
            &ev.time,
            &ev.kind,
            &ev.payload,
            &a.state,
            &a.outcome,
            &p.answer,
            &a.steps,
            &a.add_input,
            &a.add_output,
            &a.set_question,
            &a.question,
            &p.started_at,
            &p.ended_at,
            &wakes::CHANNEL,
            &p.count_owner_tokens,
            &utc_day(ev.time),
        ],
    )
    .await?;
    let Some(row) = row else {
        return Err(corrupt(
            "event append",
            "the append function returned no row",
        ));
    };
    let status: String = col(&row, 0)?;
    match status.as_str() {
        "ok" => {
            let tokens: Option<i64> = col(&row, 2)?;
            Ok(Appended {
                owner_tokens_today: tokens.map(unsigned),
            })
        }
        "no_run" => Err(StoreError::Sql(format!("no run {run_id} to append to"))),
        "fenced" => Err(StoreError::Fenced {
            run_id: run_id.to_string(),
            driver: driver.to_string(),
        }),
        "seq" => {
            let last: Option<i64> = col(&row, 1)?;
            Err(StoreError::Corrupt {
                what: "event sequence",
                message: format!(
                    "run {run_id}: seq {} after {}",
                    ev.seq,
                    unsigned(last.unwrap_or(0))
                ),
            })
        }
        other => Err(corrupt("event append", format!("unknown answer {other:?}"))),
    }
}

pub(crate) async fn after(
    c: &impl GenericClient,
    run_id: &str,
    after: u64,
    limit: u32,
) -> Result<Vec<StoredEvent>, StoreError> {
    let rows = query(
        c,
        "SELECT seq, time, kind, payload FROM events WHERE run_id = $1 AND seq > $2
         ORDER BY seq LIMIT $3",
        &[
            &run_id,
            &(after.min(i64::MAX as u64) as i64),
            &i64::from(limit),
        ],
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok(StoredEvent {
                seq: unsigned(col(r, 0)?),
                time: col(r, 1)?,
                kind: col(r, 2)?,
                payload: col(r, 3)?,
            })
        })
        .collect()
}

/// Keeps the image once per run and id: a second put of the same id changes nothing.
pub(crate) async fn put_image(
    c: &impl GenericClient,
    run_id: &str,
    id: &str,
    media_type: &str,
    data: &[u8],
) -> Result<(), StoreError> {
    execute(
        c,
        "INSERT INTO images (run_id, id, media_type, data) VALUES ($1, $2, $3, $4)
         ON CONFLICT (run_id, id) DO NOTHING",
        &[&run_id, &id, &media_type, &data],
    )
    .await?;
    Ok(())
}

pub(crate) async fn image(
    c: &impl GenericClient,
    run_id: &str,
    id: &str,
) -> Result<Option<(String, Vec<u8>)>, StoreError> {
    let row = query_opt(
        c,
        "SELECT media_type, data FROM images WHERE run_id = $1 AND id = $2",
        &[&run_id, &id],
    )
    .await?;
    row.map(|r| Ok((col(&r, 0)?, col(&r, 1)?))).transpose()
}

pub(crate) async fn conversation(
    c: &impl GenericClient,
    session_id: &str,
) -> Result<Option<String>, StoreError> {
    let row = query_opt(
        c,
        "SELECT messages FROM conversations WHERE session_id = $1",
        &[&session_id],
    )
    .await?;
    row.map(|r| col(&r, 0)).transpose()
}

pub(crate) async fn set_conversation(
    c: &impl GenericClient,
    session_id: &str,
    messages: &str,
    now: i64,
) -> Result<(), StoreError> {
    execute(
        c,
        "INSERT INTO conversations (session_id, messages, updated_at) VALUES ($1, $2, $3)
         ON CONFLICT (session_id) DO UPDATE SET messages = excluded.messages, updated_at = excluded.updated_at",
        &[&session_id, &messages, &now],
    )
    .await?;
    Ok(())
}

/// Adds to the owner's input tokens of the UTC day of `now`; the day's new total. One
/// statement: concurrent adds serialise on the row and lose nothing.
pub(crate) async fn add_input_tokens(
    c: &impl GenericClient,
    owner: &str,
    tokens: u64,
    now: i64,
) -> Result<u64, StoreError> {
    let row = query_opt(
        c,
        "INSERT INTO token_usage (owner, day, input_tokens) VALUES ($1, $2, $3)
         ON CONFLICT (owner, day) DO UPDATE SET input_tokens = token_usage.input_tokens + excluded.input_tokens
         RETURNING input_tokens",
        &[&owner, &utc_day(now), &(tokens.min(i64::MAX as u64) as i64)],
    )
    .await?;
    let total: i64 = match row {
        Some(r) => col(&r, 0)?,
        None => 0,
    };
    Ok(unsigned(total))
}
