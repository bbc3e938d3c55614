//! `sandboxd bench pool`: sessions from the warm pool and from cold creates, one at a time
//! and 50 at once, beside `docker run -d` of the same hardened container in the same run;
//! and what one idle session costs the host in memory (its container plus sandboxd's own
//! state), so how many fit in 8 GiB.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd_core::config::{PoolConfig, SessionsConfig};
use sandboxd_core::sandbox::{SessionManager, ShellOptions};

use super::Ctx;
use super::bench::{bench_image, bench_session, docker_cli, hardened_run_args, row, section};

/// CubeSandbox's published P99 of 50 concurrent creates (blog, 2026-06-01, 96-core bare metal).
const CUBE_P99_50_MS: f64 = 137.0;

async fn manager(ctx: &Ctx, pool: usize) -> anyhow::Result<Arc<SessionManager>> {
    manager_with(ctx, pool, ctx.config.pool.refill_delay_ms).await
}

pub(crate) async fn manager_with(
    ctx: &Ctx,
    pool: usize,
    refill_delay_ms: u64,
) -> anyhow::Result<Arc<SessionManager>> {
    Ok(SessionManager::with_pool(
        ctx.runtime().await?,
        ctx.config.limits.clone(),
        SessionsConfig {
            max: 128,
            max_per_owner: 128,
            ..ctx.config.sessions.clone()
        },
        PoolConfig {
            size: pool,
            refill_delay_ms,
            ..ctx.config.pool.clone()
        },
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    ))
}

/// Create (or claim) a session and have its first command answered; the time it took.
async fn create_to_first(m: &SessionManager) -> anyhow::Result<(Duration, String)> {
    let t = Instant::now();
    let s = bench_session(m).await?;
    let out = s.sandbox.shell("true", ShellOptions::default()).await?;
    anyhow::ensure!(out.exit_code == Some(0), "the first command failed");
    Ok((t.elapsed(), s.id.clone()))
}

/// Claims from a pool whose refill task runs, as in `mcp` and `serve`: each claim waits (not
/// timed) for a full pool, then the claim and the first command are timed, the claim wakes
/// the refill, which starts `refill_delay_ms` later. Returns (claim → first command, claim).
async fn claims_with_refill(
    ctx: &Ctx,
    rounds: usize,
    refill_delay_ms: u64,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let size = 2;
    let m = manager_with(ctx, size, refill_delay_ms).await?;
    let task = m.spawn_pool();
    let (mut total, mut claim) = (Vec::new(), Vec::new());
    let result = async {
        for _ in 0..rounds {
            let deadline = Instant::now() + Duration::from_secs(120);
            while m.pool_ready() < size {
                anyhow::ensure!(Instant::now() < deadline, "the pool did not refill");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // The previous container's removal settles too, as between real claims.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let t = Instant::now();
            let s = bench_session(&m).await?;
            let claimed = t.elapsed();
            let out = s.sandbox.shell("true", ShellOptions::default()).await?;
            anyhow::ensure!(out.exit_code == Some(0), "the first command failed");
            total.push(t.elapsed());
            claim.push(claimed);
            m.admin_remove(&s.id).await?;
        }
        Ok(())
    }
    .await;
    if let Some(task) = task {
        task.abort();
    }
    m.remove_all().await;
    result.map(|()| (total, claim))
}

/// `n` creates at once; each one's time from the common start to its first command.
async fn concurrent(m: &Arc<SessionManager>, n: usize) -> anyhow::Result<Vec<Duration>> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move { create_to_first(&m).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??.0);
    }
    Ok(out)
}

/// `n` `docker run -d` at once (n CLI processes); each one's time to its container id.
fn concurrent_docker_runs(image: &str, oci: &str, n: usize) -> anyhow::Result<Vec<Duration>> {
    let start = Instant::now();
    let runs: Vec<_> = (0..n)
        .map(|_| {
            let image = image.to_string();
            let oci = oci.to_string();
            std::thread::spawn(move || {
                let id = docker_cli(&hardened_run_args(&image, &oci));
                (start.elapsed(), id)
            })
        })
        .collect();
    let mut times = Vec::new();
    let mut ids = Vec::new();
    for r in runs {
        let (t, id) = r
            .join()
            .map_err(|_| anyhow::anyhow!("a docker run thread panicked"))?;
        times.push(t);
        ids.push(id);
    }
    for id in ids.iter().flatten() {
        let _ = docker_cli(&["rm", "-f", id]);
    }
    for id in ids {
        id?;
    }
    Ok(times)
}

/// This process's resident memory, from /proc.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

pub(crate) async fn pool(ctx: &Ctx, n: usize) -> anyhow::Result<()> {
    let image = bench_image();
    let oci = ctx.config.docker.runtime.clone();
    section("Warm pool and concurrent creates");

    let cold = manager(ctx, 0).await?;
    let mut c = cold_creates(&cold, &image, &oci).await?;
    let mut claims = warm_claims(ctx, n).await?;
    // As in `mcp` and `serve`: the refill task runs and each claim wakes it. Immediately
    // (refill_delay_ms = 0, before this issue) and after the configured delay.
    let rounds = n.clamp(10, 50);
    let (mut at_once, _) = claims_with_refill(ctx, rounds, 0).await?;
    let delay = ctx.config.pool.refill_delay_ms.max(1);
    let (mut delayed, mut claim_part) = claims_with_refill(ctx, rounds, delay).await?;
    row(
        "warm claim → first `true`, refill task woken at once",
        &mut at_once,
        "",
        &mut [],
        "p50 ≤ 5 ms, p99 ≤ 20 ms",
    );
    row(
        &format!("warm claim → first `true`, refill {delay} ms after the claim"),
        &mut delayed,
        "",
        &mut [],
        "p50 ≤ 5 ms, p99 ≤ 20 ms",
    );
    row(
        "  of which: the claim (create returns)",
        &mut claim_part,
        "",
        &mut [],
        "—",
    );
    row(
        "warm claim → first `true` answered (pool full, no refill running)",
        &mut claims,
        "cold create",
        &mut c.totals.clone(),
        "p50 ≤ 5 ms, p99 ≤ 20 ms",
    );
    c.rows();
    fifty_at_once(ctx, &cold, &image, &oci).await?;
    println!();
    idle_density(ctx).await
}

/// Cold creates, one at a time, beside `docker run -d` of the same hardening.
struct ColdCreates {
    /// Create → first `true` answered.
    totals: Vec<Duration>,
    docker_runs: Vec<Duration>,
    /// Where a cold create's time goes: the engine's create + start, then the first shell.
    engine_part: Vec<Duration>,
    shell_part: Vec<Duration>,
}

impl ColdCreates {
    fn rows(&mut self) {
        row(
            "cold create → first `true` answered",
            &mut self.totals,
            "docker run -d",
            &mut self.docker_runs,
            "p50 ≤ 1.0× docker run -d",
        );

        row(
            "  of which: container create + start",
            &mut self.engine_part,
            "",
            &mut [],
            "—",
        );
        row(
            "  of which: first shell start + `true`",
            &mut self.shell_part,
            "",
            &mut [],
            "—",
        );
    }
}

async fn cold_creates(
    cold: &Arc<SessionManager>,
    image: &str,
    oci: &str,
) -> anyhow::Result<ColdCreates> {
    let mut c = ColdCreates {
        totals: Vec::new(),
        docker_runs: Vec::new(),
        engine_part: Vec::new(),
        shell_part: Vec::new(),
    };
    for _ in 0..10 {
        let t = Instant::now();
        let s = bench_session(cold).await?;
        let created = t.elapsed();
        s.sandbox.shell("true", ShellOptions::default()).await?;
        let total = t.elapsed();
        c.engine_part.push(created);
        c.shell_part.push(total - created);
        c.totals.push(total);
        cold.admin_remove(&s.id).await?;
        let t = Instant::now();
        let cid = docker_cli(&hardened_run_args(image, oci))?;
        c.docker_runs.push(t.elapsed());
        docker_cli(&["rm", "-f", &cid])?;
    }
    Ok(c)
}

/// Warm: each claim from a full pool; the refill is not timed.
async fn warm_claims(ctx: &Ctx, n: usize) -> anyhow::Result<Vec<Duration>> {
    let size = 4;
    let warm = manager(ctx, size).await?;
    let mut claims = Vec::new();
    for _ in 0..n.clamp(10, 50) {
        sandboxd::bench::support::fill_pool(&warm, size).await?;
        let (t, id) = create_to_first(&warm).await?;
        claims.push(t);
        warm.admin_remove(&id).await?;
    }
    warm.remove_all().await;
    Ok(claims)
}

/// 50 at once: cold creates against 50 docker run -d, then 50 claims from a pool of 50.
async fn fifty_at_once(
    ctx: &Ctx,
    cold: &Arc<SessionManager>,
    image: &str,
    oci: &str,
) -> anyhow::Result<()> {
    let mut ours = concurrent(cold, 50).await?;
    cold.remove_all().await;
    let mut base = concurrent_docker_runs(image, oci, 50)?;
    row(
        "50 concurrent cold creates → first command (each from the common start)",
        &mut ours,
        "50 × docker run -d",
        &mut base,
        &format!("P99 beside CubeSandbox's {CUBE_P99_50_MS} ms (96-core bare metal)"),
    );
    let warm50 = manager(ctx, 50).await?;
    sandboxd::bench::support::fill_pool(&warm50, 50).await?;
    let mut ours = concurrent(&warm50, 50).await?;
    warm50.remove_all().await;
    row(
        "50 concurrent warm claims → first command",
        &mut ours,
        "",
        &mut [],
        &format!("P99 beside CubeSandbox's {CUBE_P99_50_MS} ms"),
    );
    Ok(())
}

/// The host memory one idle session costs: its container's cgroup (processes plus tmpfs,
/// without reclaimable page cache) and the growth of sandboxd's own resident memory.
async fn idle_density(ctx: &Ctx) -> anyhow::Result<()> {
    let k = 20;
    let m = manager(ctx, 0).await?;
    let before = rss_bytes();
    let mut sessions = Vec::new();
    for _ in 0..k {
        let s = bench_session(&m).await?;
        // Idle as a used session is: its shell and file helper started.
        s.sandbox.warm_up().await?;
        sessions.push(s);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let host = rss_bytes().saturating_sub(before) / k as u64;
    let mut container = 0u64;
    for s in &sessions {
        container += m.memory_of(s).await?.unwrap_or(0);
    }
    let container = container / k as u64;
    m.remove_all().await;
    let per = container + host;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let fit = (8u64 << 30).checked_div(per).unwrap_or(0);
    println!("| idle session ({k} sessions, shell and file helper up) | MiB |");
    println!("|---|---|");
    println!(
        "| container (cgroup memory, no page cache) | {:.1} |",
        mib(container)
    );
    println!(
        "| sandboxd host-side state (RSS growth per session) | {:.2} |",
        mib(host)
    );
    println!("| total per idle session | {:.1} |", mib(per));
    println!("| idle sessions in 8 GiB (target ≥ 200) | {fit} |");
    println!();
    Ok(())
}
