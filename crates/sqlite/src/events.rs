//! The `events` and `images` tables, and the conversation and token counters of the
//! runs API. An event is committed with its run's patch in one transaction, so a reader
//! that sees `last_seq = n` finds events 1..n.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::{runs, sql, utc_day};
use sandboxd_core::store::{Appended, RunPatch, StoreError, StoredEvent};

/// Commits the event and the patch; the seq must follow the run's last one, and the run must
/// be in flight and driven by `driver`, whose lease is live (`runs::fence`). With
/// `count_owner_tokens` the owner's input tokens of the event's day grow in the same
/// transaction.
pub(super) fn append(
    tx: &Transaction<'_>,
    run_id: &str,
    driver: &str,
    ev: &StoredEvent,
    p: &RunPatch,
) -> Result<Appended, StoreError> {
    let run: Option<(i64, String)> = tx
        .query_row(
            "SELECT last_seq, owner FROM runs WHERE id = ?1",
            [run_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql)?;
    let Some((last, owner)) = run else {
        return Err(StoreError::Sql(format!("no run {run_id} to append to")));
    };
    runs::fence(tx, run_id, driver)?;
    if ev.seq != last.max(0) as u64 + 1 {
        return Err(StoreError::Corrupt {
            what: "event sequence",
            message: format!("run {run_id}: seq {} after {last}", ev.seq),
        });
    }
    tx.execute(
        "INSERT INTO events (run_id, seq, time, kind, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![run_id, ev.seq as i64, ev.time, ev.kind, ev.payload],
    )
    .map_err(sql)?;
    runs::patch(tx, run_id, Some(ev.seq), p)?;
    let owner_tokens_today = if p.count_owner_tokens {
        Some(add_input_tokens(tx, &owner, p.add_input_tokens, ev.time)?)
    } else {
        None
    };
    Ok(Appended { owner_tokens_today })
}

pub(super) fn after(
    c: &Connection,
    run_id: &str,
    after: u64,
    limit: u32,
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut st = c
        .prepare(
            "SELECT seq, time, kind, payload FROM events WHERE run_id = ?1 AND seq > ?2
             ORDER BY seq LIMIT ?3",
        )
        .map_err(sql)?;
    let rows = st
        .query_map(
            params![run_id, after.min(i64::MAX as u64) as i64, limit as i64],
            |r| {
                Ok(StoredEvent {
                    seq: r.get::<_, i64>(0)?.max(0) as u64,
                    time: r.get(1)?,
                    kind: r.get(2)?,
                    payload: r.get(3)?,
                })
            },
        )
        .map_err(sql)?;
    rows.collect::<Result<_, _>>().map_err(sql)
}

pub(super) fn put_image(
    tx: &Transaction<'_>,
    run_id: &str,
    id: &str,
    media_type: &str,
    data: &[u8],
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT OR IGNORE INTO images (run_id, id, media_type, data) VALUES (?1, ?2, ?3, ?4)",
        params![run_id, id, media_type, data],
    )
    .map_err(sql)?;
    Ok(())
}

pub(super) fn image(
    c: &Connection,
    run_id: &str,
    id: &str,
) -> Result<Option<(String, Vec<u8>)>, StoreError> {
    c.query_row(
        "SELECT media_type, data FROM images WHERE run_id = ?1 AND id = ?2",
        params![run_id, id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
    .map_err(sql)
}

pub(super) fn conversation(c: &Connection, session_id: &str) -> Result<Option<String>, StoreError> {
    c.query_row(
        "SELECT messages FROM conversations WHERE session_id = ?1",
        [session_id],
        |r| r.get(0),
    )
    .optional()
    .map_err(sql)
}

pub(super) fn set_conversation(
    tx: &Transaction<'_>,
    session_id: &str,
    messages: &str,
    now: i64,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO conversations (session_id, messages, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (session_id) DO UPDATE SET messages = excluded.messages, updated_at = excluded.updated_at",
        params![session_id, messages, now],
    )
    .map_err(sql)?;
    Ok(())
}

/// Adds to the owner's input tokens of the UTC day of `now`; the day's new total.
pub(super) fn add_input_tokens(
    tx: &Transaction<'_>,
    owner: &str,
    tokens: u64,
    now: i64,
) -> Result<u64, StoreError> {
    let day = utc_day(now);
    tx.execute(
        "INSERT INTO token_usage (owner, day, input_tokens) VALUES (?1, ?2, ?3)
         ON CONFLICT (owner, day) DO UPDATE SET input_tokens = input_tokens + excluded.input_tokens",
        params![owner, day, tokens.min(i64::MAX as u64) as i64],
    )
    .map_err(sql)?;
    let total: i64 = tx
        .query_row(
            "SELECT input_tokens FROM token_usage WHERE owner = ?1 AND day = ?2",
            params![owner, day],
            |r| r.get(0),
        )
        .map_err(sql)?;
    Ok(total.max(0) as u64)
}
