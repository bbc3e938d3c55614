//! Agent overhead per step: an in-process OpenAI-compatible responder that answers at once
//! with one bash `true` call, a real session sandbox, and the real loop. What is measured
//! is everything sandboxd adds around the model: building the context, the HTTP round trip
//! through async-openai, parsing, the registry, the persistent shell, events.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Agent, AgentSettings, EventKind, RunRequest};
use crate::llm::{ApiType, Endpoint, LlmClient, LlmSettings};
use crate::sandbox::Sandbox;
use crate::tools::ToolRegistry;
use crate::tools::bash::Bash;
use crate::tools::terminate::Terminate;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot start the local responder: {0}")]
    Responder(#[from] std::io::Error),
    #[error("the benchmark run ended early: {0}")]
    RunEnded(String),
}

async fn answer(State(n): State<Arc<AtomicU64>>, Json(_body): Json<Value>) -> Json<Value> {
    let i = n.fetch_add(1, Ordering::Relaxed);
    Json(json!({
        "id": format!("bench-{i}"), "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                "function": {"name": "bash", "arguments": "{\"command\":\"true\"}"}}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    }))
}

/// Runs `steps` measured agent steps against `sandbox` and returns the duration of each
/// (from one "thinking" event to the next), after one extra warm-up step.
pub async fn bench_agent_step(
    sandbox: Arc<dyn Sandbox>,
    steps: usize,
) -> Result<Vec<Duration>, BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state(Arc::new(AtomicU64::new(0)));
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let endpoint = Endpoint {
        api_type: ApiType::OpenAi,
        base_url: format!("http://{addr}/v1"),
        api_key: "bench".into(),
        model: "bench".into(),
        deployment: String::new(),
        api_version: String::new(),
    };
    let llm = Arc::new(LlmClient::new(
        endpoint,
        None,
        LlmSettings::from_config(&Default::default()),
    ));
    let mut tools = ToolRegistry::new();
    let bash = Bash::new(
        sandbox.clone(),
        Duration::from_secs(30),
        Duration::from_secs(30),
        64 * 1024,
    );
    let _ = tools.register(Arc::new(bash));
    let _ = tools.register(Arc::new(Terminate));
    let settings = AgentSettings {
        max_steps: steps + 1,
        max_observe: 10_000,
        max_input_tokens: 0,
        context_tokens: 100_000,
        transcript_dir: None,
    };
    let agent = Agent::new(llm, tools, settings);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<super::Event>();
    let collector = tokio::spawn(async move {
        let mut marks = Vec::new();
        while let Some(ev) = rx.recv().await {
            if matches!(
                ev.kind,
                EventKind::Thinking { .. } | EventKind::RunFinished { .. }
            ) {
                marks.push(Instant::now());
            }
        }
        marks
    });
    let request = RunRequest::new("benchmark", "bench", sandbox.session_id());
    let outcome = agent.run(request, Some(tx), CancellationToken::new()).await;
    server.abort();
    let marks = collector.await.unwrap_or_default();
    if !matches!(outcome.reason, super::FinishReason::MaxSteps { .. }) {
        return Err(BenchError::RunEnded(outcome.reason.describe()));
    }
    Ok(marks.windows(2).skip(1).map(|w| w[1] - w[0]).collect())
}
