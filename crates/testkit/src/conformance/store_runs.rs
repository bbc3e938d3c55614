//! The store conformance cases of `RunControl`: how replicas on one store share runs. A
//! session's runs take turns in insert order (also when inserted concurrently), an event is
//! accepted only from the run's driver while its lease is live and the run is in flight, a
//! dead replica's runs go to exactly one of two replicas taking them over at once, and stop
//! requests (a cancel, a fail with its reason: the first one stands) and answers round-trip
//! through the row.

use std::collections::BTreeSet;

use anyhow::{Context, Result, anyhow, ensure};
use sandboxd_core::store::{
    RunPatch, RunScope, RunState, StopRequest, Store, StoreError, StoredQuestion, Turn, now_ms,
};

use super::store::{
    DRIVER, StoreFactory, add_user, drive, event, fresh, must_run, reserve, run_row,
};

/// Ends run `id` (driven by `DRIVER`, whose last seq is `last`) with the given state.
async fn end(store: &dyn Store, id: &str, last: u64, state: RunState) -> Result<()> {
    let patch = RunPatch {
        state: Some(state),
        ended_at: Some(now_ms()),
        ..Default::default()
    };
    store
        .append_event(id, DRIVER, event(last + 1, "run_state"), patch)
        .await
        .with_context(|| format!("end run {id}"))?;
    Ok(())
}

/// A replica whose lease has already run out (a lease of 1 ms, then a wait past it).
async fn dead_replica(store: &dyn Store, id: &str) -> Result<()> {
    store.replica_beat(id, 1).await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while store.live_replicas().await?.iter().any(|r| r == id) {
        ensure!(
            std::time::Instant::now() < deadline,
            "a 1 ms lease still lives"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    Ok(())
}

fn fenced<T>(r: Result<T, StoreError>) -> bool {
    matches!(r, Err(StoreError::Fenced { .. }))
}

pub(super) async fn case_run_order(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    reserve(&*store, "s1", &alice).await?;
    reserve(&*store, "s2", &alice).await?;
    for (id, session) in [("a", "s1"), ("b", "s1"), ("c", "s1"), ("d", "s2")] {
        store.insert_run(run_row(id, session, &alice), 10).await?;
    }
    let turn = |id: &'static str| {
        let store = store.clone();
        async move { store.run_turn(id, DRIVER).await }
    };
    ensure!(turn("a").await? == Turn::Go, "the session's first run goes");
    ensure!(
        turn("b").await? == Turn::After("a".into()),
        "the second waits for the first"
    );
    ensure!(
        turn("c").await? == Turn::After("a".into()),
        "the third waits for the earliest run in flight"
    );
    ensure!(
        turn("d").await? == Turn::Go,
        "another session's run does not wait"
    );
    end(&*store, "a", 0, RunState::Succeeded).await?;
    ensure!(turn("b").await? == Turn::Go, "the next goes once it ended");
    ensure!(
        turn("c").await? == Turn::After("b".into()),
        "in insert order"
    );
    ensure!(
        store.run_turn("b", "r-c0ffee000002").await? == Turn::Lost,
        "a replica that does not drive the run has no turn"
    );
    ensure!(turn("a").await? == Turn::Lost, "an ended run has no turn");
    ensure!(
        store.run_turn("nope", DRIVER).await? == Turn::Lost,
        "an unknown run has no turn"
    );

    // Inserted at once into one session (by two owners, as an admin's run in a user's
    // session is): exactly one goes, and the others wait in one chain.
    let admin = add_user(&*store, "root", 2).await?;
    reserve(&*store, "s3", &alice).await?;
    let inserts: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            let owner = if i % 2 == 0 {
                alice.clone()
            } else {
                admin.clone()
            };
            tokio::spawn(async move {
                store
                    .insert_run(run_row(&format!("q{i}"), "s3", &owner), 100)
                    .await
            })
        })
        .collect();
    for t in inserts {
        t.await??;
    }
    let mut first = Vec::new();
    let mut waits_for = BTreeSet::new();
    for i in 0..8 {
        match store.run_turn(&format!("q{i}"), DRIVER).await? {
            Turn::Go => first.push(i),
            Turn::After(other) => {
                waits_for.insert(other);
            }
            Turn::Lost => return Err(anyhow!("q{i} is in flight and driven: not lost")),
        }
    }
    ensure!(
        first.len() == 1 && waits_for.len() == 1,
        "one run goes, the others wait for it: {first:?} go, they wait for {waits_for:?}"
    );
    Ok(())
}

pub(super) async fn case_run_fencing(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    reserve(&*store, "s1", &alice).await?;
    store.insert_run(run_row("r1", "s1", &alice), 10).await?;
    let other = "r-c0ffee000002";
    store.replica_beat(other, 3_600_000).await?;
    let patch = RunPatch {
        add_input_tokens: 7,
        ..Default::default()
    };
    ensure!(
        fenced(
            store
                .append_event("r1", other, event(1, "step"), patch.clone())
                .await
        ),
        "a live replica that is not the run's driver is fenced out"
    );
    let r = must_run(&*store, "r1").await?;
    ensure!(
        r.last_seq == 0 && r.input_tokens == 0,
        "a fenced append changes nothing"
    );
    store
        .append_event("r1", DRIVER, event(1, "step"), patch)
        .await
        .context("the driver appends")?;

    // A driver whose lease ran out is fenced out of its own run.
    let gone = "r-c0ffee000003";
    store
        .insert_run(run_row("r2", "s1", &alice).with_driver(gone), 10)
        .await?;
    dead_replica(&*store, gone).await?;
    ensure!(
        fenced(
            store
                .append_event("r2", gone, event(1, "step"), RunPatch::default())
                .await
        ),
        "a driver whose lease expired is fenced out"
    );
    ensure!(
        store.events_after("r2", 0, 10).await?.is_empty(),
        "and wrote nothing"
    );

    // An ended run takes no more events, even from its driver.
    end(&*store, "r1", 1, RunState::Succeeded).await?;
    ensure!(
        fenced(
            store
                .append_event("r1", DRIVER, event(3, "late"), RunPatch::default())
                .await
        ),
        "an ended run takes no event"
    );
    ensure!(
        must_run(&*store, "r1").await?.last_seq == 2,
        "the ended run kept its events"
    );
    Ok(())
}

pub(super) async fn case_run_takeover(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    reserve(&*store, "s1", &alice).await?;
    let (a, b, dead) = ("r-c0ffee00000a", "r-c0ffee00000b", "r-c0ffee00000d");
    store.replica_beat(a, 3_600_000).await?;
    store.replica_beat(b, 3_600_000).await?;
    dead_replica(&*store, dead).await?;
    // A live replica's run, an ended run of the dead one, and one run from before drivers.
    store
        .insert_run(run_row("live", "s1", &alice).with_driver(a), 100)
        .await?;
    store
        .insert_run(run_row("ended", "s1", &alice), 100)
        .await?;
    end(&*store, "ended", 0, RunState::Succeeded).await?;
    let mut legacy = run_row("legacy", "s1", &alice);
    legacy.driver = None;
    store.insert_run(legacy, 100).await?;
    ensure!(
        store.take_over_orphans(dead).await?.is_empty(),
        "a dead replica takes nothing over"
    );

    let mut orphans: BTreeSet<String> = ["legacy".to_string()].into();
    for round in 0..5 {
        for i in 0..4 {
            let id = format!("o{round}{i}");
            let row = run_row(&id, "s1", &alice).with_driver(dead);
            store.insert_run(row, 100).await?;
            orphans.insert(id);
        }
        let (sa, sb) = (store.clone(), store.clone());
        let (ta, tb) = tokio::join!(
            tokio::spawn(async move { sa.take_over_orphans(a).await }),
            tokio::spawn(async move { sb.take_over_orphans(b).await })
        );
        let (ta, tb) = (ta??, tb??);
        let ids_a: BTreeSet<String> = ta.iter().map(|r| r.id.clone()).collect();
        let ids_b: BTreeSet<String> = tb.iter().map(|r| r.id.clone()).collect();
        ensure!(
            ids_a.is_disjoint(&ids_b),
            "round {round}: a run went to both replicas: {ids_a:?} and {ids_b:?}"
        );
        let taken: BTreeSet<String> = ids_a.union(&ids_b).cloned().collect();
        ensure!(
            taken == orphans,
            "round {round}: every orphan is taken once: {taken:?} of {orphans:?}"
        );
        ensure!(
            ta.iter().all(|r| r.driver.as_deref() == Some(a))
                && tb.iter().all(|r| r.driver.as_deref() == Some(b)),
            "the rows returned name their new driver"
        );
        // The new drivers end them; the dead one is fenced out of them.
        for r in ta.iter().chain(tb.iter()) {
            let me = r.driver.as_deref().unwrap_or_default();
            ensure!(
                fenced(
                    store
                        .append_event(&r.id, dead, event(r.last_seq + 1, "x"), RunPatch::default())
                        .await
                ),
                "the dead driver is fenced out of {}",
                r.id
            );
            let patch = RunPatch {
                state: Some(RunState::Interrupted),
                ..Default::default()
            };
            store
                .append_event(&r.id, me, event(r.last_seq + 1, "run_state"), patch)
                .await
                .with_context(|| format!("the new driver ends {}", r.id))?;
        }
        orphans.clear();
    }
    let live = must_run(&*store, "live").await?;
    ensure!(
        live.driver.as_deref() == Some(a) && !live.state.is_terminal(),
        "a live replica's run stays its own"
    );
    ensure!(
        must_run(&*store, "ended").await?.driver.as_deref() == Some(DRIVER),
        "an ended run is not taken over"
    );
    Ok(())
}

pub(super) async fn case_run_cancel_and_reply(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    let bob = add_user(&*store, "bob", 2).await?;
    reserve(&*store, "s1", &alice).await?;
    reserve(&*store, "s2", &alice).await?;
    reserve(&*store, "s3", &bob).await?;
    for (id, s, owner) in [
        ("r1", "s1", &alice),
        ("r2", "s1", &alice),
        ("r3", "s2", &alice),
        ("r4", "s3", &bob),
        ("done", "s2", &alice),
    ] {
        store.insert_run(run_row(id, s, owner), 10).await?;
    }
    end(&*store, "done", 0, RunState::Succeeded).await?;
    let cancel = |scope: RunScope, reason: String| {
        let store = store.clone();
        async move {
            let mut ids = store.request_cancel(scope, &reason).await?;
            ids.sort();
            Ok::<_, StoreError>(ids)
        }
    };
    let user = StopRequest::Cancel.to_column();
    ensure!(
        cancel(RunScope::Run("r1".into()), user.clone()).await? == ["r1"],
        "one run"
    );
    ensure!(
        must_run(&*store, "r1").await?.stop_request() == Some(StopRequest::Cancel),
        "the request is in the row"
    );
    ensure!(
        must_run(&*store, "r2").await?.cancel.is_none(),
        "and only in that run's"
    );
    // A fail request (its session's sandbox went) keeps its reason whole, and is the one
    // that stands when a cancel follows it (serve ends the row after failing its runs).
    let why = "its sandbox was evicted: The node was low on resource: memory.";
    let fail = StopRequest::Fail(why.into());
    ensure!(
        cancel(RunScope::Session("s1".into()), fail.to_column()).await? == ["r1", "r2"],
        "a session's runs in flight"
    );
    ensure!(
        must_run(&*store, "r1").await?.stop_request() == Some(StopRequest::Cancel),
        "the first request stands"
    );
    ensure!(
        must_run(&*store, "r2").await?.stop_request() == Some(fail.clone()),
        "a fail request is kept with its reason"
    );
    ensure!(
        cancel(RunScope::Owner(alice.clone()), user).await? == ["r1", "r2", "r3"],
        "an owner's runs in flight, not an ended one nor another owner's"
    );
    ensure!(
        must_run(&*store, "r2").await?.stop_request() == Some(fail),
        "a cancel after a fail request leaves the fail"
    );
    ensure!(
        must_run(&*store, "r4").await?.cancel.is_none(),
        "another owner's run is untouched"
    );

    // An answer goes only to a pending question, once; the driver's next question event
    // (answered or a new question) takes it out of the row.
    ensure!(
        store.post_reply("r4", "early").await?.is_none(),
        "no question: no answer"
    );
    let ask = |at: i64| RunPatch {
        state: Some(RunState::WaitingForHuman),
        question: Some(Some(StoredQuestion {
            text: "which?".into(),
            asked_at: at,
            expires_at: at + 60_000,
        })),
        ..Default::default()
    };
    let t = now_ms();
    store
        .append_event("r4", DRIVER, event(1, "question_asked"), ask(t))
        .await?;
    ensure!(
        store.post_reply("r4", "blue").await? == Some(1),
        "the answer is left, at the run's last seq"
    );
    ensure!(
        store.post_reply("r4", "red").await?.is_none(),
        "a second answer to the same question is refused"
    );
    ensure!(
        must_run(&*store, "r4").await?.reply.as_deref() == Some("blue"),
        "the first answer stands"
    );
    let answered = RunPatch {
        state: Some(RunState::Running),
        question: Some(None),
        ..Default::default()
    };
    store
        .append_event("r4", DRIVER, event(2, "question_answered"), answered)
        .await?;
    let r = must_run(&*store, "r4").await?;
    ensure!(
        r.reply.is_none() && r.question.is_none(),
        "taking the answer clears it with the question"
    );

    store
        .append_event("r4", DRIVER, event(3, "question_asked"), ask(t + 1))
        .await?;
    ensure!(store.post_reply("r4", "b").await? == Some(3), "asked again");
    ensure!(
        !store.withdraw_reply("r4", "a").await?,
        "only the answer posted is taken back"
    );
    ensure!(
        store.withdraw_reply("r4", "b").await?,
        "an answer not taken is taken back"
    );
    ensure!(
        must_run(&*store, "r4").await?.reply.is_none(),
        "and is gone"
    );
    ensure!(
        store.post_reply("r4", "c").await? == Some(3),
        "the question can be answered again"
    );
    store
        .append_event("r4", DRIVER, event(4, "question_asked"), ask(t + 2))
        .await?;
    ensure!(
        must_run(&*store, "r4").await?.reply.is_none(),
        "a new question drops an answer to the one before"
    );
    Ok(())
}

/// The cases above, for the suite's list.
pub(super) async fn all(f: &dyn StoreFactory) -> Result<()> {
    use super::run_case;
    const S: &str = "store";
    run_case(S, "case_run_order", case_run_order(f)).await?;
    run_case(S, "case_run_fencing", case_run_fencing(f)).await?;
    run_case(S, "case_run_takeover", case_run_takeover(f)).await?;
    run_case(S, "case_run_cancel_and_reply", case_run_cancel_and_reply(f)).await?;
    Ok(())
}
