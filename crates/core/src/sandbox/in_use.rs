//! When a session was last used, and whether it is in use now: the one clock every idle
//! check reads (the manager's reaper, with each session's own timeout, and its memory budget).
//!
//! A touch marks a moment of use; that is enough for a request that ends at once, but not
//! for a run or a tool call that lasts longer than the idle timeout (a run's bash step
//! sleeping, a run waiting for a human's answer or for the run before it). Those hold an
//! `InUse` for as long as they last: while any is held the session is not idle at all, and
//! its idle time counts from the moment the last one is released.

use std::ops::Deref;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::manager::Session;

/// A session's use: the last moment it was used and how many holders use it now.
pub(super) struct UseClock(Mutex<Clock>);

struct Clock {
    last_used: Instant,
    holders: usize,
}

impl UseClock {
    pub(super) fn new() -> Self {
        UseClock(Mutex::new(Clock {
            last_used: Instant::now(),
            holders: 0,
        }))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Clock) -> T) -> T {
        // Every update is one assignment, so a poisoned lock still holds a valid clock.
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c)
    }

    pub(super) fn touch(&self) {
        self.with(|c| c.last_used = Instant::now());
    }

    /// Zero while held; else the time since the last use.
    pub(super) fn idle_for(&self) -> Duration {
        self.with(|c| match c.holders {
            0 => c.last_used.elapsed(),
            _ => Duration::ZERO,
        })
    }

    /// Dates the last use `ago` back (a re-attached session's recorded last use). A time
    /// before the monotonic clock's start (the host booted since) cannot be expressed and
    /// counts as now: the session then gets one whole idle timeout, never less.
    pub(super) fn used_ago(&self, ago: Duration) {
        let now = Instant::now();
        self.with(|c| c.last_used = now.checked_sub(ago).unwrap_or(now));
    }

    fn hold(&self) {
        self.with(|c| c.holders += 1);
    }

    fn release(&self) {
        self.with(|c| {
            c.holders = c.holders.saturating_sub(1);
            c.last_used = Instant::now();
        });
    }
}

/// Holds a session in use until dropped: it is never idle meanwhile, and its idle time
/// starts again when the last holder lets go. `S` is `&Session` for a holder within one
/// call, `Arc<Session>` for one that outlives it (a streamed response).
pub struct InUse<S: Deref<Target = Session>>(S);

impl<S: Deref<Target = Session>> InUse<S> {
    pub fn new(session: S) -> Self {
        session.clock.hold();
        InUse(session)
    }
}

impl<S: Deref<Target = Session>> Drop for InUse<S> {
    fn drop(&mut self) {
        self.0.clock.release();
    }
}
