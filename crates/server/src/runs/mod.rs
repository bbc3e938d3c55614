//! Service runs: `RunService` starts agent or plan runs in sessions, keeps their events in
//! the store and streams them to followers, cancels them, routes `ask_human` answers to
//! them, and interrupts what a crash left in flight. It knows nothing of HTTP (the routes in
//! routes.rs are a thin shell over it), so another front end can reuse it.
//!
//! Runs of one session are serialized: each waits, `queued`, for the session's lock. A run
//! is `LiveRun` in this process while it is in flight; its journal (journal.rs) numbers and
//! commits its events, which followers on any replica read from the store (stream.rs); its
//! sink and asker (sink.rs) are what the engine gets (engine.rs drives the agent or the flow).
//! Tasks do not own the service and the service owns no task handle: no Arc cycle.

mod engine;
pub mod journal;
pub mod routes;
pub mod sink;
pub mod stream;
pub mod types;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::journal::Journal;
use self::sink::Answer;
use sandboxd_core::agent::{EventKind, FinishReason, RunContext, new_run_id};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::store::{RunPatch, RunRow, RunState, Store, StoreError, now_ms};

/// What a run does: one agent run, or the planning flow.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    Agent,
    Plan,
}

impl RunMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RunMode::Agent => "agent",
            RunMode::Plan => "plan",
        }
    }
}

/// Why the service stopped a run (the engine only sees a cancellation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    User,
    Quota { limit: u64 },
    Shutdown,
}

/// A run in flight in this process.
pub struct LiveRun {
    pub id: String,
    pub owner: String,
    pub session_id: String,
    /// The manager's id of the session it runs in.
    pub runtime_id: String,
    pub journal: Journal,
    store: Arc<dyn Store>,
    cancel: CancellationToken,
    /// Cancelled once the run's last event is committed.
    ended: CancellationToken,
    stop: Mutex<Option<Stop>>,
    question: tokio::sync::Mutex<Option<tokio::sync::oneshot::Sender<Answer>>>,
    tokens_per_day: u64,
}

impl LiveRun {
    /// Stops the run at once (the engine drops the LLM request and kills the command in
    /// flight); the first reason given is the one the run ends with.
    pub fn stop(&self, why: Stop) {
        if let Ok(mut s) = self.stop.lock()
            && s.is_none()
        {
            *s = Some(why);
        }
        self.cancel.cancel();
    }

    /// How `run_finished` names a cancellation the service made.
    fn stop_reason(&self) -> Option<FinishReason> {
        match *self.stop.lock().ok()? {
            Some(Stop::Quota { limit }) => Some(FinishReason::QuotaExceeded {
                quota: "input_tokens_per_day".into(),
                limit,
            }),
            Some(Stop::Shutdown) => Some(FinishReason::Interrupted),
            _ => None,
        }
    }

    async fn set_state(&self, state: RunState) -> Result<u64, StoreError> {
        let patch = RunPatch {
            state: Some(state),
            started_at: (state == RunState::Running).then(now_ms),
            ..Default::default()
        };
        self.journal
            .emit(
                EventKind::RunState {
                    state: state.as_str().into(),
                },
                patch,
            )
            .await
    }
}

/// RFC 3339 in UTC with milliseconds, from unix milliseconds.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A run to start.
pub struct StartRun {
    /// The owning user's id.
    pub owner: String,
    /// The API id of the session.
    pub session_id: String,
    /// The session as the manager holds it (what the engine runs in).
    pub session: Arc<Session>,
    pub task: String,
    pub mode: RunMode,
    pub max_steps: Option<usize>,
    /// The owner's concurrent-runs quota.
    pub max_active: u32,
    /// The owner's daily input-token quota; 0 is none.
    pub tokens_per_day: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RunServiceError {
    #[error("runs need an LLM and none is usable: {0}. Set [llm] in the config and restart serve")]
    NoLlm(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the run has no pending question")]
    NotWaiting,
}

pub struct RunService {
    store: Arc<dyn Store>,
    ctx: Result<RunContext, String>,
    question_timeout: Duration,
    live: Mutex<HashMap<String, Arc<LiveRun>>>,
    /// One lock per session with runs in flight: its runs take turns.
    sessions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    tasks: TaskTracker,
}

impl RunService {
    /// `ctx` is the LLM and config runs use, or why there is none (runs are then refused).
    pub fn new(
        store: Arc<dyn Store>,
        ctx: Result<RunContext, String>,
        question_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            ctx,
            question_timeout,
            live: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
        })
    }

    /// The run if it is in flight in this process.
    pub fn live(&self, id: &str) -> Option<Arc<LiveRun>> {
        self.live.lock().ok()?.get(id).cloned()
    }

    /// Checks that runs can start at all (an LLM is configured).
    pub fn ready(&self) -> Result<(), RunServiceError> {
        self.ctx
            .as_ref()
            .map(|_| ())
            .map_err(|e| RunServiceError::NoLlm(e.clone()))
    }

    /// Records the run (`queued`, within the owner's quota) and starts it on its own task;
    /// it waits for the session's previous run, if any.
    pub async fn start(self: &Arc<Self>, req: StartRun) -> Result<RunRow, RunServiceError> {
        let ctx = self.ctx.clone().map_err(RunServiceError::NoLlm)?;
        let id = new_run_id();
        let row = RunRow::queued(
            id.clone(),
            req.session_id.clone(),
            req.owner.clone(),
            req.task.clone(),
            req.mode.as_str(),
            req.max_steps.map(|n| n as u64),
            now_ms(),
        );
        let live = Arc::new(LiveRun {
            id: id.clone(),
            owner: req.owner.clone(),
            session_id: req.session_id.clone(),
            runtime_id: req.session.id.clone(),
            journal: Journal::new(self.store.clone(), id.clone(), 0),
            store: self.store.clone(),
            cancel: CancellationToken::new(),
            ended: CancellationToken::new(),
            stop: Mutex::new(None),
            question: tokio::sync::Mutex::new(None),
            tokens_per_day: req.tokens_per_day,
        });
        // Registered before the row exists, so a cancel that finds the row finds it live.
        if let Ok(mut m) = self.live.lock() {
            m.insert(id.clone(), live.clone());
        }
        if let Err(e) = self.store.insert_run(row, req.max_active).await {
            self.forget(&id);
            return Err(e.into());
        }
        if let Err(e) = live.set_state(RunState::Queued).await {
            tracing::error!(run = %id, error = %e, "cannot record the queued state");
        }
        let service = self.clone();
        let task_live = live.clone();
        self.tasks.spawn(async move {
            service.drive(ctx, task_live, req).await;
        });
        self.store
            .run(&id)
            .await?
            .ok_or_else(|| StoreError::Sql(format!("run {id} vanished after insert")).into())
    }

    fn session_lock(&self, session_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        match self.sessions.lock() {
            Ok(mut m) => m.entry(session_id.to_string()).or_default().clone(),
            Err(_) => Arc::default(),
        }
    }

    fn forget(&self, id: &str) {
        if let Ok(mut m) = self.live.lock() {
            m.remove(id);
        }
    }

    /// The whole life of a run on its task: queue, run, record the ending.
    async fn drive(self: Arc<Self>, ctx: RunContext, live: Arc<LiveRun>, req: StartRun) {
        // The session is in use from here to the run's end: queued, running, waiting for a
        // human's answer and between a plan's steps it is never idle, however long that is.
        let _in_use = req.session.hold();
        let lock = self.session_lock(&req.session_id);
        let ending = tokio::select! {
            guard = lock.clone().lock_owned() => {
                let ending = self.execute(&ctx, &live, &req).await;
                drop(guard);
                ending
            }
            _ = live.cancel.cancelled() => {
                // Cancelled (or shut down) while queued: the engine never saw it.
                let reason = live.stop_reason().unwrap_or(FinishReason::Cancelled);
                self.finished_event(&live, &reason, 0).await;
                Ending { reason, answer: None, steps: 0 }
            }
        };
        let state = match &ending.reason {
            r if r.is_success() => RunState::Succeeded,
            FinishReason::Cancelled => RunState::Cancelled,
            FinishReason::Interrupted => RunState::Interrupted,
            _ => RunState::Failed,
        };
        let patch = RunPatch {
            state: Some(state),
            outcome: serde_json::to_value(&ending.reason).ok(),
            answer: ending.answer,
            steps: Some(ending.steps as u64),
            question: Some(None),
            ended_at: Some(now_ms()),
            ..Default::default()
        };
        let kind = EventKind::RunState {
            state: state.as_str().into(),
        };
        if let Err(e) = live.journal.emit(kind, patch).await {
            tracing::error!(run = %live.id, error = %e, "cannot record the run's ending");
        }
        self.forget(&live.id);
        if let Ok(mut m) = self.sessions.lock()
            && m.get(&req.session_id)
                .is_some_and(|l| Arc::strong_count(l) <= 2)
        {
            m.remove(&req.session_id);
        }
        drop(lock);
        live.ended.cancel();
    }

    /// Stops the run and waits (at most `wait`) until its ending is recorded; false when it
    /// is not in flight here.
    pub async fn cancel(&self, id: &str, wait: Duration) -> bool {
        let Some(live) = self.live(id) else {
            return false;
        };
        live.stop(Stop::User);
        let _ = tokio::time::timeout(wait, live.ended.cancelled()).await;
        true
    }

    /// Cancels every run of the session in flight here (the session is being deleted) and
    /// waits (at most `wait`) for their endings.
    pub async fn cancel_session(&self, session_id: &str, wait: Duration) {
        self.cancel_where(|r| r.session_id == session_id, wait)
            .await;
    }

    /// Cancels every run in flight here in the manager's session `runtime_id` (its row ended
    /// elsewhere) and waits (at most `wait`) for their endings.
    pub async fn cancel_runtime(&self, runtime_id: &str, wait: Duration) {
        self.cancel_where(|r| r.runtime_id == runtime_id, wait)
            .await;
    }

    /// Cancels every run of the user in flight here (the user is being removed): they end
    /// `cancelled`. Waits (at most `wait`) for their endings.
    pub async fn cancel_owner(&self, owner: &str, wait: Duration) {
        self.cancel_where(|r| r.owner == owner, wait).await;
    }

    async fn cancel_where(&self, which: impl Fn(&LiveRun) -> bool, wait: Duration) {
        let runs: Vec<Arc<LiveRun>> = self
            .live
            .lock()
            .map(|m| m.values().filter(|r| which(r)).cloned().collect())
            .unwrap_or_default();
        for run in &runs {
            run.stop(Stop::User);
        }
        for run in runs {
            let _ = tokio::time::timeout(wait, run.ended.cancelled()).await;
        }
    }

    /// Hands an answer to the run's pending question and waits until the run took it.
    pub async fn answer(&self, id: &str, answer: String) -> Result<(), RunServiceError> {
        let live = self.live(id).ok_or(RunServiceError::NotWaiting)?;
        let tx = live
            .question
            .lock()
            .await
            .take()
            .ok_or(RunServiceError::NotWaiting)?;
        let (ack, taken) = tokio::sync::oneshot::channel();
        tx.send((answer, ack))
            .map_err(|_| RunServiceError::NotWaiting)?;
        taken.await.map_err(|_| RunServiceError::NotWaiting)
    }

    /// Shutdown: every run in flight is stopped (it ends `interrupted`); waits at most `wait`
    /// for their endings to be recorded.
    pub async fn shutdown(&self, wait: Duration) {
        let all: Vec<Arc<LiveRun>> = self
            .live
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        for run in &all {
            run.stop(Stop::Shutdown);
        }
        self.tasks.close();
        if tokio::time::timeout(wait, self.tasks.wait()).await.is_err() {
            tracing::warn!(runs = all.len(), "runs still ending after the drain bound");
        }
    }
}

/// How a run ended, for its row.
struct Ending {
    reason: FinishReason,
    answer: Option<String>,
    steps: usize,
}
