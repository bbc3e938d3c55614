//! Resuming a hibernated API session, and the one slow path of every session lookup.
//!
//! `sessions::live_session` (exec, files, tools, runs, A2A: every front end's use of a
//! session) finds a session this replica holds at once; anything else comes here, under the
//! session's transition lock (hibernate.rs), with its row read again: a hibernated session
//! is resumed, a running one attached on demand (attach.rs). So a lookup racing a
//! hibernation on this replica waits for it and then resumes, never takes the removed
//! container for a lost one.
//!
//! A resume makes the sandbox again under the same runtime id, with the row's limits, from
//! the row's template (`SessionManager::recreate`), restores the snapshot into /workspace
//! after checking it (core/src/sandbox/snapshot.rs; the check runs beside the recreate, the
//! unpack in the persistent shell as it starts), then marks the row running by the
//! store's conditional update (exactly one resume wins), deletes the snapshot, and tells the
//! user: `Live::resumed` (the exec answer's `note`, a `Sandboxd-Resumed` header) and a
//! notice at the start of the next run's events (`ResumeNotice`).
//!
//! A snapshot that is refused (damaged, over the session's workspace, an entry the upload
//! rules refuse) ends the session with the reason, and the request gets a 409 saying why:
//! nothing of it reached the sandbox. A failure of the engine leaves the session
//! hibernated for the next try (503).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::Json;
use axum::extract::State;

use crate::AppState;
use crate::auth::Caller;
use crate::backend::{Backend, Live, idle_timeout};
use crate::error::{ApiError, ApiPath, ErrorCode, ErrorResponses};
use crate::hibernate::{self, snapshot_dir, transfer_timeout, workspace_bytes};
use crate::sessions::owned_row;
use crate::types::Session as SessionView;
use sandboxd_core::sandbox::Owner;
use sandboxd_core::sandbox::hibernate::ResumeNotice;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::snapshot::{self, SnapshotError};
use sandboxd_core::sandbox::tar_safety::ArchiveSummary;
use sandboxd_core::store::{SessionKind, SessionRow, SessionState, now_ms};

/// The header that says a request resumed its session.
pub const RESUMED_HEADER: &str = "sandboxd-resumed";

/// The session of `row` (running) when this replica does not hold it: resumed if it is
/// hibernated, else attached on demand; under the session's transition lock, the row read
/// again.
pub async fn resume_or_attach(st: &AppState, row: &SessionRow) -> Result<Arc<Live>, ApiError> {
    let lock = st.backend.transitions.of(&row.id);
    let _switching = lock.lock().await;
    let row = st
        .store
        .session(&row.id)
        .await?
        .ok_or_else(|| ApiError::not_found("session", &row.id))?;
    if row.state != SessionState::Running {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "session {} has ended ({}); create a new one",
                row.id,
                row.end_reason.as_deref().unwrap_or("no reason recorded")
            ),
        ));
    }
    if row.hibernated() {
        return resume(st, &row).await.map(Arc::new);
    }
    crate::attach::live(st, &row).await.ok_or_else(|| {
        ApiError::new(
            ErrorCode::Conflict,
            format!(
                "session {} has no attached sandbox; delete it and create a new one",
                row.id
            ),
        )
    })
}

/// Resumes the hibernated session of `row` (the caller holds its transition lock).
async fn resume(st: &AppState, row: &SessionRow) -> Result<Live, ApiError> {
    let started = Instant::now();
    let (Some(runtime_id), Some(name)) = (row.runtime_id.as_deref(), row.snapshot.as_deref())
    else {
        return Err(ApiError::internal(
            "a hibernated session without a snapshot",
        ));
    };
    let owner = Backend::owner_of(&row.owner)?;
    let (session, summary) = remake(st, row, &owner, runtime_id, name).await?;
    match st
        .store
        .resume_session(&row.id, name, &session.handle, now_ms())
        .await
    {
        Ok(true) => {}
        other => {
            discard(st, &session).await;
            other?;
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "session {} changed while it was being resumed; retry",
                    row.id
                ),
            ));
        }
    }
    snapshot::delete(&snapshot_dir(st), name);
    if let Err(e) = st.store.add_session_holder(&row.id, st.replica.id()).await {
        tracing::warn!(session = %row.id, error = %e, "could not record a session's holder");
    }
    let mut running = row.clone();
    running.snapshot = None;
    running.container_id = Some(session.handle.clone());
    crate::egress_proxies::follow(st, &session, &running).await;
    let ms = started.elapsed().as_millis();
    let notice = format!(
        "session {} was hibernated while idle and has been resumed in {ms} ms: /workspace is back ({} entries, {} bytes), but the processes it ran, the shell's state (directory, variables) and python variables did not survive",
        row.id, summary.entries, summary.total_bytes
    );
    tracing::info!(session = %row.id, ms = ms as u64, bytes = summary.total_bytes, "resumed a hibernated session");
    session
        .slots
        .get_or_insert_with(ResumeNotice::default)
        .set(notice.clone());
    let mut live = Live::new(&running, session);
    live.resumed = Some(notice);
    Ok(live)
}

/// Makes the sandbox of hibernated session `row` again and restores snapshot `name` into
/// it. The snapshot is checked on the host while the container is made, and unpacked by the
/// persistent shell as it starts (`snapshot::unpack`), the one process the first command
/// needs anyway, the archive fed to the sandbox's main process while the shell starts where
/// the backend can (`SandboxSpec::restore_bytes`): a resume costs about a cold create.
async fn remake(
    st: &AppState,
    row: &SessionRow,
    owner: &Owner,
    runtime_id: &str,
    name: &str,
) -> Result<(Arc<Session>, ArchiveSummary), ApiError> {
    let manager = st.backend.manager();
    // What this replica held of it before another replica hibernated it is gone.
    manager.forget_held(owner, runtime_id);
    let image = manager
        .templates()
        .resolve(row.template.as_deref())
        .map_err(|e| {
            ApiError::new(
                ErrorCode::Conflict,
                format!("session {} cannot be resumed: {e}", row.id),
            )
        })?
        .image;
    // Opened first: a snapshot this replica cannot read costs no container.
    let dir = snapshot_dir(st);
    let opened = match snapshot::open(&dir, name, workspace_bytes(row)).await {
        Ok(opened) => opened,
        Err(e) => return Err(not_restored(st, row, None, e).await),
    };
    let bytes = opened.bytes();
    let started = Instant::now();
    let (made, checked) = tokio::join!(
        manager.recreate(
            owner,
            runtime_id,
            &row.limits,
            image,
            row.container_id.as_deref(),
            Some(bytes),
        ),
        snapshot::check_opened(opened),
    );
    let session = made?;
    let made_ms = started.elapsed().as_millis() as u64;
    session.set_idle_timeout(idle_timeout(row));
    // Before the shell starts below.
    session.sandbox.set_session_env(row.env.vars());
    let restored = match checked {
        Ok(checked) => {
            snapshot::unpack(session.sandbox.as_ref(), checked, transfer_timeout(st)).await
        }
        Err(e) => Err(e),
    };
    tracing::debug!(session = %row.id, made_ms, restored_ms = started.elapsed().as_millis() as u64 - made_ms, "a hibernated session's sandbox made and restored");
    match restored {
        Ok(summary) => Ok((session, summary)),
        Err(e) => Err(not_restored(st, row, Some(&session), e).await),
    }
}

/// What a restore that failed leaves (the sandbox it made, if any, removed): for a snapshot
/// refused (`snapshot::refused`), the session ended, with why (409); for anything else (the
/// engine, a snapshot this replica cannot see or read now), the session and its snapshot
/// kept for the next try (503).
async fn not_restored(
    st: &AppState,
    row: &SessionRow,
    session: Option<&Arc<Session>>,
    e: SnapshotError,
) -> ApiError {
    if !snapshot::refused(&e) {
        if let Some(session) = session {
            discard(st, session).await;
        }
        let dir = snapshot_dir(st);
        tracing::warn!(session = %row.id, error = %e, dir = %dir.display(), "a hibernated session could not be resumed here; kept for the next try");
        // The host's paths stay in the log.
        let what = match e {
            SnapshotError::Missing { .. } => format!("{e} (it was hibernated by a replica whose snapshot directory this one does not share: retry through that replica, or have the admin set [sessions] snapshot_dir to a directory every replica shares)"),
            SnapshotError::Io { .. } => "its snapshot file cannot be read on this replica (the admin finds why in serve's log)".to_string(),
            other => other.to_string(),
        };
        return ApiError::new(
            ErrorCode::SandboxUnavailable,
            format!(
                "session {} is hibernated and could not be resumed now: {what}. The session and its files are kept; retry",
                row.id
            ),
        );
    }
    let why = format!("its hibernation snapshot was refused at resume: {e}");
    tracing::warn!(session = %row.id, reason = %why, "ending a session");
    st.runs
        .cancel_session(&row.id, Duration::from_secs(10))
        .await;
    let _ = crate::audit::end(st, &crate::audit::Who::system(), &row.id, &why).await;
    hibernate::forget(st, row).await;
    let _ = st
        .backend
        .remove(&row.owner, row.runtime_id.as_deref())
        .await;
    ApiError::new(
        ErrorCode::Conflict,
        format!(
            "session {} was hibernated and cannot be resumed: {e}. Nothing of the snapshot was written; the session has ended, create a new one",
            row.id
        ),
    )
}

/// Removes a sandbox a resume made and could not finish; the session stays hibernated.
async fn discard(st: &AppState, session: &Arc<Session>) {
    let manager = st.backend.manager();
    if manager.take_idle(session, Duration::ZERO) {
        let _ = manager.remove_kept(session).await;
    }
}

/// An admin's session, or 404 (to anyone else the route does not exist).
async fn admins_row(st: &AppState, caller: &Caller, id: &str) -> Result<SessionRow, ApiError> {
    if !caller.is_admin() {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "no such route for this key (it is for admins)",
        ));
    }
    let row = owned_row(st, caller, id).await?;
    if row.kind != SessionKind::Api || row.state != SessionState::Running {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("session {id} is not a running API session"),
        ));
    }
    Ok(row)
}

/// Hibernates the running API session of `row` now (whoever calls checked that the caller
/// may: the admin route, an owner's E2B pause): one this replica holds at once, one it does
/// not after attaching it here. Ok(false) when it was hibernated already; a 409 while it is
/// in use or has a run in flight (it stays live).
pub async fn hibernate_now(st: &AppState, row: &SessionRow) -> Result<bool, ApiError> {
    if row.hibernated() {
        return Ok(false);
    }
    let id = &row.id;
    let owner = Backend::owner_of(&row.owner)?;
    let session = match row
        .runtime_id
        .as_deref()
        .and_then(|rt| st.backend.manager().held(&owner, rt))
    {
        Some(s) => s,
        None => resume_or_attach(st, row).await?.session().clone(),
    };
    let done = hibernate::hibernate(st, row, session)
        .await
        .map_err(|why| {
            ApiError::new(
                ErrorCode::Conflict,
                format!("session {id} cannot be hibernated: {why}"),
            )
        })?;
    if !done {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("session {id} is in use or has a run in flight; it stays live"),
        ));
    }
    Ok(true)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/hibernate", tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The session is hibernated (admins only): its /workspace is saved on the host and its container removed; its next use resumes it. Refused (409) while it is in use or has a run in flight", body = SessionView), ErrorResponses),
    security(("bearer" = [])))]
pub async fn hibernate_session(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SessionView>, ApiError> {
    let row = admins_row(&st, &caller, &id).await?;
    hibernate_now(&st, &row).await?;
    let row = owned_row(&st, &caller, &id).await?;
    Ok(Json(SessionView::of(&row, &st.config.runtime.backend)))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/resume", tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The session runs (admins only): a hibernated one is resumed now, with its /workspace restored; a live one is left as it is", body = SessionView), ErrorResponses),
    security(("bearer" = [])))]
pub async fn resume_session(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SessionView>, ApiError> {
    let row = admins_row(&st, &caller, &id).await?;
    if row.hibernated() {
        resume_or_attach(&st, &row).await?;
    }
    let row = owned_row(&st, &caller, &id).await?;
    Ok(Json(SessionView::of(&row, &st.config.runtime.backend)))
}
