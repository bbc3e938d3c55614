//! Following a run's events: replayed from the store after a given seq, then live from the
//! run's broadcast, each exactly once and in order, until the run's terminal `run_state` (or
//! shutdown, or the client leaving).
//!
//! The follower subscribes to the broadcast before it reads the store, so nothing committed
//! between the two is missed; what both deliver is dropped by seq. A follower that lags
//! behind the bounded broadcast, or sees a gap, reads the store again from its last seq.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use super::RunService;
use crate::store::{RunState, Store, StoredEvent};

/// Events read from the store at once.
const PAGE: u32 = 256;
/// How often a follower of a run that is in flight but not in this process looks again.
const POLL: Duration = Duration::from_secs(1);

pub struct Follower {
    store: Arc<dyn Store>,
    runs: Arc<RunService>,
    run_id: String,
    last: u64,
    follow: bool,
    shutdown: CancellationToken,
    buf: VecDeque<StoredEvent>,
    rx: Option<broadcast::Receiver<Arc<StoredEvent>>>,
    done: bool,
}

/// Whether the event is the run's last: its terminal `run_state`.
fn is_last(e: &StoredEvent) -> bool {
    if e.kind != "run_state" {
        return false;
    }
    serde_json::from_str::<serde_json::Value>(&e.payload)
        .ok()
        .and_then(|v| v.get("state")?.as_str().and_then(RunState::parse))
        .is_some_and(RunState::is_terminal)
}

impl Follower {
    pub fn new(
        store: Arc<dyn Store>,
        runs: Arc<RunService>,
        run_id: String,
        after: u64,
        follow: bool,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            runs,
            run_id,
            last: after,
            follow,
            shutdown,
            buf: VecDeque::new(),
            rx: None,
            done: false,
        }
    }

    /// The next event, or None when the stream is over.
    pub async fn next(&mut self) -> Option<StoredEvent> {
        loop {
            if let Some(e) = self.buf.pop_front() {
                if e.seq != self.last + 1 {
                    // Out of step (cannot happen from the store): read again.
                    self.buf.clear();
                    continue;
                }
                self.last = e.seq;
                if is_last(&e) {
                    self.done = true;
                }
                return Some(e);
            }
            if self.done || self.shutdown.is_cancelled() {
                return None;
            }
            if self.follow && self.rx.is_none() {
                self.rx = self.runs.live(&self.run_id).map(|l| l.journal.subscribe());
            }
            match self.store.events_after(&self.run_id, self.last, PAGE).await {
                Ok(batch) if !batch.is_empty() => {
                    self.buf.extend(batch);
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(run = %self.run_id, error = %e, "cannot read the run's events");
                    return None;
                }
            }
            if !self.follow {
                return None;
            }
            match self.store.run(&self.run_id).await {
                Ok(Some(row)) if row.state.is_terminal() && self.last >= row.last_seq => {
                    return None;
                }
                Ok(Some(_)) => {}
                _ => return None,
            }
            self.wait_live().await?;
        }
    }

    /// Waits for the next live event (queued in `buf`), a lag or gap (then the store is read
    /// again), or the end of the broadcast. None on shutdown.
    async fn wait_live(&mut self) -> Option<()> {
        let Some(rx) = self.rx.as_mut() else {
            tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                _ = tokio::time::sleep(POLL) => return Some(()),
            }
        };
        loop {
            let got = tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                r = rx.recv() => r,
            };
            match got {
                Ok(e) if e.seq <= self.last => continue,
                Ok(e) if e.seq == self.last + 1 => {
                    self.buf.push_back((*e).clone());
                    return Some(());
                }
                Ok(_) | Err(RecvError::Lagged(_)) => return Some(()),
                Err(RecvError::Closed) => {
                    self.rx = None;
                    return Some(());
                }
            }
        }
    }
}
