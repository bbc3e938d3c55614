//! The one `Fetcher` both research tools use: every rule of `ssrf.rs` on every hop, the
//! checked resolver, redirects followed by hand, no environment proxy, timeouts, a body
//! streamed under a hard cap and only text-like content types (and PDF).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use reqwest::{Method, StatusCode};
use url::Url;

use super::audit::FetchRecord;
use super::resolver::{CheckedResolve, NameResolver, SystemResolver, refusal_in, resolve_checked};
use super::ssrf::{Origin, Policy, Refusal, Target};
use crate::config::ResearchConfig;

/// Content types a page may have. Anything else (images, archives, executables, octet
/// streams) is refused before the body is read.
const TEXT_TYPES: &[&str] = &[
    "text/html",
    "application/xhtml+xml",
    "text/plain",
    "text/markdown",
    "text/csv",
    "text/xml",
    "application/xml",
    "application/json",
    "application/rss+xml",
    "application/atom+xml",
    "application/pdf",
];

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("{url}: {message}")]
    Network { url: String, message: String },
    #[error("{url}: no answer within {secs} s (the whole fetch, redirects included)")]
    Timeout { url: String, secs: u64 },
    #[error("the research client could not be built: {0}")]
    Setup(String),
}

/// One request as a tool or engine makes it.
#[derive(Debug, Clone)]
pub struct FetchRequest {
    pub method: Method,
    pub url: Url,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// A body and its content type (engines' POSTs).
    pub body: Option<(&'static str, Vec<u8>)>,
    pub origin: Origin,
}

impl FetchRequest {
    pub fn get(url: Url, origin: Origin) -> Self {
        Self {
            method: Method::GET,
            url,
            headers: Vec::new(),
            body: None,
            origin,
        }
    }

    pub fn header(mut self, name: HeaderName, value: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.push((name, v));
        }
        self
    }
}

#[derive(Debug, Clone)]
pub struct FetchResponse {
    pub url: Url,
    pub final_url: Url,
    pub status: StatusCode,
    /// The media type, lower-cased, without parameters ("text/html").
    pub content_type: String,
    pub charset: Option<String>,
    pub body: Vec<u8>,
    pub headers: HeaderMap,
    pub remote_addr: Option<SocketAddr>,
    pub elapsed: Duration,
}

impl FetchResponse {
    pub fn record(&self) -> FetchRecord {
        FetchRecord {
            url: self.url.to_string(),
            final_url: Some(self.final_url.to_string()),
            status: Some(self.status.as_u16()),
            bytes: self.body.len() as u64,
            content_type: Some(self.content_type.clone()),
            refused: None,
            error: None,
            elapsed_ms: self.elapsed.as_millis() as u64,
        }
    }
}

pub struct Fetcher {
    client: reqwest::Client,
    policy: Arc<Policy>,
    resolver: Arc<dyn NameResolver>,
    proxied: bool,
    timeout: Duration,
    connect_timeout: Duration,
    max_redirects: usize,
    max_body: u64,
    user_agent: String,
}

impl Fetcher {
    pub fn new(config: &ResearchConfig) -> Result<Fetcher, FetchError> {
        Self::with_resolver(config, Arc::new(SystemResolver))
    }

    pub fn with_resolver(
        config: &ResearchConfig,
        resolver: Arc<dyn NameResolver>,
    ) -> Result<Fetcher, FetchError> {
        let policy = Arc::new(Policy::from_config(config).map_err(FetchError::Setup)?);
        let connect_timeout = Duration::from_secs(config.connect_timeout_secs.max(1));
        let timeout = Duration::from_secs(config.timeout_secs.max(1));
        let mut builder = reqwest::Client::builder()
            // Environment proxies would move name resolution out of our hands.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(connect_timeout)
            .timeout(timeout)
            .referer(false);
        let proxied = !config.proxy.trim().is_empty();
        let mut proxy_host = None;
        if proxied {
            let proxy_url = Url::parse(config.proxy.trim())
                .map_err(|e| FetchError::Setup(format!("[research] proxy: {e}")))?;
            // The admin's proxy is reached whatever its address is; only its own name is
            // exempt from the checks, never the targets behind it.
            proxy_host = proxy_url.host_str().map(|h| h.to_ascii_lowercase());
            let proxy = reqwest::Proxy::all(proxy_url.as_str())
                .map_err(|e| FetchError::Setup(format!("[research] proxy: {e}")))?;
            builder = builder.proxy(proxy);
        }
        builder = builder.dns_resolver(Arc::new(CheckedResolve {
            policy: policy.clone(),
            resolver: resolver.clone(),
            timeout: connect_timeout,
            exempt: proxy_host,
        }));
        let client = builder
            .build()
            .map_err(|e| FetchError::Setup(e.to_string()))?;
        Ok(Fetcher {
            client,
            policy,
            resolver,
            proxied,
            timeout,
            connect_timeout,
            max_redirects: config.max_redirects,
            max_body: config.max_body_kb.saturating_mul(1024),
            user_agent: config.user_agent.clone(),
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// One fetch with its whole redirect chain under one deadline.
    pub async fn fetch(&self, req: FetchRequest) -> Result<FetchResponse, FetchError> {
        let url = req.url.to_string();
        let started = Instant::now();
        match tokio::time::timeout(self.timeout, self.follow(req, started)).await {
            Ok(r) => r,
            Err(_) => Err(FetchError::Timeout {
                url,
                secs: self.timeout.as_secs(),
            }),
        }
    }

    async fn follow(
        &self,
        mut req: FetchRequest,
        started: Instant,
    ) -> Result<FetchResponse, FetchError> {
        let first = req.url.clone();
        let mut hops = vec![first.clone()];
        loop {
            let target = self.policy.check_url(&req.url, req.origin)?;
            if let (true, Target::Name(name)) = (self.proxied, &target) {
                // Through a proxy our resolver never sees the target: check it here at
                // least (not rebinding-proof; the proxy must enforce its own rules).
                resolve_checked(
                    self.resolver.as_ref(),
                    &self.policy,
                    name,
                    self.connect_timeout,
                )
                .await
                .map_err(|e| match e {
                    super::resolver::ResolveError::Refused(r) => FetchError::Refused(r),
                    other => network(&req.url, other.to_string()),
                })?;
            }
            let resp = self.send(&req).await?;
            let status = resp.status();
            if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
                let next = resp
                    .headers()
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| req.url.join(l).ok());
                let Some(next) = next else {
                    return Err(network(
                        &req.url,
                        format!("a {status} redirect without a usable Location"),
                    ));
                };
                if hops.len() > self.max_redirects {
                    return Err(Refusal::new(
                        "redirects",
                        format!(
                            "more than {} redirects ({} → … → {next})",
                            self.max_redirects, first
                        ),
                        "fetch the final URL directly if it is known; redirect chains this long are cut",
                    )
                    .into());
                }
                hops.push(next.clone());
                req = redirected(req, status, next);
                continue;
            }
            return self.read(first, req.url, resp, started).await;
        }
    }

    async fn send(&self, req: &FetchRequest) -> Result<reqwest::Response, FetchError> {
        let mut builder = self
            .client
            .request(req.method.clone(), req.url.clone())
            .header(reqwest::header::USER_AGENT, &self.user_agent);
        for (k, v) in &req.headers {
            builder = builder.header(k, v);
        }
        if let Some((ct, body)) = &req.body {
            builder = builder.header(CONTENT_TYPE, *ct).body(body.clone());
        }
        builder.send().await.map_err(|e| match refusal_in(&e) {
            Some(r) => FetchError::Refused(r),
            None if e.is_timeout() => FetchError::Timeout {
                url: req.url.to_string(),
                secs: self.timeout.as_secs(),
            },
            None => network(&req.url, error_chain(&e)),
        })
    }

    async fn read(
        &self,
        url: Url,
        final_url: Url,
        mut resp: reqwest::Response,
        started: Instant,
    ) -> Result<FetchResponse, FetchError> {
        let (content_type, charset) = media_type(resp.headers().get(CONTENT_TYPE));
        if let Some(ct) = &content_type
            && !TEXT_TYPES.contains(&ct.as_str())
        {
            return Err(Refusal::new(
                "content-type",
                format!("{final_url} is {ct}, not text, HTML, JSON, XML or PDF"),
                "only text-like pages and PDFs are fetched; no setting widens this",
            )
            .into());
        }
        let declared = resp
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(n) = declared
            && n > self.max_body
        {
            return Err(self
                .too_large(&final_url, format!("declares {n} bytes"))
                .into());
        }
        let mut body = Vec::with_capacity(declared.unwrap_or(0).min(self.max_body) as usize);
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| network(&final_url, error_chain(&e)))?
        {
            if body.len() as u64 + chunk.len() as u64 > self.max_body {
                return Err(self
                    .too_large(
                        &final_url,
                        format!("sent more than {} bytes", self.max_body),
                    )
                    .into());
            }
            body.extend_from_slice(&chunk);
        }
        let content_type = match content_type {
            Some(ct) => ct,
            None => sniff(&body).ok_or_else(|| {
                Refusal::new(
                    "content-type",
                    format!("{final_url} has no content type and does not look like text"),
                    "only text-like pages and PDFs are fetched; no setting widens this",
                )
            })?,
        };
        Ok(FetchResponse {
            url,
            final_url,
            status: resp.status(),
            content_type,
            charset,
            headers: resp.headers().clone(),
            remote_addr: resp.remote_addr(),
            body,
            elapsed: started.elapsed(),
        })
    }

    fn too_large(&self, url: &Url, what: String) -> Refusal {
        Refusal::new(
            "body-size",
            format!("{url} {what}, over the cap of {} KiB", self.max_body / 1024),
            "the admin can raise [research] max_body_kb",
        )
    }
}

/// The next request of a redirect: 303 (and 301/302 after a POST, as browsers do) turn
/// into a GET without a body; headers the caller set never follow to another origin.
fn redirected(mut req: FetchRequest, status: StatusCode, next: Url) -> FetchRequest {
    let to_get = status == StatusCode::SEE_OTHER
        || (req.method == Method::POST
            && matches!(status, StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND));
    if to_get {
        req.method = Method::GET;
        req.body = None;
    }
    if next.origin() != req.url.origin() {
        req.headers.clear();
    }
    req.url = next;
    req
}

fn media_type(v: Option<&HeaderValue>) -> (Option<String>, Option<String>) {
    let Some(raw) = v.and_then(|v| v.to_str().ok()) else {
        return (None, None);
    };
    let mut parts = raw.split(';');
    let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let charset = parts.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| v.trim().trim_matches('"').to_ascii_lowercase())
    });
    ((!essence.is_empty()).then_some(essence), charset)
}

/// A type for a body served without one: PDF by its magic, HTML or plain text if it is
/// text; None for anything binary.
fn sniff(body: &[u8]) -> Option<String> {
    if body.starts_with(b"%PDF-") {
        return Some("application/pdf".into());
    }
    let head = &body[..body.len().min(1024)];
    if head.contains(&0) {
        return None;
    }
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    let t = text.trim_start();
    if t.starts_with("<!doctype html") || t.starts_with("<html") {
        Some("text/html".into())
    } else {
        Some("text/plain".into())
    }
}

fn network(url: &Url, message: String) -> FetchError {
    FetchError::Network {
        url: url.to_string(),
        message,
    }
}

/// reqwest's Display hides the cause ("error sending request"); the chain says it.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}
