//! Remote A2A agents as tools of a run (`[[remote_agents]]`): the client side of A2A, where
//! `serve`'s `/a2a` is the server side. At a run's start each agent the run's owner may use
//! has its card fetched; each one that answers becomes a tool `a2a_<name>`, and one that does
//! not is skipped with a notice to the model, as an MCP server is. Every byte goes through the
//! research `Fetcher`: `[research]`'s URL rules (no private or local address unless the admin
//! allows it, names resolved and checked by sandboxd, redirects checked hop by hop) hold for
//! the card, the endpoint it names and every call. The bearer token is read from sandboxd's
//! environment and sent only to the configured origin.

mod tool;
pub mod wire;

use std::sync::Arc;

use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use url::Url;

use crate::config::{Config, RemoteAgentConfig};
use crate::research::fetcher::{FetchRequest, Fetcher};
use crate::research::ssrf::Origin;
use crate::tools::Tool;
use wire::{Card, Dialect};

pub use tool::RemoteAgentTool;

/// Where an agent card is under an agent's base URL.
const WELL_KNOWN: &str = ".well-known/agent-card.json";

/// The tools of the remote agents `owner`'s runs may use, and a notice per agent skipped.
pub async fn connect(config: &Config, owner: &str) -> (Vec<Arc<dyn Tool>>, Vec<String>) {
    let allowed: Vec<&RemoteAgentConfig> = config
        .remote_agents
        .iter()
        .filter(|a| a.allows(owner))
        .collect();
    if allowed.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let fetcher = match Fetcher::new(&config.research) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            return (
                Vec::new(),
                vec![format!("remote A2A agents are skipped: {e}")],
            );
        }
    };
    let connecting = allowed.into_iter().map(|a| {
        let fetcher = fetcher.clone();
        async move { (a.name.clone(), Client::connect(a, fetcher).await) }
    });
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut notices = Vec::new();
    for (name, result) in futures::future::join_all(connecting).await {
        match result {
            Ok(client) => tools.push(Arc::new(RemoteAgentTool::new(client))),
            Err(why) => notices.push(format!("remote A2A agent {name} is skipped: {why}")),
        }
    }
    (tools, notices)
}

/// One remote agent as its card described it, and how to reach it.
pub struct Client {
    pub config: RemoteAgentConfig,
    pub card: Card,
    fetcher: Arc<Fetcher>,
    /// `Authorization: Bearer …`, only for the configured origin.
    auth: Option<HeaderValue>,
    /// Whether the endpoint is on the admin's configured origin (else checked as the model's).
    same_origin: bool,
}

impl Client {
    /// Fetches the card and checks what it names.
    async fn connect(config: &RemoteAgentConfig, fetcher: Arc<Fetcher>) -> Result<Client, String> {
        let base = Url::parse(&config.url).map_err(|e| format!("{}: {e}", config.url))?;
        let card_url = card_url(&base)?;
        let resp = fetcher
            .fetch(FetchRequest::get(card_url.clone(), Origin::Admin))
            .await
            .map_err(|e| format!("its card could not be fetched: {e}"))?;
        if !resp.status.is_success() {
            return Err(format!("its card at {card_url} answered {}", resp.status));
        }
        let card = wire::parse_card(&resp.body, &resp.final_url)?;
        let same_origin = card.endpoint.origin() == base.origin();
        let auth = match config.bearer_env.as_str() {
            "" => None,
            var => Some(bearer(var)?),
        };
        if auth.is_some() && !same_origin {
            return Err(format!(
                "its card names an endpoint on another origin ({}), and the token of {} is sent only to {}",
                card.endpoint,
                config.bearer_env,
                base.origin().ascii_serialization()
            ));
        }
        Ok(Client {
            config: config.clone(),
            card,
            fetcher,
            auth,
            same_origin,
        })
    }

    /// One JSON-RPC call; an HTTP error or a JSON-RPC error is an `Err` for the model.
    async fn call(&self, body: &Value) -> Result<wire::Reply, String> {
        let origin = if self.same_origin {
            Origin::Admin
        } else {
            Origin::Model
        };
        let mut req = FetchRequest {
            method: Method::POST,
            url: self.card.endpoint.clone(),
            headers: Vec::new(),
            body: Some(("application/json", body.to_string().into_bytes())),
            origin,
        };
        if self.card.dialect == Dialect::V1 {
            req.headers.push((
                HeaderName::from_static("a2a-version"),
                HeaderValue::from_static("1.0"),
            ));
        }
        if let Some(auth) = &self.auth {
            req.headers.push((AUTHORIZATION, auth.clone()));
        }
        let resp = self.fetcher.fetch(req).await.map_err(|e| e.to_string())?;
        match resp.status {
            s if s.is_success() => wire::parse_reply(&resp.body),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(format!(
                "the agent refused sandboxd's credentials ({}); the admin sets them with [[remote_agents]] bearer_env",
                resp.status
            )),
            s => Err(format!("the agent answered HTTP {s}")),
        }
    }
}

/// The card's URL: the configured URL if it names a `.json` file, else the well-known path
/// under it.
fn card_url(base: &Url) -> Result<Url, String> {
    if base.path().ends_with(".json") {
        return Ok(base.clone());
    }
    let mut dir = base.clone();
    if !dir.path().ends_with('/') {
        dir.set_path(&format!("{}/", dir.path()));
    }
    dir.join(WELL_KNOWN).map_err(|e| e.to_string())
}

/// `Bearer <the variable's value>`, checked to be a header value (never logged).
fn bearer(var: &str) -> Result<HeaderValue, String> {
    let token = std::env::var(var)
        .map_err(|_| format!("the environment variable {var} (bearer_env) is not set"))?;
    let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
        .map_err(|_| format!("the value of {var} cannot be sent in a header"))?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_card_is_under_the_base_url_or_is_the_url() {
        let u = |s: &str| card_url(&Url::parse(s).unwrap()).unwrap().to_string();
        assert_eq!(
            u("https://a.example"),
            "https://a.example/.well-known/agent-card.json"
        );
        assert_eq!(
            u("https://a.example/agents/w"),
            "https://a.example/agents/w/.well-known/agent-card.json"
        );
        assert_eq!(
            u("https://a.example/cards/w.json"),
            "https://a.example/cards/w.json"
        );
    }
}
