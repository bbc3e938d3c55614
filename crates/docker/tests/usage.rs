//! Usage readings on the real engine: where the engine is on this host (DOCKER_HOST unset or a
//! unix socket), they come from the container's cgroup files and not the engine's stats; the
//! CPU of a busy container grows between two of them and agrees with the stats API's, and the
//! memory is above zero and near the API's; a stopped container, which has no cgroup files,
//! is read through the API, and a removed one is gone. Under runc, and under gVisor (runsc)
//! where Docker has it (required when SANDBOXD_TEST_RUNSC=1): runsc's sandboxes get host
//! cgroups of their own.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::SandboxSpec;
use sandboxd_core::sandbox::{ExecRequest, Owner, Runtime, SandboxError};
use sandboxd_docker::{DockerRuntime, UsageReading, UsageSource};

use crate::conformance::runtime_under;

/// Removes the container however the test ends.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

/// Slack between readings taken at different moments of a container that burns at most one
/// CPU: the engine's collector samples up to a second away from the request.
const CPU_SLACK_USEC: u64 = 2_000_000;

/// Whether this host shows the container's cgroup where the engine's usual layouts put it
/// (v1 and v2, cgroupfs and systemd): then the reading must come from those files. Not
/// where it cannot (a remote or rootless engine, a test in a cgroup namespace of its own).
fn host_shows_cgroup_of(id: &str) -> bool {
    [
        format!("/sys/fs/cgroup/memory/docker/{id}"),
        format!("/sys/fs/cgroup/memory/system.slice/docker-{id}.scope"),
        format!("/sys/fs/cgroup/docker/{id}"),
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope"),
    ]
    .iter()
    .any(|p| std::path::Path::new(p).is_dir())
}

async fn reading(rt: &DockerRuntime, handle: &str) -> Result<UsageReading> {
    rt.usage_reading(handle).await.context("a usage reading")
}

/// A reading's CPU and memory, both told.
fn both(r: &UsageReading) -> Result<(u64, u64)> {
    let u = r.usage;
    Ok((
        u.cpu_usec.context("no CPU in the reading")?,
        u.memory_bytes.context("no memory in the reading")?,
    ))
}

async fn readings_of_a_busy_container(rt: DockerRuntime, what: &str) -> Result<()> {
    let spec = SandboxSpec {
        session_id: format!("usage{what}{}", std::process::id()),
        owner: Some(Owner::new("conformance")?),
        pooled: false,
        limits: Limits {
            cpus: 1.0,
            ..Limits::default()
        },
        keep: false,
        replica: None,
        image: None,
        restore_bytes: None,
    };
    let (handle, sandbox) = Runtime::create(&rt, &spec).await?;
    let _cleanup = Cleanup(handle.clone());
    let expected = if host_shows_cgroup_of(&handle) {
        UsageSource::HostCgroup
    } else {
        UsageSource::StatsApi
    };

    let first = reading(&rt, &handle).await?;
    assert_eq!(first.source, expected, "{what}: {first:?}");
    let (cpu0, memory0) = both(&first)?;
    assert!(memory0 > 0, "{what}: {first:?}");

    // A busy loop that outlives the exec (bounded, should the cleanup fail).
    let busy = "timeout 120 sh -c 'while :; do :; done' >/dev/null 2>&1 &";
    let out = sandbox
        .exec(ExecRequest::shell_line(busy).timeout(Duration::from_secs(30)))
        .await?;
    assert_eq!(out.exit_code, Some(0), "{what}: {out:?}");
    let mut grown = first;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        grown = reading(&rt, &handle).await?;
        if both(&grown)?.0 > cpu0 + 100_000 {
            break;
        }
    }
    let (cpu1, _) = both(&grown)?;
    assert!(
        cpu1 > cpu0 + 100_000,
        "{what}: no CPU burnt: {first:?} then {grown:?}"
    );
    assert_eq!(grown.source, expected, "{what}: {grown:?}");

    // The API's reading, bracketed by two of ours.
    let api = rt.stats_api_usage(&handle).await?;
    let after = reading(&rt, &handle).await?;
    let (cpu2, memory2) = both(&after)?;
    let api_cpu = api.cpu_usec.context("no CPU from the API")?;
    let api_memory = api.memory_bytes.context("no memory from the API")?;
    eprintln!("[usage] {what}: ours {grown:?} then {after:?}, the API's {api:?}");
    assert!(
        cpu1.saturating_sub(CPU_SLACK_USEC) <= api_cpu && api_cpu <= cpu2 + CPU_SLACK_USEC,
        "{what}: the API's CPU {api_cpu} µs is not between ours, {cpu1} and {cpu2}"
    );
    let near = memory2.abs_diff(api_memory) <= (api_memory / 2).max(16 << 20);
    assert!(
        memory2 > 0 && near,
        "{what}: memory {memory2} B is far from the API's {api_memory} B"
    );

    // The single readings tell the same, and the counter never goes back.
    let memory = rt.memory_usage(&handle).await?.context("memory_usage")?;
    let cpu = rt
        .cpu_usage_usec(&handle)
        .await?
        .context("cpu_usage_usec")?;
    assert!(
        memory > 0 && cpu >= cpu2,
        "{what}: {memory} B, {cpu} µs after {after:?}"
    );

    stopped_then_removed(&rt, &handle, what).await
}

/// A stopped container has no cgroup files: the engine answers; a removed one is gone.
async fn stopped_then_removed(rt: &DockerRuntime, handle: &str, what: &str) -> Result<()> {
    let stop = tokio::process::Command::new("docker")
        .args(["stop", "-t", "1", handle])
        .output()
        .await?;
    ensure!(stop.status.success(), "docker stop: {stop:?}");
    let stopped = reading(rt, handle).await?;
    assert_eq!(stopped.source, UsageSource::StatsApi, "{what}: {stopped:?}");
    rt.remove(handle).await?;
    let gone = rt.usage_reading(handle).await;
    assert!(
        matches!(gone, Err(SandboxError::SandboxGone { .. })),
        "{what}: a removed container's reading: {gone:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readings_come_from_the_hosts_cgroup_files_and_agree_with_the_engine() -> Result<()> {
    readings_of_a_busy_container(runtime_under(None).await, "runc").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readings_of_a_gvisor_sandbox_come_from_its_host_cgroup() -> Result<()> {
    let rt = runtime_under(Some("runsc".into())).await;
    let registered = rt.registered_runtimes().await?;
    if !registered.iter().any(|r| r == "runsc") {
        let promised = std::env::var("SANDBOXD_TEST_RUNSC").is_ok_and(|v| v == "1");
        assert!(
            !promised,
            "SANDBOXD_TEST_RUNSC=1 promises gVisor, but Docker has no runsc ({registered:?})"
        );
        eprintln!("NOT RUN: Docker has no runsc runtime (registered: {registered:?})");
        return Ok(());
    }
    readings_of_a_busy_container(rt, "runsc").await
}
