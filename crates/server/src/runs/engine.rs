//! How a service run drives the engine: one agent run (`run_in_session`, continuing the
//! session's stored conversation) or the planning flow, both through the run's sink and asker;
//! and the `run_finished` serve writes itself (a run that never started).

use std::sync::Arc;

use super::sink::{ServiceAsker, ServiceSink};
use super::{Ending, LiveRun, RunMode, RunService, StartRun};
use sandboxd_core::agent::profiles::flow_config;
use sandboxd_core::agent::{
    EventKind, FinishReason, History, RunContext, RunRequest, run_in_session,
};
use sandboxd_core::flow::{AgentStepRunner, FlowRequest, FlowStatus, PlanningFlow};
use sandboxd_core::llm::Message;
use sandboxd_core::store::{RunPatch, RunState, conversation, now_ms};

impl RunService {
    pub(super) async fn execute(
        &self,
        ctx: &RunContext,
        live: &Arc<LiveRun>,
        req: &StartRun,
    ) -> Ending {
        if live.cancel.is_cancelled() {
            let reason = live.stop_reason().unwrap_or(FinishReason::Cancelled);
            self.finished_event(live, &reason, 0).await;
            return Ending {
                reason,
                answer: None,
                steps: 0,
            };
        }
        if let Err(e) = live.set_state(RunState::Running).await {
            tracing::error!(run = %live.id, error = %e, "cannot record the running state");
        }
        let sink = Arc::new(ServiceSink {
            run: live.clone(),
            model: ctx.config.llm.model.clone(),
        });
        let asker = Arc::new(ServiceAsker {
            run: live.clone(),
            timeout: self.question_timeout,
        });
        match req.mode {
            RunMode::Agent => self.run_agent(ctx, live, req, sink, asker).await,
            RunMode::Plan => run_plan(ctx, live, req, sink, asker).await,
        }
    }

    /// One agent run, continuing the session's stored conversation and storing it after.
    async fn run_agent(
        &self,
        ctx: &RunContext,
        live: &Arc<LiveRun>,
        req: &StartRun,
        sink: Arc<ServiceSink>,
        asker: Arc<ServiceAsker>,
    ) -> Ending {
        let history = match self.stored_conversation(&req.session_id).await {
            Ok(history) => history,
            Err(message) => {
                let reason = FinishReason::Error { message };
                self.finished_event(live, &reason, 0).await;
                return Ending {
                    reason,
                    answer: None,
                    steps: 0,
                };
            }
        };
        let mut request = RunRequest::new(req.task.clone());
        request.run_id = live.id.clone();
        request.max_steps = req.max_steps;
        request.history = History::Given(history);
        if let Some(profile) = &req.profile {
            request = request.with_profile(profile);
        }
        request.mcp_servers = req.mcp_servers.clone();
        match run_in_session(ctx, &req.session, request, asker, sink, live.cancel.clone()).await {
            Ok(outcome) => {
                self.keep_conversation(&req.session_id, &outcome.conversation)
                    .await;
                let mut reason = outcome.reason;
                // A stop the service made says why: a cancellation, and a failure under a
                // session whose sandbox ended meanwhile (`Stop::SessionEnded`, ends.rs).
                match live.stop_reason() {
                    Some(why) if reason == FinishReason::Cancelled => reason = why,
                    Some(why @ FinishReason::Error { .. })
                        if matches!(reason, FinishReason::Error { .. }) =>
                    {
                        reason = why
                    }
                    _ => {}
                }
                Ending {
                    reason,
                    answer: outcome.answer,
                    steps: outcome.steps,
                }
            }
            Err(e) => {
                let reason = FinishReason::Error {
                    message: e.to_string(),
                };
                self.finished_event(live, &reason, 0).await;
                Ending {
                    reason,
                    answer: None,
                    steps: 0,
                }
            }
        }
    }

    /// Stores the session's conversation for its next run; a failure is logged, the run's
    /// ending stands.
    async fn keep_conversation(&self, session_id: &str, conversation: &[Message]) {
        match conversation::encode(conversation) {
            Ok(text) => {
                if let Err(e) = self
                    .store
                    .set_conversation(session_id, text, now_ms())
                    .await
                {
                    tracing::error!(session = %session_id, error = %e, "cannot keep the conversation");
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot encode the conversation"),
        }
    }

    /// The conversation a run in `session_id` continues (empty for the session's first run).
    /// One that cannot be read or decoded fails the run with a message saying so: running
    /// the task as if nothing came before would answer a different question.
    async fn stored_conversation(&self, session_id: &str) -> Result<Vec<Message>, String> {
        match self.store.conversation(session_id).await {
            Ok(Some(text)) => conversation::decode(&text).map_err(|e| {
                tracing::error!(session = %session_id, error = %e, "cannot decode the conversation");
                format!(
                    "session {session_id}'s conversation cannot be continued: {e}; start a new session for this task"
                )
            }),
            Ok(None) => Ok(Vec::new()),
            Err(e) => {
                tracing::error!(session = %session_id, error = %e, "cannot read the conversation");
                Err(format!(
                    "session {session_id}'s conversation cannot be read: {e}; try again, or start a new session for this task"
                ))
            }
        }
    }

    /// A `run_finished` the service writes itself (the engine never ran, or failed to start).
    pub(super) async fn finished_event(&self, live: &LiveRun, reason: &FinishReason, steps: usize) {
        let kind = EventKind::RunFinished {
            reason: reason.clone(),
            answer: None,
            steps,
            prompt_tokens: 0,
            completion_tokens: 0,
            duration_ms: 0,
        };
        if let Err(e) = live.emit(kind, RunPatch::default()).await {
            tracing::error!(run = %live.id, error = %e, "cannot record run_finished");
        }
    }
}

/// The planning flow in the run's session; its summary is the answer.
async fn run_plan(
    ctx: &RunContext,
    live: &Arc<LiveRun>,
    req: &StartRun,
    sink: Arc<ServiceSink>,
    asker: Arc<ServiceAsker>,
) -> Ending {
    let runner = AgentStepRunner::new(ctx.clone(), req.session.clone(), asker)
        .with_max_steps(req.max_steps)
        .with_mcp_servers(req.mcp_servers.clone());
    let flow = PlanningFlow::new(ctx.llm.clone(), Arc::new(runner), flow_config(&ctx.config));
    let mut flow_request = FlowRequest::new(
        req.task.clone(),
        req.session.owner.to_string(),
        req.session.id.clone(),
    );
    flow_request.flow_id = live.id.replacen("run-", "flow-", 1);
    let out = flow.run(flow_request, sink, live.cancel.clone()).await;
    let reason = match &out.status {
        FlowStatus::Completed => FinishReason::FinalAnswer,
        FlowStatus::Cancelled => live.stop_reason().unwrap_or(FinishReason::Cancelled),
        other => FinishReason::Error {
            message: other.describe(),
        },
    };
    Ending {
        reason,
        answer: Some(out.summary),
        steps: out.attempts.len(),
    }
}
