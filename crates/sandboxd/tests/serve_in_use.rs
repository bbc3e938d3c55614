//! A session in use through `sandboxd serve` (a real process on loopback, the real engine
//! and image, a fake LLM at the HTTP boundary): a run that waits for a human and then
//! sleeps past its session's idle timeout keeps the session, which idles out only after
//! the run ended; and the tools API works on the session's own tools, so a python variable
//! set through it is there for a run in the same session, and the other way round.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env};
use support::fake_llm::{FakeLlm, Reply};

/// `sessions` are `[sessions]` keys: `Env` puts `extra` right under its `[sessions]` table
/// (which already sets `reap_interval_secs = 1`).
fn config(llm: &FakeLlm, sessions: &str) -> String {
    format!(
        "{sessions}[llm]\nbase_url = {:?}\nmodel = \"fake-model\"\napi_key = \"sk-fake\"\nmax_retries = 1\n\
         [server]\ndrain_secs = 2\nauth_failures_per_minute = 10000\n",
        llm.base_url()
    )
}

async fn start_run(api: &Api, body: Value) -> String {
    let (s, v) = api.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(s, 201, "start run: {v}");
    v["id"].as_str().unwrap().to_string()
}

/// Polls the run (its route reads the store, never the session) until `done` holds.
async fn run_until(api: &Api, run: &str, done: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let (s, v) = api
            .json(Method::GET, &format!("/v1/runs/{run}"), None)
            .await;
        assert_eq!(s, 200, "{v}");
        if done(&v) {
            return v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "run never got there: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ended(v: &Value) -> bool {
    ["succeeded", "failed", "cancelled", "interrupted"].contains(&v["state"].as_str().unwrap())
}

/// The session as the list shows it (a store read: looking does not count as use).
async fn listed(api: &Api, id: &str) -> Value {
    let (s, v) = api
        .json(Method::GET, "/v1/sessions?include_ended=true", None)
        .await;
    assert_eq!(s, 200, "{v}");
    v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("session {id} is not listed: {v}"))
}

/// The events of a finished run.
async fn events(api: &Api, run: &str) -> Vec<Value> {
    let resp = api
        .req(Method::GET, &format!("/v1/runs/{run}/events?follow=false"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body = resp.text().await.unwrap();
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn tool_results(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .filter(|e| e["type"] == "tool_result")
        .map(|e| e.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_keeps_its_session_past_the_idle_timeout_which_counts_from_the_runs_end() {
    let llm = FakeLlm::start(vec![
        Reply::tool("ask_human", json!({"inquire": "Go on?"})),
        Reply::tool("bash", json!({"command": "sleep 5; echo SLEPT-THROUGH"})),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    // The manager's one reaper would take the session within the run: after its own 1 s
    // (the admin's timeout is 2 s); it looks every second.
    let env = Env::new(&config(&llm, "idle_timeout_secs = 2\n")).await;
    let key = env.add_user("ida", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"idle_timeout": 1})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["idle_timeout"], 1);
    let session = v["id"].as_str().unwrap().to_string();
    let run = start_run(
        &api,
        json!({"task": "wait, then sleep", "session_id": session}),
    )
    .await;

    // Waiting for an answer for longer than both timeouts (and their reap intervals).
    run_until(&api, &run, |v| v["state"] == "waiting_for_human").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        listed(&api, &session).await["state"],
        "running",
        "waiting is use"
    );
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/runs/{run}/answer"),
            Some(json!({"answer": "yes"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");

    // Then a bash step sleeping past them again.
    let done = run_until(&api, &run, ended).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let results = tool_results(&events(&api, &run).await);
    assert!(
        results.iter().any(|r| r.contains("SLEPT-THROUGH")),
        "the sleeping command finished in its container: {results:?}"
    );
    let row = listed(&api, &session).await;
    assert_eq!(row["state"], "running", "the run kept its session: {row}");

    // Ended, the run no longer holds it: it idles out by its own timeout.
    let t = Instant::now();
    let row = loop {
        let row = listed(&api, &session).await;
        if row["state"] == "ended" {
            break row;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "never idled out: {row}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let reason = row["end_reason"].as_str().unwrap();
    assert!(reason.contains("idle for more than 1 s"), "{row}");
    // Counted from the run's end: a whole timeout after it, not at once.
    let at =
        |v: &Value| chrono::DateTime::parse_from_rfc3339(v["ended_at"].as_str().unwrap()).unwrap();
    assert!(
        at(&row) - at(&done) >= chrono::Duration::seconds(1),
        "the session ended a timeout after the run: {row} {done}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tools_api_and_a_run_share_the_sessions_python() {
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "python",
            json!({"code": "print(f'X-PLUS-ONE={x + 1}')\ny = 'SET-BY-THE-RUN'"}),
        ),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    let env = Env::new(&config(&llm, "")).await;
    let key = env.add_user("tia", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let session = api.session().await;
    let python = format!("/v1/sessions/{session}/tools/python");

    let (s, v) = api
        .json(Method::POST, &python, Some(json!({"code": "x = 41"})))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["is_error"], false, "{v}");

    let run = start_run(&api, json!({"task": "add one", "session_id": session})).await;
    let done = run_until(&api, &run, ended).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let results = tool_results(&events(&api, &run).await);
    assert!(
        results.iter().any(|r| r.contains("X-PLUS-ONE=42")),
        "the run's python saw x from the tools API: {results:?}"
    );

    let (s, v) = api
        .json(Method::POST, &python, Some(json!({"code": "print(y)"})))
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v["output"].as_str().unwrap().contains("SET-BY-THE-RUN"),
        "the tools API's python saw y from the run: {v}"
    );
}
