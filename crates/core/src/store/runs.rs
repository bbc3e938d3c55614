//! The store's run types: a run's row, what changes on it, its events as stored, and the
//! queries over them; and `RunControl`, how replicas on one store share runs: which replica
//! drives a run, whose turn it is in its session, the takeover of a dead replica's runs, and
//! the cancel requests and `ask_human` replies any replica leaves in a run's row for its
//! driver. The service (src/server/runs) owns their meaning; the store keeps them.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Waiting for the session's previous run (runs of one session are serialized).
    Queued,
    Running,
    WaitingForHuman,
    Succeeded,
    Failed,
    Cancelled,
    /// It was in flight when serve stopped or crashed.
    Interrupted,
}

impl RunState {
    pub const IN_FLIGHT: [RunState; 3] = [
        RunState::Queued,
        RunState::Running,
        RunState::WaitingForHuman,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::WaitingForHuman => "waiting_for_human",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
            RunState::Interrupted => "interrupted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            RunState::Queued,
            RunState::Running,
            RunState::WaitingForHuman,
            RunState::Succeeded,
            RunState::Failed,
            RunState::Cancelled,
            RunState::Interrupted,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        !Self::IN_FLIGHT.contains(&self)
    }
}

/// A pending `ask_human` question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredQuestion {
    pub text: String,
    pub asked_at: i64,
    pub expires_at: i64,
}

/// One stored run.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: String,
    pub session_id: String,
    /// The owning user's id.
    pub owner: String,
    pub task: String,
    /// "agent" or "plan".
    pub mode: String,
    pub max_steps: Option<u64>,
    pub state: RunState,
    /// The FinishReason JSON once the run ended.
    pub outcome: Option<serde_json::Value>,
    pub answer: Option<String>,
    pub steps: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub question: Option<StoredQuestion>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    /// The seq of the run's last committed event (0 before the first).
    pub last_seq: u64,
    /// The replica that drives the run (the only one whose events are accepted); None for a
    /// run stored before replicas existed.
    pub driver: Option<String>,
    /// A stop another replica asked for, for the driver to act on: what to do, as
    /// `StopRequest::to_column` wrote it (`stop_request` reads it).
    pub cancel: Option<String>,
    /// An answer to the pending question posted on any replica, not yet taken by the driver.
    pub reply: Option<String>,
    /// The agent profile an agent-mode run was started with (None: a plan, an A2A task, a
    /// run stored before profiles were recorded).
    pub agent: Option<String>,
}

impl RunRow {
    /// The stop another replica asked for, if any.
    pub fn stop_request(&self) -> Option<StopRequest> {
        self.cancel.as_deref().map(StopRequest::from_column)
    }

    /// A run as `insert_run` records it: queued, nothing done or spent, no event yet.
    pub fn queued(
        id: impl Into<String>,
        session_id: impl Into<String>,
        owner: impl Into<String>,
        task: impl Into<String>,
        mode: impl Into<String>,
        max_steps: Option<u64>,
        now: i64,
    ) -> Self {
        Self {
            id: id.into(),
            session_id: session_id.into(),
            owner: owner.into(),
            task: task.into(),
            mode: mode.into(),
            max_steps,
            state: RunState::Queued,
            outcome: None,
            answer: None,
            steps: 0,
            input_tokens: 0,
            output_tokens: 0,
            question: None,
            created_at: now,
            started_at: None,
            ended_at: None,
            last_seq: 0,
            driver: None,
            cancel: None,
            reply: None,
            agent: None,
        }
    }

    /// The same row started with agent profile `name`.
    pub fn with_agent(mut self, name: Option<String>) -> Self {
        self.agent = name;
        self
    }

    /// The same row driven by replica `id`.
    pub fn with_driver(mut self, id: impl Into<String>) -> Self {
        self.driver = Some(id.into());
        self
    }
}

/// What an event's commit changes on its run, in the same transaction; `None` keeps a field.
/// Setting or clearing the question also clears a posted reply: a reply answers the question
/// it was posted to, never the next one.
#[derive(Debug, Clone, Default)]
pub struct RunPatch {
    pub state: Option<RunState>,
    pub outcome: Option<serde_json::Value>,
    pub answer: Option<String>,
    pub steps: Option<u64>,
    /// Added to the run's counters.
    pub add_input_tokens: u64,
    pub add_output_tokens: u64,
    /// An event's append also adds `add_input_tokens` to the run owner's input tokens of the
    /// UTC day of the event's `time` (the daily quota's count, `Store::usage`) in its
    /// transaction, and reports the day's new total (`Appended`): one write per model answer
    /// instead of two. `patch_run` ignores it (only an event counts against the quota).
    pub count_owner_tokens: bool,
    /// Some(None) clears the question.
    pub question: Option<Option<StoredQuestion>>,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
}

/// What a committed append reports besides success.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Appended {
    /// The run owner's input tokens of the event's UTC day after the append, when the patch
    /// counted them (`RunPatch::count_owner_tokens`); None when it did not.
    pub owner_tokens_today: Option<u64>,
}

/// One event as stored: `payload` is the Event JSON of docs/events.md.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: u64,
    pub time: i64,
    /// The event's `type`.
    pub kind: String,
    pub payload: String,
}

/// What `list_runs` returns: newest first, after an opaque cursor.
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    /// Only this owner's runs; None for every owner (admins).
    pub owner: Option<String>,
    pub session_id: Option<String>,
    pub state: Option<RunState>,
    pub before: Option<i64>,
    pub limit: u32,
}

#[derive(Debug, Clone)]
pub struct RunPage {
    pub runs: Vec<RunRow>,
    pub next: Option<i64>,
}

/// What a stop request left in a run's row (`RunRow::cancel`, `RunControl::request_cancel`)
/// asks its driver to do. The stores keep the text as it is; a replica of an earlier version
/// that finds a fail request cancels the run (it only asks whether there is one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopRequest {
    /// End it `cancelled`: a user's cancel, its session deleted, its user removed.
    Cancel,
    /// End it `failed`, saying why: its session's sandbox ended under it (removed, evicted,
    /// OOM-killed outside sandboxd), as the replica that heard of the end tells it.
    Fail(String),
}

/// How a fail request starts in the row; anything else is a cancel.
const FAIL_REQUEST: &str = "fail: ";

impl StopRequest {
    /// The text the row keeps.
    pub fn to_column(&self) -> String {
        match self {
            StopRequest::Cancel => "user".to_string(),
            StopRequest::Fail(why) => format!("{FAIL_REQUEST}{why}"),
        }
    }

    /// What a row's text asks for.
    pub fn from_column(text: &str) -> StopRequest {
        match text.strip_prefix(FAIL_REQUEST) {
            Some(why) => StopRequest::Fail(why.to_string()),
            None => StopRequest::Cancel,
        }
    }
}

/// Which runs a cancel request is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunScope {
    Run(String),
    /// Every run of the session (it is being deleted).
    Session(String),
    /// Every run of the user (they are being removed).
    Owner(String),
}

/// Whether a run may go on, by its row (`RunControl::run_turn`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// No run of its session inserted before it is in flight: it may run.
    Go,
    /// It waits for this run of its session, inserted before it and still in flight.
    After(String),
    /// The run is not in flight, or another replica drives it: this driver must drop it.
    Lost,
}

/// How the replicas on one store share runs. A run is driven by exactly one replica, the
/// one named in its row's `driver`, and only while that replica's lease (`Replicas`) is live
/// by the store's clock: `append_event` refuses (`StoreError::Fenced`) an event from any
/// other, or from one whose lease expired, or for a run that already ended. A run whose
/// driver's lease expired is taken over (`take_over_orphans`) by exactly one live replica,
/// which ends it. Runs of one session go in insert order: the order is the insert's, which
/// every store serializes per session. Every method is one short transaction.
#[async_trait]
pub trait RunControl: Send + Sync {
    /// Whether `run_id`, driven by `driver`, may run now or waits for an earlier run of its
    /// session still in flight (by insert order).
    async fn run_turn(&self, run_id: &str, driver: &str) -> Result<Turn, StoreError>;

    /// The runs in flight that `driver` drives, in insert order.
    async fn runs_driven_by(&self, driver: &str) -> Result<Vec<RunRow>, StoreError>;

    /// Makes `me` the driver of every run in flight whose driver is not a live replica (or
    /// is none), provided `me` itself is live; returns those runs as they are now. Of two
    /// replicas calling it at once, each run goes to exactly one.
    async fn take_over_orphans(&self, me: &str) -> Result<Vec<RunRow>, StoreError>;

    /// Asks the driver of the runs in flight in `scope` to stop them as `reason` says (a
    /// `StopRequest::to_column`; a request already made is kept); returns their ids.
    async fn request_cancel(
        &self,
        scope: RunScope,
        reason: &str,
    ) -> Result<Vec<String>, StoreError>;

    /// Leaves `answer` for the run's pending question, if it is waiting for one and no
    /// answer was posted yet; returns the run's `last_seq` at that moment (what the driver
    /// commits after it answers whether it took the answer), or None.
    async fn post_reply(&self, run_id: &str, answer: &str) -> Result<Option<u64>, StoreError>;

    /// Takes back a posted answer the driver has not taken (the poster gave up waiting);
    /// whether it was still there.
    async fn withdraw_reply(&self, run_id: &str, answer: &str) -> Result<bool, StoreError>;
}
