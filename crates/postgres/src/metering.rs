//! Usage metering rows (schema_v14.sql): a sample or a count is added to the session's row
//! and its owner's day in one transaction. The session's usage row is made first if it is
//! missing, then locked (`FOR UPDATE`), so two replicas sampling one session at once are
//! serialized and the second adds only the difference from the first's reading.

use std::collections::BTreeMap;

use async_trait::async_trait;
use deadpool_postgres::Transaction;
use tokio_postgres::types::ToSql;

use crate::runs::big;
use crate::{PgStore, col, execute, query, query_opt, unsigned, utc_day};
use sandboxd_core::store::metering::{
    Delta, MAX_USAGE_ROWS, MAX_USAGE_SESSIONS, ModelTokens, sample_delta,
};
use sandboxd_core::store::{
    Counted, DayUsage, Metering, Reading, SessionUsage, StoreError, UsageQuery, UsageTotals,
};

/// The last sample a new one goes on from: its container, CPU reading and time.
struct Last {
    container: Option<String>,
    cpu: Option<i64>,
    at: Option<i64>,
}

/// Makes the session's usage row if it is missing and locks it; its last sample.
async fn lock_row(
    tx: &Transaction<'_>,
    session: &str,
    owner: &str,
    now: i64,
) -> Result<Last, StoreError> {
    execute(
        tx,
        "INSERT INTO session_usage (session_id, owner, first_at_ms) VALUES ($1, $2, $3)
         ON CONFLICT (session_id) DO NOTHING",
        &[&session, &owner, &now],
    )
    .await?;
    let row = query_opt(
        tx,
        "SELECT cpu_container, cpu_reading_usec, sampled_at_ms FROM session_usage
         WHERE session_id = $1 FOR UPDATE",
        &[&session],
    )
    .await?;
    match row {
        Some(r) => Ok(Last {
            container: col(&r, 0)?,
            cpu: col(&r, 1)?,
            at: col(&r, 2)?,
        }),
        None => Ok(Last {
            container: None,
            cpu: None,
            at: None,
        }),
    }
}

/// Adds `d` to the (locked) session row and its owner's day of `now`; `sample` is the new
/// last sample, if this is one.
async fn add(
    tx: &Transaction<'_>,
    (session, owner): (&str, &str),
    d: &Delta,
    sample: Option<&Last>,
    now: i64,
) -> Result<(), StoreError> {
    let (container, reading, sampled_at) = match sample {
        Some(l) => (l.container.clone(), l.cpu, l.at),
        None => (None, None, None),
    };
    let (cpu, wall) = (big(d.cpu_usec), big(d.wall_ms));
    let (bin, bout, calls) = (big(d.bytes_in), big(d.bytes_out), big(d.tool_calls));
    let mem = d.memory_gib_seconds;
    execute(
        tx,
        "UPDATE session_usage SET
             sampled_at_ms = GREATEST(sampled_at_ms, $2),
             cpu_reading_usec = COALESCE($3, cpu_reading_usec),
             cpu_usec = cpu_usec + $4, memory_gib_secs = memory_gib_secs + $5,
             wall_ms = wall_ms + $6, bytes_in = bytes_in + $7, bytes_out = bytes_out + $8,
             tool_calls = tool_calls + $9,
             cpu_container = COALESCE($10, cpu_container)
         WHERE session_id = $1",
        &[
            &session,
            &sampled_at,
            &reading,
            &cpu,
            &mem,
            &wall,
            &bin,
            &bout,
            &calls,
            &container,
        ],
    )
    .await?;
    execute(
        tx,
        "INSERT INTO usage_days (owner, day, cpu_usec, memory_gib_secs, wall_ms, bytes_in,
             bytes_out, tool_calls)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (owner, day) DO UPDATE SET
             cpu_usec = usage_days.cpu_usec + excluded.cpu_usec,
             memory_gib_secs = usage_days.memory_gib_secs + excluded.memory_gib_secs,
             wall_ms = usage_days.wall_ms + excluded.wall_ms,
             bytes_in = usage_days.bytes_in + excluded.bytes_in,
             bytes_out = usage_days.bytes_out + excluded.bytes_out,
             tool_calls = usage_days.tool_calls + excluded.tool_calls",
        &[
            &owner,
            &utc_day(now),
            &cpu,
            &mem,
            &wall,
            &bin,
            &bout,
            &calls,
        ],
    )
    .await?;
    Ok(())
}

async fn add_tokens(
    tx: &Transaction<'_>,
    (session, owner): (&str, &str),
    model: &str,
    c: &Counted,
    now: i64,
) -> Result<(), StoreError> {
    let (tin, tout) = (big(c.tokens_in), big(c.tokens_out));
    execute(
        tx,
        "INSERT INTO session_usage_tokens (session_id, model, tokens_in, tokens_out)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (session_id, model) DO UPDATE SET
             tokens_in = session_usage_tokens.tokens_in + excluded.tokens_in,
             tokens_out = session_usage_tokens.tokens_out + excluded.tokens_out",
        &[&session, &model, &tin, &tout],
    )
    .await?;
    execute(
        tx,
        "INSERT INTO usage_day_tokens (owner, day, model, tokens_in, tokens_out)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (owner, day, model) DO UPDATE SET
             tokens_in = usage_day_tokens.tokens_in + excluded.tokens_in,
             tokens_out = usage_day_tokens.tokens_out + excluded.tokens_out",
        &[&owner, &utc_day(now), &model, &tin, &tout],
    )
    .await?;
    Ok(())
}

/// The totals columns of both tables, from column `at` on.
fn totals(r: &tokio_postgres::Row, at: usize) -> Result<UsageTotals, StoreError> {
    Ok(UsageTotals {
        cpu_seconds: unsigned(col(r, at)?) as f64 / 1e6,
        memory_gib_seconds: col(r, at + 1)?,
        wall_seconds: unsigned(col(r, at + 2)?) as f64 / 1e3,
        bytes_in: unsigned(col(r, at + 3)?),
        bytes_out: unsigned(col(r, at + 4)?),
        tool_calls: unsigned(col(r, at + 5)?),
        tokens: Vec::new(),
    })
}

/// Token rows `(key, model, in, out)` by key.
fn token_rows(
    rows: &[tokio_postgres::Row],
) -> Result<BTreeMap<String, Vec<ModelTokens>>, StoreError> {
    let mut out: BTreeMap<String, Vec<ModelTokens>> = BTreeMap::new();
    for r in rows {
        out.entry(col(r, 0)?).or_default().push(ModelTokens {
            model: col(r, 1)?,
            tokens_in: unsigned(col(r, 2)?),
            tokens_out: unsigned(col(r, 3)?),
        });
    }
    Ok(out)
}

const TOTALS: &str = "cpu_usec, memory_gib_secs, wall_ms, bytes_in, bytes_out, tool_calls";

#[async_trait]
impl Metering for PgStore {
    async fn meter_sample(&self, runtime_id: &str, r: &Reading) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(crate::sql)?;
        let row = query_opt(
            &tx,
            "SELECT id, owner, created_at FROM sessions WHERE runtime_id = $1
             ORDER BY created_at DESC LIMIT 1",
            &[&runtime_id],
        )
        .await?;
        let Some(row) = row else {
            return Ok(false);
        };
        let (session, owner, created): (String, String, i64) =
            (col(&row, 0)?, col(&row, 1)?, col(&row, 2)?);
        let last = lock_row(&tx, &session, &owner, r.at).await?;
        let since = last.at.unwrap_or(created);
        let before = match (&last.container, last.cpu) {
            (Some(c), Some(cpu)) => Some((c.as_str(), unsigned(cpu))),
            _ => None,
        };
        if let Some(d) = sample_delta(before, since, r) {
            // The new last sample: this reading's container and counter, if it read one.
            let next = Last {
                container: r.cpu_usec.map(|_| r.container.clone()),
                cpu: r.cpu_usec.map(big),
                at: Some(r.at.max(since)),
            };
            add(&tx, (&session, &owner), &d, Some(&next), r.at).await?;
        }
        tx.commit().await.map_err(crate::sql)?;
        Ok(true)
    }

    async fn meter_count(
        &self,
        session_id: &str,
        counted: &Counted,
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(crate::sql)?;
        let row = query_opt(
            &tx,
            "SELECT owner FROM sessions WHERE id = $1",
            &[&session_id],
        )
        .await?;
        let Some(row) = row else {
            return Ok(false);
        };
        let owner: String = col(&row, 0)?;
        lock_row(&tx, session_id, &owner, now).await?;
        add(&tx, (session_id, &owner), &counted.delta(), None, now).await?;
        if let Some(model) = counted.model_bounded()
            && (counted.tokens_in > 0 || counted.tokens_out > 0)
        {
            add_tokens(&tx, (session_id, &owner), &model, counted, now).await?;
        }
        tx.commit().await.map_err(crate::sql)?;
        Ok(true)
    }

    async fn usage_days(&self, q: &UsageQuery) -> Result<Vec<DayUsage>, StoreError> {
        let (from, to) = (utc_day(q.from), utc_day(q.to));
        let limit = i64::from(q.limit.clamp(1, MAX_USAGE_ROWS));
        let all = q.owner.is_none();
        let owner = q.owner.clone().unwrap_or_default();
        let filter = "($1 OR owner = $2) AND day >= $3 AND day <= $4";
        let args: [&(dyn ToSql + Sync); 4] = [&all, &owner, &from, &to];
        let c = self.client().await?;
        let text = format!(
            "SELECT owner, day, {TOTALS} FROM usage_days WHERE {filter}
             ORDER BY day, owner LIMIT $5"
        );
        let rows = query(&c, &text, &[&all, &owner, &from, &to, &limit]).await?;
        let text = format!(
            "SELECT owner || ' ' || day, model, tokens_in, tokens_out FROM usage_day_tokens
             WHERE {filter} ORDER BY model"
        );
        let mut tokens = token_rows(&query(&c, &text, &args).await?)?;
        rows.iter()
            .map(|r| {
                let (owner, day): (String, String) = (col(r, 0)?, col(r, 1)?);
                let mut totals = totals(r, 2)?;
                totals.tokens = tokens.remove(&format!("{owner} {day}")).unwrap_or_default();
                Ok(DayUsage { owner, day, totals })
            })
            .collect()
    }

    async fn usage_sessions(&self, q: &UsageQuery) -> Result<Vec<SessionUsage>, StoreError> {
        let limit = i64::from(q.limit.clamp(1, MAX_USAGE_SESSIONS));
        let all = q.owner.is_none();
        let owner = q.owner.clone().unwrap_or_default();
        let args: [&(dyn ToSql + Sync); 4] = [&all, &owner, &q.from, &q.to];
        let c = self.client().await?;
        let text = format!(
            "SELECT session_id, owner, first_at_ms, {TOTALS} FROM session_usage
             WHERE ($1 OR owner = $2) AND first_at_ms >= $3 AND first_at_ms <= $4
             ORDER BY first_at_ms, session_id LIMIT $5"
        );
        let rows = query(&c, &text, &[&all, &owner, &q.from, &q.to, &limit]).await?;
        let text = "SELECT t.session_id, t.model, t.tokens_in, t.tokens_out
             FROM session_usage_tokens t JOIN session_usage s ON s.session_id = t.session_id
             WHERE ($1 OR s.owner = $2) AND s.first_at_ms >= $3 AND s.first_at_ms <= $4
             ORDER BY t.model";
        let mut tokens = token_rows(&query(&c, text, &args).await?)?;
        rows.iter()
            .map(|r| {
                let session_id: String = col(r, 0)?;
                let mut totals = totals(r, 3)?;
                totals.tokens = tokens.remove(&session_id).unwrap_or_default();
                Ok(SessionUsage {
                    session_id,
                    owner: col(r, 1)?,
                    first_at: col(r, 2)?,
                    totals,
                })
            })
            .collect()
    }
}
