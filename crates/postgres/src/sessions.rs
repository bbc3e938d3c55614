//! The `sessions` table: one row-mapping helper (`select`), the quota-checked reservation and
//! the statements of the other session methods.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::{
    Args, arg_refs, col, corrupt, execute, page_split, page_tail, query, to_json, unsigned,
};
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::store::{
    SessionCaps, SessionEnv, SessionKind, SessionPage, SessionQuery, SessionRow, SessionState,
    StoreError,
};

const COLS: &str = "rowid, id, owner, state, limits, metadata, idle_timeout_secs, runtime_id, container_id, created_at, last_used_at, ended_at, end_reason, kind, egress, template, snapshot, env";

/// The advisory-lock class of an owner's session cap (the second key is the owner's hash).
const SESSION_CAP_LOCK: i32 = 1;
/// The advisory-lock class of the global session cap (one key, 0): taken before any owner's,
/// so every reservation takes the two in the same order.
const SESSION_TOTAL_LOCK: i32 = 3;

fn from_row(r: &Row) -> Result<(i64, SessionRow), StoreError> {
    let state: String = col(r, 3)?;
    let limits: String = col(r, 4)?;
    let metadata: String = col(r, 5)?;
    let kind: String = col(r, 13)?;
    let egress: String = col(r, 14)?;
    let env: Option<String> = col(r, 17)?;
    let row = SessionRow {
        id: col(r, 1)?,
        owner: col(r, 2)?,
        state: SessionState::parse(&state).ok_or_else(|| corrupt("session state", &state))?,
        kind: SessionKind::parse(&kind).ok_or_else(|| corrupt("session kind", &kind))?,
        limits: serde_json::from_str(&limits).map_err(|e| corrupt("session limits", e))?,
        metadata: serde_json::from_str(&metadata).map_err(|e| corrupt("session metadata", e))?,
        idle_timeout_secs: unsigned(col(r, 6)?),
        runtime_id: col(r, 7)?,
        container_id: col(r, 8)?,
        created_at: col(r, 9)?,
        last_used_at: col(r, 10)?,
        ended_at: col(r, 11)?,
        end_reason: col(r, 12)?,
        egress: EgressPolicy::parse(&egress).map_err(|e| corrupt("session egress", e))?,
        template: col(r, 15)?,
        snapshot: col(r, 16)?,
        env: SessionEnv::from_stored(env.as_deref())?,
    };
    Ok((col(r, 0)?, row))
}

/// The sessions matching `tail` with their rowids (the paging cursor), JSON decoded.
pub(crate) async fn select(
    c: &impl GenericClient,
    tail: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Vec<(i64, SessionRow)>, StoreError> {
    let rows = query(c, &format!("SELECT {COLS} FROM sessions {tail}"), args).await?;
    rows.iter().map(from_row).collect()
}

pub(crate) async fn one(
    c: &impl GenericClient,
    id: &str,
) -> Result<Option<SessionRow>, StoreError> {
    Ok(select(c, "WHERE id = $1", &[&id])
        .await?
        .into_iter()
        .next()
        .map(|(_, r)| r))
}

/// Takes the transaction-scoped lock of one owner's cap of class `class`: writers of that
/// owner's cap on every connection (and every replica) count and insert one at a time.
pub(crate) async fn lock_owner(
    c: &impl GenericClient,
    class: i32,
    owner: &str,
) -> Result<(), StoreError> {
    query(
        c,
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&class, &owner],
    )
    .await?;
    Ok(())
}

/// Counts the sessions that have not ended (those of `owner` only, if given).
async fn count_active(c: &impl GenericClient, owner: Option<&str>) -> Result<i64, StoreError> {
    let rows = query(
        c,
        "SELECT COUNT(*) FROM sessions WHERE state != 'ended' AND ($1::TEXT IS NULL OR owner = $1)",
        &[&owner],
    )
    .await?;
    match rows.first() {
        Some(r) => col(r, 0),
        None => Ok(0),
    }
}

/// Inserts a `creating` session unless every owner's together reach `caps.total` or its
/// owner's reach `caps.per_owner`, and records its first holder; runs in a transaction, under
/// the global cap lock and then the owner's.
pub(crate) async fn reserve(
    c: &impl GenericClient,
    row: &SessionRow,
    caps: &SessionCaps,
) -> Result<(), StoreError> {
    query(
        c,
        "SELECT pg_advisory_xact_lock($1, 0)",
        &[&SESSION_TOTAL_LOCK],
    )
    .await?;
    let all = count_active(c, None).await?;
    if all >= i64::from(caps.total) {
        return Err(StoreError::SessionsFull {
            limit: caps.total,
            active: all.min(i64::from(u32::MAX)) as u32,
        });
    }
    let max_active = caps.per_owner;
    lock_owner(c, SESSION_CAP_LOCK, &row.owner).await?;
    let active = count_active(c, Some(&row.owner)).await?;
    if active >= i64::from(max_active) {
        return Err(StoreError::SessionQuota {
            limit: max_active,
            active: active.min(i64::from(u32::MAX)) as u32,
        });
    }
    execute(
        c,
        "INSERT INTO sessions (id, owner, state, limits, metadata, idle_timeout_secs, created_at, last_used_at, kind, egress, template, env)
         VALUES ($1, $2, 'creating', $3, $4, $5, $6, $6, $7, $8, $9, $10)",
        &[
            &row.id,
            &row.owner,
            &to_json(&row.limits)?,
            &to_json(&row.metadata)?,
            &(row.idle_timeout_secs.min(i64::MAX as u64) as i64),
            &row.created_at,
            &row.kind.as_str(),
            &row.egress.to_string(),
            &row.template,
            &row.env.to_stored(),
        ],
    )
    .await?;
    if let Some(holder) = &caps.holder {
        add_holder(c, &row.id, holder).await?;
    }
    Ok(())
}

/// Ends the running session of `runtime_id` if it idled past its own timeout with no run in
/// flight: one statement, so of replicas reaping at once exactly one changes the row.
pub(crate) async fn end_idle(
    c: &impl GenericClient,
    runtime_id: &str,
    reason: &str,
    now: i64,
) -> Result<Option<String>, StoreError> {
    let sql = format!(
        "UPDATE sessions SET state = 'ended', env = NULL, ended_at = $2, end_reason = $3
         WHERE runtime_id = $1 AND state = 'running' AND snapshot IS NULL
           AND last_used_at + idle_timeout_secs * 1000 <= $2 AND NOT {RUN_IN_FLIGHT}
         RETURNING id"
    );
    let rows = query(c, &sql, &[&runtime_id, &now, &reason]).await?;
    rows.first().map(|r| col(r, 0)).transpose()
}

/// The runs that keep a session from idling out or hibernating.
const RUN_IN_FLIGHT: &str = "EXISTS (SELECT 1 FROM runs WHERE runs.session_id = sessions.id
     AND runs.state IN ('queued', 'running', 'waiting_for_human'))";

/// Hibernates the running session `id` (see `SessionSnapshots::hibernate_session`).
pub(crate) async fn hibernate(
    c: &impl GenericClient,
    id: &str,
    snapshot: &str,
    used_before: i64,
) -> Result<bool, StoreError> {
    let sql = format!(
        "UPDATE sessions SET snapshot = $2
         WHERE id = $1 AND state = 'running' AND snapshot IS NULL
           AND last_used_at <= $3 AND NOT {RUN_IN_FLIGHT}"
    );
    Ok(execute(c, &sql, &[&id, &snapshot, &used_before]).await? > 0)
}

/// Resumes the hibernated session `id` (see `SessionSnapshots::resume_session`).
pub(crate) async fn resume(
    c: &impl GenericClient,
    id: &str,
    snapshot: &str,
    container_id: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let n = execute(
        c,
        "UPDATE sessions SET snapshot = NULL, container_id = $3,
             last_used_at = GREATEST(last_used_at, $4)
         WHERE id = $1 AND state = 'running' AND snapshot = $2",
        &[&id, &snapshot, &container_id, &now],
    )
    .await?;
    Ok(n > 0)
}

/// Ends the hibernated sessions idle past their timeout; (id, snapshot) of each.
pub(crate) async fn end_idle_hibernated(
    c: &impl GenericClient,
    reason: &str,
    now: i64,
) -> Result<Vec<(String, String)>, StoreError> {
    let sql = format!(
        "UPDATE sessions SET state = 'ended', env = NULL, ended_at = $1, end_reason = $2
         WHERE state = 'running' AND snapshot IS NOT NULL
           AND last_used_at + idle_timeout_secs * 1000 <= $1 AND NOT {RUN_IN_FLIGHT}
         RETURNING id, snapshot"
    );
    let rows = query(c, &sql, &[&now, &reason]).await?;
    rows.iter().map(|r| Ok((col(r, 0)?, col(r, 1)?))).collect()
}

pub(crate) async fn add_holder(
    c: &impl GenericClient,
    session_id: &str,
    replica_id: &str,
) -> Result<(), StoreError> {
    execute(
        c,
        "INSERT INTO session_holders (session_id, replica_id)
         SELECT id, $2 FROM sessions WHERE id = $1
         ON CONFLICT (session_id, replica_id) DO NOTHING",
        &[&session_id, &replica_id],
    )
    .await?;
    Ok(())
}

pub(crate) async fn remove_holders(
    c: &impl GenericClient,
    session_id: &str,
    replica_ids: &[String],
) -> Result<(), StoreError> {
    execute(
        c,
        "DELETE FROM session_holders WHERE session_id = $1 AND replica_id = ANY($2)",
        &[&session_id, &replica_ids],
    )
    .await?;
    Ok(())
}

pub(crate) async fn holders(c: &impl GenericClient) -> Result<Vec<(String, String)>, StoreError> {
    let rows = query(
        c,
        "SELECT h.session_id, h.replica_id FROM session_holders h
         JOIN sessions s ON s.id = h.session_id
         WHERE s.state != 'ended' ORDER BY h.session_id, h.replica_id",
        &[],
    )
    .await?;
    rows.iter().map(|r| Ok((col(r, 0)?, col(r, 1)?))).collect()
}

pub(crate) async fn started(
    c: &impl GenericClient,
    id: &str,
    runtime_id: &str,
    container_id: &str,
) -> Result<(), StoreError> {
    execute(
        c,
        "UPDATE sessions SET state = 'running', runtime_id = $2, container_id = $3
         WHERE id = $1 AND state = 'creating'",
        &[&id, &runtime_id, &container_id],
    )
    .await?;
    Ok(())
}

pub(crate) async fn list(
    c: &impl GenericClient,
    q: &SessionQuery,
) -> Result<SessionPage, StoreError> {
    let mut where_ = vec!["TRUE".to_string()];
    let mut args: Args = Vec::new();
    if let Some(owner) = &q.owner {
        args.push(Box::new(owner.clone()));
        where_.push(format!("owner = ${}", args.len()));
    }
    if !q.include_ended {
        where_.push("state != 'ended'".into());
    }
    if let Some(before) = q.before {
        args.push(Box::new(before));
        where_.push(format!("rowid < ${}", args.len()));
    }
    for (k, v) in &q.metadata {
        // The key is a bound parameter, never part of the statement.
        args.push(Box::new(k.clone()));
        let key = args.len();
        args.push(Box::new(v.clone()));
        where_.push(format!("(metadata::jsonb ->> ${key}) = ${}", args.len()));
    }
    let (tail, limit) = page_tail(&where_, &mut args, q.limit);
    let rows = select(c, &tail, &arg_refs(&args)).await?;
    let (sessions, next) = page_split(rows, limit);
    Ok(SessionPage { sessions, next })
}

/// Every session that has not ended, every owner, oldest first.
pub(crate) async fn active(c: &impl GenericClient) -> Result<Vec<SessionRow>, StoreError> {
    let rows = select(c, "WHERE state != 'ended' ORDER BY rowid", &[]).await?;
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

pub(crate) async fn touch(c: &impl GenericClient, id: &str, now: i64) -> Result<(), StoreError> {
    execute(
        c,
        "UPDATE sessions SET last_used_at = $2 WHERE id = $1 AND last_used_at < $2",
        &[&id, &now],
    )
    .await?;
    Ok(())
}

pub(crate) async fn set_idle_timeout(
    c: &impl GenericClient,
    id: &str,
    secs: u64,
    now: i64,
) -> Result<bool, StoreError> {
    let secs = secs.min(i64::MAX as u64) as i64;
    let n = execute(
        c,
        "UPDATE sessions SET idle_timeout_secs = $2, last_used_at = GREATEST(last_used_at, $3)
         WHERE id = $1 AND state = 'running'",
        &[&id, &secs, &now],
    )
    .await?;
    Ok(n > 0)
}

pub(crate) async fn end(
    c: &impl GenericClient,
    id: &str,
    reason: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let n = execute(
        c,
        "UPDATE sessions SET state = 'ended', env = NULL, ended_at = $2, end_reason = $3
         WHERE id = $1 AND state != 'ended'",
        &[&id, &now, &reason],
    )
    .await?;
    Ok(n > 0)
}

/// Deletes the row; its runs, their events and images, and its conversation cascade.
pub(crate) async fn delete(c: &impl GenericClient, id: &str) -> Result<bool, StoreError> {
    Ok(execute(c, "DELETE FROM sessions WHERE id = $1", &[&id]).await? > 0)
}

pub(crate) async fn owner_ids(c: &impl GenericClient) -> Result<Vec<String>, StoreError> {
    let rows = query(
        c,
        "SELECT id FROM users UNION SELECT owner FROM sessions",
        &[],
    )
    .await?;
    rows.iter().map(|r| col(r, 0)).collect()
}
