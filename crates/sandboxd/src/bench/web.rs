//! The research benchmark for `sandboxd bench research`: web_fetch of a local 1 MiB article
//! (the checked fetch, readability, Markdown, the write into /workspace) beside a plain
//! reqwest GET of the same page in the same run. The page is served on 127.0.0.1 and
//! admitted by a bench-only allow-list.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::header;
use axum::routing::get;
use serde_json::json;

use sandboxd_core::research::quota::UserBook;
use sandboxd_core::research::resolver::SystemResolver;
use sandboxd_core::research::{Research, ResearchConfig};
use sandboxd_core::sandbox::Sandbox;
use sandboxd_core::tools::web::WebFetch;
use sandboxd_core::tools::{Tool, ToolContext};

#[derive(Debug, Clone)]
pub struct FetchBench {
    /// web_fetch end to end, one sample per call.
    pub web_fetch: Vec<Duration>,
    /// reqwest GET + body of the same page.
    pub plain_get: Vec<Duration>,
    /// The checked fetch alone (SSRF rules, checked connection, capped body).
    pub checked_get: Vec<Duration>,
    /// Readability + Markdown of the page alone (no network, no sandbox).
    pub convert: Vec<Duration>,
    pub page_bytes: usize,
}

/// About 1 MiB of article HTML: paragraphs with relative links, a nav and a footer.
pub fn article(bytes: usize) -> String {
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Bench article</title></head><body>\
         <nav><a href=\"/\">Home</a> <a href=\"/about\">About</a></nav><article><h1>Bench article</h1>",
    );
    let mut i = 0;
    while html.len() < bytes {
        html.push_str(&format!(
            "<p>Paragraph {i} of the benchmark article talks about rainfall, temples and trains, \
             with <a href=\"/ref/{i}\">a reference</a> and <em>some emphasis</em> so that the \
             converter has inline markup to handle as well as plain running text.</p>"
        ));
        i += 1;
    }
    html.push_str("</article><footer>footer</footer></body></html>");
    html
}

pub async fn bench_fetch(sandbox: Arc<dyn Sandbox>, n: usize) -> Result<FetchBench, String> {
    let page = Arc::new(article(1 << 20));
    let page_bytes = page.len();
    let (port, server) = serve_page(page.clone()).await?;
    let mut config = ResearchConfig {
        allow: vec!["127.0.0.1/32".into()],
        fetches_per_run: u32::MAX,
        fetches_per_user_per_day: u32::MAX,
        ..ResearchConfig::default()
    };
    config.ports.push(port);
    let research = Research::with_parts(
        &config,
        "bench",
        Arc::new(SystemResolver),
        Arc::new(UserBook::default()),
    );
    let tool = WebFetch::new(sandbox, research.clone());
    let web_fetch = time_web_fetch(&tool, port, n).await?;
    let plain_get = time_plain_get(port, n, page_bytes).await?;
    let checked_get = time_checked_get(&research, port, n, page_bytes).await?;
    server.abort();
    let base = url::Url::parse(&page_url(port, 0)).map_err(|e| e.to_string())?;
    let mut convert = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let md = sandboxd_core::research::markdown::html_to_markdown(&page, &base);
        convert.push(t.elapsed());
        if md.markdown.len() < page_bytes / 4 {
            return Err(format!("the conversion lost the article ({})", md.method));
        }
    }
    Ok(FetchBench {
        web_fetch,
        plain_get,
        checked_get,
        convert,
        page_bytes,
    })
}

/// The page under `/page/{i}` on a loopback port; the port, and the server task to abort.
async fn serve_page(page: Arc<String>) -> Result<(u16, tokio::task::JoinHandle<()>), String> {
    let app = Router::new().route(
        "/page/{i}",
        get(move || {
            let p = page.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    p.to_string(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((port, server))
}

/// The page's URL; each `i` is its own URL, so no layer can answer from a cache.
fn page_url(port: u16, i: usize) -> String {
    format!("http://127.0.0.1:{port}/page/{i}")
}

/// web_fetch end to end, after one warm-up call (the TLS-free client, the connection and
/// the file helper).
async fn time_web_fetch(tool: &WebFetch, port: u16, n: usize) -> Result<Vec<Duration>, String> {
    let ctx = ToolContext::default();
    let first = tool
        .execute(json!({"url": page_url(port, 0)}), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    if first.is_error() {
        return Err(first.render());
    }
    let mut web_fetch = Vec::with_capacity(n);
    for i in 1..=n {
        let t = Instant::now();
        let r = tool
            .execute(json!({"url": page_url(port, i)}), &ctx)
            .await
            .map_err(|e| e.to_string())?;
        web_fetch.push(t.elapsed());
        if r.is_error() {
            return Err(r.render());
        }
    }
    Ok(web_fetch)
}

async fn time_plain_get(port: u16, n: usize, page_bytes: usize) -> Result<Vec<Duration>, String> {
    let client = reqwest::Client::new();
    let mut plain_get = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let body = client
            .get(page_url(port, i))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        plain_get.push(t.elapsed());
        if body.len() != page_bytes {
            return Err("the plain GET lost bytes".into());
        }
    }
    Ok(plain_get)
}

async fn time_checked_get(
    research: &Research,
    port: u16,
    n: usize,
    page_bytes: usize,
) -> Result<Vec<Duration>, String> {
    let fetcher = research.fetcher().map_err(|e| e.to_string())?;
    let mut checked_get = Vec::with_capacity(n);
    for i in 0..n {
        let u = url::Url::parse(&page_url(port, i)).map_err(|e| e.to_string())?;
        let t = Instant::now();
        let r = fetcher
            .fetch(sandboxd_core::research::fetcher::FetchRequest::get(
                u,
                sandboxd_core::research::ssrf::Origin::Model,
            ))
            .await
            .map_err(|e| e.to_string())?;
        checked_get.push(t.elapsed());
        if r.body.len() != page_bytes {
            return Err("the checked GET lost bytes".into());
        }
    }
    Ok(checked_get)
}
