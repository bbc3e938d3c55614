//! A remote MCP tool as an ordinary registry `Tool`, and the mapping of MCP results into
//! `ToolResult` (bounded: a remote server is not trusted with the host's memory).

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use rmcp::model::{CallToolResult, ContentBlock, Tool as RemoteTool};
use serde_json::Value;

use super::names;
use crate::tools::registry::MAX_DESCRIPTION;
use crate::tools::{Tool, ToolContext, ToolError, ToolResult};

use super::remote::RemoteServer;

/// Text and images of an MCP result as a ToolResult (the first image is kept).
pub(super) fn from_call_result(result: &CallToolResult) -> ToolResult {
    let mut text = Vec::new();
    let mut image = None;
    let mut text_len = 0;
    for block in &result.content {
        match block {
            // A remote server is not trusted with the host's memory: text beyond the cap and
            // images too large to send to a model are left out here, before anything keeps them.
            ContentBlock::Text(t) if text_len >= MAX_REMOTE_TEXT => {
                text_len += t.text.len();
            }
            ContentBlock::Text(t) => {
                text_len += t.text.len();
                let mut piece = t.text.clone();
                if text_len > MAX_REMOTE_TEXT {
                    let mut end = piece.len().saturating_sub(text_len - MAX_REMOTE_TEXT);
                    while !piece.is_char_boundary(end) {
                        end -= 1;
                    }
                    piece.truncate(end);
                    piece.push_str("\n[the rest of the server's text was cut by sandboxd]");
                }
                text.push(piece);
            }
            ContentBlock::Image(i) if i.data.len() > MAX_REMOTE_IMAGE => text.push(format!(
                "[an image of {} base64 characters was left out: over the {} limit]",
                i.data.len(),
                MAX_REMOTE_IMAGE
            )),
            ContentBlock::Image(i) if image.is_none() => image = Some(i.data.clone()),
            ContentBlock::Image(i) => {
                text.push(format!("[another image ({}) was left out]", i.mime_type))
            }
            ContentBlock::Audio(a) => {
                text.push(format!("[audio ({}) is not supported here]", a.mime_type))
            }
            ContentBlock::Resource(_) => text.push("[an embedded resource was left out]".into()),
            ContentBlock::ResourceLink(r) => text.push(format!("[resource: {}]", r.uri)),
            _ => text.push("[content of an unknown kind was left out]".into()),
        }
    }
    if text.is_empty()
        && let Some(s) = &result.structured_content
    {
        text.push(s.to_string());
    }
    let text = text.join("\n");
    let mut out = if result.is_error == Some(true) {
        ToolResult::error(if text.is_empty() {
            "the tool failed without a message".into()
        } else {
            text
        })
    } else {
        ToolResult::ok(if text.is_empty() && image.is_none() {
            "(no output)".to_string()
        } else {
            text
        })
    };
    if let Some(img) = image {
        out = out.with_image(img);
    }
    out
}

/// Characters of text kept from one remote tool result.
const MAX_REMOTE_TEXT: usize = 1 << 20;
/// Largest image (base64 characters) taken from one remote tool result: the shared image cap.
const MAX_REMOTE_IMAGE: usize = crate::tools::MAX_IMAGE_BYTES / 3 * 4 + 4;

/// One remote tool as a registry tool.
pub struct McpTool {
    pub(super) name: String,
    pub(super) original: String,
    pub(super) description: String,
    pub(super) parameters: Value,
    /// The server's name, for messages.
    pub(super) server_name: String,
    /// Weak: the server holds its tools, so a strong reference back would be a cycle that
    /// outlives `McpClients::close` (one leak per run). The client set owns the servers.
    pub(super) server: Weak<RemoteServer>,
}

impl McpTool {
    pub(super) fn new(server: &Arc<RemoteServer>, remote: &RemoteTool) -> Option<Self> {
        let name = names::tool_name(&server.config.name, &remote.name, server.config.keep_names)?;
        let raw = remote.description.as_deref().unwrap_or("");
        let desc = if raw.chars().count() > MAX_DESCRIPTION {
            let mut d: String = raw.chars().take(MAX_DESCRIPTION - 1).collect();
            d.push('…');
            d
        } else if raw.is_empty() {
            format!(
                "{} (from the MCP server {})",
                remote.name, server.config.name
            )
        } else {
            raw.to_string()
        };
        let mut params = Value::Object((*remote.input_schema).clone());
        if let Some(obj) = params.as_object_mut() {
            obj.entry("type")
                .or_insert_with(|| Value::String("object".into()));
        }
        Some(Self {
            name,
            original: remote.name.to_string(),
            description: desc,
            parameters: params,
            server_name: server.config.name.clone(),
            server: Arc::downgrade(server),
        })
    }

    pub fn server(&self) -> &str {
        &self.server_name
    }

    pub fn original_name(&self) -> &str {
        &self.original
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        self.parameters.clone()
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let Some(server) = self.server.upgrade() else {
            return Ok(ToolResult::error(format!(
                "the connection to the MCP server {:?} was closed",
                self.server_name
            )));
        };
        Ok(server.call(&self.original, args, ctx).await)
    }
}
