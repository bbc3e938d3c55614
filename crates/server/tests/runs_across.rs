//! Two replicas (two `Server`s, each its own replica id) on one SQLite store file and one
//! fake runtime, their runs on one fake LLM: a session's runs take turns wherever they were
//! posted, a run whose replica dies (`kill -9`: its runtime dropped, its lease no longer
//! renewed) is ended `interrupted` by the other within a lease and a half, and cancels and
//! answers posted to the replica that does not drive the run reach the one that does.
//!
//! The second replica starts after the first made the sessions, so it holds them too (its
//! start-up reconcile attaches them). Each server has its own handle of the store, so no
//! wake-up crosses between them: the replicas' runs meet only through the store's rows.

use std::time::{Duration, Instant};

use reqwest::Method;
use sandboxd_testkit::fake_llm::{FakeLlm, Gate, Reply};
use serde_json::{Value, json};

use crate::harness::{Serve, Setup, start_crashable, start_on};
use crate::runs_in_process::{all_events, llm_asked, run, run_in_state, terminate};

/// The run's stored events: (type, data).
async fn events(serve: &Serve, key: &str, id: &str) -> Vec<(String, Value)> {
    all_events(serve, key, id)
        .await
        .into_iter()
        .map(|e| (e.1, e.2))
        .collect()
}

fn states(evs: &[(String, Value)]) -> Vec<String> {
    evs.iter()
        .filter(|e| e.0 == "run_state")
        .map(|e| e.1["state"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn runs_of_one_session_posted_to_two_replicas_take_turns() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![terminate().gated(&gate), terminate()]).await;
    let setup = Setup::with_llm(&llm);
    let (a, keys) = start_on(&setup, &[("ann", None)]).await;
    let key = &keys[0];
    let session = a.session(key).await;
    let (b, _) = start_on(&setup, &[]).await;

    let (first, _) = run(&a, key, &session).await;
    llm_asked(&llm, 1).await;
    run_in_state(&a, key, &first, "running").await;
    let (second, state) = run(&b, key, &session).await;
    assert_eq!(state, "queued");
    // Longer than several polls of the store: the second stays queued behind the first.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (_, v) = b
        .call(key, Method::GET, &format!("/v1/runs/{second}"), None)
        .await;
    assert_eq!(v["state"], "queued", "it waits for the first: {v}");
    assert_eq!(llm.requests().len(), 1, "only the first run asked the LLM");

    gate.open();
    let first = run_in_state(&b, key, &first, "succeeded").await;
    let second = run_in_state(&a, key, &second, "succeeded").await;
    let (ended, started) = (
        first["ended_at"].as_str().unwrap(),
        second["started_at"].as_str().unwrap(),
    );
    assert!(
        started >= ended,
        "the second started {started}, the first ended {ended}"
    );
    let id = second["id"].as_str().unwrap();
    assert_eq!(
        states(&events(&a, key, id).await),
        ["queued", "running", "succeeded"]
    );
}

#[tokio::test]
async fn a_run_whose_replica_dies_is_interrupted_by_another_within_the_lease() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![terminate().gated(&gate), terminate()]).await;
    let setup = Setup::with_llm(&llm).lease(2);
    let (a, keys) = start_crashable(&setup, &["ann"]).await;
    let key = &keys[0];
    let session = a.serve.session(key).await;
    let (b, _) = start_on(&setup, &[]).await;
    let (cut, _) = run(&a.serve, key, &session).await;
    llm_asked(&llm, 1).await;
    run_in_state(&b, key, &cut, "running").await;
    let (queued, _) = run(&a.serve, key, &session).await;

    a.crash();
    let crashed = Instant::now();
    let v = b
        .until(key, &format!("/v1/runs/{cut}"), |v| v["state"] != "running")
        .await;
    // A lease (2 s), half a lease for the sweep, a poll; and slack for a loaded machine.
    let took = crashed.elapsed();
    assert!(took < Duration::from_secs(10), "noticed after {took:?}");
    assert_eq!(v["state"], "interrupted", "{v}");
    let evs = events(&b, key, &cut).await;
    assert_eq!(
        states(&evs),
        ["queued", "running", "interrupted"],
        "{evs:?}"
    );
    let finished: Vec<&Value> = evs
        .iter()
        .filter(|e| e.0 == "run_finished")
        .map(|e| &e.1)
        .collect();
    assert_eq!(finished.len(), 1, "{evs:?}");
    assert_eq!(finished[0]["reason"]["kind"], "interrupted");
    assert_eq!(v["last_seq"], evs.len(), "the kept events and the ending");
    // The dead replica's queued run is interrupted too (its task died with it).
    let q = run_in_state(&b, key, &queued, "interrupted").await;
    assert_eq!(q["started_at"], Value::Null, "{q}");

    // The session takes runs again, on the replica that lives.
    let (again, _) = run(&b, key, &session).await;
    run_in_state(&b, key, &again, "succeeded").await;
}

#[tokio::test]
async fn a_cancel_posted_to_the_other_replica_stops_the_run_where_it_runs() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![terminate().gated(&gate), terminate()]).await;
    let setup = Setup::with_llm(&llm);
    let (a, keys) = start_on(&setup, &[("ann", None)]).await;
    let key = &keys[0];
    let session = a.session(key).await;
    let (b, _) = start_on(&setup, &[]).await;
    let (running, _) = run(&a, key, &session).await;
    llm_asked(&llm, 1).await;
    run_in_state(&a, key, &running, "running").await;
    let (queued, _) = run(&a, key, &session).await;

    // The queued one first: it ends without ever running.
    let path = |id: &str| format!("/v1/runs/{id}/cancel");
    let (s, v) = b.call(key, Method::POST, &path(&queued), None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("cancelled")), "{v}");
    let (s, v) = b.call(key, Method::POST, &path(&running), None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("cancelled")), "{v}");
    assert_eq!(v["outcome"]["kind"], "cancelled", "{v}");
    let evs = events(&a, key, &running).await;
    assert_eq!(states(&evs), ["queued", "running", "cancelled"], "{evs:?}");
    assert_eq!(
        states(&events(&a, key, &queued).await),
        ["queued", "cancelled"]
    );

    // The session is usable from either replica.
    let (again, _) = run(&b, key, &session).await;
    run_in_state(&a, key, &again, "succeeded").await;
}

#[tokio::test]
async fn an_answer_posted_to_the_other_replica_reaches_the_question() {
    let llm = FakeLlm::start(vec![
        Reply::tool("ask_human", json!({"inquire": "which colour?"})),
        terminate(),
    ])
    .await;
    let setup = Setup::with_llm(&llm);
    let (a, keys) = start_on(&setup, &[("ann", None)]).await;
    let key = &keys[0];
    let session = a.session(key).await;
    let (b, _) = start_on(&setup, &[]).await;
    let (id, _) = run(&a, key, &session).await;
    let waiting = run_in_state(&b, key, &id, "waiting_for_human").await;
    assert_eq!(waiting["question"]["text"], "which colour?");

    let path = format!("/v1/runs/{id}/answer");
    let (s, v) = b
        .call(key, Method::POST, &path, Some(json!({"answer": "teal"})))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["question"], Value::Null, "the question is answered: {v}");
    let (s, v) = b
        .call(key, Method::POST, &path, Some(json!({"answer": "again"})))
        .await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("not_waiting")));
    run_in_state(&b, key, &id, "succeeded").await;
    let evs = events(&b, key, &id).await;
    let answered: Vec<&Value> = evs
        .iter()
        .filter(|e| e.0 == "question_answered")
        .map(|e| &e.1)
        .collect();
    assert_eq!(answered.len(), 1, "{evs:?}");
    assert_eq!(answered[0]["by"], "user");
    let asked = llm.requests();
    assert!(
        asked[1].to_string().contains("teal"),
        "the model got the answer: {}",
        asked[1]
    );
}

#[tokio::test]
async fn a_replica_that_cannot_renew_its_lease_stops_its_run_and_another_ends_it() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![terminate().gated(&gate), terminate()]).await;
    let setup = Setup::with_llm(&llm).lease(2);
    let (a, keys) = start_on(&setup, &[("ann", None)]).await;
    let key = &keys[0];
    let session = a.session(key).await;
    let (b, _) = start_on(&setup, &[]).await;
    let (cut, _) = run(&a, key, &session).await;
    llm_asked(&llm, 1).await;
    run_in_state(&a, key, &cut, "running").await;

    // A lives on but reaches the store no more: its lease runs out, it stops its run (it
    // does not hold it any more) and B ends the run for it.
    a.state.replica.stop_beating();
    let v = b
        .until(key, &format!("/v1/runs/{cut}"), |v| v["state"] != "running")
        .await;
    assert_eq!(v["state"], "interrupted", "{v}");
    assert!(a.state.replica.fenced());
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.state.runs.live(&cut).is_some() {
        assert!(Instant::now() < deadline, "A still drives the run it lost");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.open();
    let evs = events(&b, key, &cut).await;
    assert_eq!(
        states(&evs),
        ["queued", "running", "interrupted"],
        "{evs:?}"
    );
    assert_eq!(
        evs.iter().filter(|e| e.0 == "run_finished").count(),
        1,
        "one ending, B's: {evs:?}"
    );
    assert_eq!(llm.requests().len(), 1, "A asked nothing more");

    // A takes no new run while it holds no lease; B does.
    let body = json!({"task": "finish", "session_id": session});
    let (s, v) = a.call(key, Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(s, 500, "{v}");
    assert!(v.to_string().contains("lease"), "{v}");
    let (again, _) = run(&b, key, &session).await;
    run_in_state(&b, key, &again, "succeeded").await;
}
