//! One run of the planning flow: plan, steps in order, summary. Every loop here is bounded:
//! at most `max_plan_steps` steps, each at most `1 + step_retries` runs, at most
//! `max_replans` re-plannings, all under one deadline and one token budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::planner::{self, Answer, Planner};
use super::runner::{StepOutcome, StepRequest};
use super::steps::{self, Verdict};
use super::{FlowOutcome, FlowRequest, PlanningFlow, StepAttempt, prompts, summary};
use crate::agent::sink::Emitter;
use crate::agent::{EventKind, EventSink, FinishReason, new_run_id};
use crate::events::{FlowStatus, PlanView};
use crate::llm::Usage;
use crate::tools::planning::{Plan, PlanBook, StepStatus};

/// Cancels the flow when its deadline passes; stops watching when dropped.
struct Watchdog(tokio::task::JoinHandle<()>);

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One attempt at a plan step: the step's index and text, the attempt's number (from 1) and
/// the executor its tag chose.
#[derive(Clone, Copy)]
struct StepTry<'s> {
    i: usize,
    attempt: u32,
    text: &'s str,
    executor: &'s steps::Executor,
}

/// What running one step came to.
enum StepEnd {
    Completed,
    /// Blocked after its retries; why.
    Blocked(String),
    /// The flow must stop with this status.
    Stop(FlowStatus),
}

pub(super) struct FlowRun<'a> {
    flow: &'a PlanningFlow,
    request: FlowRequest,
    /// Where the flow's events and every step's run's events go.
    sink: Arc<dyn EventSink>,
    emitter: Emitter<'a>,
    /// The flow's own token: the caller's cancel and the deadline both cancel it.
    cancel: CancellationToken,
    deadline_hit: Arc<AtomicBool>,
    _watchdog: Watchdog,
    book: Arc<PlanBook>,
    plan_id: String,
    fallback: Option<String>,
    usage: Usage,
    attempts: Vec<StepAttempt>,
    replans: u32,
    started: Instant,
}

impl<'a> FlowRun<'a> {
    pub(super) fn new(
        flow: &'a PlanningFlow,
        request: FlowRequest,
        sink: &'a Arc<dyn EventSink>,
        cancel: CancellationToken,
    ) -> Self {
        let cancel = cancel.child_token();
        let deadline_hit = Arc::new(AtomicBool::new(false));
        let timeout = Duration::from_secs(flow.config.timeout_secs.max(1));
        let watchdog = {
            let (cancel, hit) = (cancel.clone(), deadline_hit.clone());
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                hit.store(true, Ordering::SeqCst);
                cancel.cancel();
            })
        };
        Self {
            emitter: Emitter::new(request.flow_id.clone(), sink.as_ref()),
            flow,
            request,
            sink: sink.clone(),
            cancel,
            deadline_hit,
            _watchdog: Watchdog(watchdog),
            book: flow.runner.plans(),
            plan_id: String::new(),
            fallback: None,
            usage: Usage::default(),
            attempts: Vec::new(),
            replans: 0,
            started: Instant::now(),
        }
    }

    pub(super) async fn execute(mut self) -> FlowOutcome {
        let status = self.steps().await;
        self.finish(status).await
    }

    fn stopped(&self) -> FlowStatus {
        if self.deadline_hit.load(Ordering::SeqCst) {
            FlowStatus::TimedOut
        } else {
            FlowStatus::Cancelled
        }
    }

    /// The budget left, if the flow has one.
    fn remaining(&self) -> Option<u64> {
        let budget = self.flow.config.max_input_tokens;
        (budget > 0).then(|| budget.saturating_sub(self.usage.prompt_tokens))
    }

    fn budget_spent(&self) -> FlowStatus {
        FlowStatus::BudgetSpent {
            budget: self.flow.config.max_input_tokens,
            spent: self.usage.prompt_tokens,
        }
    }

    fn planner(&mut self) -> Planner<'_> {
        Planner {
            llm: &self.flow.llm,
            book: &self.book,
            cancel: &self.cancel,
            usage: &mut self.usage,
            retries: Vec::new(),
        }
    }

    async fn emit_all(&mut self, kinds: Vec<EventKind>) {
        for kind in kinds {
            self.emitter.emit(kind).await;
        }
    }

    async fn plan(&self) -> Result<Plan, FlowStatus> {
        self.book
            .get(Some(&self.plan_id))
            .await
            .map_err(|e| FlowStatus::Blocked {
                step: 0,
                reason: format!("the plan is gone: {e}"),
            })
    }

    /// Plans, then runs the steps; returns how the flow ended.
    async fn steps(&mut self) -> FlowStatus {
        let flow = self.flow;
        let config = &flow.config;
        let system = prompts::planner(self.book.max_steps(), &config.executors);
        let task = self.request.task.clone();
        let mut planner = self.planner();
        let answer = planner.create(system, &task).await;
        let retries = std::mem::take(&mut planner.retries);
        self.emit_all(retries).await;
        let plan = match answer {
            Answer::Plan(p) => p,
            Answer::Cancelled => return self.stopped(),
            Answer::Invalid(why) => match planner::default_plan(&self.book, &task).await {
                Ok(p) => {
                    self.fallback = Some(format!(
                        "the planner gave no valid plan twice ({why}); using the default one-step plan"
                    ));
                    p
                }
                Err(e) => {
                    return FlowStatus::Blocked {
                        step: 0,
                        reason: format!("no plan could be made: {e}"),
                    };
                }
            },
        };
        self.plan_id = plan.id.clone();
        self.emitter
            .emit(EventKind::PlanCreated {
                plan: PlanView::from(&plan),
                fallback: self.fallback.clone(),
            })
            .await;
        let mut blocked_why = String::new();
        loop {
            if self.cancel.is_cancelled() {
                return self.stopped();
            }
            if self.remaining() == Some(0) {
                return self.budget_spent();
            }
            let plan = match self.plan().await {
                Ok(p) => p,
                Err(status) => return status,
            };
            let Some(i) = plan
                .steps
                .iter()
                .position(|s| s.status != StepStatus::Completed)
            else {
                return FlowStatus::Completed;
            };
            if plan.steps[i].status == StepStatus::Blocked {
                if blocked_why.is_empty() {
                    blocked_why = plan.steps[i].notes.clone();
                }
                match self.replan(&plan, i, &blocked_why).await {
                    Ok(true) => continue,
                    Ok(false) => {
                        return FlowStatus::Blocked {
                            step: i,
                            reason: blocked_why,
                        };
                    }
                    Err(status) => return status,
                }
            }
            match self.run_step(&plan, i).await {
                StepEnd::Completed => {}
                StepEnd::Blocked(why) => blocked_why = why,
                StepEnd::Stop(status) => return status,
            }
        }
    }

    /// Runs step `i` until it completes, is blocked after its retries, or the flow stops.
    async fn run_step(&mut self, plan: &Plan, i: usize) -> StepEnd {
        let flow = self.flow;
        let config = &flow.config;
        let text = plan.steps[i].text.clone();
        let executor = steps::executor_for(&text, &config.executors);
        let mut retry: Option<(u32, String, String)> = None;
        for attempt in 1..=config.step_retries.min(crate::config::flow::MAX_RETRIES) + 1 {
            let step = StepTry {
                i,
                attempt,
                text: &text,
                executor: &executor,
            };
            let (run_id, outcome) = match self.attempt(&step, retry.take()).await {
                Ok(ran) => ran,
                Err(end) => return end,
            };
            let (status, notes, end) = self.judge(&step, &outcome, &mut retry).await;
            let _ = self
                .book
                .mark_step(Some(&self.plan_id), i, Some(status), Some(&notes))
                .await;
            self.emitter
                .emit(EventKind::StepFinished {
                    index: i,
                    status: status.as_str().to_string(),
                    notes,
                    reason: outcome.reason,
                    attempt,
                    step_run_id: run_id,
                })
                .await;
            if let Some(end) = end {
                return end;
            }
        }
        // Unreachable in practice: the last attempt always ends the loop above.
        StepEnd::Blocked("no attempts left".into())
    }

    /// One run of a step: marked in progress, announced, run and recorded among the attempts.
    /// Returns the attempt's run id and how its run ended.
    async fn attempt(
        &mut self,
        step: &StepTry<'_>,
        retry: Option<(u32, String, String)>,
    ) -> Result<(String, StepOutcome), StepEnd> {
        let StepTry {
            i,
            attempt,
            text,
            executor,
        } = *step;
        // The model's own mark_step notes of this attempt start empty.
        let now = self
            .book
            .mark_step(
                Some(&self.plan_id),
                i,
                Some(StepStatus::InProgress),
                Some(""),
            )
            .await;
        let Ok(now) = now else {
            return Err(StepEnd::Stop(FlowStatus::Blocked {
                step: i,
                reason: "the plan changed under the flow".into(),
            }));
        };
        let prompt = prompts::step(&prompts::StepPrompt {
            task: &self.request.task,
            plan: &now.render(),
            n: i + 1,
            total: now.steps.len(),
            step: text,
            retry,
        });
        let run_id = new_run_id();
        self.emitter
            .emit(EventKind::StepStarted {
                index: i,
                text: text.to_string(),
                executor: executor.name.clone(),
                attempt,
                step_run_id: run_id.clone(),
            })
            .await;
        let request = StepRequest {
            run_id: run_id.clone(),
            prompt,
            tools: executor.tools.clone(),
            system_note: executor.prompt.clone(),
            max_steps: executor.max_steps,
            max_input_tokens: self.remaining().unwrap_or(0),
            plan_id: self.plan_id.clone(),
            step_index: i,
        };
        let outcome = self
            .flow
            .runner
            .run_step(request, self.sink.clone(), self.cancel.clone())
            .await;
        self.usage.add(outcome.usage);
        self.attempts.push(StepAttempt {
            index: i,
            attempt,
            run_id: run_id.clone(),
            executor: executor.name.clone(),
            reason: outcome.reason.clone(),
            answer: outcome.answer.clone(),
            steps: outcome.steps,
        });
        Ok((run_id, outcome))
    }

    /// What an attempt's outcome makes of the step: its status, its notes and, unless it is
    /// tried again (then `retry` says why), how the step ends.
    async fn judge(
        &self,
        step: &StepTry<'_>,
        outcome: &StepOutcome,
        retry: &mut Option<(u32, String, String)>,
    ) -> (StepStatus, String, Option<StepEnd>) {
        let (i, attempt) = (step.i, step.attempt);
        let model_notes = self
            .book
            .get(Some(&self.plan_id))
            .await
            .ok()
            .and_then(|p| p.steps.get(i).map(|s| s.notes.clone()))
            .unwrap_or_default();
        let verdict = match steps::verdict(outcome) {
            // A run cancelled by the deadline or the user, or one that failed because
            // of it, is the flow stopping, not the step failing.
            Verdict::Failed(_) if self.cancel.is_cancelled() => Verdict::Stopped,
            v => v,
        };
        match verdict {
            Verdict::Done => (
                StepStatus::Completed,
                steps::done_notes(outcome, &model_notes),
                Some(StepEnd::Completed),
            ),
            Verdict::Stopped => {
                let status = self.stopped();
                let notes = format!("interrupted: {}", status.describe());
                (StepStatus::InProgress, notes, Some(StepEnd::Stop(status)))
            }
            Verdict::Failed(why) => {
                let flow_budget = self.flow.config.max_input_tokens > 0
                    && matches!(outcome.reason, FinishReason::TokenBudget { .. });
                let last = attempt > self.flow.config.step_retries || flow_budget;
                let notes = steps::failed_notes(outcome, attempt, last, &why);
                if last {
                    let end = if flow_budget {
                        StepEnd::Stop(self.budget_spent())
                    } else {
                        StepEnd::Blocked(why)
                    };
                    (StepStatus::Blocked, notes, Some(end))
                } else {
                    *retry = Some((attempt + 1, why, model_notes.clone()));
                    (StepStatus::InProgress, notes, None)
                }
            }
        }
    }

    /// One bounded re-planning after step `i` is blocked; Ok(true) when the plan changed.
    async fn replan(&mut self, plan: &Plan, i: usize, why: &str) -> Result<bool, FlowStatus> {
        let max = self
            .flow
            .config
            .max_replans
            .min(crate::config::flow::MAX_REPLANS);
        if self.replans >= max || self.cancel.is_cancelled() || self.remaining() == Some(0) {
            return Ok(false);
        }
        self.replans += 1;
        let system = prompts::planner(self.book.max_steps(), &self.flow.config.executors);
        let prompt = prompts::replan(&prompts::Replan {
            task: &self.request.task,
            plan: &plan.render(),
            plan_id: &plan.id,
            n: i + 1,
            step: &plan.steps[i].text,
            why,
            max_steps: self.book.max_steps(),
        });
        let plan_id = self.plan_id.clone();
        let mut planner = self.planner();
        let answer = planner.replan(system, prompt, &plan_id).await;
        let retries = std::mem::take(&mut planner.retries);
        self.emit_all(retries).await;
        match answer {
            Answer::Plan(p) => {
                self.emitter
                    .emit(EventKind::Replanned {
                        plan: PlanView::from(&p),
                        reason: format!("step {} was blocked: {why}", i + 1),
                    })
                    .await;
                Ok(true)
            }
            Answer::Invalid(e) => {
                self.emitter
                    .emit(EventKind::Error {
                        message: format!("re-planning gave no usable plan: {e}"),
                    })
                    .await;
                Ok(false)
            }
            Answer::Cancelled => Err(self.stopped()),
        }
    }

    /// The summary and the outcome; a stopped flow returns its partial result at once.
    async fn finish(mut self, status: FlowStatus) -> FlowOutcome {
        let plan = self
            .book
            .get(Some(&self.plan_id))
            .await
            .unwrap_or_else(|_| Plan {
                id: self.plan_id.clone(),
                title: "no plan".into(),
                steps: Vec::new(),
            });
        let files = self.flow.runner.workspace_files().await;
        let mut usage = self.usage;
        let writes = matches!(status, FlowStatus::Completed | FlowStatus::Blocked { .. })
            && !self.cancel.is_cancelled()
            && self.remaining() != Some(0)
            && !plan.steps.is_empty();
        let text = if writes {
            let answers: Vec<Option<String>> = (0..plan.steps.len())
                .map(|i| {
                    let last = self.attempts.iter().rev().find(|a| a.index == i);
                    last.and_then(|a| a.answer.clone())
                })
                .collect();
            let request = summary::request(&self.request.task, &plan, &answers, &files);
            summary::write(&self.flow.llm, request, &self.cancel, &mut usage).await
        } else {
            None
        };
        let summary = match text {
            Some(t) => match summary::headline(&status, &plan) {
                Some(h) => format!("{h}\n\n{}", t.trim()),
                None => t.trim().to_string(),
            },
            None => summary::plain(&status, &plan, &files),
        };
        let elapsed = self.started.elapsed();
        self.emitter
            .emit(EventKind::FlowFinished {
                status: status.clone(),
                plan: PlanView::from(&plan),
                summary: summary.clone(),
                files: files.clone(),
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                duration_ms: elapsed.as_millis() as u64,
            })
            .await;
        FlowOutcome {
            flow_id: self.request.flow_id.clone(),
            status,
            plan,
            planner_fallback: self.fallback.clone(),
            attempts: self.attempts,
            summary,
            files,
            usage,
            replans: self.replans,
            elapsed,
        }
    }
}
