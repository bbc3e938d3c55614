//! The research tools, `web_search` and `web_fetch`: they run on the host (the sandbox has
//! no network), go through `research::Research` (one Fetcher, the engines, the quotas) and
//! write what they bring back into /workspace/research through the Sandbox trait.

mod fetch;
mod search;

use std::sync::Arc;

use serde_json::{Value, json};

pub use fetch::WebFetch;
pub use search::WebSearch;

use super::{Tool, ToolResult};
use crate::research::audit::FetchRecord;
use crate::research::{Research, ResearchConfig};
use crate::sandbox::{Sandbox, SandboxError};

/// The research tools of one run for `owner`: none when `[research] enabled = false`;
/// web_fetch otherwise; web_search too when at least one engine is configured.
pub fn research_tools(
    sandbox: Arc<dyn Sandbox>,
    config: &ResearchConfig,
    owner: &str,
) -> Vec<Arc<dyn Tool>> {
    if !config.enabled {
        return Vec::new();
    }
    let research = Research::new(config, owner);
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    if research.can_search() {
        tools.push(Arc::new(WebSearch::new(sandbox.clone(), research.clone())));
    }
    tools.push(Arc::new(WebFetch::new(sandbox, research)));
    tools
}

/// The audit records as the tool result's data, and into tracing.
fn with_records(
    result: ToolResult,
    tool: &str,
    owner: &str,
    records: &[FetchRecord],
) -> ToolResult {
    for r in records {
        r.trace(tool, owner);
    }
    result.with_data(json!({ "fetches": records }))
}

/// A free path `<dir>/<stem><ext>`, `<stem>-2<ext>`, … inside the sandbox (a kept
/// session may already hold earlier results; they are never overwritten).
async fn free_path(sandbox: &dyn Sandbox, stem: &str, ext: &str) -> Result<String, SandboxError> {
    for i in 1..=1000 {
        let path = if i == 1 {
            format!("{}/{stem}{ext}", crate::research::RESEARCH_DIR)
        } else {
            format!("{}/{stem}-{i}{ext}", crate::research::RESEARCH_DIR)
        };
        match sandbox.stat(&path).await {
            Err(SandboxError::NotFound { .. }) => return Ok(path),
            Err(e) => return Err(e),
            Ok(_) => continue,
        }
    }
    Ok(format!(
        "{}/{stem}-{}{ext}",
        crate::research::RESEARCH_DIR,
        rand::random::<u32>()
    ))
}

/// A short code (language "en", region "de"): letters, digits and dashes, at most 16.
fn code_arg(args: &Value, key: &str) -> Result<Option<String>, ToolResult> {
    let Some(v) = args.get(key).and_then(Value::as_str).map(str::trim) else {
        return Ok(None);
    };
    if v.is_empty() {
        return Ok(None);
    }
    if v.len() > 16
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ToolResult::error(format!(
            "{key} must be a short code such as \"en\" or \"de\", not {v:?}"
        )));
    }
    Ok(Some(v.to_ascii_lowercase()))
}
