//! The listener of `sandboxd serve`: accepts connections and serves each with hyper's HTTP/1
//! server (`conn`), under three bounds that keep strangers from holding the service:
//!
//! - a header timeout and an idle timeout per connection (`conn` has the rules): a client
//!   that sends half a request and stalls, or keeps a connection open with nothing in it, is
//!   closed; a request in flight (an event stream, a long exec) is never cut by them;
//! - a cap on open connections (`[server] max_connections`, at most half the open-file limit,
//!   `nofile`). At the cap, the connection that has waited longest without a request in
//!   flight is closed to make room for the new one, so a flood of stalled connections cannot
//!   keep /healthz or a real client out; when every connection carries a request, the new
//!   one is closed at once. Either way the process never holds more than the cap (plus the
//!   one being accepted), so descriptors are left for Docker and the store.
//! - an accept error (out of descriptors after all, or memory) backs off briefly instead of
//!   spinning, and is logged at most every few seconds, as are closings at the cap.
//!
//! Shutdown: the token stops the accept loop; each connection closes once its request in
//! flight has been answered (idle ones at once), and `serve` returns when all have; the
//! caller bounds that wait by `[server] drain_secs`.

mod conn;
pub mod nofile;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use conn::Timeouts;
use conn::{Activity, Ended};

use crate::ServerConfig;

/// How long a new connection waits for the one closed for it to let go of its slot.
const EVICTION_WAIT: Duration = Duration::from_secs(1);
/// Back-off after a failed accept (out of descriptors or memory): the failure is not the
/// client's, and retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The least time between two warnings of one kind (a flood must not flood the log).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The bounds of the listener.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub timeouts: Timeouts,
    pub max_connections: usize,
}

impl Bounds {
    /// The configured bounds, the cap lowered to fit the open-file limit `nofile`.
    pub fn new(s: &ServerConfig, nofile: Option<u64>) -> Bounds {
        Bounds {
            timeouts: Timeouts {
                header: Duration::from_secs(s.header_timeout_secs.max(1)),
                idle: Duration::from_secs(s.idle_timeout_secs.max(1)),
            },
            max_connections: nofile::connection_cap(s.max_connections, nofile),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled and every connection has ended.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Slots::new(bounds.max_connections));
    let tasks = TaskTracker::new();
    let mut full = Warning::new();
    let mut evicted = Warning::new();
    let mut failed = Warning::new();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.cancelled() => break,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                accept_failed(e, &mut failed).await;
                continue;
            }
        };
        let slot = match slots.admit().await {
            Admitted::Free(slot) => slot,
            Admitted::Evicted(slot) => {
                if let Some(n) = evicted.due() {
                    tracing::warn!(
                        max_connections = bounds.max_connections,
                        closed = n,
                        "at the connection cap: closed the connections that waited longest without a request to make room ([server] max_connections)"
                    );
                }
                slot
            }
            Admitted::Full => {
                if let Some(n) = full.due() {
                    tracing::warn!(
                        max_connections = bounds.max_connections,
                        refused = n,
                        "at the connection cap with a request in flight on every connection: new connections are closed ([server] max_connections)"
                    );
                }
                continue;
            }
        };
        // TCP_NODELAY: SSE events and streamed output are small writes; with Nagle each waits
        // for the previous one's (delayed, up to 40 ms) ACK.
        let _ = tcp.set_nodelay(true);
        let (router, shutdown) = (router.clone(), shutdown.clone());
        tasks.spawn(async move {
            let activity = slot.activity.clone();
            let ended = conn::serve(tcp, peer, router, activity, bounds.timeouts, shutdown).await;
            if ended == Ended::TimedOut {
                tracing::debug!(%peer, "closed a connection that sent no request in time");
            }
            drop(slot);
        });
    }
    drop(listener);
    tasks.close();
    tasks.wait().await;
}

/// An accept that failed: the connection's own trouble (reset before we took it) is
/// nothing; anything else (EMFILE, ENFILE, ENOMEM) is logged and waited out a little.
async fn accept_failed(e: std::io::Error, warning: &mut Warning) {
    use std::io::ErrorKind::*;
    if matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted) {
        return;
    }
    if let Some(n) = warning.due() {
        tracing::warn!(error = %e, failures = n, "cannot accept connections");
    }
    tokio::time::sleep(ACCEPT_BACKOFF).await;
}

/// The open connections: a permit each, and what each is doing (to pick one to close).
struct Slots {
    permits: Arc<Semaphore>,
    open: Mutex<HashMap<u64, Arc<Activity>>>,
    next: AtomicU64,
}

/// A connection's place; dropping it frees the place.
struct Slot {
    id: u64,
    slots: Arc<Slots>,
    activity: Arc<Activity>,
    _permit: OwnedSemaphorePermit,
}

enum Admitted {
    Free(Slot),
    /// Another connection was closed for this one.
    Evicted(Slot),
    /// Every connection carries a request: the new one is closed.
    Full,
}

impl Slots {
    fn new(max: usize) -> Slots {
        Slots {
            permits: Arc::new(Semaphore::new(max.clamp(1, Semaphore::MAX_PERMITS))),
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }

    async fn admit(self: &Arc<Self>) -> Admitted {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Admitted::Free(self.slot(permit));
        }
        let Some(victim) = self.longest_waiting() else {
            return Admitted::Full;
        };
        victim.evict.cancel();
        match tokio::time::timeout(EVICTION_WAIT, self.permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Admitted::Evicted(self.slot(permit)),
            _ => Admitted::Full,
        }
    }

    fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let activity = Activity::new();
        self.lock().insert(id, activity.clone());
        Slot {
            id,
            slots: self.clone(),
            activity,
            _permit: permit,
        }
    }

    /// The connection without a request in flight that has waited longest, not already
    /// being closed.
    fn longest_waiting(&self) -> Option<Arc<Activity>> {
        let open = self.lock();
        open.values()
            .filter(|a| !a.evict.is_cancelled())
            .filter_map(|a| a.waiting_since().map(|since| (since, a)))
            .min_by_key(|(since, _)| *since)
            .map(|(_, a)| a.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Activity>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().remove(&self.id);
    }
}

/// A warning said at most every `WARN_EVERY`, with how many times it happened meanwhile.
struct Warning {
    last: Option<Instant>,
    count: u64,
}

impl Warning {
    fn new() -> Warning {
        Warning {
            last: None,
            count: 0,
        }
    }

    /// Counts one occurrence; `Some(count)` when it is time to say so.
    fn due(&mut self) -> Option<u64> {
        self.count += 1;
        let now = Instant::now();
        if self.last.is_some_and(|t| now < t + WARN_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_longest_waiting_idle_connection_makes_room() {
        let slots = Arc::new(Slots::new(2));
        let Admitted::Free(old) = slots.admit().await else {
            panic!("a free slot")
        };
        tokio::time::advance(Duration::from_secs(1)).await;
        let Admitted::Free(busy) = slots.admit().await else {
            panic!("a free slot")
        };
        let _request = busy.activity.begin();
        // The third evicts `old` (waiting, the longest), never `busy` (a request in flight).
        let (third, _) = tokio::join!(slots.admit(), async {
            old.activity.evict.cancelled().await;
            drop(old);
        });
        let Admitted::Evicted(third) = third else {
            panic!("room made")
        };
        assert!(!busy.activity.evict.is_cancelled());
        // Now `third` waits and `busy` is busy: the next takes `third`'s place.
        let (fourth, _) = tokio::join!(slots.admit(), async {
            third.activity.evict.cancelled().await;
            drop(third);
        });
        assert!(matches!(fourth, Admitted::Evicted(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_with_every_connection_busy_the_new_one_is_refused() {
        let slots = Arc::new(Slots::new(1));
        let Admitted::Free(busy) = slots.admit().await else {
            panic!("a free slot")
        };
        let _request = busy.activity.begin();
        assert!(matches!(slots.admit().await, Admitted::Full));
        assert!(!busy.activity.evict.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_warning_is_said_once_per_interval_with_the_count() {
        let mut w = Warning::new();
        assert_eq!(w.due(), Some(1));
        assert_eq!(w.due(), None);
        assert_eq!(w.due(), None);
        tokio::time::advance(WARN_EVERY).await;
        assert_eq!(w.due(), Some(3));
    }
}
