//! A session's container removed outside sandboxd (`docker rm -f`) under a running `sandboxd
//! serve` (a real process, the real engine and image, a fake LLM at the HTTP boundary): the
//! engine's events end the session at once, its row says why, and the run in flight in it
//! (waiting for the model) ends failed with that reason in its event stream, without
//! anything calling into the sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use serde_json::json;

use serve::runs::{SERVER, llm_config, start_run, until};
use serve::{Api, Env, assert_run_failed_with, ended_session};
use support::fake_llm::{FakeLlm, Gate, Reply};

const REASON: &str = "its sandbox was removed outside sandboxd";

#[tokio::test(flavor = "multi_thread")]
async fn a_container_removed_outside_sandboxd_ends_its_session_and_run_with_the_reason() {
    // The model's second answer is held back for as long as the test runs: the run is in
    // flight, waiting for the model, when its container goes, and nothing calls into the
    // sandbox that would find it gone: only the engine's events can tell.
    let gate = Gate::default();
    let llm = FakeLlm::start_with_fallback(
        vec![Reply::tool("bash", json!({"command": "echo ready"}))],
        Reply::tool("terminate", json!({"status": "success", "answer": "late"})).gated(&gate),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let key = env.add_user("cat", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(&api, json!({"task": "wait a long time", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    until(&api, &id, "tool_result").await;
    let container = env.container(&session).await;

    let out = std::process::Command::new("docker")
        .args(["rm", "-f", &container])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker rm -f: {out:?}");

    let v = ended_session(&api, &session).await;
    assert_eq!(v["end_reason"], REASON, "{v}");

    // The run's stream ends with the run failed, saying why.
    assert_run_failed_with(&api, &id, REASON).await;
    gate.open();
}
