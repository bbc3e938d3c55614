//! /v1/sessions/{id}/processes: several processes at once in a session, beside its persistent
//! shell (which runs one command at a time): start (argv or a bash line, with env and cwd),
//! list, stream (Server-Sent Events: what the process kept, then what comes, then `exit`),
//! stdin, signal. A thin shell over the session's `ProcessTable`, the same one the E2B
//! surface uses; its bounds are the table's (`MAX_PROCESSES` running, `REPLAY_BYTES` kept).
//!
//! The table lives on the replica that started the process: with several replicas the
//! other routes find it only there (a 404 elsewhere).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

mod schema;

use crate::AppState;
use crate::auth::Caller;
use crate::backend::Live;
use crate::error::ErrorCode;
use crate::error::{ApiError, ApiJson, ApiPath, ErrorResponses};
use crate::exec_stream::json_event;
use crate::sessions::{live_session, sandbox_failed};
use crate::streams::Kind;
use crate::streams::StreamGuard;
use crate::types::{ExecBody, ExecResult};
use sandboxd_core::sandbox::processes::{ProcessEvent, ProcessSpec, ProcessTable, Signal};
use sandboxd_core::sandbox::{ShellOptions, resolve_path};

/// What to start: exactly one of `command` and `argv` (its schema is written out in
/// schema.rs, which says so; a derived one could not).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub stdin: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessView {
    pub pid: u32,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub tag: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StdinBody {
    /// Text written to the process's stdin as it is (UTF-8).
    #[serde(default)]
    pub data: String,
    /// Close stdin after writing (the process reads EOF).
    #[serde(default)]
    pub close: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// Either ends the process and everything it started.
    pub signal: SignalName,
}

/// A signal's name, with or without `SIG`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
pub enum SignalName {
    #[serde(rename = "TERM")]
    Term,
    #[serde(rename = "KILL")]
    Kill,
    #[serde(rename = "SIGTERM")]
    SigTerm,
    #[serde(rename = "SIGKILL")]
    SigKill,
}

async fn table(st: &AppState, caller: &Caller, id: &str) -> Result<Arc<ProcessTable>, ApiError> {
    let live = live_session(st, caller, id).await?;
    Ok(ProcessTable::of(live.session()))
}

fn no_process(pid: u32) -> ApiError {
    ApiError::not_found("process", &pid.to_string())
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes", tag = "processes", request_body = StartProcess,
    params(("id" = String, Path, description = "The session id")),
    responses((status = 201, description = "The process runs", body = ProcessView), ErrorResponses),
    security(("bearer" = [])))]
pub async fn start_process(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<StartProcess>,
) -> Result<(StatusCode, Json<ProcessView>), ApiError> {
    let argv = match (body.command, body.argv) {
        (Some(line), None) => vec!["bash".to_string(), "-c".to_string(), line],
        (None, Some(argv)) => argv,
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of `command` and `argv`",
            ));
        }
    };
    // New work: the CPU quota of the session's owner (cpu_quota.rs).
    let live = crate::sessions::live_for_work(&st, &caller, &id).await?;
    let table = ProcessTable::of(live.session());
    let spec = ProcessSpec {
        argv,
        env: body.env,
        cwd: body.cwd,
        tag: body.tag,
        stdin: body.stdin,
    };
    let sub = table.start(spec.clone()).await?;
    let info = sandboxd_core::sandbox::processes::ProcessInfo { pid: sub.pid, spec };
    Ok((StatusCode::CREATED, Json(view(info))))
}

fn view(p: sandboxd_core::sandbox::processes::ProcessInfo) -> ProcessView {
    ProcessView {
        pid: p.pid,
        argv: p.spec.argv,
        env: p.spec.env,
        cwd: p.spec.cwd,
        tag: p.spec.tag,
    }
}

#[utoipa::path(get, path = "/v1/sessions/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The running processes, oldest first", body = Vec<ProcessView>), ErrorResponses),
    security(("bearer" = [])))]
pub async fn list_processes(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Vec<ProcessView>>, ApiError> {
    let table = table(&st, &caller, &id).await?;
    Ok(Json(table.list().into_iter().map(view).collect()))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessText {
    pub text: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessExitView {
    /// None when it was killed by a signal.
    pub exit_code: Option<i64>,
    pub signaled: bool,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/processes/{pid}/stream", tag = "processes",
    params(("id" = String, Path, description = "The session id"), ("pid" = u32, Path, description = "The process id")),
    responses((status = 200, description = "Server-Sent Events: `stdout` and `stderr` (`{text}`, invalid UTF-8 replaced), `missed` (`{bytes}` not kept), then `exit` (`{exit_code, signaled}`)", content_type = "text/event-stream"), ErrorResponses),
    security(("bearer" = [])))]
pub async fn stream_process(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
) -> Result<Response, ApiError> {
    let live = live_session(&st, &caller, &id).await?;
    let table = ProcessTable::of(live.session());
    let sub = table.subscribe(pid).ok_or_else(|| no_process(pid))?;
    let guard = st.streams.open(&caller, Kind::Stream, &st.shutdown)?;
    let state = (sub, guard, live.hold(), false);
    let events = futures::stream::unfold(state, |(mut sub, guard, hold, done)| async move {
        if done {
            return None;
        }
        let token = guard.token().clone();
        let event = tokio::select! {
            e = sub.next() => e,
            _ = token.cancelled() => None,
        }?;
        let text = |b: &[u8]| ProcessText {
            text: String::from_utf8_lossy(b).into_owned(),
        };
        let (event, done) = match event {
            ProcessEvent::Stdout(b) => (json_event("stdout", &text(&b)), false),
            ProcessEvent::Stderr(b) => (json_event("stderr", &text(&b)), false),
            ProcessEvent::Missed(n) => (
                json_event("missed", &serde_json::json!({"bytes": n})),
                false,
            ),
            ProcessEvent::Exit(x) => {
                let exit = ProcessExitView {
                    exit_code: x.code,
                    signaled: x.signaled,
                };
                (json_event("exit", &exit), true)
            }
        };
        Some((
            Ok::<Event, std::convert::Infallible>(event),
            (sub, guard, hold, done),
        ))
    });
    let mut resp = Sse::new(events)
        .keep_alive(KeepAlive::new().text("keep-alive"))
        .into_response();
    resp.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    Ok(resp)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes/{pid}/stdin", tag = "processes", request_body = StdinBody,
    params(("id" = String, Path, description = "The session id"), ("pid" = u32, Path, description = "The process id")),
    responses((status = 204, description = "Written (and closed when asked)"), ErrorResponses),
    security(("bearer" = [])))]
pub async fn process_stdin(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(body): ApiJson<StdinBody>,
) -> Result<StatusCode, ApiError> {
    let table = table(&st, &caller, &id).await?;
    // An empty write that closes nothing still names a process: an unknown one is a 404.
    table
        .resolve(Some(pid), None)
        .ok_or_else(|| no_process(pid))?;
    if !body.data.is_empty() {
        table
            .send_stdin(pid, body.data.as_bytes())
            .await
            .ok_or_else(|| no_process(pid))??;
    }
    if body.close {
        table
            .close_stdin(pid)
            .await
            .ok_or_else(|| no_process(pid))?;
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes/{pid}/signal", tag = "processes", request_body = SignalBody,
    params(("id" = String, Path, description = "The session id"), ("pid" = u32, Path, description = "The process id")),
    responses((status = 204, description = "The process and everything it started are gone"), ErrorResponses),
    security(("bearer" = [])))]
pub async fn signal_process(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(body): ApiJson<SignalBody>,
) -> Result<StatusCode, ApiError> {
    let signal = match body.signal {
        SignalName::Term | SignalName::SigTerm => Signal::Term,
        SignalName::Kill | SignalName::SigKill => Signal::Kill,
    };
    let table = table(&st, &caller, &id).await?;
    table
        .signal(pid, signal)
        .await
        .ok_or_else(|| no_process(pid))??;
    Ok(StatusCode::NO_CONTENT)
}

/// An exec with `env` or `cwd`: the command as its own process (`Sandbox::exec`), with the
/// same timeout and output cap as the shell's, its variables kept out of the command text.
pub(crate) async fn own_process(
    st: &AppState,
    live: &Live,
    body: &ExecBody,
    opts: ShellOptions,
    guard: &StreamGuard,
) -> Result<ExecResult, ApiError> {
    let cwd = body.cwd.as_deref().map(resolve_path).transpose()?;
    let spec = ProcessSpec {
        argv: vec!["bash".into(), "-c".into(), body.command.clone()],
        env: body.env.clone(),
        cwd,
        ..Default::default()
    };
    sandboxd_core::sandbox::processes::check_spec(&spec)?;
    sandboxd_core::sandbox::processes::check_cwd(&*live.sandbox, spec.cwd.as_deref()).await?;
    let mut req = sandboxd_core::sandbox::ExecRequest::new(spec.argv)
        .timeout(opts.timeout)
        .output_cap(opts.output_cap);
    for (k, v) in spec.env {
        req = req.env(k, v);
    }
    if let Some(cwd) = spec.cwd {
        req = req.cwd(cwd);
    }
    let out = tokio::select! {
        out = live.sandbox.exec(req) => out,
        _ = guard.token().cancelled() => {
            return Err(match guard.revoked() {
                Some(why) => why.error(),
                None => ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down, so the command was stopped"),
            });
        }
    };
    let out = match out {
        Ok(o) => o,
        Err(e) => return Err(sandbox_failed(st, live, e).await),
    };
    Ok(ExecResult {
        exit_code: out.exit_code.map(|c| c as i32),
        stdout: out.stdout_lossy(),
        stderr: out.stderr_lossy(),
        stdout_truncated: out.stdout_truncated,
        stderr_truncated: out.stderr_truncated,
        timed_out: out.timed_out,
        duration_ms: out.duration.as_millis() as u64,
        note: None,
        timeout: opts.timeout.as_secs(),
    })
}
