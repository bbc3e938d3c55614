//! PgStore's one-statement event append (`sandboxd_append_event`, schema_v8.sql) on a real
//! PostgreSQL: every field of a patch lands in its own column (the function takes 17
//! positional arguments, so a swapped pair would show here), each refusal is the error the
//! separate statements gave (the no-run `Sql`, `Fenced` before the seq check, `Corrupt` for the
//! seq) and changes nothing, and hostile values (a seq at u64::MAX, quotes, a NUL byte) are
//! refused or stored as given, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod support;

use sandboxd_core::store::{
    Replicas, RunControl, RunPatch, RunRow, RunState, SessionRow, Store, StoreError, StoredEvent,
    StoredQuestion, now_ms,
};
use sandboxd_postgres::PgStore;

const DRIVER: &str = "r-a";

fn event(seq: u64, kind: &str, payload: &str) -> StoredEvent {
    StoredEvent {
        seq,
        time: 1_700_000_000_000 + seq as i64,
        kind: kind.into(),
        payload: payload.into(),
    }
}

/// A store with run `r1` in flight, driven by `DRIVER` under a live lease.
async fn store_with_run(dbs: &support::Databases) -> PgStore {
    let (_, url) = dbs.create().await;
    let store = PgStore::open(&url).await.unwrap();
    let now = now_ms();
    let session = SessionRow::creating("s1", "u1", Default::default(), Default::default(), 60, now);
    store.reserve_session(session, 4).await.unwrap();
    store.replica_beat(DRIVER, 3_600_000).await.unwrap();
    let row = RunRow::queued("r1", "s1", "u1", "task", "agent", None, now).with_driver(DRIVER);
    store.insert_run(row, 4).await.unwrap();
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_of_the_patch_lands_in_its_column() {
    let Some(admin) = support::admin_url() else {
        return;
    };
    let dbs = support::Databases::new(admin);
    let store = store_with_run(&dbs).await;
    let question = StoredQuestion {
        text: "which 'colour'?".into(),
        asked_at: 11,
        expires_at: 22,
    };
    let first = RunPatch {
        state: Some(RunState::WaitingForHuman),
        steps: Some(3),
        add_input_tokens: 7,
        add_output_tokens: 5,
        question: Some(Some(question.clone())),
        started_at: Some(100),
        ..Default::default()
    };
    let payload = r#"{"type":"question_asked","text":"it's \"quoted\""}"#;
    store
        .append_event("r1", DRIVER, event(1, "question_asked", payload), first)
        .await
        .unwrap();
    let r = store.run("r1").await.unwrap().unwrap();
    assert_eq!(r.state, RunState::WaitingForHuman);
    assert_eq!((r.steps, r.input_tokens, r.output_tokens), (3, 7, 5));
    assert_eq!(r.question, Some(question));
    assert_eq!((r.started_at, r.ended_at, r.last_seq), (Some(100), None, 1));
    assert_eq!(store.post_reply("r1", "blue").await.unwrap(), Some(1));

    let outcome = serde_json::json!({"kind": "answered", "steps": 4});
    let last = RunPatch {
        state: Some(RunState::Succeeded),
        outcome: Some(outcome.clone()),
        answer: Some("blue it is".into()),
        steps: Some(4),
        add_input_tokens: 1,
        add_output_tokens: 2,
        question: Some(None),
        started_at: Some(999),
        ended_at: Some(200),
        count_owner_tokens: true,
    };
    let appended = store
        .append_event("r1", DRIVER, event(2, "run_finished", "{}"), last)
        .await
        .unwrap();
    assert_eq!(
        appended.owner_tokens_today,
        Some(1),
        "the owner's day counts the event's input tokens"
    );
    let r = store.run("r1").await.unwrap().unwrap();
    assert_eq!(r.state, RunState::Succeeded);
    assert_eq!(r.outcome, Some(outcome));
    assert_eq!(r.answer.as_deref(), Some("blue it is"));
    assert_eq!((r.steps, r.input_tokens, r.output_tokens), (4, 8, 7));
    assert_eq!(r.question, None, "Some(None) clears the question");
    assert_eq!(
        r.reply, None,
        "clearing the question clears the posted reply"
    );
    assert_eq!(r.started_at, Some(100), "the first start stands");
    assert_eq!((r.ended_at, r.last_seq), (Some(200), 2));
    let evs = store.events_after("r1", 0, 10).await.unwrap();
    assert_eq!(evs[0], event(1, "question_asked", payload));
    assert_eq!(evs[1], event(2, "run_finished", "{}"));
    drop(store);
    dbs.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_is_the_error_it_was_and_changes_nothing() {
    let Some(admin) = support::admin_url() else {
        return;
    };
    let dbs = support::Databases::new(admin);
    let store = store_with_run(&dbs).await;
    let spend = || RunPatch {
        add_input_tokens: 100,
        state: Some(RunState::Failed),
        ..Default::default()
    };
    store
        .append_event("r1", DRIVER, event(1, "step", "{}"), RunPatch::default())
        .await
        .unwrap();

    match store
        .append_event("nope", DRIVER, event(1, "x", "{}"), spend())
        .await
    {
        Err(StoreError::Sql(m)) => assert_eq!(m, "no run nope to append to"),
        other => panic!("an unknown run: {other:?}"),
    }
    for (seq, after) in [(1, 1), (3, 1), (u64::MAX, 1)] {
        match store
            .append_event("r1", DRIVER, event(seq, "dup", "{}"), spend())
            .await
        {
            Err(StoreError::Corrupt { what, message }) => {
                assert_eq!(what, "event sequence");
                assert_eq!(message, format!("run r1: seq {seq} after {after}"));
            }
            other => panic!("seq {seq} after {after}: {other:?}"),
        }
    }
    // The fence is checked before the seq, as the separate statements did: a replica that
    // does not drive the run is told so whatever seq it sends.
    for seq in [2, 9] {
        match store
            .append_event("r1", "r-b", event(seq, "x", "{}"), spend())
            .await
        {
            Err(StoreError::Fenced { run_id, driver }) => {
                assert_eq!((run_id.as_str(), driver.as_str()), ("r1", "r-b"));
            }
            other => panic!("another replica's append: {other:?}"),
        }
    }
    // The driver's lease ended: fenced too.
    store.replica_leave(DRIVER).await.unwrap();
    assert!(matches!(
        store
            .append_event("r1", DRIVER, event(2, "x", "{}"), spend())
            .await,
        Err(StoreError::Fenced { .. })
    ));
    // A NUL byte is refused by Postgres's TEXT: an error, not a panic, and nothing changes.
    store.replica_beat(DRIVER, 3_600_000).await.unwrap();
    assert!(matches!(
        store
            .append_event("r1", DRIVER, event(2, "x", "a\0b"), spend())
            .await,
        Err(StoreError::Sql(_))
    ));

    let r = store.run("r1").await.unwrap().unwrap();
    assert_eq!(
        (r.last_seq, r.input_tokens),
        (1, 0),
        "no refusal applied its patch"
    );
    assert_eq!(r.state, RunState::Queued);
    assert_eq!(store.events_after("r1", 0, 10).await.unwrap().len(), 1);
    // And the run goes on from where it was.
    store
        .append_event("r1", DRIVER, event(2, "step", "{}"), RunPatch::default())
        .await
        .unwrap();
    drop(store);
    dbs.drop_all().await;
}
