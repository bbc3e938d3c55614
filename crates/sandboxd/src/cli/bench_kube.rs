//! `sandboxd bench kubernetes` (issue 23): the Kubernetes backend through `KubeRuntime`, built
//! as every command builds it (backends.rs), against the cluster a kubeconfig names — a real
//! one, or the fake API server of `crates/kubernetes/examples/fake_apiserver.rs`, whose pods
//! are Docker containers — beside the same operations through the Docker runtime directly in
//! the same run (bench/kubernetes.rs says what each one is). With the fake, the difference
//! is the backend's own overhead; the API server requests each operation makes are counted
//! in the client, so what a real cluster adds is at least those round trips times its API
//! server's latency (and a create's pod start). Refuses, saying how to get one, when no
//! cluster answers.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sandboxd::bench::kubernetes::{Calls, Plan, Side, measure};
use sandboxd::bench::stats::percentile;
use sandboxd_core::sandbox::Runtime;
use sandboxd_kubernetes::{ApiCalls, KubeRuntime};

use super::Ctx;
use super::bench::{BenchArgs, bench_image, chrono_date, docker_cli, hardened_run_args};

/// How long the first request to the cluster may take before it counts as unreachable.
const REACH_TIMEOUT: Duration = Duration::from_secs(15);
/// The warm pool's size, and the claims beyond it once it is drained.
const POOL: usize = 2;

const FAKE_RECIPE: &str = "To bench against the fake API server on loopback instead: \
     `cargo run -p sandboxd-kubernetes --example fake_apiserver -- /tmp/fake-kubeconfig` \
     (it writes the kubeconfig and prints `ready` once it answers), then \
     `sandboxd bench kubernetes --kubeconfig /tmp/fake-kubeconfig`";

fn refusal(source: &str, why: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("no Kubernetes cluster is reachable through {source}: {why}. {FAKE_RECIPE}")
}

/// The runtime on the cluster, after one request proves it answers.
async fn connect(
    ctx: &Ctx,
    args: &BenchArgs,
    calls: &ApiCalls,
) -> anyhow::Result<(KubeRuntime, String)> {
    let kubeconfig: Option<PathBuf> = args.kubeconfig.clone().or_else(|| {
        std::env::var_os("KUBECONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let source = match &kubeconfig {
        Some(p) => format!("the kubeconfig {}", p.display()),
        None => "~/.kube/config or the in-cluster service account (no --kubeconfig, no KUBECONFIG)"
            .to_string(),
    };
    let mut config = ctx.config.clone();
    if let Some(ns) = &args.namespace {
        config.kubernetes.namespace = ns.clone();
    }
    if config.kubernetes.image.is_empty() {
        // The fake's pods run on the local engine: the image the Docker baseline runs.
        config.kubernetes.image = docker_image(ctx);
    }
    let rt = crate::backends::kube_runtime_at(&config, kubeconfig.as_deref(), Some(calls.clone()))
        .await
        .map_err(|e| refusal(&source, format!("{e:#}")))?;
    match tokio::time::timeout(REACH_TIMEOUT, rt.list()).await {
        Ok(Ok(_)) => Ok((rt, source)),
        Ok(Err(e)) => Err(refusal(&source, e)),
        Err(_) => Err(refusal(
            &source,
            format!("no answer within {}s", REACH_TIMEOUT.as_secs()),
        )),
    }
}

fn docker_image(ctx: &Ctx) -> String {
    if ctx.config.docker.image.is_empty() {
        sandboxd_docker::image::image_tag()
    } else {
        ctx.config.docker.image.clone()
    }
}

pub(crate) async fn kubernetes(ctx: &Ctx, args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let calls = ApiCalls::default();
    let (kube, source) = connect(ctx, args, &calls).await?;
    // The baseline: the Docker runtime as every command builds it (the image built if
    // missing, before the first pod needs it on the fake's node).
    let mut docker_config = ctx.config.clone();
    docker_config.runtime.backend = "docker".into();
    let docker = crate::backends::runtime(&docker_config)
        .await
        .context("the Docker baseline needs the Docker engine")?;
    // Once per process, not per session: the deny-all NetworkPolicy, the network probe pod
    // and this process's Lease (a create waits for them).
    let before = calls.snapshot();
    kube.ensure_isolated().await?;
    kube.hold_lease().await?;
    let setup = Calls {
        by_kind: calls.since(&before),
        ops: 1,
    };
    let plan = Plan {
        limits: ctx.config.limits.clone(),
        iterations: args.iterations,
        pool: POOL,
        beyond: args.iterations.clamp(1, 10),
    };
    let kube_rt: Arc<dyn Runtime> = Arc::new(kube.clone());
    let result = async {
        let k = measure(kube_rt, &plan, Some(&calls)).await?;
        let d = measure(docker, &plan, None).await?;
        anyhow::Ok((k, d))
    }
    .await;
    kube.release_lease().await;
    let (k, d) = result?;
    let mut runs = docker_runs(ctx, plan.rounds().min(10))?;
    runs.sort();
    println!(
        "sandboxd bench kubernetes — {} — {} build — machine: {} cores — cluster: {source}, namespace {}, image {}",
        chrono_date(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kube.settings().namespace,
        kube.settings().image,
    );
    println!();
    print_times(&k, &d, &plan, &runs);
    print_calls(&k, &setup);
    Ok(ExitCode::SUCCESS)
}

/// `n` × `docker run -d` (the docker CLI) of a session's hardening, then its removal: the
/// fake API server starts each pod so, where the Docker runtime asks the engine's API.
fn docker_runs(ctx: &Ctx, n: usize) -> anyhow::Result<Vec<Duration>> {
    let image = bench_image();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        let id = docker_cli(&hardened_run_args(&image, &ctx.config.docker.runtime))?;
        out.push(t.elapsed());
        docker_cli(&["rm", "-f", &id])?;
    }
    Ok(out)
}

fn ms(sorted: &[Duration], q: f64) -> String {
    if sorted.is_empty() {
        return "—".into();
    }
    format!("{:.2}", percentile(sorted, q).as_secs_f64() * 1e3)
}

fn calls_of(side: &Side, ops: &[&str]) -> String {
    let parts: Vec<String> = ops
        .iter()
        .filter_map(|op| side.calls.get(op).map(Calls::describe))
        .filter(|d| d != "none")
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(" · ")
    }
}

/// One row: the Kubernetes side's p50/p95/p99, the Docker side's, what Kubernetes adds at
/// p50, its API requests and the target.
fn row(what: String, kv: &[Duration], dv: &[Duration], calls: String, target: &str) {
    let added = match (kv.is_empty(), dv.is_empty()) {
        (false, false) => format!(
            "{:+.2}",
            (percentile(kv, 0.5).as_secs_f64() - percentile(dv, 0.5).as_secs_f64()) * 1e3
        ),
        _ => "—".into(),
    };
    println!(
        "| {what} | {} | {} | {} | {} | {} | {} | {added} | {calls} | {target} |",
        ms(kv, 0.5),
        ms(kv, 0.95),
        ms(kv, 0.99),
        ms(dv, 0.5),
        ms(dv, 0.95),
        ms(dv, 0.99),
    );
}

fn print_times(k: &Side, d: &Side, plan: &Plan, docker_runs: &[Duration]) {
    println!("### Kubernetes backend: KubeRuntime beside the Docker runtime directly (issue 23)");
    println!();
    println!(
        "| measurement | Kubernetes p50 ms | p95 ms | p99 ms | Docker p50 ms | p95 ms | p99 ms | added at p50 ms | API requests each | target |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    row(
        format!("cold create → first `true` answered ({})", k.cold.len()),
        &k.cold,
        &d.cold,
        calls_of(k, &["cold create", "first command"]),
        "recorded (a cluster adds its pod start)",
    );
    row(
        "  of which: the create returns".into(),
        &k.cold_create,
        &d.cold_create,
        calls_of(k, &["cold create"]),
        "—",
    );
    row(
        "  `docker run -d` of the same hardening (how the fake's node starts a pod)".into(),
        &[],
        docker_runs,
        "—".into(),
        "—",
    );
    row(
        format!(
            "command round trip, `true` through the persistent shell ({})",
            k.shell.len()
        ),
        &k.shell,
        &d.shell,
        calls_of(k, &["command"]),
        "recorded",
    );
    row(
        format!("one-shot exec `true`, a new process ({})", k.exec.len()),
        &k.exec,
        &d.exec,
        calls_of(k, &["one-shot exec"]),
        "recorded",
    );
    row(
        format!("warm claim → first `true` answered ({})", k.warm.len()),
        &k.warm,
        &d.warm,
        calls_of(k, &["warm claim"]),
        "real cluster: p50 < 64 ms, p95 < 80 ms",
    );
    row(
        format!("drained pool of {}: its warm claims", plan.pool),
        &k.drained_warm,
        &d.drained_warm,
        "as a warm claim".into(),
        "—",
    );
    row(
        format!(
            "drained pool: {} claims beyond it (cold fallback at once)",
            k.drained_cold.len()
        ),
        &k.drained_cold,
        &d.drained_cold,
        calls_of(k, &["claim beyond the pool"]),
        "no cliff: as a cold create",
    );
    println!();
}

fn print_calls(k: &Side, setup: &Calls) {
    println!(
        "API server requests per operation (counted in the Kubernetes client; the Lease's renewals left out):"
    );
    println!();
    println!("| operation | requests each | by kind |");
    println!("|---|---|---|");
    println!(
        "| once per process: NetworkPolicy, network probe pod, Lease | {:.0} | {} |",
        setup.per_op(),
        setup.describe()
    );
    for (op, c) in &k.calls {
        println!("| {op} | {:.2} | {} |", c.per_op(), c.describe());
    }
    println!();
}
