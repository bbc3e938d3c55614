//! Deciding about one plan step: which executor its tag selects, and what its run's end
//! means for the step (done, failed and worth one more try, or stopped from outside).
//!
//! Upstream marked a step completed whenever its run returned, including after max_steps
//! or a spent token budget, and retried a step whose run raised without any bound.

use std::collections::BTreeMap;

use regex::Regex;

use super::runner::StepOutcome;
use crate::agent::FinishReason;
use crate::config::ExecutorConfig;
use crate::tools::planning::book::clean_line;

/// Characters of a step's answer kept as its notes.
pub const NOTES_CHARS: usize = 400;

/// How a step is run.
#[derive(Debug, Clone, PartialEq)]
pub struct Executor {
    /// The tag that selected it, or "default".
    pub name: String,
    /// None offers every tool of the session.
    pub tools: Option<Vec<String>>,
    pub prompt: Option<String>,
    pub max_steps: Option<usize>,
}

fn tag_pattern() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"\[([A-Za-z][A-Za-z0-9_-]{0,31})\]")
            .unwrap_or_else(|_| unreachable!("constant regex"))
    })
}

/// The first `[tag]` of a step, lower-cased with `-` read as `_` (so `[Data-Analysis]`,
/// `[DATA_ANALYSIS]` and `[data_analysis]` are one tag; upstream's routing broke on case).
pub fn tag_of(text: &str) -> Option<String> {
    tag_pattern()
        .captures(text)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_ascii_lowercase().replace('-', "_"))
}

/// The executor a step's tag selects; an untagged step or an unknown tag gets the default.
pub fn executor_for(text: &str, executors: &BTreeMap<String, ExecutorConfig>) -> Executor {
    if let Some(tag) = tag_of(text)
        && let Some(e) = executors.get(&tag)
    {
        return Executor {
            name: tag,
            tools: (!e.tools.is_empty()).then(|| e.tools.clone()),
            prompt: (!e.prompt.trim().is_empty()).then(|| e.prompt.clone()),
            max_steps: (e.max_steps > 0).then_some(e.max_steps),
        };
    }
    Executor {
        name: "default".into(),
        tools: None,
        prompt: None,
        max_steps: None,
    }
}

/// What a step's run ending means.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// terminate(success) or a final text answer.
    Done,
    /// max steps, the token budget, an error or terminate(failure): why.
    Failed(String),
    /// Cancelled from outside (the user, the deadline).
    Stopped,
}

pub fn verdict(outcome: &StepOutcome) -> Verdict {
    match &outcome.reason {
        FinishReason::Cancelled => Verdict::Stopped,
        r if r.is_success() => Verdict::Done,
        FinishReason::Terminated { .. } => Verdict::Failed(match &outcome.answer {
            Some(a) if !a.trim().is_empty() => {
                format!("the agent gave up: {}", clean_line(a, 200))
            }
            _ => "the agent gave up (terminate with status failure)".into(),
        }),
        r => Verdict::Failed(r.describe()),
    }
}

/// A completed step's notes: its own answer, else what the model noted with mark_step.
pub fn done_notes(outcome: &StepOutcome, model_notes: &str) -> String {
    match outcome.answer.as_deref().map(str::trim) {
        Some(a) if !a.is_empty() => clean_line(a, NOTES_CHARS),
        _ if !model_notes.trim().is_empty() => clean_line(model_notes, NOTES_CHARS),
        _ => format!(
            "completed ({}) without an answer",
            outcome.reason.describe()
        ),
    }
}

/// A failed attempt's notes: whether it is retried or the step is now blocked, why, and
/// the run's answer when `why` does not already hold it.
pub fn failed_notes(outcome: &StepOutcome, attempt: u32, last: bool, why: &str) -> String {
    let mut notes = if last {
        format!("blocked after {attempt} attempt(s): {why}")
    } else {
        format!("attempt {attempt} ended: {why}; retrying")
    };
    if !matches!(outcome.reason, FinishReason::Terminated { .. })
        && let Some(a) = outcome.answer.as_deref().filter(|a| !a.trim().is_empty())
    {
        notes.push_str(&format!(" (its answer: {a})"));
    }
    clean_line(&notes, 600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FlowConfig;
    use crate::llm::Usage;

    fn outcome(reason: FinishReason, answer: Option<&str>) -> StepOutcome {
        StepOutcome {
            run_id: "r".into(),
            reason,
            answer: answer.map(String::from),
            steps: 1,
            usage: Usage::default(),
        }
    }

    #[test]
    fn tags_select_executors_whatever_their_case() {
        let ex = FlowConfig::default().executors;
        assert_eq!(executor_for("[PYTHON] plot it", &ex).name, "python");
        assert_eq!(
            executor_for("Plot it [python]", &ex).tools,
            Some(vec!["python".to_string(), "str_replace_editor".to_string()])
        );
        assert_eq!(executor_for("[search] find", &ex).name, "default");
        assert_eq!(executor_for("no tag", &ex).tools, None);
        assert_eq!(
            tag_of("[Data-Analysis] x").as_deref(),
            Some("data_analysis")
        );
        assert_eq!(tag_of("[1] x"), None);
    }

    #[test]
    fn only_success_completes_a_step() {
        let ok = outcome(
            FinishReason::Terminated {
                status: "success".into(),
            },
            Some("did it"),
        );
        assert_eq!(verdict(&ok), Verdict::Done);
        assert_eq!(done_notes(&ok, ""), "did it");
        assert_eq!(
            verdict(&outcome(FinishReason::FinalAnswer, Some("x"))),
            Verdict::Done
        );
        for r in [
            FinishReason::MaxSteps { max_steps: 3 },
            FinishReason::TokenBudget {
                budget: 1,
                spent: 2,
            },
            FinishReason::Error {
                message: "boom".into(),
            },
            FinishReason::Terminated {
                status: "failure".into(),
            },
        ] {
            assert!(
                matches!(verdict(&outcome(r.clone(), None)), Verdict::Failed(_)),
                "{r:?}"
            );
        }
        assert_eq!(
            verdict(&outcome(FinishReason::Cancelled, None)),
            Verdict::Stopped
        );
        let bare = outcome(
            FinishReason::Terminated {
                status: "success".into(),
            },
            None,
        );
        assert_eq!(done_notes(&bare, "noted"), "noted");
        let gave_up = outcome(
            FinishReason::Terminated {
                status: "failure".into(),
            },
            Some("no data"),
        );
        let Verdict::Failed(why) = verdict(&gave_up) else {
            panic!("terminate(failure) is a failure")
        };
        assert_eq!(
            failed_notes(&gave_up, 2, true, &why),
            "blocked after 2 attempt(s): the agent gave up: no data"
        );
        let maxed = outcome(FinishReason::MaxSteps { max_steps: 3 }, Some("half"));
        assert_eq!(
            failed_notes(&maxed, 1, false, "reached max_steps (3)"),
            "attempt 1 ended: reached max_steps (3); retrying (its answer: half)"
        );
    }
}
