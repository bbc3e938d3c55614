//! An E2B-compatible API, so code written against E2B's SDKs runs on sandboxd by setting
//! `E2B_API_URL=http://HOST:PORT/e2b`, `E2B_SANDBOX_URL=http://HOST:PORT/e2b/sandbox` and
//! `E2B_API_KEY` to a sandboxd key. A thin shell over the same library objects as /v1: an E2B
//! sandbox is an API session of the key's user (quotas, 404 across users, idle timeouts,
//! /v1 and the web UI see it).
//!
//! - `control.rs`: the control plane (`/e2b/v2/sandboxes`, `/e2b/sandboxes/{id}`, ...);
//!   `lifecycle.rs` its pause (hibernation), connect (resume) and timeout.
//! - `/e2b/sandbox/...`: every in-sandbox call, routed by the `E2b-Sandbox-Id` header
//!   (`target`): envd's process service (`process.rs`), its filesystem service and `/files`
//!   (`fs.rs`), and the code interpreter's `/execute` and `/contexts` (`interp.rs`, `contexts.rs`).
//!   Connect's protocol is in `connect.rs`.
//!
//! Authentication is the /v1 middleware: the SDK sends the key as `X-API-Key` to the control
//! plane and, as the envd access and traffic tokens the create answer hands back, as
//! `X-Access-Token` and `E2B-Traffic-Access-Token` to the sandbox (auth.rs accepts them).

mod connect;
mod contexts;
mod control;
mod fs;
mod interp;
mod lifecycle;
mod multipart;
mod process;
mod wire;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};

use crate::AppState;
use crate::auth::Caller;
use crate::backend::Live;
use crate::error::ApiError;

/// envd's port in a sandbox, as the SDK names it in `E2b-Sandbox-Port`.
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port.
pub const JUPYTER_PORT: u16 = 49999;
/// The envd version the control plane reports: the SDK picks its wire features by it (0.5.2:
/// a default user, closing stdin; multipart uploads, which `/files` takes).
pub const ENVD_VERSION: &str = "0.5.2";

/// Every route of the E2B surface (mounted by `app` behind the authentication layer).
pub fn router(st: &AppState) -> Router<Arc<AppState>> {
    let upload = st.config.server.upload_limit_mb.saturating_mul(1 << 20) as usize;
    let json = st.config.server.body_limit_kb.saturating_mul(1024) as usize;
    Router::new()
        .route(
            "/e2b/v2/sandboxes",
            post(control::create).get(control::list),
        )
        .route("/e2b/sandboxes", post(control::create).get(control::list))
        .route(
            "/e2b/sandboxes/{id}",
            get(control::get_one).delete(control::kill),
        )
        .route("/e2b/sandboxes/{id}/timeout", post(lifecycle::set_timeout))
        .route("/e2b/v2/sandboxes/{id}/connect", post(lifecycle::connect))
        .route("/e2b/sandboxes/{id}/connect", post(lifecycle::connect))
        .route("/e2b/sandboxes/{id}/pause", post(lifecycle::pause))
        .route("/e2b/sandbox/health", get(health))
        .route("/e2b/sandbox/process.Process/{method}", post(process::rpc))
        .route("/e2b/sandbox/filesystem.Filesystem/{method}", post(fs::rpc))
        .route(
            "/e2b/sandbox/files",
            get(fs::download)
                .post(fs::upload)
                .layer(DefaultBodyLimit::max(upload)),
        )
        .route("/e2b/sandbox/execute", post(interp::execute))
        .route(
            "/e2b/sandbox/contexts",
            post(contexts::create_context).get(contexts::list_contexts),
        )
        .route(
            "/e2b/sandbox/contexts/{id}",
            delete(contexts::remove_context),
        )
        .route(
            "/e2b/sandbox/contexts/{id}/restart",
            post(contexts::restart_context),
        )
        .layer(DefaultBodyLimit::max(json))
}

/// An error as E2B's REST API answers: `{"code": STATUS, "message": ...}`.
#[derive(Debug)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
    /// Seconds the client should wait (`Retry-After`), as the `/v1` error said (a quota
    /// that resets, a store that is back shortly).
    pub retry_after: Option<u64>,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> Self {
        let status = e.status.unwrap_or_else(|| e.detail.code.status());
        let mut out = Self::new(status, e.detail.message);
        out.retry_after = e.retry_after;
        out
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        let mut resp = (self.status, axum::Json(body)).into_response();
        retry_after(&mut resp, self.retry_after);
        resp
    }
}

/// Sets `Retry-After` on an E2B or Connect error's response, when it has one.
pub(crate) fn retry_after(resp: &mut Response, secs: Option<u64>) {
    if let Some(v) = secs.and_then(|s| axum::http::HeaderValue::from_str(&s.to_string()).ok()) {
        resp.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, v);
    }
}

/// The sandbox an in-sandbox call names in its headers: the caller's live session (404 for
/// another user's, as for one that never existed), and the port it asked for.
pub async fn target(
    st: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
) -> Result<(Arc<Live>, u16), E2bError> {
    let id = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            E2bError::invalid("the `E2b-Sandbox-Id` header is missing: set E2B_SANDBOX_URL to http://HOST:PORT/e2b/sandbox and use the SDK, which sends it")
        })?;
    let port = match headers.get("e2b-sandbox-port").map(|v| v.to_str()) {
        None => ENVD_PORT,
        Some(Ok(p)) => p.parse::<u16>().map_err(|_| {
            E2bError::invalid(format!("the `E2b-Sandbox-Port` header {p:?} is not a port"))
        })?,
        Some(Err(_)) => {
            return Err(E2bError::invalid(
                "the `E2b-Sandbox-Port` header is not text",
            ));
        }
    };
    if port != ENVD_PORT && port != JUPYTER_PORT {
        return Err(E2bError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "The sandbox {id} is running but port is not open: {port}. A sandboxd sandbox has no network, so it exposes no ports; only envd's ({ENVD_PORT}) and the code interpreter's ({JUPYTER_PORT}) API are served"
            ),
        ));
    }
    let live = crate::sessions::live_session(st, caller, id)
        .await
        .map_err(|e| match e.detail.code {
            crate::error::ErrorCode::NotFound | crate::error::ErrorCode::Conflict => {
                // As E2B's proxy answers for a sandbox that is gone (the SDKs read the words).
                E2bError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("The sandbox {id} was not found: {}", e.detail.message),
                )
            }
            _ => E2bError::from(e),
        })?;
    live.touch();
    Ok((live, port))
}

/// envd's health probe, which the SDK sends when a call fails at the connection level and
/// for `is_running`: a paused (hibernated) sandbox is not running, and probing it does not
/// resume it (502, as E2B's proxy answers for a sandbox that does not run).
async fn health(
    axum::extract::State(st): axum::extract::State<Arc<AppState>>,
    axum::Extension(caller): axum::Extension<Caller>,
    headers: HeaderMap,
) -> Response {
    let id = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if let Ok(row) = crate::sessions::owned_row(&st, &caller, id).await
        && row.hibernated()
    {
        let paused = format!("The sandbox {id} is paused: connect to it to resume it");
        return E2bError::new(StatusCode::BAD_GATEWAY, paused).into_response();
    }
    match target(&st, &caller, &headers).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}
