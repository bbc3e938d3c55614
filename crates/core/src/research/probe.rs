//! What `sandboxd doctor` says about research: whether it is on, and which engines answer
//! (each configured engine is asked one small query through the real Fetcher).

use super::engines::{Search, SearchQuery, engines};
use super::fetcher::Fetcher;
use crate::config::ResearchConfig;

/// One engine's state as doctor prints it.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineState {
    /// Answered with this many results.
    Answers(usize),
    /// Configured, but the probe failed (blocked, unreachable, refused, no results).
    Fails(String),
    /// Not configured (no URL or no key); the reason says what to set.
    Unconfigured(String),
}

/// Every engine of `[research] engines`, in order.
pub async fn probe_engines(config: &ResearchConfig) -> Vec<(String, EngineState)> {
    let (usable, skipped) = engines(config);
    let mut out: Vec<(String, EngineState)> = skipped
        .into_iter()
        .map(|(n, why)| (n, EngineState::Unconfigured(why)))
        .collect();
    let fetcher = match Fetcher::new(config) {
        Ok(f) => f,
        Err(e) => {
            for e2 in usable {
                out.push((e2.name().into(), EngineState::Fails(e.to_string())));
            }
            return out;
        }
    };
    let q = SearchQuery {
        query: "sandboxd".into(),
        count: 3,
        language: None,
        region: None,
    };
    for engine in usable {
        let name = engine.name().to_string();
        let one = Search::new(vec![engine], config);
        let outcome = one.run(&fetcher, &q).await;
        let state = if outcome.engine.is_some() {
            EngineState::Answers(outcome.hits.len())
        } else {
            let why = outcome
                .failures
                .into_iter()
                .map(|(_, w)| w)
                .collect::<Vec<_>>()
                .join("; ");
            EngineState::Fails(why)
        };
        out.push((name, state));
    }
    // Back into the configured order.
    out.sort_by_key(|(n, _)| {
        config
            .engines
            .iter()
            .position(|e| e.eq_ignore_ascii_case(n))
            .unwrap_or(usize::MAX)
    });
    out
}
