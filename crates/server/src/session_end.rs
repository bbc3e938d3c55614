//! Ending a session and, separately, deleting its history.
//!
//! `DELETE /v1/sessions/{id}` ends the session: its runs are cancelled and its container is
//! removed, but the row stays (state `ended`) with its runs, events, images and
//! conversation, exactly like a session that ended idle; `[server] retention_days` purges
//! them later. Ending is idempotent: an ended session answers 204 again.
//!
//! `DELETE /v1/sessions/{id}/history` is the explicit, separate call that deletes the
//! history at once. It is its own route rather than a `?purge=true` flag so that nothing
//! that ends sessions (a script, a retry, a proxy that drops or adds query strings) can
//! destroy history by accident, and so the document states its effect on its own line. A
//! live session is ended first, the same way, so nothing of it is left running. Both answer
//! 404 for another user's session, as for one that never existed.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiPath, ErrorResponses};
use crate::sessions::owned_row;
use sandboxd_core::store::{SessionKind, SessionRow};

/// How long ending a session waits for each of its runs to stop.
const RUN_STOP_WAIT: Duration = Duration::from_secs(10);

#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 204, description = "The session is ended (or already was): its runs are cancelled and its container removed. The session, its runs, their events and images stay readable (list it with `include_ended=true`) until `retention_days` purges them, or until DELETE /v1/sessions/{id}/history"), ErrorResponses),
    security(("bearer" = [])))]
pub async fn delete_session(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    let row = owned_row(&st, &caller, &id).await?;
    end(&st, &caller, &row).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/history", tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 204, description = "The session's history is deleted: the session itself, its runs, their events and images, and its conversation. A live session is ended first. Afterwards every route answers 404 for it"), ErrorResponses),
    security(("bearer" = [])))]
pub async fn delete_history(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    let row = owned_row(&st, &caller, &id).await?;
    end(&st, &caller, &row).await?;
    // The row goes last: its runs, events, images and conversation go with it (ON DELETE
    // CASCADE), and the container is already removed, so nothing is left that no row names.
    st.store.delete_session(&row.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Ends a session at a caller's request: the row first (so no new run or exec starts in
/// it), then its runs (cancelled, and waited for), then its container. An ended session
/// keeps its first reason; a container already gone is not an error.
async fn end(st: &AppState, caller: &Caller, row: &SessionRow) -> Result<(), ApiError> {
    let reason = if caller.user.id == row.owner {
        "ended by its owner"
    } else {
        "ended by an admin"
    };
    if row.kind == SessionKind::Mcp {
        // An MCP client's sandbox: no runs and no kept container; the ledger ends the row
        // and the sandbox goes.
        st.mcp.end_session(row, reason, &caller.who).await;
        return Ok(());
    }
    // Its last usage reading, so this answer already counts what it used: taken while the
    // row is still running, because once it has ended the upkeep may take the container
    // (the longer the gap, the likelier this answer came before the container went).
    crate::metering::sample_before_end(st, row).await;
    crate::audit::end(st, &caller.who, &row.id, reason).await?;
    st.runs.cancel_session(&row.id, RUN_STOP_WAIT).await;
    // The row read before it ended: a session still being created has no container yet,
    // and one made after this is removed by the upkeep (its row ended).
    st.backend
        .remove(&row.owner, row.runtime_id.as_deref())
        .await?;
    if row.hibernated() {
        // No container took its records with it: its snapshot and records go here.
        crate::hibernate::forget(st, row).await;
    }
    Ok(())
}
