//! `a2a_<name>`: the model sends a message to a remote agent and gets its answer. The call
//! returns at once on the remote side and the task is polled (backing off to 5 s) until it
//! ends or asks for input, within the agent's `timeout_secs`; a call given up (the timeout,
//! or the run cancelled) cancels the remote task. The conversation lasts for the run: later
//! calls continue the agent's context, and the call after a question answers that task.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Client;
use super::wire::{self, Reply, State};
use crate::tools::{Tool, ToolContext, ToolError, ToolResult, arg_str};

/// Longest message the model may send in one call (characters).
const MAX_MESSAGE: usize = 16 * 1024;

/// The conversation with the agent so far.
#[derive(Default)]
struct Thread {
    context: Option<String>,
    /// A task waiting for our answer (it asked a question).
    waiting: Option<String>,
}

pub struct RemoteAgentTool {
    client: Client,
    name: String,
    description: String,
    thread: Mutex<Thread>,
    ids: AtomicU64,
}

impl RemoteAgentTool {
    pub fn new(client: Client) -> Self {
        let what = match (
            client.config.description.as_str(),
            client.card.description.as_str(),
        ) {
            ("", "") => format!("the agent {:?}", client.card.name),
            ("", card) => card.to_string(),
            (own, _) => own.to_string(),
        };
        let description = format!(
            "Send a message to the remote A2A agent {:?} and get its answer: {what} Later calls continue the same conversation (new_conversation starts another); if the agent asks a question, call again with the answer.",
            client.config.name
        );
        Self {
            name: client.config.tool_name(),
            description: wire_cut(&description, 1000),
            client,
            thread: Mutex::new(Thread::default()),
            ids: AtomicU64::new(1),
        }
    }

    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    fn thread(&self) -> std::sync::MutexGuard<'_, Thread> {
        self.thread.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends the message and polls until the task settles, the deadline passes or the run
    /// is cancelled (both cancel the remote task).
    async fn exchange(&self, text: &str, ctx: &ToolContext) -> Result<Reply, String> {
        let d = self.client.card.dialect;
        let (context, waiting) = {
            let t = self.thread();
            (t.context.clone(), t.waiting.clone())
        };
        let body = wire::send(
            d,
            self.next_id(),
            text,
            context.as_deref(),
            waiting.as_deref(),
        );
        let deadline = Instant::now() + Duration::from_secs(self.client.config.timeout_secs);
        let mut reply = self.client.call(&body).await?;
        let mut pause = Duration::from_millis(250);
        while !reply.state.settled() {
            let Some(task) = reply.task.clone() else {
                break;
            };
            let wait = pause.min(deadline.saturating_duration_since(Instant::now()));
            let gave_up = tokio::select! {
                _ = ctx.cancel.cancelled() => Some("the run was cancelled".to_string()),
                _ = tokio::time::sleep(wait) => (Instant::now() >= deadline).then(|| format!(
                    "the agent did not finish within {} s (remote_agents timeout_secs)",
                    self.client.config.timeout_secs
                )),
            };
            if let Some(why) = gave_up {
                // Best effort: the remote task should not go on for nobody.
                let _ = self
                    .client
                    .call(&wire::cancel(d, self.next_id(), &task))
                    .await;
                return Err(format!("{why}; its task {task} was cancelled"));
            }
            reply = self
                .client
                .call(&wire::get(d, self.next_id(), &task))
                .await?;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
        let mut t = self.thread();
        if reply.context.is_some() {
            t.context = reply.context.clone();
        }
        t.waiting = (reply.state == State::InputRequired)
            .then(|| reply.task.clone())
            .flatten();
        Ok(reply)
    }

    /// What the model reads of a settled reply.
    fn observe(&self, reply: Reply) -> ToolResult {
        let agent = &self.client.config.name;
        let data = json!({"a2a": {
            "agent": agent, "task": reply.task, "context": reply.context,
            "state": format!("{:?}", reply.state),
        }});
        let mut text = reply.artifacts.clone();
        if !reply.status.is_empty() {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&reply.status);
        }
        let result = match reply.state {
            State::Completed | State::Working => ToolResult::ok(if text.is_empty() {
                format!("The agent {agent} finished without an answer.")
            } else {
                text
            }),
            State::InputRequired => ToolResult::ok(format!(
                "The agent {agent} asks: {text}\nCall {} again with the answer as the message.",
                self.name
            )),
            State::AuthRequired => ToolResult::error(format!(
                "the agent {agent} wants an authentication sandboxd cannot give ({text})"
            )),
            State::Failed | State::Rejected | State::Canceled => ToolResult {
                output: text,
                error: Some(format!("the agent {agent}'s task ended {:?}", reply.state)),
                ..ToolResult::default()
            },
        };
        result.with_data(data)
    }
}

fn wire_cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[async_trait]
impl Tool for RemoteAgentTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "message": {"type": "string", "description": "What to say to the agent (plain text)."},
                "new_conversation": {"type": "boolean", "description": "Start a new conversation instead of continuing the last one (default false)."}
            },
            "required": ["message"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let text = arg_str(&args, "message").unwrap_or("").trim();
        if text.is_empty() {
            return Ok(ToolResult::error(
                "the message is empty; say what to ask the agent",
            ));
        }
        if text.chars().count() > MAX_MESSAGE {
            return Ok(ToolResult::error(format!(
                "the message is over {MAX_MESSAGE} characters; send less, or put the material in fewer words"
            )));
        }
        if args.get("new_conversation").and_then(Value::as_bool) == Some(true) {
            *self.thread() = Thread::default();
        }
        Ok(match self.exchange(text, ctx).await {
            Ok(reply) => self.observe(reply),
            Err(why) => ToolResult::error(format!(
                "the agent {} could not answer: {why}",
                self.client.config.name
            )),
        })
    }
}
