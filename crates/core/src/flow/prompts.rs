//! The flow's prompts, kept as Markdown beside this module; `{placeholders}` are filled
//! here. Model text put into them (steps, notes, answers) is already cleaned by the plan
//! book or cut by the caller.

use std::collections::BTreeMap;

use crate::config::ExecutorConfig;

const PLANNER: &str = include_str!("prompts/planner.md");
const PLANNER_TASK: &str = include_str!("prompts/planner_task.md");
const PLANNER_AGAIN: &str = include_str!("prompts/planner_again.md");
const STEP: &str = include_str!("prompts/step.md");
const STEP_RETRY: &str = include_str!("prompts/step_retry.md");
const REPLAN: &str = include_str!("prompts/replan.md");
const SUMMARY: &str = include_str!("prompts/summary.md");
const SUMMARY_TASK: &str = include_str!("prompts/summary_task.md");

/// Fills `{key}` placeholders in one pass over the template, so a value that happens to
/// contain `{plan}` (model or user text) is never expanded itself.
fn fill(template: &str, pairs: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let value = after.find('}').and_then(|close| {
            let key = &after[..close];
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v, close))
        });
        match value {
            Some((v, close)) => {
                out.push_str(v);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.trim_end().to_string()
}

/// The planner's system prompt, with the executor tags it may use.
pub(super) fn planner(max_steps: usize, executors: &BTreeMap<String, ExecutorConfig>) -> String {
    let mut tags = String::new();
    if !executors.is_empty() {
        tags.push_str(
            "\nA step may start with a tag that chooses who runs it; untagged steps are run by the general agent:\n",
        );
        for (tag, e) in executors {
            let what = if e.description.is_empty() {
                "a specialised executor"
            } else {
                e.description.as_str()
            };
            tags.push_str(&format!("- [{tag}]: {what}\n"));
        }
    }
    fill(
        PLANNER,
        &[("max_steps", &max_steps.to_string()), ("executors", &tags)],
    )
}

pub(super) fn planner_task(task: &str) -> String {
    fill(PLANNER_TASK, &[("task", task)])
}

pub(super) fn planner_again(why: &str, max_steps: usize) -> String {
    fill(
        PLANNER_AGAIN,
        &[("why", why), ("max_steps", &max_steps.to_string())],
    )
}

/// What a step's run is asked to do.
pub(super) struct StepPrompt<'a> {
    pub task: &'a str,
    pub plan: &'a str,
    /// 1-based, as people count.
    pub n: usize,
    pub total: usize,
    pub step: &'a str,
    /// For a retry: the attempt number, how the last one ended and its notes.
    pub retry: Option<(u32, String, String)>,
}

pub(super) fn step(p: &StepPrompt<'_>) -> String {
    let n = p.n.to_string();
    let retry = match &p.retry {
        Some((attempt, reason, notes)) => {
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" Its notes: {notes}.")
            };
            format!(
                "{}\n\n",
                fill(
                    STEP_RETRY,
                    &[
                        ("attempt", &attempt.to_string()),
                        ("n", &n),
                        ("reason", reason),
                        ("notes", &notes),
                    ],
                )
            )
        }
        None => String::new(),
    };
    fill(
        STEP,
        &[
            ("task", p.task),
            ("plan", p.plan),
            ("n", &n),
            ("total", &p.total.to_string()),
            ("step", p.step),
            ("retry", &retry),
        ],
    )
}

pub(super) struct Replan<'a> {
    pub task: &'a str,
    pub plan: &'a str,
    pub plan_id: &'a str,
    pub n: usize,
    pub step: &'a str,
    pub why: &'a str,
    pub max_steps: usize,
}

pub(super) fn replan(r: &Replan<'_>) -> String {
    fill(
        REPLAN,
        &[
            ("task", r.task),
            ("plan", r.plan),
            ("plan_id", r.plan_id),
            ("n", &r.n.to_string()),
            ("step", r.step),
            ("why", r.why),
            ("max_steps", &r.max_steps.to_string()),
        ],
    )
}

pub(super) fn summary() -> String {
    SUMMARY.trim_end().to_string()
}

pub(super) fn summary_task(
    task: &str,
    title: &str,
    done: usize,
    total: usize,
    steps: &str,
    files: &str,
) -> String {
    fill(
        SUMMARY_TASK,
        &[
            ("task", task),
            ("title", title),
            ("done", &done.to_string()),
            ("total", &total.to_string()),
            ("steps", steps),
            ("files", files),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled() {
        let s = step(&StepPrompt {
            task: "T",
            plan: "P",
            n: 2,
            total: 3,
            step: "S",
            retry: Some((2, "reached max_steps (3)".into(), String::new())),
        });
        assert!(s.contains("Do step 2 only.") && s.contains("attempt 2 of step 2"));
        assert!(!s.contains('{'), "{s}");
        let p = planner(4, &crate::config::FlowConfig::default().executors);
        assert!(p.contains("At most 4 steps") && p.contains("- [python]:"));
        assert!(!p.contains('{'));
        assert_eq!(
            fill("a {x} {y} {z", &[("x", "{y}"), ("y", "b")]),
            "a {y} b {z"
        );
    }
}
