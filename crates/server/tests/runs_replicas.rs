//! Two servers on one store in this process, as two replicas: a run posted to one is followed
//! on the other live, every event exactly once and in order, and a follower that leaves one
//! and comes back to the other with `Last-Event-ID` misses nothing. Once with one store
//! handle (the servers share its wake-ups, as replicas on one Postgres share NOTIFY), once
//! with a handle each (no wake-up crosses: the followers find the events by re-reading the
//! table, as after lost notifications). The multi-process proof on Postgres is in
//! crates/sandboxd/tests.

use sandboxd_testkit::fake_llm::{FakeLlm, Gate};

use crate::harness::{Setup, start_with};
use crate::runs_in_process::{
    Ev, all_events, llm_asked, open_events, read_events, run, run_in_state, terminate,
};

async fn followed_across_replicas(shared_wakes: bool) {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![terminate().gated(&gate)]).await;
    let setup = Setup::with_llm(&llm);
    let store = setup.open_store().await;
    let (a, keys) = start_with(&setup, store.clone(), &[("ann", None)]).await;
    let other = if shared_wakes {
        store
    } else {
        setup.open_store().await
    };
    let (b, _) = start_with(&setup, other, &[]).await;
    let key = &keys[0];
    let session = a.session(key).await;
    let (id, _) = run(&a, key, &session).await;
    llm_asked(&llm, 1).await;

    // On B: one follower for the whole run; on A, one that reads two events and leaves.
    let mut whole = open_events(&b, key, &id, "", None).await;
    let whole = tokio::spawn(async move { read_events(&mut whole, None).await });
    let mut resp = open_events(&a, key, &id, "", None).await;
    let head = read_events(&mut resp, Some(2)).await;
    drop(resp);
    assert_eq!(head.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2]);
    // It comes back to B while the run is still in flight on A.
    let mut resp = open_events(&b, key, &id, "", Some("2")).await;
    let rest = tokio::spawn(async move { read_events(&mut resp, None).await });
    gate.open();
    run_in_state(&b, key, &id, "succeeded").await;
    let full = all_events(&a, key, &id).await;
    assert_eq!(
        full.last().map(|e| (e.1.as_str(), e.2["state"].clone())),
        Some(("run_state", serde_json::json!("succeeded")))
    );
    assert!(
        full.len() > 3,
        "events after the gate were followed live: {full:?}"
    );
    assert_eq!(
        whole.await.unwrap(),
        full,
        "B's follower: every event of the run driven on A, once each, in order"
    );
    let joined: Vec<Ev> = head.into_iter().chain(rest.await.unwrap()).collect();
    assert_eq!(
        joined, full,
        "A's head and B's resumed rest are the run, once each"
    );
    assert_eq!(all_events(&b, key, &id).await, full, "B reads the same log");
}

#[tokio::test]
async fn a_run_on_one_replica_is_followed_and_resumed_on_another_woken_by_the_store() {
    followed_across_replicas(true).await;
}

#[tokio::test]
async fn a_run_on_one_replica_is_followed_and_resumed_on_another_with_no_wake_up_at_all() {
    followed_across_replicas(false).await;
}
