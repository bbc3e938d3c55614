//! The `serve` benchmarks for `sandboxd bench serve`, each against a real server on loopback
//! in this process (its own temporary data directory and users):
//! - exec overhead: `true` through `POST /v1/sessions/{id}/exec` (auth, store lookup, routing,
//!   JSON both ways) against the same session's persistent shell called from the library,
//!   interleaved so both see the same container and machine load; the difference of the
//!   medians is the API's overhead. The streamed exec's first byte is measured beside it.
//! - the runs benchmarks (event latency, 20 users at once): server_runs.rs; the same across
//!   replicas of one Postgres store: replicas.rs. `BenchServer::over` starts a server over a
//!   given store, so several can share one (replicas).

use std::sync::{Arc, Mutex};
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
    /// Taken by the first `stop` (a server shared as a replica is stopped through `&self`).
    stop_tx: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    serving: Mutex<Option<tokio::task::JoinHandle<anyhow::Result<()>>>>,
    dir: std::path::PathBuf,
}

impl BenchServer {
    /// A server on its own SQLite store (a temporary data directory) with `users` new users.
    pub async fn start(
        manager: Arc<SessionManager>,
        config: Config,
        users: usize,
    ) -> anyhow::Result<BenchServer> {
        let dir = tempfile_dir()?;
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("sandboxd.db")).await?);
        let keys = add_users(store.as_ref(), users).await?;
        Self::start_in(dir, store, manager, config, keys).await
    }

    /// A server over `store` (which may be shared with other servers: replicas) whose users'
    /// keys are `keys`, in a temporary data directory of its own.
    pub async fn over(
        store: Arc<dyn Store>,
        manager: Arc<SessionManager>,
        config: Config,
        keys: Vec<String>,
    ) -> anyhow::Result<BenchServer> {
        Self::start_in(tempfile_dir()?, store, manager, config, keys).await
    }

    /// A server over `store` with the data directory `dir` (removed by `stop`, or here when
    /// the server cannot start).
    pub async fn start_in(
        dir: std::path::PathBuf,
        store: Arc<dyn Store>,
        manager: Arc<SessionManager>,
        mut config: Config,
        keys: Vec<String>,
    ) -> anyhow::Result<BenchServer> {
        config.data_dir = Some(dir.clone());
        let addr = "127.0.0.1:0".parse()?;
        let server = match Server::start(config, store, manager, addr).await {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
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
            stop_tx: Mutex::new(Some(stop_tx)),
            serving: Mutex::new(Some(serving)),
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

    /// Stops serving (the replica leaves the registry) and removes the data directory.
    pub async fn stop(&self) {
        let tx = self.stop_tx.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(tx) = tx {
            let _ = tx.send(());
        }
        let serving = self.serving.lock().map(|mut s| s.take()).unwrap_or(None);
        if let Some(s) = serving {
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

/// The sync exec of `true` through each server (in a session of its first user made on it),
/// one request on each in turn so all see the same machine load; each server's sorted
/// samples, in the servers' order. The first 10 rounds warm up and are not counted.
pub async fn exec_interleaved(
    servers: &[&BenchServer],
    n: usize,
) -> anyhow::Result<Vec<Vec<Duration>>> {
    let mut sessions = Vec::new();
    for s in servers {
        let key = s
            .keys
            .first()
            .ok_or_else(|| anyhow::anyhow!("the benchmark server has no user"))?;
        sessions.push((*s, key.as_str(), s.session(key).await?));
    }
    let result = exec_rounds_of(&sessions, n).await;
    for (s, key, id) in &sessions {
        s.delete_session(key, id).await;
    }
    let mut out = result?;
    for v in &mut out {
        v.sort();
    }
    Ok(out)
}

async fn exec_rounds_of(
    sessions: &[(&BenchServer, &str, String)],
    n: usize,
) -> anyhow::Result<Vec<Vec<Duration>>> {
    let body = serde_json::json!({"command": "true"});
    let mut out = vec![Vec::with_capacity(n); sessions.len()];
    for i in 0..n + 10 {
        for ((s, key, id), samples) in sessions.iter().zip(&mut out) {
            let t = Instant::now();
            let r = s
                .http
                .post(format!("{}/v1/sessions/{id}/exec", s.base))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await?;
            anyhow::ensure!(r.status().is_success(), "exec answered {}", r.status());
            let _ = r.bytes().await?;
            if i >= 10 {
                samples.push(t.elapsed());
            }
        }
    }
    Ok(out)
}

/// Adds `n` users (`bench0`, `bench1`, …) to `store`; their API keys in order.
pub async fn add_users(store: &dyn Store, n: usize) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::with_capacity(n);
    for i in 0..n {
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
    Ok(keys)
}

/// A new empty directory under the system's temporary directory.
pub fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("sandboxd-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
