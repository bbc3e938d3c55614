//! Service runs: `RunService` starts agent or plan runs in sessions, keeps their events in
//! the store and streams them to followers, cancels them, routes `ask_human` answers to
//! them, and interrupts what a dead replica or a crash left in flight. It knows nothing of
//! HTTP (the routes in routes.rs are a thin shell over it), so another front end can reuse it.
//!
//! Replicas (several serve processes on one store): the replica that accepts a run records
//! itself as the run's driver and drives it; only the driver's events are accepted, and only
//! while its lease is live by the store's clock (the store fences every append), so two
//! replicas never both drive a run and a replica that lost its lease stops at its next event.
//! Runs of one session take turns in insert order, wherever they were posted: a run waits,
//! `queued`, until no earlier run of its session is in flight (wait.rs is the one way it
//! waits for the store). Stop requests (cancel it, or fail it because its session's sandbox
//! went: `StopRequest`) and answers reach the driver through the run's row (`cancel`,
//! `reply`), which the driver's control loop reads (control.rs); the control loop
//! also interrupts the runs of replicas whose lease ran out (one replica takes each over).
//!
//! A run is `LiveRun` in the process that drives it; its journal (journal.rs) numbers and
//! commits its events, which followers on any replica read from the store (stream.rs); its
//! sink and asker (sink.rs) are what the engine gets (engine.rs drives the agent or the flow).
//! Tasks do not own the service and the service owns no task handle: no Arc cycle.

pub mod agents;
mod control;
mod engine;
pub mod journal;
pub mod routes;
pub mod sink;
mod sse;
pub mod stream;
pub mod types;
pub mod wait;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::journal::Journal;
use self::wait::Wakes;
use crate::replica::Replica;
use sandboxd_core::agent::profiles::Profile;
use sandboxd_core::agent::{Event, EventKind, FinishReason, RunContext, new_run_id};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::store::{
    Appended, RunPatch, RunRow, RunScope, RunState, StopRequest, Store, StoreError, Turn, now_ms,
};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    User,
    /// The session's sandbox ended under the run (outside sandboxd, ends.rs): it fails
    /// with why.
    SessionEnded(String),
    /// A daily quota of the owner is spent (`input_tokens_per_day`, `cpu_seconds_per_day`).
    Quota {
        quota: &'static str,
        limit: u64,
    },
    Shutdown,
    /// This replica does not hold the run any more (its lease ran out, or another replica
    /// took the run over): it stops at once and writes nothing more.
    Lost,
}

impl Stop {
    /// The stop a request left in the run's row asks for (control.rs).
    fn requested(request: StopRequest) -> Stop {
        match request {
            StopRequest::Cancel => Stop::User,
            StopRequest::Fail(why) => Stop::SessionEnded(why),
        }
    }

    /// What a request in the row asks the driver of a run stopped this way elsewhere for:
    /// a run whose sandbox went fails with why on every replica, any other stop cancels.
    fn request(&self) -> StopRequest {
        match self {
            Stop::SessionEnded(why) => StopRequest::Fail(why.clone()),
            _ => StopRequest::Cancel,
        }
    }
}

/// A pending question's answer slot: the question's `asked_at` (so an answer posted to an
/// earlier question is never handed to a later one) and where the answer goes.
type ReplySlot = (i64, tokio::sync::oneshot::Sender<String>);

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
    /// Set while the asker waits for an answer; the control loop fills it from the row.
    reply: Mutex<Option<ReplySlot>>,
    /// Whether the run's row exists (the control loop judges only inserted runs lost).
    inserted: AtomicBool,
    tokens_per_day: u64,
    /// Whom the session's CPU is metered to (its owner, who may not be the run's: an admin's
    /// run in a user's session) and their daily CPU quota (0: none), checked before each
    /// tool call (sink.rs).
    cpu_owner: String,
    cpu_seconds_per_day: u64,
    /// The answer's text while it is written, for this replica's followers (live only).
    deltas: sse::LiveText,
}

/// Answer pieces a slow follower may lag behind by before it misses some (the whole answer
/// still comes in its `assistant_text` event).
const DELTA_QUEUE: usize = 256;

impl LiveRun {
    /// The answer's pieces from now on, while the run lasts, and the text so far of the
    /// answer being written.
    pub fn deltas(
        &self,
    ) -> (
        tokio::sync::broadcast::Receiver<sandboxd_core::agent::TextDelta>,
        Option<sandboxd_core::agent::TextDelta>,
    ) {
        self.deltas.subscribe()
    }
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
            Some(Stop::Quota { quota, limit }) => Some(FinishReason::QuotaExceeded {
                quota: quota.into(),
                limit,
            }),
            Some(Stop::Shutdown | Stop::Lost) => Some(FinishReason::Interrupted),
            Some(Stop::SessionEnded(ref why)) => Some(FinishReason::Error {
                message: format!("the session ended: {why}"),
            }),
            _ => None,
        }
    }

    /// Whether the run was stopped because this replica does not hold it any more.
    fn lost(&self) -> bool {
        self.stop.lock().is_ok_and(|s| *s == Some(Stop::Lost))
    }

    /// Hands `answer` to the question asked at `asked_at`, if the run is waiting for it;
    /// whether it was handed over.
    fn hand_reply(&self, asked_at: i64, answer: String) -> bool {
        let Ok(mut slot) = self.reply.lock() else {
            return false;
        };
        match slot.take() {
            Some((at, tx)) if at == asked_at => tx.send(answer).is_ok(),
            other => {
                *slot = other;
                false
            }
        }
    }

    /// A refused commit: the store fenced this replica out, so the run is not ours any more
    /// and stops at once; any other failure is logged by the caller.
    fn refused(&self, e: &StoreError) {
        if matches!(e, StoreError::Fenced { .. }) {
            tracing::warn!(run = %self.id, error = %e, "this replica lost the run; stopping it");
            self.stop(Stop::Lost);
        }
    }

    /// Commits an event of the engine (journal.rs), stopping the run if it was lost.
    pub async fn commit(&self, event: Event, patch: RunPatch) -> Result<Appended, StoreError> {
        let r = self.journal.commit(event, patch).await;
        if let Err(e) = &r {
            self.refused(e);
        }
        r.map(|(_, appended)| appended)
    }

    /// Commits an event of the service's own, stopping the run if it was lost.
    pub async fn emit(&self, kind: EventKind, patch: RunPatch) -> Result<u64, StoreError> {
        let r = self.journal.emit(kind, patch).await;
        if let Err(e) = &r {
            self.refused(e);
        }
        r
    }

    async fn set_state(&self, state: RunState) -> Result<u64, StoreError> {
        let patch = RunPatch {
            state: Some(state),
            started_at: (state == RunState::Running).then(now_ms),
            ..Default::default()
        };
        self.emit(
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
    /// The agent profile of an agent-mode run (its tools, prompt and step limit).
    pub profile: Option<Profile>,
    /// The owner's concurrent-runs quota.
    pub max_active: u32,
    /// The owner's daily input-token quota; 0 is none.
    pub tokens_per_day: u64,
    /// The session owner's id and daily CPU quota in seconds (0 is none): the CPU is theirs.
    pub cpu_owner: String,
    pub cpu_seconds_per_day: u64,
    /// The admin's MCP servers (an mcp.json) whose tools the run gets, if the owner may.
    pub mcp_servers: Option<std::path::PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunServiceError {
    #[error("runs need an LLM and none is usable: {0}. Set [llm] in the config and restart serve")]
    NoLlm(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the run has no pending question")]
    NotWaiting,
    #[error(
        "this replica cannot start runs now: its lease in the store ran out (the store is unreachable or slow); retry, another replica can take the request"
    )]
    Fenced,
}

pub struct RunService {
    store: Arc<dyn Store>,
    ctx: Result<RunContext, String>,
    question_timeout: Duration,
    /// This process as a replica: the driver it records, and whether its lease holds.
    replica: Arc<Replica>,
    /// The runs this replica drives, from before their row is inserted until their ending
    /// is recorded.
    live: Mutex<HashMap<String, Arc<LiveRun>>>,
    wakes: Wakes,
    tasks: TaskTracker,
}

impl RunService {
    /// `ctx` is the LLM and config runs use, or why there is none (runs are then refused).
    pub fn new(
        store: Arc<dyn Store>,
        ctx: Result<RunContext, String>,
        question_timeout: Duration,
        replica: Arc<Replica>,
    ) -> Arc<Self> {
        Arc::new(Self {
            wakes: Wakes::new(store.clone()),
            store,
            ctx,
            question_timeout,
            replica,
            live: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
        })
    }

    /// The run if it is in flight in this process.
    pub fn live(&self, id: &str) -> Option<Arc<LiveRun>> {
        self.live.lock().ok()?.get(id).cloned()
    }

    /// The run of session `session_id` this process drives now, if any (runs of a session
    /// take turns: at most one of them is past its queue).
    pub fn live_in_session(&self, session_id: &str) -> Option<Arc<LiveRun>> {
        let m = self.live.lock().ok()?;
        m.values()
            .find(|r| r.session_id == session_id && r.inserted.load(Ordering::SeqCst))
            .cloned()
    }

    /// Checks that runs can start at all (an LLM is configured).
    pub fn ready(&self) -> Result<(), RunServiceError> {
        self.ctx
            .as_ref()
            .map(|_| ())
            .map_err(|e| RunServiceError::NoLlm(e.clone()))
    }

    /// Records the run (`queued`, within the owner's quota, driven by this replica) and
    /// starts it on its own task; it waits for the session's earlier runs, if any.
    pub async fn start(self: &Arc<Self>, req: StartRun) -> Result<RunRow, RunServiceError> {
        let ctx = self.ctx.clone().map_err(RunServiceError::NoLlm)?;
        if self.replica.fenced() {
            return Err(RunServiceError::Fenced);
        }
        let id = new_run_id();
        let me = self.replica.id().to_string();
        let row = RunRow::queued(
            id.clone(),
            req.session_id.clone(),
            req.owner.clone(),
            req.task.clone(),
            req.mode.as_str(),
            req.max_steps.map(|n| n as u64),
            now_ms(),
        )
        .with_agent(req.profile.as_ref().map(|p| p.name.clone()))
        .with_driver(me.clone());
        let live = Arc::new(LiveRun {
            id: id.clone(),
            owner: req.owner.clone(),
            session_id: req.session_id.clone(),
            runtime_id: req.session.id.clone(),
            journal: Journal::new(self.store.clone(), id.clone(), 0, me),
            store: self.store.clone(),
            cancel: CancellationToken::new(),
            ended: CancellationToken::new(),
            stop: Mutex::new(None),
            reply: Mutex::new(None),
            inserted: AtomicBool::new(false),
            tokens_per_day: req.tokens_per_day,
            cpu_owner: req.cpu_owner.clone(),
            cpu_seconds_per_day: req.cpu_seconds_per_day,
            deltas: sse::LiveText::new(DELTA_QUEUE),
        });
        // Registered before the row exists, so a cancel that finds the row finds it live
        // and the control loop never takes a row of ours for an orphan.
        if let Ok(mut m) = self.live.lock() {
            m.insert(id.clone(), live.clone());
        }
        if let Err(e) = self.store.insert_run(row, req.max_active).await {
            self.forget(&id);
            return Err(e.into());
        }
        live.inserted.store(true, Ordering::SeqCst);
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

    fn forget(&self, id: &str) {
        if let Ok(mut m) = self.live.lock() {
            m.remove(id);
        }
    }

    /// Waits until the run's turn comes in its session (true), or until it is found not to
    /// be this replica's any more (false).
    async fn wait_turn(&self, live: &LiveRun) -> bool {
        let (store, me, id) = (&self.store, self.replica.id(), live.id.as_str());
        // The earlier run waited for: a wake-up about it is worth a look at once.
        let waited_for = Mutex::new(String::new());
        let waited = &waited_for;
        let turn = self
            .wakes
            .until(
                Duration::MAX,
                |w| waited.lock().is_ok_and(|earlier| *earlier == w),
                move || async move {
                    match store.run_turn(id, me).await {
                        Ok(Turn::Go) => Some(true),
                        Ok(Turn::Lost) => Some(false),
                        Ok(Turn::After(earlier)) => {
                            if let Ok(mut w) = waited.lock() {
                                *w = earlier;
                            }
                            None
                        }
                        Err(e) => {
                            tracing::warn!(run = %id, error = %e, "cannot read the run's turn; retrying");
                            None
                        }
                    }
                },
            )
            .await;
        turn.unwrap_or(false)
    }

    /// The whole life of a run on its task: queue, run, record the ending.
    async fn drive(self: Arc<Self>, ctx: RunContext, live: Arc<LiveRun>, req: StartRun) {
        // The session is in use from here to the run's end: queued, running, waiting for a
        // human's answer and between a plan's steps it is never idle, however long that is.
        let _in_use = req.session.hold();
        let ending = tokio::select! {
            go = self.wait_turn(&live) => {
                if go {
                    self.execute(&ctx, &live, &req).await
                } else {
                    live.stop(Stop::Lost);
                    Ending { reason: FinishReason::Interrupted, answer: None, steps: 0 }
                }
            }
            _ = live.cancel.cancelled() => {
                // Cancelled (or shut down) while queued: the engine never saw it.
                let reason = live.stop_reason().unwrap_or(FinishReason::Cancelled);
                self.finished_event(&live, &reason, 0).await;
                Ending { reason, answer: None, steps: 0 }
            }
        };
        self.record_ending(&live, ending).await;
        self.forget(&live.id);
        live.ended.cancel();
    }

    /// The run's terminal state, with its outcome, in its last event. A run this replica
    /// lost is another's to end (or was ended): nothing is written for it.
    async fn record_ending(&self, live: &LiveRun, ending: Ending) {
        if live.lost() {
            tracing::info!(run = %live.id, "the run was lost to another replica; its ending is theirs");
            return;
        }
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
        if let Some(m) = crate::metrics::get() {
            m.run_ended(state.as_str());
        }
        let kind = EventKind::RunState {
            state: state.as_str().into(),
        };
        if let Err(e) = live.emit(kind, patch).await {
            tracing::error!(run = %live.id, error = %e, "cannot record the run's ending");
        }
    }

    /// Stops the run wherever it is driven and waits (at most `wait`) until its ending is
    /// recorded. A run driven here stops at once; one driven by another replica gets a
    /// cancel request in its row, which its driver acts on.
    pub async fn cancel(&self, id: &str, wait: Duration) {
        if let Some(live) = self.live(id) {
            live.stop(Stop::User);
            let _ = tokio::time::timeout(wait, live.ended.cancelled()).await;
            return;
        }
        self.cancel_scope(RunScope::Run(id.to_string()), |_| false, wait)
            .await;
    }

    /// Cancels every run of the session in flight, on any replica (the session is being
    /// deleted), and waits (at most `wait`) for their endings.
    pub async fn cancel_session(&self, session_id: &str, wait: Duration) {
        let scope = RunScope::Session(session_id.to_string());
        self.cancel_scope(scope, |r| r.session_id == session_id, wait)
            .await;
    }

    /// Stops every run of the session in flight, on any replica, whose sandbox ended under
    /// them: they end failed, saying `why`. Waits (at most `wait`) only for the runs driven
    /// here, so that ending the session (ends.rs, whether the end was heard or a sweep found
    /// it, at start-up before the port is bound or in the upkeep) never stalls on another
    /// replica. The others get the fail request in their rows: a live driver ends them
    /// failed when it reads it, and whoever takes over a dead driver's run ends it failed
    /// too (control.rs's `interrupt`), so nothing is gained by waiting for them.
    pub async fn fail_session_here(&self, session_id: &str, why: &str, wait: Duration) {
        tracing::info!(session = %session_id, %why, "the session's sandbox is gone under its runs");
        let stop = Stop::SessionEnded(why.to_string());
        let local = self.stop_local_as(|r| r.session_id == session_id, &stop);
        let scope = RunScope::Session(session_id.to_string());
        self.request_stop(scope, &stop).await;
        for run in local {
            let _ = tokio::time::timeout(wait, run.ended.cancelled()).await;
        }
    }

    /// Stops every run in flight here in the manager's session `runtime_id` (its row ended
    /// elsewhere) and waits (at most `wait`) for their endings. Each stops as its row asks
    /// when it holds a request, else it is cancelled: the replica that ended the row left a
    /// fail request when the sandbox vanished (ends.rs), and the run must fail with why
    /// whether this replica's control pass or its upkeep comes to it first.
    pub async fn cancel_runtime(&self, runtime_id: &str, wait: Duration) {
        let runs = self.local_runs(|r| r.runtime_id == runtime_id);
        for run in &runs {
            let why = match self.store.run(&run.id).await {
                Ok(Some(row)) => row.stop_request().map_or(Stop::User, Stop::requested),
                _ => Stop::User,
            };
            run.stop(why);
        }
        for run in runs {
            let _ = tokio::time::timeout(wait, run.ended.cancelled()).await;
        }
    }

    /// Cancels every run of the user in flight, on any replica (the user is being removed):
    /// they end `cancelled`. Waits (at most `wait`) for their endings.
    pub async fn cancel_owner(&self, owner: &str, wait: Duration) {
        self.cancel_scope(
            RunScope::Owner(owner.to_string()),
            |r| r.owner == owner,
            wait,
        )
        .await;
    }

    /// The runs driven here that `which` picks.
    fn local_runs(&self, which: impl Fn(&LiveRun) -> bool) -> Vec<Arc<LiveRun>> {
        self.live
            .lock()
            .map(|m| m.values().filter(|r| which(r)).cloned().collect())
            .unwrap_or_default()
    }

    /// Stops the runs driven here that `which` picks, saying `why`; returns them.
    fn stop_local_as(&self, which: impl Fn(&LiveRun) -> bool, why: &Stop) -> Vec<Arc<LiveRun>> {
        let runs = self.local_runs(which);
        for run in &runs {
            run.stop(why.clone());
        }
        runs
    }

    /// Cancels the runs of `scope` on any replica (`stop_scope` with a user's stop).
    async fn cancel_scope(&self, scope: RunScope, here: impl Fn(&LiveRun) -> bool, wait: Duration) {
        self.stop_scope(scope, here, &Stop::User, wait).await;
    }

    /// Stops the runs of `scope` driven here at once as `why` says, asks the drivers of the
    /// others to do the same (in their rows: `Stop::request`), then waits until every one
    /// of them has ended, by the store.
    async fn stop_scope(
        &self,
        scope: RunScope,
        here: impl Fn(&LiveRun) -> bool,
        why: &Stop,
        wait: Duration,
    ) {
        self.stop_local_as(here, why);
        let Some(ids) = self.request_stop(scope, why).await else {
            return;
        };
        let (store, wanted) = (&self.store, &ids);
        let all_ended = move || async move {
            for id in wanted {
                match store.run(id).await {
                    Ok(Some(row)) if !row.state.is_terminal() => return None,
                    Err(_) => return None,
                    _ => {}
                }
            }
            Some(())
        };
        if self
            .wakes
            .until(wait, |id| ids.iter().any(|i| i == id), all_ended)
            .await
            .is_none()
        {
            tracing::warn!(runs = ?ids, "runs asked to cancel have not all ended yet");
        }
    }

    /// Asks the drivers of the runs of `scope` still in flight, wherever they are, to stop
    /// as `why` says (in their rows) and wakes them; the ids asked, or None when the store
    /// failed.
    async fn request_stop(&self, scope: RunScope, why: &Stop) -> Option<Vec<String>> {
        let request = why.request().to_column();
        let ids = match self.store.request_cancel(scope, &request).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::error!(error = %e, "cannot ask other replicas to cancel runs");
                return None;
            }
        };
        for id in &ids {
            self.wakes.wake(id).await;
        }
        Some(ids)
    }

    /// Shutdown: every run in flight is stopped (it ends `interrupted`); waits at most `wait`
    /// for their endings to be recorded.
    pub async fn shutdown(&self, wait: Duration) {
        let all = self.stop_local_as(|_| true, &Stop::Shutdown);
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
