//! The `serve` benchmarks for `sandboxd bench serve`, each against a real server on loopback
//! in this process (its own temporary data directory and users):
//! - exec overhead: `true` through `POST /v1/sessions/{id}/exec` (auth, store lookup, routing,
//!   JSON both ways) against the same session's persistent shell called from the library,
//!   interleaved so both see the same container and machine load; the difference of the
//!   medians is the API's overhead. The streamed exec's first byte is measured beside it.
//! - the runs benchmarks (event latency, 20 users at once): bench_runs.rs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd_core::config::Config;
use sandboxd_core::sandbox::{SessionManager, ShellOptions};
use sandboxd_core::store::{NewUser, Store};
use sandboxd_server::{AppState, Server};
use sandboxd_sqlite::SqliteStore;

/// A server on a loopback port with `users` users (their keys in order), stopped by `stop`.
pub struct BenchServer {
    pub base: String,
    pub keys: Vec<String>,
    pub state: Arc<AppState>,
    pub http: reqwest::Client,
    stop_tx: Option<tokio::sync::oneshot::Sender<()>>,
    serving: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    dir: std::path::PathBuf,
}

impl BenchServer {
    pub async fn start(
        manager: Arc<SessionManager>,
        mut config: Config,
        users: usize,
    ) -> anyhow::Result<BenchServer> {
        let dir = tempfile_dir()?;
        config.data_dir = Some(dir.clone());
        let store = SqliteStore::open(&dir.join("sandboxd.db")).await?;
        let mut keys = Vec::with_capacity(users);
        for i in 0..users {
            let (key, stored) = sandboxd_server::auth::new_key(None);
            store
                .add_user(NewUser {
                    name: format!("bench{i}"),
                    admin: false,
                    key: stored,
                    quota: Default::default(),
                })
                .await?;
            keys.push(key);
        }
        let addr = "127.0.0.1:0".parse()?;
        let server = Server::start(config, Arc::new(store), manager, addr).await?;
        let base = format!("http://{}", server.addr);
        let state = server.state.clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(async move {
            let _ = stop_rx.await;
        }));
        Ok(BenchServer {
            base,
            keys,
            state,
            http: reqwest::Client::new(),
            stop_tx: Some(stop_tx),
            serving: Some(serving),
            dir,
        })
    }

    /// Creates a session for the user with key `key`; its id.
    pub async fn session(&self, key: &str) -> anyhow::Result<String> {
        let created: serde_json::Value = self
            .http
            .post(format!("{}/v1/sessions", self.base))
            .bearer_auth(key)
            .json(&serde_json::json!({}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        created["id"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| anyhow::anyhow!("the new session has no id: {created}"))
    }

    pub async fn delete_session(&self, key: &str, id: &str) {
        let _ = self
            .http
            .delete(format!("{}/v1/sessions/{id}", self.base))
            .bearer_auth(key)
            .send()
            .await;
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
        if let Some(s) = self.serving.take() {
            let _ = s.await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sorted samples of both paths, and the streamed exec's time to its first output event.
pub struct ExecBench {
    pub api: Vec<Duration>,
    pub library: Vec<Duration>,
    pub stream_first: Vec<Duration>,
}

pub async fn bench_exec(
    manager: Arc<SessionManager>,
    config: Config,
    n: usize,
) -> anyhow::Result<ExecBench> {
    let server = BenchServer::start(manager, config, 1).await?;
    let key = server.keys[0].clone();
    let result = exec_rounds(&server, &key, n).await;
    server.stop().await;
    result
}

async fn exec_rounds(server: &BenchServer, key: &str, n: usize) -> anyhow::Result<ExecBench> {
    let id = server.session(key).await?;
    let row = server
        .state
        .store
        .session(&id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the benchmark session has no row"))?;
    let live = server
        .state
        .backend
        .get(&row)
        .await
        .ok_or_else(|| anyhow::anyhow!("the benchmark session is not live"))?;
    let url = format!("{}/v1/sessions/{id}/exec", server.base);
    let stream_url = format!("{url}/stream");
    let body = serde_json::json!({"command": "true"});
    let echo = serde_json::json!({"command": "echo x"});
    let mut out = ExecBench {
        api: Vec::with_capacity(n),
        library: Vec::with_capacity(n),
        stream_first: Vec::with_capacity(n),
    };
    let http = &server.http;
    for i in 0..n + 10 {
        let t = Instant::now();
        let r = http.post(&url).bearer_auth(key).json(&body).send().await?;
        anyhow::ensure!(r.status().is_success(), "exec answered {}", r.status());
        let _ = r.bytes().await?;
        let api = t.elapsed();
        let t = Instant::now();
        live.sandbox.shell("true", ShellOptions::default()).await?;
        let lib = t.elapsed();
        // The streamed exec: from the request to its first output event.
        let t = Instant::now();
        let mut r = http
            .post(&stream_url)
            .bearer_auth(key)
            .json(&echo)
            .send()
            .await?;
        anyhow::ensure!(
            r.status().is_success(),
            "exec/stream answered {}",
            r.status()
        );
        let mut seen = Vec::new();
        let mut first = None;
        while let Some(chunk) = r.chunk().await? {
            seen.extend_from_slice(&chunk);
            if first.is_none() && seen.windows(13).any(|w| w == b"event: stdout") {
                first = Some(t.elapsed());
            }
        }
        // The first rounds warm the connection pool and the shell.
        if i >= 10 {
            out.api.push(api);
            out.library.push(lib);
            out.stream_first.extend(first);
        }
    }
    server.delete_session(key, &id).await;
    out.api.sort();
    out.library.sort();
    out.stream_first.sort();
    Ok(out)
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("sandboxd-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
