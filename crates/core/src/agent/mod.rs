//! The agent: a ReAct loop (think → act → observe) on an OpenAI-compatible LLM, with every
//! tool call going into the session's sandbox through the registry.
//!
//! An `Agent` holds no per-run state: `run` builds a fresh memory, counters and stuck
//! detector each time (OpenManus kept its step counter and memory between requests). What
//! a session carries from one run to the next (its conversation, its tools' state) lives
//! with the session and is composed by `run_in_session` (session_run.rs), the one entry
//! point the CLI, the MCP server and the service share.

pub mod condense;
pub mod extract;
mod live;
pub mod memory;
pub mod profiles;
pub mod prompts;
mod react;
pub mod session_run;
pub mod sink;
pub mod transcript;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use crate::events::{Event, EventKind, FinishReason, ImageRef, TextDelta};
pub use session_run::{
    History, RunContext, RunError, RunRequest, RunShape, SessionLease, run_in_session,
};
pub use sink::{EventSink, FanOut, Image, MemorySink, NullSink, RunRecord};

use crate::config::Config;
use crate::llm::{LlmClient, Message, Usage};
use crate::tools::ToolRegistry;

/// Loop settings, from [agent].
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub max_steps: usize,
    /// Characters of one tool observation shown to the model.
    pub max_observe: usize,
    /// Input tokens one run may spend; 0 means no budget.
    pub max_input_tokens: u64,
    /// Token budget of the context sent in one request (0: the model's window).
    pub context_tokens: usize,
    /// Condense the history before trimming it (condense.rs).
    pub condense: bool,
}

impl AgentSettings {
    pub fn from_config(config: &Config) -> Self {
        let a = &config.agent;
        Self {
            max_steps: a.max_steps.max(1),
            max_observe: a.max_observe.max(100),
            max_input_tokens: a.max_input_tokens,
            context_tokens: a.context_tokens,
            condense: a.condense,
        }
    }
}

/// One task for the loop, and whom it belongs to.
#[derive(Debug, Clone)]
pub struct AgentTask {
    /// Chosen by the caller so it can name outputs before the run starts (`new_run_id()`).
    pub run_id: String,
    pub task: String,
    pub owner: String,
    pub session_id: String,
    /// The conversation this run continues (messages after the system prompt, tool calls
    /// paired; see `memory::paired_prefix`); empty for a fresh one.
    pub earlier: Vec<Message>,
    /// Told to the sinks right after `run_started` (e.g. an MCP server that was skipped).
    pub notices: Vec<String>,
}

impl AgentTask {
    /// A fresh task with a new run id.
    pub fn new(
        task: impl Into<String>,
        owner: impl Into<String>,
        session_id: impl Into<String>,
    ) -> Self {
        Self {
            run_id: new_run_id(),
            task: task.into(),
            owner: owner.into(),
            session_id: session_id.into(),
            earlier: Vec::new(),
            notices: Vec::new(),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub run_id: String,
    pub reason: FinishReason,
    /// The terminate answer or the final text answer.
    pub answer: Option<String>,
    pub steps: usize,
    pub usage: Usage,
    pub elapsed: std::time::Duration,
    /// Everything after the system prompt: what the session's next run continues.
    pub conversation: Vec<Message>,
    /// Where the transcript was written (set by `run_in_session`).
    pub transcript: Option<std::path::PathBuf>,
}

pub struct Agent {
    llm: Arc<LlmClient>,
    tools: ToolRegistry,
    settings: AgentSettings,
    /// The session's browser, whose state joins the next prompt while it is in use.
    browser: Option<Arc<crate::tools::browser::BrowserUse>>,
    /// Runs before every step (MCP servers refresh their tools there).
    hook: Option<Arc<dyn StepHook>>,
    /// Extra paragraphs for the system prompt, e.g. MCP servers' instructions.
    system_notes: Vec<String>,
    /// The session's sandbox, where condensation keeps the outputs it masks.
    workspace: Option<Arc<dyn crate::sandbox::Sandbox>>,
}

/// Called before every step with the run's own tool registry; returns notes for the model
/// (e.g. "tools added: …"), which are added to the conversation.
#[async_trait::async_trait]
pub trait StepHook: Send + Sync {
    async fn before_step(&self, tools: &mut ToolRegistry) -> Vec<String>;
}

impl Agent {
    pub fn new(llm: Arc<LlmClient>, tools: ToolRegistry, settings: AgentSettings) -> Self {
        Self {
            llm,
            tools,
            settings,
            browser: None,
            hook: None,
            system_notes: Vec::new(),
            workspace: None,
        }
    }

    /// The sandbox whose /workspace keeps the full text of outputs condensation masks.
    pub fn with_workspace(mut self, sandbox: Arc<dyn crate::sandbox::Sandbox>) -> Self {
        self.workspace = Some(sandbox);
        self
    }

    pub fn with_hook(mut self, hook: Arc<dyn StepHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Paragraphs appended to the system prompt, each attributed by the caller.
    pub fn with_system_notes(mut self, notes: Vec<String>) -> Self {
        self.system_notes = notes;
        self
    }

    /// Shows the model the browser's current state (and, for a multimodal model, its
    /// screenshot) in the step after it used the browser, as OpenManus's Manus.think does.
    pub fn with_browser(mut self, browser: Arc<crate::tools::browser::BrowserUse>) -> Self {
        self.browser = Some(browser);
        self
    }

    pub fn settings(&self) -> &AgentSettings {
        &self.settings
    }

    /// Runs one task to its end. Events go to `sink` as they happen; `cancel` stops the
    /// run at once, cancelling the tool call in flight.
    pub async fn run(
        &self,
        task: AgentTask,
        sink: &dyn EventSink,
        cancel: CancellationToken,
    ) -> RunOutcome {
        react::Run::new(self, task, sink, cancel).execute().await
    }
}

/// A run id: sortable by time, unique, safe as a file name.
pub fn new_run_id() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "run-{secs}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}
