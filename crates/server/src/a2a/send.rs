//! The A2A methods over runs: a message starts a run (in its context's session, or a new one)
//! or, naming a task that waits for input, answers its question; GetTask, ListTasks and
//! CancelTask read and cancel runs. Starting, answering and the ownership check are the /v1
//! routes' own functions, so quotas and isolation are theirs.

use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};

use super::wire::{self, Dialect, WorkspaceFile};
use super::{RpcError, code, stream};
use crate::AppState;
use crate::auth::Caller;
use crate::error::ErrorCode;
use crate::runs::RunMode;
use crate::runs::routes::{answer, owned_run, start_run};
use crate::runs::types::CreateRun;
use sandboxd_core::sandbox::{FileKind, WORKSPACE};
use sandboxd_core::store::{RunQuery, RunRow, RunState};

/// How long CancelTask waits for the run's ending to be recorded (as POST …/cancel).
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// The most files of /workspace one task lists as artifact parts.
const MAX_FILES: usize = 100;

/// What every method gets: the service, the caller, the base URL they reached us at.
pub(super) struct Ctx<'a> {
    pub(super) st: &'a std::sync::Arc<AppState>,
    pub(super) caller: &'a Caller,
    pub(super) base: &'a str,
    pub(super) dialect: Dialect,
}

/// A message's content, checked.
struct Incoming {
    text: String,
    task_id: Option<String>,
    context_id: Option<String>,
    mode: RunMode,
    return_immediately: bool,
}

fn opt_str(v: &Value, key: &str) -> Result<Option<String>, RpcError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(RpcError::params(format!("`{key}` must be a string"))),
    }
}

fn parse_message(d: Dialect, params: &Value) -> Result<Incoming, RpcError> {
    let msg = params
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| RpcError::params("`message` (an object) is required"))?;
    let parts = msg
        .get("parts")
        .and_then(Value::as_array)
        .ok_or_else(|| RpcError::params("`message.parts` (an array) is required"))?;
    let mut texts = Vec::new();
    for p in parts {
        match p.get("text").and_then(Value::as_str) {
            Some(t) => texts.push(t),
            None => {
                return Err(RpcError::new(
                    code::CONTENT_TYPE,
                    "only text parts are accepted; upload files to the context's session (PUT /v1/sessions/{contextId}/files/content) and name them in the text",
                ));
            }
        }
    }
    let text = texts.join("\n");
    if text.trim().is_empty() {
        return Err(RpcError::params(
            "the message has no text; say what the agent should do",
        ));
    }
    let mode = [msg.get("metadata"), params.get("metadata")]
        .into_iter()
        .flatten()
        .find_map(|m| m.get("mode"))
        .map(|m| match m.as_str() {
            Some("agent") => Ok(RunMode::Agent),
            Some("plan") => Ok(RunMode::Plan),
            _ => Err(RpcError::params(
                "`metadata.mode` must be \"agent\" or \"plan\"",
            )),
        })
        .transpose()?
        .unwrap_or(RunMode::Agent);
    let conf = params.get("configuration");
    let return_immediately = match d {
        Dialect::V1 => conf.and_then(|c| c.get("returnImmediately")) == Some(&json!(true)),
        Dialect::V03 => conf.and_then(|c| c.get("blocking")) == Some(&json!(false)),
    };
    Ok(Incoming {
        text,
        task_id: opt_str(msg, "taskId")?,
        context_id: opt_str(msg, "contextId")?,
        mode,
        return_immediately,
    })
}

/// The caller's run, or `TaskNotFoundError` (another user's run is not found, as in /v1).
pub(super) async fn owned(ctx: &Ctx<'_>, id: &str) -> Result<RunRow, RpcError> {
    owned_run(ctx.st, ctx.caller, id)
        .await
        .map_err(|e| match e.code() {
            ErrorCode::NotFound => RpcError::task_not_found(id),
            _ => e.into(),
        })
}

async fn reread(ctx: &Ctx<'_>, id: &str) -> Result<RunRow, RpcError> {
    owned(ctx, id).await
}

/// Starts the message's run, or hands it to the task's pending question; the run's row.
async fn begin(ctx: &Ctx<'_>, m: Incoming) -> Result<RunRow, RpcError> {
    let Some(task_id) = m.task_id else {
        let body = CreateRun {
            task: m.text,
            session_id: m.context_id.clone(),
            session: None,
            max_steps: None,
            mode: Some(m.mode),
            agent: None,
        };
        return start_run(ctx.st, ctx.caller, body)
            .await
            .map_err(|e| match (e.code(), &m.context_id) {
                (ErrorCode::NotFound, Some(c)) => RpcError::params(format!(
                    "context {c:?} not found: a context is a session of yours (the contextId of an earlier task); leave it out to start a new one"
                )),
                _ => e.into(),
            });
    };
    let row = owned(ctx, &task_id).await?;
    if m.context_id.as_ref().is_some_and(|c| *c != row.session_id) {
        return Err(RpcError::params(format!(
            "task {task_id} belongs to context {}, not {:?}",
            row.session_id,
            m.context_id.unwrap_or_default()
        )));
    }
    match row.state {
        RunState::WaitingForHuman => {
            answer(ctx.st, &row, m.text).await?;
            reread(ctx, &task_id).await
        }
        s if s.is_terminal() => Err(RpcError::new(
            code::UNSUPPORTED,
            format!(
                "task {task_id} has ended; send a new message with its contextId (and no taskId) to continue the conversation"
            ),
        )),
        _ => Err(RpcError::new(
            code::UNSUPPORTED,
            format!(
                "task {task_id} is working and asks nothing; wait for it (SubscribeToTask) or cancel it"
            ),
        )),
    }
}

/// The regular files in the session's /workspace, as artifact parts (a session that has
/// ended has none to offer).
pub(super) async fn files(ctx: &Ctx<'_>, row: &RunRow) -> Vec<WorkspaceFile> {
    if !row.state.is_terminal() {
        return Vec::new();
    }
    let Ok(live) = crate::sessions::live_session(ctx.st, ctx.caller, &row.session_id).await else {
        return Vec::new();
    };
    let _in_use = live.hold();
    let entries = match live.sandbox.list_dir(WORKSPACE).await {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(run = %row.id, error = %e, "cannot list /workspace for the task's artifacts");
            return Vec::new();
        }
    };
    entries
        .into_iter()
        .filter(|e| e.kind == FileKind::File)
        .take(MAX_FILES)
        .map(|e| {
            let path = format!("{WORKSPACE}/{}", e.name);
            let q: String = url::form_urlencoded::byte_serialize(path.as_bytes()).collect();
            WorkspaceFile {
                url: format!(
                    "{}/v1/sessions/{}/files/content?path={q}",
                    ctx.base, row.session_id
                ),
                name: e.name,
            }
        })
        .collect()
}

/// The task as its row is now (with its files once it ended).
pub(super) async fn task_of(ctx: &Ctx<'_>, row: &RunRow) -> Value {
    let files = files(ctx, row).await;
    wire::task(ctx.dialect, row, &files)
}

/// SendMessage: the task once it ended or asks for input (or at once, when asked to).
pub(super) async fn send(ctx: &Ctx<'_>, params: &Value) -> Result<Value, RpcError> {
    let m = parse_message(ctx.dialect, params)?;
    let immediately = m.return_immediately;
    let row = begin(ctx, m).await?;
    let row = if immediately {
        row
    } else {
        stream::settle(ctx, &row).await?
    };
    Ok(wire::task_result(ctx.dialect, task_of(ctx, &row).await))
}

/// SendStreamingMessage: the task, then its updates until it ends or asks for input.
pub(super) async fn send_streaming(
    ctx: &Ctx<'_>,
    id: Value,
    params: &Value,
) -> Result<Response, RpcError> {
    let m = parse_message(ctx.dialect, params)?;
    let row = begin(ctx, m).await?;
    let after = row.last_seq;
    stream::sse(ctx, id, row, true, after)
}

/// SubscribeToTask: the task as it is, then its updates. With `Last-Event-ID` (the SSE id
/// of the last update received), the updates after it instead, and no snapshot.
pub(super) async fn subscribe(
    ctx: &Ctx<'_>,
    id: Value,
    params: &Value,
    headers: &HeaderMap,
) -> Result<Response, RpcError> {
    let task_id = opt_str(params, "id")?.ok_or_else(|| RpcError::params("`id` is required"))?;
    let row = owned(ctx, &task_id).await?;
    if row.state.is_terminal() {
        return Err(RpcError::new(
            code::UNSUPPORTED,
            format!("task {task_id} has ended; GetTask returns it"),
        ));
    }
    let resume = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .filter(|n| *n <= row.last_seq)
                .ok_or_else(|| {
                    RpcError::params("header `Last-Event-ID`: not the id of an update of this task")
                })?,
        ),
    };
    match resume {
        Some(after) => stream::sse(ctx, id, row, false, after),
        None => {
            let after = row.last_seq;
            stream::sse(ctx, id, row, true, after)
        }
    }
}

pub(super) async fn get(ctx: &Ctx<'_>, params: &Value) -> Result<Value, RpcError> {
    let id = opt_str(params, "id")?.ok_or_else(|| RpcError::params("`id` is required"))?;
    let row = owned(ctx, &id).await?;
    Ok(task_of(ctx, &row).await)
}

pub(super) async fn cancel(ctx: &Ctx<'_>, params: &Value) -> Result<Value, RpcError> {
    let id = opt_str(params, "id")?.ok_or_else(|| RpcError::params("`id` is required"))?;
    let row = owned(ctx, &id).await?;
    if row.state.is_terminal() {
        return Err(RpcError::new(
            code::TASK_NOT_CANCELABLE,
            format!("task {id} has already ended ({})", row.state.as_str()),
        ));
    }
    ctx.st.runs.cancel(&id, CANCEL_WAIT).await;
    let row = reread(ctx, &id).await?;
    Ok(task_of(ctx, &row).await)
}

/// ListTasks: the caller's tasks (an admin's: everyone's, as GET /v1/runs), newest first.
pub(super) async fn list(ctx: &Ctx<'_>, params: &Value) -> Result<Value, RpcError> {
    let size = match params.get("pageSize") {
        None | Some(Value::Null) => 50,
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| RpcError::params("`pageSize` must be between 1 and 100"))?
            as u32,
    };
    let before = match opt_str(params, "pageToken")? {
        None => None,
        Some(t) => Some(t.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
            RpcError::params("`pageToken` is not one this server issued; pass `nextPageToken`")
        })?),
    };
    let state = match opt_str(params, "status")? {
        None => None,
        Some(s) => Some(
            wire::parse_state(&s)
                .ok_or_else(|| RpcError::params(format!("`status` {s:?} is not a task state")))?,
        ),
    };
    let owner = (!ctx.caller.is_admin()).then(|| ctx.caller.id().to_string());
    let page = ctx
        .st
        .store
        .list_runs(&RunQuery {
            owner,
            session_id: opt_str(params, "contextId")?,
            state,
            before,
            limit: size,
        })
        .await
        .map_err(|e| RpcError::from(crate::error::ApiError::from(e)))?;
    let tasks: Vec<Value> = page
        .runs
        .iter()
        .map(|r| wire::task(ctx.dialect, r, &[]))
        .collect();
    Ok(json!({
        "tasks": tasks,
        "nextPageToken": page.next.map(|n| n.to_string()).unwrap_or_default(),
        "pageSize": size,
        "totalSize": tasks.len(),
    }))
}
