//! Cancelling runs of `sandboxd serve` (a real process, the real engine and image, a fake LLM
//! at the HTTP boundary): cancel kills the command in flight and the run quota holds; a
//! queued run cancelled ends unstarted and spares the running one.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::runs::{
    SERVER, assert_numbered, events, follow_all, get_run, kinds, llm_config, read_sse, read_sse_on,
    start_run, until, until_with,
};
use serve::{Api, Env, code};
use support::fake_llm::{FakeLlm, Reply};

fn sleeps_in(api_container: &str) -> usize {
    let out = std::process::Command::new("docker")
        .args([
            "exec",
            api_container,
            "sh",
            "-c",
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("sleep 100"))
        .count()
}

async fn container_of(env: &Env, session: &str) -> String {
    let store = sandboxd_sqlite::SqliteStore::open(&env.db()).await.unwrap();
    use sandboxd_core::store::Store;
    store
        .session(session)
        .await
        .unwrap()
        .unwrap()
        .container_id
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_kills_the_command_in_flight_and_the_run_quota_holds() {
    let llm = FakeLlm::start_with_fallback(
        vec![Reply::tool("bash", json!({"command": "sleep 100"}))],
        Reply::tool("terminate", json!({"status": "success", "answer": "late"})),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}[quotas]\nruns = 1\n", llm_config(&llm))).await;
    let key = env.add_user("cat", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(&api, json!({"task": "wait a long time", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    until(&api, &id, "tool_call").await;
    let container = container_of(&env, &session).await;
    let t = Instant::now();
    while sleeps_in(&container) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the sleep never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The concurrent-runs quota (1) is taken by this run.
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/runs",
            Some(json!({"task": "another", "session_id": session})),
        )
        .await;
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    assert_eq!(v["error"]["quota"], "runs");
    assert_eq!(v["error"]["limit"], "1");

    let t = Instant::now();
    let (s, v) = api
        .json(Method::POST, &format!("/v1/runs/{id}/cancel"), None)
        .await;
    let took = t.elapsed();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "cancelled", "{v}");
    assert_eq!(v["outcome"]["kind"], "cancelled");
    assert!(took < Duration::from_secs(2), "cancel took {took:?}");
    assert_eq!(
        sleeps_in(&container),
        0,
        "the sleep is gone from the container"
    );
    let evs = read_sse(events(&api, &id, "?follow=false", None).await, None).await;
    let k = kinds(&evs);
    assert_eq!(&k[k.len() - 2..], ["run_finished", "run_state"]);
    assert_eq!(evs.last().unwrap().data["state"], "cancelled");
    // Cancelling again returns the ended run as it is.
    let (s, v) = api
        .json(Method::POST, &format!("/v1/runs/{id}/cancel"), None)
        .await;
    assert_eq!((s, v["state"].as_str()), (200, Some("cancelled")));
    // The quota is free again.
    let again = start_run(&api, json!({"task": "now", "session_id": session})).await;
    let evs = follow_all(&api, again["id"].as_str().unwrap()).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded");
}

/// Opens the gate file a run's command waits for (as the sandbox user, beside the shell the
/// run holds busy).
fn open_gate(container: &str, gate: &str) {
    let st = std::process::Command::new("docker")
        .args(["exec", container, "touch", gate])
        .status()
        .unwrap();
    assert!(st.success(), "docker exec touch {gate}: {st}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_queued_run_ends_it_unstarted_and_spares_the_running_one() {
    let gate = "/workspace/gate";
    let llm = FakeLlm::start_with_fallback(
        vec![
            Reply::tool(
                "bash",
                json!({"command": format!("until [ -e {gate} ]; do sleep 0.1; done; echo GATE-OPEN")}),
            ),
            Reply::tool(
                "terminate",
                json!({"status": "success", "answer": "first done"}),
            ),
            Reply::tool(
                "terminate",
                json!({"status": "success", "answer": "third done"}),
            ),
        ],
        // What a run that should never have asked would be given.
        Reply::tool("terminate", json!({"status": "success", "answer": "extra"})),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let key = env.add_user("hal", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let first = start_run(
        &api,
        json!({"task": "FIRST: wait for the gate", "session": {}}),
    )
    .await;
    let first_id = first["id"].as_str().unwrap().to_string();
    let session = first["session_id"].as_str().unwrap().to_string();
    until_with(&api, &first_id, "tool_call", "GATE-OPEN").await;

    // The second run of the session waits for the first, which waits for the gate.
    let queued = start_run(
        &api,
        json!({"task": "QUEUED-TASK-MARKER", "session_id": session}),
    )
    .await;
    let id = queued["id"].as_str().unwrap().to_string();
    assert_eq!(queued["state"], "queued", "{queued}");
    // A follower connected while it is queued has its queued state live.
    let mut open = events(&api, &id, "", None).await;
    let mut buf = String::new();
    let mut live = read_sse_on(&mut open, &mut buf, Some(1)).await;
    assert_eq!(live[0].data["state"], "queued", "{live:?}");

    let (s, v) = api
        .json(Method::POST, &format!("/v1/runs/{id}/cancel"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "cancelled", "{v}");
    assert_eq!(v["outcome"]["kind"], "cancelled", "{v}");
    assert!(v["started_at"].is_null(), "it never started: {v}");
    assert!(v["ended_at"].is_string(), "{v}");
    assert_eq!(v["steps"], 0);
    // The cancel did not wait for the session's lock: the first run is still at the gate.
    assert_eq!(get_run(&api, &first_id).await["state"], "running");

    live.extend(read_sse_on(&mut open, &mut buf, None).await);
    assert_numbered(&live, 1);
    assert_eq!(
        kinds(&live),
        ["run_state", "run_finished", "run_state"],
        "no step events: {live:?}"
    );
    assert_eq!(live[1].data["reason"]["kind"], "cancelled");
    assert_eq!(live[2].data["state"], "cancelled");
    let replay = read_sse(events(&api, &id, "?follow=false", None).await, None).await;
    assert_eq!(replay, live, "the stream after the fact is the same");
    let store = sandboxd_sqlite::SqliteStore::open(&env.db()).await.unwrap();
    use sandboxd_core::store::Store;
    let stored = store.events_after(&id, 0, 100).await.unwrap();
    let stored: Vec<(u64, String, Value)> = stored
        .iter()
        .map(|e| {
            (
                e.seq,
                e.kind.clone(),
                serde_json::from_str(&e.payload).unwrap(),
            )
        })
        .collect();
    let streamed: Vec<(u64, String, Value)> = live
        .iter()
        .map(|e| (e.id, e.event.clone(), e.data.clone()))
        .collect();
    assert_eq!(stored, streamed, "the store holds what was streamed");
    let row = store.run(&id).await.unwrap().unwrap();
    assert_eq!(row.state, sandboxd_core::store::RunState::Cancelled);
    assert_eq!((row.started_at, row.last_seq), (None, 3));

    // The first run goes on as if nothing happened, and the session takes a next run.
    let container = container_of(&env, &session).await;
    open_gate(&container, gate);
    let evs = follow_all(&api, &first_id).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded", "{evs:?}");
    assert!(
        evs.iter()
            .any(|e| e.event == "tool_result" && e.data.to_string().contains("GATE-OPEN")),
        "{evs:?}"
    );
    assert_eq!(get_run(&api, &first_id).await["answer"], "first done");
    let third = start_run(&api, json!({"task": "THIRD", "session_id": session})).await;
    let evs = follow_all(&api, third["id"].as_str().unwrap()).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded", "{evs:?}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3, "two for the first run, one for the third");
    assert!(
        reqs.iter()
            .all(|r| !r.to_string().contains("QUEUED-TASK-MARKER")),
        "the cancelled run never reached the model, nor the conversation"
    );
    assert!(reqs[2].to_string().contains("FIRST: wait for the gate"));
    assert_eq!(get_run(&api, &id).await["state"], "cancelled");
}
