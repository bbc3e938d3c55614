//! The store conformance case of the daily token count in an event's append
//! (`RunPatch::count_owner_tokens`): a model answer's `token_usage` event adds its input
//! tokens to the run's counters and to the run owner's count of the event's UTC day in one
//! write, and reports the day's new total (`Appended`), which the service compares with the
//! daily quota. Both stores must count the same: per owner across runs, per day by the
//! event's time, nothing for a refused append or a patch outside an event, one counter with
//! `add_input_tokens`, and nothing lost when appends of one owner's runs race.

use anyhow::{Context, Result, ensure};
use sandboxd_core::store::{Appended, RunPatch, Store, StoreError, StoredEvent};

use super::store::{DRIVER, StoreFactory, add_user, drive, fresh, must_run, reserve, run_row};

/// A day in unix milliseconds.
const DAY_MS: i64 = 86_400_000;

/// An event at time `t`.
fn event_at(seq: u64, t: i64) -> StoredEvent {
    StoredEvent {
        seq,
        time: t,
        kind: "token_usage".into(),
        payload: format!(r#"{{"type":"token_usage","seq":{seq}}}"#),
    }
}

/// A patch that adds `tokens` input tokens to the run, counted for its owner or not.
fn tokens(tokens: u64, count: bool) -> RunPatch {
    RunPatch {
        add_input_tokens: tokens,
        add_output_tokens: 1,
        count_owner_tokens: count,
        ..Default::default()
    }
}

/// Appends to run `id` as its driver; what the store reported.
async fn append(
    store: &dyn Store,
    id: &str,
    seq: u64,
    t: i64,
    patch: RunPatch,
) -> Result<Appended, StoreError> {
    store
        .append_event(id, DRIVER, event_at(seq, t), patch)
        .await
}

async fn today(store: &dyn Store, owner: &str, t: i64) -> Result<u64> {
    Ok(store.usage(owner, t).await?.input_tokens_today)
}

pub(super) async fn case_owner_tokens_in_append(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    let bob = add_user(&*store, "bob", 2).await?;
    reserve(&*store, "s1", &alice).await?;
    reserve(&*store, "s2", &bob).await?;
    for (id, session, owner) in [
        ("r1", "s1", &alice),
        ("r2", "s1", &alice),
        ("b1", "s2", &bob),
    ] {
        store.insert_run(run_row(id, session, owner), 100).await?;
    }
    // One instant for every event and read, so no case straddles a UTC midnight.
    let t = sandboxd_core::store::now_ms();

    let got = append(&*store, "r1", 1, t, tokens(100, true)).await?;
    ensure!(
        got.owner_tokens_today == Some(100),
        "a counted append reports the owner's day: {got:?}"
    );
    let got = append(&*store, "r1", 2, t, tokens(30, false)).await?;
    ensure!(
        got.owner_tokens_today.is_none(),
        "an append that does not count reports nothing: {got:?}"
    );
    let r1 = must_run(&*store, "r1").await?;
    ensure!(
        (r1.input_tokens, r1.output_tokens) == (130, 2),
        "the run counts its tokens either way: {} in, {} out",
        r1.input_tokens,
        r1.output_tokens
    );
    ensure!(
        today(&*store, &alice, t).await? == 100,
        "only the counted 100"
    );

    let got = append(&*store, "r2", 1, t, tokens(50, true)).await?;
    ensure!(
        got.owner_tokens_today == Some(150),
        "the owner's count spans their runs: {got:?}"
    );
    let got = append(&*store, "b1", 1, t, tokens(7, true)).await?;
    ensure!(
        got.owner_tokens_today == Some(7),
        "another owner counts apart: {got:?}"
    );

    // Refused appends count nothing: a repeated seq, a replica that is not the driver.
    let dup = append(&*store, "r1", 2, t, tokens(1000, true)).await;
    ensure!(dup.is_err(), "a repeated seq is refused: {dup:?}");
    let other = "r-c0ffee000002";
    store.replica_beat(other, 3_600_000).await?;
    let fenced = store
        .append_event("r1", other, event_at(3, t), tokens(1000, true))
        .await;
    ensure!(
        matches!(fenced, Err(StoreError::Fenced { .. })),
        "another replica is fenced out: {fenced:?}"
    );
    ensure!(
        today(&*store, &alice, t).await? == 150,
        "a refused append counts nothing"
    );

    // The day is the event's; a patch outside an event never counts.
    let got = append(&*store, "r1", 3, t + DAY_MS, tokens(5, true)).await?;
    ensure!(
        got.owner_tokens_today == Some(5),
        "the next UTC day starts from zero: {got:?}"
    );
    ensure!(
        today(&*store, &alice, t + DAY_MS).await? == 5,
        "the next day's 5"
    );
    store
        .patch_run("r2", tokens(9, true))
        .await
        .context("patch_run")?;
    ensure!(
        must_run(&*store, "r2").await?.input_tokens == 59,
        "patch_run adds to the run"
    );
    ensure!(
        today(&*store, &alice, t).await? == 150,
        "patch_run does not count for the owner"
    );

    // One counter with `add_input_tokens`; a count of 0 reports the day as it is.
    ensure!(store.add_input_tokens(&alice, 10, t).await? == 160, "160");
    let got = append(&*store, "r2", 2, t, tokens(0, true)).await?;
    ensure!(
        got.owner_tokens_today == Some(160),
        "a count of 0 reports the day's total: {got:?}"
    );
    racing_appends(&store, &alice, t).await
}

/// Eight runs of one owner append a counted event each at once: every append reports a
/// different total, and the last total is all of them added up.
async fn racing_appends(store: &std::sync::Arc<dyn Store>, alice: &str, t: i64) -> Result<()> {
    let before = today(&**store, alice, t).await?;
    for i in 0..8 {
        store
            .insert_run(run_row(&format!("w{i}"), "s1", alice), 100)
            .await?;
    }
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(
                async move { append(&*store, &format!("w{i}"), 1, t, tokens(3, true)).await },
            )
        })
        .collect();
    let mut totals = Vec::new();
    for task in tasks {
        let got = task.await.context("an appending task")??;
        totals.push(got.owner_tokens_today.context("a counted append reports")?);
    }
    totals.sort_unstable();
    let expected: Vec<u64> = (1..=8).map(|k| before + 3 * k).collect();
    ensure!(
        totals == expected,
        "racing appends serialise on the owner's day: {totals:?}, expected {expected:?}"
    );
    ensure!(
        today(&**store, alice, t).await? == before + 24,
        "nothing lost"
    );
    Ok(())
}
