//! A run's journal: numbers its events and commits each to the store (with the change it
//! brings to the run's row, in one transaction). One lock around number-and-commit keeps the
//! seqs of one run gap-free and in order. Followers read the store, woken by the store's own
//! wake-up after each commit (stream.rs), so a follower on any replica sees the same log.
//! Every commit names the replica that drives the run: the store refuses it
//! (`StoreError::Fenced`) unless that replica is the run's driver and its lease is live.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Mutex;

use sandboxd_core::agent::{Event, EventKind};
use sandboxd_core::store::{Appended, RunPatch, Store, StoreError, StoredEvent, now_ms};

pub struct Journal {
    store: Arc<dyn Store>,
    run_id: String,
    /// The replica whose events these are (the run's driver).
    driver: String,
    started: Instant,
    last: Mutex<u64>,
}

impl Journal {
    /// `last` is the run's last committed seq (0 for a new run); `driver` the replica that
    /// drives it (this one).
    pub fn new(store: Arc<dyn Store>, run_id: String, last: u64, driver: String) -> Self {
        Self {
            store,
            run_id,
            driver,
            started: Instant::now(),
            last: Mutex::new(last),
        }
    }

    /// The run's last committed seq (waits for a commit in progress).
    pub async fn last(&self) -> u64 {
        *self.last.lock().await
    }

    /// A new event of the service's own (run_state, question_asked …).
    pub async fn emit(&self, kind: EventKind, patch: RunPatch) -> Result<u64, StoreError> {
        let event = Event {
            run_id: self.run_id.clone(),
            seq: 0,
            at: String::new(),
            elapsed_ms: 0,
            kind,
        };
        Ok(self.commit(event, patch).await?.0)
    }

    /// Commits an event of the engine (agent or flow), renumbered into the run's sequence:
    /// a plan's step runs and the service's own events share one numbering. Returns its seq
    /// and what the store reported (the owner's tokens of the day, when the patch counted).
    pub async fn commit(
        &self,
        mut event: Event,
        patch: RunPatch,
    ) -> Result<(u64, Appended), StoreError> {
        let mut last = self.last.lock().await;
        event.seq = *last + 1;
        event.run_id = self.run_id.clone();
        event.at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        event.elapsed_ms = self.started.elapsed().as_millis() as u64;
        let stored = stored_event(&event)?;
        let appended = self
            .store
            .append_event(&self.run_id, &self.driver, stored, patch)
            .await?;
        *last = event.seq;
        Ok((event.seq, appended))
    }
}

/// The store's form of an event: its type and its one-line JSON.
pub fn stored_event(event: &Event) -> Result<StoredEvent, StoreError> {
    let value = serde_json::to_value(event).map_err(|e| StoreError::Sql(e.to_string()))?;
    let kind = value
        .get("type")
        .and_then(|t| t.as_str())
        .unwrap_or("unknown")
        .to_string();
    Ok(StoredEvent {
        seq: event.seq,
        time: now_ms(),
        kind,
        payload: value.to_string(),
    })
}
