//! The flow's wire types, carried by the plan events of `agent::EventKind` (plan_created,
//! step_started, step_finished, replanned, flow_finished): plain strings and numbers, so a
//! terminal, the service's store or a web page can show the plan beside the timeline.

use serde::{Deserialize, Serialize};

use crate::tools::planning::Plan;

/// A plan as the events show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanView {
    pub id: String,
    pub title: String,
    pub steps: Vec<PlanStepView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStepView {
    pub text: String,
    /// not_started, in_progress, completed or blocked.
    pub status: String,
    pub notes: String,
}

impl From<&Plan> for PlanView {
    fn from(p: &Plan) -> Self {
        Self {
            id: p.id.clone(),
            title: p.title.clone(),
            steps: p
                .steps
                .iter()
                .map(|s| PlanStepView {
                    text: s.text.clone(),
                    status: s.status.as_str().to_string(),
                    notes: s.notes.clone(),
                })
                .collect(),
        }
    }
}

/// How a flow ended. Everything but `Completed` is a partial result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FlowStatus {
    /// Every step completed.
    Completed,
    /// A step is blocked after its retries (and any re-planning); `step` is 0-based.
    Blocked {
        step: usize,
        reason: String,
    },
    Cancelled,
    /// The flow's deadline ([flow] timeout_secs) passed.
    TimedOut,
    /// The flow's input-token budget ([flow] max_input_tokens) is spent.
    BudgetSpent {
        budget: u64,
        spent: u64,
    },
}

impl FlowStatus {
    pub fn is_success(&self) -> bool {
        matches!(self, FlowStatus::Completed)
    }

    pub fn describe(&self) -> String {
        match self {
            FlowStatus::Completed => "completed".into(),
            FlowStatus::Blocked { step, reason } => {
                format!("partial: step {} is blocked ({reason})", step + 1)
            }
            FlowStatus::Cancelled => "cancelled".into(),
            FlowStatus::TimedOut => "partial: the flow's deadline passed".into(),
            FlowStatus::BudgetSpent { budget, spent } => {
                format!("partial: the flow's input-token budget is spent ({spent} of {budget})")
            }
        }
    }
}
