//! The store conformance case for run wake-ups (`Store::run_wakes`, `Store::wake_run`): every
//! receiver made before an event's append gets the run's id after it, within a bounded wait,
//! and a reader woken by it finds the event (the wake-up follows the commit); a refused append
//! wakes nobody; `wake_run` reaches every receiver, in its control form (`control_wake`,
//! which only a run's driver acts on). `WAKE_ALL` ("re-read everything", sent
//! when a store's listener reconnects) may come at any time and is skipped here.
//!
//! Wake-ups across processes (Postgres NOTIFY between replicas, its listener's reconnect) are
//! the Postgres crate's own tests: a second handle of a SQLite file is not woken by design.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use sandboxd_core::store::{RunPatch, WAKE_ALL, Wake, control_wake};
use tokio::sync::broadcast::{Receiver, error::TryRecvError};

use super::store::{DRIVER, StoreFactory, add_user, drive, event, fresh, reserve, run_row};

/// How long a wake-up may take to arrive (Postgres: a NOTIFY's round trip).
const WAIT: Duration = Duration::from_secs(10);

/// The next wake-up that is not `WAKE_ALL`, within `WAIT`.
async fn next_wake(rx: &mut Receiver<String>) -> Result<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| anyhow!("no wake-up within {WAIT:?}"))?;
        match got {
            Ok(id) if id == WAKE_ALL => {}
            Ok(id) => return Ok(id),
            Err(e) => bail!("the wake-ups failed: {e}"),
        }
    }
}

pub(super) async fn case_run_wakes(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    reserve(&*store, "s1", &alice).await?;
    store.insert_run(run_row("r1", "s1", &alice), 10).await?;
    store.insert_run(run_row("r2", "s1", &alice), 10).await?;
    let mut rx = store.run_wakes();
    let mut other = store.run_wakes();

    for seq in 1..=3 {
        store
            .append_event("r1", DRIVER, event(seq, "step"), RunPatch::default())
            .await
            .with_context(|| format!("append seq {seq}"))?;
        let id = next_wake(&mut rx).await.context("after an append")?;
        ensure!(id == "r1", "the append of r1 wakes r1, not {id:?}");
        let seen = store.events_after("r1", seq - 1, 10).await?;
        ensure!(
            seen.first().map(|e| e.seq) == Some(seq),
            "a reader woken by seq {seq}'s wake-up finds it: {seen:?}"
        );
        let id = next_wake(&mut other).await.context("a second receiver")?;
        ensure!(id == "r1", "every receiver is woken, got {id:?}");
    }
    store
        .append_event("r2", DRIVER, event(1, "other"), RunPatch::default())
        .await?;
    ensure!(
        next_wake(&mut rx).await? == "r2",
        "another run's append wakes that run"
    );

    // A refused append (a repeated seq) commits nothing and wakes nobody: the next wake-up
    // is the marker sent after it.
    ensure!(
        store
            .append_event("r1", DRIVER, event(3, "dup"), RunPatch::default())
            .await
            .is_err(),
        "a repeated seq is refused"
    );
    store.wake_run("r-marker").await.context("wake_run")?;
    let marker = control_wake("r-marker");
    ensure!(
        next_wake(&mut rx).await? == marker,
        "a refused append sends no wake-up; wake_run reaches the receiver, in its control form"
    );
    ensure!(
        next_wake(&mut other).await? == "r2",
        "r2's wake-up, in order"
    );
    ensure!(
        next_wake(&mut other).await? == marker,
        "wake_run reaches every receiver"
    );
    ensure!(
        Wake::parse(&marker) == Wake::Control("r-marker") && Wake::parse("r1") == Wake::Event("r1"),
        "an append's wake-up is an event's, wake_run's a control one"
    );
    match rx.try_recv() {
        Ok(id) if id != WAKE_ALL => bail!("an unexpected wake-up {id:?}"),
        Ok(_) | Err(TryRecvError::Empty) => {}
        Err(e) => bail!("the wake-ups failed: {e}"),
    }
    Ok(())
}
