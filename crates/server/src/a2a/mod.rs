//! A2A (Agent2Agent) on `serve`: the agent card at `/.well-known/agent-card.json` and the
//! JSON-RPC binding at `POST /a2a`, v1.0 (`A2A-Version: 1.0`) and 0.3 (no header), as a thin
//! shell over the runs service: a task is a run, a context is a session, a message starts a
//! run (or answers the run's `ask_human` question when it names a task waiting for input),
//! the artifacts are the run's answer and the files in /workspace, a stream is the run's
//! event log translated (stream.rs), cancel is the run's cancel. Every method goes through
//! the same checks as /v1 (`runs::routes::start_run`, `owned_run`, `answer`): the auth layer
//! in front, the user's quotas, 404 (here `TaskNotFoundError`) for another user's task.
//!
//! Why not the official Rust SDK, `a2a-server-lf` (0.5.3, a2aproject/a2a-rs, axum): its
//! `DefaultRequestHandler` drives an `AgentExecutor` and keeps tasks in its own `TaskStore`,
//! which would be a second run flow beside the runs service (its own task states, its own
//! event queue, no replicas, no fencing, no resumable log), and its `RequestHandler` seam
//! would still leave us every mapping here. It speaks only v1.0 (no 0.3 method names, which a
//! header-less request must get), and it pulls reqwest 0.13, tower-http 0.7 and the
//! protobuf stack (a2a-pb/prost) next to our reqwest 0.12 and tower-http 0.6: two copies of
//! each in every build for a JSON-RPC surface of some hundred lines. The wire shapes are
//! checked against the official Python `a2a-sdk` instead (tests/serve_a2a.rs).
//!
//! Push-notification config methods answer `PushNotificationNotSupportedError` (the card says
//! `pushNotifications: false`).

pub mod card;
mod send;
mod stream;
pub mod wire;

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use self::wire::Dialect;
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorCode};

/// A2A's JSON-RPC error codes (spec §5.4 and JSON-RPC 2.0).
pub mod code {
    pub const PARSE: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    pub const TASK_NOT_FOUND: i64 = -32001;
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    pub const PUSH_NOT_SUPPORTED: i64 = -32003;
    pub const UNSUPPORTED: i64 = -32004;
    pub const CONTENT_TYPE: i64 = -32005;
    pub const VERSION_NOT_SUPPORTED: i64 = -32009;
    /// sandboxd's own errors (quotas, capacity, conflicts): `data` holds the /v1 error body.
    pub const SERVER: i64 = -32000;
}

/// A JSON-RPC error: the code, the message, and the /v1 error detail when there is one.
#[derive(Debug)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn params(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }

    pub fn task_not_found(id: &str) -> Self {
        Self::new(
            code::TASK_NOT_FOUND,
            format!("task {id:?} not found (it does not exist, or it is not yours)"),
        )
    }

    fn body(&self, id: &Value) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.data {
            e["data"] = d.clone();
        }
        json!({"jsonrpc": "2.0", "id": id, "error": e})
    }
}

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> Self {
        let c = match e.code() {
            ErrorCode::NotFound => code::TASK_NOT_FOUND,
            ErrorCode::InvalidRequest | ErrorCode::PayloadTooLarge => code::INVALID_PARAMS,
            ErrorCode::Internal => code::INTERNAL,
            _ => code::SERVER,
        };
        Self {
            code: c,
            message: e.detail.message.clone(),
            data: serde_json::to_value(&e.detail).ok(),
        }
    }
}

/// One JSON-RPC call, checked.
pub struct Call {
    pub id: Value,
    pub method: String,
    pub params: Value,
    pub dialect: Dialect,
}

fn parse_call(headers: &HeaderMap, body: &[u8]) -> Result<Call, (Value, RpcError)> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        let e = RpcError::new(code::PARSE, format!("the body is not JSON: {e}"));
        (Value::Null, e)
    })?;
    let id = v.get("id").cloned().unwrap_or(Value::Null);
    let bad = |m: &str| (id.clone(), RpcError::new(code::INVALID_REQUEST, m));
    if !(id.is_string() || id.is_number() || id.is_null()) {
        return Err((
            Value::Null,
            RpcError::new(code::INVALID_REQUEST, "`id` must be a string or a number"),
        ));
    }
    if v.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(bad("not a JSON-RPC 2.0 request: `jsonrpc` must be \"2.0\""));
    }
    let Some(method) = v.get("method").and_then(Value::as_str) else {
        return Err(bad("`method` must be a string"));
    };
    let params = v.get("params").cloned().unwrap_or_else(|| json!({}));
    if !params.is_object() {
        return Err((id, RpcError::params("`params` must be an object")));
    }
    let version = headers
        .get("a2a-version")
        .map(|h| h.to_str().unwrap_or("?"));
    let Some(dialect) = Dialect::parse(version) else {
        let e = RpcError::new(
            code::VERSION_NOT_SUPPORTED,
            format!(
                "A2A-Version {:?} is not supported; this agent speaks 1.0 and 0.3 (no header)",
                version.unwrap_or_default()
            ),
        );
        return Err((id, e));
    };
    Ok(Call {
        id,
        method: method.to_string(),
        params,
        dialect,
    })
}

pub fn ok(id: &Value, result: Value) -> Response {
    Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}

pub fn err(id: &Value, e: RpcError) -> Response {
    Json(e.body(id)).into_response()
}

/// The public card.
pub async fn agent_card(headers: HeaderMap) -> Response {
    Json(card::card(&card::base_url(&headers))).into_response()
}

/// `POST /a2a`: one JSON-RPC call (batches are not part of A2A).
pub async fn handle(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let call = match parse_call(&headers, &body) {
        Ok(c) => c,
        Err((id, e)) => return err(&id, e),
    };
    let base = card::base_url(&headers);
    let ctx = send::Ctx {
        st: &st,
        caller: &caller,
        base: &base,
        dialect: call.dialect,
    };
    let d = call.dialect;
    let r = match (d, call.method.as_str()) {
        (Dialect::V1, "SendMessage") | (Dialect::V03, "message/send") => {
            send::send(&ctx, &call.params)
                .await
                .map(|t| ok(&call.id, t))
        }
        (Dialect::V1, "SendStreamingMessage") | (Dialect::V03, "message/stream") => {
            send::send_streaming(&ctx, call.id.clone(), &call.params).await
        }
        (Dialect::V1, "SubscribeToTask") | (Dialect::V03, "tasks/resubscribe") => {
            send::subscribe(&ctx, call.id.clone(), &call.params, &headers).await
        }
        (Dialect::V1, "GetTask") | (Dialect::V03, "tasks/get") => {
            send::get(&ctx, &call.params).await.map(|t| ok(&call.id, t))
        }
        (Dialect::V1, "ListTasks") => send::list(&ctx, &call.params)
            .await
            .map(|t| ok(&call.id, t)),
        (Dialect::V1, "CancelTask") | (Dialect::V03, "tasks/cancel") => {
            send::cancel(&ctx, &call.params)
                .await
                .map(|t| ok(&call.id, t))
        }
        (Dialect::V1, "GetExtendedAgentCard")
        | (Dialect::V03, "agent/getAuthenticatedExtendedCard") => {
            Ok(ok(&call.id, card::card(&base)))
        }
        (_, m) if m.contains("ushNotificationConfig") => Err(RpcError::new(
            code::PUSH_NOT_SUPPORTED,
            "push notifications are not supported; stream the task (SendStreamingMessage, SubscribeToTask) or poll it (GetTask)",
        )),
        (_, m) => Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            format!(
                "no method {m:?} in A2A {}",
                if d == Dialect::V1 {
                    "1.0"
                } else {
                    "0.3 (send `A2A-Version: 1.0` for the 1.0 names)"
                }
            ),
        )),
    };
    r.unwrap_or_else(|e| err(&call.id, e))
}
