//! The MCP server's wire shapes: tool specs as MCP tools (with the `sandbox_id` stateless
//! clients pass, and the `sandbox_create`/`sandbox_close` pair they get), and tool results
//! as MCP content.

use std::sync::Arc;

use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject, Tool as McpTool};
use serde_json::json;

use crate::tools::{ToolResult, ToolSpec};

pub(super) fn to_mcp_tool(spec: &ToolSpec) -> McpTool {
    let schema: JsonObject = spec.parameters.as_object().cloned().unwrap_or_default();
    McpTool::new(
        spec.name.clone(),
        spec.description.clone(),
        Arc::new(schema),
    )
}

/// A spec with the required `sandbox_id` parameter stateless clients pass.
pub(super) fn with_sandbox_id(spec: &ToolSpec) -> McpTool {
    let mut params = spec.parameters.clone();
    if let Some(obj) = params.as_object_mut() {
        let props = obj.entry("properties").or_insert_with(|| json!({}));
        if let Some(p) = props.as_object_mut() {
            p.insert(
                "sandbox_id".into(),
                json!({"type": "string", "description": "The id sandbox_create returned."}),
            );
        }
        let req = obj.entry("required").or_insert_with(|| json!([]));
        if let Some(r) = req.as_array_mut() {
            r.push(json!("sandbox_id"));
        }
    }
    to_mcp_tool(&ToolSpec {
        name: spec.name.clone(),
        description: spec.description.clone(),
        parameters: params,
    })
}

pub(super) fn lifecycle_tools() -> Vec<McpTool> {
    let create = ToolSpec {
        name: "sandbox_create".into(),
        description: "Create a sandbox (a fresh container) and return its sandbox_id, which every \
                      other tool needs. It is removed by sandbox_close or after being idle."
            .into(),
        parameters: json!({"type": "object", "properties": {}}),
    };
    let close = ToolSpec {
        name: "sandbox_close".into(),
        description: "Remove a sandbox and everything in it.".into(),
        parameters: json!({"type": "object", "properties": {"sandbox_id": {"type": "string"}}, "required": ["sandbox_id"]}),
    };
    vec![to_mcp_tool(&create), to_mcp_tool(&close)]
}

/// A ToolResult as MCP content: text first, then the images in order.
pub fn to_call_result(r: &ToolResult) -> CallToolResult {
    let mut content = Vec::new();
    let text = r.render();
    if !text.is_empty() || r.base64_image.is_none() {
        content.push(ContentBlock::text(text));
    }
    for img in r.images() {
        content.push(ContentBlock::image(img.clone(), mime_of_base64(img)));
    }
    if r.is_error() {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

/// Guesses the type of a base64 image from its first bytes (PNG unless it says otherwise).
fn mime_of_base64(b64: &str) -> &'static str {
    if b64.starts_with("/9j/") {
        "image/jpeg"
    } else if b64.starts_with("R0lGOD") {
        "image/gif"
    } else if b64.starts_with("UklGR") {
        "image/webp"
    } else {
        "image/png"
    }
}

pub(super) fn error_result(text: impl Into<String>) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(text.into())]).into()
}
