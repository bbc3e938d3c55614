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
use sandboxd_core::store::{RunState, Store, StoredEvent};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::Replica;
    use crate::runs::journal::Journal;
    use sandboxd_core::agent::EventKind;
    use sandboxd_core::store::{RunPatch, RunRow, SessionRow, now_ms};
    use sandboxd_sqlite::SqliteStore;

    /// The replica the test runs are driven by.
    const DRIVER: &str = "r-0123456789ab";

    async fn store_with_run(dir: &std::path::Path) -> Arc<dyn Store> {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("s.db")).await.unwrap());
        let now = now_ms();
        store.replica_beat(DRIVER, 3_600_000).await.unwrap();
        store
            .reserve_session(
                SessionRow::creating("ses", "u", Default::default(), Default::default(), 60, now),
                4,
            )
            .await
            .unwrap();
        store
            .insert_run(
                RunRow::queued("run-1", "ses", "u", "t", "agent", None, now).with_driver(DRIVER),
                2,
            )
            .await
            .unwrap();
        store
    }

    async fn replica(store: &Arc<dyn Store>) -> Arc<Replica> {
        Replica::register(store.as_ref(), Duration::from_secs(60))
            .await
            .unwrap()
    }

    fn note(i: usize) -> EventKind {
        EventKind::Notice {
            message: format!("n{i}"),
        }
    }

    /// A follower far behind the bounded broadcast (it lags) re-reads the store and gets
    /// every event exactly once, in order, then ends at the terminal run_state.
    #[tokio::test]
    async fn a_lagging_follower_rereads_the_store_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        let journal = Journal::new(store.clone(), "run-1".into(), 0, DRIVER.into());
        let runs = RunService::new(
            store.clone(),
            Err("none".into()),
            Duration::from_secs(1),
            replica(&store).await,
        );
        let mut f = Follower::new(
            store.clone(),
            runs,
            "run-1".into(),
            0,
            true,
            CancellationToken::new(),
        );
        f.rx = Some(journal.subscribe());
        journal.emit(note(0), RunPatch::default()).await.unwrap();
        assert_eq!(f.next().await.map(|e| e.seq), Some(1));
        // The follower is not reading while the run emits more than the broadcast holds.
        let n = 600;
        for i in 1..n {
            journal.emit(note(i), RunPatch::default()).await.unwrap();
        }
        let end = RunPatch {
            state: Some(RunState::Succeeded),
            ..Default::default()
        };
        journal
            .emit(
                EventKind::RunState {
                    state: "succeeded".into(),
                },
                end,
            )
            .await
            .unwrap();
        assert_eq!(f.wait_live().await, Some(()));
        assert!(f.buf.is_empty(), "it lagged: nothing live was queued");
        let mut seqs = vec![1];
        while let Some(e) = f.next().await {
            seqs.push(e.seq);
        }
        assert_eq!(seqs, (1..=n as u64 + 1).collect::<Vec<_>>());
        let row = store.run("run-1").await.unwrap().unwrap();
        assert_eq!(row.last_seq, n as u64 + 1);

        // From the middle, without following.
        let runs = RunService::new(
            store.clone(),
            Err("none".into()),
            Duration::from_secs(1),
            replica(&store).await,
        );
        let mut f = Follower::new(
            store.clone(),
            runs,
            "run-1".into(),
            590,
            false,
            CancellationToken::new(),
        );
        let mut seqs = Vec::new();
        while let Some(e) = f.next().await {
            seqs.push(e.seq);
        }
        assert_eq!(seqs, (591..=601).collect::<Vec<_>>());
    }

    /// The store refuses an event out of sequence, counts the run quota, and keeps the
    /// conversation, images and the day's tokens.
    #[tokio::test]
    async fn the_store_keeps_runs_in_sequence_and_within_quota() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        let ev = |seq| sandboxd_core::store::StoredEvent {
            seq,
            time: now_ms(),
            kind: "notice".into(),
            payload: "{}".into(),
        };
        store
            .append_event("run-1", DRIVER, ev(1), RunPatch::default())
            .await
            .unwrap();
        assert!(
            store
                .append_event("run-1", DRIVER, ev(3), RunPatch::default())
                .await
                .is_err()
        );
        assert!(
            store
                .append_event("run-1", DRIVER, ev(1), RunPatch::default())
                .await
                .is_err()
        );
        let mut second = store.run("run-1").await.unwrap().unwrap();
        second.id = "run-2".into();
        store.insert_run(second.clone(), 2).await.unwrap();
        second.id = "run-3".into();
        assert!(matches!(
            store.insert_run(second, 2).await,
            Err(sandboxd_core::store::StoreError::RunQuota {
                limit: 2,
                active: 2
            })
        ));
        store
            .set_conversation("ses", "[1]".into(), now_ms())
            .await
            .unwrap();
        assert_eq!(
            store.conversation("ses").await.unwrap().as_deref(),
            Some("[1]")
        );
        store
            .put_image("run-1", "sha256:ab", "image/png", vec![1, 2])
            .await
            .unwrap();
        assert_eq!(
            store.image("run-1", "sha256:ab").await.unwrap(),
            Some(("image/png".to_string(), vec![1, 2]))
        );
        assert!(store.image("run-2", "sha256:ab").await.unwrap().is_none());
        assert_eq!(store.add_input_tokens("u", 10, now_ms()).await.unwrap(), 10);
        assert_eq!(store.add_input_tokens("u", 5, now_ms()).await.unwrap(), 15);
        assert_eq!(
            store.usage("u", now_ms()).await.unwrap().input_tokens_today,
            15
        );
        assert_eq!(store.runs_in_flight().await.unwrap().len(), 2);
    }

    /// The runs of a replica that is gone are taken over and end `interrupted` after their
    /// kept events; a live replica's are left alone.
    #[tokio::test]
    async fn a_gone_replicas_runs_end_interrupted_after_their_kept_events() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        let note = sandboxd_core::store::StoredEvent {
            seq: 1,
            time: now_ms(),
            kind: "notice".into(),
            payload: "{}".into(),
        };
        store
            .append_event("run-1", DRIVER, note, RunPatch::default())
            .await
            .unwrap();
        let mut second = store.run("run-1").await.unwrap().unwrap();
        second.id = "run-2".into();
        store.insert_run(second, 2).await.unwrap();
        let me = replica(&store).await;
        assert!(
            RunService::interrupt_orphans(&store, me.id())
                .await
                .unwrap()
                .is_empty(),
            "runs of a live replica are not orphans"
        );
        store.replica_leave(DRIVER).await.unwrap();
        let interrupted = RunService::interrupt_orphans(&store, me.id())
            .await
            .unwrap();
        assert_eq!(interrupted, vec!["run-1".to_string(), "run-2".to_string()]);
        let row = store.run("run-1").await.unwrap().unwrap();
        assert_eq!(row.state, RunState::Interrupted);
        assert_eq!(
            row.last_seq, 3,
            "run_finished and run_state after the kept event"
        );
        let evs = store.events_after("run-1", 0, 10).await.unwrap();
        assert_eq!(
            evs.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
            ["notice", "run_finished", "run_state"]
        );
    }
}
