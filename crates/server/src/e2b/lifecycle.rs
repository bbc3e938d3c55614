//! E2B's pause, connect (resume) and set timeout, on sandboxd's hibernation and idle
//! timeouts.
//!
//! Pausing a sandbox hibernates its session (`resume::hibernate_now`, what the admin's
//! POST /v1/sessions/{id}/hibernate does; the owner may pause their own): /workspace is
//! saved on the host and the container removed. E2B's memory snapshot does not exist here,
//! so a pause that asks for one (`mode="full"`) is refused, saying so; the default pause
//! keeps the filesystem as E2B's `mode="filesystem"` does. Connecting to a paused sandbox
//! resumes it (201, as E2B answers a resume); so does any in-sandbox call (`target`), as
//! E2B's auto-resume does.
//!
//! E2B's timeout is the session's idle timeout, written to its row (which every replica's
//! reaper and the hibernated sessions' end read) and to the live session: it applies from
//! now, at most the admin's `[sessions] idle_timeout_secs` (the cap POST /v1/sessions
//! applies to `idle_timeout`), and the end time get/list show says what was applied.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::E2bError;
use super::control::{access_token, refused, sandbox, view};
use crate::AppState;
use crate::auth::Caller;
use crate::error::ErrorCode;
use crate::types::{Session, SessionStatus};
use sandboxd_core::store::now_ms;

/// A body the SDK may leave out or send empty (`{}` of unset fields): the defaults then.
fn optional_json<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, E2bError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| E2bError::invalid(format!("invalid body: {e}")))
}

/// E2B's pause body; its `requireHealthyGuest` is ignored (a hibernation does not ask envd).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PauseBody {
    memory: Option<bool>,
}

/// E2B's pause: the session hibernated (204); 409 when it is paused already.
pub(super) async fn pause(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, E2bError> {
    let body: PauseBody = optional_json(&body)?;
    if body.memory == Some(true) {
        return Err(refused(
            "a paused sandbox keeps its files (/workspace), not its memory: pause with mode=\"filesystem\" (or no mode); processes and python variables do not survive a pause",
        ));
    }
    let s = sandbox(&st, &caller, &id).await?;
    if s.state == SessionStatus::Hibernated {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    let row = crate::sessions::owned_row(&st, &caller, &id).await?;
    match crate::resume::hibernate_now(&st, &row).await {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        )),
        // In use or with a run in flight, or its files cannot be saved: it keeps running.
        // Not E2B's 409, which the SDK reads as "already paused".
        Err(e) if matches!(e.detail.code, ErrorCode::Conflict) => Err(E2bError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}; the sandbox keeps running", e.detail.message),
        )),
        Err(e) => Err(e.into()),
    }
}

/// E2B's connect body; its `memory` is ignored (false, `on_resume="reboot"`, is what every
/// resume here is).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ConnectBody {
    timeout: Option<u64>,
}

/// Connecting: a paused sandbox is resumed (201) with its files, a running one answers its
/// details (200). A `timeout` is applied to a paused one, and to a running one only when
/// longer than its current one (as E2B's connect does).
pub(super) async fn connect(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let body: ConnectBody = optional_json(&body)?;
    let s = sandbox(&st, &caller, &id).await?;
    let paused = s.state == SessionStatus::Hibernated;
    if let Some(t) = body.timeout.filter(|t| *t > 0)
        && (paused || t > s.idle_timeout)
    {
        apply_timeout(&st, &caller, &s, t).await?;
    }
    crate::sessions::live_session(&st, &caller, &id)
        .await?
        .touch();
    let s = sandbox(&st, &caller, &id).await?;
    let status = if paused {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view(&s, access_token(&headers).as_deref()))).into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct TimeoutBody {
    timeout: u64,
}

/// E2B's set timeout: the idle timeout from now, longer or shorter, at most the admin's cap.
/// A paused sandbox stays paused.
pub(super) async fn set_timeout(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    crate::error::ApiJson(body): crate::error::ApiJson<TimeoutBody>,
) -> Result<StatusCode, E2bError> {
    let s = sandbox(&st, &caller, &id).await?;
    apply_timeout(&st, &caller, &s, body.timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets the idle timeout of sandbox `s` to `secs` (at least 1, at most the admin's cap) from
/// now: the row first (every replica reads it), then this replica's live session, if any.
async fn apply_timeout(
    st: &Arc<AppState>,
    caller: &Caller,
    s: &Session,
    secs: u64,
) -> Result<(), E2bError> {
    let secs = secs.clamp(1, crate::sessions::idle_timeout_cap(st));
    let set = st.store.set_idle_timeout(&s.id, secs, now_ms()).await;
    if !set.map_err(|e| E2bError::from(crate::error::ApiError::from(e)))? {
        return Err(E2bError::not_found(format!(
            "sandbox \"{}\" not found",
            s.id
        )));
    }
    if s.state != SessionStatus::Hibernated {
        let live = crate::sessions::live_session(st, caller, &s.id).await?;
        live.session()
            .set_idle_timeout(std::time::Duration::from_secs(secs));
        live.touch();
    }
    Ok(())
}
