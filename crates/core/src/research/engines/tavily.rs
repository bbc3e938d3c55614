//! Tavily: `POST /search` with a JSON body and `Authorization: Bearer`; the key comes from
//! `[research] tavily_api_key` or TAVILY_API_KEY. Tavily has no language parameter and
//! takes a country by its English name, so the region is sent only as `country` when it is
//! a name it knows ("germany"), never a guess.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;

use super::{Engine, EngineError, EngineHttp, RawHit, SearchQuery, endpoint, excerpt};
use crate::research::config::ResearchConfig;
use crate::research::fetcher::FetchRequest;
use crate::research::ssrf::Origin;

pub(super) struct Tavily {
    url: url::Url,
    key: String,
}

impl Tavily {
    pub(super) fn from_config(c: &ResearchConfig) -> Result<Self, String> {
        let key = c
            .tavily_key()
            .ok_or("no key ([research] tavily_api_key or TAVILY_API_KEY)")?;
        Ok(Self {
            url: endpoint("tavily_url", &c.tavily_url)?,
            key,
        })
    }
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    results: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    content: String,
}

#[async_trait]
impl Engine for Tavily {
    fn name(&self) -> &'static str {
        "tavily"
    }

    fn key(&self) -> String {
        format!("tavily {}", self.url)
    }

    async fn search(
        &self,
        http: &EngineHttp<'_>,
        q: &SearchQuery,
    ) -> Result<Vec<RawHit>, EngineError> {
        let mut body = json!({
            "query": q.query,
            "max_results": q.count.min(20),
            "search_depth": "basic",
            "topic": "general",
        });
        if let Some(r) = &q.region
            && r.len() > 3
            && r.chars().all(|c| c.is_ascii_alphabetic() || c == ' ')
        {
            body["country"] = json!(r.to_ascii_lowercase());
        }
        let mut req = FetchRequest::get(self.url.clone(), Origin::Admin)
            .header(reqwest::header::ACCEPT, "application/json")
            .header(
                reqwest::header::AUTHORIZATION,
                &format!("Bearer {}", self.key),
            );
        req.method = reqwest::Method::POST;
        req.body = Some(("application/json", body.to_string().into_bytes()));
        let resp = http.send(req).await?;
        let answer: Answer = serde_json::from_slice(&resp.body)
            .map_err(|e| EngineError::Parse(format!("{e} in {:?}", excerpt(&resp.body))))?;
        Ok(answer
            .results
            .into_iter()
            .map(|i| RawHit {
                title: i.title,
                url: i.url,
                snippet: i.content,
            })
            .collect())
    }
}
