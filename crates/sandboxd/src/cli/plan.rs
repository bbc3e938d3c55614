//! `sandboxd run --plan`: the planning flow on the session `run` created, and the live
//! checklist of its plan events (✓ done, ▶ running, ✗ blocked).

use std::io::Write;
use std::sync::Arc;

use sandboxd_core::agent::profiles::flow_config;
use sandboxd_core::agent::{Event, EventKind, EventSink, RunContext, RunRequest};
use sandboxd_core::flow::{AgentStepRunner, FlowOutcome, FlowRequest, PlanView, PlanningFlow};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::tools::ask_human::Asker;
use tokio_util::sync::CancellationToken;

use super::render::{clean, sayln, short};

/// Runs `request`'s task as a plan in `session`; events go to `sink` (the terminal).
pub(crate) async fn run_flow(
    ctx: &RunContext,
    session: &Arc<Session>,
    request: RunRequest,
    asker: Arc<dyn Asker>,
    sink: Arc<dyn EventSink>,
    cancel: CancellationToken,
) -> FlowOutcome {
    let runner = AgentStepRunner::new(ctx.clone(), session.clone(), asker)
        .with_mcp_servers(request.mcp_servers.clone())
        .with_max_steps(request.max_steps);
    let flow = PlanningFlow::new(ctx.llm.clone(), Arc::new(runner), flow_config(&ctx.config));
    let mut flow_request =
        FlowRequest::new(request.task, session.owner.to_string(), session.id.clone());
    flow_request.flow_id = request.run_id.replacen("run-", "flow-", 1);
    flow.run(flow_request, sink, cancel).await
}

fn checklist(plan: &PlanView) {
    for (i, s) in plan.steps.iter().enumerate() {
        let mark = match s.status.as_str() {
            "completed" => "✓",
            "in_progress" => "▶",
            "blocked" => "✗",
            _ => "·",
        };
        sayln!("   {mark} {}. {}", i + 1, short(&s.text, 160));
    }
}

/// Renders one plan event; other events are not ours.
pub(crate) fn show(ev: &Event) {
    match &ev.kind {
        EventKind::PlanCreated { plan, fallback } => {
            sayln!(
                "📋 plan {} · {} · {} steps",
                plan.id,
                short(&plan.title, 120),
                plan.steps.len()
            );
            if let Some(why) = fallback {
                sayln!("⚠ {}", short(why, 300));
            }
            checklist(plan);
        }
        EventKind::StepStarted {
            index,
            text,
            executor,
            attempt,
            ..
        } => {
            let again = if *attempt > 1 {
                format!(" (attempt {attempt})")
            } else {
                String::new()
            };
            let who = if executor == "default" {
                String::new()
            } else {
                format!(" [{executor}]")
            };
            sayln!("▶ step {}{who}{again}: {}", index + 1, short(text, 160));
        }
        EventKind::StepFinished {
            index,
            status,
            notes,
            ..
        } => {
            let mark = match status.as_str() {
                "completed" => "✓",
                "blocked" => "✗",
                _ => "↻",
            };
            sayln!("{mark} step {}: {}", index + 1, short(notes, 240));
        }
        EventKind::Replanned { plan, reason } => {
            sayln!("↻ re-planned ({}):", short(reason, 200));
            checklist(plan);
        }
        EventKind::FlowFinished {
            status,
            plan,
            summary,
            files,
            prompt_tokens,
            completion_tokens,
            duration_ms,
        } => {
            checklist(plan);
            // Model text: no escape sequence reaches the terminal.
            let mut out = std::io::stdout().lock();
            for line in summary.lines() {
                let _ = writeln!(out, "{}", clean(line));
            }
            let _ = out.flush();
            sayln!(
                "── flow {} · {} files · {prompt_tokens} prompt + {completion_tokens} completion tokens · {:.1}s",
                status.describe(),
                files.len(),
                *duration_ms as f64 / 1000.0
            );
        }
        _ => {}
    }
}
