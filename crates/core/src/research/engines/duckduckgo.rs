//! DuckDuckGo's HTML endpoint: keyless but fragile. One POST of the first page only (later
//! pages need a `vqd` token and are what gets an address blocked); a CAPTCHA page
//! (`form#challenge-form`, the "anomaly" page) or HTTP 202 counts as blocked and cools
//! the engine down. Result links that go through `/l/?uddg=` are decoded.

use async_trait::async_trait;

use super::{Engine, EngineError, EngineHttp, RawHit, SearchQuery, endpoint};
use crate::research::config::ResearchConfig;
use crate::research::fetcher::FetchRequest;
use crate::research::ssrf::Origin;

/// DuckDuckGo refuses longer queries.
const MAX_QUERY: usize = 499;

pub(super) struct DuckDuckGo {
    url: url::Url,
}

impl DuckDuckGo {
    pub(super) fn from_config(c: &ResearchConfig) -> Result<Self, String> {
        Ok(Self {
            url: endpoint("duckduckgo_url", &c.duckduckgo_url)?,
        })
    }
}

/// DuckDuckGo's `kl`: "region-language" ("us-en", "de-de"), "wt-wt" for no region.
fn region_code(q: &SearchQuery) -> String {
    match (&q.region, &q.language) {
        (None, _) => "wt-wt".into(),
        (Some(r), Some(l)) => format!("{}-{}", r.to_ascii_lowercase(), l.to_ascii_lowercase()),
        (Some(r), None) => {
            let r = r.to_ascii_lowercase();
            let lang = match r.as_str() {
                "us" | "uk" | "au" | "ca" | "nz" | "ie" | "in" | "za" => "en",
                other => other,
            };
            format!("{r}-{lang}")
        }
    }
}

#[async_trait]
impl Engine for DuckDuckGo {
    fn name(&self) -> &'static str {
        "duckduckgo"
    }

    fn key(&self) -> String {
        format!("duckduckgo {}", self.url)
    }

    async fn search(
        &self,
        http: &EngineHttp<'_>,
        q: &SearchQuery,
    ) -> Result<Vec<RawHit>, EngineError> {
        let query: String = q.query.chars().take(MAX_QUERY).collect();
        let form = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("q", &query)
            .append_pair("b", "")
            .append_pair("kl", &region_code(q))
            .finish();
        let referer = self.url.origin().ascii_serialization() + "/";
        let mut req = FetchRequest::get(self.url.clone(), Origin::Admin)
            .header(reqwest::header::REFERER, &referer)
            .header(reqwest::header::ACCEPT, "text/html")
            .header(
                reqwest::header::ACCEPT_LANGUAGE,
                q.language.as_deref().unwrap_or("en"),
            );
        req.method = reqwest::Method::POST;
        req.body = Some(("application/x-www-form-urlencoded", form.into_bytes()));
        let resp = http.send(req).await?;
        if resp.status.as_u16() == 202 {
            return Err(EngineError::Blocked {
                reason: "HTTP 202 (DuckDuckGo's rate limit)".into(),
                retry_after: None,
            });
        }
        let html = String::from_utf8_lossy(&resp.body);
        parse(&html)
    }
}

/// Results of an HTML result page, or Blocked for a CAPTCHA page.
pub(super) fn parse(html: &str) -> Result<Vec<RawHit>, EngineError> {
    let doc = dom_query::Document::from(html);
    if doc.select("form#challenge-form").exists()
        || doc.select(".anomaly-modal__title").exists()
        || html.contains("bots use DuckDuckGo too")
    {
        return Err(EngineError::Blocked {
            reason: "a CAPTCHA page (DuckDuckGo's bot check)".into(),
            retry_after: None,
        });
    }
    let mut out = Vec::new();
    for node in doc.select("div.result, div.web-result").nodes() {
        let result = dom_query::Selection::from(*node);
        if result.has_class("result--ad") {
            continue;
        }
        let link = result.select("a.result__a, h2 a").first();
        let Some(href) = link.attr("href") else {
            continue;
        };
        let snippet = result.select(".result__snippet").first().text();
        out.push(RawHit {
            title: link.text().to_string(),
            url: decode_href(&href),
            snippet: snippet.to_string(),
        });
    }
    Ok(out)
}

/// `//duckduckgo.com/l/?uddg=<target>&rut=…` → the target; other hrefs as they are.
fn decode_href(href: &str) -> String {
    let full = if href.starts_with("//") {
        format!("https:{href}")
    } else {
        href.to_string()
    };
    if let Ok(u) = url::Url::parse(&full)
        && u.path() == "/l/"
        && let Some((_, target)) = u.query_pairs().find(|(k, _)| k == "uddg")
    {
        return target.into_owned();
    }
    full
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_read_and_redirect_links_decoded() {
        let html = r#"<div id="links">
          <div class="result results_links web-result result--ad"><h2><a class="result__a" href="https://ads.example/">Ad</a></h2></div>
          <div class="result results_links web-result"><h2 class="result__title">
            <a class="result__a" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fexample.com%2Fa%3Fx%3D1&amp;rut=abc">Example <b>A</b></a></h2>
            <a class="result__snippet" href="x">First snippet</a></div>
          <div class="result results_links web-result"><h2><a class="result__a" href="https://example.org/b">B</a></h2>
            <a class="result__snippet">Second</a></div></div>"#;
        let hits = parse(html).unwrap();
        assert_eq!(hits.len(), 2, "{hits:?}");
        assert_eq!(hits[0].url, "https://example.com/a?x=1");
        assert_eq!(hits[0].title, "Example A");
        assert_eq!(hits[0].snippet, "First snippet");
        assert_eq!(hits[1].url, "https://example.org/b");
    }

    #[test]
    fn a_captcha_page_is_blocked() {
        let html = r#"<form id="challenge-form" action="//duckduckgo.com/anomaly.js"></form>"#;
        assert!(matches!(parse(html), Err(EngineError::Blocked { .. })));
    }

    #[test]
    fn region_and_language_become_kl() {
        let q = |r: Option<&str>, l: Option<&str>| SearchQuery {
            query: "x".into(),
            count: 5,
            region: r.map(String::from),
            language: l.map(String::from),
        };
        assert_eq!(region_code(&q(None, Some("de"))), "wt-wt");
        assert_eq!(region_code(&q(Some("DE"), None)), "de-de");
        assert_eq!(region_code(&q(Some("us"), None)), "us-en");
        assert_eq!(region_code(&q(Some("ch"), Some("fr"))), "ch-fr");
    }
}
