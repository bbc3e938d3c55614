//! `sandboxd bench hibernate` (issue 28, item 5): a real server on loopback in this process,
//! its own manager (no warm pool, so every create is cold) and temporary data directory:
//! - a cold create: `POST /v1/sessions`, then the first command (`true` through the exec
//!   route) answered — the baseline, measured before each cycle below so both meet the same load;
//! - hibernate of a session whose /workspace holds `size` MiB of random bytes (the save to
//!   the snapshot file, the row, the container's removal: `hibernate::hibernate`, what the
//!   reaper and the admin route run);
//! - resume: the first command on the hibernated session (`true` through the exec route, as
//!   the baseline's) answered: the container made again, the snapshot checked and restored,
//!   the row flipped; the file is then checked, untimed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::records::NoRecords;
use sandboxd_core::sandbox::{Runtime, SessionManager};

use super::server::BenchServer;

/// One workspace size's samples, sorted.
pub struct SizeBench {
    pub mib: u64,
    pub hibernate: Vec<Duration>,
    pub resume: Vec<Duration>,
}

pub struct HibernateBench {
    /// Cold create → first command answered (one before each cycle of every size), sorted.
    pub cold: Vec<Duration>,
    pub sizes: Vec<SizeBench>,
}

/// `n` hibernate/resume cycles of a session per size in `sizes`, each after a cold create
/// (the baseline, measured interleaved).
pub async fn bench_hibernate(
    runtime: Arc<dyn Runtime>,
    config: Config,
    sizes: &[u64],
    n: usize,
) -> anyhow::Result<HibernateBench> {
    let manager = SessionManager::new(
        runtime,
        config.limits.clone(),
        config.sessions.clone(),
        Arc::new(NoRecords),
    );
    let server = BenchServer::start(manager, config, 1).await?;
    let result = measure(&server, sizes, n).await;
    server.stop().await;
    result
}

async fn measure(server: &BenchServer, sizes: &[u64], n: usize) -> anyhow::Result<HibernateBench> {
    let key = server.keys[0].clone();
    let mut cold = Vec::with_capacity(n * sizes.len());
    let mut out = Vec::new();
    for &mib in sizes {
        let id = server.session(&key).await?;
        let fill = format!("head -c {mib}M /dev/urandom > /workspace/fill.bin");
        exec(server, &key, &id, &fill).await?;
        let mut b = SizeBench {
            mib,
            hibernate: Vec::with_capacity(n),
            resume: Vec::with_capacity(n),
        };
        for _ in 0..n {
            // The baseline interleaved with the resumes, so both meet the same load.
            cold.push(cold_create(server, &key).await?);
            b.hibernate.push(hibernate_once(server, &id).await?);
            // The same first command as the baseline's; the file is checked after, untimed.
            let t = Instant::now();
            exec(server, &key, &id, "true").await?;
            b.resume.push(t.elapsed());
            let out = exec(server, &key, &id, "stat -c %s /workspace/fill.bin").await?;
            let want = format!("{}\n", mib << 20);
            anyhow::ensure!(
                out["stdout"].as_str() == Some(want.as_str()),
                "the resumed workspace lost its file: {out}"
            );
        }
        b.hibernate.sort();
        b.resume.sort();
        out.push(b);
        server.delete_session(&key, &id).await;
    }
    cold.sort();
    Ok(HibernateBench { cold, sizes: out })
}

/// A cold create and its first command answered; how long it took.
async fn cold_create(server: &BenchServer, key: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let id = server.session(key).await?;
    exec(server, key, &id, "true").await?;
    let took = t.elapsed();
    server.delete_session(key, &id).await;
    Ok(took)
}

/// Hibernates session `id` as the reaper would; how long it took.
async fn hibernate_once(server: &BenchServer, id: &str) -> anyhow::Result<Duration> {
    let st = &server.state;
    let row = st
        .store
        .session(id)
        .await?
        .context("the session's row is gone")?;
    let owner = sandboxd_server::backend::Backend::owner_of(&row.owner)?;
    let rt = row
        .runtime_id
        .clone()
        .context("the session has no runtime id")?;
    let session = st
        .backend
        .manager()
        .held(&owner, &rt)
        .context("the server does not hold the session")?;
    let t = Instant::now();
    let done = sandboxd_server::hibernate::hibernate(st, &row, session)
        .await
        .map_err(|why| anyhow::anyhow!("could not hibernate: {why}"))?;
    anyhow::ensure!(done, "the session was not hibernated (in use?)");
    Ok(t.elapsed())
}

async fn exec(
    server: &BenchServer,
    key: &str,
    id: &str,
    command: &str,
) -> anyhow::Result<serde_json::Value> {
    let out: serde_json::Value = server
        .http
        .post(format!("{}/v1/sessions/{id}/exec", server.base))
        .bearer_auth(key)
        .json(&serde_json::json!({"command": command, "timeout": 600}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    anyhow::ensure!(out["exit_code"] == 0, "`{command}` failed: {out}");
    Ok(out)
}
