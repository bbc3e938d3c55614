//! What left the host: one `FetchRecord` per request a research tool made (pages, engine
//! queries, refusals included). Records go to tracing (target `sandboxd::research`) and
//! into the tool result's `data` as `{"fetches": [...]}`, which is the seam where the run's
//! event stream can pick them up as events.

use serde::{Deserialize, Serialize};

use super::fetcher::FetchError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FetchRecord {
    /// The URL asked for (for engines: the engine's endpoint, the query in it or its body).
    pub url: String,
    /// Where the redirects ended.
    pub final_url: Option<String>,
    pub status: Option<u16>,
    /// Body bytes received.
    pub bytes: u64,
    pub content_type: Option<String>,
    /// The rule that refused the request, if one did.
    pub refused: Option<String>,
    /// A network error or timeout, if one happened.
    pub error: Option<String>,
    pub elapsed_ms: u64,
}

impl FetchRecord {
    pub fn failed(url: &str, err: &FetchError, elapsed_ms: u64) -> Self {
        let (refused, error) = match err {
            FetchError::Refused(r) => (Some(r.rule.to_string()), None),
            other => (None, Some(other.to_string())),
        };
        Self {
            url: url.to_string(),
            final_url: None,
            status: None,
            bytes: 0,
            content_type: None,
            refused,
            error,
            elapsed_ms,
        }
    }

    /// Logs the record; called once per request by the tools.
    pub fn trace(&self, tool: &str, owner: &str) {
        tracing::info!(
            target: "sandboxd::research",
            tool,
            owner,
            url = %self.url,
            final_url = self.final_url.as_deref().unwrap_or(""),
            status = self.status.unwrap_or(0),
            bytes = self.bytes,
            refused = self.refused.as_deref().unwrap_or(""),
            error = self.error.as_deref().unwrap_or(""),
            "research fetch"
        );
    }
}
