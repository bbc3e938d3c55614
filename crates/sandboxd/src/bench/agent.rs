//! Agent overhead per step: an in-process OpenAI-compatible responder that answers at once
//! with one bash `true` call, a real session sandbox, and the real loop. What is measured
//! is everything sandboxd adds around the model: building the context, the HTTP round trip
//! through async-openai, parsing, the registry, the persistent shell, events through the
//! sinks. Also: continuing a kept session, up to its first request to the model.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::bench::support::{local_responder, tool_call_completion};
use sandboxd_core::agent::{
    Agent, AgentSettings, AgentTask, Event, EventKind, EventSink, FanOut, Image, MemorySink,
};
use sandboxd_core::agent::{NullSink, RunContext, RunRequest, run_in_session};
use sandboxd_core::config::{Config, LimitRequest, Limits, SessionsConfig};
use sandboxd_core::sandbox::Sandbox;
use sandboxd_core::sandbox::{CreateOptions, Owner, Runtime, SessionManager};
use sandboxd_core::tools::ToolRegistry;
use sandboxd_core::tools::ask_human::NoHuman;
use sandboxd_core::tools::bash::Bash;
use sandboxd_core::tools::terminate::Terminate;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot start the local responder: {0}")]
    Responder(#[from] std::io::Error),
    #[error("the benchmark run ended early: {0}")]
    RunEnded(String),
    #[error(transparent)]
    Sandbox(#[from] sandboxd_core::sandbox::SandboxError),
}

/// When each step started (its "thinking" event) and when the run finished.
#[derive(Default)]
struct Marks(std::sync::Mutex<Vec<Instant>>);

#[async_trait::async_trait]
impl EventSink for Marks {
    async fn event(&self, event: &Event, _image: Option<&Image>) {
        if matches!(
            event.kind,
            EventKind::Thinking { .. } | EventKind::RunFinished { .. }
        ) && let Ok(mut m) = self.0.lock()
        {
            m.push(Instant::now());
        }
    }
}

async fn answer(State(n): State<Arc<AtomicU64>>, Json(_body): Json<Value>) -> Json<Value> {
    let i = n.fetch_add(1, Ordering::Relaxed);
    Json(tool_call_completion(i, "bash", r#"{"command":"true"}"#))
}

/// Runs `steps` measured agent steps against `sandbox` and returns the duration of each
/// (from one "thinking" event to the next), after one extra warm-up step.
pub async fn bench_agent_step(
    sandbox: Arc<dyn Sandbox>,
    steps: usize,
) -> Result<Vec<Duration>, BenchError> {
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state(Arc::new(AtomicU64::new(0)));
    let (llm, responder) = local_responder(app).await?;
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
        condense: true,
    };
    let agent = Agent::new(llm, tools, settings);
    // The sinks a CLI run has: one that watches (here: marks the steps) and one that keeps
    // every event (as the transcript does), behind the fan-out.
    let marks = Arc::new(Marks::default());
    let sink = FanOut(vec![marks.clone(), MemorySink::new()]);
    let task = AgentTask::new("benchmark", "bench", sandbox.session_id());
    let outcome = agent.run(task, &sink, CancellationToken::new()).await;
    drop(responder);
    let marks = marks.0.lock().map(|m| m.clone()).unwrap_or_default();
    if !matches!(
        outcome.reason,
        sandboxd_core::agent::FinishReason::MaxSteps { .. }
    ) {
        return Err(BenchError::RunEnded(outcome.reason.describe()));
    }
    Ok(marks.windows(2).skip(1).map(|w| w[1] - w[0]).collect())
}

/// Arrival times of the requests the continuation responder answered.
#[derive(Default)]
struct Arrivals(std::sync::Mutex<Vec<Instant>>);

async fn terminate_answer(
    State(arrivals): State<Arc<Arrivals>>,
    Json(_body): Json<Value>,
) -> Json<Value> {
    let i = match arrivals.0.lock() {
        Ok(mut a) => {
            a.push(Instant::now());
            a.len()
        }
        Err(_) => 0,
    };
    Json(tool_call_completion(
        i,
        "terminate",
        r#"{"status":"success"}"#,
    ))
}

/// Continuing a kept session as `sandboxd run --session ID` does in a new process: a new
/// manager finds the session's container, `run_in_session` restores the conversation from
/// the last run's transcript and asks the model. Each sample runs from before the manager
/// is made to the moment the model's endpoint receives the first request (the CLI's own
/// process start and config loading are not in it).
pub async fn bench_continue(
    runtime: Arc<dyn Runtime>,
    limits: Limits,
    sessions: SessionsConfig,
    config: Config,
    n: usize,
) -> Result<Vec<Duration>, BenchError> {
    let arrivals = Arc::new(Arrivals::default());
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(terminate_answer))
        .with_state(arrivals.clone());
    let (llm, responder) = local_responder(app).await?;
    let dir = std::env::temp_dir().join(format!("sandboxd-bench-continue-{}", std::process::id()));
    let ctx = RunContext {
        llm,
        config,
        transcripts: Some(dir.clone()),
    };
    let first = SessionManager::new(
        runtime.clone(),
        limits.clone(),
        sessions.clone(),
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    let owner = Owner::new("bench")?;
    let session = first
        .create(
            &owner,
            &LimitRequest::default(),
            CreateOptions { keep: true },
        )
        .await?;
    let result = async {
        let once = |s: Arc<sandboxd_core::sandbox::manager::Session>| {
            let ctx = ctx.clone();
            async move {
                run_in_session(
                    &ctx,
                    &s,
                    RunRequest::new("continue the benchmark"),
                    Arc::new(NoHuman),
                    Arc::new(NullSink),
                    CancellationToken::new(),
                )
                .await
                .map_err(|e| BenchError::RunEnded(e.to_string()))
            }
        };
        once(session.clone()).await?;
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let before = arrivals.0.lock().map(|a| a.len()).unwrap_or(0);
            let started = Instant::now();
            // A new manager knows nothing of the session, as in a new process.
            let manager = SessionManager::new(
                runtime.clone(),
                limits.clone(),
                sessions.clone(),
                std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
            );
            let s = manager.get(&owner, &session.id).await?;
            once(s).await?;
            let first_request = arrivals.0.lock().ok().and_then(|a| a.get(before).copied());
            if let Some(at) = first_request {
                samples.push(at.saturating_duration_since(started));
            }
        }
        Ok(samples)
    }
    .await;
    drop(responder);
    let _ = first.remove(&owner, &session.id).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
