//! The run's event sink and asker as the service gives them to the engine.
//!
//! `ServiceSink` commits every event to the store (images first, so an event never points at
//! bytes the store lacks), counts the user's input tokens of the day (in the `token_usage`
//! event's own append) and stops the run when the daily quota is spent (and, at each tool
//! call, when the owner's daily CPU quota is: cpu_quota.rs), counts the session's
//! tokens per model and tool calls for usage metering (metering.rs), and names the real
//! ending in `run_finished` when the service stopped the run (quota, shutdown). `ServiceAsker` puts the run in `waiting_for_human` with
//! a question that expires, answered through POST /v1/runs/{id}/answer on any replica: the
//! answer is left in the run's row and handed over by the control loop (control.rs).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::{LiveRun, Stop, rfc3339};
use sandboxd_core::agent::{Event, EventKind, EventSink, FinishReason, Image, TextDelta};
use sandboxd_core::store::{Appended, Counted, RunPatch, RunState, StoredQuestion, now_ms};
use sandboxd_core::tools::ask_human::Asker;

/// Longest question kept (the model's text; the rest is cut).
const MAX_QUESTION_CHARS: usize = 4000;

pub struct ServiceSink {
    pub run: Arc<LiveRun>,
    /// The model the run's tokens are spent with (usage metering counts them per model).
    pub model: String,
}

impl ServiceSink {
    /// As a tool is about to run: stops the run once its session owner's daily CPU quota is spent,
    /// as a spent token quota stops it (the figure is the store's, as stale as the last
    /// sample: cpu_quota.rs). A command already running is not stopped mid-way by this;
    /// the next tool call of the run is.
    async fn check_cpu(&self) {
        let run = &self.run;
        let store = run.store.as_ref();
        match crate::cpu_quota::spent(store, run.cpu_seconds_per_day, &run.cpu_owner).await {
            Ok(Some(s)) => {
                tracing::info!(run = %run.id, used = s.used, "the daily CPU quota is spent; stopping the run");
                run.stop(Stop::Quota {
                    quota: crate::cpu_quota::QUOTA,
                    limit: s.limit,
                });
            }
            Ok(None) => {}
            // The rule (cpu_quota.rs): new work is refused on an unknown figure, a run in
            // flight carries on; its next tool call checks again.
            Err(e) => {
                tracing::warn!(run = %run.id, error = %e, "cannot read the owner's CPU-seconds of today; the run goes on");
            }
        }
    }

    /// What an event adds to the session's usage: a model answer's tokens, a tool call.
    fn metered(&self, kind: &EventKind) -> Option<Counted> {
        match kind {
            EventKind::TokenUsage {
                prompt_tokens,
                completion_tokens,
                ..
            } => Some(Counted {
                model: Some(self.model.clone()),
                tokens_in: *prompt_tokens,
                tokens_out: *completion_tokens,
                ..Counted::default()
            }),
            EventKind::ToolCall { .. } => Some(Counted {
                tool_calls: 1,
                ..Counted::default()
            }),
            _ => None,
        }
    }
}

#[async_trait]
impl EventSink for ServiceSink {
    async fn event(&self, event: &Event, image: Option<&Image>) {
        let run = &self.run;
        let mut event = event.clone();
        let mut patch = RunPatch::default();
        if let Some(counted) = self.metered(&event.kind) {
            crate::metering::count(run.store.as_ref(), &run.session_id, counted).await;
        }
        let tool_call = matches!(event.kind, EventKind::ToolCall { .. });
        match &mut event.kind {
            EventKind::TokenUsage {
                prompt_tokens,
                completion_tokens,
                ..
            } => {
                // Counted against the owner's day in the event's own append (one write).
                patch.add_input_tokens = *prompt_tokens;
                patch.add_output_tokens = *completion_tokens;
                patch.count_owner_tokens = true;
            }
            EventKind::RunFinished { reason, .. } if *reason == FinishReason::Cancelled => {
                if let Some(why) = run.stop_reason() {
                    *reason = why;
                }
            }
            _ => {}
        }
        if let Some(img) = image
            && let Err(e) = run
                .store
                .put_image(
                    &run.id,
                    &img.reference.id,
                    &img.reference.media_type,
                    img.data.to_vec(),
                )
                .await
        {
            tracing::error!(run = %run.id, error = %e, "cannot store an image of the run");
        }
        // The answer so far is in this event or void (a retry): a late follower gets none of
        // it, even while the commit is under way.
        run.deltas.forget_answer();
        match run.commit(event, patch).await {
            Ok(Appended {
                owner_tokens_today: Some(total),
            }) if run.tokens_per_day > 0 && total >= run.tokens_per_day => {
                tracing::info!(run = %run.id, total, "the daily input-token quota is spent; stopping the run");
                run.stop(Stop::Quota {
                    quota: "input_tokens_per_day",
                    limit: run.tokens_per_day,
                });
            }
            Ok(_) => {}
            Err(e) => {
                // The store is the record: a run whose events cannot be kept is stopped (a
                // fenced commit has already stopped it as lost, and the first reason stands).
                tracing::error!(run = %run.id, error = %e, "cannot commit an event; cancelling the run");
                run.stop(Stop::User);
            }
        }
        if tool_call {
            self.check_cpu().await;
        }
    }

    /// Live only: handed to this replica's followers, never stored (the step's
    /// `assistant_text` event is the record). No follower, nothing to do. Placed after the
    /// run's last committed event: the journal renumbers the engine's events.
    async fn delta(&self, delta: &TextDelta) {
        let mut delta = delta.clone();
        delta.after_seq = self.run.journal.last().await;
        self.run.deltas.send(delta);
    }
}

pub struct ServiceAsker {
    pub run: Arc<LiveRun>,
    pub timeout: Duration,
}

#[async_trait]
impl Asker for ServiceAsker {
    async fn ask(&self, question: &str) -> Option<String> {
        let run = &self.run;
        let text: String = question.chars().take(MAX_QUESTION_CHARS).collect();
        let asked_at = now_ms();
        let expires_at = asked_at + self.timeout.as_millis() as i64;
        // The slot exists before the question is in the row, so no answer finds it missing.
        let (tx, rx) = oneshot::channel::<String>();
        if let Ok(mut slot) = run.reply.lock() {
            *slot = Some((asked_at, tx));
        }
        let asked = RunPatch {
            question: Some(Some(StoredQuestion {
                text: text.clone(),
                asked_at,
                expires_at,
            })),
            ..Default::default()
        };
        let log = |r: Result<u64, sandboxd_core::store::StoreError>| {
            if let Err(e) = r {
                tracing::error!(run = %run.id, error = %e, "cannot commit a question event");
            }
        };
        log(run
            .emit(
                EventKind::QuestionAsked {
                    question: text,
                    expires_at: rfc3339(expires_at),
                },
                asked,
            )
            .await);
        log(run.set_state(RunState::WaitingForHuman).await);
        let got = tokio::select! {
            a = rx => a.ok(),
            _ = tokio::time::sleep(self.timeout) => None,
            // The run's ending clears the question (and any posted answer) in its last event.
            _ = run.cancel.cancelled() => {
                clear_slot(run);
                return None;
            }
        };
        clear_slot(run);
        let by = if got.is_some() { "user" } else { "timeout" };
        // Clearing the question clears a posted answer too: one that came after the
        // timeout is dropped, and its poster reads `by: timeout` here.
        let cleared = RunPatch {
            question: Some(None),
            ..Default::default()
        };
        log(run
            .emit(EventKind::QuestionAnswered { by: by.into() }, cleared)
            .await);
        log(run.set_state(RunState::Running).await);
        got
    }
}

fn clear_slot(run: &LiveRun) {
    if let Ok(mut slot) = run.reply.lock() {
        slot.take();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::runs::journal::Journal;
    use sandboxd_core::store::{RunRow, SessionRow, Store};
    use sandboxd_sqlite::SqliteStore;

    /// An unanswered question expires after the configured time (virtual, paused clock):
    /// the run is told no human answered, and the events say so in order.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_question_times_out_and_the_run_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("s.db")).await.unwrap());
        let now = now_ms();
        let session =
            SessionRow::creating("ses", "u", Default::default(), Default::default(), 60, now);
        store.reserve_session(session, 4).await.unwrap();
        // Already running: the asker is handed a run the engine drives.
        store.replica_beat("r-test", 3_600_000).await.unwrap();
        let row = RunRow {
            state: RunState::Running,
            ..RunRow::queued("run-q", "ses", "u", "t", "agent", None, now).with_driver("r-test")
        };
        store.insert_run(row, 2).await.unwrap();
        let run = Arc::new(LiveRun {
            id: "run-q".into(),
            owner: "u".into(),
            session_id: "ses".into(),
            runtime_id: "0123456789ab".into(),
            journal: Journal::new(store.clone(), "run-q".into(), 0, "r-test".into()),
            store: store.clone(),
            cancel: CancellationToken::new(),
            ended: CancellationToken::new(),
            stop: Mutex::new(None),
            reply: Mutex::new(None),
            inserted: AtomicBool::new(true),
            tokens_per_day: 0,
            cpu_owner: "u".into(),
            cpu_seconds_per_day: 0,
            deltas: crate::runs::sse::LiveText::new(4),
        });
        let asker = ServiceAsker {
            run: run.clone(),
            timeout: Duration::from_secs(300),
        };
        let start = tokio::time::Instant::now();
        assert_eq!(asker.ask("Which colour?").await, None);
        assert!(start.elapsed() >= Duration::from_secs(300));
        assert!(run.reply.lock().unwrap().is_none());
        let evs = store.events_after("run-q", 0, 10).await.unwrap();
        let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "question_asked",
                "run_state",
                "question_answered",
                "run_state"
            ]
        );
        assert!(evs[2].payload.contains("\"by\":\"timeout\""));
        assert!(evs[3].payload.contains("\"state\":\"running\""));
        let row = store.run("run-q").await.unwrap().unwrap();
        assert!(row.question.is_none());
        assert_eq!(row.state, RunState::Running);
    }
}
