//! `sandboxd bench kubernetes` end to end: the real binary against the fake API server of
//! crates/kubernetes (examples/fake_apiserver.rs, its own process, built by `cargo test
//! --no-run` with the other examples), with two iterations. Every row is printed with numbers
//! on both sides; the counts the bench reports are the backend's real behaviour (a warm claim
//! is exactly one API request, the claim's merge patch, and a command through the persistent
//! shell none; a claim beyond a drained pool is a cold create's pod POST); and with no
//! cluster answering it refuses, naming the way to start the fake. No timing is asserted.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::support::cli::sandboxd;

/// The fake API server as a process; dropping it stops it with SIGTERM, on which it removes
/// its pods' containers.
struct FakeCluster {
    child: Child,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

/// The example beside this test binary (target/<profile>/deps/all-… → examples/).
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let path = profile.join("examples").join("fake_apiserver");
    assert!(
        path.exists(),
        "{} is missing: `cargo test --no-run` of the workspace builds it (or `cargo build -p sandboxd-kubernetes --example fake_apiserver`)",
        path.display()
    );
    path
}

impl FakeCluster {
    fn start() -> FakeCluster {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let mut child = Command::new(example())
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let fake = FakeCluster {
            child,
            kubeconfig,
            _dir: dir,
        };
        assert!(
            line.starts_with("ready 127.0.0.1:"),
            "the fake said {line:?}"
        );
        assert!(fake.kubeconfig.exists(), "the fake wrote no kubeconfig");
        fake
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// The cells of the first table row whose first cell starts with `what` (is `what`, when
/// `exact`).
fn find_row(out: &str, what: &str, exact: bool) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect::<Vec<_>>()
        })
        .find(|cells| {
            if exact {
                cells[0] == what
            } else {
                cells[0].starts_with(what)
            }
        })
        .unwrap_or_else(|| panic!("no row {what:?} in:\n{out}"))
}

fn row(out: &str, what: &str) -> Vec<String> {
    find_row(out, what, false)
}

/// A measured row: Kubernetes and Docker p50/p95/p99 are all numbers.
fn measured(out: &str, what: &str) -> Vec<String> {
    let cells = row(out, what);
    for c in &cells[1..7] {
        assert!(
            c.parse::<f64>().is_ok(),
            "{what}: {c:?} is not a time: {cells:?}"
        );
    }
    cells
}

#[test]
fn the_kubernetes_bench_runs_end_to_end_against_the_fake_api_server() {
    let fake = FakeCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let out = sandboxd(dir.path())
        .args(["bench", "kubernetes", "--iterations", "2", "--kubeconfig"])
        .arg(&fake.kubeconfig)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench kubernetes failed:\n{stdout}\n{stderr}"
    );
    println!("{stdout}");
    assert!(
        stdout.contains("build"),
        "the header names the build: {stdout}"
    );

    let cold = measured(&stdout, "cold create → first `true` answered (2)");
    assert!(cold[8].contains("POST pods 1"), "{cold:?}");
    measured(&stdout, "of which: the create returns");
    let runs = row(&stdout, "`docker run -d` of the same hardening");
    assert!(runs[4].parse::<f64>().is_ok(), "{runs:?}");
    let shell = measured(
        &stdout,
        "command round trip, `true` through the persistent shell (2)",
    );
    assert_eq!(
        shell[8], "none",
        "a shell command is no API request: {shell:?}"
    );
    let exec = measured(&stdout, "one-shot exec `true`, a new process (2)");
    assert_eq!(exec[8], "GET pods/exec 1", "{exec:?}");
    let warm = measured(&stdout, "warm claim → first `true` answered (2)");
    assert_eq!(
        warm[8], "PATCH pods 1",
        "a claim is its one merge patch: {warm:?}"
    );
    measured(&stdout, "drained pool of 2: its warm claims");
    let beyond = measured(&stdout, "drained pool: 2 claims beyond it");
    assert!(
        beyond[8].contains("POST pods 1"),
        "a cold create: {beyond:?}"
    );

    let setup = row(&stdout, "once per process");
    assert!(
        setup[2].contains("POST networkpolicies") || setup[2].contains("GET networkpolicies"),
        "{setup:?}"
    );
    assert!(setup[2].contains("POST pods 1"), "the probe pod: {setup:?}");
    assert_eq!(find_row(&stdout, "warm claim", true)[1], "1.00");
}

#[test]
fn the_kubernetes_bench_refuses_without_a_cluster_and_says_how_to_start_the_fake() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n"
        ),
    )
    .unwrap();
    for path in [kubeconfig.clone(), dir.path().join("missing")] {
        let out = sandboxd(dir.path())
            .args(["bench", "kubernetes", "--iterations", "1", "--kubeconfig"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{path:?}: it ran without a cluster");
        assert!(
            stderr.contains("no Kubernetes cluster is reachable through the kubeconfig")
                && stderr.contains("--example fake_apiserver"),
            "{path:?}: {stderr}"
        );
        assert!(
            out.stdout.is_empty(),
            "nothing measured: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
