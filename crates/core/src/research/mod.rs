//! Research without giving the sandbox a network: host-side search and fetch.
//!
//! The container keeps `network=none`. `web_search` and `web_fetch` (src/tools/web/) run
//! here on the host, through one `Fetcher` that enforces every SSRF rule (ssrf.rs,
//! resolver.rs), and write what they bring back into the sandbox's /workspace/research
//! through the Sandbox trait, where python and the editor work on it. `Research` is what
//! the two tools of one run share: the config, the Fetcher (built on first use), the
//! engines and the quotas.

pub mod audit;

pub mod engines;
pub mod fetcher;
pub mod markdown;
mod own_addrs;
pub mod probe;
pub mod quota;
pub mod resolver;
pub mod ssrf;

use std::sync::{Arc, OnceLock};

pub mod config;
pub use config::ResearchConfig;
use engines::Search;
use fetcher::{FetchError, Fetcher};
use quota::{Quotas, UserBook};
use resolver::{NameResolver, SystemResolver};

/// Where research results land inside the sandbox.
pub const RESEARCH_DIR: &str = "/workspace/research";

/// The research state of one run (one tool registry).
pub struct Research {
    pub config: ResearchConfig,
    resolver: Arc<dyn NameResolver>,
    fetcher: OnceLock<Result<Arc<Fetcher>, String>>,
    pub search: Search,
    pub quotas: Quotas,
}

impl Research {
    /// `owner` is who the per-user quotas are charged to.
    pub fn new(config: &ResearchConfig, owner: &str) -> Arc<Research> {
        Self::with_parts(config, owner, Arc::new(SystemResolver), UserBook::global())
    }

    /// With a scripted resolver or a separate quota book (tests, `serve`).
    pub fn with_parts(
        config: &ResearchConfig,
        owner: &str,
        resolver: Arc<dyn NameResolver>,
        book: Arc<UserBook>,
    ) -> Arc<Research> {
        let (engines, skipped) = engines::engines(config);
        for (name, why) in skipped {
            tracing::debug!(engine = %name, reason = %why, "research: search engine not used");
        }
        Arc::new(Research {
            search: Search::new(engines, config),
            quotas: Quotas::new(config, owner, book),
            config: config.clone(),
            resolver,
            fetcher: OnceLock::new(),
        })
    }

    /// The Fetcher, built on first use so listing tools costs no TLS setup.
    pub fn fetcher(&self) -> Result<Arc<Fetcher>, FetchError> {
        self.fetcher
            .get_or_init(|| {
                Fetcher::with_resolver(&self.config, self.resolver.clone())
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(FetchError::Setup)
    }

    /// Whether web_search has an engine to ask.
    pub fn can_search(&self) -> bool {
        !self.search.is_empty()
    }
}

/// The current time as RFC 3339 UTC, for front matter and search files.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
