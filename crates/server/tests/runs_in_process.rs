//! Runs through `Server` in this process (harness.rs), on the fake runtime and the fake LLM:
//! a session's runs take turns while other sessions' do not wait, an event stream resumed
//! with `Last-Event-ID` gets exactly the rest, a restart (graceful or a crash) keeps users,
//! sessions and runs and ends the run in flight `interrupted`, and run listings page by
//! cursor. The model only ever calls `terminate`, which needs no process in the sandbox; a
//! gated reply keeps a run in flight for exactly as long as a test needs.

use std::time::{Duration, Instant};

use reqwest::Method;
use sandboxd_testkit::fake_llm::{FakeLlm, Gate, Reply};
use sandboxd_testkit::serve::runs::read_sse_on;
use serde_json::{Value, json};

use crate::harness::{Serve, Setup, code, start_crashable, start_on};

pub(crate) fn terminate() -> Reply {
    Reply::tool("terminate", json!({"status": "success", "answer": "done"}))
}

/// Posts a run in `session`; its id and state as answered.
pub(crate) async fn run(serve: &Serve, key: &str, session: &str) -> (String, String) {
    let body = json!({"task": "finish", "session_id": session});
    let (s, v) = serve.call(key, Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    (id, v["state"].as_str().unwrap().to_string())
}

pub(crate) async fn run_in_state(serve: &Serve, key: &str, id: &str, state: &str) -> Value {
    serve
        .until(key, &format!("/v1/runs/{id}"), |v| v["state"] == state)
        .await
}

/// Waits (at most 30 s) until the fake LLM has received `n` requests.
pub(crate) async fn llm_asked(llm: &FakeLlm, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while llm.requests().len() < n {
        assert!(Instant::now() < deadline, "the LLM was not asked {n} times");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One SSE event: id, type, data.
pub(crate) type Ev = (u64, String, Value);

pub(crate) async fn open_events(
    serve: &Serve,
    key: &str,
    run: &str,
    query: &str,
    last_event_id: Option<&str>,
) -> reqwest::Response {
    let mut req = serve
        .http
        .get(format!("{}/v1/runs/{run}/events{query}", serve.base))
        .bearer_auth(key);
    if let Some(last) = last_event_id {
        req = req.header("Last-Event-ID", last);
    }
    req.send().await.unwrap()
}

/// Reads events until the stream ends or `max` came (testkit's SSE reader, as tuples).
pub(crate) async fn read_events(resp: &mut reqwest::Response, max: Option<usize>) -> Vec<Ev> {
    assert_eq!(resp.status(), 200);
    read_sse_on(resp, &mut String::new(), max)
        .await
        .into_iter()
        .map(|e| (e.id, e.event, e.data))
        .collect()
}

/// Every stored event of an ended run, from a stream that does not follow.
pub(crate) async fn all_events(serve: &Serve, key: &str, id: &str) -> Vec<Ev> {
    let mut resp = open_events(serve, key, id, "?follow=false", None).await;
    let evs = read_events(&mut resp, None).await;
    let ids: Vec<u64> = evs.iter().map(|e| e.0).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "{evs:?}");
    evs
}

#[tokio::test]
async fn a_sessions_second_run_waits_for_the_first_and_other_sessions_do_not() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![terminate().gated(&gate), terminate(), terminate()]).await;
    let setup = Setup::with_llm(&llm);
    let (serve, keys) = start_on(&setup, &[("ann", None)]).await;
    let key = &keys[0];
    let (one, other) = (serve.session(key).await, serve.session(key).await);
    let (first, _) = run(&serve, key, &one).await;
    llm_asked(&llm, 1).await;
    run_in_state(&serve, key, &first, "running").await;

    let (second, state) = run(&serve, key, &one).await;
    assert_eq!(state, "queued");
    let (elsewhere, _) = run(&serve, key, &other).await;
    run_in_state(&serve, key, &elsewhere, "succeeded").await;
    let (_, v) = serve
        .call(key, Method::GET, &format!("/v1/runs/{second}"), None)
        .await;
    assert_eq!(v["state"], "queued", "it waits for the first: {v}");
    assert_eq!(
        llm.requests().len(),
        2,
        "only the first and the other session's run asked"
    );
    run_in_state(&serve, key, &first, "running").await;

    gate.open();
    let first = run_in_state(&serve, key, &first, "succeeded").await;
    let second = run_in_state(&serve, key, &second, "succeeded").await;
    assert_eq!(llm.requests().len(), 3);
    let ended = first["ended_at"].as_str().unwrap();
    let started = second["started_at"].as_str().unwrap();
    assert!(
        started >= ended,
        "the second started {started}, the first ended {ended}"
    );
    let kinds: Vec<String> = all_events(&serve, key, second["id"].as_str().unwrap())
        .await
        .into_iter()
        .filter(|e| e.1 == "run_state")
        .map(|e| e.2["state"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["queued", "running", "succeeded"]);
}

#[tokio::test]
async fn an_event_stream_resumed_with_last_event_id_gets_exactly_the_rest() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![terminate().gated(&gate)]).await;
    let (serve, keys) = start_on(&Setup::with_llm(&llm), &[("ann", None)]).await;
    let key = &keys[0];
    let session = serve.session(key).await;
    let (id, _) = run(&serve, key, &session).await;
    llm_asked(&llm, 1).await;

    // A follower reads the first two events live, then leaves.
    let mut resp = open_events(&serve, key, &id, "", None).await;
    let head = read_events(&mut resp, Some(2)).await;
    drop(resp);
    assert_eq!(head.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2]);
    // It comes back while the run is still in flight and follows it to its end.
    let mut resp = open_events(&serve, key, &id, "", Some("2")).await;
    let rest = tokio::spawn(async move { read_events(&mut resp, None).await });
    gate.open();
    let rest = rest.await.unwrap();
    let full = all_events(&serve, key, &id).await;
    assert_eq!(
        full.last().map(|e| (e.1.as_str(), e.2["state"].clone())),
        Some(("run_state", json!("succeeded")))
    );
    let joined: Vec<Ev> = head.into_iter().chain(rest).collect();
    assert_eq!(
        joined, full,
        "the two parts are the run's events, once each, in order"
    );

    // From the store: after any seq, exactly the events after it.
    let n = full.len() as u64;
    for after in [1, n - 1, n] {
        let last = after.to_string();
        let mut resp = open_events(&serve, key, &id, "?follow=false", Some(&last)).await;
        let got = read_events(&mut resp, None).await;
        assert_eq!(got, full[after as usize..].to_vec(), "after {after}");
    }
    let resp = open_events(&serve, key, &id, "", Some("two")).await;
    assert_eq!(
        resp.status(),
        400,
        "a Last-Event-ID that is not a seq is bad input"
    );
}

/// The store of a service stopped with a run in flight, served again: what is asserted is
/// the same for a graceful stop and for a crash.
async fn a_restart_keeps_the_service(crash: bool) {
    let gate = Gate::default();
    let script = vec![terminate(), terminate().gated(&gate), terminate()];
    let llm = FakeLlm::start(script).await;
    let setup = Setup::with_llm(&llm);
    let (before, keys) = start_crashable(&setup, &["ann"]).await;
    let key = &keys[0];
    let session = before.serve.session(key).await;
    let (done, _) = run(&before.serve, key, &session).await;
    let done = run_in_state(&before.serve, key, &done, "succeeded").await;
    let (cut, _) = run(&before.serve, key, &session).await;
    llm_asked(&llm, 2).await;
    run_in_state(&before.serve, key, &cut, "running").await;
    let (_, me) = before.serve.call(key, Method::GET, "/v1/me", None).await;
    if crash {
        before.crash();
    } else {
        before.stop().await;
    }

    let (after, _) = start_on(&setup, &[]).await;
    let (s, me_again) = after.call(key, Method::GET, "/v1/me", None).await;
    let user = |v: &Value| (v["id"].clone(), v["name"].clone(), v["created_at"].clone());
    assert_eq!(s, 200, "the key still opens: {me_again}");
    assert_eq!(user(&me_again), user(&me), "the same user");
    assert_eq!(me["name"], "ann");
    let (s, v) = after
        .call(key, Method::GET, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!((s, v["state"].as_str()), (200, Some("running")), "{v}");
    let (s, v) = after
        .call(
            key,
            Method::GET,
            &format!("/v1/runs/{}", done["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!((s, &v), (200, &done), "an ended run is kept as it was");
    let v = after
        .until(key, &format!("/v1/runs/{cut}"), |v| v["state"] != "running")
        .await;
    assert_eq!(v["state"], "interrupted", "{v}");
    let evs = all_events(&after, key, &cut).await;
    let tail: Vec<&str> = evs.iter().rev().take(2).map(|e| e.1.as_str()).collect();
    assert_eq!(tail, ["run_state", "run_finished"], "{evs:?}");
    assert_eq!(evs.last().unwrap().2["state"], "interrupted");
    assert_eq!(v["last_seq"], evs.len());

    // The session takes runs again.
    let (again, _) = run(&after, key, &session).await;
    run_in_state(&after, key, &again, "succeeded").await;
    let (_, list) = after.call(key, Method::GET, "/v1/runs", None).await;
    let ids: Vec<&str> = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [again.as_str(), cut.as_str(), done["id"].as_str().unwrap()]
    );
}

#[tokio::test]
async fn a_crash_keeps_users_sessions_and_runs_and_the_run_in_flight_ends_interrupted() {
    a_restart_keeps_the_service(true).await;
}

#[tokio::test]
async fn a_graceful_restart_keeps_users_sessions_and_runs_and_interrupts_the_run_in_flight() {
    a_restart_keeps_the_service(false).await;
}

#[tokio::test]
async fn run_listings_page_by_cursor_newest_first_without_repeats_or_gaps() {
    let llm = FakeLlm::start_with_fallback(vec![], terminate()).await;
    let (serve, keys) = start_on(&Setup::with_llm(&llm), &[("dee", None), ("eve", None)]).await;
    let (key, other) = (&keys[0], &keys[1]);
    let session = serve.session(key).await;
    let mut made = Vec::new();
    for _ in 0..5 {
        let (id, _) = run(&serve, key, &session).await;
        run_in_state(&serve, key, &id, "succeeded").await;
        made.push(id);
    }
    let theirs = serve.session(other).await;
    let (foreign, _) = run(&serve, other, &theirs).await;
    run_in_state(&serve, other, &foreign, "succeeded").await;

    let mut seen = Vec::new();
    let mut path = "/v1/runs?limit=2".to_string();
    loop {
        let (s, page) = serve.call(key, Method::GET, &path, None).await;
        assert_eq!(s, 200, "{page}");
        let rows = page["runs"].as_array().unwrap();
        assert!(rows.len() <= 2, "{page}");
        seen.extend(rows.iter().map(|r| r["id"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/runs?limit=2&cursor={c}"),
            None => break,
        }
    }
    made.reverse();
    assert_eq!(
        seen, made,
        "every run of hers once, newest first, none of eve's"
    );
    let (s, v) = serve
        .call(key, Method::GET, "/v1/runs?cursor=not-a-cursor", None)
        .await;
    assert_eq!((s, code(&v)), (400, "invalid_request"), "{v}");
}
