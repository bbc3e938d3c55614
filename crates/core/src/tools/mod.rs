//! Tools the model calls. Each tool is one file with the same shape: a struct holding the
//! session's sandbox handle (never a host path), a name, a description under 1024
//! characters, a JSON schema and `execute`. The registry validates arguments before a tool
//! ever sees them.

pub mod ask_human;
pub mod bash;
pub mod browser;
pub mod editor;
pub mod files;
pub mod planning;
pub mod python;
pub mod registry;
pub mod saved;
pub mod session;
pub mod terminate;
pub mod view_image;
pub mod web;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::sandbox::SandboxError;

pub use registry::{RegistryError, ToolRegistry, ToolSpec};

/// The largest image (decoded bytes) any tool returns: plots, screenshots, read_file and
/// remote MCP tools alike. A 4 MiB PNG is far more than a model needs to see, and it bounds
/// what one call costs the host (about 4/3 of it again as base64, per copy).
pub const MAX_IMAGE_BYTES: usize = 4 << 20;

/// What a tool call produced, as the model will see it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub output: String,
    /// Set when the call failed in a way the model can act on.
    pub error: Option<String>,
    /// A PNG or JPEG, base64-encoded (plots, screenshots).
    pub base64_image: Option<String>,
    /// Further images of the same result, in order (a python cell's second and later
    /// figures); None for most tools. Boxed like `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub more_images: Option<Box<Vec<String>>>,
    /// A note from sandboxd itself (e.g. "the shell was restarted").
    pub system: Option<String>,
    /// Structured facts for sandboxd, never shown to the model (the research tools'
    /// `{"fetches": [...]}` audit records); events and the API can pick them up here.
    /// Boxed: most results carry none, and ToolResult travels in `Result`s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Box<Value>>,
}

impl ToolResult {
    pub fn ok(output: impl Into<String>) -> Self {
        Self {
            output: output.into(),
            ..Self::default()
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        Self {
            error: Some(message.into()),
            ..Self::default()
        }
    }

    /// Attaches an image (after any attached before), unless it is over `MAX_IMAGE_BYTES`:
    /// then a note says why it is missing. Every tool returns images through here, so one cap
    /// holds for all of them.
    pub fn with_image(mut self, base64: String) -> Self {
        let bytes = base64.len() / 4 * 3;
        if bytes > MAX_IMAGE_BYTES {
            return self.with_system(format!(
                "an image of about {bytes} bytes was not returned: images are capped at {MAX_IMAGE_BYTES} bytes"
            ));
        }
        match self.base64_image {
            None => self.base64_image = Some(base64),
            Some(_) => self.more_images.get_or_insert_default().push(base64),
        }
        self
    }

    /// The images after the first, in order.
    pub fn more_images(&self) -> &[String] {
        self.more_images.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Every image of the result, in order.
    pub fn images(&self) -> impl Iterator<Item = &String> {
        self.base64_image.iter().chain(self.more_images())
    }

    pub fn with_system(mut self, note: impl Into<String>) -> Self {
        self.system = Some(note.into());
        self
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(Box::new(data));
        self
    }

    pub fn is_error(&self) -> bool {
        self.error.is_some()
    }

    /// The text the model reads: the error or the output, then any system note.
    pub fn render(&self) -> String {
        let mut text = match &self.error {
            Some(e) if self.output.is_empty() => format!("Error: {e}"),
            Some(e) => format!("{}\nError: {e}", self.output),
            None => self.output.clone(),
        };
        if let Some(s) = &self.system {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&format!("[sandboxd: {s}]"));
        }
        text
    }
}

/// A failure of sandboxd itself, not something the model can fix by changing its call.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("the tool call was cancelled")]
    Cancelled,
    #[error("{0}")]
    Internal(String),
}

impl ToolError {
    /// Sandbox errors a model can act on become observations; the rest stay errors.
    pub fn into_observation(self) -> Result<ToolResult, ToolError> {
        match self {
            ToolError::Sandbox(e) if !e.is_fatal_for_session() => {
                Ok(ToolResult::error(e.to_string()))
            }
            other => Err(other),
        }
    }
}

/// Per-call context: cancellation (Ctrl-C, a closed client) reaches the tool through it.
#[derive(Clone, Default)]
pub struct ToolContext {
    pub cancel: CancellationToken,
}

#[async_trait]
pub trait Tool: Send + Sync {
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    /// A JSON schema object: `{"type":"object","properties":{…},"required":[…]}`.
    fn parameters(&self) -> Value;
    /// `args` has already been checked against `parameters()` by the registry.
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError>;
}

/// Reads an optional string argument.
pub fn arg_str<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

/// The optional `timeout` argument in seconds: the default when absent, capped at `max`.
pub fn timeout_arg(
    args: &Value,
    default: std::time::Duration,
    max: std::time::Duration,
) -> Result<std::time::Duration, ToolResult> {
    match args.get("timeout").and_then(Value::as_u64) {
        Some(0) => Err(ToolResult::error("timeout must be at least 1 second")),
        Some(s) => Ok(std::time::Duration::from_secs(s).min(max)),
        None => Ok(default.min(max)),
    }
}
