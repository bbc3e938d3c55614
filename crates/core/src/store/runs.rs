//! The store's run types: a run's row, what changes on it, its events as stored, and the
//! queries over them. The service (src/server/runs) owns their meaning; the store keeps them.

use serde::{Deserialize, Serialize};

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
}

impl RunRow {
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
        }
    }
}

/// What an event's commit changes on its run, in the same transaction; `None` keeps a field.
#[derive(Debug, Clone, Default)]
pub struct RunPatch {
    pub state: Option<RunState>,
    pub outcome: Option<serde_json::Value>,
    pub answer: Option<String>,
    pub steps: Option<u64>,
    /// Added to the run's counters.
    pub add_input_tokens: u64,
    pub add_output_tokens: u64,
    /// Some(None) clears the question.
    pub question: Option<Option<StoredQuestion>>,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
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
