//! What reaches a run through its row, and the runs nobody drives.
//!
//! The control loop (one per replica) re-reads the rows of the runs this replica drives
//! whenever a control wake-up (`Wake::Control`: a cancel request, an answer) names one of
//! them or `WAKE_ALL` comes, and at least every `wait::POLL` while it drives any: a stop
//! request (`cancel`) stops the run as it asks (cancelled, or failed with why its sandbox
//! went: `StopRequest`), a posted answer (`reply`) goes to its pending
//! question, and a run whose row no longer names this replica is stopped as lost. A fenced
//! replica (its lease ran out) stops every run it drives at once.
//!
//! The sweep, every half lease and at start: every run in flight whose driver is not a live
//! replica is taken over by this one (the store gives each to exactly one replica) and ended
//! `interrupted` after its kept events, as is a run this replica's row names but no task of
//! its drives any more (a lost lease that came back). A queued run whose driver died is
//! interrupted too, not adopted: its task, session handle and request were that process's.
//! So a dead replica's runs end within its lease plus half a lease (plus a poll).
//!
//! An answer posted on any replica (`answer`) is left in the row; the poster waits, bounded,
//! until the driver took it (its `question_answered` says by whom).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::journal::Journal;
use super::wait::POLL;
use super::{LiveRun, RunService, RunServiceError, Stop};
use sandboxd_core::agent::{EventKind, FinishReason};
use sandboxd_core::store::StopRequest;
use sandboxd_core::store::{RunPatch, RunRow, RunState, Store, StoreError, Wake, now_ms};

/// How long POST …/answer waits for the driver to take the answer before taking it back.
const ANSWER_WAIT: Duration = Duration::from_secs(30);

impl RunService {
    /// Runs the control loop and the sweep until `stop` is cancelled.
    pub fn spawn_control(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let every = me.replica.lease() / 2;
            let mut next_sweep = Instant::now() + every;
            let mut rx = me.wakes.subscribe();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = me.wakes.changed(&mut rx, POLL, |w| me.concerns(w)) => {}
                }
                me.control_pass().await;
                if Instant::now() >= next_sweep {
                    me.sweep().await;
                    next_sweep = Instant::now() + every;
                }
            }
        })
    }

    /// Whether a wake-up may change what the control pass acts on: a control wake-up (a
    /// cancel request, an answer) about a run driven here. Not an event's: the events of a
    /// run driven here are this replica's own commits, which change neither `cancel` nor
    /// `reply`, and a takeover is met by the fence at the next commit or by the next poll;
    /// re-reading every row after each event cost a round trip per event on Postgres.
    fn concerns(&self, w: Wake<'_>) -> bool {
        match w {
            Wake::Control(id) => self.live(id).is_some(),
            Wake::All | Wake::Event(_) => false,
        }
    }

    fn live_runs(&self) -> Vec<Arc<LiveRun>> {
        self.live
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// One look at the rows of the runs driven here.
    async fn control_pass(&self) {
        // Whether each was inserted, read before the rows: a run whose insert commits after
        // the read is missing from them, and must not be taken for lost (it was, under load).
        let runs: Vec<(Arc<LiveRun>, bool)> = self
            .live_runs()
            .into_iter()
            .map(|r| {
                let inserted = r.inserted.load(std::sync::atomic::Ordering::SeqCst);
                (r, inserted)
            })
            .collect();
        if runs.is_empty() {
            return;
        }
        if self.replica.fenced() {
            for (run, _) in &runs {
                run.stop(Stop::Lost);
            }
            return;
        }
        let rows: HashMap<String, RunRow> = match self.store.runs_driven_by(self.replica.id()).await
        {
            Ok(rows) => rows.into_iter().map(|r| (r.id.clone(), r)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the runs this replica drives");
                return;
            }
        };
        for (run, inserted) in runs {
            let Some(row) = rows.get(&run.id) else {
                // Not in flight under this replica's name any more: taken over (or just
                // ended, and then the stop changes nothing).
                if inserted {
                    run.stop(Stop::Lost);
                }
                continue;
            };
            if let Some(request) = row.stop_request() {
                run.stop(Stop::requested(request));
            }
            if let (Some(reply), Some(q)) = (&row.reply, &row.question) {
                run.hand_reply(q.asked_at, reply.clone());
            }
        }
    }

    /// Takes over and interrupts the runs of dead replicas, and this replica's own runs
    /// that no task drives.
    async fn sweep(&self) {
        let me = self.replica.id();
        if self.replica.fenced() {
            return;
        }
        match self.store.runs_driven_by(me).await {
            Ok(rows) => {
                // Read after the rows: a run is registered before its row is inserted.
                let orphans: Vec<RunRow> = rows
                    .into_iter()
                    .filter(|r| self.live(&r.id).is_none())
                    .collect();
                for row in orphans {
                    self.interrupt_logged(row).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the runs this replica drives"),
        }
        match self.store.take_over_orphans(me).await {
            Ok(rows) => {
                for row in rows {
                    tracing::info!(run = %row.id, dead = ?row.driver, "taking over a dead replica's run to end it");
                    self.interrupt_logged(row).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot take over dead replicas' runs"),
        }
    }

    async fn interrupt_logged(&self, row: RunRow) {
        let id = row.id.clone();
        match interrupt(&self.store, self.replica.id(), row).await {
            Ok(()) => {}
            // It ended (or was taken over) since it was read: nothing to do.
            Err(e @ StoreError::Fenced { .. }) => {
                tracing::debug!(run = %id, error = %e, "the run is not ours to interrupt any more")
            }
            Err(e) => tracing::warn!(run = %id, error = %e, "cannot interrupt the run"),
        }
    }

    /// At start: every run in flight whose replica is dead (a stop or a crash) is taken
    /// over by `me` and ends `interrupted` after its kept events; runs of live replicas are
    /// theirs. Returns the ids of the runs interrupted.
    pub async fn interrupt_orphans(
        store: &Arc<dyn Store>,
        me: &str,
    ) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for row in store.take_over_orphans(me).await? {
            let id = row.id.clone();
            interrupt(store, me, row).await?;
            out.push(id);
        }
        Ok(out)
    }

    /// Leaves `answer` for the run's pending question (asked at `asked_at`) and waits until
    /// its driver, on whichever replica, took it. NotWaiting when there is no question to
    /// answer, another answer came first, the question expired first, or the driver did not
    /// take it in time (then it is taken back).
    pub async fn answer(
        &self,
        id: &str,
        asked_at: i64,
        answer: String,
    ) -> Result<(), RunServiceError> {
        let seq = self
            .store
            .post_reply(id, &answer)
            .await?
            .ok_or(RunServiceError::NotWaiting)?;
        self.wakes.wake(id).await;
        let store = &self.store;
        let settled = move || async move {
            let row = store.run(id).await.ok()??;
            let moved_on = row.state != RunState::WaitingForHuman
                || row.question.as_ref().is_none_or(|q| q.asked_at != asked_at);
            (row.state.is_terminal() || (row.reply.is_none() && moved_on)).then_some(())
        };
        if self
            .wakes
            .until(ANSWER_WAIT, |w| w == id, settled)
            .await
            .is_none()
            && self.store.withdraw_reply(id, &answer).await?
        {
            tracing::warn!(run = %id, "the run's driver did not take the answer in time");
            return Err(RunServiceError::NotWaiting);
        }
        // Taken, or dropped with the question (it expired, the run ended): the first
        // `question_answered` after the posting says which.
        let taken = self
            .store
            .events_after(id, seq, 64)
            .await?
            .into_iter()
            .find(|e| e.kind == "question_answered")
            .and_then(|e| serde_json::from_str::<serde_json::Value>(&e.payload).ok())
            .is_some_and(|v| v["by"] == "user");
        if taken {
            Ok(())
        } else {
            Err(RunServiceError::NotWaiting)
        }
    }
}

/// Ends a run this replica drives (or just took over) `interrupted`: `run_finished
/// {kind: interrupted}` and `run_state interrupted` after its kept events. One whose
/// sandbox ended under it (a fail request in its row, left for a driver that died) ends
/// `failed` saying why, as its driver would have.
async fn interrupt(store: &Arc<dyn Store>, me: &str, row: RunRow) -> Result<(), StoreError> {
    let journal = Journal::new(store.clone(), row.id.clone(), row.last_seq, me.to_string());
    let (reason, state) = match row.stop_request() {
        Some(StopRequest::Fail(why)) => (
            FinishReason::Error {
                message: format!("the session ended: {why}"),
            },
            RunState::Failed,
        ),
        _ => (FinishReason::Interrupted, RunState::Interrupted),
    };
    journal
        .emit(
            EventKind::RunFinished {
                reason: reason.clone(),
                answer: None,
                steps: row.steps as usize,
                prompt_tokens: row.input_tokens,
                completion_tokens: row.output_tokens,
                duration_ms: 0,
            },
            RunPatch::default(),
        )
        .await?;
    let patch = RunPatch {
        state: Some(state),
        outcome: serde_json::to_value(&reason).ok(),
        question: Some(None),
        ended_at: Some(now_ms()),
        ..Default::default()
    };
    journal
        .emit(
            EventKind::RunState {
                state: state.as_str().into(),
            },
            patch,
        )
        .await?;
    Ok(())
}
