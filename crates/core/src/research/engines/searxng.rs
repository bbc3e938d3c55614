//! SearXNG's JSON API (`/search?format=json`): keyless and the first choice for a
//! self-hosted deployment. The instance must have `json` under `search.formats`, else it
//! answers 403, which is reported with that fix.

use async_trait::async_trait;
use serde::Deserialize;

use super::{Engine, EngineError, EngineHttp, RawHit, SearchQuery, endpoint, excerpt};
use crate::research::config::ResearchConfig;
use crate::research::fetcher::FetchRequest;
use crate::research::ssrf::Origin;

pub(super) struct SearXng {
    base: url::Url,
}

impl SearXng {
    pub(super) fn from_config(c: &ResearchConfig) -> Result<Self, String> {
        Ok(Self {
            base: endpoint("searxng_url", &c.searxng_url)?,
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
    url: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    content: String,
}

#[async_trait]
impl Engine for SearXng {
    fn name(&self) -> &'static str {
        "searxng"
    }

    fn key(&self) -> String {
        format!("searxng {}", self.base)
    }

    async fn search(
        &self,
        http: &EngineHttp<'_>,
        q: &SearchQuery,
    ) -> Result<Vec<RawHit>, EngineError> {
        let mut url = self
            .base
            .join("search")
            .map_err(|e| EngineError::Parse(e.to_string()))?;
        {
            let mut p = url.query_pairs_mut();
            p.append_pair("q", &q.query)
                .append_pair("format", "json")
                .append_pair("pageno", "1")
                .append_pair("safesearch", "1");
            // SearXNG takes one locale: "de-CH", or a language alone.
            let locale = match (&q.language, &q.region) {
                (Some(l), Some(r)) => Some(format!("{l}-{}", r.to_ascii_uppercase())),
                (Some(l), None) => Some(l.clone()),
                (None, Some(r)) => Some(format!("all-{}", r.to_ascii_uppercase())),
                (None, None) => None,
            };
            if let Some(l) = locale {
                p.append_pair("language", &l);
            }
        }
        let req = FetchRequest::get(url, Origin::Admin)
            .header(reqwest::header::ACCEPT, "application/json");
        let resp = match http.send(req).await {
            Err(EngineError::Status { status: 403, .. }) => {
                return Err(EngineError::Status {
                    status: 403,
                    detail: "the instance refuses JSON; enable `json` under search.formats in its settings.yml".into(),
                });
            }
            other => other?,
        };
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
