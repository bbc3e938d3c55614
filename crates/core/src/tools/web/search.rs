//! web_search: asks the configured engines in order and saves the normalised results as
//! /workspace/research/search-<n>.json; the model sees a compact list and the path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{code_arg, free_path, with_records};
use crate::research::engines::{Outcome, SearchQuery};
use crate::research::quota::Kind;
use crate::research::{Research, now_rfc3339};
use crate::sandbox::Sandbox;
use crate::tools::{Tool, ToolContext, ToolError, ToolResult, arg_str};

/// Longest query passed on (engines refuse or truncate far shorter ones anyway).
const MAX_QUERY_CHARS: usize = 1000;

pub struct WebSearch {
    sandbox: Arc<dyn Sandbox>,
    research: Arc<Research>,
    /// The n of the next search-<n>.json.
    next: AtomicU32,
}

impl WebSearch {
    pub fn new(sandbox: Arc<dyn Sandbox>, research: Arc<Research>) -> Self {
        Self {
            sandbox,
            research,
            next: AtomicU32::new(1),
        }
    }
}

#[async_trait]
impl Tool for WebSearch {
    fn name(&self) -> &str {
        "web_search"
    }

    fn description(&self) -> &str {
        "Search the web from the host (the sandbox itself has no network). Returns a ranked list \
         of titles, URLs and snippets and saves them as JSON under /workspace/research/. Follow up \
         with web_fetch on the URLs worth reading. `language` and `region` are short codes such \
         as \"en\" and \"us\"."
    }

    fn parameters(&self) -> Value {
        let c = &self.research.config;
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to search for."},
                "count": {"type": "integer", "description": format!("How many results (1-{}, default {}).", c.max_results, c.default_results)},
                "language": {"type": "string", "description": "Language code of the results, e.g. \"en\", \"de\"."},
                "region": {"type": "string", "description": "Country/region code, e.g. \"us\", \"de\"."}
            },
            "required": ["query"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let query = arg_str(&args, "query").unwrap_or("").trim().to_string();
        if query.is_empty() {
            return Ok(ToolResult::error("query is empty; say what to search for"));
        }
        let query: String = query.chars().take(MAX_QUERY_CHARS).collect();
        let c = &self.research.config;
        let count = match args.get("count").and_then(Value::as_u64) {
            None => c.default_results,
            Some(0) => return Ok(ToolResult::error("count must be at least 1")),
            Some(n) => (n as usize).min(c.max_results.max(1)),
        };
        let (language, region) = match (code_arg(&args, "language"), code_arg(&args, "region")) {
            (Ok(l), Ok(r)) => (l, r),
            (Err(e), _) | (_, Err(e)) => return Ok(e),
        };
        if let Err(e) = self.research.quotas.take(Kind::Search) {
            return Ok(ToolResult::error(e.to_string()));
        }
        let fetcher = match self.research.fetcher() {
            Ok(f) => f,
            Err(e) => return Ok(ToolResult::error(e.to_string())),
        };
        let q = SearchQuery {
            query: query.clone(),
            count,
            language: language.clone(),
            region: region.clone(),
        };
        let outcome = tokio::select! {
            o = self.research.search.run(&fetcher, &q) => o,
            _ = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        };
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let path = free_path(self.sandbox.as_ref(), &format!("search-{n}"), ".json").await?;
        let file = json!({
            "query": query,
            "language": language,
            "region": region,
            "searched_at": now_rfc3339(),
            "engine": outcome.engine,
            "results": outcome.hits,
            "failed_engines": outcome.failures.iter()
                .map(|(e, why)| json!({"engine": e, "reason": why})).collect::<Vec<_>>(),
        });
        let bytes =
            serde_json::to_vec_pretty(&file).map_err(|e| ToolError::Internal(e.to_string()))?;
        if let Err(e) = self.sandbox.write_file(&path, &bytes).await {
            return ToolError::from(e).into_observation();
        }
        let text = render(&query, &outcome, &path);
        // "No results" is an answer; only "no engine could be asked at all" is an error.
        let none_answered = outcome.engine.is_none()
            && !outcome.failures.iter().any(|(_, why)| why == "no results");
        let result = if none_answered {
            ToolResult {
                output: text,
                error: Some("no search engine answered; fetch known URLs with web_fetch, or try again later".into()),
                ..ToolResult::default()
            }
        } else {
            ToolResult::ok(text)
        };
        let owner = self.research.quotas.owner().to_string();
        Ok(with_records(result, self.name(), &owner, &outcome.records))
    }
}

fn render(query: &str, o: &Outcome, path: &str) -> String {
    let mut out = String::new();
    match &o.engine {
        Some(engine) => {
            out.push_str(&format!(
                "{} results for {query:?} (from {engine}), saved to {path}:\n",
                o.hits.len()
            ));
            for h in &o.hits {
                let snippet: String = h.snippet.chars().take(220).collect();
                out.push_str(&format!("{}. {}\n   {}\n", h.rank, h.title, h.url));
                if !snippet.is_empty() {
                    out.push_str(&format!("   {snippet}\n"));
                }
            }
        }
        None => out.push_str(&format!(
            "No results for {query:?} (recorded in {path}). Try other or fewer words, or another language.\n"
        )),
    }
    if !o.failures.is_empty() {
        out.push_str("Engines that did not answer:\n");
        for (engine, why) in &o.failures {
            out.push_str(&format!("- {engine}: {why}\n"));
        }
    }
    out.trim_end().to_string()
}
