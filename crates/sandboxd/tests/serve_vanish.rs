//! A session's container removed outside sandboxd (`docker rm -f`) under a running `sandboxd
//! serve` (a real process, the real engine and image, a fake LLM at the HTTP boundary): the
//! engine's events end the session at once, its row says why, and the run in flight in it
//! (waiting for the model) ends failed with that reason in its event stream, without
//! anything calling into the sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::runs::{SERVER, follow_all, llm_config, start_run, until};
use serve::{Api, Env};
use support::fake_llm::{FakeLlm, Gate, Reply};

const REASON: &str = "its sandbox was removed outside sandboxd";

/// Polls the session until it has ended (a bound, not a pause).
async fn ended_session(api: &Api, id: &str) -> Value {
    let t = Instant::now();
    loop {
        let (s, v) = api
            .json(Method::GET, &format!("/v1/sessions/{id}"), None)
            .await;
        assert_eq!(s, 200, "{v}");
        if v["state"] == "ended" {
            return v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the session did not end: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

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
    let evs = follow_all(&api, &id).await;
    let last = evs.last().unwrap();
    assert_eq!(last.data["state"], "failed", "{evs:?}");
    let finished = evs
        .iter()
        .find(|e| e.event == "run_finished")
        .expect("a run_finished event");
    assert!(
        finished.data.to_string().contains(REASON),
        "{}",
        finished.data
    );
    let (s, v) = api.json(Method::GET, &format!("/v1/runs/{id}"), None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("failed")), "{v}");
    assert!(v.to_string().contains(REASON), "{v}");
    gate.open();
}
