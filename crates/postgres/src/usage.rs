//! What a user is using (quotas, the admin's view) and retention.

use deadpool_postgres::GenericClient;

use crate::{col, execute, query, unsigned, utc_day};
use sandboxd_core::store::{StoreError, Usage};

/// The owner's live sessions (of them, the /mcp ones), runs in flight and input tokens of
/// the UTC day of `now`, read in one statement (one snapshot).
pub(crate) async fn usage(
    c: &impl GenericClient,
    owner: &str,
    now: i64,
) -> Result<Usage, StoreError> {
    let rows = query(
        c,
        "SELECT
            (SELECT COUNT(*) FROM sessions WHERE owner = $1 AND state != 'ended'),
            (SELECT COUNT(*) FROM sessions WHERE owner = $1 AND state != 'ended' AND kind = 'mcp'),
            (SELECT COUNT(*) FROM runs WHERE owner = $1 AND state IN ('queued', 'running', 'waiting_for_human')),
            (SELECT COALESCE(MAX(input_tokens), 0) FROM token_usage WHERE owner = $1 AND day = $2)",
        &[&owner, &utc_day(now)],
    )
    .await?;
    let Some(r) = rows.first() else {
        return Ok(Usage::default());
    };
    let count = |i: usize| -> Result<u32, StoreError> {
        Ok(col::<i64>(r, i)?.clamp(0, i64::from(u32::MAX)) as u32)
    };
    Ok(Usage {
        active_sessions: count(0)?,
        active_mcp_sessions: count(1)?,
        active_runs: count(2)?,
        input_tokens_today: unsigned(col(r, 3)?),
    })
}

/// Deletes finished runs and ended sessions that ended before `cutoff` (with what cascades
/// from them); how many runs and sessions went. Runs in a transaction.
pub(crate) async fn purge_before(c: &impl GenericClient, cutoff: i64) -> Result<u64, StoreError> {
    let runs = execute(
        c,
        "DELETE FROM runs WHERE ended_at IS NOT NULL AND ended_at < $1",
        &[&cutoff],
    )
    .await?;
    let sessions = execute(
        c,
        "DELETE FROM sessions WHERE state = 'ended' AND ended_at < $1",
        &[&cutoff],
    )
    .await?;
    Ok(runs + sessions)
}
