//! What a run tells the world while it happens: typed, serializable events. Sinks
//! (sink.rs) receive them: the CLI renders them (or prints them as JSON lines), the
//! transcript stores them, and the service streams them over SSE. These are wire types:
//! they carry plain strings and numbers, not domain objects.

use serde::{Deserialize, Serialize};

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FinishReason {
    /// The model called terminate.
    Terminated {
        status: String,
    },
    /// The model answered with text and no tool call.
    FinalAnswer,
    MaxSteps {
        max_steps: usize,
    },
    /// The per-run input-token budget is spent.
    TokenBudget {
        budget: u64,
        spent: u64,
    },
    Cancelled,
    Error {
        message: String,
    },
    /// The service stopped the run: a daily quota of its user (`input_tokens_per_day`,
    /// `cpu_seconds_per_day`) is spent.
    QuotaExceeded {
        quota: String,
        limit: u64,
    },
    /// The run was in flight when `serve` stopped or crashed (written by serve).
    Interrupted,
}

impl FinishReason {
    /// Whether the run ended the way a user would call a success.
    pub fn is_success(&self) -> bool {
        match self {
            FinishReason::Terminated { status } => status != "failure",
            FinishReason::FinalAnswer => true,
            _ => false,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            FinishReason::Terminated { status } => format!("terminated ({status})"),
            FinishReason::FinalAnswer => "final answer".into(),
            FinishReason::MaxSteps { max_steps } => format!("reached max_steps ({max_steps})"),
            FinishReason::TokenBudget { budget, spent } => {
                format!("input-token budget spent ({spent} of {budget})")
            }
            FinishReason::Cancelled => "cancelled".into(),
            FinishReason::Error { message } => format!("error: {message}"),
            FinishReason::QuotaExceeded { quota, limit } => {
                format!("the {quota} quota of {limit} is spent")
            }
            FinishReason::Interrupted => "interrupted (the service stopped)".into(),
        }
    }
}

/// One thing that happened in a run. The schema (every type, its fields and when it is
/// sent) is documented in docs/events.md; keep the two together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub run_id: String,
    /// 1 for the first event of a run, then one more for each event: no gaps, no repeats.
    pub seq: u64,
    /// Wall-clock time the event was made, RFC 3339 in UTC with milliseconds.
    pub at: String,
    /// Milliseconds since the run started (monotonic, unlike `at`).
    pub elapsed_ms: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// A piece of the model's answer while it is being written: live only (sent to whoever
/// watches, never stored, no `seq`). The step's `assistant_text` event that follows is the
/// whole answer and the record; a follower that resumes gets that, not the pieces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextDelta {
    pub run_id: String,
    pub step: usize,
    /// The seq of the run's last event when the piece came: it belongs after that event.
    pub after_seq: u64,
    pub text: String,
}

/// An image a tool produced, by reference: the bytes travel once beside the event
/// (`EventSink::event`'s `image`) and a sink that keeps them resolves the reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ImageRef {
    /// `sha256:<hex>` of the bytes, so the same screenshot twice is stored once.
    pub id: String,
    /// "image/png" or "image/jpeg" (from the bytes' magic number, not from the tool).
    pub media_type: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    RunStarted {
        owner: String,
        session_id: String,
        task: String,
        model: String,
        max_steps: usize,
        /// Messages of earlier runs in this session the model sees again (0 for a fresh one).
        #[serde(default)]
        continued_messages: usize,
    },
    /// Something the user should know that is not the model's doing (an MCP server that
    /// was skipped, the MCP tools in use).
    Notice {
        message: String,
    },
    /// The model is being asked (the CLI shows a spinner until the next event).
    Thinking {
        step: usize,
    },
    AssistantText {
        step: usize,
        text: String,
    },
    ToolCall {
        step: usize,
        call_id: String,
        name: String,
        arguments: String,
    },
    ToolResult {
        step: usize,
        call_id: String,
        name: String,
        /// What the model sees, already cut to max_observe.
        output: String,
        is_error: bool,
        has_image: bool,
        /// The image (plot, screenshot) when there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        image: Option<ImageRef>,
        /// The tool's structured record, when it keeps one: web_search and web_fetch put
        /// `{"fetches": [{url, final_url, status, bytes, …}]}` here, so every request that
        /// left the host is in the run's events.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Box<serde_json::Value>>,
        duration_ms: u64,
    },
    /// A further image of the tool result before it (a python cell's second and later
    /// figures), in order: `index` 1 is the result's second image (its `image` is the first).
    ToolImage {
        step: usize,
        call_id: String,
        name: String,
        index: usize,
        image: ImageRef,
    },
    /// The same step came twice; the model is told to change strategy (or no longer is).
    Nudge {
        step: usize,
        active: bool,
    },
    /// Older turns were left out of the request to fit the context budget.
    ContextTrimmed {
        step: usize,
        dropped_messages: usize,
    },
    /// The history did not fit the request budget (or the provider said it was too long):
    /// older tool outputs were masked (their full text written to `files` in /workspace)
    /// and/or the middle of the history summarized by the model.
    ContextCondensed {
        step: usize,
        before_tokens: u64,
        after_tokens: u64,
        masked_outputs: usize,
        summarized_messages: usize,
        #[serde(default)]
        files: Vec<String>,
    },
    Retry {
        attempt: u32,
        max_attempts: u32,
        delay_ms: u64,
        reason: String,
    },
    TokenUsage {
        step: usize,
        prompt_tokens: u64,
        completion_tokens: u64,
        total_prompt_tokens: u64,
        total_completion_tokens: u64,
    },
    Error {
        message: String,
    },
    RunFinished {
        reason: FinishReason,
        answer: Option<String>,
        steps: usize,
        prompt_tokens: u64,
        completion_tokens: u64,
        /// Wall time of the whole run.
        duration_ms: u64,
    },
    /// The service's run changed state (queued, running, waiting_for_human, or terminal:
    /// succeeded, failed, cancelled, interrupted). Only in the service's runs.
    RunState {
        state: String,
    },
    /// The run asks its user (`ask_human`) and waits until `expires_at` (RFC 3339).
    QuestionAsked {
        question: String,
        expires_at: String,
    },
    /// The pending question got its answer: `by` is "user" or "timeout".
    QuestionAnswered {
        by: String,
    },
    /// The planning flow has its plan; `fallback` says why the default plan is used.
    PlanCreated {
        plan: PlanView,
        fallback: Option<String>,
    },
    /// A plan step starts as its own agent run (`step_run_id`); `index` is 0-based.
    StepStarted {
        index: usize,
        text: String,
        /// The executor's tag, or "default".
        executor: String,
        /// 1 for the first attempt, 2 for the retry, …
        attempt: u32,
        step_run_id: String,
    },
    StepFinished {
        index: usize,
        /// The step's status now: completed, blocked, or not_started/in_progress when
        /// it will be retried or the flow stopped.
        status: String,
        notes: String,
        reason: FinishReason,
        attempt: u32,
        step_run_id: String,
    },
    /// The plan was updated after a blocked step.
    Replanned {
        plan: PlanView,
        reason: String,
    },
    FlowFinished {
        status: FlowStatus,
        plan: PlanView,
        summary: String,
        files: Vec<String>,
        prompt_tokens: u64,
        completion_tokens: u64,
        duration_ms: u64,
    },
    /// A connection through the session's egress proxy, allowed or refused, when it ended:
    /// destination, the rule that decided, bytes each way. Never a header, a body or a
    /// query string. Only in the service's runs (the CLI's go to its log).
    Egress {
        record: crate::egress::EgressRecord,
    },
}

/// A plan as the events show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanView {
    pub id: String,
    pub title: String,
    pub steps: Vec<PlanStepView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStepView {
    pub text: String,
    /// not_started, in_progress, completed or blocked.
    pub status: String,
    pub notes: String,
}

/// How a flow ended. Everything but `Completed` is a partial result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FlowStatus {
    /// Every step completed.
    Completed,
    /// A step is blocked after its retries (and any re-planning); `step` is 0-based.
    Blocked {
        step: usize,
        reason: String,
    },
    Cancelled,
    /// The flow's deadline ([flow] timeout_secs) passed.
    TimedOut,
    /// The flow's input-token budget ([flow] max_input_tokens) is spent.
    BudgetSpent {
        budget: u64,
        spent: u64,
    },
}

impl FlowStatus {
    pub fn is_success(&self) -> bool {
        matches!(self, FlowStatus::Completed)
    }

    pub fn describe(&self) -> String {
        match self {
            FlowStatus::Completed => "completed".into(),
            FlowStatus::Blocked { step, reason } => {
                format!("partial: step {} is blocked ({reason})", step + 1)
            }
            FlowStatus::Cancelled => "cancelled".into(),
            FlowStatus::TimedOut => "partial: the flow's deadline passed".into(),
            FlowStatus::BudgetSpent { budget, spent } => {
                format!("partial: the flow's input-token budget is spent ({spent} of {budget})")
            }
        }
    }
}
