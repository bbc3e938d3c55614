//! The planning flow: OpenManus's `PlanningFlow` without its bugs. One LLM call writes a
//! plan through the planning tool; each step runs as its own agent run in the same session
//! (same container, python state, browser, files), told to do that step only; how a run
//! ends decides the step's status (one bounded retry, then blocked, then optional bounded
//! re-planning); a deadline, a token budget and cancellation cover the whole flow; the
//! summary is written from what the steps produced. Progress goes out as plan events.

pub mod agent_runner;
mod events;
mod planner;
mod prompts;
mod run;
pub mod runner;
pub mod steps;
pub mod summary;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use crate::config::{ExecutorConfig, FlowConfig};
pub use crate::events::{FlowStatus, PlanView};
pub use agent_runner::AgentStepRunner;
pub use runner::{StepOutcome, StepRequest, StepRunner};

use crate::agent::{EventSink, FinishReason};
use crate::llm::{LlmClient, Usage};
use crate::tools::planning::Plan;

/// One task for the flow, and whom it belongs to.
#[derive(Debug, Clone)]
pub struct FlowRequest {
    /// Names the flow's own events (each step's run has its own run id).
    pub flow_id: String,
    pub task: String,
    pub owner: String,
    pub session_id: String,
}

impl FlowRequest {
    pub fn new(
        task: impl Into<String>,
        owner: impl Into<String>,
        session_id: impl Into<String>,
    ) -> Self {
        Self {
            flow_id: new_flow_id(),
            task: task.into(),
            owner: owner.into(),
            session_id: session_id.into(),
        }
    }
}

/// A flow id: like a run id, with its own prefix.
pub fn new_flow_id() -> String {
    crate::agent::new_run_id().replacen("run-", "flow-", 1)
}

/// One run of one step.
#[derive(Debug, Clone)]
pub struct StepAttempt {
    /// 0-based index of the step in the plan at the time.
    pub index: usize,
    /// 1 for the first attempt, 2 for the retry, …
    pub attempt: u32,
    pub run_id: String,
    pub executor: String,
    pub reason: FinishReason,
    pub answer: Option<String>,
    /// Agent steps the run took.
    pub steps: usize,
}

/// How a flow ended, with everything it produced.
#[derive(Debug, Clone)]
pub struct FlowOutcome {
    pub flow_id: String,
    pub status: FlowStatus,
    /// The plan as it ended (statuses and notes).
    pub plan: Plan,
    /// Set when the default plan was used, saying why.
    pub planner_fallback: Option<String>,
    pub attempts: Vec<StepAttempt>,
    /// The final answer (a partial result says which step stopped the flow).
    pub summary: String,
    /// Files under /workspace at the end.
    pub files: Vec<String>,
    pub usage: Usage,
    pub replans: u32,
    pub elapsed: Duration,
}

pub struct PlanningFlow {
    llm: Arc<LlmClient>,
    runner: Arc<dyn StepRunner>,
    config: FlowConfig,
}

impl PlanningFlow {
    pub fn new(llm: Arc<LlmClient>, runner: Arc<dyn StepRunner>, config: FlowConfig) -> Self {
        Self {
            llm,
            runner,
            config,
        }
    }

    /// Runs the task to its end. Events of the flow and of every step's run go to
    /// `sink`; `cancel` stops the flow at once (the step in flight is cancelled).
    pub async fn run(
        &self,
        request: FlowRequest,
        sink: Arc<dyn EventSink>,
        cancel: CancellationToken,
    ) -> FlowOutcome {
        run::FlowRun::new(self, request, &sink, cancel)
            .execute()
            .await
    }
}
