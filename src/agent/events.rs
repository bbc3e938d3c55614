//! What a run tells the world while it happens: typed, serializable events. The CLI renders
//! them (or prints them as JSON lines), the transcript stores them, and later the API
//! streams them over SSE. These are wire types: they carry plain strings and numbers, not
//! domain objects.

use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

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
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub run_id: String,
    pub seq: u64,
    /// Milliseconds since the run started.
    pub elapsed_ms: u64,
    #[serde(flatten)]
    pub kind: EventKind,
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
        duration_ms: u64,
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
}

/// Numbers events, forwards them to a listener (if any) and keeps them for the transcript.
pub struct Emitter {
    run_id: String,
    started: Instant,
    tx: Option<mpsc::UnboundedSender<Event>>,
    log: Mutex<Vec<Event>>,
}

impl Emitter {
    pub fn new(run_id: String, tx: Option<mpsc::UnboundedSender<Event>>) -> Self {
        Self {
            run_id,
            started: Instant::now(),
            tx,
            log: Mutex::new(Vec::new()),
        }
    }

    pub fn emit(&self, kind: EventKind) {
        let Ok(mut log) = self.log.lock() else { return };
        let event = Event {
            run_id: self.run_id.clone(),
            seq: log.len() as u64,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
            kind,
        };
        if let Some(tx) = &self.tx {
            // A listener that went away (closed terminal, dropped client) does not stop the run.
            let _ = tx.send(event.clone());
        }
        log.push(event);
    }

    pub fn events(&self) -> Vec<Event> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }
}
