//! This process as a replica of the service: its id, and the lease it holds in the store's
//! replica registry (`store::Replicas`), renewed every third of `[server] lease_secs`.
//!
//! What a replica holds (the runs it drives) is its only while its lease is live by the
//! store's clock. A replica that cannot renew in time (the store unreachable, the process
//! stalled) must assume the others have taken over what it held: it is then *fenced*, and
//! stays fenced until a beat gets through again. The deadline is measured on this process's
//! monotonic clock from the moment a successful beat was *sent*, so a slow answer can only
//! make the replica fence itself early, never late.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandboxd_core::store::{Store, StoreError, new_replica_id};
use tokio::time::Instant;

/// This process's replica id and lease.
pub struct Replica {
    id: String,
    lease: Duration,
    /// Until when the last successful beat holds the lease (local monotonic clock).
    held_until: Mutex<Instant>,
    /// Set by `stop_beating`: the beat task skips its beats.
    silent: AtomicBool,
}

impl Replica {
    /// Registers a new replica with a first beat: a store that cannot take it fails the
    /// start, as any other store failure at start does.
    pub async fn register(store: &dyn Store, lease: Duration) -> Result<Arc<Self>, StoreError> {
        let lease = lease.max(Duration::from_secs(1));
        let replica = Arc::new(Self {
            id: new_replica_id(),
            lease,
            held_until: Mutex::new(Instant::now()),
            silent: AtomicBool::new(false),
        });
        replica.beat(store).await?;
        tracing::info!(replica = %replica.id, lease_secs = lease.as_secs(), "registered as a replica");
        Ok(replica)
    }

    /// This replica's id (`r-` and 12 hex digits), new at every start.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The lease `[server] lease_secs` gives.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Whether this replica's lease may have run out: it must not act on what it held.
    pub fn fenced(&self) -> bool {
        self.held_until
            .lock()
            .map(|until| Instant::now() >= *until)
            .unwrap_or(true)
    }

    /// Renews the lease once.
    async fn beat(&self, store: &dyn Store) -> Result<(), StoreError> {
        let sent = Instant::now();
        store
            .replica_beat(&self.id, self.lease.as_millis() as i64)
            .await?;
        if let Ok(mut until) = self.held_until.lock() {
            *until = (*until).max(sent + self.lease);
        }
        Ok(())
    }

    /// Renews the lease every third of it, until the task is aborted (after the runs have
    /// ended at shutdown: they need the lease to write their endings); then call `leave`.
    pub fn spawn_beats(self: &Arc<Self>, store: Arc<dyn Store>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let every = me.lease / 3;
            loop {
                tokio::time::sleep(every).await;
                if me.silent.load(Ordering::SeqCst) {
                    continue;
                }
                match crate::metrics::store_timed("lease_renew", me.beat(store.as_ref())).await {
                    Ok(()) => {}
                    Err(e) if me.fenced() => {
                        tracing::error!(replica = %me.id, error = %e, "the replica's lease ran out: it drives nothing until a beat gets through")
                    }
                    Err(e) => {
                        tracing::warn!(replica = %me.id, error = %e, "could not renew the replica's lease")
                    }
                }
            }
        })
    }

    /// Stops renewing the lease while the process lives on, as when the store is out of its
    /// reach: the replica is fenced once the lease runs out, and the others take over what it
    /// held. For tests of that case; nothing in serve calls it.
    pub fn stop_beating(&self) {
        self.silent.store(true, Ordering::SeqCst);
    }

    /// Leaves the registry (a graceful stop): the others need not wait out the lease.
    pub async fn leave(&self, store: &dyn Store) {
        if let Ok(mut until) = self.held_until.lock() {
            *until = Instant::now();
        }
        if let Err(e) = store.replica_leave(&self.id).await {
            tracing::warn!(replica = %self.id, error = %e, "could not leave the replica registry");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = sandboxd_sqlite::SqliteStore::open(&dir.path().join("s.db"))
            .await
            .expect("open the store");
        (dir, Arc::new(store))
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_stops_beating_is_fenced_after_its_lease() {
        let (_dir, store) = store().await;
        let replica = Replica::register(store.as_ref(), Duration::from_secs(3))
            .await
            .expect("register");
        assert!(replica.id().starts_with("r-") && replica.id().len() == 14);
        assert!(!replica.fenced(), "a fresh lease holds");
        tokio::time::advance(Duration::from_millis(2_900)).await;
        assert!(!replica.fenced(), "the lease holds until it runs out");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(replica.fenced(), "no beat for a whole lease: fenced");
        replica.beat(store.as_ref()).await.expect("beat");
        assert!(
            !replica.fenced(),
            "a beat that gets through lifts the fence"
        );
        assert_eq!(store.live_replicas().await.expect("live"), [replica.id()]);
    }

    // Real time: under a paused clock the checks would run ahead of a beat waiting on the
    // store's thread.
    #[tokio::test]
    async fn beats_keep_the_lease_and_leaving_ends_it() {
        let (_dir, store) = store().await;
        let replica = Replica::register(store.as_ref(), Duration::from_secs(3))
            .await
            .expect("register");
        let beats = replica.spawn_beats(store.clone());
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(!replica.fenced(), "the beats renew the lease in time");
        }
        beats.abort();
        replica.leave(store.as_ref()).await;
        assert!(replica.fenced(), "a replica that left holds nothing");
        assert!(store.live_replicas().await.expect("live").is_empty());
    }
}
