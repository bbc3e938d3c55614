//! Usage metering rows (schema_v15.sql): a sample or a count is added to the session's row
//! and its owner's day in one write transaction (SQLite's one writer serializes two samples
//! of one session, so the second adds only its difference).

use std::collections::BTreeMap;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::{SqliteStore, sql, utc_day};
use sandboxd_core::store::metering::{
    Delta, MAX_USAGE_ROWS, MAX_USAGE_SESSIONS, ModelTokens, sample_delta,
};
use sandboxd_core::store::{
    Counted, DayUsage, Metering, Reading, SessionUsage, StoreError, UsageQuery, UsageTotals,
};

/// A stored counter as the unsigned number it is; the store only ever adds to them.
fn unsigned(v: i64) -> u64 {
    v.max(0) as u64
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The last sample a new one goes on from: its container, CPU reading and time.
struct Last {
    container: Option<String>,
    cpu: Option<i64>,
    at: i64,
}

/// Adds `d` to the session's row (made at its first measure) and to its owner's day of
/// `now`; `sample` is the new last sample, if this is one.
fn add(
    tx: &Transaction<'_>,
    (session, owner): (&str, &str),
    d: &Delta,
    sample: Option<&Last>,
    now: i64,
) -> Result<(), StoreError> {
    let (container, reading, sampled_at) = match sample {
        Some(l) => (l.container.clone(), l.cpu, Some(l.at)),
        None => (None, None, None),
    };
    let (cpu, wall) = (signed(d.cpu_usec), signed(d.wall_ms));
    let (bin, bout, calls) = (
        signed(d.bytes_in),
        signed(d.bytes_out),
        signed(d.tool_calls),
    );
    let mem = d.memory_gib_seconds;
    tx.execute(
        "INSERT INTO session_usage (session_id, owner, first_at_ms, sampled_at_ms, cpu_reading_usec,
             cpu_usec, memory_gib_secs, wall_ms, bytes_in, bytes_out, tool_calls, cpu_container)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT (session_id) DO UPDATE SET
             sampled_at_ms = COALESCE(MAX(sampled_at_ms, excluded.sampled_at_ms),
                                      sampled_at_ms, excluded.sampled_at_ms),
             cpu_container = COALESCE(excluded.cpu_container, cpu_container),
             cpu_reading_usec = COALESCE(excluded.cpu_reading_usec, cpu_reading_usec),
             cpu_usec = cpu_usec + excluded.cpu_usec,
             memory_gib_secs = memory_gib_secs + excluded.memory_gib_secs,
             wall_ms = wall_ms + excluded.wall_ms,
             bytes_in = bytes_in + excluded.bytes_in,
             bytes_out = bytes_out + excluded.bytes_out,
             tool_calls = tool_calls + excluded.tool_calls",
        params![
            session, owner, now, sampled_at, reading, cpu, mem, wall, bin, bout, calls, container
        ],
    )
    .map_err(sql)?;
    tx.execute(
        "INSERT INTO usage_days (owner, day, cpu_usec, memory_gib_secs, wall_ms, bytes_in,
             bytes_out, tool_calls)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (owner, day) DO UPDATE SET
             cpu_usec = cpu_usec + excluded.cpu_usec,
             memory_gib_secs = memory_gib_secs + excluded.memory_gib_secs,
             wall_ms = wall_ms + excluded.wall_ms,
             bytes_in = bytes_in + excluded.bytes_in,
             bytes_out = bytes_out + excluded.bytes_out,
             tool_calls = tool_calls + excluded.tool_calls",
        params![owner, utc_day(now), cpu, mem, wall, bin, bout, calls],
    )
    .map_err(sql)?;
    Ok(())
}

fn add_tokens(
    tx: &Transaction<'_>,
    (session, owner): (&str, &str),
    model: &str,
    (tin, tout): (u64, u64),
    now: i64,
) -> Result<(), StoreError> {
    let (tin, tout) = (signed(tin), signed(tout));
    tx.execute(
        "INSERT INTO session_usage_tokens (session_id, model, tokens_in, tokens_out)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (session_id, model) DO UPDATE SET
             tokens_in = tokens_in + excluded.tokens_in,
             tokens_out = tokens_out + excluded.tokens_out",
        params![session, model, tin, tout],
    )
    .map_err(sql)?;
    tx.execute(
        "INSERT INTO usage_day_tokens (owner, day, model, tokens_in, tokens_out)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (owner, day, model) DO UPDATE SET
             tokens_in = tokens_in + excluded.tokens_in,
             tokens_out = tokens_out + excluded.tokens_out",
        params![owner, utc_day(now), model, tin, tout],
    )
    .map_err(sql)?;
    Ok(())
}

fn sample(tx: &Transaction<'_>, runtime_id: &str, r: &Reading) -> Result<bool, StoreError> {
    let row: Option<(String, String, i64)> = tx
        .query_row(
            "SELECT id, owner, created_at FROM sessions WHERE runtime_id = ?1
             ORDER BY created_at DESC LIMIT 1",
            [runtime_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(sql)?;
    let Some((session, owner, created)) = row else {
        return Ok(false);
    };
    let last: Option<Last> = tx
        .query_row(
            "SELECT cpu_container, cpu_reading_usec, sampled_at_ms FROM session_usage
             WHERE session_id = ?1",
            [&session],
            |row| {
                Ok(Last {
                    container: row.get(0)?,
                    cpu: row.get(1)?,
                    at: row.get::<_, Option<i64>>(2)?.unwrap_or(created),
                })
            },
        )
        .optional()
        .map_err(sql)?;
    let last = last.unwrap_or(Last {
        container: None,
        cpu: None,
        at: created,
    });
    let before = match (&last.container, last.cpu) {
        (Some(c), Some(cpu)) => Some((c.as_str(), unsigned(cpu))),
        _ => None,
    };
    let Some(d) = sample_delta(before, last.at, r) else {
        return Ok(true);
    };
    // The new last sample: this reading's container and counter, if it read one.
    let next = match r.cpu_usec {
        Some(cpu) => Last {
            container: Some(r.container.clone()),
            cpu: Some(signed(cpu)),
            at: r.at.max(last.at),
        },
        None => Last {
            at: r.at.max(last.at),
            ..last
        },
    };
    add(tx, (&session, &owner), &d, Some(&next), r.at)?;
    Ok(true)
}

fn count(tx: &Transaction<'_>, session: &str, c: &Counted, now: i64) -> Result<bool, StoreError> {
    let owner: Option<String> = tx
        .query_row("SELECT owner FROM sessions WHERE id = ?1", [session], |r| {
            r.get(0)
        })
        .optional()
        .map_err(sql)?;
    let Some(owner) = owner else {
        return Ok(false);
    };
    add(tx, (session, &owner), &c.delta(), None, now)?;
    if let Some(model) = c.model_bounded()
        && (c.tokens_in > 0 || c.tokens_out > 0)
    {
        add_tokens(
            tx,
            (session, &owner),
            &model,
            (c.tokens_in, c.tokens_out),
            now,
        )?;
    }
    Ok(true)
}

/// The totals columns of both tables, from column `at` on.
fn totals(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<UsageTotals> {
    Ok(UsageTotals {
        cpu_seconds: unsigned(r.get(at)?) as f64 / 1e6,
        memory_gib_seconds: r.get(at + 1)?,
        wall_seconds: unsigned(r.get(at + 2)?) as f64 / 1e3,
        bytes_in: unsigned(r.get(at + 3)?),
        bytes_out: unsigned(r.get(at + 4)?),
        tool_calls: unsigned(r.get(at + 5)?),
        tokens: Vec::new(),
    })
}

/// `(key, model, in, out)` rows of a token query, by key.
type TokenRows = BTreeMap<(String, String), Vec<ModelTokens>>;

fn token_rows(
    c: &Connection,
    text: &str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<TokenRows, StoreError> {
    let mut st = c.prepare(text).map_err(sql)?;
    let rows = st
        .query_map(args, |r| {
            Ok((
                (r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                ModelTokens {
                    model: r.get(2)?,
                    tokens_in: unsigned(r.get(3)?),
                    tokens_out: unsigned(r.get(4)?),
                },
            ))
        })
        .map_err(sql)?;
    let mut out = TokenRows::new();
    for row in rows {
        let (key, tokens) = row.map_err(sql)?;
        out.entry(key).or_default().push(tokens);
    }
    Ok(out)
}

const TOTALS: &str = "cpu_usec, memory_gib_secs, wall_ms, bytes_in, bytes_out, tool_calls";

fn days(c: &Connection, q: &UsageQuery) -> Result<Vec<DayUsage>, StoreError> {
    let (from, to) = (utc_day(q.from), utc_day(q.to));
    let limit = i64::from(q.limit.clamp(1, MAX_USAGE_ROWS));
    let owner = q.owner.clone().unwrap_or_default();
    let all = q.owner.is_none();
    let filter = "(?1 OR owner = ?2) AND day >= ?3 AND day <= ?4";
    let text = format!(
        "SELECT owner, day, {TOTALS} FROM usage_days WHERE {filter} ORDER BY day, owner LIMIT ?5"
    );
    let mut st = c.prepare(&text).map_err(sql)?;
    let mut rows = st
        .query_map(params![all, owner, from, to, limit], |r| {
            Ok(DayUsage {
                owner: r.get(0)?,
                day: r.get(1)?,
                totals: totals(r, 2)?,
            })
        })
        .map_err(sql)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql)?;
    let text = format!(
        "SELECT owner, day, model, tokens_in, tokens_out FROM usage_day_tokens
         WHERE {filter} ORDER BY model"
    );
    let mut tokens = token_rows(c, &text, &[&all, &owner, &from, &to])?;
    for d in &mut rows {
        d.totals.tokens = tokens
            .remove(&(d.owner.clone(), d.day.clone()))
            .unwrap_or_default();
    }
    Ok(rows)
}

fn sessions(c: &Connection, q: &UsageQuery) -> Result<Vec<SessionUsage>, StoreError> {
    let limit = i64::from(q.limit.clamp(1, MAX_USAGE_SESSIONS));
    let owner = q.owner.clone().unwrap_or_default();
    let all = q.owner.is_none();
    let filter = "(?1 OR owner = ?2) AND first_at_ms >= ?3 AND first_at_ms <= ?4";
    let text = format!(
        "SELECT session_id, owner, first_at_ms, {TOTALS} FROM session_usage WHERE {filter}
         ORDER BY first_at_ms, session_id LIMIT ?5"
    );
    let mut st = c.prepare(&text).map_err(sql)?;
    let mut rows = st
        .query_map(params![all, owner, q.from, q.to, limit], |r| {
            Ok(SessionUsage {
                session_id: r.get(0)?,
                owner: r.get(1)?,
                first_at: r.get(2)?,
                totals: totals(r, 3)?,
            })
        })
        .map_err(sql)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql)?;
    let text = format!(
        "SELECT t.session_id, '', t.model, t.tokens_in, t.tokens_out
         FROM session_usage_tokens t JOIN session_usage s ON s.session_id = t.session_id
         WHERE {} ORDER BY t.model",
        filter
            .replace("owner", "s.owner")
            .replace("first_at_ms", "s.first_at_ms")
    );
    let mut tokens = token_rows(c, &text, &[&all, &owner, &q.from, &q.to])?;
    for s in &mut rows {
        s.totals.tokens = tokens
            .remove(&(s.session_id.clone(), String::new()))
            .unwrap_or_default();
    }
    Ok(rows)
}

#[async_trait]
impl Metering for SqliteStore {
    async fn meter_sample(&self, runtime_id: &str, reading: &Reading) -> Result<bool, StoreError> {
        let (runtime_id, reading) = (runtime_id.to_string(), reading.clone());
        self.write(move |tx| sample(tx, &runtime_id, &reading))
            .await
    }

    async fn meter_count(
        &self,
        session_id: &str,
        counted: &Counted,
        now: i64,
    ) -> Result<bool, StoreError> {
        let (session, counted) = (session_id.to_string(), counted.clone());
        self.write(move |tx| count(tx, &session, &counted, now))
            .await
    }

    async fn usage_days(&self, q: &UsageQuery) -> Result<Vec<DayUsage>, StoreError> {
        let q = q.clone();
        self.read(move |c| days(c, &q)).await
    }

    async fn usage_sessions(&self, q: &UsageQuery) -> Result<Vec<SessionUsage>, StoreError> {
        let q = q.clone();
        self.read(move |c| sessions(c, &q)).await
    }
}
