//! The flow's closing summary, built from what the steps produced: each step's status and
//! notes, an excerpt of its run's answer, and the files under /workspace. Upstream's
//! summary saw only the step titles and statuses.
//!
//! The LLM writes the summary when the flow ended normally; a cancelled or timed-out flow,
//! or a failed summary call, gets the plain one built here, which says the same facts.

use tokio_util::sync::CancellationToken;

use super::prompts;
use crate::events::FlowStatus;
use crate::llm::{LlmClient, Message, Usage};
use crate::tools::planning::{Plan, StepStatus};

/// Characters of a step's answer shown to the summarizer.
const RESULT_EXCERPT: usize = 1500;
/// Characters of a step's notes in the plain summary.
const PLAIN_NOTES: usize = 400;

/// `text` with control characters other than newlines removed, cut to `max` characters.
pub fn excerpt(text: &str, max: usize) -> String {
    let clean: String = text
        .trim()
        .chars()
        .filter(|c| *c == '\n' || !c.is_control())
        .collect();
    match clean.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &clean[..at]),
        None => clean,
    }
}

fn files_block(files: &[String]) -> String {
    if files.is_empty() {
        return "(none)".into();
    }
    files
        .iter()
        .map(|f| format!("- {f}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The summarizer's request: the task, every step with its notes and result, the files.
/// `answers[i]` is the last answer of step i's runs, if it ran.
pub fn request(task: &str, plan: &Plan, answers: &[Option<String>], files: &[String]) -> String {
    let mut steps = String::new();
    for (i, s) in plan.steps.iter().enumerate() {
        steps.push_str(&format!(
            "Step {} [{}]: {}\n",
            i + 1,
            s.status.as_str(),
            s.text
        ));
        if !s.notes.is_empty() {
            steps.push_str(&format!("  Notes: {}\n", s.notes));
        }
        if let Some(a) = answers.get(i).and_then(|a| a.as_deref())
            && !a.trim().is_empty()
            && a.trim() != s.notes
        {
            steps.push_str(&format!(
                "  Result: {}\n",
                excerpt(a, RESULT_EXCERPT).replace('\n', "\n    ")
            ));
        }
    }
    prompts::summary_task(
        task,
        &plan.title,
        plan.count(StepStatus::Completed),
        plan.steps.len(),
        &steps,
        &files_block(files),
    )
}

/// Asks the LLM (no tools) to write the summary from `request`; None when it fails or
/// answers nothing, and the caller uses the plain summary.
pub async fn write(
    llm: &LlmClient,
    request: String,
    cancel: &CancellationToken,
    usage: &mut Usage,
) -> Option<String> {
    let messages = [Message::system(prompts::summary()), Message::user(request)];
    match llm.chat(&messages, &[], cancel, &|_| {}).await {
        Ok(c) => {
            usage.add(c.usage);
            c.content.filter(|t| !t.trim().is_empty())
        }
        Err(e) => {
            tracing::warn!(error = %e, "the summary call failed; using the plain summary");
            None
        }
    }
}

/// The first line of a partial result: what stopped the flow, naming the step.
pub fn headline(status: &FlowStatus, plan: &Plan) -> Option<String> {
    let text = |i: usize| plan.steps.get(i).map(|s| s.text.as_str()).unwrap_or("?");
    let running = plan
        .steps
        .iter()
        .position(|s| s.status == StepStatus::InProgress);
    let at = |what: &str| match running {
        Some(i) => format!(
            "Partial result: {what} during step {} (\"{}\").",
            i + 1,
            text(i)
        ),
        None => format!("Partial result: {what}."),
    };
    Some(match status {
        FlowStatus::Completed => return None,
        FlowStatus::Blocked { step, reason } => format!(
            "Partial result: step {} of {} (\"{}\") is blocked: {reason}.",
            step + 1,
            plan.steps.len(),
            text(*step)
        ),
        FlowStatus::Cancelled => at("the flow was cancelled"),
        FlowStatus::TimedOut => at("the flow's deadline passed"),
        FlowStatus::BudgetSpent { budget, spent } => at(&format!(
            "the flow's input-token budget is spent ({spent} of {budget})"
        )),
    })
}

/// The summary written without the LLM: the headline, the checklist with notes, the files.
pub fn plain(status: &FlowStatus, plan: &Plan, files: &[String]) -> String {
    let mut out = String::new();
    if let Some(h) = headline(status, plan) {
        out.push_str(&h);
        out.push_str("\n\n");
    }
    out.push_str(&format!(
        "{}: {} of {} steps completed.\n",
        plan.title,
        plan.count(StepStatus::Completed),
        plan.steps.len()
    ));
    for (i, s) in plan.steps.iter().enumerate() {
        out.push_str(&format!("{} {}. {}\n", s.status.mark(), i + 1, s.text));
        if !s.notes.is_empty() {
            out.push_str(&format!("   {}\n", excerpt(&s.notes, PLAIN_NOTES)));
        }
    }
    out.push_str(&format!("Files in /workspace:\n{}", files_block(files)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::planning::PlanBook;

    #[tokio::test]
    async fn the_request_carries_notes_results_and_files() {
        let book = PlanBook::new(5);
        book.create("T", &["a".into(), "b".into()]).await.unwrap();
        book.mark_step(None, 0, Some(StepStatus::Completed), Some("wrote x.csv"))
            .await
            .unwrap();
        book.mark_step(None, 1, Some(StepStatus::Blocked), Some("no data"))
            .await
            .unwrap();
        let plan = book.get(None).await.unwrap();
        let answers = vec![Some("long answer\x1b[2J\nline two".to_string()), None];
        let r = request("task", &plan, &answers, &["x.csv".into()]);
        assert!(r.contains("Notes: wrote x.csv") && r.contains("Notes: no data"));
        assert!(r.contains("Result: long answer[2J\n    line two"), "{r}");
        assert!(r.contains("- x.csv"));
        let status = FlowStatus::Blocked {
            step: 1,
            reason: "reached max_steps (2) twice".into(),
        };
        let p = plain(&status, &plan, &[]);
        assert!(
            p.starts_with("Partial result: step 2 of 2 (\"b\") is blocked"),
            "{p}"
        );
        assert!(p.contains("✓ 1. a") && p.contains("✗ 2. b") && p.contains("(none)"));
    }
}
