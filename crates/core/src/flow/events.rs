//! How a plan of the planning tool becomes the `PlanView` the run events carry (the event
//! vocabulary itself is the ground floor's: `crate::events`).

use crate::events::{PlanStepView, PlanView};
use crate::tools::planning::Plan;

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
