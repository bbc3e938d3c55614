//! `EgressProxy`: one session's proxy, from starting the in-container helper to stopping it.
//!
//! `start` spawns `sandboxd_egress.py` through `Sandbox::spawn` (so it works on every
//! backend), waits for its hello, then serves: the demux hands each new connection to a task
//! of its own (conn.rs). The helper is started with `--max` a little above the
//! `[egress] connections` cap: connections between the cap and `--max` reach the host and
//! are refused with a record that names the cap; past `--max` the helper answers the same
//! 403 itself and tells the host, which records it. Anything out of protocol from the helper
//! ends the proxy (`is_running` turns false); so does `stop` or dropping it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::channel::{Demux, Event, write_frames};
use super::decide::Caps;
use super::frame::{HELLO, HELLO_PAYLOAD};
use super::{EgressAudit, Intercept, PROXY_PORT, PolicySource, conn};
use crate::config::EgressConfig;
use crate::research::{resolver::NameResolver, ssrf};
use crate::sandbox::{Sandbox, SandboxError, SpawnRequest, helpers};

/// How long the helper may take to listen and say hello (python's start under gVisor).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `stop` waits for the helper to exit.
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// Connections past the cap that still reach the host, to be refused with a record.
const REFUSE_SLACK: usize = 32;
/// The helper's exit status when the port is bound by another process.
const EXIT_PORT_TAKEN: i64 = 3;

/// Everything a session's proxy needs from its front end (serve or the CLI).
pub struct EgressDeps {
    pub config: EgressConfig,
    /// The `[research]` SSRF rules (allow, deny, ports, the host's own addresses).
    pub ssrf: Arc<ssrf::Policy>,
    pub resolver: Arc<dyn NameResolver>,
    pub policy: Arc<dyn PolicySource>,
    pub audit: Arc<dyn EgressAudit>,
    pub session: String,
    pub owner: String,
}

/// The proxy's counters since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EgressStats {
    pub open_connections: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub connections_total: u64,
    pub connections_refused: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error(
        "127.0.0.1:{PROXY_PORT} in the sandbox is bound by another process (another replica's egress proxy, or a program of the sandbox); stop it and start the proxy again"
    )]
    PortTaken,
    #[error("the egress helper did not start: {0}")]
    Helper(String),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// What the connection tasks share.
pub(crate) struct Shared {
    pub(crate) deps: EgressDeps,
    pub(crate) intercept: Option<Arc<dyn Intercept>>,
    pub(crate) caps: Caps,
    pub(crate) stop: CancellationToken,
    pub(crate) open: AtomicU64,
    pub(crate) total: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
}

/// A session's running egress proxy.
pub struct EgressProxy {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl EgressProxy {
    /// Spawns the helper in the sandbox and serves it until dropped / stopped.
    pub async fn start(
        sandbox: Arc<dyn Sandbox>,
        deps: EgressDeps,
    ) -> Result<EgressProxy, EgressError> {
        let (port, max) = (PROXY_PORT.to_string(), max_open(&deps).to_string());
        let argv = helpers::argv("sandboxd_egress.py", &["--port", &port, "--max", &max]);
        Self::launch(sandbox, deps, argv, None).await
    }

    /// `start`, with the CONNECTs `intercept` wants handed to it instead of tunneled.
    pub async fn start_intercepting(
        sandbox: Arc<dyn Sandbox>,
        deps: EgressDeps,
        intercept: Arc<dyn Intercept>,
    ) -> Result<EgressProxy, EgressError> {
        let (port, max) = (PROXY_PORT.to_string(), max_open(&deps).to_string());
        let argv = helpers::argv("sandboxd_egress.py", &["--port", &port, "--max", &max]);
        Self::launch(sandbox, deps, argv, Some(intercept)).await
    }

    /// `start` with `argv` run in place of the image's helper: the tests' misbehaving helpers.
    #[doc(hidden)]
    pub async fn start_command(
        sandbox: Arc<dyn Sandbox>,
        deps: EgressDeps,
        argv: Vec<String>,
    ) -> Result<EgressProxy, EgressError> {
        Self::launch(sandbox, deps, argv, None).await
    }

    async fn launch(
        sandbox: Arc<dyn Sandbox>,
        deps: EgressDeps,
        argv: Vec<String>,
        intercept: Option<Arc<dyn Intercept>>,
    ) -> Result<EgressProxy, EgressError> {
        let max_open = max_open(&deps);
        let mut req = SpawnRequest::new(argv).env("SANDBOXD_TAG", "sandboxd-egress");
        req.env.extend(helpers::env());
        let process = sandbox.spawn(req).await?;
        let stop = CancellationToken::new();
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(write_frames(process.stdin, out_rx, stop.clone()));
        let mut demux = Demux::new(process.output, out_tx, max_open);
        let hello = tokio::time::timeout(START_TIMEOUT, demux.next_frame()).await;
        let failed = match hello {
            Ok(Ok(f)) if f.id == 0 && f.kind == HELLO && f.payload.as_ref() == HELLO_PAYLOAD => {
                None
            }
            Ok(Ok(f)) => Some(format!(
                "its first frame (type {}) was not its hello",
                f.kind
            )),
            Ok(Err(why)) => Some(why),
            Err(_) => Some(format!("it did not listen within {START_TIMEOUT:?}")),
        };
        if let Some(why) = failed {
            stop.cancel();
            drop(demux.output);
            let code = (process.exit_code)().await;
            if code == Some(EXIT_PORT_TAKEN) {
                return Err(EgressError::PortTaken);
            }
            let words = String::from_utf8_lossy(&demux.stderr).trim().to_string();
            return Err(EgressError::Helper(format!(
                "{why} (exit status {code:?}; its last words: {})",
                if words.is_empty() { "(none)" } else { &words }
            )));
        }
        let caps = Caps::new(&deps);
        let shared = Arc::new(Shared {
            deps,
            intercept,
            caps,
            stop: stop.clone(),
            open: AtomicU64::new(0),
            total: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
        });
        let task = tokio::spawn(serve(shared.clone(), demux));
        Ok(EgressProxy {
            shared,
            task,
            writer,
        })
    }

    /// False once the helper or the channel ended (or `stop` was called).
    pub fn is_running(&self) -> bool {
        !self.shared.stop.is_cancelled()
    }

    pub fn stats(&self) -> EgressStats {
        let s = &self.shared;
        EgressStats {
            open_connections: s.open.load(Ordering::Acquire),
            bytes_up: s.up.load(Ordering::Acquire),
            bytes_down: s.down.load(Ordering::Acquire),
            connections_total: s.total.load(Ordering::Acquire),
            connections_refused: s.refused.load(Ordering::Acquire),
        }
    }

    /// Ends every connection (each still gets its record), closes the helper's stdin (it
    /// exits) and waits for the proxy's tasks and the helper's exit.
    pub async fn stop(mut self) {
        self.shared.stop.cancel();
        let _ = (&mut self.task).await;
        let _ = (&mut self.writer).await;
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

/// The helper's `--max`, and the most connections the host lets it hold open.
fn max_open(deps: &EgressDeps) -> usize {
    deps.config.connections as usize + REFUSE_SLACK
}

/// Runs the demux and starts a task per connection until the channel ends or `stop`.
async fn serve(shared: Arc<Shared>, mut demux: Demux) {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let dispatch = async {
        let mut conns = tokio::task::JoinSet::new();
        while let Some(event) = events.recv().await {
            match event {
                Event::Open(io) => {
                    conns.spawn(conn::serve(shared.clone(), io));
                }
                Event::Refused => conn::refused_by_helper(&shared).await,
            }
            // Reap finished connections so the set stays as small as what is open.
            while conns.try_join_next().is_some() {}
        }
        // The channel ended: the connections end too (their queues closed); wait for their
        // records.
        while conns.join_next().await.is_some() {}
    };
    let run = async {
        let why = demux.run(events_tx, &shared.stop).await;
        if !shared.stop.is_cancelled() {
            tracing::warn!(target: super::TRACE_TARGET, session = %shared.deps.session, %why,
                "egress: the proxy's channel ended");
        }
        shared.stop.cancel();
    };
    // Not raced against `stop`: the demux watches it and ends, and the connections (which
    // watch it too) still write their records before this returns.
    futures::future::join(run, dispatch).await;
    // The writer closed the helper's stdin; its output ends when it has exited, so `stop`
    // returns with the port free for the next proxy (bounded: a wedged helper is left to
    // the sandbox's end).
    let exited = async { while demux.output.next().await.is_some() {} };
    let _ = tokio::time::timeout(EXIT_WAIT, exited).await;
}
