//! Abuse: fork bomb, memory bomb, disk fill, output flood. Each stays inside its limits and
//! leaves the host and other sessions unharmed.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::time::{Duration, Instant};

use sandboxd_core::config::LimitRequest;
use sandboxd_core::sandbox::{ExecRequest, SandboxError, ShellOptions};

fn opts(secs: u64) -> ShellOptions {
    ShellOptions {
        timeout: Duration::from_secs(secs),
        ..ShellOptions::default()
    }
}

#[tokio::test]
async fn a_fork_bomb_stops_at_the_pids_limit_and_others_still_answer() {
    let m = support::manager().await;
    let (bomb, _g1) = support::session_with(
        &m,
        &LimitRequest {
            pids: Some(64),
            ..Default::default()
        },
    )
    .await;
    let (other, _g2) = support::session(&m).await;
    other.sandbox.shell("true", opts(10)).await.unwrap();
    let b = bomb.sandbox.clone();
    let bombing = tokio::spawn(async move {
        b.shell("bomb() { bomb | bomb & }; bomb; sleep 8", opts(10))
            .await
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pids = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{.Id}}", &bomb.handle])
        .output()
        .unwrap();
    assert!(pids.status.success());
    let t = Instant::now();
    let out = other
        .sandbox
        .shell("echo still-here", opts(10))
        .await
        .unwrap();
    assert_eq!(out.stdout_lossy(), "still-here\n");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "other session took {:?}",
        t.elapsed()
    );
    if support::under_gvisor() {
        // Under gVisor the host's pids limit counts gVisor's own tasks, and reaching it stops
        // the whole sandbox: the bomb ends its session, with a reason that says so.
        let err = bombing
            .await
            .unwrap()
            .expect_err("under gVisor the sandbox stops at its process limit");
        let text = err.to_string();
        assert!(
            matches!(err, SandboxError::SandboxGone { .. }) && text.contains("process limit"),
            "{text}"
        );
        return;
    }
    let stats = std::process::Command::new("docker")
        .args([
            "stats",
            "--no-stream",
            "--format",
            "{{.PIDs}}",
            &bomb.handle,
        ])
        .output()
        .unwrap();
    let count: u64 = String::from_utf8_lossy(&stats.stdout)
        .trim()
        .parse()
        .expect("docker stats shows the bomb's process count");
    assert!(count <= 64, "pids {count}");
    let _ = bombing.await;
}

#[tokio::test]
async fn a_memory_bomb_is_oom_killed_and_reported() {
    let m = support::manager().await;
    let (s, _g) = support::session_with(
        &m,
        &LimitRequest {
            memory_mb: Some(128),
            ..Default::default()
        },
    )
    .await;
    let out = s
        .sandbox
        .shell(
            "python3 -c 'x = bytearray(512 * 1024 * 1024); print(len(x))'",
            opts(60),
        )
        .await;
    if support::under_gvisor() {
        // Under gVisor the host's OOM killer takes gVisor's kernel, so the whole sandbox
        // dies; the call must say so at once (the attached exec never ends by itself),
        // not wait for its timeout.
        let err = out.expect_err("under gVisor the sandbox dies with its bomb");
        let text = err.to_string();
        assert!(
            matches!(err, SandboxError::SandboxGone { .. })
                && text.contains("ran out of memory (limit 128 MiB)")
                && text.contains("gVisor")
                && !text.contains("timed out"),
            "{text}"
        );
        return;
    }
    let out = out.unwrap();
    // SIGKILL from the OOM killer: bash reports 128 + 9.
    assert_eq!(
        out.exit_code,
        Some(137),
        "stdout {:?} stderr {:?}",
        out.stdout_lossy(),
        out.stderr_lossy()
    );
    assert_eq!(out.stdout_lossy(), "");
    let note = out.note.unwrap_or_default();
    assert!(note.contains("out-of-memory"), "note: {note:?}");
    // The session survives its bomb.
    assert_eq!(
        s.sandbox
            .shell("echo ok", opts(10))
            .await
            .unwrap()
            .stdout_lossy(),
        "ok\n"
    );
}

#[tokio::test]
async fn filling_the_workspace_stops_at_the_quota() {
    let m = support::manager().await;
    let (s, _g) = support::session_with(
        &m,
        &LimitRequest {
            workspace_mb: Some(32),
            ..Default::default()
        },
    )
    .await;
    let host_before = free_bytes("/");
    let out = s
        .sandbox
        .shell("dd if=/dev/zero of=/workspace/fill bs=1M count=100 2>&1; ls -s --block-size=1M /workspace/fill", opts(60))
        .await
        .unwrap();
    let text = out.stdout_lossy();
    assert!(text.contains("No space left on device"), "{text}");
    let size: u64 = text
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(size <= 32, "{text}");
    let host_after = free_bytes("/");
    assert!(
        host_before.abs_diff(host_after) < 64 << 20,
        "host disk moved by {}",
        host_before.abs_diff(host_after)
    );
    // write_file reports the full disk as a clear error, not a panic.
    let err = s
        .sandbox
        .write_file("/workspace/more", &vec![1u8; 1 << 20])
        .await
        .unwrap_err();
    assert!(err.to_string().to_lowercase().contains("space"), "{err}");
}

fn free_bytes(path: &str) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail", path])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn an_output_flood_is_capped_and_the_host_stays_bounded() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let rss_before = rss_kb();
    let out = s.sandbox.shell("timeout 10 yes", opts(30)).await.unwrap();
    assert!(out.stdout_truncated);
    assert!(out.stdout.len() < 300 * 1024, "{}", out.stdout.len());
    let rss_after = rss_kb();
    assert!(
        rss_after < rss_before + 64 * 1024,
        "host RSS grew from {rss_before} kB to {rss_after} kB"
    );
    let one_shot = s
        .sandbox
        .exec(ExecRequest::shell_line("head -c 50000000 /dev/zero").output_cap(4096))
        .await
        .unwrap();
    assert!(one_shot.stdout_truncated && one_shot.stdout.len() < 8192);
}

fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}
