//! Search engines behind one trait, tried in the configured order by `Search::run`.
//!
//! An engine that errs **or** answers nothing hands over to the next one, and the
//! observation lists every engine that failed and why. Retries are short and bounded
//! (a network error or 5xx only, after 500 ms); a CAPTCHA or rate-limit answer cools that
//! engine down for `cooldown_secs` (or the engine's Retry-After, if shorter than an hour)
//! and is never retried inside a call, so no tool call sleeps for more than a second.

mod brave;
mod duckduckgo;
mod searxng;
mod tavily;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::audit::FetchRecord;
use super::fetcher::{FetchError, FetchRequest, FetchResponse, Fetcher};
use crate::research::config::ResearchConfig;

/// What the model asked for, as every engine receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchQuery {
    pub query: String,
    pub count: usize,
    /// A language code ("en", "de"), if given.
    pub language: Option<String>,
    /// A region/country code ("us", "de"), if given.
    pub region: Option<String>,
}

/// One normalised result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    pub rank: usize,
    pub title: String,
    pub url: String,
    pub snippet: String,
    pub engine: String,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A CAPTCHA, a 429 or an anomaly page: the engine is cooled down.
    #[error("blocked: {reason}")]
    Blocked {
        reason: String,
        retry_after: Option<Duration>,
    },
    #[error("HTTP {status}: {detail}")]
    Status { status: u16, detail: String },
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("unreadable answer: {0}")]
    Parse(String),
}

impl EngineError {
    fn transient(&self) -> bool {
        match self {
            EngineError::Status { status, .. } => *status >= 500,
            EngineError::Fetch(FetchError::Network { .. } | FetchError::Timeout { .. }) => true,
            _ => false,
        }
    }
}

/// One search engine. `search` returns raw results; ranking, de-duplication and the
/// engine name are filled in by `Search::run`.
#[async_trait]
pub trait Engine: Send + Sync {
    fn name(&self) -> &'static str;
    /// A stable key for its cool-down (name and endpoint).
    fn key(&self) -> String;
    async fn search(
        &self,
        http: &EngineHttp<'_>,
        q: &SearchQuery,
    ) -> Result<Vec<RawHit>, EngineError>;
}

#[derive(Debug, Clone, PartialEq)]
pub struct RawHit {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

/// The Fetcher as engines use it: every request is recorded for the audit.
pub struct EngineHttp<'a> {
    fetcher: &'a Fetcher,
    records: Mutex<Vec<FetchRecord>>,
}

impl EngineHttp<'_> {
    pub async fn send(&self, req: FetchRequest) -> Result<FetchResponse, EngineError> {
        let url = req.url.to_string();
        let started = std::time::Instant::now();
        let result = self.fetcher.fetch(req).await;
        let record = match &result {
            Ok(r) => r.record(),
            Err(e) => FetchRecord::failed(&url, e, started.elapsed().as_millis() as u64),
        };
        if let Ok(mut r) = self.records.lock() {
            r.push(record);
        }
        let resp = result?;
        if resp.status.as_u16() == 429 {
            return Err(EngineError::Blocked {
                reason: "HTTP 429 Too Many Requests".into(),
                retry_after: retry_after(&resp),
            });
        }
        if !resp.status.is_success() {
            let detail: String = String::from_utf8_lossy(&resp.body)
                .chars()
                .take(200)
                .collect();
            return Err(EngineError::Status {
                status: resp.status.as_u16(),
                detail: detail.split_whitespace().collect::<Vec<_>>().join(" "),
            });
        }
        Ok(resp)
    }
}

fn retry_after(resp: &FetchResponse) -> Option<Duration> {
    resp.headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// (engine name, why it is not used).
pub type Skipped = Vec<(String, String)>;

/// Engines that are configured, in order; the others with the reason they are not.
pub fn engines(config: &ResearchConfig) -> (Vec<Arc<dyn Engine>>, Skipped) {
    let mut usable: Vec<Arc<dyn Engine>> = Vec::new();
    let mut skipped = Vec::new();
    for name in &config.engines {
        let built: Result<Arc<dyn Engine>, String> = match name.to_ascii_lowercase().as_str() {
            "searxng" => searxng::SearXng::from_config(config).map(|e| Arc::new(e) as _),
            "duckduckgo" => duckduckgo::DuckDuckGo::from_config(config).map(|e| Arc::new(e) as _),
            "brave" => brave::Brave::from_config(config).map(|e| Arc::new(e) as _),
            "tavily" => tavily::Tavily::from_config(config).map(|e| Arc::new(e) as _),
            other => Err(format!(
                "unknown engine {other:?} (known: searxng, duckduckgo, brave, tavily)"
            )),
        };
        match built {
            Ok(e) => usable.push(e),
            Err(why) => skipped.push((name.clone(), why)),
        }
    }
    (usable, skipped)
}

/// Cool-downs of this process, by engine key.
fn cooldowns() -> &'static Mutex<HashMap<String, Instant>> {
    static C: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// How long `key` is still cooling down, if it is.
pub fn cooling(key: &str) -> Option<Duration> {
    let map = cooldowns().lock().ok()?;
    let until = *map.get(key)?;
    let now = Instant::now();
    (until > now).then(|| until - now)
}

fn cool_down(key: &str, d: Duration) {
    if let Ok(mut map) = cooldowns().lock() {
        map.insert(key.to_string(), Instant::now() + d);
    }
}

/// What a search produced.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub hits: Vec<Hit>,
    /// The engine that answered, if any did.
    pub engine: Option<String>,
    /// Engines that failed or were skipped, and why.
    pub failures: Vec<(String, String)>,
    pub records: Vec<FetchRecord>,
}

pub struct Search {
    engines: Vec<Arc<dyn Engine>>,
    retries: u32,
    cooldown: Duration,
}

impl Search {
    pub fn new(engines: Vec<Arc<dyn Engine>>, config: &ResearchConfig) -> Self {
        Self {
            engines,
            retries: config.retries.min(3),
            cooldown: Duration::from_secs(config.cooldown_secs),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    pub async fn run(&self, fetcher: &Fetcher, q: &SearchQuery) -> Outcome {
        let http = EngineHttp {
            fetcher,
            records: Mutex::new(Vec::new()),
        };
        let mut out = Outcome::default();
        for engine in &self.engines {
            let key = engine.key();
            if let Some(left) = cooling(&key) {
                out.failures.push((
                    engine.name().into(),
                    format!(
                        "cooling down for {} s after being blocked",
                        left.as_secs().max(1)
                    ),
                ));
                continue;
            }
            match self.attempt(engine.as_ref(), &http, q).await {
                Ok(raw) => {
                    let hits = normalise(raw, engine.name(), q.count);
                    if hits.is_empty() {
                        out.failures
                            .push((engine.name().into(), "no results".into()));
                        continue;
                    }
                    out.hits = hits;
                    out.engine = Some(engine.name().into());
                    break;
                }
                Err(e) => {
                    if let EngineError::Blocked { retry_after, .. } = &e {
                        let d = retry_after
                            .filter(|d| *d <= Duration::from_secs(3600))
                            .unwrap_or(self.cooldown)
                            .max(Duration::from_secs(1));
                        cool_down(&key, d);
                        tracing::warn!(
                            engine = engine.name(),
                            secs = d.as_secs(),
                            "research: engine blocked; cooling down"
                        );
                    }
                    out.failures.push((engine.name().into(), e.to_string()));
                }
            }
        }
        out.records = http.records.into_inner().unwrap_or_default();
        out
    }

    async fn attempt(
        &self,
        engine: &dyn Engine,
        http: &EngineHttp<'_>,
        q: &SearchQuery,
    ) -> Result<Vec<RawHit>, EngineError> {
        let mut tries = 0;
        loop {
            match engine.search(http, q).await {
                Err(e) if e.transient() && tries < self.retries => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                other => return other,
            }
        }
    }
}

/// Ranks from 1, drops results without an http(s) URL or seen before (ignoring the
/// fragment and a trailing slash), trims snippets, keeps at most `count`.
pub fn normalise(raw: Vec<RawHit>, engine: &str, count: usize) -> Vec<Hit> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in raw {
        let Ok(mut url) = url::Url::parse(r.url.trim()) else {
            continue;
        };
        if !matches!(url.scheme(), "http" | "https") {
            continue;
        }
        url.set_fragment(None);
        let key = url.as_str().trim_end_matches('/').to_ascii_lowercase();
        if !seen.insert(key) {
            continue;
        }
        let squash = |s: &str, max: usize| -> String {
            let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
            s.chars().take(max).collect()
        };
        out.push(Hit {
            rank: out.len() + 1,
            title: squash(&r.title, 300),
            url: url.to_string(),
            snippet: squash(&r.snippet, 500),
            engine: engine.to_string(),
        });
        if out.len() >= count {
            break;
        }
    }
    out
}

/// An admin-configured endpoint, parsed.
fn endpoint(key: &str, raw: &str) -> Result<url::Url, String> {
    if raw.trim().is_empty() {
        return Err(format!("[research] {key} is not set"));
    }
    url::Url::parse(raw.trim()).map_err(|e| format!("[research] {key} {raw:?}: {e}"))
}

/// The part of a body a parse error quotes.
fn excerpt(body: &[u8]) -> String {
    let s: String = String::from_utf8_lossy(body).chars().take(120).collect();
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
