//! Following a run's events, on any replica, wherever the run is driven: the events table is
//! the log and its seq the SSE `id`. The follower reads the store after the last seq it sent,
//! then waits for the store's wake-up about this run (Postgres: NOTIFY from whichever replica
//! committed; SQLite: in process), or `WAKE_ALL`, or a short re-read timeout, and reads again,
//! until the run's terminal `run_state` (or shutdown, or the client leaving).
//!
//! A wake-up is only a hint: one lost (a listener reconnecting, a receiver lagging) costs at
//! most `REREAD` of latency, never an event, because only the table is read. The follower
//! subscribes to the wake-ups before its first read, so a commit after that read always wakes
//! it. Each event is sent once and in order: only seq `last + 1` is taken. `next` may be
//! dropped at any await and called again (it is cancel-safe): nothing read is lost.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use sandboxd_core::store::{RunState, Store, StoredEvent, Woken, wait_for_run};

/// Events read from the store at once.
const PAGE: u32 = 256;
/// How long a follower waits for a wake-up before it reads the store anyway (a wake-up may be
/// lost): the latency bound when one is.
const REREAD: Duration = Duration::from_secs(1);

pub struct Follower {
    store: Arc<dyn Store>,
    run_id: String,
    last: u64,
    follow: bool,
    shutdown: CancellationToken,
    buf: VecDeque<StoredEvent>,
    wakes: Option<broadcast::Receiver<String>>,
    reread: Duration,
    done: bool,
    /// The last read returned less than a page: nothing more was committed when it ran.
    at_tail: bool,
    /// The last wait ended with a wake-up (about this run, or re-read all), not a timeout.
    woken: bool,
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
    /// The run's events after seq `after`; with `follow`, live until the run ends.
    pub fn new(
        store: Arc<dyn Store>,
        run_id: String,
        after: u64,
        follow: bool,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            run_id,
            last: after,
            follow,
            shutdown,
            buf: VecDeque::new(),
            wakes: None,
            reread: REREAD,
            done: false,
            at_tail: false,
            woken: false,
        }
    }

    /// The next event, or None when the stream is over.
    pub async fn next(&mut self) -> Option<StoredEvent> {
        loop {
            if let Some(e) = self.buf.pop_front() {
                if e.seq != self.last + 1 {
                    // Out of step (cannot happen from the store): read again.
                    self.buf.clear();
                    self.at_tail = false;
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
            if self.follow && self.wakes.is_none() {
                // Before the read: whatever commits after it wakes this receiver.
                self.wakes = Some(self.store.run_wakes());
            }
            // The last read reached the tail after the subscription, so the next commit wakes
            // us: wait, not read the events and the run again (two round trips per event on
            // Postgres). A run ended without an event is seen by the read after its wake-up.
            // `at_tail` stays set until the wait ends: a caller that drops this future
            // mid-wait (the SSE body, for a text delta) comes back to the wait, not a read.
            if !self.at_tail {
                match self.store.events_after(&self.run_id, self.last, PAGE).await {
                    Ok(batch) if !batch.is_empty() => {
                        self.at_tail = self.follow && batch.len() < PAGE as usize;
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
                // A run that ended without a terminal event after `last` (a resume past its
                // end, a deleted run). Not after a wake-up that found nothing new: its event
                // came in an earlier read (a run's events come faster than a read), and an
                // end is an event; the first read and every timeout still look.
                if !std::mem::take(&mut self.woken) {
                    match self.store.run(&self.run_id).await {
                        Ok(Some(row)) if row.state.is_terminal() && self.last >= row.last_seq => {
                            return None;
                        }
                        Ok(Some(_)) => {}
                        _ => return None,
                    }
                }
            }
            let wakes = self.wakes.as_mut()?;
            tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                w = wait_for_run(wakes, &self.run_id, self.reread) => self.woken = w == Woken::Run,
            }
            self.at_tail = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::Replica;
    use crate::runs::RunService;
    use crate::runs::journal::Journal;
    use sandboxd_core::agent::EventKind;
    use sandboxd_core::store::{RunPatch, RunRow, RunWakes, SessionRow, now_ms};
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

    fn note(i: usize) -> EventKind {
        EventKind::Notice {
            message: format!("n{i}"),
        }
    }

    async fn end(journal: &Journal) {
        let end = RunPatch {
            state: Some(RunState::Succeeded),
            ..Default::default()
        };
        let kind = EventKind::RunState {
            state: "succeeded".into(),
        };
        journal.emit(kind, end).await.unwrap();
    }

    async fn rest(f: &mut Follower) -> Vec<u64> {
        let mut seqs = Vec::new();
        while let Some(e) = f.next().await {
            seqs.push(e.seq);
        }
        seqs
    }

    fn follower(store: &Arc<dyn Store>, after: u64, follow: bool) -> Follower {
        let shutdown = CancellationToken::new();
        Follower::new(store.clone(), "run-1".into(), after, follow, shutdown)
    }

    /// A follower whose wake-ups lag (it was sent more than the channel holds, none of them
    /// about its run) reads the store again and gets every event exactly once, in order,
    /// then ends at the terminal run_state; one that does not follow reads from the middle to
    /// the end.
    #[tokio::test]
    async fn a_follower_whose_wake_ups_lag_rereads_the_store_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        let journal = Journal::new(store.clone(), "run-1".into(), 0, DRIVER.into());
        journal.emit(note(0), RunPatch::default()).await.unwrap();
        // Its own wake-ups, which hear nothing of this run; the re-read timeout is an hour,
        // so only the lag can end its wait.
        let wakes = RunWakes::new();
        let mut f = follower(&store, 0, true);
        f.wakes = Some(wakes.subscribe());
        f.reread = Duration::from_secs(3600);
        assert_eq!(f.next().await.map(|e| e.seq), Some(1));
        let reader = tokio::spawn(async move { rest(&mut f).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let n = 300;
        for i in 1..n {
            journal.emit(note(i), RunPatch::default()).await.unwrap();
        }
        end(&journal).await;
        for _ in 0..2000 {
            wakes.send("run-other");
        }
        let seqs = tokio::time::timeout(Duration::from_secs(30), reader)
            .await
            .expect("the lag woke the follower")
            .unwrap();
        assert_eq!(seqs, (2..=n as u64 + 1).collect::<Vec<_>>());
        let row = store.run("run-1").await.unwrap().unwrap();
        assert_eq!(row.last_seq, n as u64 + 1);

        let mut f = follower(&store, 290, false);
        assert_eq!(rest(&mut f).await, (291..=301).collect::<Vec<_>>());
    }

    /// A follower waiting for more is woken by the store's wake-up after the commit, not by
    /// its re-read timeout (made an hour here, so only the wake-up can end the wait).
    #[tokio::test]
    async fn a_waiting_follower_is_woken_by_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        let journal = Journal::new(store.clone(), "run-1".into(), 0, DRIVER.into());
        journal.emit(note(0), RunPatch::default()).await.unwrap();
        let mut f = follower(&store, 0, true);
        f.reread = Duration::from_secs(3600);
        assert_eq!(f.next().await.map(|e| e.seq), Some(1));
        let waiting = tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..2 {
                got.push(f.next().await.map(|e| e.seq));
            }
            got
        });
        // Another run's commit does not end the wait, this run's does.
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.wake_run("run-other").await.unwrap();
        journal.emit(note(1), RunPatch::default()).await.unwrap();
        end(&journal).await;
        let got = tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("woken by the commits")
            .unwrap();
        assert_eq!(got, [Some(2), Some(3)]);
    }

    /// A follower that hears no wake-up at all (every notification lost) still gets every
    /// event, once and in order, by re-reading on its timeout: the table is the truth.
    #[tokio::test]
    async fn a_follower_that_hears_nothing_still_gets_every_event() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        let journal = Journal::new(store.clone(), "run-1".into(), 0, DRIVER.into());
        let silent = RunWakes::new();
        let mut f = follower(&store, 0, true);
        f.wakes = Some(silent.subscribe());
        f.reread = Duration::from_millis(100);
        let reader = tokio::spawn(async move { rest(&mut f).await });
        for i in 0..5 {
            journal.emit(note(i), RunPatch::default()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        end(&journal).await;
        let seqs = tokio::time::timeout(Duration::from_secs(30), reader)
            .await
            .expect("the re-reads found the end")
            .unwrap();
        assert_eq!(seqs, (1..=6).collect::<Vec<_>>());
        drop(silent);
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
        let me = Replica::register(store.as_ref(), Duration::from_secs(60))
            .await
            .unwrap();
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

    /// A gone replica's run whose sandbox ended under it (a fail request left in its row for
    /// the driver that died) ends `failed` saying why, not `interrupted`.
    #[tokio::test]
    async fn a_gone_replicas_run_asked_to_fail_ends_failed_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        let why = "its sandbox was removed outside sandboxd";
        let fail = sandboxd_core::store::StopRequest::Fail(why.into()).to_column();
        let scope = sandboxd_core::store::RunScope::Run("run-1".into());
        assert_eq!(
            store.request_cancel(scope, &fail).await.unwrap(),
            vec!["run-1".to_string()]
        );
        let me = Replica::register(store.as_ref(), Duration::from_secs(60))
            .await
            .unwrap();
        store.replica_leave(DRIVER).await.unwrap();
        let ended = RunService::interrupt_orphans(&store, me.id())
            .await
            .unwrap();
        assert_eq!(ended, vec!["run-1".to_string()]);
        let row = store.run("run-1").await.unwrap().unwrap();
        assert_eq!(row.state, RunState::Failed);
        let outcome = row.outcome.unwrap().to_string();
        assert!(
            outcome.contains(&format!("the session ended: {why}")),
            "{outcome}"
        );
    }
}
