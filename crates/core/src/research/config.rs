//! The `[research]` section: which engines, how the Fetcher is fenced in, and the quotas.
//! Everything here is the admin's; no tool argument or API field can widen any of it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResearchConfig {
    /// `false` turns web_search and web_fetch off everywhere.
    pub enabled: bool,
    /// Offer the two tools on the MCP server too (off by default: an MCP client is a
    /// second party that could use sandboxd as an egress proxy).
    pub mcp: bool,
    /// Engines in the order they are tried; one that is not configured is skipped.
    /// Known: "searxng", "duckduckgo", "brave", "tavily".
    pub engines: Vec<String>,
    /// A SearXNG instance (with `format: json` enabled), e.g. "http://searx.lan:8080".
    /// On a private address it must also be listed in `allow`.
    pub searxng_url: String,
    pub duckduckgo_url: String,
    pub brave_url: String,
    /// Empty means the BRAVE_API_KEY environment variable.
    pub brave_api_key: String,
    pub tavily_url: String,
    /// Empty means the TAVILY_API_KEY environment variable.
    pub tavily_api_key: String,
    /// Results a search returns when the model does not ask for a count.
    pub default_results: usize,
    /// Most results a search may return.
    pub max_results: usize,
    /// Extra attempts of one engine after a network error or a 5xx (never after a block).
    pub retries: u32,
    /// How long an engine that answered with a CAPTCHA or a rate limit is left alone.
    pub cooldown_secs: u64,
    /// Hosts or CIDRs reachable although the deny list covers them (an internal wiki, a
    /// self-hosted SearXNG). "wiki.lan" lets that name resolve to private addresses;
    /// "10.1.2.0/24" lets those addresses be reached by any name or literally.
    pub allow: Vec<String>,
    /// Hosts or CIDRs refused on top of the built-in deny list.
    pub deny: Vec<String>,
    /// When not empty, web_fetch reaches only these hosts or CIDRs (search engines are
    /// the admin's own endpoints and are not restricted by it).
    pub only: Vec<String>,
    /// Ports a URL may name.
    pub ports: Vec<u16>,
    /// An explicit proxy for every research request; empty means none. Proxies from the
    /// environment (HTTP_PROXY, …) are never used. Through a proxy the proxy resolves
    /// names, so it must enforce egress rules itself; URL and literal-IP rules still apply.
    pub proxy: String,
    pub connect_timeout_secs: u64,
    /// Deadline of one fetch, the whole redirect chain and the body included.
    pub timeout_secs: u64,
    pub max_redirects: usize,
    /// Hard cap on a response body; a longer body is refused, not cut.
    pub max_body_kb: u64,
    /// Characters of Markdown kept from one page (the rest is cut with a note).
    pub max_markdown_chars: usize,
    /// Characters of a fetched page shown in the observation.
    pub preview_chars: usize,
    pub user_agent: String,
    pub searches_per_run: u32,
    pub fetches_per_run: u32,
    /// Per owner, over a sliding 24 hours, in this sandboxd process.
    pub searches_per_user_per_day: u32,
    pub fetches_per_user_per_day: u32,
}

impl Default for ResearchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            mcp: false,
            engines: ["searxng", "duckduckgo", "brave", "tavily"]
                .map(String::from)
                .to_vec(),
            searxng_url: String::new(),
            duckduckgo_url: "https://html.duckduckgo.com/html/".into(),
            brave_url: "https://api.search.brave.com/res/v1/web/search".into(),
            brave_api_key: String::new(),
            tavily_url: "https://api.tavily.com/search".into(),
            tavily_api_key: String::new(),
            default_results: 8,
            max_results: 20,
            retries: 1,
            cooldown_secs: 300,
            allow: Vec::new(),
            deny: Vec::new(),
            only: Vec::new(),
            ports: vec![80, 443],
            proxy: String::new(),
            connect_timeout_secs: 10,
            timeout_secs: 30,
            max_redirects: 5,
            max_body_kb: 5120,
            max_markdown_chars: 200_000,
            preview_chars: 1500,
            user_agent: concat!(
                "Mozilla/5.0 (compatible; sandboxd/",
                env!("CARGO_PKG_VERSION"),
                "; research)"
            )
            .into(),
            searches_per_run: 30,
            fetches_per_run: 60,
            searches_per_user_per_day: 500,
            fetches_per_user_per_day: 2000,
        }
    }
}

impl ResearchConfig {
    /// Refuses entries that would otherwise fail only at the first fetch: a malformed
    /// allow/deny/only entry, an unknown engine, a zero cap.
    pub fn validate(&self) -> Result<(), (String, String)> {
        super::ssrf::Policy::check_lists(self)?;
        for e in &self.engines {
            if !["searxng", "duckduckgo", "brave", "tavily"]
                .contains(&e.to_ascii_lowercase().as_str())
            {
                return Err((
                    "research.engines".into(),
                    format!("unknown engine {e:?}; known: searxng, duckduckgo, brave, tavily"),
                ));
            }
        }
        for (key, v) in [
            ("timeout_secs", self.timeout_secs),
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("max_body_kb", self.max_body_kb),
        ] {
            if v == 0 {
                return Err((format!("research.{key}"), "must be at least 1".into()));
            }
        }
        if self.ports.is_empty() {
            return Err((
                "research.ports".into(),
                "lists no port; the default is [80, 443]".into(),
            ));
        }
        Ok(())
    }

    /// The Brave key from the config, else from BRAVE_API_KEY.
    pub fn brave_key(&self) -> Option<String> {
        key_or_env(&self.brave_api_key, "BRAVE_API_KEY")
    }

    /// The Tavily key from the config, else from TAVILY_API_KEY.
    pub fn tavily_key(&self) -> Option<String> {
        key_or_env(&self.tavily_api_key, "TAVILY_API_KEY")
    }
}

fn key_or_env(configured: &str, var: &str) -> Option<String> {
    if !configured.trim().is_empty() {
        return Some(configured.trim().to_string());
    }
    std::env::var(var)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}
