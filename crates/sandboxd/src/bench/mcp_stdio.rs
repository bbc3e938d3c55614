//! Where a stdio MCP server runs, and what it costs (issue 27): the same plain-Python echo
//! server (echo_server.py) inside a session's sandbox, through `Sandbox::spawn` and the exec
//! channel (the default), and on the host (`"host": true`), one tool call after another. The
//! difference at p50 is what the sandbox adds to a call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd_core::config::LimitRequest;
use sandboxd_core::mcp::McpClients;
use sandboxd_core::mcp::config::{ServerConfig, Transport};
use sandboxd_core::sandbox::manager::CreateOptions;
use sandboxd_core::sandbox::{Owner, Sandbox, SessionManager};
use sandboxd_core::tools::{ToolContext, ToolRegistry};

const SERVER: &str = include_str!("echo_server.py");

#[derive(Debug, thiserror::Error)]
pub enum StdioBenchError {
    #[error("the benchmark session could not be made: {0}")]
    Session(String),
    #[error("the echo server {0} did not start: {1}")]
    Connect(&'static str, String),
    #[error("a call to the echo server {0} failed: {1}")]
    Call(&'static str, String),
}

/// Sorted samples of one call, inside the sandbox and on the host.
pub struct StdioBench {
    pub sandbox: Vec<Duration>,
    pub host: Vec<Duration>,
}

fn server(host: bool, python: &str) -> ServerConfig {
    ServerConfig {
        name: "echo".into(),
        transport: Transport::Stdio {
            command: python.into(),
            args: vec!["-c".into(), SERVER.into()],
            env: vec![],
            host,
        },
        keep_names: false,
        refresh_every: 0,
    }
}

/// `n` calls to a server connected with `config`; sorted.
async fn calls(
    where_: &'static str,
    config: ServerConfig,
    sandbox: Option<Arc<dyn Sandbox>>,
    n: usize,
) -> Result<Vec<Duration>, StdioBenchError> {
    let clients = McpClients::connect_in(vec![config], sandbox).await;
    if let Some((_, why)) = clients.failures().first() {
        return Err(StdioBenchError::Connect(where_, why.to_string()));
    }
    let mut registry = ToolRegistry::new();
    clients.register_into(&mut registry);
    let ctx = ToolContext::default();
    let mut samples = Vec::with_capacity(n);
    // One call first: the interpreter's imports and the first frame are not the steady state.
    for i in 0..=n {
        let t = Instant::now();
        let r = registry
            .execute("mcp_echo_echo", r#"{"text": "ping"}"#, &ctx)
            .await
            .map_err(|e| StdioBenchError::Call(where_, e.to_string()))?;
        if r.is_error() || r.output != "ping" {
            return Err(StdioBenchError::Call(where_, r.render()));
        }
        if i > 0 {
            samples.push(t.elapsed());
        }
    }
    clients.close().await;
    samples.sort();
    Ok(samples)
}

/// Runs both; the session is removed before returning.
pub async fn bench_stdio(
    manager: Arc<SessionManager>,
    host_python: &str,
    n: usize,
) -> Result<StdioBench, StdioBenchError> {
    let owner =
        Owner::new("mcp-stdio-bench").map_err(|e| StdioBenchError::Session(e.to_string()))?;
    let session = manager
        .create(
            &owner,
            &LimitRequest::default(),
            CreateOptions { keep: true },
        )
        .await
        .map_err(|e| StdioBenchError::Session(e.to_string()))?;
    let result = async {
        let sandbox = calls(
            "inside the sandbox",
            server(false, "python3"),
            Some(session.sandbox.clone()),
            n,
        )
        .await?;
        let host = calls("on the host", server(true, host_python), None, n).await?;
        Ok(StdioBench { sandbox, host })
    }
    .await;
    let _ = manager.remove(&owner, &session.id).await;
    result
}
