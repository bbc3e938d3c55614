//! The tool set of an agent session, built in one place so the CLI, the API and the
//! benchmarks give the model the same tools.

use std::sync::Arc;
use std::time::Duration;

use super::ToolRegistry;
use super::ask_human::{AskHuman, Asker};
use super::bash::Bash;
use super::terminate::Terminate;
use crate::config::Config;
use crate::sandbox::manager::Session;

/// bash, python, str_replace_editor, terminate and ask_human on `session`'s sandbox.
pub fn session_tools(session: &Session, config: &Config, asker: Arc<dyn Asker>) -> ToolRegistry {
    let sandbox = session.sandbox.clone();
    let limits = &session.limits;
    let max_timeout = Duration::from_secs(limits.max_timeout_secs.max(1));
    let default_timeout = Duration::from_secs(config.agent.bash_timeout_secs.max(1));
    let output_cap = limits.output_cap();

    let mut registry = ToolRegistry::new();
    let tools: Vec<Arc<dyn super::Tool>> = vec![
        Arc::new(Bash::new(
            sandbox.clone(),
            default_timeout,
            max_timeout,
            output_cap,
        )),
        // python and str_replace_editor register here once merged:
        // Arc::new(super::python::Python::new(sandbox.clone(), default_timeout, max_timeout, output_cap)),
        // Arc::new(super::editor::StrReplaceEditor::new(sandbox.clone(), limits.max_file_bytes())),
        Arc::new(AskHuman::new(asker)),
        Arc::new(Terminate),
    ];
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
