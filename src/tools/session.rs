//! The tool sets, built in one place so the agent, the MCP server, `sandboxd tool` and the
//! benchmarks all hand out the same tools with the same limits.

use std::sync::Arc;
use std::time::Duration;

use super::ask_human::{AskHuman, Asker};
use super::bash::Bash;
use super::editor::StrReplaceEditor;
use super::files::{ListDir, ReadFile, WriteFile};
use super::python::Python;
use super::terminate::Terminate;
use super::{Tool, ToolRegistry};
use crate::config::{Config, Limits};
use crate::sandbox::Sandbox;
use crate::sandbox::manager::Session;

/// The tools that act inside the sandbox: bash, python, str_replace_editor.
pub fn sandbox_tools(sandbox: Arc<dyn Sandbox>, limits: &Limits, config: &Config) -> Vec<Arc<dyn Tool>> {
    let max_timeout = Duration::from_secs(limits.max_timeout_secs.max(1));
    let default_timeout = Duration::from_secs(config.agent.bash_timeout_secs.max(1));
    let output_cap = limits.output_cap();
    vec![
        Arc::new(Bash::new(sandbox.clone(), default_timeout, max_timeout, output_cap)),
        Arc::new(Python::new(sandbox.clone(), default_timeout, max_timeout, output_cap)),
        Arc::new(StrReplaceEditor::new(sandbox, limits.max_file_bytes())),
    ]
}

/// The agent's tools on `session`'s sandbox: the sandbox tools, ask_human and terminate.
pub fn session_tools(session: &Session, config: &Config, asker: Arc<dyn Asker>) -> ToolRegistry {
    agent_tools(session.sandbox.clone(), &session.limits, config, asker)
}

/// The agent's tools on any sandbox handle (a lazy one lists them without a container).
pub fn agent_tools(sandbox: Arc<dyn Sandbox>, limits: &Limits, config: &Config, asker: Arc<dyn Asker>) -> ToolRegistry {
    let mut tools = sandbox_tools(sandbox, limits, config);
    tools.push(Arc::new(AskHuman::new(asker)));
    tools.push(Arc::new(Terminate));
    registry_of(tools)
}

/// What the MCP server and `sandboxd tool` offer: the sandbox tools plus plain file access.
pub fn server_tools(sandbox: Arc<dyn Sandbox>, limits: &Limits, config: &Config) -> ToolRegistry {
    let mut tools = sandbox_tools(sandbox.clone(), limits, config);
    tools.push(Arc::new(ReadFile::new(sandbox.clone(), limits.output_cap())));
    tools.push(Arc::new(WriteFile::new(sandbox.clone())));
    tools.push(Arc::new(ListDir::new(sandbox)));
    registry_of(tools)
}

fn registry_of(tools: Vec<Arc<dyn Tool>>) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    for tool in tools {
        let name = tool.name().to_string();
        // Our own tools always pass the registry's checks; a failure here is a bug in one.
        if let Err(e) = registry.register(tool) {
            debug_assert!(false, "built-in tool {name} rejected: {e}");
            tracing::error!(tool = %name, error = %e, "a built-in tool was rejected by the registry");
        }
    }
    registry
}
