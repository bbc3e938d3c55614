//! The `serve` benchmark for `sandboxd bench serve`: `true` through `POST
//! /v1/sessions/{id}/exec` on loopback (auth, store lookup, routing, JSON both ways) against
//! the same session's persistent shell called from the library, interleaved so both see the
//! same container and machine load. The difference of the medians is the API's overhead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::Server;
use super::health::Readiness;
use crate::config::Config;
use crate::sandbox::{SessionManager, ShellOptions};
use crate::store::{NewUser, SqliteStore, Store};

struct AlwaysReady;

#[async_trait]
impl Readiness for AlwaysReady {
    async fn engine(&self) -> Result<(), String> {
        Ok(())
    }
    async fn image(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Sorted samples of both paths.
pub struct ExecBench {
    pub api: Vec<Duration>,
    pub library: Vec<Duration>,
}

pub async fn bench_exec(
    manager: Arc<SessionManager>,
    mut config: Config,
    n: usize,
) -> anyhow::Result<ExecBench> {
    let dir = tempfile_dir()?;
    config.data_dir = Some(dir.clone());
    let store = SqliteStore::open(&dir.join("sandboxd.db")).await?;
    let (key, stored) = super::auth::new_key(None);
    store
        .add_user(NewUser {
            name: "bench".into(),
            admin: false,
            key: stored,
            quota: Default::default(),
        })
        .await?;
    let addr = "127.0.0.1:0".parse()?;
    let server = Server::start(
        config,
        Arc::new(store),
        manager,
        Arc::new(AlwaysReady),
        addr,
    )
    .await?;
    let base = format!("http://{}", server.addr);
    let state = server.state.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(async move {
        let _ = stop_rx.await;
    }));

    let http = reqwest::Client::new();
    let created: serde_json::Value = http
        .post(format!("{base}/v1/sessions"))
        .bearer_auth(&key)
        .json(&serde_json::json!({}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let id = created["id"].as_str().unwrap_or_default().to_string();
    let live = state
        .backend
        .get(&id)
        .await
        .ok_or_else(|| anyhow::anyhow!("the benchmark session is not live"))?;
    let url = format!("{base}/v1/sessions/{id}/exec");
    let body = serde_json::json!({"command": "true"});
    let mut out = ExecBench {
        api: Vec::with_capacity(n),
        library: Vec::with_capacity(n),
    };
    for i in 0..n + 10 {
        let t = Instant::now();
        let r = http.post(&url).bearer_auth(&key).json(&body).send().await?;
        anyhow::ensure!(r.status().is_success(), "exec answered {}", r.status());
        let _ = r.bytes().await?;
        let api = t.elapsed();
        let t = Instant::now();
        live.sandbox.shell("true", ShellOptions::default()).await?;
        let lib = t.elapsed();
        // The first rounds warm the connection pool and the shell.
        if i >= 10 {
            out.api.push(api);
            out.library.push(lib);
        }
    }
    let _ = http
        .delete(format!("{base}/v1/sessions/{id}"))
        .bearer_auth(&key)
        .send()
        .await;
    let _ = stop_tx.send(());
    let _ = serving.await;
    let _ = std::fs::remove_dir_all(&dir);
    out.api.sort();
    out.library.sort();
    Ok(out)
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("sandboxd-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
