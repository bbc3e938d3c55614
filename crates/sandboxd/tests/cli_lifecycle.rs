//! The CLI's sessions when things go wrong, with real processes: `sandboxd exec` stopped by
//! SIGTERM or SIGHUP removes its container as Ctrl-C does; the orphan of a killed process is
//! gone at the next command that creates a session; an OOM kill is named with the memory
//! limit, also for a kept session re-attached with the lower limit it was created with; and
//! `tool --list` needs no engine at all.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support::{self, Cleanup};

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn sandboxd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sandboxd")
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI")
}

fn container_exists(container: &str) -> bool {
    docker(&["inspect", container]).status.success()
}

/// The container `child` (a sandboxd process) created, found by its creator label.
fn container_of(child: &Child) -> String {
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = docker(&[
            "ps",
            "--format",
            "{{.ID}} {{.Label \"sandboxd.creator\"}}",
            "--filter",
            "label=sandboxd.managed=true",
        ]);
        let text = String::from_utf8_lossy(&all.stdout).to_string();
        if let Some(container) = text.lines().find_map(|l| {
            let (container, creator) = l.split_once(' ')?;
            creator
                .starts_with(&format!("{pid}:"))
                .then(|| container.to_string())
        }) {
            return container;
        }
        assert!(
            Instant::now() < deadline,
            "sandboxd never created its container"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sandboxd did not exit within {within:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sigterm_and_sighup_of_exec_remove_the_container() {
    for (signal, status) in [("-TERM", 143), ("-HUP", 129)] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
            .args(["exec", "--", "sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let container = container_of(&child);
        let _guard = Cleanup(container.clone());
        let kill = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let exit = wait_exit(&mut child, Duration::from_secs(30));
        let mut stderr = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        assert_eq!(exit.code(), Some(status), "{signal}: {stderr}");
        assert!(
            stderr.contains("the command was killed"),
            "{signal}: {stderr}"
        );
        assert!(
            !container_exists(&container),
            "{signal} left the container {container} behind"
        );
    }
}

#[test]
fn the_orphan_of_a_killed_process_is_gone_at_the_next_create() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["exec", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let orphan = container_of(&child);
    let _guard = Cleanup(orphan.clone());
    // SIGKILL: no cleanup can run, the container stays behind.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(container_exists(&orphan));
    let next = sandboxd(&["exec", "--", "true"]);
    assert!(
        next.status.success(),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert!(
        !container_exists(&orphan),
        "the next exec must reconcile the orphan {orphan} away"
    );
}

const EAT_400_MIB: &str = "x = b'x' * (400 << 20); print(len(x))";

#[test]
fn an_oom_kill_is_named_with_the_memory_limit_also_after_reattaching() {
    // A fresh sandbox with a lowered limit.
    let out = sandboxd(&[
        "exec",
        "--memory-mb",
        "128",
        "--",
        "python3",
        "-c",
        EAT_400_MIB,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("out-of-memory") && stderr.contains("memory limit of 128 MiB"),
        "{stderr}"
    );

    // A kept session made with 256 MiB, used again by a later process: it still reports
    // and enforces 256 MiB, not the configured 1024.
    let kept = sandboxd(&["exec", "--keep", "--memory-mb", "256", "--", "true"]);
    let stderr = String::from_utf8_lossy(&kept.stderr).to_string();
    assert!(kept.status.success(), "{stderr}");
    let id = stderr
        .split_whitespace()
        .skip_while(|w| *w != "session")
        .nth(1)
        .expect("the session id is printed")
        .to_string();
    let _guard = support::cli::cleanup(&id);
    let again = sandboxd(&["exec", "--session", &id, "--", "python3", "-c", EAT_400_MIB]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(137), "{stderr}");
    assert!(stderr.contains("memory limit of 256 MiB"), "{stderr}");
    // Under the limit it runs, and a plain SIGKILL is not called an OOM kill.
    let fits = sandboxd(&[
        "exec",
        "--session",
        &id,
        "--",
        "python3",
        "-c",
        "x = b'x' * (100 << 20); print(len(x))",
    ]);
    assert!(
        fits.status.success(),
        "{}",
        String::from_utf8_lossy(&fits.stderr)
    );
    let killed = sandboxd(&["exec", "--session", &id, "--", "bash", "-c", "kill -9 $$"]);
    assert_eq!(killed.status.code(), Some(137));
    assert!(
        !String::from_utf8_lossy(&killed.stderr).contains("out-of-memory"),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    assert!(sandboxd(&["sessions", "rm", &id]).status.success());
}

#[test]
fn tool_list_needs_no_engine() {
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["tool", "--list"])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"bash\""), "{stdout}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("image"),
        "listing must not touch the image"
    );
}
