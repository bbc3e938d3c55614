//! The liveness watch of `ExecSandbox` calls, on a backend whose processes never end and
//! whose sandbox dies on demand: what gVisor's runsc does after an out-of-memory kill.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::exec_sandbox::{ExecBackend, ExecSandbox};
use super::{AttachedProcess, ExecRequest, Sandbox, SandboxError, SpawnRequest};
use crate::config::Limits;

struct Hanging {
    alive: Arc<AtomicBool>,
}

#[async_trait]
impl ExecBackend for Hanging {
    async fn spawn(&self, _: &SpawnRequest, _: bool) -> Result<AttachedProcess, SandboxError> {
        Ok(AttachedProcess {
            stdin: Box::pin(tokio::io::sink()),
            output: Box::pin(futures::stream::pending()),
            exit_code: Box::new(|| Box::pin(async { None })),
        })
    }

    async fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    async fn stop_reason(&self) -> Option<String> {
        Some("it ran out of memory".into())
    }
}

fn sandbox(alive: &Arc<AtomicBool>) -> ExecSandbox<Hanging> {
    let backend = Hanging {
        alive: alive.clone(),
    };
    ExecSandbox::new(backend, "s1".into(), Limits::default())
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_that_dies_under_a_call_ends_it_at_once_with_the_reason() {
    let alive = Arc::new(AtomicBool::new(true));
    let sb = sandbox(&alive);
    let killer = {
        let alive = alive.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            alive.store(false, Ordering::SeqCst);
        })
    };
    let started = tokio::time::Instant::now();
    let mut req = ExecRequest::new(["sleep", "1000"]);
    req.timeout = Duration::from_secs(500);
    let err = sb
        .exec(req)
        .await
        .expect_err("a dead sandbox cannot answer");
    // Virtual time: the watch looks once a second and wants two looks in a row, so the call
    // ends within three seconds of the death, not at its 500 s timeout.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(6) && waited <= Duration::from_secs(8),
        "{waited:?}"
    );
    match err {
        SandboxError::SandboxGone { message, .. } => {
            assert!(message.contains("ran out of memory"), "{message}")
        }
        other => panic!("not gone: {other}"),
    }
    killer.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn one_failed_look_does_not_end_a_call() {
    let alive = Arc::new(AtomicBool::new(true));
    let sb = sandbox(&alive);
    // Down for one look (at 3 s), up again at the next: a busy engine, not a death.
    let flicker = {
        let alive = alive.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            alive.store(false, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1000)).await;
            alive.store(true, Ordering::SeqCst);
        })
    };
    let mut req = ExecRequest::new(["sleep", "1000"]);
    req.timeout = Duration::from_secs(20);
    let started = tokio::time::Instant::now();
    let r = sb.exec(req).await;
    assert!(started.elapsed() >= Duration::from_secs(20));
    assert!(
        !matches!(r, Err(SandboxError::SandboxGone { .. })),
        "{:?}",
        r.err().map(|e| e.to_string())
    );
    flicker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_live_sandbox_lets_a_call_run_to_its_timeout() {
    let alive = Arc::new(AtomicBool::new(true));
    let sb = sandbox(&alive);
    let mut req = ExecRequest::new(["sleep", "1000"]);
    req.timeout = Duration::from_secs(30);
    let started = tokio::time::Instant::now();
    // The kill after the timeout cannot be confirmed by this backend (its processes never
    // end), which is an error of its own; what matters is that the watch did not end it.
    let r = sb.exec(req).await;
    assert!(started.elapsed() >= Duration::from_secs(30));
    assert!(
        !matches!(r, Err(SandboxError::SandboxGone { .. })),
        "{:?}",
        r.err().map(|e| e.to_string())
    );
}
