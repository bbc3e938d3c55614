//! Keeping the store and the engine in agreement: at start (also after `kill -9`) and then
//! every `[sessions] reap_interval_secs`, on every replica.
//!
//! At start: unkept sandboxes whose replica (or creator) is gone are removed (the manager's
//! reconcile: /mcp sandboxes of a stopped serve); then the sweep of attach.rs: a running
//! session no live replica holds is re-attached (by one replica), after what the gone
//! replica left running in its shell is killed (a kill that cannot be confirmed ends the
//! session instead); a row whose container is gone, or still `creating` or an /mcp
//! sandbox's with its replica gone, is ended; containers of this store's users or warm pool
//! that no active row names are removed once the replica that made them is gone (before
//! replicas recorded theirs: at start). A live replica's containers are never touched, and
//! no row ends because this replica does not hold its session. Last, the tool records of
//! every session without a container go (`forget_orphan_records`). Only the containers of
//! this store's users and pool scope are considered (the owner label carries the user id,
//! which is random per store), so several services with their own stores can share an engine.
//!
//! The warm pool's sandboxes carry the service's pool scope as owner (see `pool_owner_for`)
//! and the replica that made them; a session that claimed one is known only by its row, and
//! is adopted for the row's owner with the row's limits when attached.
//!
//! Then periodically: orphans whose replica or creator is gone are removed (the manager's
//! reconcile), live sessions whose row ended elsewhere (`sandboxd users rm`, another
//! replica's DELETE or reaper) are removed, last-use times are persisted, every held
//! session's egress follows its row (API and /mcp: egress_proxies.rs), the same sweep
//! runs, the rows of /mcp sandboxes that went are ended and the MCP sessions of removed
//! users closed (mcp_quota.rs), and old rows past the retention are purged. Idle sessions
//! are not this upkeep's: the manager's one reaper ends them, each after its row's timeout,
//! by the store's conditional update (attach.rs), and ends.rs writes why into the row.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{OWNER_PREFIX, last_used_ms};
use crate::{AppState, attach};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::store::{SessionKind, SessionRow, SessionState, now_ms};

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
    // Unkept sandboxes whose replica (or, before replicas, creator) is gone: /mcp sandboxes
    // of a stopped serve, and creates that finished after their process died.
    let unkept = st.backend.reconcile_unkept().await?;
    out.removed_containers.extend(unkept);
    let swept = attach::sweep(st, true).await?;
    out.reattached = swept.attached;
    out.ended = swept.ended.into_iter().map(|(id, _)| id).collect();
    out.removed_containers.extend(swept.removed);
    // Tool records whose session has no container (removed outside sandboxd, or a record a
    // tool wrote as its session was being removed): no row or hook would ever end them.
    // Trusted: this sweeps serve's own data directory and no client names anything here.
    // Hibernated sessions have no container on purpose: their records stay for the resume.
    let hibernated: std::collections::BTreeSet<String> = st
        .store
        .active_sessions()
        .await?
        .into_iter()
        .filter(|r| r.hibernated())
        .filter_map(|r| r.runtime_id)
        .collect();
    let manager = st.backend.manager();
    match manager
        .forget_orphans_sparing(manager.records().as_ref(), &hibernated)
        .await
    {
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
    // Hibernated sessions past their idle timeout end; stale snapshot files go.
    crate::hibernate::upkeep(st).await;
    // What must happen once across replicas: orphaned sessions attached, the shells of gone
    // replicas killed, rows of gone containers and of creates whose replica died ended, the
    // containers of gone replicas that no row names removed (attach.rs).
    match attach::sweep(st, false).await {
        Ok(s) if !(s.attached.is_empty() && s.ended.is_empty() && s.removed.is_empty()) => {
            tracing::info!(attached = ?s.attached, ended = ?s.ended, removed = ?s.removed, "swept the sessions of gone replicas")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not sweep the sessions of gone replicas"),
    }
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
    let mcp_live = mcp_sessions(st).await;
    if live.is_empty() && mcp_live.is_empty() {
        st.egress_proxies.keep_only(&[]).await;
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
    let mut held = Vec::new();
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
                held.push(row.id.clone());
                // The proxy variables and a proxy that died (egress_proxies.rs).
                crate::egress_proxies::follow(st, &session, row).await;
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
                // `cancelled` before its container goes, not `failed` after; one whose
                // sandbox vanished ends `failed`, as its row asks (ends.rs).
                st.runs
                    .cancel_runtime(&session.id, Duration::from_secs(10))
                    .await;
                let reading = st.backend.manager().reading_of(&session.handle).await;
                crate::metering::record(st.store.as_ref(), &session.id, reading).await;
                if let Err(e) = st.backend.remove(user, Some(&session.id)).await {
                    tracing::warn!(session = %session.id, error = %e, "could not remove a session's container");
                }
            }
        }
    }
    held.extend(mcp_egress(st, &rows, &mcp_live).await);
    st.egress_proxies.keep_only(&held).await;
}

/// The sessions this process holds that are not API sessions: /mcp sandboxes among them
/// (`mcp_egress` matches each to its row and its user's MCP owner).
async fn mcp_sessions(st: &AppState) -> Vec<Arc<Session>> {
    let mut all = st.backend.manager().live().await;
    all.retain(|s| !s.owner.as_str().starts_with(OWNER_PREFIX));
    all
}

/// The /mcp sandboxes held here follow their rows' egress as API sessions do (a proxy
/// that died restarts, a changed policy or credential applies); their row ids.
async fn mcp_egress(st: &AppState, rows: &[SessionRow], live: &[Arc<Session>]) -> Vec<String> {
    let mut held = Vec::new();
    for row in rows.iter().filter(|r| r.kind == SessionKind::Mcp) {
        let owner = crate::mcp::McpUsers::owner_of(&row.owner);
        let Some(session) = live
            .iter()
            .find(|s| row.runtime_id.as_deref() == Some(s.id.as_str()) && s.owner == owner)
        else {
            continue;
        };
        held.push(row.id.clone());
        crate::egress_proxies::follow(st, session, row).await;
    }
    held
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
