//! The flow's own overhead per step, without LLM time: an in-process OpenAI-compatible
//! responder that answers at once (a plan of many steps for the planner, terminate for a
//! step, a line of text for the summary), and the time from one step_started event to the
//! next. Measured twice: over an instant step runner (the flow alone: marking, prompts,
//! events) and over real runs in a session (`run_in_session`), beside plain runs of the
//! same one-call shape in the same session as the baseline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Json;
use axum::routing::post;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::bench::support::local_responder;
use sandboxd_core::agent::{
    Event, EventKind, EventSink, FinishReason, History, Image, NullSink, RunContext, RunRequest,
    run_in_session,
};
use sandboxd_core::config::Config;
use sandboxd_core::flow::runner::{StepOutcome, StepRequest, StepRunner};
use sandboxd_core::flow::{AgentStepRunner, FlowConfig, FlowRequest, FlowStatus, PlanningFlow};
use sandboxd_core::llm::{LlmClient, Usage};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::tools::ask_human::NoHuman;
use sandboxd_core::tools::planning::PlanBook;
use sandboxd_core::tools::planning::book::MAX_STEPS_CEILING;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot start the local responder: {0}")]
    Responder(#[from] std::io::Error),
    #[error("the benchmark flow ended early: {0}")]
    Ended(String),
    #[error("the baseline run did not start: {0}")]
    Run(#[from] sandboxd_core::agent::RunError),
}

/// Samples of one bench: the flow's step intervals and the baseline's (may be empty).
pub struct FlowBench {
    pub instant: Vec<Duration>,
    pub with_agent: Vec<Duration>,
    pub plain_agent: Vec<Duration>,
}

async fn answer(Json(body): Json<Value>) -> Json<Value> {
    let tools: Vec<&str> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    let call = |name: &str, args: Value| {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": name, "arguments": args.to_string()}}]})
    };
    let message = if tools.contains(&"terminate") {
        call("terminate", json!({"status": "success", "answer": "done"}))
    } else if tools.is_empty() {
        json!({"role": "assistant", "content": "summary"})
    } else {
        let steps: Vec<String> = (1..=MAX_STEPS_CEILING)
            .map(|i| format!("Do part {i}"))
            .collect();
        call(
            "planning",
            json!({"command": "create", "title": "bench", "steps": steps}),
        )
    };
    Json(json!({
        "id": "bench", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    }))
}

/// A runner whose steps succeed at once.
struct Instant0(Arc<PlanBook>);

#[async_trait]
impl StepRunner for Instant0 {
    async fn run_step(
        &self,
        r: StepRequest,
        _sink: Arc<dyn EventSink>,
        _cancel: CancellationToken,
    ) -> StepOutcome {
        StepOutcome {
            run_id: r.run_id,
            reason: FinishReason::Terminated {
                status: "success".into(),
            },
            answer: Some("done".into()),
            steps: 1,
            usage: Usage::default(),
        }
    }

    fn plans(&self) -> Arc<PlanBook> {
        self.0.clone()
    }

    async fn workspace_files(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Notes when each step starts.
#[derive(Default)]
struct Marks(std::sync::Mutex<Vec<Instant>>);

#[async_trait]
impl EventSink for Marks {
    async fn event(&self, event: &Event, _image: Option<&Image>) {
        if matches!(event.kind, EventKind::StepStarted { .. })
            && let Ok(mut m) = self.0.lock()
        {
            m.push(Instant::now());
        }
    }
}

/// Runs flows until `n` step intervals are measured.
async fn intervals(
    llm: &Arc<LlmClient>,
    runner: impl Fn() -> Arc<dyn StepRunner>,
    n: usize,
) -> Result<Vec<Duration>, BenchError> {
    let config = FlowConfig {
        max_plan_steps: MAX_STEPS_CEILING,
        ..FlowConfig::default()
    };
    let mut samples = Vec::new();
    while samples.len() < n {
        let flow = PlanningFlow::new(llm.clone(), runner(), config.clone());
        let marks = Arc::new(Marks::default());
        let request = FlowRequest::new("benchmark", "bench", "bench");
        let outcome = flow
            .run(request, marks.clone(), CancellationToken::new())
            .await;
        if outcome.status != FlowStatus::Completed {
            return Err(BenchError::Ended(outcome.status.describe()));
        }
        let marks = marks.0.lock().map(|m| m.clone()).unwrap_or_default();
        samples.extend(marks.windows(2).map(|w| w[1] - w[0]));
    }
    samples.truncate(n);
    Ok(samples)
}

/// The three samples; the agent ones run in `session` with all its tools.
pub async fn bench_flow(
    session: Arc<Session>,
    config: &Config,
    n: usize,
) -> Result<FlowBench, BenchError> {
    let app = axum::Router::new().route("/v1/chat/completions", post(answer));
    let (llm, responder) = local_responder(app).await?;
    let result = measure(&llm, session, config, n).await;
    drop(responder);
    result
}

async fn measure(
    llm: &Arc<LlmClient>,
    session: Arc<Session>,
    config: &Config,
    n: usize,
) -> Result<FlowBench, BenchError> {
    let instant = intervals(
        llm,
        || Arc::new(Instant0(Arc::new(PlanBook::new(MAX_STEPS_CEILING)))),
        n,
    )
    .await?;
    let mut config = config.clone();
    config.flow.max_plan_steps = MAX_STEPS_CEILING;
    let ctx = RunContext {
        llm: llm.clone(),
        config,
        transcripts: None,
    };
    let with_agent = {
        let (ctx, session) = (ctx.clone(), session.clone());
        intervals(
            llm,
            move || {
                Arc::new(AgentStepRunner::new(
                    ctx.clone(),
                    session.clone(),
                    Arc::new(NoHuman),
                ))
            },
            n,
        )
        .await?
    };
    // The baseline: the same one-call run in the same session, started by hand.
    let mut plain_agent = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let mut request = RunRequest::new("benchmark");
        request.history = History::Fresh;
        let o = run_in_session(
            &ctx,
            &session,
            request,
            Arc::new(NoHuman),
            Arc::new(NullSink),
            CancellationToken::new(),
        )
        .await?;
        if !o.reason.is_success() {
            return Err(BenchError::Ended(o.reason.describe()));
        }
        plain_agent.push(t.elapsed());
    }
    Ok(FlowBench {
        instant,
        with_agent,
        plain_agent,
    })
}
