//! envd's process service (`/e2b/sandbox/process.Process/{method}`) over the session's
//! `ProcessTable`: Start and Connect stream a process's events, List, SendInput, SendSignal
//! and CloseStdin act on a running one. A pty (Update, a `pty` on Start) and client-streamed
//! input (StreamInput) are not offered: the answer is Connect's `unimplemented`, saying so.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::connect::{self, ConnectError};
use super::wire::{self, Selected, Selector, SendInputRequest, SendSignalRequest, StartRequest};
use crate::AppState;
use crate::auth::Caller;
use crate::backend::Live;
use crate::streams::{Kind, StreamGuard};
use sandboxd_core::sandbox::processes::{
    ProcessEvent, ProcessSpec, ProcessTable, Signal, Subscription,
};

/// How long a stream may be silent before a keepalive message (the SDK asks for 50 s).
const KEEPALIVE: Duration = Duration::from_secs(30);

pub(super) async fn rpc(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = call(&st, &caller, &method, &headers, &body).await;
    connect::answer(&headers, answer)
}

async fn call(
    st: &Arc<AppState>,
    caller: &Caller,
    method: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    let (live, _) = super::target(st, caller, headers).await?;
    let table = ProcessTable::of(live.session());
    match method {
        "Start" => {
            // The session's owner's quota: the CPU is metered to them, whoever asks.
            crate::cpu_quota::admit_owner(st, caller, &live.owner).await?;
            let req: StartRequest = connect::request(headers, body)?;
            let guard = st.streams.open(caller, Kind::Stream, &st.shutdown)?;
            let sub = start(&table, req).await?;
            Ok(follow(live, guard, sub))
        }
        "Connect" => {
            let req: Selected = connect::request(headers, body)?;
            let pid = find(&table, &req.process)?;
            let guard = st.streams.open(caller, Kind::Stream, &st.shutdown)?;
            let sub = table.subscribe(pid).ok_or_else(|| gone(pid))?;
            Ok(follow(live, guard, sub))
        }
        "List" => Ok(connect::unary(list(&table))),
        "SendInput" => {
            let req: SendInputRequest = connect::request(headers, body)?;
            send_input(&table, req).await
        }
        "SendSignal" => {
            let req: SendSignalRequest = connect::request(headers, body)?;
            send_signal(&table, req).await
        }
        "CloseStdin" => {
            let req: Selected = connect::request(headers, body)?;
            let pid = find(&table, &req.process)?;
            table.close_stdin(pid).await.ok_or_else(|| gone(pid))?;
            Ok(connect::unary(json!({})))
        }
        "Update" => Err(unimplemented("a pty")),
        "StreamInput" => Err(unimplemented("streamed stdin (use SendInput)")),
        other => Err(ConnectError::new(
            "unimplemented",
            format!("process.Process/{other} is not a method of envd's process service"),
        )),
    }
}

async fn start(table: &Arc<ProcessTable>, req: StartRequest) -> Result<Subscription, ConnectError> {
    if req.pty.is_some() {
        return Err(unimplemented("a pty"));
    }
    let mut argv = vec![req.process.cmd];
    argv.extend(req.process.args);
    let spec = ProcessSpec {
        argv,
        env: req.process.envs,
        cwd: req.process.cwd.filter(|c| !c.is_empty()),
        tag: req.tag,
        stdin: req.stdin.unwrap_or(false),
    };
    table
        .start(spec)
        .await
        .map_err(|e| ConnectError::from(crate::error::ApiError::from(e)))
}

/// `ListResponse`: the running processes with their config.
fn list(table: &ProcessTable) -> Value {
    let processes: Vec<Value> = table
        .list()
        .into_iter()
        .map(|p| {
            let cmd = p.spec.argv.first().cloned().unwrap_or_default();
            let args = p.spec.argv.get(1..).unwrap_or_default();
            json!({
                "pid": p.pid,
                "tag": p.spec.tag,
                "config": {"cmd": cmd, "args": args, "envs": p.spec.env, "cwd": p.spec.cwd},
            })
        })
        .collect();
    json!({ "processes": processes })
}

async fn send_input(table: &ProcessTable, req: SendInputRequest) -> Result<Response, ConnectError> {
    let pid = find(table, &req.process)?;
    let Some(data) = req.input.stdin else {
        return Err(unimplemented("pty input"));
    };
    let data = wire::decode_bytes("input.stdin", &data)?;
    match table.send_stdin(pid, &data).await {
        None => Err(gone(pid)),
        Some(Err(e)) => Err(ConnectError::new("failed_precondition", e.to_string())),
        Some(Ok(())) => Ok(connect::unary(json!({}))),
    }
}

async fn send_signal(
    table: &ProcessTable,
    req: SendSignalRequest,
) -> Result<Response, ConnectError> {
    let pid = find(table, &req.process)?;
    let signal = match wire::signal_is_kill(&req.signal) {
        Some(true) => Signal::Kill,
        Some(false) => Signal::Term,
        None => {
            return Err(ConnectError::invalid(format!(
                "signal {}: send SIGNAL_SIGKILL or SIGNAL_SIGTERM",
                req.signal
            )));
        }
    };
    match table.signal(pid, signal).await {
        None => Err(gone(pid)),
        Some(Err(e)) => Err(ConnectError::new("internal", e.to_string())),
        Some(Ok(())) => Ok(connect::unary(json!({}))),
    }
}

fn unimplemented(what: &str) -> ConnectError {
    ConnectError::new(
        "unimplemented",
        format!("sandboxd's envd does not offer {what}: processes run with pipes"),
    )
}

fn gone(pid: u32) -> ConnectError {
    ConnectError::not_found(format!("process with pid {pid} not found"))
}

fn find(table: &ProcessTable, sel: &Selector) -> Result<u32, ConnectError> {
    if sel.pid.is_none() && sel.tag.is_none() {
        return Err(ConnectError::invalid(
            "select the process by `pid` or `tag`",
        ));
    }
    table.resolve(sel.pid, sel.tag.as_deref()).ok_or_else(|| {
        ConnectError::not_found(match (&sel.pid, &sel.tag) {
            (Some(pid), _) => format!("process with pid {pid} not found"),
            (None, tag) => format!(
                "process with tag {:?} not found",
                tag.as_deref().unwrap_or("")
            ),
        })
    })
}

/// What a Start or Connect stream holds while it runs.
struct Follow {
    sub: Subscription,
    guard: StreamGuard,
    started: bool,
    ended: bool,
    _in_use: sandboxd_core::sandbox::in_use::InUse<Arc<sandboxd_core::sandbox::manager::Session>>,
}

/// The process's events as envd's `StartResponse`/`ConnectResponse` messages: the start (its
/// pid), its output, its end. The stream ends early when the caller's key is revoked or the
/// server shuts down (the process runs on).
fn follow(live: Arc<Live>, guard: StreamGuard, sub: Subscription) -> Response {
    let state = Follow {
        sub,
        guard,
        started: false,
        ended: false,
        _in_use: live.hold(),
    };
    let messages = futures::stream::unfold(state, |mut f| async move {
        if f.ended {
            return None;
        }
        if !f.started {
            f.started = true;
            let start = json!({"event": {"start": {"pid": f.sub.pid}}});
            return Some((Ok(start), f));
        }
        loop {
            let token: CancellationToken = f.guard.token().clone();
            let next = tokio::select! {
                e = tokio::time::timeout(KEEPALIVE, f.sub.next()) => Some(e),
                _ = token.cancelled() => None,
            };
            let Some(next) = next else {
                f.ended = true;
                let why = match f.guard.revoked() {
                    Some(r) => r.error().detail.message,
                    None => "the server is shutting down".into(),
                };
                return Some((Err(ConnectError::new("canceled", why)), f));
            };
            let message = match next {
                Err(_) => json!({"event": {"keepalive": {}}}),
                Ok(None) => return None,
                Ok(Some(ProcessEvent::Missed(_))) => continue,
                Ok(Some(ProcessEvent::Stdout(b))) => {
                    json!({"event": {"data": {"stdout": wire::encode_bytes(&b)}}})
                }
                Ok(Some(ProcessEvent::Stderr(b))) => {
                    json!({"event": {"data": {"stderr": wire::encode_bytes(&b)}}})
                }
                Ok(Some(ProcessEvent::Exit(x))) => {
                    f.ended = true;
                    end_message(x.code, x.signaled)
                }
            };
            return Some((Ok(message), f));
        }
    });
    connect::stream(messages)
}

fn end_message(code: Option<i64>, signaled: bool) -> Value {
    let (exit_code, status) = match (code, signaled) {
        (Some(c), false) => (c, format!("exit status {c}")),
        (Some(c), true) if c != 0 => (c, "signal: killed".to_string()),
        _ => (-1, "signal: killed".to_string()),
    };
    let mut end = json!({"exitCode": exit_code, "exited": true, "status": status});
    if exit_code != 0 {
        end["error"] = json!(status);
    }
    json!({"event": {"end": end}})
}
