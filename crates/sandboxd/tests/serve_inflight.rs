//! Nothing runs unsupervised after a crash (issue 20, point 7), against a real `serve`, the
//! real engine and image, and a fake LLM: a run's bash call is in flight (a foreground
//! `sleep 300` and a background loop that appends to a marker file every second) when serve
//! is killed with SIGKILL; the next start marks the run `interrupted`, re-attaches the
//! session, and by then both processes are gone from its container and the marker stops
//! growing, while the session itself keeps working.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use serve::runs::{SERVER, ended_run, llm_config, start_run, until};
use serve::{Api, Env};
use support::fake_llm::{FakeLlm, Reply};

const COMMAND: &str =
    "(while :; do echo tick >> /workspace/ticks; sleep 1; done) & sleep 300; touch /workspace/late";

/// How many processes in the session run `sleep 300`, counted through the API's exec (the
/// counting shell's own processes never start with `sleep`).
async fn sleeps(api: &Api, session: &str) -> u64 {
    let out = api
        .exec(
            session,
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 300'",
        )
        .await;
    out["stdout"].as_str().unwrap().trim().parse().unwrap()
}

/// The marker's length through the file API (not the shell), None while it does not exist.
async fn ticks(api: &Api, session: &str) -> Option<usize> {
    let r = api
        .req(
            Method::GET,
            &format!("/v1/sessions/{session}/files/content?path=ticks"),
        )
        .send()
        .await
        .unwrap();
    (r.status() == 200).then_some(r.bytes().await.unwrap().len())
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_mid_command_then_restart_kills_what_was_in_flight() {
    let llm = FakeLlm::start_with_fallback(
        vec![Reply::tool("bash", json!({"command": COMMAND}))],
        Reply::tool("terminate", json!({"status": "success", "answer": "late"})),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let key = env.add_user("kim", &[]);
    let mut serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(&api, json!({"task": "wait a long time", "session": {}})).await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    until(&api, &run_id, "tool_call").await;
    let t = Instant::now();
    while ticks(&api, &session).await.unwrap_or(0) < 2 * "tick\n".len() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    serve.kill9();

    let serve = env.start();
    let api = Api::new(&serve, &key);
    let got = ended_run(&api, &run_id).await;
    assert_eq!(got["state"], "interrupted", "{got}");
    let (_, s) = api
        .json(Method::GET, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(s["state"], "running", "the session was re-attached: {s}");

    // Bounded: the kill happens before the new serve listens, so the first look should
    // already find nothing; on a loaded machine allow a while.
    let t = Instant::now();
    loop {
        let n = sleeps(&api, &session).await;
        if n == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the dead serve's command still runs in the session ({n} × sleep 300)"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The background loop of the same command is gone too: the marker stops growing.
    let before = ticks(&api, &session).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = ticks(&api, &session).await.unwrap();
    assert_eq!(before, after, "the marker still grows");

    // The session itself works: a fresh shell.
    let out = api.exec(&session, "echo $((6*7))").await;
    assert_eq!(out["stdout"], "42\n", "{out}");
    let (_, me) = api.json(Method::GET, "/v1/me", None).await;
    assert_eq!(me["usage"]["active_runs"], 0, "{me}");
}
