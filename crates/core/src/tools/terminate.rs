//! terminate: the model says the task is finished (success or failure); the run ends.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolResult, arg_str};

pub const NAME: &str = "terminate";

pub struct Terminate;

#[async_trait]
impl Tool for Terminate {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "End the run when the task is done or cannot be done. Put deliverables in /workspace first. \
         status is success or failure; answer is the final answer shown to the user."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "status": {"type": "string", "enum": ["success", "failure"], "description": "How the task ended."},
                "answer": {"type": "string", "description": "The final answer or a summary for the user."}
            },
            "required": ["status"]
        })
    }

    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let status = arg_str(&args, "status").unwrap_or("success");
        Ok(ToolResult::ok(format!(
            "The interaction has been completed with status: {status}"
        )))
    }
}
