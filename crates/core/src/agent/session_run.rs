//! A run as a library call: `run_in_session` takes a session, a `RunRequest`, an asker
//! and an event sink and returns the outcome. The CLI (`sandboxd run`), the planning flow
//! and the service are thin shells over it; none of them composes a run itself.
//!
//! What a session carries from run to run lives in its slots: the tools' state
//! (`SessionTools`: python interpreter, browser, editor history; the shell lives in the
//! sandbox handle) and the conversation (`Conversation` here). A kept session that this
//! process has not run yet gets its conversation back from the transcript of its last run.
//!
//! `SessionLease` is the guard that removes a session's container however the caller's
//! code ends (an error, a panic, an early return), unless the session is kept.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::extract::LlmExtractor;
use super::memory::paired_prefix;
use super::sink::{EventSink, FanOut};
use super::transcript::{TranscriptSink, last_conversation};
use super::{Agent, AgentSettings, AgentTask, RunOutcome, StepHook, new_run_id};
use crate::config::Config;
use crate::llm::{LlmClient, Message};
use crate::mcp::client::McpClients;
use crate::sandbox::SandboxError;
use crate::sandbox::manager::{Session, SessionManager};
use crate::tools::ToolRegistry;
use crate::tools::ask_human::Asker;
use crate::tools::session::SessionTools;

/// What every run of a process shares: the LLM, the configuration and where transcripts
/// go (None keeps none, and restores no conversation from them).
#[derive(Clone)]
pub struct RunContext {
    pub llm: Arc<LlmClient>,
    pub config: Config,
    pub transcripts: Option<PathBuf>,
}

impl RunContext {
    /// Transcripts under the data directory (`<data>/runs`).
    pub fn new(llm: Arc<LlmClient>, config: Config) -> Self {
        let transcripts = Some(config.data_dir().join("runs"));
        Self {
            llm,
            config,
            transcripts,
        }
    }
}

/// Which conversation the run continues.
#[derive(Debug, Clone, Default)]
pub enum History {
    /// The session's own: its previous run in this process, or the transcript of its last
    /// run. Empty for a new session.
    #[default]
    Session,
    /// None: the model sees only this task (the session's conversation restarts here).
    Fresh,
    /// Given by the caller (a service that keeps conversations in its own store).
    Given(Vec<Message>),
}

/// One task for a session, with its per-run overrides.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// Chosen by the caller so it can name outputs before the run starts.
    pub run_id: String,
    pub task: String,
    /// Overrides [agent] max_steps.
    pub max_steps: Option<usize>,
    /// An mcp.json whose servers' tools the run may use.
    pub mcp_servers: Option<PathBuf>,
    pub history: History,
    /// Tools and prompt of a run that does one part of a bigger job (a plan step).
    pub shape: RunShape,
}

impl RunRequest {
    pub fn new(task: impl Into<String>) -> Self {
        Self {
            run_id: new_run_id(),
            task: task.into(),
            max_steps: None,
            mcp_servers: None,
            history: History::Session,
            shape: RunShape::default(),
        }
    }
}

impl RunRequest {
    /// The run with `profile`'s tools, prompt and step limit (a step limit the request set
    /// itself stays).
    pub fn with_profile(mut self, profile: &super::profiles::Profile) -> Self {
        self.shape.tools = profile.tools.clone();
        self.shape.system_note = profile.prompt.clone();
        self.max_steps = self.max_steps.or(profile.max_steps);
        self
    }
}

/// How a run differs from a plain one, for a caller that runs the session's agent on a part
/// of a bigger job (the planning flow's steps). The default is a plain run.
#[derive(Clone, Default)]
pub struct RunShape {
    /// Offer only these of the session's tools (terminate is always offered); None: all.
    pub tools: Option<Vec<String>>,
    /// Tools added for this run only (the planning tool scoped to one step).
    pub extra_tools: Vec<Arc<dyn crate::tools::Tool>>,
    /// A paragraph added to the system prompt.
    pub system_note: Option<String>,
    /// Lowers [agent] max_input_tokens for this run; 0 changes nothing.
    pub max_input_tokens: u64,
}

impl std::fmt::Debug for RunShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let extra: Vec<&str> = self.extra_tools.iter().map(|t| t.name()).collect();
        f.debug_struct("RunShape")
            .field("tools", &self.tools)
            .field("extra_tools", &extra)
            .field("system_note", &self.system_note)
            .field("max_input_tokens", &self.max_input_tokens)
            .finish()
    }
}

impl RunShape {
    /// Narrows `registry` to the shape's tools and adds its extra ones.
    fn apply(&self, registry: &mut ToolRegistry) {
        if let Some(keep) = &self.tools {
            for name in registry.names() {
                if name != crate::tools::terminate::NAME && !keep.contains(&name) {
                    registry.unregister(&name);
                }
            }
        }
        for tool in &self.extra_tools {
            if let Err(e) = registry.register(tool.clone()) {
                tracing::error!(tool = tool.name(), error = %e, "a run's extra tool was rejected");
            }
        }
    }
}

/// Why a run did not start. Once it has started, every ending is a `RunOutcome`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the task is empty; say what the agent should do")]
    EmptyTask,
    #[error("cannot use the MCP servers in {path}: {message}")]
    Mcp { path: PathBuf, message: String },
}

/// A session's conversation in this process; None until its first run here looked for it.
#[derive(Default)]
struct Conversation(Mutex<Option<Vec<Message>>>);

impl Conversation {
    fn take_or_restore(&self, restore: impl FnOnce() -> Vec<Message>) -> Vec<Message> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.get_or_insert_with(restore).clone()
    }

    fn set(&self, messages: Vec<Message>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(messages);
    }
}

/// Runs `request` in `session` to its end. Events go to `sink` (and to a transcript when
/// `ctx.transcripts` is set); `cancel` stops the run, killing the tool call in flight.
pub async fn run_in_session(
    ctx: &RunContext,
    session: &Session,
    request: RunRequest,
    asker: Arc<dyn Asker>,
    sink: Arc<dyn EventSink>,
    cancel: CancellationToken,
) -> Result<RunOutcome, RunError> {
    if request.task.trim().is_empty() {
        return Err(RunError::EmptyTask);
    }
    // Not idle while the run lasts, however long a step takes; idle from its end.
    let _in_use = session.hold();
    let tools = SessionTools::of(session, &ctx.config);
    tools
        .browser
        .set_extractor(Some(Arc::new(LlmExtractor::new(ctx.llm.clone()))));
    let mut registry = tools.agent_registry(asker);
    request.shape.apply(&mut registry);
    let Mcp {
        hook: mcp,
        mut notices,
        mut system_notes,
    } = connect_mcp(request.mcp_servers.as_ref(), session, &mut registry).await?;
    notices.extend(connect_remote_agents(&ctx.config, session, &mut registry).await);
    if let Some(resumed) = resume_notice(session) {
        system_notes.push(resumed.clone());
        notices.insert(0, resumed);
    }

    let conversation = session.slots.get_or_insert_with(Conversation::default);
    let earlier = match request.history {
        History::Fresh => Vec::new(),
        History::Given(messages) => paired_prefix(messages),
        History::Session => conversation.take_or_restore(|| {
            ctx.transcripts
                .as_deref()
                .and_then(|dir| last_conversation(dir, &session.id, session.owner.as_str()))
                .unwrap_or_default()
        }),
    };

    let settings = settings_for(&ctx.config, request.max_steps, &request.shape);
    system_notes.extend(request.shape.system_note.clone());
    let mut agent = Agent::new(ctx.llm.clone(), registry, settings)
        .with_browser(tools.browser.clone())
        .with_workspace(session.sandbox.clone())
        .with_system_notes(system_notes);
    if let Some(hook) = &mcp {
        agent = agent.with_hook(hook.clone());
    }
    let transcript = ctx
        .transcripts
        .clone()
        .map(|dir| Arc::new(TranscriptSink::new(dir)));
    let sink: Arc<dyn EventSink> = match &transcript {
        Some(t) => Arc::new(FanOut(vec![sink, t.clone()])),
        None => sink,
    };
    let task = AgentTask {
        run_id: request.run_id,
        task: request.task,
        owner: session.owner.to_string(),
        session_id: session.id.clone(),
        earlier,
        notices,
    };
    let mut outcome = agent.run(task, sink.as_ref(), cancel).await;
    if let Some(hook) = &mcp {
        hook.0.close().await;
    }
    conversation.set(outcome.conversation.clone());
    outcome.transcript = transcript.and_then(|t| t.path());
    Ok(outcome)
}

/// What the run's MCP servers add: the hook that refreshes their tools, notices for the
/// model (servers skipped, tools added) and the servers' own system messages.
struct Mcp {
    hook: Option<Arc<McpRefresh>>,
    notices: Vec<String>,
    system_notes: Vec<String>,
}

/// Connects the MCP servers of the file at `path` (none without one) and registers their
/// tools; a server that fails is skipped with a notice, a file that cannot be read fails the run.
/// Stdio servers start inside the session's sandbox, unless marked `"host": true`.
async fn connect_mcp(
    path: Option<&PathBuf>,
    session: &Session,
    registry: &mut ToolRegistry,
) -> Result<Mcp, RunError> {
    let mut notices = Vec::new();
    let Some(path) = path else {
        return Ok(Mcp {
            hook: None,
            notices,
            system_notes: Vec::new(),
        });
    };
    let clients = crate::mcp::client::connect_all_in(path, Some(session.sandbox.clone()))
        .await
        .map_err(|e| RunError::Mcp {
            path: path.clone(),
            message: e.to_string(),
        })?;
    for (server, why) in clients.failures() {
        notices.push(format!("MCP server {server} is skipped: {why}"));
    }
    for server in clients.host_servers() {
        tracing::warn!(%server, "a stdio MCP server runs on this host, outside the sandbox (\"host\": true)");
        notices.push(format!(
            "MCP server {server} runs on the host, outside the sandbox (\"host\": true in the server list)"
        ));
    }
    let names = clients.register_into(registry);
    if !names.is_empty() {
        notices.push(format!("MCP tools: {}", names.join(", ")));
    }
    let system_notes = clients.system_messages();
    Ok(Mcp {
        hook: Some(Arc::new(McpRefresh(clients))),
        notices,
        system_notes,
    })
}

/// The note of a session resumed from hibernation, once: the user hears it first and the
/// model too (its earlier processes and python variables are gone).
fn resume_notice(session: &Session) -> Option<String> {
    session
        .slots
        .get::<crate::sandbox::hibernate::ResumeNotice>()
        .and_then(|n| n.take())
}

/// Registers the tools of the remote A2A agents the session's owner may use; the notices say
/// which were skipped and why, and which tools were added.
async fn connect_remote_agents(
    config: &Config,
    session: &Session,
    registry: &mut ToolRegistry,
) -> Vec<String> {
    let (tools, mut notices) = crate::a2a::connect(config, session.owner.as_str()).await;
    let mut added = Vec::new();
    for tool in tools {
        let name = tool.name().to_string();
        match registry.register(tool) {
            Ok(()) => added.push(name),
            Err(e) => notices.push(format!("remote A2A agent tool {name} is skipped: {e}")),
        }
    }
    if !added.is_empty() {
        notices.push(format!("remote A2A agent tools: {}", added.join(", ")));
    }
    notices
}

/// The agent's settings from the config, with the request's step limit and its shape's
/// input-token budget (the smaller one when both have a budget).
fn settings_for(config: &Config, max_steps: Option<usize>, shape: &RunShape) -> AgentSettings {
    let mut settings = AgentSettings::from_config(config);
    if let Some(n) = max_steps {
        settings.max_steps = n.max(1);
    }
    if shape.max_input_tokens > 0 {
        settings.max_input_tokens = match settings.max_input_tokens {
            0 => shape.max_input_tokens,
            own => own.min(shape.max_input_tokens),
        };
    }
    settings
}

/// Refreshes the MCP servers' tools before every step and announces what changed.
struct McpRefresh(McpClients);

#[async_trait::async_trait]
impl StepHook for McpRefresh {
    async fn before_step(&self, tools: &mut ToolRegistry) -> Vec<String> {
        self.0
            .refresh(tools)
            .await
            .iter()
            .map(|c| c.announcement())
            .collect()
    }
}

/// Holds a session for a caller and removes its container when released or dropped,
/// unless it is kept. Dropping it without `release` (an error path, a panic) removes the
/// container in the background.
pub struct SessionLease {
    manager: Arc<SessionManager>,
    session: Arc<Session>,
    keep: bool,
    released: bool,
}

impl SessionLease {
    pub fn new(manager: Arc<SessionManager>, session: Arc<Session>, keep: bool) -> Self {
        Self {
            manager,
            session,
            keep,
            released: false,
        }
    }

    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    pub fn kept(&self) -> bool {
        self.keep
    }

    /// Removes the container now, unless the session is kept.
    pub async fn release(mut self) -> Result<(), SandboxError> {
        self.released = true;
        if self.keep {
            return Ok(());
        }
        self.manager
            .remove(&self.session.owner, &self.session.id)
            .await
    }
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        if self.released || self.keep {
            return;
        }
        let manager = self.manager.clone();
        let id = self.session.id.clone();
        let owner = self.session.owner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = manager.remove(&owner, &id).await {
                        tracing::warn!(session = %id, error = %e, "could not remove the session");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(session = %id, "no runtime left to remove the session; the reconciler will")
            }
        }
    }
}
