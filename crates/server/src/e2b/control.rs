//! E2B's control plane at `/e2b`: create, get, list, kill (pause, connect and set timeout are
//! in lifecycle.rs). Each is the /v1 handler of the same operation (`sessions::create`,
//! `list_sessions`, `get_session`, `session_end::delete_session`) with E2B's names around
//! it: a sandbox is an API session of the key's user, its id the session's id, E2B's
//! `timeout` its idle timeout, a hibernated session a paused sandbox.
//!
//! What sandboxd refuses by design (internet access, network rules, auto-pause, MCP
//! gateways, volumes, templates it does not have) is answered as E2B answers a refused
//! request: `{"code": 400, "message": ...}` saying why.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{E2bError, ENVD_VERSION};
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, ApiQuery};
use crate::types::{CreateSession, ListSessionsQuery, Session, SessionKindView, SessionStatus};

/// The metadata key that records which E2B template a sandbox was made from.
const TEMPLATE_KEY: &str = "e2b.template";
/// The template names that are sandboxd's default image: E2B's base template and the code
/// interpreter's (the image has python, numpy, pandas and matplotlib).
pub(super) const TEMPLATES: [&str; 2] = ["base", "code-interpreter-v1"];

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    metadata: BTreeMap<String, String>,
    env_vars: BTreeMap<String, String>,
    auto_pause: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<Value>,
    mcp: Option<Value>,
    volume_mounts: Option<Vec<Value>>,
}

pub(super) fn refused(why: &str) -> E2bError {
    E2bError::invalid(format!("sandboxd refuses this by design: {why}"))
}

/// What the request asks that sandboxd never gives.
fn check_refused(body: &NewSandbox) -> Result<(), E2bError> {
    if body.allow_internet_access == Some(true) {
        return Err(refused(
            "a sandbox has no network (allow_internet_access=true); reach hosts through sandboxd's per-session egress policy (PUT /v1/sessions/{id}/egress) where the admin allows it",
        ));
    }
    if body
        .network
        .as_ref()
        .is_some_and(|n| n.as_object().is_some_and(|o| !o.is_empty()))
    {
        return Err(refused(
            "network rules and public port URLs do not apply: a sandbox has no network and exposes no ports",
        ));
    }
    if body.auto_pause == Some(true) {
        return Err(refused(
            "a sandbox is not paused automatically; pause it (Sandbox.pause) and it is kept until its timeout, or the admin's hibernate_after_secs hibernates an idle one",
        ));
    }
    if body.mcp.as_ref().is_some_and(|m| !m.is_null()) {
        return Err(refused(
            "no MCP gateway runs in a sandbox; sandboxd serves MCP itself at /mcp",
        ));
    }
    if body.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(refused("volumes are not mounted into sandboxes"));
    }
    Ok(())
}

/// The sandboxd template an E2B template name makes a sandbox from: E2B's base and code
/// interpreter templates are the default image (None); any other name is one of the admin's
/// `[[templates]]` (or `default`). An unknown name is E2B's not-found, listing the names
/// this server knows.
fn sandboxd_template(st: &AppState, name: &str) -> Result<Option<String>, E2bError> {
    if TEMPLATES.contains(&name) {
        return Ok(None);
    }
    let templates = st.backend.manager().templates();
    match templates.resolve(Some(name)) {
        Ok(t) => Ok(Some(t.name)),
        Err(_) => {
            let known: Vec<String> = TEMPLATES
                .iter()
                .map(|t| t.to_string())
                .chain(templates.names())
                .collect();
            Err(E2bError::not_found(format!(
                "template '{}' not found: this sandboxd knows {} (base and code-interpreter-v1 are its default image)",
                name.chars().take(64).collect::<String>(),
                known.join(", ")
            )))
        }
    }
}

/// The key the caller authenticated with, which the SDK sends back as envd's access token
/// and as the traffic token (the code interpreter's context routes send only that one).
pub(super) fn access_token(headers: &HeaderMap) -> Option<String> {
    crate::auth::request_key(headers).map(str::to_string)
}

pub(super) async fn create(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<NewSandbox>,
) -> Result<Response, E2bError> {
    check_refused(&body)?;
    let template = body.template_id.clone().unwrap_or_else(|| "base".into());
    let image = sandboxd_template(&st, &template)?;
    if body.metadata.contains_key(TEMPLATE_KEY) {
        return Err(E2bError::invalid(format!(
            "metadata key {TEMPLATE_KEY} is sandboxd's own"
        )));
    }
    let mut metadata = body.metadata;
    metadata.insert(TEMPLATE_KEY.into(), template.clone());
    let request = CreateSession {
        metadata,
        idle_timeout: body.timeout.filter(|t| *t > 0),
        template: image,
        env: body.env_vars,
        ..CreateSession::default()
    };
    let row = crate::sessions::create(&st, &caller, request, None).await?;
    let mut answer = json!({
        "templateID": template,
        "sandboxID": row.id,
        "clientID": "sandboxd",
        "envdVersion": ENVD_VERSION,
        "alias": template,
    });
    if let Some(token) = access_token(&headers) {
        answer["envdAccessToken"] = json!(token);
        answer["trafficAccessToken"] = json!(token);
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// A session as E2B's `ListedSandbox`/`SandboxDetail`: a hibernated session is a paused
/// sandbox; its template is the one it was made from (the E2B name asked for, for the
/// default image).
pub(super) fn view(s: &Session, token: Option<&str>) -> Value {
    let mut metadata = s.metadata.clone();
    let asked = metadata.remove(TEMPLATE_KEY);
    let template = if s.template == sandboxd_core::config::DEFAULT_TEMPLATE {
        asked.unwrap_or_else(|| "base".into())
    } else {
        s.template.clone()
    };
    let end_at = s.last_used_at + chrono::Duration::seconds(s.idle_timeout as i64);
    let state = match s.state {
        SessionStatus::Hibernated => "paused",
        _ => "running",
    };
    let mut v = json!({
        "templateID": template,
        "alias": template,
        "sandboxID": s.id,
        "clientID": "sandboxd",
        "startedAt": s.created_at,
        "endAt": end_at,
        "cpuCount": s.limits.cpus.ceil().max(1.0) as u64,
        "memoryMB": s.limits.memory_mb,
        "diskSizeMB": s.limits.workspace_mb,
        "state": state,
        "envdVersion": ENVD_VERSION,
        "metadata": metadata,
    });
    if let Some(t) = token {
        v["envdAccessToken"] = json!(t);
        v["trafficAccessToken"] = json!(t);
    }
    v
}

/// An API session that runs or is hibernated (paused); an MCP client's sandbox and an
/// ended session are no E2B sandbox.
fn is_e2b_visible(s: &Session) -> bool {
    matches!(s.kind, SessionKindView::Api)
        && matches!(s.state, SessionStatus::Running | SessionStatus::Hibernated)
}

/// The caller's sandbox `id`, running or paused, as /v1 sees it (not a use of it: a paused
/// one stays paused); E2B's not-found otherwise.
pub(super) async fn sandbox(
    st: &Arc<AppState>,
    caller: &Caller,
    id: &str,
) -> Result<Session, E2bError> {
    let Json(s) = crate::sessions::get_session(
        State(st.clone()),
        Extension(caller.clone()),
        ApiPath(id.to_string()),
    )
    .await?;
    if !is_e2b_visible(&s) {
        return Err(E2bError::not_found(format!("sandbox \"{id}\" not found")));
    }
    Ok(s)
}

pub(super) async fn get_one(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, E2bError> {
    let s = sandbox(&st, &caller, &id).await?;
    Ok(Json(view(&s, access_token(&headers).as_deref())))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<u32>,
    next_token: Option<String>,
}

pub(super) async fn list(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Result<Response, E2bError> {
    // Running and paused by default, as E2B lists; `state` narrows it.
    let states: Vec<&str> = match q.state.as_deref() {
        Some(state) => state.split(',').collect(),
        None => vec!["running", "paused"],
    };
    let wanted = |s: &Session| {
        let name = match s.state {
            SessionStatus::Hibernated => "paused",
            _ => "running",
        };
        states.contains(&name)
    };
    // The SDK percent-encodes each key and value, then URL-encodes the pairs.
    let metadata = q.metadata.map(|m| {
        m.split('&')
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                format!("{}={}", decode(k), decode(v))
            })
            .collect::<Vec<_>>()
            .join("&")
    });
    let query = ListSessionsQuery {
        limit: Some(q.limit.unwrap_or(100).clamp(1, 100)),
        cursor: q.next_token,
        metadata,
        include_ended: Some(false),
    };
    let Json(page) = crate::sessions::list_sessions(
        State(st.clone()),
        Extension(caller.clone()),
        ApiQuery(query),
    )
    .await?;
    let items: Vec<Value> = page
        .sessions
        .iter()
        .filter(|s| is_e2b_visible(s) && wanted(s))
        .map(|s| view(s, None))
        .collect();
    let mut r = Json(items).into_response();
    if let Some(next) = page
        .next_cursor
        .and_then(|n| HeaderValue::from_str(&n).ok())
    {
        r.headers_mut().insert("x-next-token", next);
    }
    Ok(r)
}

/// `%XX` escapes decoded (a malformed one is kept as it is).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) async fn kill(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    sandbox(&st, &caller, &id).await?;
    crate::session_end::delete_session(State(st), Extension(caller), ApiPath(id)).await?;
    Ok(StatusCode::NO_CONTENT)
}
