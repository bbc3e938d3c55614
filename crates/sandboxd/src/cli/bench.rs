//! `sandboxd bench`: sandboxd beside the plain `docker` CLI doing the same work in the same
//! run, printed as Markdown tables for BENCHMARKS.md. Timings live here, never in tests.

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sandboxd::bench::stats::percentile;
use sandboxd_core::config::LimitRequest;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::{CreateOptions, Owner, SessionManager, ShellOptions};
use sandboxd_core::tools::{ToolContext, ToolRegistry};

use super::Ctx;

#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// Which group to run: runtime, tools, agent, flow, browser, mcp, research, egress, serve, a2a (part of serve), pool, ui, stream, metrics, hibernate, e2b (not in all: it needs the E2B SDKs' venv), kubernetes (not in all: it needs a cluster, or the fake API server), or all.
    #[arg(default_value = "all")]
    pub group: String,
    /// Repetitions of each fast measurement.
    #[arg(long, default_value_t = 200)]
    pub iterations: usize,
    /// A PostgreSQL cluster for `serve`'s replica measurements, `postgres://USER:PASSWORD@HOST:PORT/postgres`
    /// (the user may CREATE DATABASE: the bench makes a database with a random name and drops
    /// it after). Else SANDBOXD_BENCH_PG_URL, else SANDBOXD_TEST_PG_URL; without one those
    /// measurements are skipped.
    #[arg(long, value_name = "URL")]
    pub store_url: Option<String>,
    /// `kubernetes` only: the cluster's kubeconfig (else KUBECONFIG, else ~/.kube/config or
    /// the in-cluster service account).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// `kubernetes` only: the namespace of the bench's pods (else `[kubernetes] namespace`).
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// The owner of the benchmark's sessions.
pub(crate) fn bench_owner() -> anyhow::Result<Owner> {
    Ok(Owner::new("bench")?)
}

/// A fresh session of the benchmark's owner with the configured limits: every group's
/// prologue (the caller removes it).
pub(crate) async fn bench_session(manager: &SessionManager) -> anyhow::Result<Arc<Session>> {
    Ok(manager
        .create(
            &bench_owner()?,
            &LimitRequest::default(),
            CreateOptions::default(),
        )
        .await?)
}

/// p50 and p99 of a sample, in milliseconds.
pub(crate) fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    if samples.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let at = |q: f64| percentile(samples, q).as_secs_f64() * 1e3;
    (at(0.5), at(0.99))
}

pub(crate) fn row(
    what: &str,
    ours: &mut [Duration],
    baseline_name: &str,
    base: &mut [Duration],
    target: &str,
) {
    let (o50, o99) = percentiles(ours);
    if base.is_empty() {
        println!("| {what} | {o50:.2} | {o99:.2} | — | — | — | {target} |");
        return;
    }
    let (b50, b99) = percentiles(base);
    println!(
        "| {what} | {o50:.2} | {o99:.2} | {baseline_name}: {b50:.2} | {b99:.2} | {:.2}× | {target} |",
        o50 / b50
    );
}

/// A group's heading and its table header.
pub(crate) fn section(title: &str) {
    println!("### {title}");
    println!();
    header();
}

pub(crate) fn header() {
    println!(
        "| measurement | sandboxd p50 ms | p99 ms | baseline p50 ms | baseline p99 ms | ratio (p50) | target |"
    );
    println!("|---|---|---|---|---|---|---|");
}

pub(crate) fn docker_cli(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("docker")
        .args(args)
        .stderr(Stdio::piped())
        .output()
        .context("run the docker CLI")?;
    anyhow::ensure!(
        out.status.success(),
        "docker {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The groups `sandboxd bench` knows (`all` runs every one but `a2a`, which `serve` includes,
/// and `e2b`, which needs the E2B SDKs' venv).
const GROUPS: &[&str] = &[
    "all",
    "runtime",
    "tools",
    "agent",
    "flow",
    "browser",
    "mcp",
    "research",
    "egress",
    "serve",
    "a2a",
    "pool",
    "ui",
    "stream",
    "metrics",
    "hibernate",
    "e2b",
    "kubernetes",
];

pub(crate) async fn main(ctx: Ctx, args: BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        GROUPS.contains(&args.group.as_str()),
        "unknown group {:?}: use {}",
        args.group,
        GROUPS[1..].join(", ") + " or all"
    );
    if args.group == "kubernetes" {
        // Not in `all`: it needs a cluster (or the fake API server), and no Docker manager.
        return super::bench_kube::kubernetes(&ctx, &args).await;
    }
    let manager = ctx.manager().await?;
    println!(
        "sandboxd bench — {} — machine: {} cores",
        chrono_date(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!();
    let all = args.group == "all";
    if all || args.group == "runtime" {
        runtime(&manager, &ctx.config.docker.runtime, args.iterations).await?;
    }
    if all || args.group == "tools" {
        tools(&manager, &ctx, args.iterations).await?;
    }
    if all || args.group == "agent" {
        agent(&manager, &ctx, args.iterations).await?;
    }
    if all || args.group == "flow" {
        flow(&manager, &ctx.config, args.iterations).await?;
    }
    if all || args.group == "browser" {
        browser(&manager, args.iterations.min(30)).await?;
    }
    if all || args.group == "mcp" {
        mcp(manager.clone(), &ctx, args.iterations).await?;
    }
    if all || args.group == "research" {
        research(&manager, args.iterations.min(50)).await?;
    }
    if all || args.group == "egress" {
        egress(&manager, args.iterations).await?;
    }
    if all || args.group == "serve" {
        serve(manager.clone(), &ctx, args.iterations).await?;
        super::bench_replicas::serve_replicas(&ctx, args.store_url.as_deref(), args.iterations)
            .await?;
    }
    if args.group == "a2a" {
        // Also part of `serve`; alone, for a quick look at A2A's overhead.
        section("A2A on `sandboxd serve`");
        println!("{}", a2a(manager.clone(), &ctx, args.iterations).await);
    }
    if all || args.group == "pool" {
        super::bench_pool::pool(&ctx, args.iterations).await?;
    }
    if args.group == "e2b" {
        // Not in `all`: it needs the E2B SDKs' venv.
        super::bench_e2b::e2b(&ctx, args.iterations).await?;
    }
    if all || args.group == "metrics" {
        metrics(args.iterations);
    }
    if all || args.group == "ui" {
        ui(manager.clone(), &ctx, args.iterations.min(10)).await?;
    }
    if all || args.group == "stream" {
        super::bench_stream::stream(manager.clone(), &ctx, args.iterations).await?;
    }
    if all || args.group == "hibernate" {
        hibernate(&ctx, args.iterations.min(5)).await?;
    }
    manager.remove_all().await;
    Ok(ExitCode::SUCCESS)
}

/// A `/metrics` scrape with 1,000 sessions' activity in the registry.
fn metrics(n: usize) {
    println!("### `/metrics` (issue 28)");
    println!();
    println!("| measurement | p50 ms | p99 ms |");
    println!("|---|---|---|");
    println!("{}", sandboxd::bench::metrics::report(1000, n));
    println!();
}

pub(crate) fn chrono_date() -> String {
    Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

async fn runtime(manager: &SessionManager, oci: &str, n: usize) -> anyhow::Result<()> {
    let image = bench_image();
    section("Runtime");
    // Session create-to-ready (first command answered) vs `docker run -d` of the same hardening.
    let rounds = 10;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let s = bench_session(manager).await?;
        s.sandbox.shell("true", ShellOptions::default()).await?;
        ours.push(t.elapsed());
        manager.remove(&s.owner, &s.id).await?;
        let t = Instant::now();
        let id = docker_cli(&hardened_run_args(&image, oci))?;
        base.push(t.elapsed());
        docker_cli(&["rm", "-f", &id])?;
    }
    row(
        "session create-to-ready (first `true` answered)",
        &mut ours,
        "docker run -d",
        &mut base,
        "≤ 1.2× docker run -d",
    );

    let s = bench_session(manager).await?;
    let container = s.handle.clone();
    s.sandbox.shell("true", ShellOptions::default()).await?;
    let mut ours = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.sandbox.shell("true", ShellOptions::default()).await?;
        ours.push(t.elapsed());
    }
    let mut base = Vec::new();
    for _ in 0..n.min(50) {
        let t = Instant::now();
        docker_cli(&["exec", &container, "true"])?;
        base.push(t.elapsed());
    }
    row(
        "command round trip (`true`)",
        &mut ours,
        "docker exec",
        &mut base,
        "p50 ≤ 1 ms",
    );

    file_round_trip_row(&s, &image, n).await?;
    manager.remove(&s.owner, &s.id).await?;
    println!();
    Ok(())
}

/// 1 MiB write + read: the file helper vs `docker cp` in and out of a container that allows it
/// (the archive API refuses a read-only root, so the baseline container is writable).
async fn file_round_trip_row(s: &Session, image: &str, n: usize) -> anyhow::Result<()> {
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut ours = Vec::new();
    for _ in 0..n.min(50) {
        let t = Instant::now();
        s.sandbox.write_file("/workspace/bench.bin", &data).await?;
        let back = s.sandbox.read_file("/workspace/bench.bin").await?;
        ours.push(t.elapsed());
        anyhow::ensure!(back.len() == data.len(), "round trip lost bytes");
    }
    let plain = docker_cli(&[
        "run",
        "-d",
        "--network",
        "none",
        "--label",
        "sandboxd.bench=true",
        image,
        "sleep",
        "infinity",
    ])?;
    let dir = tempfile_dir()?;
    let src = dir.join("bench.bin");
    std::fs::write(&src, &data)?;
    let mut base = Vec::new();
    for _ in 0..n.min(20) {
        let t = Instant::now();
        docker_cli(&[
            "cp",
            &src.to_string_lossy(),
            &format!("{plain}:/tmp/bench.bin"),
        ])?;
        docker_cli(&[
            "cp",
            &format!("{plain}:/tmp/bench.bin"),
            &dir.join("back.bin").to_string_lossy(),
        ])?;
        base.push(t.elapsed());
    }
    docker_cli(&["rm", "-f", &plain])?;
    let _ = std::fs::remove_dir_all(&dir);
    row(
        "1 MiB write + read",
        &mut ours,
        "docker cp in + out",
        &mut base,
        "≤ 30 ms",
    );
    Ok(())
}

/// `docker run -d` of a container hardened as a session's, under the same OCI runtime
/// (`[docker] runtime`, empty for Docker's default): the baseline of create timings.
pub(crate) fn hardened_run_args<'a>(image: &'a str, oci_runtime: &'a str) -> Vec<&'a str> {
    let runtime: &[&str] = if oci_runtime.is_empty() {
        &[]
    } else {
        &["--runtime", oci_runtime]
    };
    let mut args = vec!["run", "-d"];
    args.extend_from_slice(runtime);
    args.extend([
        "--network",
        "none",
        "--read-only",
        "--user",
        "1000:1000",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges:true",
        "--init",
        "--pids-limit",
        "256",
        "--memory",
        "1g",
        "--memory-swap",
        "1g",
        "--cpus",
        "1",
        "--tmpfs",
        "/workspace:rw,exec,size=1024m,uid=1000,gid=1000",
        "--tmpfs",
        "/tmp:rw,noexec,size=256m",
        "--label",
        "sandboxd.bench=true",
        image,
        "sleep",
        "infinity",
    ]);
    args
}

/// The image id the benchmark's baselines run (the recipe's tag, resolved).
pub(crate) fn bench_image() -> String {
    docker_cli(&[
        "inspect",
        "--format",
        "{{.Id}}",
        &sandboxd_docker::image::image_tag(),
    ])
    .unwrap_or_else(|_| sandboxd_docker::image::image_tag())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("sandboxd-bench-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn tools(manager: &SessionManager, ctx: &Ctx, n: usize) -> anyhow::Result<()> {
    section("Tools (through the registry, as the model calls them)");
    let s = bench_session(manager).await?;
    let container = s.handle.clone();
    let registry =
        sandboxd_core::tools::session::server_tools(s.sandbox.clone(), &s.limits, &ctx.config);
    python_rows(ctx, &s, &registry, &container, n).await?;
    bash_row(&registry, &container, n).await?;
    str_replace_row(&s, &registry, &container, n).await?;
    manager.remove(&s.owner, &s.id).await?;
    println!();
    Ok(())
}

/// One tool call through the registry, timed; a call the tool reports as failed is an error.
async fn timed_call(registry: &ToolRegistry, name: &str, args: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let r = registry
        .execute(name, args, &ToolContext::default())
        .await?;
    anyhow::ensure!(!r.is_error(), "{name} failed: {}", r.render());
    Ok(t.elapsed())
}

/// A warm python cell, and a new process's first cell, beside `docker exec python3 -c`.
async fn python_rows(
    ctx: &Ctx,
    s: &Session,
    registry: &ToolRegistry,
    container: &str,
    n: usize,
) -> anyhow::Result<()> {
    timed_call(registry, "python", r#"{"code":"1+1"}"#).await?;
    let mut ours = Vec::new();
    for _ in 0..n {
        ours.push(timed_call(registry, "python", r#"{"code":"1+1"}"#).await?);
    }
    let mut base = Vec::new();
    for _ in 0..n.min(30) {
        let t = Instant::now();
        docker_cli(&["exec", container, "python3", "-c", "1+1"])?;
        base.push(t.elapsed());
    }
    row(
        "python cell `1+1` (warm)",
        &mut ours,
        "docker exec python3 -c",
        &mut base,
        "p50 ≤ 5 ms",
    );

    // What a later process's first python call costs in a kept session: a new tool
    // (a new connection through the relay) reaching the interpreter that already runs.
    let mut ours = Vec::new();
    for _ in 0..n.min(50) {
        let registry =
            sandboxd_core::tools::session::server_tools(s.sandbox.clone(), &s.limits, &ctx.config);
        let t = Instant::now();
        let r = registry
            .execute("python", r#"{"code":"1+1"}"#, &ToolContext::default())
            .await?;
        anyhow::ensure!(!r.is_error(), "python failed: {}", r.render());
        ours.push(t.elapsed());
    }
    row(
        "python: a new process's first cell (relay to the running interpreter)",
        &mut ours,
        "docker exec python3 -c",
        &mut base,
        "no interpreter start",
    );
    Ok(())
}

async fn bash_row(registry: &ToolRegistry, container: &str, n: usize) -> anyhow::Result<()> {
    let mut ours = Vec::new();
    for _ in 0..n {
        ours.push(timed_call(registry, "bash", r#"{"command":"echo hi"}"#).await?);
    }
    let mut base = Vec::new();
    for _ in 0..n.min(30) {
        let t = Instant::now();
        docker_cli(&["exec", container, "echo", "hi"])?;
        base.push(t.elapsed());
    }
    row(
        "bash tool `echo`",
        &mut ours,
        "docker exec echo",
        &mut base,
        "p50 ≤ 2 ms",
    );
    Ok(())
}

/// str_replace on a 1 MiB file of 16,384 lines; each edit changes one unique line.
async fn str_replace_row(
    s: &Session,
    registry: &ToolRegistry,
    container: &str,
    n: usize,
) -> anyhow::Result<()> {
    let mut text = String::new();
    for i in 0..16_384 {
        text.push_str(&format!("line {i:05} {}\n", "x".repeat(52)));
    }
    s.sandbox
        .write_file("/workspace/big.txt", text.as_bytes())
        .await?;
    let mut ours = Vec::new();
    for i in 0..n.min(30) {
        let args = serde_json::json!({"command": "str_replace", "path": "/workspace/big.txt",
            "old_str": format!("line {i:05} "), "new_str": format!("LINE {i:05} ")});
        ours.push(timed_call(registry, "str_replace_editor", &args.to_string()).await?);
    }
    let mut base = Vec::new();
    for i in 0..n.min(30) {
        let t = Instant::now();
        docker_cli(&[
            "exec",
            container,
            "sed",
            "-i",
            &format!("s/^LINE {i:05} /line {i:05} /"),
            "/workspace/big.txt",
        ])?;
        base.push(t.elapsed());
    }
    row(
        "str_replace on a 1 MiB file",
        &mut ours,
        "docker exec sed -i",
        &mut base,
        "≤ 30 ms",
    );
    Ok(())
}

async fn agent(manager: &SessionManager, ctx: &Ctx, n: usize) -> anyhow::Result<()> {
    section("Agent (fake LLM answering at once, bash `true` each step)");
    let s = bench_session(manager).await?;
    let mut steps = sandboxd::bench::agent::bench_agent_step(s.sandbox.clone(), n.max(20))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    row(
        "agent overhead per step (sinks: fan-out to two)",
        &mut steps,
        "",
        &mut [],
        "p50 ≤ 2 ms",
    );
    manager.remove(&s.owner, &s.id).await?;
    let runtime = ctx
        .runtime()
        .await
        .context("cannot prepare the sandbox runtime")?;
    let mut resumed = sandboxd::bench::agent::bench_continue(
        runtime,
        ctx.config.limits.clone(),
        ctx.config.sessions.clone(),
        ctx.config.clone(),
        n.clamp(10, 100),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    row(
        "continue a kept session (`run --session`) to its first LLM request",
        &mut resumed,
        "",
        &mut [],
        "p50 ≤ 50 ms",
    );
    println!();
    Ok(())
}

async fn flow(
    manager: &SessionManager,
    config: &sandboxd_core::config::Config,
    n: usize,
) -> anyhow::Result<()> {
    section("Planning flow (fake LLM answering at once; 50-step plans)");
    let s = bench_session(manager).await?;
    let mut b = sandboxd::bench::flow::bench_flow(s.clone(), config, n.max(20))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    row(
        "flow overhead per step (instant step runner)",
        &mut b.instant,
        "",
        &mut [],
        "p50 ≤ 5 ms",
    );
    row(
        "flow step as a real agent run (terminate at once)",
        &mut b.with_agent,
        "plain agent run",
        &mut b.plain_agent,
        "p50 ≤ plain + 5 ms",
    );
    manager.remove(&s.owner, &s.id).await?;
    println!();
    Ok(())
}

async fn browser(manager: &SessionManager, n: usize) -> anyhow::Result<()> {
    section("Browser (Chromium inside the sandbox, CDP through the tunnel)");
    let s = bench_session(manager).await?;
    let mut b = sandboxd::bench::browser::bench_browser(s.sandbox.clone(), n.max(10))
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    row(
        "first action incl. Chromium start",
        &mut [b.first_action],
        "",
        &mut [],
        "≤ 3 s",
    );
    row(
        "go_to_url of a local page, with state",
        &mut b.go_to_url,
        "",
        &mut [],
        "p50 ≤ 300 ms",
    );
    row("screenshot", &mut b.screenshot, "", &mut [], "p50 ≤ 200 ms");
    manager.remove(&s.owner, &s.id).await?;
    println!();
    Ok(())
}

async fn mcp(manager: Arc<SessionManager>, ctx: &Ctx, n: usize) -> anyhow::Result<()> {
    section("MCP (streamable HTTP on loopback, the session's sandbox already up)");
    let b = sandboxd::bench::mcp::bench_mcp_call(manager.clone(), ctx.config.clone(), n)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut samples = b.samples.clone();
    row(
        "MCP tools/call bash `true`",
        &mut samples,
        "",
        &mut [],
        "p50 ≤ 3 ms",
    );
    let python = host_python();
    let b = sandboxd::bench::mcp_stdio::bench_stdio(manager, &python, n)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (mut inside, mut host) = (b.sandbox, b.host);
    row(
        "MCP stdio server tools/call: inside the sandbox",
        &mut inside,
        &format!("the same server on the host ({python})"),
        &mut host,
        "≤ 2 ms added at p50",
    );
    let added = percentiles(&mut inside).0 - percentiles(&mut host).0;
    println!();
    println!("Added by the sandbox at p50: {added:.3} ms (target ≤ 2 ms).");
    println!();
    Ok(())
}

/// The host's Python for the host side of the stdio comparison: python3 on PATH.
fn host_python() -> String {
    std::env::var("SANDBOXD_BENCH_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The egress proxy's overhead (issue 24): a new connection's first byte and one download,
/// through a session's proxy from inside its sandbox beside the host straight to the server.
async fn egress(manager: &SessionManager, n: usize) -> anyhow::Result<()> {
    section(
        "Egress proxy (a local server; the sandbox's client through its proxy, the host's straight)",
    );
    let s = bench_session(manager).await?;
    let b = sandboxd::bench::egress::bench_egress(s.sandbox.clone(), n.max(20), 100).await;
    manager.remove(&s.owner, &s.id).await?;
    let mut b = b.map_err(|e| anyhow::anyhow!(e))?;
    let (p50, _) = percentiles(&mut b.ttfb_proxy.clone());
    let (d50, _) = percentiles(&mut b.ttfb_direct.clone());
    row(
        "time to first byte of 1 KiB, new connection each (python client)",
        &mut b.ttfb_proxy,
        "the host straight to the server",
        &mut b.ttfb_direct,
        "≤ 2 ms added at p50",
    );
    println!(
        "| download of {} MiB | {:.0} MiB/s | | straight: {:.0} MiB/s | | {:.2}× | ≥ 50 % of straight |",
        b.download_mib,
        b.mib_s_proxy,
        b.mib_s_direct,
        b.mib_s_proxy / b.mib_s_direct.max(1e-9)
    );
    println!();
    println!("Added at p50: {:.2} ms.", p50 - d50);
    println!();
    let (e, h) = (b.exec, b.host);
    println!(
        "Ceiling: one attached exec stream ({} MiB each way): into its stdin (a download's \
         direction) {:.0} MiB/s ({:.0} % of straight), out of its stdout {:.0} MiB/s.",
        sandboxd::bench::egress::CEILING_MIB,
        e.into_mib_s,
        100.0 * e.into_mib_s / b.mib_s_direct.max(1e-9),
        e.out_mib_s
    );
    println!(
        "The proxy with its helper on the host (no engine): {:.0} MiB/s; CPU for the download: \
         helper {:.2} s, host side and server {:.2} s.",
        h.mib_s, h.helper_cpu_s, h.host_cpu_s
    );
    println!();
    page_load(manager, n).await
}

/// The page load with 30 sub-resources in the in-sandbox Chromium: from the host through the
/// proxy, beside the same page from the sandbox's own loopback.
async fn page_load(manager: &SessionManager, n: usize) -> anyhow::Result<()> {
    header();
    let s = bench_session(manager).await?;
    let b = sandboxd::bench::egress_page::bench_page_load(s.sandbox.clone(), n.clamp(5, 50)).await;
    manager.remove(&s.owner, &s.id).await?;
    let mut b = b.map_err(|e| anyhow::anyhow!(e))?;
    let what = sandboxd::bench::egress_page::SUB_RESOURCES;
    row(
        &format!("page load with {what} sub-resources in Chromium (navigation → load event)"),
        &mut b.proxy.in_page,
        "the same page from the sandbox's loopback",
        &mut b.direct.in_page,
        "—",
    );
    row(
        "the same, the whole go_to_url action (load + the page's state)",
        &mut b.proxy.action,
        "the same page from the sandbox's loopback",
        &mut b.direct.action,
        "—",
    );
    println!();
    Ok(())
}

async fn research(manager: &SessionManager, n: usize) -> anyhow::Result<()> {
    section("Research (a local 1 MiB article; the page server on loopback)");
    let s = bench_session(manager).await?;
    let mut b = sandboxd::bench::web::bench_fetch(s.sandbox.clone(), n.max(10))
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    row(
        &format!(
            "web_fetch of {} KiB: checked fetch + readability + Markdown + write",
            b.page_bytes / 1024
        ),
        &mut b.web_fetch,
        "plain reqwest GET",
        &mut b.plain_get,
        "p50 ≤ 50 ms",
    );
    row(
        "of which the checked fetch alone (SSRF rules, capped body)",
        &mut b.checked_get,
        "plain reqwest GET",
        &mut b.plain_get.clone(),
        "—",
    );
    row(
        "of which readability + Markdown alone",
        &mut b.convert,
        "",
        &mut [],
        "—",
    );
    manager.remove(&s.owner, &s.id).await?;
    println!();
    Ok(())
}

async fn serve(manager: Arc<SessionManager>, ctx: &Ctx, n: usize) -> anyhow::Result<()> {
    use sandboxd::bench::server_runs as runs;
    section("Service (`sandboxd serve`)");
    let mut b = sandboxd::bench::server::bench_exec(manager.clone(), ctx.config.clone(), n).await?;
    let (api50, _) = percentiles(&mut b.api);
    let (lib50, _) = percentiles(&mut b.library);
    row(
        "`true` via POST /v1/sessions/{id}/exec (loopback, auth, JSON)",
        &mut b.api,
        "library shell",
        &mut b.library,
        "≤ 1 ms added at p50",
    );
    row(
        "`echo x` via POST …/exec/stream, request to its first `stdout` event",
        &mut b.stream_first,
        "sync exec of `true`",
        &mut b.api.clone(),
        "—",
    );
    let latency = runs::bench_event_latency(manager.clone(), ctx.config.clone(), n).await;
    match latency {
        Ok(mut l) => {
            row(
                "event latency: agent emits (`at`) → SSE client has it (every event; `at` is ms-truncated)",
                &mut l.by_stamp,
                "",
                &mut [],
                "p50 ≤ 5 ms",
            );
            row(
                "event latency: model answer handed over → client has `token_usage` (µs clock)",
                &mut l.by_answer,
                "",
                &mut [],
                "p50 ≤ 5 ms",
            );
        }
        Err(e) => println!("| event latency | not measured: {e} | | | | | p50 ≤ 5 ms |"),
    }
    let a2a_overhead = a2a(manager.clone(), ctx, n).await;
    // 20 users' sessions at once: a manager whose session limits leave room for them.
    let mut load_config = ctx.config.clone();
    load_config.sessions.max = load_config.sessions.max.max(24);
    load_config.sessions.max_per_owner = load_config.sessions.max_per_owner.max(24);
    let load_ctx = Ctx {
        config: load_config.clone(),
    };
    drop(manager);
    let load_manager = load_ctx.manager().await?;
    let load = runs::bench_load(load_manager, load_config, 20, 5).await;
    let load_note = match load {
        Ok(mut l) => {
            row(
                &format!(
                    "step latency, {} users × 5-step runs at once (fake model, bash `true`)",
                    l.users
                ),
                &mut l.step_latency,
                "",
                &mut [],
                "all complete",
            );
            // The slowest start includes creating its session's container.
            format!("Load: {}", super::bench_replicas::load_note(&l))
        }
        Err(e) => format!("Load: not measured: {e}"),
    };
    println!();
    println!("API overhead at p50: {:.3} ms", api50 - lib50);
    println!("{a2a_overhead}");
    println!("{load_note}");
    println!();
    Ok(())
}

/// A2A SendMessage against the same run through /v1 (one row); the overhead line.
async fn a2a(manager: Arc<SessionManager>, ctx: &Ctx, n: usize) -> String {
    let target = "≤ 5 ms added at p50";
    match sandboxd::bench::a2a::bench_a2a(manager, ctx.config.clone(), n.min(50)).await {
        Ok(mut a) => {
            let (a50, _) = percentiles(&mut a.a2a);
            let (v50, _) = percentiles(&mut a.v1);
            row(
                "A2A SendMessage → completed task (1-step run, instant model)",
                &mut a.a2a,
                "POST /v1/runs + its events to the end",
                &mut a.v1,
                target,
            );
            format!("A2A overhead at p50: {:.3} ms", a50 - v50)
        }
        Err(e) => {
            println!("| A2A SendMessage | not measured: {e} | | | | | {target} |");
            format!("A2A overhead: not measured: {e}")
        }
    }
}

/// The web UI in the host's chromium (SANDBOXD_CHROMIUM, else /usr/bin/chromium).
async fn ui(manager: Arc<SessionManager>, ctx: &Ctx, n: usize) -> anyhow::Result<()> {
    let chromium =
        std::env::var("SANDBOXD_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !std::path::Path::new(&chromium).exists() {
        anyhow::bail!("bench ui needs chromium on the host ({chromium}); apt-get install chromium");
    }
    section("Web UI (host chromium, headless)");
    let mut b = sandboxd::bench::ui::bench_ui(manager, ctx.config.clone(), &chromium, n).await?;
    row(
        &format!(
            "first paint of a finished {}-step run (navigation → whole timeline drawn)",
            b.steps
        ),
        &mut b.first_paint,
        "raw SSE replay over HTTP",
        &mut b.raw_replay,
        "≤ 1000 ms",
    );
    row(
        "event emitted → shown in the page (live run)",
        &mut b.event_to_page,
        "plain SSE client",
        &mut b.event_to_sse,
        "≤ 100 ms",
    );
    println!();
    Ok(())
}

/// Hibernate and resume on `serve` against a cold create (bench/hibernate.rs): 10 MiB and
/// 500 MiB workspaces, `n` cycles each.
async fn hibernate(ctx: &Ctx, n: usize) -> anyhow::Result<()> {
    section("Hibernate and resume (`[sessions] hibernate_after_secs`)");
    let b = sandboxd::bench::hibernate::bench_hibernate(
        ctx.runtime().await?,
        ctx.config.clone(),
        &[10, 500],
        n.max(1),
    )
    .await?;
    let mut cold = b.cold.clone();
    row(
        "cold create → first command answered (POST /v1/sessions, exec `true`)",
        &mut cold,
        "",
        &mut [],
        "—",
    );
    for mut s in b.sizes {
        let target = if s.mib <= 10 {
            "≤ 1.2× a cold create"
        } else {
            "recorded"
        };
        row(
            &format!(
                "resume of a {} MiB workspace → first command answered",
                s.mib
            ),
            &mut s.resume,
            "cold create",
            &mut b.cold.clone(),
            target,
        );
        row(
            &format!(
                "hibernate of a {} MiB workspace (save, row, container removed)",
                s.mib
            ),
            &mut s.hibernate,
            "",
            &mut [],
            "recorded",
        );
    }
    println!();
    Ok(())
}
