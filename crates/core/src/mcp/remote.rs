//! One external MCP server as sandboxd sees it: the connection (stdio child, streamable
//! HTTP or legacy SSE), reconnection with backoff, the tool list and its change notifications.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, Peer, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;

use super::config::{ServerConfig, Transport};
use crate::sandbox::Sandbox;
use crate::tools::{ToolContext, ToolResult};

use super::client::lock;
use super::remote_tool::{McpTool, from_call_result};

/// Longest server instructions passed on to the model.
const MAX_INSTRUCTIONS: usize = 8000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Lines of a stdio server's stderr kept for error messages.
const STDERR_TAIL: usize = 20;

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

pub(super) struct RemoteServer {
    pub(super) config: ServerConfig,
    conn: tokio::sync::Mutex<Conn>,
    notifier: Notifier,
    pub(super) calls_since_list: AtomicU32,
    pub(super) tools: Mutex<Vec<Arc<McpTool>>>,
    pub(super) instructions: Mutex<Option<String>>,
    pub(super) stderr_tail: Arc<Mutex<VecDeque<String>>>,
    pub(super) call_timeout: Duration,
    /// Where a stdio server without `"host": true` runs; None: nowhere (it fails to start).
    sandbox: Option<Arc<dyn Sandbox>>,
}

impl RemoteServer {
    pub(super) fn new(config: ServerConfig, sandbox: Option<Arc<dyn Sandbox>>) -> Self {
        Self {
            config,
            sandbox,
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

    pub(super) fn refresh_due(&self) -> bool {
        if self.notifier.list_changed.load(Ordering::SeqCst) {
            return true;
        }
        let every = self.config.refresh_every;
        every > 0
            && !self.notifier.ever_notified.load(Ordering::SeqCst)
            && self.calls_since_list.load(Ordering::SeqCst) >= every
    }

    /// (Re)starts the connection and reads the tool list and instructions.
    pub(super) async fn reconnect(self: &Arc<Self>) -> Result<(), String> {
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

    pub(super) fn with_stderr(&self, reason: String) -> String {
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
            Transport::Stdio {
                command,
                args,
                env,
                host: false,
            } => {
                let sandbox = self.sandbox.as_ref().ok_or_else(|| {
                    format!(
                        "{command:?} runs inside a session's sandbox, and there is none here; \
                         give it \"host\": true to run it on this host instead"
                    )
                })?;
                let pipes = super::in_sandbox::start(sandbox, command, args, env).await?;
                self.forward_stderr(pipes.stderr);
                handler
                    .serve((pipes.stdout, pipes.stdin))
                    .await
                    .map_err(|e| format!("the MCP handshake failed: {e}"))
            }
            Transport::Stdio {
                command,
                args,
                env,
                host: true,
            } => {
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
                    let name = http::HeaderName::try_from(k.as_str())
                        .map_err(|e| format!("header {k:?}: {e}"))?;
                    let value = http::HeaderValue::try_from(v.as_str())
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
            Transport::Sse { url, headers } => {
                let transport = super::sse_legacy::connect(url, headers).await?;
                handler
                    .serve(transport)
                    .await
                    .map_err(|e| format!("the MCP handshake over {url} failed: {e}"))
            }
        }
    }

    pub(super) fn forward_stderr(
        &self,
        stderr: impl tokio::io::AsyncRead + Send + Unpin + 'static,
    ) {
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

    pub(super) async fn fetch_tools(
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
            match McpTool::new(self, &t) {
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
    pub(super) async fn list_tools(self: &Arc<Self>) -> Option<Vec<Arc<McpTool>>> {
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
    pub(super) async fn peer(self: &Arc<Self>) -> Result<Peer<RoleClient>, String> {
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

    pub(super) async fn mark_down(&self, reason: String) {
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

    pub(super) async fn disconnect(&self) {
        self.mark_down("closed".into()).await;
    }

    pub(super) async fn call(
        self: &Arc<Self>,
        tool: &str,
        args: Value,
        ctx: &ToolContext,
    ) -> ToolResult {
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
