//! ask_human: the model asks the user a question through an Asker (the terminal in the
//! CLI, an API endpoint later). Without a human the model is told so and carries on.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolResult, arg_str};

/// Whoever can answer the model's questions.
#[async_trait]
pub trait Asker: Send + Sync {
    /// The answer, or None when nobody is there to answer.
    async fn ask(&self, question: &str) -> Option<String>;
}

/// For runs without a human (MCP, tests, `--no-input`).
pub struct NoHuman;

#[async_trait]
impl Asker for NoHuman {
    async fn ask(&self, _question: &str) -> Option<String> {
        None
    }
}

/// Asks on the terminal; stdin is read on a blocking thread so the runtime keeps running.
pub struct TerminalAsker;

#[async_trait]
impl Asker for TerminalAsker {
    async fn ask(&self, question: &str) -> Option<String> {
        let question = question.to_string();
        tokio::task::spawn_blocking(move || {
            use std::io::{BufRead, Write};
            let mut err = std::io::stderr();
            let _ = write!(err, "\n? {question}\n> ");
            let _ = err.flush();
            let mut line = String::new();
            match std::io::stdin().lock().read_line(&mut line) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(line.trim_end().to_string()),
            }
        })
        .await
        .ok()
        .flatten()
    }
}

pub struct AskHuman {
    asker: Arc<dyn Asker>,
}

impl AskHuman {
    pub fn new(asker: Arc<dyn Asker>) -> Self {
        Self { asker }
    }
}

#[async_trait]
impl Tool for AskHuman {
    fn name(&self) -> &str {
        "ask_human"
    }

    fn description(&self) -> &str {
        "Ask the human user a question when you truly need information only they have. \
         Returns their answer, or says that no human is available."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"inquire": {"type": "string", "description": "The question for the user."}},
            "required": ["inquire"]
        })
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let question = arg_str(&args, "inquire").unwrap_or_default();
        tokio::select! {
            answer = self.asker.ask(question) => Ok(match answer {
                Some(a) => ToolResult::ok(a),
                None => ToolResult::error("no human is available in this run; decide on your own and go on"),
            }),
            _ = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
        }
    }
}
