//! The manager's end events, written into the store: the one place serve hears that a
//! session's sandbox went, whoever removed it.
//!
//! The manager is the one registry of sessions and its reaper the one that ends idle ones
//! (each after the timeout its row recorded); it also removes sessions over the memory
//! budget and orphans. Each removal is announced once with why (`Ended`). An API session's
//! row is found by the manager's id (`runtime_id`) among the active rows and ended with
//! that reason ("idle for more than 60 s"), a run still in it cancelled first; an /mcp
//! sandbox's row is the ledger's (mcp_quota.rs). A row serve ended itself before removing
//! the container (DELETE, a lost container, a removed user) is no longer active and keeps
//! its reason.
//!
//! A sandbox that ended outside sandboxd (deleted, evicted, OOM-killed: `EndReason::Vanished`,
//! the manager's watch of the runtime) fails the runs still in it with that reason, whichever
//! replica drives them (the others through a fail request in the run's row, runs/control.rs);
//! an /mcp sandbox's row ends with that reason too. A hibernated session's container, which
//! hibernation removes on purpose, is not an end.
//!
//! A listener that lags behind the events has lost some: it then ends the running API rows
//! whose container is gone from the engine, their runs failed with why (the manager's
//! reason if it kept one), and the ledger sweeps its own. An idle end is
//! written by the reaper's conditional update itself (attach.rs), so its row is no longer
//! active when its event comes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;

use crate::AppState;
use crate::audit::Who;
use sandboxd_core::sandbox::ends::{EndReason, Ended};
use sandboxd_core::store::{SessionKind, SessionRow, SessionState};

/// How long ending a session waits for each of its runs to stop.
const RUN_STOP_WAIT: Duration = Duration::from_secs(10);

/// Follows the manager's end events until shutdown, and meanwhile has the manager follow
/// the sandboxes that end outside sandboxd (`SessionManager::spawn_vanish_watch`): that task
/// ends with this one.
pub fn spawn_listener(st: Arc<AppState>) -> tokio::task::JoinHandle<()> {
    let manager = st.backend.manager().clone();
    let mut ends = manager.subscribe_ends();
    let vanish = tokio_util::task::AbortOnDropHandle::new(manager.spawn_vanish_watch());
    tokio::spawn(async move {
        let _vanish = vanish;
        loop {
            let next = tokio::select! {
                n = ends.recv() => n,
                _ = st.shutdown.cancelled() => return,
            };
            match next {
                Ok(ended) => {
                    crate::metering::on_end(&st, &ended).await;
                    st.mcp.ledger().on_end(&ended).await;
                    api_ended(&st, &ended).await;
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "session end events were missed; sweeping");
                    st.mcp.ledger().sweep(&manager).await;
                    api_sweep(&st).await;
                }
                Err(RecvError::Closed) => return,
            }
        }
    })
}

/// The active API rows, or none when the store cannot tell now.
async fn active_api_rows(st: &AppState) -> Vec<SessionRow> {
    match st.store.active_sessions().await {
        Ok(rows) => rows
            .into_iter()
            .filter(|r| r.kind == SessionKind::Api)
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "the store failed while ending a session's row");
            Vec::new()
        }
    }
}

/// Ends the row of the API session whose sandbox the manager removed, with why.
async fn api_ended(st: &AppState, ended: &Ended) {
    let rows = active_api_rows(st).await;
    let Some(row) = rows
        .iter()
        .find(|r| r.runtime_id.as_deref() == Some(ended.id.as_str()))
    else {
        return;
    };
    let reason = ended.reason.to_string();
    match ended.reason {
        // A hibernated session's container goes on purpose (hibernate.rs), whoever hears it.
        EndReason::Vanished(_) if row.hibernated() => {}
        EndReason::Vanished(_) => {
            end_vanished(st, row, &reason).await;
        }
        _ => {
            end_row(st, row, &reason).await;
        }
    }
}

/// After missed events: a running API row whose container is gone from the engine lost it
/// unheard. Not "not held here": with several replicas, another may hold it. The rows are
/// read before the engine is listed, so a session started meanwhile is not taken for gone.
async fn api_sweep(st: &AppState) {
    let rows = active_api_rows(st).await;
    let containers: std::collections::HashSet<String> = match st.backend.containers().await {
        Ok(c) => c.into_iter().map(|c| c.session_id).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the engine's containers after missed end events");
            return;
        }
    };
    for row in rows {
        let gone = row.state == SessionState::Running
            && !row.hibernated()
            && row
                .runtime_id
                .as_ref()
                .is_some_and(|rt| !containers.contains(rt));
        if gone {
            // Its runs fail with why, as when the end is heard.
            let reason = gone_reason(st, &row, "its sandbox was removed");
            end_vanished(st, &row, &reason).await;
        }
    }
}

/// Why a sweep found the row's sandbox gone: the vanish watch's reason if this replica's
/// manager kept it (a slower end than the sweep), else `fallback`.
pub(crate) fn gone_reason(st: &AppState, row: &SessionRow, fallback: &str) -> String {
    row.runtime_id
        .as_deref()
        .and_then(|rt| st.backend.manager().end_of(rt))
        .map_or_else(|| fallback.to_string(), |r| r.to_string())
}

/// Cancels the runs still in the session (they end `cancelled`), then ends its row;
/// whether this ended it.
pub(crate) async fn end_row(st: &AppState, row: &SessionRow, reason: &str) -> bool {
    st.runs.cancel_session(&row.id, RUN_STOP_WAIT).await;
    record_end(st, row, reason).await
}

/// Ends the session whose sandbox went under it (heard, or found by a sweep here or in
/// attach.rs): its runs end `failed` saying why, on every replica, and only then its row
/// ends with why. One stop, the fail request, never followed by a cancel: a run another
/// replica drives (or is yet to take over) ends failed whenever its driver reads the
/// request, so only the runs driven here are waited for (`fail_session_here`), and the
/// listener does not stall on a replica that is slow or gone. Whether this ended the row.
pub(crate) async fn end_vanished(st: &AppState, row: &SessionRow, reason: &str) -> bool {
    st.runs
        .fail_session_here(&row.id, reason, RUN_STOP_WAIT)
        .await;
    record_end(st, row, reason).await
}

/// Ends the session's row with why, its runs already stopped; whether this ended it.
async fn record_end(st: &AppState, row: &SessionRow, reason: &str) -> bool {
    tracing::info!(session = %row.id, %reason, "the session ended");
    match crate::audit::end(st, &Who::system(), &row.id, reason).await {
        Ok(ended) => ended,
        Err(e) => {
            tracing::warn!(session = %row.id, error = %e, "could not end a session's row");
            false
        }
    }
}
