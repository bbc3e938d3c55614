//! Store conformance cases of sessions shared by several replicas (issue 22): the global
//! session cap counted with the per-owner one under concurrent writers, the conditional idle
//! end that exactly one of several reapers wins, a new idle timeout it follows, and the
//! holders a replica records on the sessions it attaches.

use std::collections::BTreeMap;

use anyhow::{Context, Result, anyhow, ensure};
use sandboxd_core::config::Limits;
use sandboxd_core::store::{
    RunPatch, RunRow, RunState, SessionCaps, SessionRow, SessionState, Store, StoreError, now_ms,
};

use super::store::{StoreFactory, add_user, fresh};

fn row(id: &str, owner: &str, idle_secs: u64, now: i64) -> SessionRow {
    SessionRow::creating(
        id,
        owner,
        Limits::default(),
        BTreeMap::new(),
        idle_secs,
        now,
    )
}

fn caps(per_owner: u32, total: u32, holder: Option<&str>) -> SessionCaps {
    SessionCaps {
        per_owner,
        total,
        holder: holder.map(str::to_string),
    }
}

async fn state_of(store: &dyn Store, id: &str) -> Result<SessionState> {
    Ok(store
        .session(id)
        .await?
        .ok_or_else(|| anyhow!("session {id} is missing"))?
        .state)
}

/// 24 concurrent creates by four owners (8 each, a per-owner cap of 4) against a global cap
/// of 5: exactly 5 get in, no owner above 4; the refused ones are `SessionsFull` or
/// `SessionQuota` and leave no row; an ended session frees a global place.
pub(super) async fn case_global_session_cap(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let mut owners = Vec::new();
    for (i, name) in ["ann", "bob", "cid", "dee"].iter().enumerate() {
        owners.push(add_user(&*store, name, i as u8 + 1).await?);
    }
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let (store, owner) = (store.clone(), owners[i % 4].clone());
            tokio::spawn(async move {
                let r = row(&format!("g{i}"), &owner, 60, now_ms());
                (
                    owner,
                    store.reserve_session_within(r, caps(4, 5, None)).await,
                )
            })
        })
        .collect();
    let mut ok: BTreeMap<String, u32> = BTreeMap::new();
    for t in tasks {
        match t.await? {
            (owner, Ok(())) => *ok.entry(owner).or_default() += 1,
            (_, Err(StoreError::SessionsFull { limit: 5, .. }))
            | (_, Err(StoreError::SessionQuota { limit: 4, .. })) => {}
            (_, Err(e)) => return Err(anyhow!("a concurrent create failed otherwise: {e}")),
        }
    }
    let total: u32 = ok.values().sum();
    ensure!(total == 5, "the global cap of 5 let {total} in: {ok:?}");
    ensure!(
        ok.values().all(|n| *n <= 4),
        "an owner passed its cap: {ok:?}"
    );
    ensure!(
        store.active_sessions().await?.len() == 5,
        "refused creates leave no row"
    );
    let over = store
        .reserve_session_within(row("g99", &owners[0], 60, now_ms()), caps(100, 5, None))
        .await;
    ensure!(
        matches!(
            over,
            Err(StoreError::SessionsFull {
                limit: 5,
                active: 5
            })
        ),
        "a sixth session over the global cap is SessionsFull, got {over:?}"
    );
    let first = store.active_sessions().await?[0].id.clone();
    store.end_session(&first, "deleted", now_ms()).await?;
    store
        .reserve_session_within(row("g98", &owners[0], 60, now_ms()), caps(100, 5, None))
        .await
        .context("an ended session frees a place under the global cap")?;
    Ok(())
}

/// The idle end happens only for a running session idle past its own timeout with no run in
/// flight, and of eight concurrent reapers exactly one ends it.
pub(super) async fn case_idle_end_once(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let ann = add_user(&*store, "ann", 1).await?;
    let t0 = now_ms();
    store.reserve_session(row("i0", &ann, 10, t0), 10).await?;
    ensure!(
        store
            .end_idle_session("rt-i0", "idle", t0 + 60_000)
            .await?
            .is_none(),
        "a session still being created (no runtime id yet) is not ended idle"
    );
    store.session_started("i0", "rt-i0", "c-i0").await?;
    ensure!(
        store
            .end_idle_session("rt-i0", "idle", t0 + 9_999)
            .await?
            .is_none(),
        "a session used less than its timeout ago is not ended"
    );
    store.touch_session("i0", t0 + 5_000).await?;
    ensure!(
        store
            .end_idle_session("rt-i0", "idle", t0 + 14_999)
            .await?
            .is_none(),
        "a use recorded meanwhile keeps the session"
    );
    store.insert_run(run_row("ri0", "i0", &ann), 5).await?;
    ensure!(
        store
            .end_idle_session("rt-i0", "idle", t0 + 60_000)
            .await?
            .is_none(),
        "a session with a run in flight is not ended idle"
    );
    let done = RunPatch {
        state: Some(RunState::Succeeded),
        ended_at: Some(t0 + 1),
        ..Default::default()
    };
    store.patch_run("ri0", done).await?;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .end_idle_session("rt-i0", "idle for more than 10 s", t0 + 60_000)
                    .await
            })
        })
        .collect();
    let mut won = Vec::new();
    for t in tasks {
        won.extend(t.await??);
    }
    ensure!(
        won == ["i0"],
        "exactly one of 8 concurrent reapers ended the session, naming its row: {won:?}"
    );
    let ended = store
        .session("i0")
        .await?
        .ok_or_else(|| anyhow!("session i0 is missing"))?;
    ensure!(
        ended.state == SessionState::Ended
            && ended.end_reason.as_deref() == Some("idle for more than 10 s"),
        "the idle end records its reason: {ended:?}"
    );
    ensure!(
        store
            .end_idle_session("rt-i0", "again", t0 + 90_000)
            .await?
            .is_none(),
        "an ended session is not ended again"
    );
    Ok(())
}

/// A new idle timeout (E2B's set timeout): only for a running session; it counts from the
/// time given (an earlier one never moves the last use back), longer or shorter than the
/// one the session was made with, and the idle end follows it.
pub(super) async fn case_set_idle_timeout(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let ann = add_user(&*store, "ann", 1).await?;
    let t0 = now_ms();
    store.reserve_session(row("t0", &ann, 10, t0), 10).await?;
    ensure!(
        !store.set_idle_timeout("t0", 60, t0).await?,
        "a session still being created gets no new timeout"
    );
    ensure!(
        !store.set_idle_timeout("no-such", 60, t0).await?,
        "an unknown session gets no new timeout"
    );
    store.session_started("t0", "rt-t0", "c-t0").await?;
    ensure!(
        store.set_idle_timeout("t0", 60, t0 + 5_000).await?,
        "a running session's timeout is set"
    );
    let r = store
        .session("t0")
        .await?
        .ok_or_else(|| anyhow!("session t0 is missing"))?;
    ensure!(
        r.idle_timeout_secs == 60 && r.last_used_at == t0 + 5_000,
        "a longer timeout, counted from the time given: {r:?}"
    );
    ensure!(
        store
            .end_idle_session("rt-t0", "idle", t0 + 30_000)
            .await?
            .is_none(),
        "the longer timeout keeps the session past the one it was made with"
    );
    ensure!(
        store.set_idle_timeout("t0", 2, t0 + 1_000).await?,
        "a shorter one is set too"
    );
    let r = store
        .session("t0")
        .await?
        .ok_or_else(|| anyhow!("session t0 is missing"))?;
    ensure!(
        r.idle_timeout_secs == 2 && r.last_used_at == t0 + 5_000,
        "an earlier time does not move the last use back: {r:?}"
    );
    ensure!(
        store.end_idle_session("rt-t0", "idle", t0 + 7_000).await? == Some("t0".to_string()),
        "the idle end follows the shorter timeout, and names the row it ended"
    );
    ensure!(
        !store.set_idle_timeout("t0", 60, t0 + 8_000).await?,
        "an ended session gets no new timeout"
    );
    Ok(())
}

/// Holders: recorded by the reservation and by `add_session_holder` (idempotently), listed
/// only for sessions that have not ended, forgotten by `remove_session_holders`.
pub(super) async fn case_session_holders(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let ann = add_user(&*store, "ann", 1).await?;
    let now = now_ms();
    store
        .reserve_session_within(row("h0", &ann, 60, now), caps(10, 10, Some("r-a")))
        .await?;
    store.reserve_session(row("h1", &ann, 60, now), 10).await?;
    store.add_session_holder("h0", "r-b").await?;
    store.add_session_holder("h0", "r-b").await?;
    store.add_session_holder("h1", "r-b").await?;
    store
        .add_session_holder("nope", "r-b")
        .await
        .context("a holder of a missing session is no error")?;
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    let held = store.session_holders().await?;
    ensure!(
        held == pairs(&[("h0", "r-a"), ("h0", "r-b"), ("h1", "r-b")]),
        "the holders recorded: {held:?}"
    );
    store
        .remove_session_holders("h0", &["r-a".to_string()])
        .await?;
    store.end_session("h1", "deleted", now).await?;
    let held = store.session_holders().await?;
    ensure!(
        held == pairs(&[("h0", "r-b")]),
        "a removed holder and an ended session's holders are not listed: {held:?}"
    );
    ensure!(
        state_of(&*store, "h0").await? == SessionState::Creating,
        "untouched"
    );
    Ok(())
}

fn run_row(id: &str, session: &str, owner: &str) -> RunRow {
    RunRow::queued(id, session, owner, "a task", "agent", Some(5), now_ms())
}
