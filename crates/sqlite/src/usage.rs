//! What a user is using (quotas, the admin's view) and retention.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::{sql, utc_day};
use sandboxd_core::store::{StoreError, Usage};

pub(super) fn usage(c: &Connection, owner: &str, now: i64) -> Result<Usage, StoreError> {
    let day = utc_day(now);
    let count = |q: &str| -> Result<u32, StoreError> {
        c.query_row(q, [owner], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u32)
            .map_err(sql)
    };
    let active_sessions =
        count("SELECT COUNT(*) FROM sessions WHERE owner = ?1 AND state != 'ended'")?;
    let active_mcp_sessions = count(
        "SELECT COUNT(*) FROM sessions WHERE owner = ?1 AND state != 'ended' AND kind = 'mcp'",
    )?;
    let active_runs = count(
        "SELECT COUNT(*) FROM runs WHERE owner = ?1 AND state IN ('queued', 'running', 'waiting_for_human')",
    )?;
    let tokens: Option<i64> = c
        .query_row(
            "SELECT input_tokens FROM token_usage WHERE owner = ?1 AND day = ?2",
            params![owner, day],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql)?;
    Ok(Usage {
        active_sessions,
        active_mcp_sessions,
        active_runs,
        input_tokens_today: tokens.unwrap_or(0).max(0) as u64,
    })
}

pub(super) fn purge_before(tx: &Transaction<'_>, cutoff: i64) -> Result<u64, StoreError> {
    let runs = tx
        .execute(
            "DELETE FROM runs WHERE ended_at IS NOT NULL AND ended_at < ?1",
            [cutoff],
        )
        .map_err(sql)?;
    let sessions = tx
        .execute(
            "DELETE FROM sessions WHERE state = 'ended' AND ended_at < ?1",
            [cutoff],
        )
        .map_err(sql)?;
    Ok((runs + sessions) as u64)
}
