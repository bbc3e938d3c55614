//! Streaming and context benchmarks (`sandboxd bench stream`):
//! - time to the first visible token: a real server on loopback, a fake model that streams
//!   its answer (SSE) and notes the instant it hands the first piece of text to its
//!   connection; the SSE client of GET /v1/runs/{id}/events notes when the `delta` with that
//!   text arrives. The difference is what sandboxd adds between the model and a watcher
//!   (the streamed read, the agent's coalescing, the broadcast, the SSE write).
//! - condensation: one condensation of a long history (outputs masked into files in the
//!   sandbox, the middle summarized by a model that answers at once).
//! - token counting: a 10,000-character observation counted with the real tokenizer (what
//!   each step adds per new tool message).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::server::BenchServer;
use super::server_runs::SseReader;
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::SessionManager;

/// The streaming model: each answer waits for `go`, then streams "Hello" (noting when) and
/// a terminate call.
#[derive(Default)]
pub(super) struct Model {
    pub(super) go: Notify,
    pub(super) sent: Mutex<Option<Instant>>,
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let v = json!({"id": "bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {v}\n\n")
}

async fn answer(State(model): State<Arc<Model>>, body: String) -> Response {
    let streamed = serde_json::from_str::<Value>(&body).is_ok_and(|b| b["stream"] == true);
    if !streamed {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            "this bench model only streams",
        )
            .into_response();
    }
    let stream = futures::stream::unfold(0u8, move |i| {
        let model = model.clone();
        async move {
            let piece = match i {
                0 => {
                    model.go.notified().await;
                    chunk(json!({"role": "assistant", "content": ""}), None)
                }
                1 => {
                    if let Ok(mut s) = model.sent.lock() {
                        *s = Some(Instant::now());
                    }
                    chunk(json!({"content": "Hello"}), None)
                }
                2 => chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                        "function": {"name": "terminate", "arguments": "{\"status\": \"success\"}"}}]}),
                    None,
                ),
                3 => chunk(json!({}), Some("tool_calls")),
                4 => "data: [DONE]\n\n".to_string(),
                _ => return None,
            };
            Some((Ok::<_, Infallible>(piece), i + 1))
        }
    });
    (
        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// `n` runs, one at a time in one session; each sample is the model's first text piece
/// handed over → the SSE client has its `delta`.
pub async fn bench_first_token(
    manager: Arc<SessionManager>,
    config: Config,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let (server, model, responder) = streaming_server(manager, config).await?;
    let result = first_tokens(&server, &model, n).await;
    server.stop().await;
    responder.abort();
    result
}

/// A server on loopback whose model is the streaming `Model` (answering on its own port).
pub(super) async fn streaming_server(
    manager: Arc<SessionManager>,
    mut config: Config,
) -> anyhow::Result<(BenchServer, Arc<Model>, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let model = Arc::new(Model::default());
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state(model.clone());
    let responder = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    config.llm.base_url = format!("http://{addr}/v1");
    config.llm.api_key = "bench".into();
    config.llm.model = "bench".into();
    config.llm.api_type = "openai".into();
    config.llm.max_retries = 0;
    config.llm.stream = true;
    let server = BenchServer::start(manager, config, 1).await?;
    Ok((server, model, responder))
}

async fn first_tokens(
    server: &BenchServer,
    model: &Model,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let key = &server.keys[0];
    let session = server.session(key).await?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let body = json!({"task": format!("bench first token {i}"), "session_id": session});
        let r = server
            .http
            .post(format!("{}/v1/runs", server.base))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await?;
        anyhow::ensure!(
            r.status().as_u16() == 201,
            "POST /v1/runs answered {}",
            r.status()
        );
        let run: Value = r.json().await?;
        let id = run["id"].as_str().unwrap_or_default();
        let resp = server
            .http
            .get(format!("{}/v1/runs/{id}/events", server.base))
            .bearer_auth(key)
            .send()
            .await?
            .error_for_status()?;
        // The stream is open (and subscribed to the run's deltas): the model may answer.
        model.go.notify_one();
        let mut reader = SseReader::new(resp);
        let mut got = None;
        while let Some(e) = reader.next().await? {
            if got.is_none() && e.kind == "delta" {
                got = Some(e.at);
            }
        }
        let sent = model.sent.lock().ok().and_then(|mut s| s.take());
        match (sent, got) {
            (Some(sent), Some(got)) => samples.push(got.saturating_duration_since(sent)),
            _ => anyhow::bail!("run {id}: no delta reached the follower"),
        }
    }
    // Its container goes now: the server's stop keeps the sessions (they outlive a serve).
    server.delete_session(key, &session).await;
    Ok(samples)
}

/// A summary answered at once, as the condensation's model.
async fn summary(body: String) -> axum::Json<Value> {
    let _ = body;
    axum::Json(json!({
        "id": "bench-summary", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Summary: the steps printed logs; nothing failed."}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    }))
}

/// A 10,000-character observation: a build log.
fn observation() -> String {
    "INFO build step finished, 42 files compiled in 1.7 s (cache hit)\n"
        .repeat(160)
        .chars()
        .take(10_000)
        .collect()
}

/// A history of `turns` bash steps, each with a 10,000-character observation.
fn long_history(
    turns: usize,
    tokenizer: sandboxd_core::llm::Tokenizer,
) -> sandboxd_core::agent::memory::Memory {
    use sandboxd_core::llm::{FunctionCall, Message, ToolCall};
    let output = observation();
    let mut memory =
        sandboxd_core::agent::memory::Memory::new("system".into(), "task".into(), tokenizer);
    for i in 0..turns {
        let id = format!("call_{i}");
        memory.push(Message::Assistant {
            content: None,
            tool_calls: vec![ToolCall {
                id: id.clone(),
                kind: "function".into(),
                function: FunctionCall {
                    name: "bash".into(),
                    arguments: r#"{"command":"make"}"#.into(),
                },
            }],
        });
        memory.push(Message::tool(id, output.clone()));
    }
    memory
}

/// Condensation samples: a 40-step history (~90,000 tokens) condensed under a 12,000-token
/// budget, outputs masked into files of `sandbox`, the middle summarized; and the cost of
/// counting one 10,000-character observation with the real tokenizer.
pub async fn bench_condense(
    sandbox: Arc<dyn sandboxd_core::sandbox::Sandbox>,
    n: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    use sandboxd_core::agent::condense::Condenser;
    let app = axum::Router::new().route("/v1/chat/completions", post(summary));
    let (llm, _responder) = super::support::local_responder(app).await?;
    let tokenizer = llm.tokenizer();
    let cancel = tokio_util::sync::CancellationToken::new();
    let condenser = Condenser {
        llm: &llm,
        workspace: Some(&sandbox),
        run_id: "bench",
        cancel: &cancel,
    };
    let mut condense = Vec::with_capacity(n);
    let mut count = Vec::with_capacity(n);
    let observation = observation();
    for _ in 0..n {
        let mut memory = long_history(40, tokenizer);
        let started = Instant::now();
        let done = condenser.condense(&mut memory, 12_000).await?;
        condense.push(started.elapsed());
        anyhow::ensure!(done.is_some(), "nothing was condensed");
        let started = Instant::now();
        std::hint::black_box(tokenizer.count(&observation));
        count.push(started.elapsed());
    }
    let _ = sandbox
        .remove(sandboxd_core::agent::condense::SPILL_DIR, true)
        .await;
    Ok((condense, count))
}
