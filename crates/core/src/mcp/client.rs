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
//!
//! The connection to one server is in remote.rs, a remote tool as a registry tool in
//! remote_tool.rs.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::config::{self, McpConfigError, ServerConfig};
use super::remote::RemoteServer;
pub use super::remote_tool::McpTool;
use crate::sandbox::Sandbox;
use crate::tools::ToolRegistry;

/// Connects to every server of an mcp.json; a server that fails is reported, not fatal.
/// With no sandbox, only HTTP servers and stdio servers marked `"host": true` can start.
pub async fn connect_all(path: &Path) -> Result<McpClients, McpConfigError> {
    connect_all_in(path, None).await
}

/// As `connect_all`, with the stdio servers (those not marked `"host": true`) started
/// inside `sandbox`.
pub async fn connect_all_in(
    path: &Path,
    sandbox: Option<Arc<dyn Sandbox>>,
) -> Result<McpClients, McpConfigError> {
    let (servers, bad) = config::load(path)?;
    let mut clients = McpClients::connect_in(servers, sandbox).await;
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
    /// Connects to the given servers concurrently, with no sandbox (see `connect_all`).
    pub async fn connect(configs: Vec<ServerConfig>) -> McpClients {
        Self::connect_in(configs, None).await
    }

    /// Connects to the given servers concurrently, stdio ones inside `sandbox` unless they
    /// are marked to run on the host.
    pub async fn connect_in(
        configs: Vec<ServerConfig>,
        sandbox: Option<Arc<dyn Sandbox>>,
    ) -> McpClients {
        let attempts = configs.into_iter().map(|c| {
            let sandbox = sandbox.clone();
            async move {
                let server = Arc::new(RemoteServer::new(c, sandbox));
                let result = server.reconnect().await;
                (server, result)
            }
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

    /// The connected stdio servers that run on the host (`"host": true`), for warnings.
    pub fn host_servers(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter(|s| {
                matches!(
                    s.config.transport,
                    config::Transport::Stdio { host: true, .. }
                )
            })
            .map(|s| s.config.name.clone())
            .collect()
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
            lock(&server.tools).clear();
        }
    }
}

fn try_register(registry: &mut ToolRegistry, tool: &Arc<McpTool>) -> bool {
    if registry.get(&tool.name).is_some() {
        tracing::warn!(tool = %tool.name, server = %tool.server_name, "a tool with this name already exists; keeping the first");
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

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
