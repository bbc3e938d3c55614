//! web_fetch: one URL through the Fetcher, written into /workspace/research. HTML becomes
//! Markdown with absolute links and a front-matter block (`<slug>.md`); PDFs and text-like
//! bodies are saved as they are. The model sees a preview and the path.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Value, json};
use url::Url;

use super::{free_path, with_records};
use crate::research::audit::FetchRecord;
use crate::research::fetcher::{FetchRequest, FetchResponse};
use crate::research::markdown::{
    cap_chars, decode_text, front_matter, html_to_markdown_off_thread, slug,
};
use crate::research::quota::Kind;
use crate::research::ssrf::Origin;
use crate::research::{Research, now_rfc3339};
use crate::sandbox::Sandbox;
use crate::tools::{Tool, ToolContext, ToolError, ToolResult, arg_str};

pub struct WebFetch {
    sandbox: Arc<dyn Sandbox>,
    research: Arc<Research>,
}

impl WebFetch {
    pub fn new(sandbox: Arc<dyn Sandbox>, research: Arc<Research>) -> Self {
        Self { sandbox, research }
    }
}

/// What one fetched body turns into inside the sandbox.
struct Saved {
    path: String,
    /// The text the preview is cut from.
    text: String,
    title: Option<String>,
    how: &'static str,
    raw_path: Option<String>,
}

#[async_trait]
impl Tool for WebFetch {
    fn name(&self) -> &str {
        "web_fetch"
    }

    fn description(&self) -> &str {
        "Fetch one web page from the host (the sandbox itself has no network) and save it under \
         /workspace/research/: HTML as readable Markdown with absolute links and a front-matter \
         block (url, final_url, fetched_at, status, ...); PDFs and plain text as they are. Returns \
         a preview and the path; read the whole file with python or the editor. Private and local \
         addresses are refused. save_raw also keeps the original bytes."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "An absolute http(s) URL."},
                "save_raw": {"type": "boolean", "description": "Also save the original bytes next to the Markdown (default false)."}
            },
            "required": ["url"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let raw_url = arg_str(&args, "url").unwrap_or("").trim();
        let url = match Url::parse(raw_url) {
            Ok(u) => u,
            Err(e) => {
                return Ok(ToolResult::error(format!(
                    "{raw_url:?} is not an absolute URL ({e}); give one like https://example.com/page"
                )));
            }
        };
        let save_raw = args
            .get("save_raw")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if let Err(e) = self.research.quotas.take(Kind::Fetch) {
            return Ok(ToolResult::error(e.to_string()));
        }
        let owner = self.research.quotas.owner().to_string();
        let fetcher = match self.research.fetcher() {
            Ok(f) => f,
            Err(e) => return Ok(ToolResult::error(e.to_string())),
        };
        let started = Instant::now();
        let result = tokio::select! {
            r = fetcher.fetch(FetchRequest::get(url.clone(), Origin::Model)) => r,
            _ = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        };
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                let record =
                    FetchRecord::failed(url.as_str(), &e, started.elapsed().as_millis() as u64);
                let msg = format!("cannot fetch {url}: {e}");
                return Ok(with_records(
                    ToolResult::error(msg),
                    self.name(),
                    &owner,
                    &[record],
                ));
            }
        };
        let record = resp.record();
        if !resp.status.is_success() {
            let preview: String =
                decode_text(&resp.body, resp.charset.as_deref(), &resp.content_type)
                    .chars()
                    .take(300)
                    .collect();
            let msg = format!(
                "{} answered HTTP {}; nothing was saved. The start of its page: {}",
                resp.final_url,
                resp.status,
                preview.split_whitespace().collect::<Vec<_>>().join(" ")
            );
            return Ok(with_records(
                ToolResult::error(msg),
                self.name(),
                &owner,
                &[record],
            ));
        }
        let saved = match self.save(&resp, save_raw).await {
            Ok(s) => s,
            Err(e) => return e.into_observation(),
        };
        let text = self.render(&resp, &saved);
        Ok(with_records(
            ToolResult::ok(text),
            self.name(),
            &owner,
            &[record],
        ))
    }
}

impl WebFetch {
    async fn save(&self, resp: &FetchResponse, save_raw: bool) -> Result<Saved, ToolError> {
        let stem = slug(&resp.final_url);
        let sandbox = self.sandbox.as_ref();
        let ct = resp.content_type.as_str();
        if ct == "text/html" || ct == "application/xhtml+xml" {
            let html = decode_text(&resp.body, resp.charset.as_deref(), ct);
            let page = html_to_markdown_off_thread(html, resp.final_url.clone()).await;
            let (markdown, _) = cap_chars(page.markdown, self.research.config.max_markdown_chars);
            let title = page.title.clone().unwrap_or_default();
            let mut doc = front_matter(&[
                ("url", resp.url.to_string()),
                ("final_url", resp.final_url.to_string()),
                ("fetched_at", now_rfc3339()),
                ("status", resp.status.as_u16().to_string()),
                ("content_type", resp.content_type.clone()),
                ("bytes", resp.body.len().to_string()),
                ("title", title.clone()),
                ("extraction", page.method.to_string()),
            ]);
            if !title.is_empty() {
                doc.push_str(&format!("# {title}\n\n"));
            }
            doc.push_str(&markdown);
            doc.push('\n');
            let path = free_path(sandbox, &stem, ".md").await?;
            sandbox.write_file(&path, doc.as_bytes()).await?;
            let raw_path = if save_raw {
                let p = free_path(sandbox, &stem, ".raw.html").await?;
                sandbox.write_file(&p, &resp.body).await?;
                Some(p)
            } else {
                None
            };
            return Ok(Saved {
                path,
                text: markdown,
                title: page.title,
                how: page.method,
                raw_path,
            });
        }
        // PDFs and text-like bodies are saved byte for byte.
        let ext = match ct {
            "application/pdf" => ".pdf",
            "text/markdown" => ".md",
            "text/csv" => ".csv",
            "application/json" => ".json",
            "text/xml" | "application/xml" | "application/rss+xml" | "application/atom+xml" => {
                ".xml"
            }
            _ => ".txt",
        };
        let path = free_path(sandbox, &stem, ext).await?;
        sandbox.write_file(&path, &resp.body).await?;
        let text = if ext == ".pdf" {
            format!(
                "(a PDF of {} bytes; read it in python with `from pypdf import PdfReader; PdfReader(\"{path}\")`)",
                resp.body.len()
            )
        } else {
            decode_text(&resp.body, resp.charset.as_deref(), ct)
        };
        Ok(Saved {
            path,
            text,
            title: None,
            how: "saved as is",
            raw_path: None,
        })
    }

    fn render(&self, resp: &FetchResponse, saved: &Saved) -> String {
        let mut out = format!(
            "Fetched {} (HTTP {}, {}, {} bytes; {}) → {}\n",
            resp.url,
            resp.status.as_u16(),
            resp.content_type,
            resp.body.len(),
            saved.how,
            saved.path
        );
        if resp.final_url != resp.url {
            out.push_str(&format!("Redirected to: {}\n", resp.final_url));
        }
        if let Some(t) = &saved.title {
            out.push_str(&format!("Title: {t}\n"));
        }
        if let Some(p) = &saved.raw_path {
            out.push_str(&format!("Original bytes: {p}\n"));
        }
        let max = self.research.config.preview_chars;
        let total = saved.text.chars().count();
        let preview: String = saved.text.chars().take(max).collect();
        out.push('\n');
        out.push_str(preview.trim_end());
        if total > max {
            out.push_str(&format!(
                "\n[… {} more characters in {}]",
                total - max,
                saved.path
            ));
        }
        out
    }
}
