//! Brave Search API: `GET /res/v1/web/search` with the `X-Subscription-Token` header; the
//! key comes from `[research] brave_api_key` or BRAVE_API_KEY.

use async_trait::async_trait;
use serde::Deserialize;

use super::{Engine, EngineError, EngineHttp, RawHit, SearchQuery, endpoint, excerpt};
use crate::research::config::ResearchConfig;
use crate::research::fetcher::FetchRequest;
use crate::research::ssrf::Origin;

pub(super) struct Brave {
    url: url::Url,
    key: String,
}

impl Brave {
    pub(super) fn from_config(c: &ResearchConfig) -> Result<Self, String> {
        let key = c
            .brave_key()
            .ok_or("no key ([research] brave_api_key or BRAVE_API_KEY)")?;
        Ok(Self {
            url: endpoint("brave_url", &c.brave_url)?,
            key,
        })
    }
}

#[derive(Deserialize, Default)]
struct Answer {
    #[serde(default)]
    web: Web,
}

#[derive(Deserialize, Default)]
struct Web {
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
    description: String,
}

#[async_trait]
impl Engine for Brave {
    fn name(&self) -> &'static str {
        "brave"
    }

    fn key(&self) -> String {
        format!("brave {}", self.url)
    }

    async fn search(
        &self,
        http: &EngineHttp<'_>,
        q: &SearchQuery,
    ) -> Result<Vec<RawHit>, EngineError> {
        let mut url = self.url.clone();
        {
            let mut p = url.query_pairs_mut();
            p.append_pair("q", &q.query)
                .append_pair("count", &q.count.min(20).to_string());
            if let Some(r) = &q.region {
                p.append_pair("country", &r.to_ascii_lowercase());
            }
            if let Some(l) = &q.language {
                p.append_pair("search_lang", &l.to_ascii_lowercase());
            }
        }
        let req = FetchRequest::get(url, Origin::Admin)
            .header(reqwest::header::ACCEPT, "application/json")
            .header(
                reqwest::header::HeaderName::from_static("x-subscription-token"),
                &self.key,
            );
        let resp = http.send(req).await?;
        let answer: Answer = serde_json::from_slice(&resp.body)
            .map_err(|e| EngineError::Parse(format!("{e} in {:?}", excerpt(&resp.body))))?;
        Ok(answer
            .web
            .results
            .into_iter()
            .map(|i| RawHit {
                title: i.title,
                url: i.url,
                snippet: i.description,
            })
            .collect())
    }
}
