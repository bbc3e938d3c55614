//! The flow's `StepRunner` over `run_in_session`, the one entry point of a run: each step is
//! a run in the flow's session, so every step talks to the same container, persistent shell,
//! python interpreter and browser (OpenManus tore its sandbox and browser down after every
//! step). A step starts a fresh conversation: what it needs from earlier steps is in the
//! plan's notes and in the sandbox, not in an ever-growing memory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::runner::{StepOutcome, StepRequest, StepRunner};
use crate::agent::{
    EventSink, FinishReason, History, RunContext, RunRequest, RunShape, run_in_session,
};
use crate::llm::Usage;
use crate::sandbox::ExecRequest;
use crate::sandbox::manager::Session;
use crate::tools::ask_human::Asker;
use crate::tools::planning::{self, PlanBook, PlanningTool};

/// Most files listed for the summary.
const MAX_FILES: usize = 300;

pub struct AgentStepRunner {
    ctx: RunContext,
    session: Arc<Session>,
    asker: Arc<dyn Asker>,
    /// MCP servers for the default executor's steps (a tool subset leaves them out).
    mcp_servers: Option<PathBuf>,
    /// Most agent steps per run unless the executor says otherwise; None: [agent].
    max_steps: Option<usize>,
    plans: Arc<PlanBook>,
}

impl AgentStepRunner {
    /// Steps run in `session`, with the session's own plans.
    pub fn new(ctx: RunContext, session: Arc<Session>, asker: Arc<dyn Asker>) -> Self {
        let plans = PlanBook::of(&session, ctx.config.flow.max_plan_steps);
        Self {
            ctx,
            session,
            asker,
            mcp_servers: None,
            max_steps: None,
            plans,
        }
    }

    pub fn with_mcp_servers(mut self, path: Option<PathBuf>) -> Self {
        self.mcp_servers = path;
        self
    }

    pub fn with_max_steps(mut self, n: Option<usize>) -> Self {
        self.max_steps = n;
        self
    }
}

#[async_trait]
impl StepRunner for AgentStepRunner {
    async fn run_step(
        &self,
        request: StepRequest,
        sink: Arc<dyn EventSink>,
        cancel: CancellationToken,
    ) -> StepOutcome {
        let scoped =
            PlanningTool::for_step(self.plans.clone(), &request.plan_id, request.step_index);
        // MCP servers add tools to the run, so only the default executor, which offers
        // everything, connects them.
        let mcp_servers = match &request.tools {
            None => self.mcp_servers.clone(),
            Some(_) => None,
        };
        let run = RunRequest {
            run_id: request.run_id.clone(),
            task: request.prompt,
            max_steps: request.max_steps.or(self.max_steps),
            mcp_servers,
            history: History::Fresh,
            shape: RunShape {
                tools: request.tools,
                extra_tools: vec![Arc::new(scoped)],
                system_note: request.system_note,
                max_input_tokens: request.max_input_tokens,
            },
        };
        let asker = self.asker.clone();
        match run_in_session(&self.ctx, &self.session, run, asker, sink, cancel).await {
            Ok(o) => StepOutcome {
                run_id: o.run_id,
                reason: o.reason,
                answer: o.answer,
                steps: o.steps,
                usage: o.usage,
            },
            // The run did not start (an MCP server file that cannot be used): a failed step.
            Err(e) => StepOutcome {
                run_id: request.run_id,
                reason: FinishReason::Error {
                    message: e.to_string(),
                },
                answer: None,
                steps: 0,
                usage: Usage::default(),
            },
        }
    }

    fn plans(&self) -> Arc<PlanBook> {
        self.plans.clone()
    }

    async fn workspace_files(&self) -> Vec<String> {
        let mut req = ExecRequest::shell_line(format!(
            "find /workspace -xdev -type f -printf '%P\\0' 2>/dev/null | head -z -n {MAX_FILES}"
        ))
        .timeout(Duration::from_secs(5));
        req.output_cap = 256 * 1024;
        match self.session.sandbox.exec(req).await {
            Ok(out) => parse_file_list(&out.stdout),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list /workspace for the flow's summary");
                Vec::new()
            }
        }
    }
}

/// NUL-separated names from the sandbox: hostile bytes, so cleaned to one printable line each.
pub fn parse_file_list(raw: &[u8]) -> Vec<String> {
    let mut files: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|name| planning::book::clean_line(&String::from_utf8_lossy(name), 300))
        .filter(|n| !n.is_empty())
        .take(MAX_FILES)
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    #[test]
    fn file_names_are_cleaned() {
        let files = super::parse_file_list(b"b.txt\0a\x1b[31m\n.csv\0\0");
        assert_eq!(files, vec!["a [31m .csv", "b.txt"]);
    }
}
