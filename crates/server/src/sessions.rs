//! /v1/sessions: create, list, get and delete sessions, run shell commands and tools in them.
//!
//! Every route that takes an id resolves it through the store and answers 404 unless the
//! caller owns the session (or is an admin): another user's session is indistinguishable
//! from one that never existed.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::auth::Caller;
use crate::backend::Live;
use crate::cpu_quota::Admitted;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorCode, ErrorResponses};
use crate::quota::Quota;
use crate::streams::Kind;
use crate::types::*;
use sandboxd_core::config::LimitRequest;
use sandboxd_core::sandbox::{SandboxError, ShellOptions};
use sandboxd_core::store::{
    SessionCaps, SessionKind, SessionQuery, SessionRow, SessionState, StoreError, now_ms,
};
use sandboxd_core::tools::ToolContext;

const MAX_METADATA: usize = 32;
const MAX_ID_LEN: usize = 128;

fn check_metadata(m: &std::collections::BTreeMap<String, String>) -> Result<(), ApiError> {
    if m.len() > MAX_METADATA {
        return Err(ApiError::invalid(format!(
            "field `metadata`: {} pairs, at most {MAX_METADATA} are allowed",
            m.len()
        )));
    }
    for (k, v) in m {
        check_metadata_key(k)?;
        if v.chars().count() > 512 {
            return Err(ApiError::invalid(format!(
                "field `metadata.{k}`: the value is longer than 512 characters"
            )));
        }
    }
    Ok(())
}

fn check_metadata_key(k: &str) -> Result<(), ApiError> {
    let ok = (1..=64).contains(&k.len())
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "field `metadata`: key {k:?} must match ^[A-Za-z0-9_.-]{{1,64}}$"
        )))
    }
}

/// The caller's session row, or 404 when it does not exist or is someone else's.
pub async fn owned_row(st: &AppState, caller: &Caller, id: &str) -> Result<SessionRow, ApiError> {
    let row = if id.len() > MAX_ID_LEN {
        None
    } else {
        st.store.session(id).await?
    };
    match row {
        Some(r) if caller.owns(&r.owner) => {
            if r.owner != caller.user.id {
                let details = serde_json::json!({"owner": r.owner});
                crate::audit::record(st, &caller.who, "admin.session_access", &r.id, details).await;
            }
            Ok(r)
        }
        _ => Err(ApiError::not_found("session", id)),
    }
}

/// The caller's running session with its sandbox, or 404/409.
pub async fn live_session(st: &AppState, caller: &Caller, id: &str) -> Result<Arc<Live>, ApiError> {
    let row = owned_row(st, caller, id).await?;
    live_of(st, row).await
}

/// `live_session` for new work (a command, a process, a tool call): refused first when the
/// daily CPU quota of the session's owner is spent (cpu_quota.rs; an admin acting in a
/// user's session is held to that user's), before a hibernated one is resumed for it.
pub async fn live_for_work(
    st: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Arc<Live>, ApiError> {
    Ok(admitted_live(st, caller, id).await?.0)
}

/// `live_for_work`, with the check's `Admitted` (whose quota it was: a run keeps checking it).
pub async fn admitted_live(
    st: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(Arc<Live>, Admitted), ApiError> {
    let row = owned_row(st, caller, id).await?;
    let admitted = crate::cpu_quota::admit_owner(st, caller, &row.owner).await?;
    Ok((live_of(st, row).await?, admitted))
}

/// The running session of `row` with its sandbox, or 409.
async fn live_of(st: &AppState, row: SessionRow) -> Result<Arc<Live>, ApiError> {
    let id = row.id.as_str();
    if row.kind == SessionKind::Mcp {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "session {id} is the sandbox of an MCP client: use it through /mcp (DELETE /v1/sessions/{id} ends it); create an API session with POST /v1/sessions"
            ),
        ));
    }
    match row.state {
        SessionState::Running => {}
        SessionState::Creating => {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("session {id} is still being created; retry in a moment"),
            ));
        }
        SessionState::Ended => return Err(ended(&row)),
    }
    // Held here: at once. Anything else (attach on demand, resume from hibernation) under
    // the session's transition lock (resume.rs).
    if !row.hibernated()
        && let Some(live) = crate::attach::held(st, &row).await
    {
        return Ok(live);
    }
    crate::resume::resume_or_attach(st, &row).await
}

fn ended(row: &SessionRow) -> ApiError {
    ApiError::new(
        ErrorCode::Conflict,
        format!(
            "session {} has ended ({}); create a new one",
            row.id,
            row.end_reason.as_deref().unwrap_or("no reason recorded")
        ),
    )
}

/// Maps a sandbox failure; a lost container ends the session for good.
pub async fn sandbox_failed(st: &AppState, live: &Live, e: SandboxError) -> ApiError {
    if matches!(e, SandboxError::SandboxGone { .. }) {
        let who = crate::audit::Who::system();
        let _ = crate::audit::end(st, &who, &live.id, "its container is gone").await;
        let _ = st.backend.remove(&live.owner, Some(&live.runtime_id)).await;
    }
    e.into()
}

#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = CreateSession,
    responses((status = 201, description = "The new session, running", body = Session), ErrorResponses),
    security(("bearer" = [])))]
pub async fn create_session(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiJson(body): ApiJson<CreateSession>,
) -> Result<(StatusCode, Json<Session>), ApiError> {
    let row = create(&st, &caller, body, None).await?;
    let view = Session::of(&row, &st.config.runtime.backend);
    Ok((StatusCode::CREATED, Json(view)))
}

/// The `session.create` entry: who, the limits, the backend and its handle.
async fn audit_created(st: &AppState, caller: &Caller, row: &SessionRow) {
    let details = serde_json::json!({
        "owner": row.owner,
        "limits": row.limits,
        "backend": st.config.runtime.backend,
        "handle": row.container_id,
        "runtime_id": row.runtime_id,
        "egress": row.egress.to_string(),
    });
    crate::audit::record(st, &caller.who, "session.create", &row.id, details).await;
}

/// The longest idle timeout a session may have: the admin's `[sessions] idle_timeout_secs`
/// (a request for more gets this; E2B's set timeout too).
pub fn idle_timeout_cap(st: &AppState) -> u64 {
    st.config.sessions.idle_timeout_secs.max(1)
}

/// Makes a session for the caller (within their quota and ceilings), running; also how
/// POST /v1/runs makes a new session. `admitted`: the daily CPU check this request already
/// made for it (a run's); None checks here.
pub async fn create(
    st: &Arc<AppState>,
    caller: &Caller,
    body: CreateSession,
    admitted: Option<Admitted>,
) -> Result<SessionRow, ApiError> {
    check_metadata(&body.metadata)?;
    sandboxd_core::sandbox::processes::check_env(&body.env)
        .map_err(|e| ApiError::invalid(format!("field `env`: {e}")))?;
    // Before anything is reserved. An unknown template is a 404 (as E2B answers one), with
    // the known names in the message.
    let template = st
        .backend
        .manager()
        .templates()
        .resolve(body.template.as_deref())
        .map_err(|e| ApiError::new(ErrorCode::NotFound, format!("field `template`: {e}")))?;
    let admin_idle = idle_timeout_cap(st);
    let idle = match body.idle_timeout {
        None => admin_idle,
        Some(0) => {
            return Err(ApiError::invalid(
                "field `idle_timeout`: must be at least 1",
            ));
        }
        Some(s) if s > 31_536_000 => {
            return Err(ApiError::invalid(format!(
                "field `idle_timeout`: {s} is above the maximum of 31536000"
            )));
        }
        Some(s) => s.min(admin_idle),
    };
    let quota = Quota::resolve(&st.config.quotas, &caller.user.quota, &st.config.limits);
    // A new session is the caller's own: their day, unless the request already checked it.
    if admitted.is_none() {
        crate::cpu_quota::admit(st, caller).await?;
    }
    let asked = LimitRequest::from(&body.limits);
    if let Some((name, value)) = quota.exceeded_by(&asked) {
        return Err(ApiError::quota(
            name,
            &value,
            format!(
                "limits.{name} is above your ceiling of {value}; ask for less, or ask the admin to raise it"
            ),
        ));
    }
    let egress =
        crate::egress::for_new_session(&st.config.egress, &caller.user.quota, body.egress)?;
    let filled = quota.fill(&asked);
    let limits = st
        .config
        .limits
        .lowered(&filled)
        .map_err(|e| ApiError::invalid(format!("field `limits`: {e}")))?;
    let row = SessionRow::creating(
        format!("ses_{}", uuid::Uuid::new_v4().simple()),
        caller.id(),
        limits,
        body.metadata,
        idle,
        now_ms(),
    )
    .with_egress(egress)
    .with_template(template.image.is_some().then(|| template.name.clone()))
    .with_env(body.env);
    // The global cap is counted in the store with the owner's, across every replica; the
    // row records this replica as its first holder (a create it does not finish is ended
    // by another once its lease is out).
    let caps = SessionCaps {
        per_owner: quota.sessions,
        total: u32::try_from(st.config.sessions.max).unwrap_or(u32::MAX),
        holder: Some(st.replica.id().to_string()),
    };
    match st.store.reserve_session_within(row.clone(), caps).await {
        Err(StoreError::SessionsFull { limit, .. }) => {
            return Err(SandboxError::TooManySessions {
                limit: limit as usize,
            }
            .into());
        }
        other => other?,
    }
    // Made on its own task: a client that disconnects must not leave a half-made session.
    let task_state = st.clone();
    let task_row = row.clone();
    let image = template.image;
    let made = tokio::spawn(async move { make(&task_state, &task_row, &filled, image).await })
        .await
        .map_err(ApiError::internal)?;
    made?;
    let row = st
        .store
        .session(&row.id)
        .await?
        .ok_or_else(|| ApiError::internal("the new session vanished"))?;
    audit_created(st, caller, &row).await;
    Ok(row)
}

async fn make(
    st: &AppState,
    row: &SessionRow,
    filled: &LimitRequest,
    image: Option<String>,
) -> Result<(), ApiError> {
    match st.backend.create(row, filled, image).await {
        Ok(live) => {
            if !row.env.0.is_empty() {
                // A warm sandbox's shell started before the session had an environment.
                live.sandbox.set_session_env(row.env.vars());
                let _ = live.sandbox.restart_shell().await;
            }
            if let Err(e) = st
                .store
                .session_started(&row.id, &live.runtime_id, &live.handle)
                .await
            {
                let _ = st.backend.remove(&row.owner, Some(&live.runtime_id)).await;
                let _ = st.store.delete_session(&row.id).await;
                return Err(e.into());
            }
            crate::egress_proxies::follow(st, live.session(), row).await;
            Ok(())
        }
        Err(e) => {
            let _ = st.store.delete_session(&row.id).await;
            Err(e.into())
        }
    }
}

#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", params(ListSessionsQuery),
    responses((status = 200, description = "Your sessions, newest first (an admin's: everyone's)", body = SessionList), ErrorResponses),
    security(("bearer" = [])))]
pub async fn list_sessions(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<ListSessionsQuery>,
) -> Result<Json<SessionList>, ApiError> {
    let before = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(c.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::invalid("parameter `cursor`: not a cursor this server issued; pass `next_cursor` from the previous page")
        })?),
    };
    let mut metadata = Vec::new();
    if let Some(m) = q.metadata.as_deref().filter(|m| !m.is_empty()) {
        for pair in m.split('&') {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                ApiError::invalid(format!(
                    "parameter `metadata`: {pair:?} is not key=value (encode the filter as key=value&key2=value2)"
                ))
            })?;
            check_metadata_key(k)?;
            metadata.push((k.to_string(), v.to_string()));
        }
        if metadata.len() > MAX_METADATA {
            return Err(ApiError::invalid("parameter `metadata`: too many pairs"));
        }
    }
    let limit = q.limit.unwrap_or(50);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid(
            "parameter `limit`: must be between 1 and 100",
        ));
    }
    let page = st
        .store
        .list_sessions(&SessionQuery {
            owner: (!caller.is_admin()).then(|| caller.id().to_string()),
            include_ended: q.include_ended.unwrap_or(false),
            metadata,
            before,
            limit,
        })
        .await?;
    Ok(Json(SessionList {
        sessions: page
            .sessions
            .iter()
            .map(|r| Session::of(r, &st.config.runtime.backend))
            .collect(),
        next_cursor: page.next.map(|n| n.to_string()),
    }))
}

#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The session", body = Session), ErrorResponses),
    security(("bearer" = [])))]
pub async fn get_session(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Session>, ApiError> {
    let mut row = owned_row(&st, &caller, &id).await?;
    // Looking at a session is no use of it (it may idle out, or hibernate, meanwhile).
    if let Some(live) = st.backend.get_quiet(&row) {
        row.last_used_at = row.last_used_at.max(live.last_used_ms());
    }
    Ok(Json(Session::of(&row, &st.config.runtime.backend)))
}

/// Checks an exec body and finds its session: the sync and the streamed exec take the same
/// body, the same session states and the same timeout and output caps.
pub async fn exec_target(
    st: &AppState,
    caller: &Caller,
    id: &str,
    body: &ExecBody,
) -> Result<(Arc<Live>, ShellOptions), ApiError> {
    if body.command.trim().is_empty() {
        return Err(ApiError::invalid("field `command`: must not be empty"));
    }
    if body.command.contains('\0') {
        return Err(ApiError::invalid("field `command`: contains a NUL byte"));
    }
    let live = live_for_work(st, caller, id).await?;
    let max = live.limits.max_timeout_secs.max(1);
    let timeout = match body.timeout {
        None => st.config.agent.bash_timeout_secs.clamp(1, max),
        Some(0) => return Err(ApiError::invalid("field `timeout`: must be at least 1")),
        Some(t) if t > 86_400 => {
            return Err(ApiError::invalid(format!(
                "field `timeout`: {t} is above the maximum of 86400"
            )));
        }
        Some(t) => t.min(max),
    };
    let opts = ShellOptions {
        timeout: Duration::from_secs(timeout),
        output_cap: live.limits.output_cap(),
    };
    Ok((live, opts))
}

/// The header both execs answer with: the seconds of timeout the command runs under (the
/// request's, or the default, lowered to the session's `max_timeout_secs`).
pub const TIMEOUT_HEADER: &str = "sandboxd-timeout";

#[utoipa::path(post, path = "/v1/sessions/{id}/exec", tag = "sessions", request_body = ExecBody,
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The command ran (see exit_code and timed_out)", body = ExecResult,
        headers(("Sandboxd-Timeout" = u64, description = "The timeout the command ran under, in seconds"),
            ("Sandboxd-Resumed" = String, description = "Present when the session was hibernated and this request resumed it: what survived (its files) and what did not (processes, the shell's state, python variables); `note` says it too"))), ErrorResponses),
    security(("bearer" = [])))]
pub async fn exec(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ExecBody>,
) -> Result<(axum::http::HeaderMap, Json<ExecResult>), ApiError> {
    let (live, opts) = exec_target(&st, &caller, &id, &body).await?;
    let applied = opts.timeout.as_secs();
    // Ended when the caller's credential is revoked (not counted as a stream). Not at
    // shutdown: a request in flight has the drain to finish.
    let guard = st
        .streams
        .open(&caller, Kind::Request, &CancellationToken::new())?;
    // A command may run longer than the session's idle timeout.
    let _in_use = live.hold();
    if !body.env.is_empty() || body.cwd.is_some() {
        let mut result = crate::processes::own_process(&st, &live, &body, opts, &guard).await?;
        if let Some(resumed) = &live.resumed {
            result.note = Some(match result.note.take() {
                Some(note) => format!("{resumed}; {note}"),
                None => resumed.clone(),
            });
        }
        return Ok((exec_headers(applied, &live), Json(result)));
    }
    let out = tokio::select! {
        out = live.sandbox.shell(&body.command, opts) => out,
        _ = guard.token().cancelled() => {
            // Dropping the call mid-command leaves the shell unsynchronized: replacing it
            // kills the command (as the bash tool does on a cancel).
            let _ = live.sandbox.restart_shell().await;
            return Err(match guard.revoked() {
                Some(why) => why.error(),
                None => ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down, so the command was stopped"),
            });
        }
    };
    let out = match out {
        Ok(o) => o,
        Err(e) => return Err(sandbox_failed(&st, &live, e).await),
    };
    st.metrics.exec(out.duration);
    let result = ExecResult {
        exit_code: out.exit_code,
        stdout: out.stdout_lossy(),
        stderr: out.stderr_lossy(),
        stdout_truncated: out.stdout_truncated,
        stderr_truncated: out.stderr_truncated,
        timed_out: out.timed_out,
        duration_ms: out.duration.as_millis() as u64,
        note: match (&live.resumed, out.note) {
            (Some(resumed), Some(note)) => Some(format!("{resumed}; {note}")),
            (resumed, note) => note.or_else(|| resumed.clone()),
        },
        timeout: applied,
    };
    Ok((exec_headers(applied, &live), Json(result)))
}

/// The exec's headers: the timeout applied and, when this request resumed a hibernated
/// session, what survived.
fn exec_headers(applied: u64, live: &Live) -> axum::http::HeaderMap {
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(TIMEOUT_HEADER, HeaderValue::from(applied));
    if let Some(resumed) = live.resumed.as_deref()
        && let Ok(v) = HeaderValue::from_str(resumed)
    {
        headers.insert(crate::resume::RESUMED_HEADER, v);
    }
    headers
}

#[utoipa::path(get, path = "/v1/tools", tag = "tools",
    responses((status = 200, description = "The tools every session offers", body = Vec<ToolInfo>), ErrorResponses),
    security(("bearer" = [])))]
pub async fn list_tools(State(st): State<Arc<AppState>>) -> Json<Vec<ToolInfo>> {
    Json(st.tool_specs.clone())
}

#[utoipa::path(post, path = "/v1/sessions/{id}/tools/{name}", tag = "tools",
    request_body(content = Object, description = "The tool's arguments, as its schema in GET /v1/tools says"),
    params(("id" = String, Path, description = "The session id"), ("name" = String, Path, description = "The tool name")),
    responses((status = 200, description = "The tool ran; failures it reports are in `error`", body = ToolCallResult), ErrorResponses),
    security(("bearer" = [])))]
pub async fn call_tool(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, name)): ApiPath<(String, String)>,
    ApiJson(args): ApiJson<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<ToolCallResult>, ApiError> {
    let live = live_for_work(&st, &caller, &id).await?;
    // The session's own tools, so a run in it sees what this call leaves (python
    // variables, the browser's tabs, the editor's undo history), and the other way round.
    let registry = live.tools(&st.config);
    let Some(tool) = registry.get(&name) else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "no tool {name:?}; the tools are: {}",
                registry.names().join(", ")
            ),
        ));
    };
    let args = serde_json::Value::Object(args);
    sandboxd_core::tools::registry::check_args(&tool.parameters(), &args)
        .map_err(|m| ApiError::invalid(format!("arguments of {name}: {m}")))?;
    // Dropping this request (client gone, time limit) cancels the tool, which kills its
    // command; so does a revoked credential (the guard's token is the parent).
    let guard = st
        .streams
        .open(&caller, Kind::Request, &CancellationToken::new())?;
    let cancel = guard.token().child_token();
    let _on_drop = cancel.clone().drop_guard();
    let ctx = ToolContext { cancel };
    let result = {
        // A call may last longer than the session's idle timeout.
        let _in_use = live.hold();
        registry.execute(&name, &args.to_string(), &ctx).await
    };
    crate::metering::tool_call(st.store.as_ref(), &live.id).await;
    if let Some(why) = guard.revoked() {
        return Err(why.error());
    }
    match result {
        Ok(r) => Ok(Json(ToolCallResult {
            is_error: r.is_error(),
            images: r.images().cloned().collect(),
            output: r.output,
            error: r.error,
            base64_image: r.base64_image,
            system: match (&live.resumed, r.system) {
                (Some(resumed), Some(system)) => Some(format!("{resumed}; {system}")),
                (resumed, system) => system.or_else(|| resumed.clone()),
            },
        })),
        Err(sandboxd_core::tools::ToolError::Sandbox(e)) => {
            Err(sandbox_failed(&st, &live, e).await)
        }
        Err(e) => Err(ApiError::internal(e)),
    }
}
