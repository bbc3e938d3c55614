//! The store conformance cases for the replica registry (`Replicas`): a beat makes a replica
//! live until its lease runs out by the store's clock, a later beat extends it, a lease of
//! zero is already over, leaving ends it at once and touches nobody else, the clock a beat
//! returns is the store's now, and the registry outlives a restart.

use std::time::Duration;

use anyhow::{Result, ensure};
use sandboxd_core::store::now_ms;

use super::store::{StoreFactory, fresh};

/// Longer than any pause between a beat and the check after it, on a loaded machine.
const LONG: i64 = 600_000;

pub(super) async fn case_replica_leases(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    ensure!(
        store.live_replicas().await?.is_empty(),
        "a fresh store has no live replica"
    );
    let before = now_ms();
    let clock = store.replica_beat("r-a", LONG).await?;
    // Same host in the suite: the store's clock and ours agree to within a loaded second.
    ensure!(
        (clock - before).abs() < 5_000,
        "a beat returns the store's clock (got {clock}, ours was {before})"
    );
    store.replica_beat("r-b", LONG).await?;
    ensure!(
        store.live_replicas().await? == ["r-a", "r-b"],
        "both beating replicas are live, sorted"
    );
    // A lease of zero ends as it is given: r-b is no longer live, r-a untouched.
    store.replica_beat("r-b", 0).await?;
    ensure!(
        store.live_replicas().await? == ["r-a"],
        "a replica whose lease ran out is not live"
    );
    // A short lease is live, then runs out by itself.
    store.replica_beat("r-c", 300).await?;
    ensure!(
        store.live_replicas().await?.contains(&"r-c".to_string()),
        "a replica is live within its lease"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    ensure!(
        store.live_replicas().await? == ["r-a"],
        "a lease that was not renewed runs out"
    );
    // A beat after the lease ran out makes the replica live again (a replica that lost its
    // lease learns it from its own fence, not from the registry refusing it).
    store.replica_beat("r-c", LONG).await?;
    store.replica_leave("r-a").await?;
    ensure!(
        store.live_replicas().await? == ["r-c"],
        "leaving ends that replica's lease at once and no other"
    );
    store.replica_leave("r-nobody").await?;
    Ok(())
}

pub(super) async fn case_replicas_restart(f: &dyn StoreFactory) -> Result<()> {
    let (store, name) = f.fresh().await?;
    store.replica_beat("r-kept", LONG).await?;
    drop(store);
    let store = f.reopen(&name).await?;
    ensure!(
        store.live_replicas().await? == ["r-kept"],
        "a replica's lease outlives the store's restart"
    );
    Ok(())
}
