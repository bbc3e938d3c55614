//! view_image: the agent looks at an image file in the sandbox (a chart it drew, a
//! screenshot it saved, an image the user brought). The image goes into the conversation
//! like a plot does, within the shared image cap (`MAX_IMAGE_BYTES`), and only for a model
//! that sees images: for a text-only one the call says why instead of sending bytes the
//! provider would refuse.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::files::image_result;
use super::{MAX_IMAGE_BYTES, Tool, ToolContext, ToolError, ToolResult, arg_str};
use crate::sandbox::Sandbox;

pub const NAME: &str = "view_image";

pub struct ViewImage {
    sandbox: Arc<dyn Sandbox>,
    /// Whether the run's model takes images (`LlmConfig::takes_images`).
    sees: bool,
    /// The model's name, for the text-only explanation.
    model: String,
}

impl ViewImage {
    pub fn new(sandbox: Arc<dyn Sandbox>, sees: bool, model: impl Into<String>) -> Self {
        Self {
            sandbox,
            sees,
            model: model.into(),
        }
    }
}

#[async_trait]
impl Tool for ViewImage {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "Look at an image file in the sandbox (PNG, JPEG, GIF or WebP: a chart you saved, a \
         screenshot, an image from the user). The image is shown to you after the call. Relative \
         paths are under /workspace. Images over the size cap are refused: save a smaller copy."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Image path inside the sandbox, e.g. /workspace/charts/sales.png or charts/sales.png."}
            },
            "required": ["path"]
        })
    }

    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let path = arg_str(&args, "path").unwrap_or_default();
        if !self.sees {
            return Ok(ToolResult::error(format!(
                "cannot show {path}: the model of this run ({}) does not take images, so \
                 sandboxd sends none ([llm] multimodal is off for it; an admin can set \
                 multimodal = true if it does). Describe the image from its data instead, \
                 e.g. with python",
                if self.model.is_empty() {
                    "unnamed"
                } else {
                    &self.model
                }
            )));
        }
        // One byte over the cap tells an oversized image from one exactly at it.
        let (data, size) = self.sandbox.read_head(path, MAX_IMAGE_BYTES + 1).await?;
        match image_result(path, &data, size) {
            Some(result) => Ok(result),
            None => Ok(ToolResult::error(format!(
                "{path} is not a PNG, JPEG, GIF or WebP image ({size} bytes); convert it first \
                 (e.g. matplotlib's savefig(..., format=\"png\"))"
            ))),
        }
    }
}
