//! A scripted OpenAI-compatible server (axum) for tests: it answers POST
//! /v1/chat/completions with the next `Reply` of its script — tool calls, text, an HTTP
//! error with headers, or a raw JSON body — and records every request it received.
//!
//! ```text
//! let llm = FakeLlm::start(vec![Reply::tool("bash", json!({"command": "ls"})), Reply::text("done")]).await;
//! let client = llm.client();            // or use llm.base_url() in an [llm] config
//! ... run the agent ...
//! assert_eq!(llm.requests().len(), 2);
//! ```
//!
//! When the script runs out, the fallback reply is used (`start_with_fallback`), else the
//! server answers 400 "the fake LLM's script is exhausted" (400 is never retried, so a test
//! that asks for more than it scripted fails at once and says why).
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use sandboxd_core::llm::{ApiType, Endpoint, LlmClient, LlmSettings};

pub use crate::fake_llm_stream::Piece;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// An answer streamed in exactly these pieces (gates between them hold it half-written);
    /// to a request without `stream` it is sent whole.
    Streamed(Vec<Piece>),
    /// An assistant message with optional text and tool calls `(name, raw JSON arguments)`.
    Assistant {
        content: Option<String>,
        calls: Vec<(String, String)>,
    },
    /// An HTTP error with a body and extra headers (Retry-After, ...).
    Error {
        status: u16,
        body: Value,
        headers: Vec<(String, String)>,
    },
    /// A 200 with exactly this body (what Ollama or vLLM send).
    Raw(Value),
    /// Waits, then answers with the inner reply.
    Delayed(Duration, Box<Reply>),
    /// Holds the inner reply until the test opens the gate.
    Gated(Gate, Box<Reply>),
    /// Built from the request's body: a "model" whose answer carries what it was shown (a
    /// test then proves the text came through the run, not from the script).
    FromRequest(fn(&Value) -> Reply),
}

/// Holds `Reply::Gated` answers until `open` (then it stays open): a run that keeps its
/// LLM request in flight for exactly as long as a test needs, with no timing involved.
#[derive(Debug, Clone, Default)]
pub struct Gate(tokio_util::sync::CancellationToken);

impl Gate {
    pub fn open(&self) {
        self.0.cancel();
    }

    pub(crate) async fn wait(&self) {
        self.0.cancelled().await;
    }
}

impl Reply {
    pub fn tool(name: &str, args: Value) -> Reply {
        Reply::tools(vec![(name, args)])
    }

    pub fn tools(calls: Vec<(&str, Value)>) -> Reply {
        Reply::Assistant {
            content: None,
            calls: calls
                .into_iter()
                .map(|(n, a)| (n.to_string(), a.to_string()))
                .collect(),
        }
    }

    /// A call whose arguments are sent as given, malformed or not.
    pub fn tool_raw(name: &str, raw_args: &str) -> Reply {
        Reply::Assistant {
            content: None,
            calls: vec![(name.to_string(), raw_args.to_string())],
        }
    }

    pub fn text(text: &str) -> Reply {
        Reply::Assistant {
            content: Some(text.to_string()),
            calls: Vec::new(),
        }
    }

    /// Adds assistant text to a tool-call reply.
    pub fn with_content(self, text: &str) -> Reply {
        match self {
            Reply::Assistant { calls, .. } => Reply::Assistant {
                content: Some(text.to_string()),
                calls,
            },
            other => other,
        }
    }

    /// An error in OpenAI's format: `{"error": {"message": ..., "type": ...}}`.
    pub fn error(status: u16, message: &str) -> Reply {
        Reply::Error {
            status,
            body: json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}}),
            headers: Vec::new(),
        }
    }

    pub fn header(self, name: &str, value: &str) -> Reply {
        match self {
            Reply::Error {
                status,
                body,
                mut headers,
            } => {
                headers.push((name.to_string(), value.to_string()));
                Reply::Error {
                    status,
                    body,
                    headers,
                }
            }
            other => other,
        }
    }

    pub fn raw(body: Value) -> Reply {
        Reply::Raw(body)
    }

    pub fn delayed(self, by: Duration) -> Reply {
        Reply::Delayed(by, Box::new(self))
    }

    /// This reply, held until `gate` is opened.
    pub fn gated(self, gate: &Gate) -> Reply {
        Reply::Gated(gate.clone(), Box::new(self))
    }
}

/// A request as the server received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub body: Value,
    pub headers: Vec<(String, String)>,
    pub at: Instant,
}

struct Shared {
    script: Mutex<VecDeque<Reply>>,
    fallback: Option<Reply>,
    requests: Mutex<Vec<Recorded>>,
    counter: AtomicU64,
}

pub struct FakeLlm {
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeLlm {
    pub async fn start(script: Vec<Reply>) -> FakeLlm {
        Self::launch(script, None).await
    }

    /// After the script, answers `fallback` forever.
    pub async fn start_with_fallback(script: Vec<Reply>, fallback: Reply) -> FakeLlm {
        Self::launch(script, Some(fallback)).await
    }

    async fn launch(script: Vec<Reply>, fallback: Option<Reply>) -> FakeLlm {
        let shared = Arc::new(Shared {
            script: Mutex::new(script.into()),
            fallback,
            requests: Mutex::new(Vec::new()),
            counter: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            // Azure's path shape, so an azure config can be pointed here too.
            .route(
                "/openai/deployments/{deployment}/chat/completions",
                post(handle),
            )
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake LLM");
        let addr = listener.local_addr().expect("fake LLM address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeLlm {
            shared,
            addr,
            server,
        }
    }

    /// `http://127.0.0.1:PORT/v1`, as [llm] base_url wants it.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.recorded().into_iter().map(|r| r.body).collect()
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.shared
            .requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            api_type: ApiType::OpenAi,
            base_url: self.base_url(),
            api_key: "sk-fake".into(),
            model: "fake-model".into(),
            deployment: String::new(),
            api_version: String::new(),
        }
    }

    /// Client settings for tests: short backoff so retry tests stay fast.
    pub fn settings() -> LlmSettings {
        let mut s = LlmSettings::from_config(&Default::default());
        s.backoff_base = Duration::from_millis(20);
        s.timeout = Duration::from_secs(30);
        s
    }

    pub fn client(&self) -> Arc<LlmClient> {
        Arc::new(LlmClient::new(self.endpoint(), None, Self::settings()))
    }
}

async fn handle(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: String) -> Response {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    let prompt_chars = body.to_string().len() as u64;
    let shown = body.clone();
    if let Ok(mut r) = shared.requests.lock() {
        r.push(Recorded {
            body,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
                .collect(),
            at: Instant::now(),
        });
    }
    let next = shared
        .script
        .lock()
        .ok()
        .and_then(|mut s| s.pop_front())
        .or_else(|| shared.fallback.clone());
    let Some(held) = next else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": {"message": "the fake LLM's script is exhausted"}})),
        )
            .into_response();
    };
    let mut reply = held;
    let reply = loop {
        reply = match reply {
            Reply::Delayed(by, inner) => {
                tokio::time::sleep(by).await;
                *inner
            }
            Reply::Gated(gate, inner) => {
                gate.0.cancelled().await;
                *inner
            }
            Reply::FromRequest(make) => make(&shown),
            ready => break ready,
        };
    };
    let n = shared.counter.fetch_add(1, Ordering::Relaxed);
    let streamed = shown["stream"] == Value::Bool(true);
    let reply = match reply {
        Reply::Assistant { content, calls } if streamed => {
            let pieces = crate::fake_llm_stream::fragments(content.as_deref(), &calls);
            return crate::fake_llm_stream::response(pieces, n, prompt_chars);
        }
        Reply::Streamed(pieces) if streamed => {
            return crate::fake_llm_stream::response(pieces, n, prompt_chars);
        }
        Reply::Streamed(pieces) => whole(pieces),
        other => other,
    };
    match reply {
        Reply::Assistant { content, calls } => {
            let tool_calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| json!({"id": format!("call_{n}_{i}"), "type": "function", "function": {"name": name, "arguments": args}}))
                .collect();
            let mut message = json!({"role": "assistant", "content": content});
            if !tool_calls.is_empty() {
                message["tool_calls"] = Value::Array(tool_calls);
            }
            let finish = if calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            };
            axum::Json(json!({
                "id": format!("chatcmpl-fake-{n}"), "object": "chat.completion", "created": 1_700_000_000u64, "model": "fake-model",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                // ~4 characters per token, like the agent's own estimate.
                "usage": {"prompt_tokens": prompt_chars / 4, "completion_tokens": 10, "total_tokens": prompt_chars / 4 + 10}
            }))
            .into_response()
        }
        Reply::Error {
            status,
            body,
            headers,
        } => {
            let mut resp = (
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                axum::Json(body),
            )
                .into_response();
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
                    resp.headers_mut().insert(k, v);
                }
            }
            resp
        }
        Reply::Raw(body) => axum::Json(body).into_response(),
        Reply::Delayed(..) | Reply::Gated(..) | Reply::FromRequest(..) | Reply::Streamed(..) => {
            unreachable!("unwrapped above")
        }
    }
}

/// A streamed script answered whole (the request did not ask for a stream).
fn whole(pieces: Vec<Piece>) -> Reply {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => content.push_str(&t),
            Piece::Call {
                index,
                name,
                arguments,
            } => {
                if calls.len() <= index {
                    calls.resize(index + 1, (String::new(), String::new()));
                }
                if let Some(name) = name {
                    calls[index].0 = name;
                }
                calls[index].1.push_str(&arguments);
            }
            // Answered whole: nothing to wait for, and no stream to break.
            Piece::Wait(_) | Piece::Break => {}
        }
    }
    Reply::Assistant {
        content: (!content.is_empty()).then_some(content),
        calls,
    }
}

/// Checks OpenAI's pairing rule on one request body: every assistant tool call is answered
/// by exactly one tool message before the next non-tool message, and every tool message
/// answers a call of the assistant message right before its group.
pub fn check_tool_pairing(body: &Value) -> Result<(), String> {
    let messages = body["messages"].as_array().ok_or("no messages array")?;
    let mut open: Vec<String> = Vec::new();
    let mut answered: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default().to_string();
            if !open.contains(&id) {
                return Err(format!(
                    "message {i}: tool message for {id:?} has no preceding assistant tool call"
                ));
            }
            if answered.contains(&id) {
                return Err(format!("message {i}: second tool message for {id:?}"));
            }
            answered.push(id);
            continue;
        }
        if let Some(missing) = open.iter().find(|id| !answered.contains(id)) {
            return Err(format!(
                "message {i} ({role}) comes before the tool result of {missing:?}"
            ));
        }
        open.clear();
        answered.clear();
        if role == "assistant" {
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                open.push(c["id"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    if let Some(missing) = open.iter().find(|id| !answered.contains(id)) {
        return Err(format!(
            "the request ends before the tool result of {missing:?}"
        ));
    }
    Ok(())
}

/// The text of the last message of a recorded request whose role is `role`.
pub fn last_of_role(body: &Value, role: &str) -> Option<String> {
    body["messages"]
        .as_array()?
        .iter()
        .rev()
        .find(|m| m["role"] == role)
        .map(|m| {
            m["content"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| m["content"].to_string())
        })
}
