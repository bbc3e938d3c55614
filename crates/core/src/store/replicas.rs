//! The replica registry: every `serve` process on one store (a replica) records itself with a
//! lease it renews, by the store's clock, so that any replica can tell which others are alive.
//! What a replica holds (the runs it drives, its warm sandboxes, the shells it started) is
//! held only while its lease is live: a replica killed with `kill -9` stops renewing, and
//! after at most one lease the others treat everything it held as orphaned.
//!
//! The lease is measured by the store's clock (Postgres' `clock_timestamp()`, SQLite's host
//! clock), never by each replica's own: replicas on hosts whose clocks disagree still agree on
//! who is alive.

use async_trait::async_trait;

use super::StoreError;

/// The store's replica registry. Every method is one short transaction.
#[async_trait]
pub trait Replicas: Send + Sync {
    /// Records replica `id` alive until the store's clock reaches now + `lease_ms` (a first
    /// beat registers it); returns the store's clock, in unix milliseconds.
    async fn replica_beat(&self, id: &str, lease_ms: i64) -> Result<i64, StoreError>;
    /// Removes replica `id` (a graceful shutdown): its lease ends now.
    async fn replica_leave(&self, id: &str) -> Result<(), StoreError>;
    /// The ids of the replicas whose lease has not expired by the store's clock, sorted.
    async fn live_replicas(&self) -> Result<Vec<String>, StoreError>;
}

/// A new replica id: `r-` and 12 random hex digits (unique per process start, so a restarted
/// replica never inherits what its previous life held).
pub fn new_replica_id() -> String {
    format!("r-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}
