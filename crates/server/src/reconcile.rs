//! Keeping the store and the engine in agreement: at start (also after `kill -9`) and then
//! every `[sessions] reap_interval_secs`.
//!
//! At start: a stored session whose container still runs is re-attached with its stored
//! limits, after what the dead process left running in its shell is killed (a kill that
//! cannot be confirmed ends the session instead); one whose container is gone, or that was still being created, is marked ended;
//! containers of API sessions that no active stored session owns are removed, and so are
//! unkept containers whose creating process is gone (the manager's own reconcile); last,
//! the tool records of every session without a container go (`forget_orphan_records`). Only the
//! containers of this store's users are considered (the owner label carries the user id,
//! which is random per store), so several `serve`s with their own data directories can share
//! an engine without taking each other's sessions for orphans.
//!
//! The warm pool's sandboxes carry this serve's pool scope as owner (see `pool_owner`), and
//! a session that claimed one is known only by its row: a running one that an active row
//! names is adopted for the row's owner with the row's limits, every other one of the scope
//! (warm sandboxes of a process that died, a claim whose row ended) is removed.
//!
//! Then periodically: orphans whose creator is gone are removed (the manager's reconcile),
//! live sessions whose row ended elsewhere (`sandboxd users rm`) are removed, last-use times
//! are persisted, the rows of /mcp sandboxes that went are ended and the MCP sessions of
//! removed users closed (mcp_quota.rs), and old rows past the retention are purged. Idle
//! sessions are not this upkeep's: the manager's one reaper ends them, each after its row's
//! timeout, and ends.rs writes why into the row.
//!
//! /mcp sandboxes are never kept: at start their containers are the manager's orphans and
//! their rows, still active, are ended (another live replica's still run: theirs are kept).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::AppState;
use crate::backend::{Backend, OWNER_PREFIX, last_used_ms};
use sandboxd_core::sandbox::{SandboxState, SessionInfo};
use sandboxd_core::store::{SessionKind, SessionState, now_ms};

/// What the start-up reconcile did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciled {
    pub reattached: Vec<String>,
    pub ended: Vec<String>,
    pub removed_containers: Vec<String>,
    /// Sessions (runtime ids) whose container was gone and whose tool records were removed.
    pub forgotten_records: Vec<String>,
}

pub async fn at_start(st: &AppState) -> anyhow::Result<Reconciled> {
    let mut out = Reconciled::default();
    let unkept = st.backend.reconcile_unkept().await?;
    out.removed_containers.extend(unkept);
    let containers = st.backend.containers().await?;
    let manager = st.backend.manager();
    let scope = manager.pool_scope().map(|o| o.to_string());
    let of_scope = |c: &SessionInfo| c.pooled && scope.as_deref() == Some(c.owner.as_str());
    let mut kept: HashSet<String> = HashSet::new();
    for row in st.store.active_sessions().await? {
        // An /mcp sandbox never outlives the process that made it (its container is not
        // kept; the manager's reconcile above removed it): its row ends here, unless its
        // container runs (another live replica's).
        if row.kind == SessionKind::Mcp {
            // A sandbox of this data directory's pool scope was claimed by this replica's
            // dead predecessor; one running in any other scope, by another live replica.
            let running = |rt: &str| {
                containers
                    .iter()
                    .any(|c| c.session_id == rt && c.state == SandboxState::Running && !of_scope(c))
            };
            if st.mcp.ledger().ends_at_start(&row, running).await? {
                out.ended.push(row.id);
            }
            continue;
        }
        let found = row.runtime_id.as_deref().and_then(|r| {
            containers.iter().find(|c| {
                c.session_id == r
                    && (c.owner == format!("{OWNER_PREFIX}{}", row.owner) || of_scope(c))
            })
        });
        let reason = match (row.state, found) {
            (SessionState::Running, Some(c)) if c.state == SandboxState::Running => {
                // A claimed warm sandbox is bound to the row's owner first (its labels
                // name only the scope), then re-attached like any other.
                let attached = async {
                    if of_scope(c) {
                        let owner = Backend::owner_of(&row.owner)?;
                        manager.adopt(&owner, &c.session_id, &row.limits).await?;
                    }
                    st.backend.reattach(&row, &c.session_id).await
                }
                .await;
                match attached {
                    Ok(_) => {
                        kept.insert(c.session_id.clone());
                        out.reattached.push(row.id.clone());
                        continue;
                    }
                    Err(e) => format!("its container could not be re-attached: {e}"),
                }
            }
            (SessionState::Running, Some(c)) => format!("its container is {}", c.state),
            (SessionState::Running, None) => "its container is gone".to_string(),
            _ => "sandboxd stopped while its container was being created".to_string(),
        };
        tracing::info!(session = %row.id, %reason, "ending a stored session");
        st.store.end_session(&row.id, &reason, now_ms()).await?;
        // A container still there is removed below (and the manager tells its end hook);
        // for one already gone, the hook is told here.
        if found.is_none()
            && let Some(rt) = &row.runtime_id
        {
            manager.session_ended(rt).await;
        }
        out.ended.push(row.id);
    }
    let ours: HashSet<String> = st.store.owner_ids().await?.into_iter().collect();
    for c in containers {
        let owner = c.owner.strip_prefix(OWNER_PREFIX);
        let ours = owner.is_some_and(|o| ours.contains(o)) || of_scope(&c);
        if ours && !kept.contains(&c.session_id) {
            st.backend.remove_runtime(&c.session_id).await?;
            out.removed_containers.push(c.session_id);
        }
    }
    // Tool records whose session has no container (removed outside sandboxd, or a record a
    // tool wrote as its session was being removed): no row or hook would ever end them.
    // Trusted: this sweeps serve's own data directory and no client names anything here.
    match manager.forget_orphan_records().await {
        Ok(ids) => out.forgotten_records = ids,
        Err(e) => tracing::warn!(error = %e, "could not look for orphaned tool records"),
    }
    Ok(out)
}

/// One pass of the periodic upkeep.
pub async fn tick(st: &AppState) {
    // Orphans that appeared after the start-up reconcile: a create the engine finished after
    // a killed process had gone (a warm sandbox of its pool, say) is never started by anyone.
    match st.backend.reconcile_unkept().await {
        Ok(removed) if !removed.is_empty() => {
            tracing::info!(?removed, "removed containers whose creator is gone")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not look for orphaned containers"),
    }
    api_upkeep(st).await;
    // /mcp sandboxes: rows whose sandbox went unnoticed end, and the MCP sessions of users
    // removed by `sandboxd users rm` close.
    st.mcp.ledger().sweep(st.backend.manager()).await;
    st.mcp.remove_gone_users(st.store.as_ref()).await;
    let days = st.config.server.retention_days;
    if days > 0 {
        let cutoff = now_ms() - (days as i64).saturating_mul(86_400_000);
        match st.store.purge_before(cutoff).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "purged rows past the retention"),
            Err(e) => tracing::warn!(error = %e, "could not purge old rows"),
        }
    }
}

/// API sessions this process holds: one whose row ended elsewhere (`sandboxd users rm` in
/// another process) is removed, a run still in it cancelled first; every other one's last
/// use is recorded in its row.
async fn api_upkeep(st: &AppState) {
    // The sessions first, then the rows: a session made meanwhile is already claimed by its
    // row, or its row is still `creating` (it names no session yet) and its owner's
    // unclaimed sessions wait for the next pass.
    let live = st.backend.all().await;
    if live.is_empty() {
        return;
    }
    let rows = match st.store.active_sessions().await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "the store failed during upkeep");
            return;
        }
    };
    let api = rows.iter().filter(|r| r.kind == SessionKind::Api);
    let creating: HashSet<&str> = api
        .clone()
        .filter(|r| r.state == SessionState::Creating)
        .map(|r| r.owner.as_str())
        .collect();
    for session in live {
        let row = api
            .clone()
            .find(|r| r.runtime_id.as_deref() == Some(session.id.as_str()));
        let user = session
            .owner
            .as_str()
            .strip_prefix(OWNER_PREFIX)
            .unwrap_or_default();
        match row {
            Some(row) => {
                let used = last_used_ms(&session);
                if row.last_used_at < used
                    && let Err(e) = st.store.touch_session(&row.id, used).await
                {
                    tracing::warn!(error = %e, "could not record a session's last use");
                }
            }
            None if creating.contains(user) => {}
            None => {
                tracing::info!(session = %session.id, "removing a session whose row ended");
                // A run still in it (its user was removed by `sandboxd users rm`) ends
                // `cancelled` before its container goes, not `failed` after.
                st.runs
                    .cancel_runtime(&session.id, Duration::from_secs(10))
                    .await;
                if let Err(e) = st.backend.remove(user, Some(&session.id)).await {
                    tracing::warn!(session = %session.id, error = %e, "could not remove a session's container");
                }
            }
        }
    }
}

/// Runs `tick` every `[sessions] reap_interval_secs` until shutdown.
pub fn spawn_upkeep(st: Arc<AppState>) -> tokio::task::JoinHandle<()> {
    let every = Duration::from_secs(st.config.sessions.reap_interval_secs.max(1));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = st.shutdown.cancelled() => return,
            }
            tick(&st).await;
        }
    })
}
