//! Plan creation and re-planning: one LLM call offered only the planning tool, its answer
//! checked before anything is stored.
//!
//! Upstream parsed the first `planning` call, overwrote its plan id with a timestamp and let
//! any exception from the tool end the whole flow ("Execution failed"); a reply without a
//! call silently became a three-step default plan. Here a bad answer is shown to the model
//! once with what was wrong, and the flow says in its events when it falls back.

use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::prompts;
use crate::agent::EventKind;
use crate::llm::{Completion, LlmClient, LlmError, Message, Usage};
use crate::tools::Tool;
use crate::tools::planning::{self, Plan, PlanBook, PlanningTool};
use crate::tools::registry::check_args;

/// What asking the planner gave.
pub(super) enum Answer {
    Plan(Plan),
    /// Not a usable plan; why, for the model and the events.
    Invalid(String),
    Cancelled,
}

/// The LLM side of planning, shared by creation and re-planning.
pub(super) struct Planner<'a> {
    pub llm: &'a LlmClient,
    pub book: &'a Arc<PlanBook>,
    pub cancel: &'a CancellationToken,
    pub usage: &'a mut Usage,
    /// Retry events of the LLM calls, for the caller to send (the client's callback is
    /// synchronous, the sink is not).
    pub retries: Vec<EventKind>,
}

impl Planner<'_> {
    fn tool_json(&self) -> Value {
        let tool = PlanningTool::new(self.book.clone());
        serde_json::json!({"type": "function", "function": {
            "name": tool.name(), "description": tool.description(), "parameters": tool.parameters()}})
    }

    async fn ask(&mut self, messages: &[Message]) -> Result<Completion, LlmError> {
        let notices = std::sync::Mutex::new(Vec::new());
        let on_retry = |n: crate::llm::RetryNotice| {
            if let Ok(mut v) = notices.lock() {
                v.push(EventKind::Retry {
                    attempt: n.attempt,
                    max_attempts: n.max_attempts,
                    delay_ms: n.delay.as_millis() as u64,
                    reason: n.reason,
                });
            }
        };
        let tools = [self.tool_json()];
        let result = self
            .llm
            .chat(messages, &tools, self.cancel, &on_retry)
            .await;
        self.retries
            .extend(notices.into_inner().unwrap_or_else(|p| p.into_inner()));
        let c = result?;
        self.usage.add(c.usage);
        Ok(c)
    }

    /// Asks for a plan; a bad answer is asked again once. The caller falls back on Invalid.
    pub(super) async fn create(&mut self, system: String, task: &str) -> Answer {
        let max = self.book.max_steps();
        let mut messages = vec![
            Message::system(system),
            Message::user(prompts::planner_task(task)),
        ];
        let mut failures = Vec::new();
        for _ in 0..2 {
            let completion = match self.ask(&messages).await {
                Ok(c) => c,
                Err(LlmError::Cancelled) => return Answer::Cancelled,
                Err(e) => {
                    failures.push(format!("the planner's LLM call failed: {e}"));
                    continue;
                }
            };
            match self.accept(&completion, "create", None).await {
                Ok(plan) => return Answer::Plan(plan),
                Err(why) => {
                    push_answer(&mut messages, &completion, &why);
                    messages.push(Message::user(prompts::planner_again(&why, max)));
                    failures.push(why);
                }
            }
        }
        Answer::Invalid(failures.join("; then: "))
    }

    /// One re-planning request for `plan_id`; answered with an update or nothing.
    pub(super) async fn replan(&mut self, system: String, prompt: String, plan_id: &str) -> Answer {
        let messages = [Message::system(system), Message::user(prompt)];
        match self.ask(&messages).await {
            Ok(c) => match self.accept(&c, "update", Some(plan_id)).await {
                Ok(plan) => Answer::Plan(plan),
                Err(why) => Answer::Invalid(why),
            },
            Err(LlmError::Cancelled) => Answer::Cancelled,
            Err(e) => Answer::Invalid(format!("the planner's LLM call failed: {e}")),
        }
    }

    /// Checks the first planning call against the schema and the command expected, then
    /// stores it through the book (which assigns the id and cleans the text).
    async fn accept(
        &self,
        c: &Completion,
        command: &str,
        plan_id: Option<&str>,
    ) -> Result<Plan, String> {
        let Some(call) = c
            .tool_calls
            .iter()
            .find(|t| t.function.name == planning::NAME)
        else {
            return Err(match c.tool_calls.first() {
                Some(other) => format!(
                    "it called {:?}, but only the planning tool is available",
                    planning::book::clean_line(&other.function.name, 64)
                ),
                None => "it answered with text and no call of the planning tool".into(),
            });
        };
        let args: Value = serde_json::from_str(&call.function.arguments)
            .map_err(|e| format!("the arguments are not valid JSON ({e})"))?;
        if !args.is_object() {
            return Err("the arguments must be a JSON object".into());
        }
        let tool = PlanningTool::new(self.book.clone());
        check_args(&tool.parameters(), &args).map_err(|e| format!("bad arguments: {e}"))?;
        let got = args
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if got != command {
            return Err(format!("the command must be {command:?}, not {got:?}"));
        }
        let title = args.get("title").and_then(Value::as_str);
        let steps = match args.get("steps").filter(|v| !v.is_null()) {
            None => None,
            Some(v) => Some(
                v.as_array()
                    .ok_or("steps must be a list of strings")?
                    .iter()
                    .map(|s| {
                        s.as_str()
                            .map(String::from)
                            .ok_or("every step must be a string")
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        match plan_id {
            None => {
                let title = title.ok_or("create needs a title")?;
                let steps = steps.ok_or("create needs steps")?;
                self.book
                    .create(title, &steps)
                    .await
                    .map_err(|e| e.to_string())
            }
            Some(own) => {
                if let Some(asked) = args.get("plan_id").and_then(Value::as_str)
                    && asked != own
                {
                    return Err(format!("the plan being re-planned is {own}, not {asked:?}"));
                }
                let steps = steps.ok_or("update needs the full new list of steps")?;
                self.book
                    .update(Some(own), title, Some(&steps))
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// Puts a rejected answer into the conversation with a tool message for every call, so the
/// second request pairs every call with its result.
fn push_answer(messages: &mut Vec<Message>, c: &Completion, why: &str) {
    messages.push(Message::Assistant {
        content: c.content.clone(),
        tool_calls: c.tool_calls.clone(),
    });
    for call in &c.tool_calls {
        let text = if call.function.name == planning::NAME {
            format!("Error: {why}")
        } else {
            "Error: not run: only the planning tool is available".to_string()
        };
        messages.push(Message::tool(call.id.clone(), text));
    }
}

/// The plan used when the planner gave none: the whole task as one step, so the flow still
/// does the work as a single agent run would.
pub(super) async fn default_plan(book: &PlanBook, task: &str) -> Result<Plan, planning::PlanError> {
    let title = format!("Plan for: {}", planning::book::clean_line(task, 60));
    book.create(
        &title,
        &["Do the whole task and save the deliverables in /workspace".to_string()],
    )
    .await
}
