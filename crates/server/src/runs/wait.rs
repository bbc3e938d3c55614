//! The one way the runs service waits for a change in the store: a run's turn in its
//! session, a cancel request or an answer for a run this replica drives, the ending of a run
//! another replica drives. The store's rows are the truth; a wake-up (`Store::run_wakes`,
//! sent after every event's commit, and in its control form by `wake` after a cancel request
//! or an answer) is only a hint to re-read them sooner, and every wait re-reads at least every
//! `POLL` anyway, so a change whose wake-up was lost is still seen within `POLL`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{Receiver, error::RecvError};
use tokio::time::Instant;

use sandboxd_core::store::{Store, Wake};

/// The longest a wait goes without re-reading the store.
pub const POLL: Duration = Duration::from_millis(250);

pub struct Wakes {
    store: Arc<dyn Store>,
}

impl Wakes {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }

    /// A receiver of wake-ups; take it before reading the store, so no change between the
    /// read and the wait is missed.
    pub fn subscribe(&self) -> Receiver<String> {
        self.store.run_wakes()
    }

    /// Tells the waiters on every replica that run `run_id`'s row changed without an event
    /// (a cancel request, an answer). A lost wake-up only delays them by a poll.
    pub async fn wake(&self, run_id: &str) {
        if let Err(e) = self.store.wake_run(run_id).await {
            tracing::debug!(run = %run_id, error = %e, "cannot send a run's wake-up");
        }
    }

    /// Returns after a wake-up `which` accepts (or one that says re-read all), or after
    /// `within`, at most `POLL`.
    pub async fn changed(
        &self,
        rx: &mut Receiver<String>,
        within: Duration,
        which: impl Fn(Wake<'_>) -> bool,
    ) {
        let sleep = tokio::time::sleep(within.min(POLL));
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => return,
                got = rx.recv() => match got {
                    Ok(p) if matches!(Wake::parse(&p), Wake::All) || which(Wake::parse(&p)) => return,
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => return,
                    Err(RecvError::Closed) => {
                        (&mut sleep).await;
                        return;
                    }
                },
            }
        }
    }

    /// Re-reads with `check` until it gives a value (returned) or `bound` passes (None; a
    /// bound too far to represent is none); at once after a wake-up of either kind about a
    /// run `which` accepts.
    pub async fn until<T, F, Fut>(
        &self,
        bound: Duration,
        which: impl Fn(&str) -> bool,
        mut check: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Instant::now().checked_add(bound);
        let mut rx = self.subscribe();
        loop {
            if let Some(v) = check().await {
                return Some(v);
            }
            let left = deadline.map_or(POLL, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return None;
            }
            let about = |w: Wake<'_>| match w {
                Wake::All => true,
                Wake::Event(id) | Wake::Control(id) => which(id),
            };
            self.changed(&mut rx, left, about).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use sandboxd_sqlite::SqliteStore;

    /// A wake-up about the run waited for ends the wait at once; others do not; without one
    /// the store is re-read every `POLL`, and the wait gives up at its bound.
    #[tokio::test(start_paused = true)]
    async fn a_wait_rereads_on_its_wake_ups_and_every_poll_until_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("s.db")).await.unwrap());
        let wakes = Arc::new(Wakes::new(store));
        let reads = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let counted = reads.clone();
        let got = wakes
            .until(
                Duration::from_secs(1),
                |id| id == "run-a",
                || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async { None::<()> }
                },
            )
            .await;
        assert_eq!(got, None);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(
            reads.load(Ordering::SeqCst),
            5,
            "a read at 0 and every 250 ms"
        );

        let (w, flag) = (wakes.clone(), Arc::new(AtomicU32::new(0)));
        let f = flag.clone();
        let waiter = tokio::spawn(async move {
            w.until(
                Duration::from_secs(60),
                |id| id == "run-a",
                || {
                    let v = f.load(Ordering::SeqCst);
                    async move { (v == 1).then_some(Instant::now()) }
                },
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let set_at = Instant::now();
        flag.store(1, Ordering::SeqCst);
        wakes.wake("run-b").await;
        wakes.wake("run-a").await;
        let seen = waiter.await.unwrap().unwrap();
        assert_eq!(
            seen, set_at,
            "the wake-up about run-a ended the wait at once"
        );
    }
}
