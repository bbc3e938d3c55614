//! Lifecycle: the reconciler removes orphans and nothing else, a container killed from
//! outside fails fast, limits requests only go down, the session cap holds.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::time::{Duration, Instant};

use sandboxd_core::config::LimitRequest;
use sandboxd_core::sandbox::{CreateOptions, SandboxError, ShellOptions};

fn docker(args: &[&str]) -> std::process::Output {
    std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI")
}

#[tokio::test]
async fn the_reconciler_removes_orphans_and_touches_nothing_else() {
    // An unrelated, unlabelled container, and a live session of this process, beside it.
    let image = support::runtime().await.image().to_string();
    let bystander = format!("bystander-{:08x}", rand::random::<u32>());
    let run = docker(&[
        "run",
        "-d",
        "--name",
        &bystander,
        "--network",
        "none",
        &image,
        "sleep",
        "600",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let _bystander_guard = Removed(bystander.clone());
    let m = support::manager().await;
    let (mine, _g) = support::session(&m).await;
    // Every reconciler on this engine removes every orphan, and other tests start sandboxd
    // processes (each reconciles at start) at any moment: one of them may take the orphan
    // between its creator's death and this reconcile. The orphan is made last, its creator
    // killed right before the reconcile, and a round another reconciler won is played again,
    // so what is asserted stays "this reconciler removed it".
    let mut lost = Vec::new();
    for _round in 0..3 {
        let (orphan, container, _orphan_guard) = orphan_of_a_dead_process();
        let removed = m.reconcile().await.unwrap();
        assert!(
            !removed.contains(&mine.id),
            "a live session of this process was removed"
        );
        let gone = docker(&["inspect", &container]);
        assert!(!gone.status.success(), "the orphan {orphan} is still there");
        if removed.contains(&orphan) {
            let alive = docker(&["inspect", "--format", "{{.State.Running}}", &bystander]);
            assert_eq!(String::from_utf8_lossy(&alive.stdout).trim(), "true");
            assert!(mine.sandbox.is_alive().await);
            return;
        }
        lost.push(orphan);
    }
    panic!("another reconciler took the orphan every round: {lost:?}");
}

/// Removes a container by name when dropped, also when the test panics.
struct Removed(String);

impl Drop for Removed {
    fn drop(&mut self) {
        docker(&["rm", "-f", &self.0]);
    }
}

/// A sandboxd process that holds a session and is killed without cleanup: its session id and
/// container (as `sessions list --json` shows them), and a guard that removes it whatever
/// happens.
fn orphan_of_a_dead_process() -> (String, String, support::Cleanup) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["exec", "--", "sleep", "600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (session, container) = loop {
        // The creator is pid:start-time; match on the pid. A running one: the engine is
        // done starting it when its creator dies.
        let listed = support::cli::sessions_listed();
        if let Some(s) = listed.iter().find(|s| {
            s["state"] == "running"
                && s["creator"]
                    .as_str()
                    .is_some_and(|c| c.starts_with(&format!("{pid}:")))
        }) {
            let field = |k: &str| s[k].as_str().unwrap().to_string();
            break (field("session_id"), field("handle"));
        }
        assert!(
            Instant::now() < deadline,
            "the child never created its container"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let guard = support::Cleanup(container.clone());
    (session, container, guard)
}

#[tokio::test]
async fn a_container_killed_from_outside_fails_fast_with_a_clear_error() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    s.sandbox
        .shell("true", ShellOptions::default())
        .await
        .unwrap();
    assert!(docker(&["kill", &s.handle]).status.success());
    let t = Instant::now();
    let shell = s.sandbox.shell("echo hi", ShellOptions::default()).await;
    let file = s.sandbox.read_file("/workspace/x").await;
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    let err = shell.expect_err("a dead container cannot run commands");
    assert!(matches!(err, SandboxError::SandboxGone { .. }), "{err}");
    assert!(err.to_string().contains("start a new session"));
    assert!(file.is_err());
    assert!(!s.sandbox.is_alive().await);
}

#[tokio::test]
async fn requests_cannot_raise_limits_and_the_session_cap_holds() {
    let m = support::manager_with(support::test_limits(), 1).await;
    let err = m
        .create(
            &support::owner(),
            &LimitRequest {
                memory_mb: Some(1 << 20),
                ..Default::default()
            },
            CreateOptions::default(),
        )
        .await
        .err()
        .expect("raising memory must be refused");
    assert!(
        err.to_string().contains("above the configured maximum"),
        "{err}"
    );
    let (_s, _g) = support::session(&m).await;
    let err = m
        .create(
            &support::owner(),
            &LimitRequest::default(),
            CreateOptions::default(),
        )
        .await
        .err()
        .expect("over the cap");
    assert!(
        matches!(err, SandboxError::TooManySessions { limit: 1 }),
        "{err}"
    );
}

#[tokio::test]
async fn idle_sessions_are_reaped() {
    let limits = support::test_limits();
    let m = sandboxd_core::sandbox::SessionManager::new(
        std::sync::Arc::new(support::runtime().await),
        limits,
        sandboxd_core::config::SessionsConfig {
            idle_timeout_secs: 1,
            ..Default::default()
        },
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    let (s, _g) = support::session(&m).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reaped = m.reap_idle().await;
    assert_eq!(reaped, vec![s.id.clone()]);
    let gone = docker(&["inspect", &s.handle]);
    assert!(!gone.status.success());
}

#[tokio::test]
async fn owners_and_limits_survive_the_labels_of_a_real_container() {
    use sandboxd_core::sandbox::{Owner, Viewer};
    let (alice, bob) = (Owner::new("alice").unwrap(), Owner::new("bob").unwrap());
    let m = support::manager().await;
    let req = LimitRequest {
        memory_mb: Some(256),
        ..Default::default()
    };
    let s = m
        .create(&alice, &req, CreateOptions { keep: true })
        .await
        .unwrap();
    let _g = support::Cleanup(s.handle.clone());
    // A later process: a new manager that knows nothing but the engine's labels.
    let later = support::manager().await;
    let err = later
        .get(&bob, &s.id)
        .await
        .err()
        .expect("bob must not see it");
    assert!(matches!(err, SandboxError::SessionNotFound { .. }), "{err}");
    assert!(matches!(
        later.remove(&bob, &s.id).await,
        Err(SandboxError::SessionNotFound { .. })
    ));
    let bobs = later.list(&Viewer::Owner(bob.clone())).await.unwrap();
    assert!(bobs.iter().all(|i| i.session_id != s.id));
    let again = later.get(&alice, &s.id).await.unwrap();
    assert_eq!(
        again.limits.memory_mb, 256,
        "re-attached with the recorded limit"
    );
    assert!(again.keep);
    let inspect = docker(&["inspect", "--format", "{{.HostConfig.Memory}}", &s.handle]);
    assert_eq!(
        String::from_utf8_lossy(&inspect.stdout).trim(),
        (256u64 << 20).to_string()
    );
    let all = later.list(&Viewer::Admin).await.unwrap();
    let info = all.iter().find(|i| i.session_id == s.id).unwrap();
    assert_eq!((info.owner.as_str(), info.kept), ("alice", true));
    later.admin_remove(&s.id).await.unwrap();
    assert!(!docker(&["inspect", &s.handle]).status.success());
}
