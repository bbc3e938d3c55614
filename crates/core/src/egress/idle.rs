//! The idle cut of an open connection: a tunnel or forwarded request that moved no byte
//! either way for `[egress] idle_secs` is closed.
//!
//! Without it a connection the sandbox forgot (a WebSocket of a page Chromium left, a
//! keep-alive nobody reuses) held one of the session's `[egress] connections` slots, and a
//! host-side socket, until the session ended.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::decide::{Refused, refused};

/// When a connection last moved a byte, and how long it may stay silent.
pub(crate) struct Idle {
    start: Instant,
    /// Milliseconds from `start` to the last byte either way.
    last_ms: AtomicU64,
    limit: Duration,
}

impl Idle {
    pub(crate) fn new(idle_secs: u64) -> Idle {
        Idle {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            // At least a second: a zero would cut every connection at once.
            limit: Duration::from_secs(idle_secs.max(1)),
        }
    }

    /// A byte moved (either way): the silence starts again.
    pub(crate) fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(now, Ordering::AcqRel);
    }

    /// Returns once the connection has been silent for the limit: the cut, for the record.
    pub(crate) async fn expired(&self) -> Refused {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Acquire));
            let due = self.start + last + self.limit;
            if Instant::now() >= due {
                return refused(
                    "idle",
                    format!(
                        "closed after {} s with no byte either way ([egress] idle_secs)",
                        self.limit.as_secs()
                    ),
                );
            }
            // Sleeps to the deadline as it stands; a byte meanwhile moves it, so look again.
            tokio::time::sleep_until(due).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn silence_for_the_limit_cuts_and_a_byte_restarts_it() {
        let idle = Idle::new(5);
        tokio::time::advance(Duration::from_secs(4)).await;
        idle.touch();
        let cut = tokio::time::timeout(Duration::from_millis(4900), idle.expired()).await;
        assert!(cut.is_err(), "a byte 4 s in gives it 5 s more");
        let cut = idle.expired().await;
        assert_eq!(cut.rule, "idle");
        assert!(cut.reason.contains("idle_secs"), "{}", cut.reason);
        assert!(Instant::now() >= idle.start + Duration::from_secs(9));
    }
}
