//! The `sessions` table: one row-mapping helper (`select`) and the statements of the
//! session methods.

use rusqlite::{Connection, OptionalExtension, Params, Transaction, params};

use crate::{page, sql, to_json};
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::store::{
    SessionCaps, SessionEnv, SessionKind, SessionPage, SessionQuery, SessionRow, SessionState,
    StoreError,
};

const COLS: &str = "rowid, id, owner, state, limits, metadata, idle_timeout_secs, runtime_id, container_id, created_at, last_used_at, ended_at, end_reason, kind, egress, template, snapshot, env";

/// The sessions matching `tail` with their rowids (the paging cursor), JSON decoded.
pub(super) fn select(
    c: &Connection,
    tail: &str,
    args: impl Params,
) -> Result<Vec<(i64, SessionRow)>, StoreError> {
    let mut st = c
        .prepare(&format!("SELECT {COLS} FROM sessions {tail}"))
        .map_err(sql)?;
    let rows = st
        .query_map(args, |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, String>(13)?,
                r.get::<_, String>(14)?,
                r.get::<_, Option<String>>(17)?,
                SessionRow {
                    id: r.get(1)?,
                    owner: r.get(2)?,
                    state: SessionState::Ended,
                    kind: SessionKind::Api,
                    limits: Default::default(),
                    metadata: Default::default(),
                    idle_timeout_secs: r.get::<_, i64>(6)?.max(0) as u64,
                    runtime_id: r.get(7)?,
                    container_id: r.get(8)?,
                    created_at: r.get(9)?,
                    last_used_at: r.get(10)?,
                    ended_at: r.get(11)?,
                    end_reason: r.get(12)?,
                    egress: Default::default(),
                    template: r.get(15)?,
                    snapshot: r.get(16)?,
                    env: Default::default(),
                },
            ))
        })
        .map_err(sql)?;
    let corrupt = |what, message: String| StoreError::Corrupt { what, message };
    rows.map(|row| {
        let (rowid, state, limits, metadata, kind, egress, env, mut row) = row.map_err(sql)?;
        row.env = SessionEnv::from_stored(env.as_deref())?;
        row.egress = EgressPolicy::parse(&egress).map_err(|e| corrupt("session egress", e))?;
        row.kind =
            SessionKind::parse(&kind).ok_or_else(|| corrupt("session kind", kind.clone()))?;
        row.state =
            SessionState::parse(&state).ok_or_else(|| corrupt("session state", state.clone()))?;
        row.limits =
            serde_json::from_str(&limits).map_err(|e| corrupt("session limits", e.to_string()))?;
        row.metadata = serde_json::from_str(&metadata)
            .map_err(|e| corrupt("session metadata", e.to_string()))?;
        Ok((rowid, row))
    })
    .collect()
}

pub(super) fn one(c: &Connection, id: &str) -> Result<Option<SessionRow>, StoreError> {
    Ok(select(c, "WHERE id = ?1", [id])?
        .into_iter()
        .next()
        .map(|(_, r)| r))
}

/// Counts and inserts in the caller's write transaction (the global cap first, then the
/// owner's), and records the first holder.
pub(super) fn reserve(
    tx: &Transaction<'_>,
    row: &SessionRow,
    caps: &SessionCaps,
) -> Result<(), StoreError> {
    let all: i64 = tx
        .query_row(
            "SELECT COUNT(*) FROM sessions WHERE state != 'ended'",
            [],
            |r| r.get(0),
        )
        .map_err(sql)?;
    if all >= i64::from(caps.total) {
        return Err(StoreError::SessionsFull {
            limit: caps.total,
            active: all.min(i64::from(u32::MAX)) as u32,
        });
    }
    let max_active = caps.per_owner;
    let active: i64 = tx
        .query_row(
            "SELECT COUNT(*) FROM sessions WHERE owner = ?1 AND state != 'ended'",
            [&row.owner],
            |r| r.get(0),
        )
        .map_err(sql)?;
    if active >= max_active as i64 {
        return Err(StoreError::SessionQuota {
            limit: max_active,
            active: active as u32,
        });
    }
    tx.execute(
        "INSERT INTO sessions (id, owner, state, limits, metadata, idle_timeout_secs, created_at, last_used_at, kind, egress, template, env)
         VALUES (?1, ?2, 'creating', ?3, ?4, ?5, ?6, ?6, ?7, ?8, ?9, ?10)",
        params![
            row.id,
            row.owner,
            to_json(&row.limits)?,
            to_json(&row.metadata)?,
            row.idle_timeout_secs as i64,
            row.created_at,
            row.kind.as_str(),
            row.egress.to_string(),
            row.template,
            row.env.to_stored()
        ],
    )
    .map_err(sql)?;
    if let Some(holder) = &caps.holder {
        add_holder(tx, &row.id, holder)?;
    }
    Ok(())
}

/// The runs that keep a session from idling out (every state but the ended ones).
const RUN_IN_FLIGHT: &str = "EXISTS (SELECT 1 FROM runs WHERE runs.session_id = sessions.id
     AND runs.state IN ('queued', 'running', 'waiting_for_human'))";

pub(super) fn end_idle(
    tx: &Transaction<'_>,
    runtime_id: &str,
    reason: &str,
    now: i64,
) -> Result<Option<String>, StoreError> {
    tx.query_row(
        &format!(
            "UPDATE sessions SET state = 'ended', env = NULL, ended_at = ?2, end_reason = ?3
             WHERE runtime_id = ?1 AND state = 'running' AND snapshot IS NULL
               AND last_used_at + idle_timeout_secs * 1000 <= ?2 AND NOT {RUN_IN_FLIGHT}
             RETURNING id"
        ),
        params![runtime_id, now, reason],
        |r| r.get::<_, String>(0),
    )
    .optional()
    .map_err(sql)
}

/// Hibernates the running session `id` (see `SessionSnapshots::hibernate_session`).
pub(super) fn hibernate(
    tx: &Transaction<'_>,
    id: &str,
    snapshot: &str,
    used_before: i64,
) -> Result<bool, StoreError> {
    let n = tx
        .execute(
            &format!(
                "UPDATE sessions SET snapshot = ?2
                 WHERE id = ?1 AND state = 'running' AND snapshot IS NULL
                   AND last_used_at <= ?3 AND NOT {RUN_IN_FLIGHT}"
            ),
            params![id, snapshot, used_before],
        )
        .map_err(sql)?;
    Ok(n > 0)
}

/// Resumes the hibernated session `id` (see `SessionSnapshots::resume_session`).
pub(super) fn resume(
    tx: &Transaction<'_>,
    id: &str,
    snapshot: &str,
    container_id: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let n = tx
        .execute(
            "UPDATE sessions SET snapshot = NULL, container_id = ?3,
                 last_used_at = MAX(last_used_at, ?4)
             WHERE id = ?1 AND state = 'running' AND snapshot = ?2",
            params![id, snapshot, container_id, now],
        )
        .map_err(sql)?;
    Ok(n > 0)
}

/// Ends the hibernated sessions idle past their timeout; (id, snapshot) of each.
pub(super) fn end_idle_hibernated(
    tx: &Transaction<'_>,
    reason: &str,
    now: i64,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut st = tx
        .prepare(&format!(
            "UPDATE sessions SET state = 'ended', env = NULL, ended_at = ?1, end_reason = ?2
             WHERE state = 'running' AND snapshot IS NOT NULL
               AND last_used_at + idle_timeout_secs * 1000 <= ?1 AND NOT {RUN_IN_FLIGHT}
             RETURNING id, snapshot"
        ))
        .map_err(sql)?;
    let rows = st
        .query_map(params![now, reason], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(sql)?;
    rows.collect::<Result<_, _>>().map_err(sql)
}

pub(super) fn add_holder(
    tx: &Transaction<'_>,
    session_id: &str,
    replica_id: &str,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO session_holders (session_id, replica_id)
         SELECT id, ?2 FROM sessions WHERE id = ?1
         ON CONFLICT (session_id, replica_id) DO NOTHING",
        params![session_id, replica_id],
    )
    .map_err(sql)?;
    Ok(())
}

pub(super) fn remove_holders(
    tx: &Transaction<'_>,
    session_id: &str,
    replica_ids: &[String],
) -> Result<(), StoreError> {
    for replica in replica_ids {
        tx.execute(
            "DELETE FROM session_holders WHERE session_id = ?1 AND replica_id = ?2",
            params![session_id, replica],
        )
        .map_err(sql)?;
    }
    Ok(())
}

pub(super) fn holders(c: &Connection) -> Result<Vec<(String, String)>, StoreError> {
    let mut st = c
        .prepare(
            "SELECT h.session_id, h.replica_id FROM session_holders h
             JOIN sessions s ON s.id = h.session_id
             WHERE s.state != 'ended' ORDER BY h.session_id, h.replica_id",
        )
        .map_err(sql)?;
    let rows = st
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(sql)?;
    rows.collect::<Result<_, _>>().map_err(sql)
}

pub(super) fn started(
    tx: &Transaction<'_>,
    id: &str,
    runtime_id: &str,
    container_id: &str,
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE sessions SET state = 'running', runtime_id = ?2, container_id = ?3
         WHERE id = ?1 AND state = 'creating'",
        params![id, runtime_id, container_id],
    )
    .map_err(sql)?;
    Ok(())
}

pub(super) fn list(c: &Connection, q: &SessionQuery) -> Result<SessionPage, StoreError> {
    let mut where_ = vec!["1 = 1".to_string()];
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    if let Some(owner) = &q.owner {
        args.push(owner.clone().into());
        where_.push(format!("owner = ?{}", args.len()));
    }
    if !q.include_ended {
        where_.push("state != 'ended'".into());
    }
    if let Some(before) = q.before {
        args.push(before.into());
        where_.push(format!("rowid < ?{}", args.len()));
    }
    for (k, v) in &q.metadata {
        // The JSON path is a bound parameter; keys are checked to be plain names.
        args.push(format!("$.\"{k}\"").into());
        let path = args.len();
        args.push(v.clone().into());
        where_.push(format!("json_extract(metadata, ?{path}) = ?{}", args.len()));
    }
    let (sessions, next) = page(c, &where_, args, q.limit, |c, tail, args| {
        select(c, tail, args)
    })?;
    Ok(SessionPage { sessions, next })
}

pub(super) fn touch(tx: &Transaction<'_>, id: &str, now: i64) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE sessions SET last_used_at = ?2 WHERE id = ?1 AND last_used_at < ?2",
        params![id, now],
    )
    .map_err(sql)?;
    Ok(())
}

pub(super) fn set_idle_timeout(
    tx: &Transaction<'_>,
    id: &str,
    secs: u64,
    now: i64,
) -> Result<bool, StoreError> {
    let secs = secs.min(i64::MAX as u64) as i64;
    let n = tx
        .execute(
            "UPDATE sessions SET idle_timeout_secs = ?2, last_used_at = MAX(last_used_at, ?3)
             WHERE id = ?1 AND state = 'running'",
            params![id, secs, now],
        )
        .map_err(sql)?;
    Ok(n > 0)
}

pub(super) fn end(
    tx: &Transaction<'_>,
    id: &str,
    reason: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let n = tx
        .execute(
            "UPDATE sessions SET state = 'ended', env = NULL, ended_at = ?2, end_reason = ?3
             WHERE id = ?1 AND state != 'ended'",
            params![id, now, reason],
        )
        .map_err(sql)?;
    Ok(n > 0)
}

pub(super) fn delete(tx: &Transaction<'_>, id: &str) -> Result<bool, StoreError> {
    let n = tx
        .execute("DELETE FROM sessions WHERE id = ?1", [id])
        .map_err(sql)?;
    Ok(n > 0)
}

pub(super) fn owner_ids(c: &Connection) -> Result<Vec<String>, StoreError> {
    let mut st = c
        .prepare("SELECT id FROM users UNION SELECT DISTINCT owner FROM sessions")
        .map_err(sql)?;
    let rows = st.query_map([], |r| r.get::<_, String>(0)).map_err(sql)?;
    rows.collect::<Result<_, _>>().map_err(sql)
}
