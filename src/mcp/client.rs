//! The MCP client: external MCP servers (config/mcp.json) whose tools join the agent's
//! registry as ordinary `Tool`s.
//!
//! Use from the agent:
//! ```text
//! let clients = sandboxd::mcp::connect_all(Path::new("config/mcp.json")).await?;
//! for (server, why) in clients.failures() { warn!("MCP server {server} skipped: {why}") }
//! clients.register_into(&mut registry);                    // mcp_{server}_{tool} tools
//! for text in clients.system_messages() { memory.push_system(text) }   // attributed instructions
//! // every step (cheap when nothing changed):
//! for change in clients.refresh(&mut registry).await { memory.push_system(change.announcement()) }
//! // at the end:
//! clients.close().await;
//! ```
//!
//! A server that fails at startup is reported in `failures()` and skipped. One that dies
//! mid-run turns the call into an error observation; the next call reconnects, and failed
//! reconnects back off (1 s, 2 s, 4 s … 60 s) so a dead server costs nothing per step.
//! Tool lists are re-read on `notifications/tools/list_changed`, and every
//! `refresh_every` calls for servers that never sent one.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, Tool as RemoteTool,
};
use rmcp::service::{NotificationContext, Peer, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;

use super::config::{self, McpConfigError, ServerConfig, Transport};
use super::names;
use crate::tools::registry::MAX_DESCRIPTION;
use crate::tools::{Tool, ToolContext, ToolError, ToolRegistry, ToolResult};

/// Longest server instructions passed on to the model.
const MAX_INSTRUCTIONS: usize = 8000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Lines of a stdio server's stderr kept for error messages.
const STDERR_TAIL: usize = 20;

/// Connects to every server of an mcp.json; a server that fails is reported, not fatal.
pub async fn connect_all(path: &Path) -> Result<McpClients, McpConfigError> {
    let (servers, bad) = config::load(path)?;
    let mut clients = McpClients::connect(servers).await;
    clients.failures.extend(bad.into_iter().map(|e| match e {
        McpConfigError::Invalid { server, message } => (server, message),
        other => (String::new(), other.to_string()),
    }));
    Ok(clients)
}

/// Tools a server added or removed since the last refresh.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolsChange {
    pub server: String,
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

impl ToolsChange {
    /// The system message that tells the model.
    pub fn announcement(&self) -> String {
        let mut parts = Vec::new();
        if !self.added.is_empty() {
            parts.push(format!("new tools available: {}", self.added.join(", ")));
        }
        if !self.removed.is_empty() {
            parts.push(format!(
                "tools no longer available: {}",
                self.removed.join(", ")
            ));
        }
        format!("MCP server {:?}: {}", self.server, parts.join("; "))
    }
}

pub struct McpClients {
    servers: Vec<Arc<RemoteServer>>,
    failures: Vec<(String, String)>,
}

impl McpClients {
    /// Connects to the given servers concurrently.
    pub async fn connect(configs: Vec<ServerConfig>) -> McpClients {
        let attempts = configs.into_iter().map(|c| async move {
            let server = Arc::new(RemoteServer::new(c));
            let result = server.reconnect().await;
            (server, result)
        });
        let mut servers = Vec::new();
        let mut failures = Vec::new();
        for (server, result) in futures::future::join_all(attempts).await {
            match result {
                Ok(()) => servers.push(server),
                Err(e) => {
                    tracing::warn!(server = %server.config.name, error = %e, "MCP server failed to start; skipping it");
                    failures.push((server.config.name.clone(), e));
                }
            }
        }
        McpClients { servers, failures }
    }

    /// Servers that could not be started, with the reason.
    pub fn failures(&self) -> &[(String, String)] {
        &self.failures
    }

    pub fn server_names(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.config.name.clone()).collect()
    }

    /// Each connected server's instructions: (server, text).
    pub fn instructions(&self) -> Vec<(String, String)> {
        self.servers
            .iter()
            .filter_map(|s| Some((s.config.name.clone(), lock(&s.instructions).clone()?)))
            .collect()
    }

    /// The instructions as system messages that say where they come from.
    pub fn system_messages(&self) -> Vec<String> {
        self.instructions()
            .into_iter()
            .map(|(server, text)| {
                format!(
                    "Instructions from the MCP server {server:?} (a third-party tool provider; they describe \
                     its mcp_{server}_* tools and do not come from the user):\n{text}"
                )
            })
            .collect()
    }

    /// Adds every remote tool to the registry; returns the names registered. On a clash
    /// the tool already there wins and the remote one is skipped with a warning.
    pub fn register_into(&self, registry: &mut ToolRegistry) -> Vec<String> {
        let mut added = Vec::new();
        for server in &self.servers {
            let tools: Vec<Arc<McpTool>> = lock(&server.tools).clone();
            let mut kept = Vec::new();
            for tool in tools {
                if try_register(registry, &tool) {
                    added.push(tool.name.clone());
                    kept.push(tool);
                }
            }
            *lock(&server.tools) = kept;
        }
        added
    }

    /// Re-reads tool lists of servers that announced a change (or are due), updates the
    /// registry, and returns what changed so the agent can tell the model.
    pub async fn refresh(&self, registry: &mut ToolRegistry) -> Vec<ToolsChange> {
        let mut changes = Vec::new();
        for server in &self.servers {
            if !server.refresh_due() {
                continue;
            }
            let Some(listed) = server.list_tools().await else {
                continue;
            };
            let old: Vec<Arc<McpTool>> = lock(&server.tools).clone();
            let mut change = ToolsChange {
                server: server.config.name.clone(),
                added: Vec::new(),
                removed: Vec::new(),
            };
            let mut kept = Vec::new();
            for tool in &old {
                match listed.iter().find(|t| t.name == tool.name) {
                    // Same name: replace it in place in case the schema or description changed.
                    Some(new) => {
                        registry.unregister(&tool.name);
                        if try_register(registry, new) {
                            kept.push(new.clone());
                        }
                    }
                    None => {
                        registry.unregister(&tool.name);
                        change.removed.push(tool.name.clone());
                    }
                }
            }
            for new in listed
                .iter()
                .filter(|n| !old.iter().any(|o| o.name == n.name))
            {
                if try_register(registry, new) {
                    change.added.push(new.name.clone());
                    kept.push(new.clone());
                }
            }
            *lock(&server.tools) = kept;
            if !change.added.is_empty() || !change.removed.is_empty() {
                changes.push(change);
            }
        }
        changes
    }

    /// Closes every connection (stdio servers get EOF, then SIGTERM, then SIGKILL).
    pub async fn close(&self) {
        for server in &self.servers {
            server.disconnect().await;
        }
    }
}

fn try_register(registry: &mut ToolRegistry, tool: &Arc<McpTool>) -> bool {
    if registry.get(&tool.name).is_some() {
        tracing::warn!(tool = %tool.name, server = %tool.server.config.name, "a tool with this name already exists; keeping the first");
        return false;
    }
    match registry.register(tool.clone()) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(tool = %tool.name, error = %e, "skipping a remote MCP tool");
            false
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Receives the server's notifications.
#[derive(Clone)]
struct Notifier {
    list_changed: Arc<AtomicBool>,
    ever_notified: Arc<AtomicBool>,
}

impl ClientHandler for Notifier {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.store(true, Ordering::SeqCst);
        self.ever_notified.store(true, Ordering::SeqCst);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        )
    }
}

enum Conn {
    Up(RunningService<RoleClient, Notifier>),
    Down {
        retry_at: Instant,
        backoff: Duration,
        reason: String,
    },
}

struct RemoteServer {
    config: ServerConfig,
    conn: tokio::sync::Mutex<Conn>,
    notifier: Notifier,
    calls_since_list: AtomicU32,
    tools: Mutex<Vec<Arc<McpTool>>>,
    instructions: Mutex<Option<String>>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    call_timeout: Duration,
}

impl RemoteServer {
    fn new(config: ServerConfig) -> Self {
        Self {
            config,
            conn: tokio::sync::Mutex::new(Conn::Down {
                retry_at: Instant::now(),
                backoff: Duration::ZERO,
                reason: "not started".into(),
            }),
            notifier: Notifier {
                list_changed: Arc::new(AtomicBool::new(false)),
                ever_notified: Arc::new(AtomicBool::new(false)),
            },
            calls_since_list: AtomicU32::new(0),
            tools: Mutex::new(Vec::new()),
            instructions: Mutex::new(None),
            stderr_tail: Arc::new(Mutex::new(VecDeque::new())),
            call_timeout: Duration::from_secs(600),
        }
    }

    fn refresh_due(&self) -> bool {
        if self.notifier.list_changed.load(Ordering::SeqCst) {
            return true;
        }
        let every = self.config.refresh_every;
        every > 0
            && !self.notifier.ever_notified.load(Ordering::SeqCst)
            && self.calls_since_list.load(Ordering::SeqCst) >= every
    }

    /// (Re)starts the connection and reads the tool list and instructions.
    async fn reconnect(self: &Arc<Self>) -> Result<(), String> {
        let mut conn = self.conn.lock().await;
        let backoff = match &*conn {
            Conn::Down { backoff, .. } => *backoff,
            Conn::Up(_) => Duration::ZERO,
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, self.start()).await {
            Ok(Ok(running)) => {
                let info = running.peer_info();
                let text = info
                    .and_then(|i| i.instructions.clone())
                    .filter(|t| !t.trim().is_empty());
                *lock(&self.instructions) =
                    text.map(|t| t.chars().take(MAX_INSTRUCTIONS).collect());
                let peer = running.peer().clone();
                *conn = Conn::Up(running);
                drop(conn);
                let listed = self.fetch_tools(&peer).await?;
                // First connection: these are the tools; later ones go through refresh().
                let mut tools = lock(&self.tools);
                if tools.is_empty() {
                    *tools = listed;
                } else {
                    self.notifier.list_changed.store(true, Ordering::SeqCst);
                }
                Ok(())
            }
            failed => {
                let reason = match failed {
                    Ok(Err(e)) => e,
                    _ => format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
                };
                let reason = self.with_stderr(reason);
                let next = if backoff.is_zero() {
                    Duration::from_secs(1)
                } else {
                    (backoff * 2).min(MAX_BACKOFF)
                };
                *conn = Conn::Down {
                    retry_at: Instant::now() + next,
                    backoff: next,
                    reason: reason.clone(),
                };
                Err(reason)
            }
        }
    }

    fn with_stderr(&self, reason: String) -> String {
        let tail: Vec<String> = lock(&self.stderr_tail).iter().cloned().collect();
        if tail.is_empty() {
            reason
        } else {
            format!("{reason}; its stderr ended with:\n{}", tail.join("\n"))
        }
    }

    async fn start(&self) -> Result<RunningService<RoleClient, Notifier>, String> {
        let handler = self.notifier.clone();
        match &self.config.transport {
            Transport::Stdio { command, args, env } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).env_clear();
                if let Some(path) = std::env::var_os("PATH") {
                    cmd.env("PATH", path);
                }
                cmd.envs(env.iter().map(|(k, v)| (k, v)));
                let (transport, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("cannot start {command:?}: {e}"))?;
                if let Some(stderr) = stderr {
                    self.forward_stderr(stderr);
                }
                handler
                    .serve(transport)
                    .await
                    .map_err(|e| format!("the MCP handshake failed: {e}"))
            }
            Transport::Http { url, headers } => {
                let mut cfg = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                let mut custom = std::collections::HashMap::new();
                for (k, v) in headers {
                    if k.eq_ignore_ascii_case("authorization")
                        && let Some(token) = v.strip_prefix("Bearer ")
                    {
                        cfg = cfg.auth_header(token.to_string());
                        continue;
                    }
                    let name = axum::http::HeaderName::try_from(k.as_str())
                        .map_err(|e| format!("header {k:?}: {e}"))?;
                    let value = axum::http::HeaderValue::try_from(v.as_str())
                        .map_err(|e| format!("header {k:?}: {e}"))?;
                    custom.insert(name, value);
                }
                let cfg = cfg.custom_headers(custom);
                let transport = StreamableHttpClientTransport::from_config(cfg);
                handler
                    .serve(transport)
                    .await
                    .map_err(|e| format!("cannot connect to {url}: {e}"))
            }
        }
    }

    fn forward_stderr(&self, stderr: tokio::process::ChildStderr) {
        let tail = self.stderr_tail.clone();
        let name = self.config.name.clone();
        lock(&tail).clear();
        tokio::spawn(async move {
            // Lines are read with a length cap: a server writing gigabytes without a newline
            // must not grow the host's memory.
            let mut lines = tokio_util::codec::FramedRead::new(
                stderr,
                tokio_util::codec::LinesCodec::new_with_max_length(4096),
            );
            while let Some(line) = futures::StreamExt::next(&mut lines).await {
                let line = match line {
                    Ok(l) => l,
                    Err(tokio_util::codec::LinesCodecError::MaxLineLengthExceeded) => {
                        "[an over-long stderr line]".to_string()
                    }
                    Err(_) => break,
                };
                tracing::debug!(server = %name, "{line}");
                let mut t = lock(&tail);
                if t.len() == STDERR_TAIL {
                    t.pop_front();
                }
                t.push_back(line.chars().take(500).collect());
            }
        });
    }

    async fn fetch_tools(
        self: &Arc<Self>,
        peer: &Peer<RoleClient>,
    ) -> Result<Vec<Arc<McpTool>>, String> {
        self.notifier.list_changed.store(false, Ordering::SeqCst);
        self.calls_since_list.store(0, Ordering::SeqCst);
        let listed = peer
            .list_all_tools()
            .await
            .map_err(|e| format!("tools/list failed: {e}"))?;
        let mut tools: Vec<Arc<McpTool>> = Vec::new();
        for t in listed {
            match McpTool::new(self.clone(), &t) {
                Some(tool) if tools.iter().any(|x| x.name == tool.name) => {
                    tracing::warn!(server = %self.config.name, tool = %t.name, name = %tool.name, "two remote tools sanitize to the same name; keeping the first");
                }
                Some(tool) => tools.push(Arc::new(tool)),
                None => {
                    tracing::warn!(server = %self.config.name, tool = %t.name, "a remote tool name has no usable characters; skipping it")
                }
            }
        }
        Ok(tools)
    }

    /// The current tool list, or None when the server is unreachable.
    async fn list_tools(self: &Arc<Self>) -> Option<Vec<Arc<McpTool>>> {
        let peer = self.peer().await.ok()?;
        match self.fetch_tools(&peer).await {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(server = %self.config.name, error = %e, "could not refresh the tool list");
                None
            }
        }
    }

    /// The live connection, reconnecting when it died and the backoff allows.
    async fn peer(self: &Arc<Self>) -> Result<Peer<RoleClient>, String> {
        {
            let mut conn = self.conn.lock().await;
            match &*conn {
                Conn::Up(running)
                    if !running.is_closed() && !running.peer().is_transport_closed() =>
                {
                    return Ok(running.peer().clone());
                }
                Conn::Up(_) => {
                    *conn = Conn::Down {
                        retry_at: Instant::now(),
                        backoff: Duration::ZERO,
                        reason: self.with_stderr("the connection closed".into()),
                    }
                }
                Conn::Down {
                    retry_at, reason, ..
                } if Instant::now() < *retry_at => {
                    let wait = retry_at.saturating_duration_since(Instant::now());
                    return Err(format!(
                        "the MCP server {:?} is down ({reason}); the next reconnect attempt is in {} s",
                        self.config.name,
                        wait.as_secs().max(1)
                    ));
                }
                Conn::Down { .. } => {}
            }
        }
        self.reconnect().await.map_err(|e| {
            format!(
                "the MCP server {:?} could not be restarted: {e}",
                self.config.name
            )
        })?;
        match &*self.conn.lock().await {
            Conn::Up(running) => Ok(running.peer().clone()),
            Conn::Down { reason, .. } => Err(reason.clone()),
        }
    }

    async fn mark_down(&self, reason: String) {
        let mut conn = self.conn.lock().await;
        let old = std::mem::replace(
            &mut *conn,
            Conn::Down {
                retry_at: Instant::now(),
                backoff: Duration::ZERO,
                reason,
            },
        );
        drop(conn);
        if let Conn::Up(running) = old {
            let _ = running.cancel().await;
        }
    }

    async fn disconnect(&self) {
        self.mark_down("closed".into()).await;
    }

    async fn call(self: &Arc<Self>, tool: &str, args: Value, ctx: &ToolContext) -> ToolResult {
        let peer = match self.peer().await {
            Ok(p) => p,
            Err(e) => return ToolResult::error(e),
        };
        self.calls_since_list.fetch_add(1, Ordering::SeqCst);
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Value::Object(map) = args {
            params = params.with_arguments(map);
        }
        let name = &self.config.name;
        let outcome = tokio::select! {
            r = tokio::time::timeout(self.call_timeout, peer.call_tool(params)) => r,
            _ = ctx.cancel.cancelled() => return ToolResult::error("the call was cancelled"),
        };
        match outcome {
            Ok(Ok(result)) => from_call_result(&result),
            Ok(Err(ServiceError::McpError(e))) => ToolResult::error(format!(
                "the MCP server {name:?} refused the call: {}",
                e.message
            )),
            Ok(Err(e)) => {
                let reason = self.with_stderr(e.to_string());
                self.mark_down(reason.clone()).await;
                ToolResult::error(format!(
                    "the MCP server {name:?} failed during the call ({reason}); it will be restarted on the next call"
                ))
            }
            Err(_) => ToolResult::error(format!(
                "the MCP server {name:?} did not answer within {} s",
                self.call_timeout.as_secs()
            )),
        }
    }
}

/// Text and images of an MCP result as a ToolResult (the first image is kept).
pub fn from_call_result(result: &CallToolResult) -> ToolResult {
    let mut text = Vec::new();
    let mut image = None;
    let mut text_len = 0;
    for block in &result.content {
        match block {
            // A remote server is not trusted with the host's memory: text beyond the cap and
            // images too large to send to a model are left out here, before anything keeps them.
            ContentBlock::Text(t) if text_len >= MAX_REMOTE_TEXT => {
                text_len += t.text.len();
            }
            ContentBlock::Text(t) => {
                text_len += t.text.len();
                let mut piece = t.text.clone();
                if text_len > MAX_REMOTE_TEXT {
                    let mut end = piece.len().saturating_sub(text_len - MAX_REMOTE_TEXT);
                    while !piece.is_char_boundary(end) {
                        end -= 1;
                    }
                    piece.truncate(end);
                    piece.push_str("\n[the rest of the server's text was cut by sandboxd]");
                }
                text.push(piece);
            }
            ContentBlock::Image(i) if i.data.len() > MAX_REMOTE_IMAGE => text.push(format!(
                "[an image of {} base64 characters was left out: over the {} limit]",
                i.data.len(),
                MAX_REMOTE_IMAGE
            )),
            ContentBlock::Image(i) if image.is_none() => image = Some(i.data.clone()),
            ContentBlock::Image(i) => {
                text.push(format!("[another image ({}) was left out]", i.mime_type))
            }
            ContentBlock::Audio(a) => {
                text.push(format!("[audio ({}) is not supported here]", a.mime_type))
            }
            ContentBlock::Resource(_) => text.push("[an embedded resource was left out]".into()),
            ContentBlock::ResourceLink(r) => text.push(format!("[resource: {}]", r.uri)),
            _ => text.push("[content of an unknown kind was left out]".into()),
        }
    }
    if text.is_empty()
        && let Some(s) = &result.structured_content
    {
        text.push(s.to_string());
    }
    let text = text.join("\n");
    let mut out = if result.is_error == Some(true) {
        ToolResult::error(if text.is_empty() {
            "the tool failed without a message".into()
        } else {
            text
        })
    } else {
        ToolResult::ok(if text.is_empty() && image.is_none() {
            "(no output)".to_string()
        } else {
            text
        })
    };
    if let Some(img) = image {
        out = out.with_image(img);
    }
    out
}

/// Characters of text kept from one remote tool result.
const MAX_REMOTE_TEXT: usize = 1 << 20;
/// Largest image (base64 characters) taken from one remote tool result.
const MAX_REMOTE_IMAGE: usize = 8 << 20;

/// One remote tool as a registry tool.
pub struct McpTool {
    name: String,
    original: String,
    description: String,
    parameters: Value,
    server: Arc<RemoteServer>,
}

impl McpTool {
    fn new(server: Arc<RemoteServer>, remote: &RemoteTool) -> Option<Self> {
        let name = names::tool_name(&server.config.name, &remote.name, server.config.keep_names)?;
        let raw = remote.description.as_deref().unwrap_or("");
        let desc = if raw.chars().count() > MAX_DESCRIPTION {
            let mut d: String = raw.chars().take(MAX_DESCRIPTION - 1).collect();
            d.push('…');
            d
        } else if raw.is_empty() {
            format!(
                "{} (from the MCP server {})",
                remote.name, server.config.name
            )
        } else {
            raw.to_string()
        };
        let mut params = Value::Object((*remote.input_schema).clone());
        if let Some(obj) = params.as_object_mut() {
            obj.entry("type")
                .or_insert_with(|| Value::String("object".into()));
        }
        Some(Self {
            name,
            original: remote.name.to_string(),
            description: desc,
            parameters: params,
            server,
        })
    }

    pub fn server(&self) -> &str {
        &self.server.config.name
    }

    pub fn original_name(&self) -> &str {
        &self.original
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        self.parameters.clone()
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        Ok(self.server.call(&self.original, args, ctx).await)
    }
}
