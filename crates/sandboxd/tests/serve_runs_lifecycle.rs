//! Runs of `sandboxd serve` that wait or are cut short (a real process, the real engine and
//! image, a fake LLM at the HTTP boundary): ask_human answered through the API or timed out,
//! and runs interrupted by `kill -9` and by SIGTERM, which keep their events.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use serve::runs::{
    SERVER, assert_numbered, ended_run, events, follow_all, get_run, kinds, llm_config, read_sse,
    start_run, until, until_with,
};
use serve::{Api, Env, Serve};
use support::fake_llm::{FakeLlm, Reply};

#[tokio::test(flavor = "multi_thread")]
async fn ask_human_is_answered_through_the_api_or_times_out() {
    let llm = FakeLlm::start(vec![
        Reply::tool("ask_human", json!({"inquire": "Which colour?"})),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "painted"}),
        ),
        Reply::tool("ask_human", json!({"inquire": "Anyone there?"})),
        Reply::tool("terminate", json!({"status": "success", "answer": "alone"})),
    ])
    .await;
    let server = SERVER.replace("[server]\n", "[server]\nquestion_timeout_secs = 2\n");
    let env = Env::new(&format!("{}{server}", llm_config(&llm))).await;
    let key = env.add_user("dee", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(&api, json!({"task": "paint it", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    let evs = until(&api, &id, "run_state").await;
    assert_eq!(evs.len(), 1);
    let asked = until(&api, &id, "question_asked").await;
    assert_eq!(asked.last().unwrap().data["question"], "Which colour?");
    // The run is visibly waiting.
    let t = Instant::now();
    let v = loop {
        let v = get_run(&api, &id).await;
        if v["state"] == "waiting_for_human" {
            break v;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(v["question"]["text"], "Which colour?");
    assert!(v["question"]["expires_at"].is_string());
    // A second run of the same session waits, queued, for this one to end.
    let queued = start_run(&api, json!({"task": "ask again", "session_id": session})).await;
    let queued_id = queued["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get_run(&api, &queued_id).await["state"], "queued");
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/runs/{id}/answer"),
            Some(json!({"answer": "BLUE-ANSWER"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(v["question"].is_null(), "{v}");
    let evs = follow_all(&api, &id).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded");
    let answered = evs.iter().find(|e| e.event == "question_answered").unwrap();
    assert_eq!(answered.data["by"], "user");
    let k = kinds(&evs);
    let qa = k.iter().position(|t| t == "question_asked").unwrap();
    assert_eq!(evs[qa + 1].data["state"], "waiting_for_human");
    assert_eq!(k[qa + 2], "question_answered");
    assert_eq!(evs[qa + 3].data["state"], "running");
    assert!(
        llm.requests()[1].to_string().contains("BLUE-ANSWER"),
        "the answer reached the model"
    );

    // Unanswered: the question expires and the run goes on without an answer. It started
    // only after the first run ended.
    let first_ended = get_run(&api, &id).await["ended_at"]
        .as_str()
        .unwrap()
        .to_string();
    let id = queued_id;
    let evs = follow_all(&api, &id).await;
    let running = evs
        .iter()
        .find(|e| e.event == "run_state" && e.data["state"] == "running")
        .unwrap();
    let t = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap();
    assert!(t(running.data["at"].as_str().unwrap()) >= t(&first_ended));
    assert_eq!(evs[0].data["state"], "queued");
    let answered = evs.iter().find(|e| e.event == "question_answered").unwrap();
    assert_eq!(answered.data["by"], "timeout");
    assert_eq!(evs.last().unwrap().data["state"], "succeeded");
    let v = get_run(&api, &id).await;
    assert!(v["question"].is_null());
    assert_eq!(v["answer"], "alone");
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_and_sigterm_leave_runs_interrupted_with_their_events() {
    let llm = FakeLlm::start_with_fallback(
        vec![Reply::tool(
            "bash",
            json!({"command": "echo before the crash > /workspace/f.txt"}),
        )],
        Reply::tool("bash", json!({"command": "sleep 100"})),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let key = env.add_user("gus", &[]);
    let mut serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(&api, json!({"task": "write then wait", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    let before = until(&api, &id, "tool_result").await;
    until_with(&api, &id, "tool_call", "sleep 100").await;
    let seen = read_sse(events(&api, &id, "?follow=false", None).await, None).await;
    let first_pid = serve.pid();
    serve.kill9();

    let mut serve: Serve = env.start();
    let api = Api::new(&serve, &key);
    let v = ended_run(&api, &id).await;
    assert_eq!(v["state"], "interrupted", "{v}");
    assert_eq!(v["outcome"]["kind"], "interrupted");
    let evs = read_sse(events(&api, &id, "", None).await, None).await;
    assert_eq!(
        evs[..seen.len()].to_vec(),
        seen,
        "the events before the crash are kept"
    );
    assert_numbered(&evs, 1);
    let k = kinds(&evs);
    assert_eq!(&k[k.len() - 2..], ["run_finished", "run_state"]);
    assert_eq!(evs[evs.len() - 2].data["reason"]["kind"], "interrupted");
    assert!(before.iter().any(|e| e.event == "tool_result"));
    let r = api
        .req(
            Method::GET,
            &format!("/v1/sessions/{session}/files/content?path=f.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "the session was re-attached");
    assert_eq!(r.text().await.unwrap(), "before the crash\n");
    // No orphan: of what the killed serve made for this user or in its warm pool (the session
    // may have come from it), only the session's container is left.
    let user = env.user_ids()[0].clone();
    let owners = [format!("serve:{user}"), env.pool_owner()];
    let rt = env.runtime_id(&session).await;
    serve::wait_for_leftovers(&owners, first_pid, &[rt]).await;

    // SIGTERM with a run in a sleep and a follower connected: the run ends interrupted and
    // the open stream does not hold the exit.
    let run = start_run(&api, json!({"task": "wait again", "session_id": session})).await;
    let id2 = run["id"].as_str().unwrap().to_string();
    until_with(&api, &id2, "tool_call", "sleep 100").await;
    let open = events(&api, &id2, "", None).await;
    let took = serve.sigterm(Duration::from_secs(15));
    assert!(took < Duration::from_secs(8), "shutdown took {took:?}");
    drop(open);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let v = get_run(&api, &id2).await;
    assert_eq!(v["state"], "interrupted", "{v}");
    let evs = read_sse(events(&api, &id2, "?follow=false", None).await, None).await;
    assert_numbered(&evs, 1);
    assert_eq!(evs.last().unwrap().data["state"], "interrupted");
    assert_eq!(
        evs.iter().filter(|e| e.event == "run_finished").count(),
        1,
        "one ending, written by the stopping serve: {:?}",
        kinds(&evs)
    );
}
