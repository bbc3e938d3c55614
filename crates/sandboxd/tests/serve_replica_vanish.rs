//! A session's container removed outside sandboxd (`docker rm -f`) while a run in it is
//! driven by another replica than the one that hears of the end: two real `sandboxd serve`
//! processes on one Postgres and one engine, the real image, a fake LLM at the HTTP boundary.
//!
//! Replica A made the session; the run is posted to (and driven by) replica B. B is stopped
//! (SIGSTOP) before the container goes, so only A hears the engine's event in time: A fails
//! the run through its row (a fail request with the reason, not a cancel) and ends the
//! session without waiting for a run it does not drive (B is stopped all that while); B,
//! continued, finds the session ended (its own report of the container is only forgotten)
//! and ends the run `failed` with the reason, as a run driven by A would.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::process::Command;

use reqwest::Method;
use serde_json::json;

use crate::serve::runs::{get_run, start_run, until};
use crate::serve::{Serve, assert_run_failed_with, ended_session};
use crate::serve_replicas::Cluster;
use crate::support::fake_llm::{FakeLlm, Gate, Reply};

const REASON: &str = "its sandbox was removed outside sandboxd";

/// Longer than replica B stays stopped (until A has ended the session, and a little while
/// if A were to wait for B's run), so B's run is never taken over as a dead replica's.
const LEASE_SECS: u64 = 90;

/// Sends `signal` (STOP, CONT) to the replica's process.
fn signal(serve: &Serve, signal: &str) {
    let out = Command::new("kill")
        .args([&format!("-{signal}"), &serve.pid().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "kill -{signal}: {out:?}");
}

/// Continues a stopped replica however the test ends (a stopped process is never reaped).
struct Stopped<'a>(&'a Serve);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        // No assertion here: it may run while a failed assertion unwinds.
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.pid().to_string()])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_driven_by_another_replica_fails_with_the_reason_its_sandbox_went() {
    // The model's second answer is held back for as long as the test runs: the run waits for
    // the model when its container goes, so nothing calls into the sandbox on B.
    let gate = Gate::default();
    let llm = FakeLlm::start_with_fallback(
        vec![Reply::tool("bash", json!({"command": "echo ready"}))],
        Reply::tool("terminate", json!({"status": "success", "answer": "late"})).gated(&gate),
    )
    .await;
    let Some(c) = Cluster::start_leased(2, &llm, "", LEASE_SECS, "").await else {
        return;
    };
    let alice = c.add_user("alice", &[]);
    let (a, b) = (c.api(0, &alice), c.api(1, &alice));
    let session = a.session().await;
    let run = start_run(
        &b,
        json!({"task": "wait a long time", "session_id": session}),
    )
    .await;
    let id = run["id"].as_str().unwrap().to_string();
    until(&b, &id, "tool_result").await;
    // By the row, not by an owner label: a session claimed from the warm pool keeps the
    // pool's labels.
    let (s, v) = a
        .json(Method::GET, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    let container = v["handle"]
        .as_str()
        .expect("the session's handle")
        .to_string();

    signal(c.serve(1), "STOP");
    let stopped = Stopped(c.serve(1));
    let out = Command::new("docker")
        .args(["rm", "-f", &container])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker rm -f: {out:?}");
    // A heard it: the session ends, saying why, while B still sleeps.
    let v = ended_session(&a, &session).await;
    assert_eq!(v["end_reason"], REASON, "{v}\n{}", c.logs());
    // Without waiting for B's run: one that waited would have given up on it (B never
    // answers while stopped) and said so before ending the session.
    let log_a = c.serve(0).log.lock().unwrap().clone();
    assert!(
        !log_a.contains("have not all ended yet"),
        "A waited for a run B drives:\n{log_a}"
    );
    drop(stopped);

    // B, continued, fails the run with the reason A's request carried.
    assert_run_failed_with(&a, &id, REASON).await;
    let v = get_run(&b, &id).await;
    assert_eq!(v["state"], "failed", "{v}\n{}", c.logs());
    gate.open();
}
