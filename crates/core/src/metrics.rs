//! The metrics seam: what the library counts, told to whoever listens. The core names no
//! metrics crate and no exposition format; `sandboxd serve` installs a `Recorder` (the
//! server's Prometheus registry, `server/src/metrics/`) once at start, and every other front
//! end (the CLI, the stdio MCP server) installs none, so each call below is a load of an
//! empty `OnceLock` and nothing else.
//!
//! One recorder per process, like a logger: the counters are the process's (each replica
//! exposes its own). Label values the core passes are bounded by construction: a tool's name
//! is a built-in tool's (a remote MCP server's tools, whose names a user's server picks,
//! are all `mcp`), a model is the configured one.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How a session's sandbox was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Taken from the warm pool.
    Warm,
    /// Created for the request.
    Cold,
}

/// One LLM request as the client saw it (all attempts of one turn).
#[derive(Debug, Clone, Copy)]
pub struct LlmCall<'a> {
    pub model: &'a str,
    pub took: Duration,
    /// False for a request that ended in an error (after its retries) or was cancelled.
    pub ok: bool,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// The receiver of the library's measurements. Every method has an empty default, so a
/// recorder implements what it keeps.
pub trait Recorder: Send + Sync {
    /// A session was made (`took`: from the request to a usable sandbox).
    fn session_created(&self, _claim: Claim, _took: Duration) {}
    /// A tool call ran (the agent's or an API call's); `tool` is `tool_label`'s.
    fn tool_call(&self, _tool: &str, _took: Duration, _failed: bool) {}
    /// An LLM request ended.
    fn llm_request(&self, _call: LlmCall<'_>) {}
}

static RECORDER: OnceLock<Arc<dyn Recorder>> = OnceLock::new();

/// Installs the process's recorder; false when one was installed already (the first stays).
pub fn install(recorder: Arc<dyn Recorder>) -> bool {
    RECORDER.set(recorder).is_ok()
}

/// Counts a session made since `started` (no-op without a recorder).
pub fn session_created(claim: Claim, started: Instant) {
    if let Some(r) = recorder() {
        r.session_created(claim, started.elapsed());
    }
}

/// The sessions one process holds (`SessionManager::census`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Sessions in the manager's table.
    pub live: usize,
    /// Creations under way.
    pub starting: usize,
    /// Warm sandboxes ready in the pool.
    pub warm: usize,
    /// Warm sandboxes being made.
    pub filling: usize,
}

/// The installed recorder, if any.
pub fn recorder() -> Option<&'static dyn Recorder> {
    RECORDER.get().map(|r| r.as_ref())
}

/// The label a tool call is counted under: the tool's own name for built-in tools, `mcp` for
/// every remote MCP server's tool (their names come from the servers a user attaches, so they
/// must not become label values).
pub fn tool_label(name: &str) -> &str {
    if name.starts_with("mcp_") {
        "mcp"
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_tools_share_one_label() {
        assert_eq!(tool_label("bash"), "bash");
        assert_eq!(tool_label("str_replace_editor"), "str_replace_editor");
        assert_eq!(tool_label("mcp_github_create_issue"), "mcp");
        assert_eq!(tool_label("mcp_x_\u{1F600}"), "mcp");
    }
}
