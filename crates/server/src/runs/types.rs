//! The runs API's wire types (docs/openapi.json is generated from them; the contract is
//! /work/briefs/runs-api.md, summarized in README's service section).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::RunMode;
use crate::types::{CreateSession, time};
use sandboxd_core::store::{RunRow, RunState};

/// POST /v1/runs.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// What the agent should do (not blank; at most 100000 characters).
    #[schema(min_length = 1, max_length = 100000, pattern = "\\S")]
    pub task: String,
    /// Continue this session of yours and its conversation; without it a new session is made.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The new session's settings (only without `session_id`; both together are a 409).
    #[serde(default)]
    pub session: Option<CreateSession>,
    /// Overrides the admin's `[agent] max_steps` (1–1000).
    #[schema(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "crate::types::integral")]
    pub max_steps: Option<u64>,
    /// "agent" (default) or "plan" (the planning flow).
    #[serde(default)]
    pub mode: Option<RunMode>,
    /// The agent profile (GET /v1/agents lists them; default "general"). Agent mode only:
    /// a plan's steps name profiles by their tags.
    #[schema(max_length = 64)]
    #[serde(default)]
    pub agent: Option<String>,
}

/// POST /v1/runs/{id}/answer.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    #[schema(max_length = 100000)]
    pub answer: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// The pending `ask_human` question.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Question {
    pub text: String,
    pub asked_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Run {
    pub id: String,
    pub session_id: String,
    /// The owning user's id.
    pub owner: String,
    pub task: String,
    pub mode: RunMode,
    /// The agent profile the run was started with (GET /v1/agents); null for a plan, an A2A
    /// task and a run stored before profiles were recorded.
    pub agent: Option<String>,
    pub state: RunState,
    /// How it ended: the `reason` of run_finished (docs/events.md), e.g. {"kind": "final_answer"};
    /// null while in flight.
    #[schema(value_type = Option<Object>)]
    pub outcome: Option<serde_json::Value>,
    pub answer: Option<String>,
    pub steps: u64,
    pub usage: RunUsage,
    pub question: Option<Question>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// The seq of the run's last event (0 before the first).
    pub last_seq: u64,
    /// How much left the host through the session's egress proxy during the run, and to
    /// where (GET /v1/runs/{id} only; null in lists).
    pub egress: Option<crate::egress::RunEgress>,
}

impl From<&RunRow> for Run {
    fn from(r: &RunRow) -> Self {
        Run {
            id: r.id.clone(),
            session_id: r.session_id.clone(),
            owner: r.owner.clone(),
            task: r.task.clone(),
            mode: if r.mode == "plan" {
                RunMode::Plan
            } else {
                RunMode::Agent
            },
            agent: r.agent.clone(),
            state: r.state,
            outcome: r.outcome.clone(),
            answer: r.answer.clone(),
            steps: r.steps,
            usage: RunUsage {
                prompt_tokens: r.input_tokens,
                completion_tokens: r.output_tokens,
            },
            question: r.question.as_ref().map(|q| Question {
                text: q.text.clone(),
                asked_at: time(q.asked_at),
                expires_at: time(q.expires_at),
            }),
            created_at: time(r.created_at),
            started_at: r.started_at.map(time),
            ended_at: r.ended_at.map(time),
            last_seq: r.last_seq,
            egress: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunList {
    pub runs: Vec<Run>,
    /// Pass as `cursor` for the next page; null on the last.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListRunsQuery {
    /// 1–100, default 50.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^([1-9][0-9]{0,17})?$")]
    pub cursor: Option<String>,
    pub session_id: Option<String>,
    #[param(inline)]
    pub state: Option<RunState>,
    /// Only the runs of this user id (`id` in GET /v1/users). A user other than an admin
    /// sees only their own runs, so another user's id lists none.
    pub owner: Option<String>,
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Send events after this seq (like `Last-Event-ID`).
    pub after: Option<u64>,
    /// false: send what exists and end (default true: follow until the run ends).
    pub follow: Option<bool>,
}
