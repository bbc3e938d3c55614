//! The flow's one boundary to the agent: "run one agent run in this session with this
//! prompt, these tools, this many steps, this cancellation, and tell me how it ended".
//!
//! The flow never builds an agent itself: `agent_runner.rs` implements this with
//! `run_in_session`, the one entry point of a run, and the benchmark puts an instant runner
//! here to measure the flow alone.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::agent::{EventSink, FinishReason};
use crate::llm::Usage;
use crate::tools::planning::PlanBook;

/// One step's run, as the flow asks for it.
#[derive(Debug, Clone)]
pub struct StepRequest {
    /// Chosen by the flow so its step events can name the run before it starts.
    pub run_id: String,
    /// The task of the run: the plan, the step to do, the rules.
    pub prompt: String,
    /// The tools offered, by name; None offers all. The runner always adds the planning
    /// tool scoped to this step and terminate.
    pub tools: Option<Vec<String>>,
    /// A paragraph for the run's system prompt (the executor's prompt).
    pub system_note: Option<String>,
    /// Most steps of the run; None means the runner's default.
    pub max_steps: Option<usize>,
    /// Input tokens the run may spend; 0 means the runner's own budget only.
    pub max_input_tokens: u64,
    /// The plan and the 0-based step this run works on.
    pub plan_id: String,
    pub step_index: usize,
}

/// How a step's run ended.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    pub run_id: String,
    pub reason: FinishReason,
    /// The terminate answer or the final text answer.
    pub answer: Option<String>,
    /// Agent steps (think → act) the run took.
    pub steps: usize,
    pub usage: Usage,
}

#[async_trait]
pub trait StepRunner: Send + Sync {
    /// Runs one agent run in the flow's session (same container, python, browser, files).
    /// Never fails: an error is a `FinishReason::Error` outcome.
    async fn run_step(
        &self,
        request: StepRequest,
        sink: Arc<dyn EventSink>,
        cancel: CancellationToken,
    ) -> StepOutcome;

    /// The session's plans.
    fn plans(&self) -> Arc<PlanBook>;

    /// Files under /workspace, relative to it, for the summary (at most a few hundred).
    async fn workspace_files(&self) -> Vec<String>;
}
