//! The CLI end to end: `exec` streams output and returns the command's exit code, `--keep`
//! leaves a session that `sessions list` shows and `sessions rm` removes, `doctor` reports.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::process::{Command, Stdio};

fn sandboxd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sandboxd")
}

#[test]
fn exec_streams_output_and_returns_the_exit_code() {
    let out = sandboxd(&[
        "exec",
        "--",
        "bash",
        "-c",
        "echo out; echo err >&2; id -u; exit 3",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n1000\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err"));
    // Input on a pipe reaches the command.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["exec", "--", "wc", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"12345").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "5");
}

#[test]
fn kept_sessions_are_listed_and_removed() {
    let out = sandboxd(&["exec", "--keep", "--", "touch", "/workspace/marker"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let id = stderr
        .split_whitespace()
        .skip_while(|w| *w != "session")
        .nth(1)
        .expect("the session id is printed")
        .to_string();
    let _guard = crate::support::cli::cleanup(&id);
    let list = sandboxd(&["sessions", "list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains(&id));
    // The kept session is still usable by id, with its files.
    let again = sandboxd(&["exec", "--session", &id, "--", "ls", "/workspace"]);
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), "marker");
    // gc leaves a kept, running session alone.
    let gc = sandboxd(&["sessions", "gc"]);
    assert!(gc.status.success());
    assert!(String::from_utf8_lossy(&sandboxd(&["sessions", "list"]).stdout).contains(&id));
    let rm = sandboxd(&["sessions", "rm", &id]);
    assert!(rm.status.success());
    assert!(!String::from_utf8_lossy(&sandboxd(&["sessions", "list"]).stdout).contains(&id));
    let missing = sandboxd(&["sessions", "rm", "nosuchsession"]);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("no session nosuchsession"), "{stderr}");
    // The library's neutral fix, and the CLI's command for it.
    assert!(
        stderr.contains("list the live sessions") && stderr.contains("`sandboxd sessions list`"),
        "{stderr}"
    );
}

#[test]
fn doctor_reports_docker_and_the_limits() {
    // Research off: doctor would otherwise ask the default search engine on the internet.
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("doctor")
        .env("SANDBOXD_RESEARCH_ENABLED", "false")
        .stdin(Stdio::null())
        .output()
        .expect("run sandboxd");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("research: off"), "{text}");
    assert!(text.contains("ok    Docker engine reachable"), "{text}");
    assert!(
        text.contains("limits per session: 1024 MiB memory"),
        "{text}"
    );
}

/// With the Kubernetes backend doctor checks the cluster, not Docker: an API server that
/// does not answer is a failure that says how to point at one.
#[test]
fn doctor_checks_the_cluster_when_the_backend_is_kubernetes() {
    let dir = std::env::temp_dir().join(format!("sandboxd-kdoc-{:08x}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("k8s.toml");
    std::fs::write(
        &cfg,
        "[runtime]\nbackend = \"kubernetes\"\n[kubernetes]\nimage = \"registry.example/sandboxd-sandbox:1\"\n",
    )
    .unwrap();
    // A kubeconfig whose API server is a closed loopback port.
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"http://127.0.0.1:9\"}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u, namespace: sandboxd}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["--config", cfg.to_str().unwrap(), "doctor"])
        .env("SANDBOXD_RESEARCH_ENABLED", "false")
        .env("KUBECONFIG", &kubeconfig)
        .stdin(Stdio::null())
        .output()
        .expect("run sandboxd");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("FAIL  Kubernetes API server"), "{text}");
    assert!(text.contains("→ point KUBECONFIG at the cluster"), "{text}");
    assert!(text.contains("deny-all NetworkPolicy"), "{text}");
    assert!(!text.contains("Docker engine"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_config_key_is_named() {
    let dir = std::env::temp_dir().join(format!("sandboxd-cfg-{:08x}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[limits]\nmemory_mib = 3\n").unwrap();
    let out = sandboxd(&["--config", cfg.to_str().unwrap(), "doctor"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory_mib"));
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["doctor"])
        .env("SANDBOXD_LIMITS_PIDZ", "5")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SANDBOXD_LIMITS_PIDZ"));
    let _ = std::fs::remove_dir_all(&dir);
}
