//! A local web for the research tests (axum on 127.0.0.1, never the internet): article
//! pages, redirect chains, oversized and binary bodies, a PDF, a fake SearXNG JSON API and
//! a fake DuckDuckGo HTML endpoint that can be switched to its CAPTCHA page. Every request
//! is recorded (path and query or form body).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use serde_json::json;

#[derive(Default)]
pub struct WebState {
    /// (path, query string or form body) of every request.
    pub hits: Mutex<Vec<(String, String)>>,
    /// DuckDuckGo answers with its CAPTCHA page while this is set.
    pub captcha: AtomicBool,
    /// SearXNG answers with no results while this is set.
    pub searx_empty: AtomicBool,
    /// The port this server listens on (the search results link back to it).
    pub port: std::sync::atomic::AtomicU16,
}

pub struct FakeWeb {
    pub addr: SocketAddr,
    pub state: Arc<WebState>,
}

impl FakeWeb {
    pub async fn start() -> FakeWeb {
        let state = Arc::new(WebState::default());
        let app = Router::new()
            .route("/article/{name}", get(article))
            .route("/redirect/{n}", get(redirect))
            .route("/to", get(to))
            .route("/big", get(big))
            .route("/stream-big", get(stream_big))
            .route(
                "/binary",
                get(|| typed("application/octet-stream", vec![0u8, 1, 2, 255])),
            )
            .route(
                "/png",
                get(|| typed("image/png", b"\x89PNG\r\n\x1a\n....".to_vec())),
            )
            .route("/paper.pdf", get(|| typed("application/pdf", PDF.to_vec())))
            .route(
                "/notes.txt",
                get(|| typed("text/plain; charset=utf-8", "plain notes\nline 2\n".into())),
            )
            .route("/slow", get(slow))
            .route(
                "/missing",
                get(|| async { (StatusCode::NOT_FOUND, "<h1>Not here</h1>") }),
            )
            .route("/searx/search", get(searx))
            .route("/ddg/", any(ddg))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        state.port.store(addr.port(), Ordering::SeqCst);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeWeb { addr, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.addr.port())
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn hits(&self) -> Vec<(String, String)> {
        self.state.hits.lock().unwrap().clone()
    }

    pub fn set_captcha(&self, on: bool) {
        self.state.captcha.store(on, Ordering::SeqCst);
    }

    pub fn set_searx_empty(&self, on: bool) {
        self.state.searx_empty.store(on, Ordering::SeqCst);
    }
}

/// A minimal valid-looking PDF (the bytes are what matters: saved as they are).
pub const PDF: &[u8] = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n";

async fn typed(ct: &'static str, body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, ct)], body).into_response()
}

fn record(state: &WebState, path: &str, q: &str) {
    state
        .hits
        .lock()
        .unwrap()
        .push((path.to_string(), q.to_string()));
}

pub fn article_html(name: &str) -> String {
    format!(
        r#"<!doctype html><html><head><meta charset="utf-8"><title>Article {name}</title></head><body>
<nav><a href="/">Home</a> | <a href="/about">About us</a></nav>
<article><h1>Article {name}</h1>
<p>The {name} study measured rainfall in Kyoto over thirty years and found the wettest month to be
June, with the rainy season (tsuyu) bringing about 230 mm. See <a href="/article/{name}-data">the data
page</a> and <a href="details.html">details</a> for the method.</p>
<p>Temperatures peak in August. The authors compared the record with Osaka and Nara and found the
same pattern, with Kyoto a little cooler at night because of the surrounding mountains.</p>
<p>The report closes with advice for visitors: come in November for the autumn leaves, when it is
dry and mild, and book early because the temples are busiest then.</p></article>
<footer>Footer text © 2026</footer></body></html>"#
    )
}

async fn article(State(s): State<Arc<WebState>>, Path(name): Path<String>) -> Response {
    record(&s, &format!("/article/{name}"), "");
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        article_html(&name),
    )
        .into_response()
}

async fn redirect(Path(n): Path<u32>) -> Response {
    if n == 0 {
        return typed("text/plain", b"end of the chain".to_vec()).await;
    }
    (
        StatusCode::FOUND,
        [(header::LOCATION, format!("/redirect/{}", n - 1))],
    )
        .into_response()
}

async fn to(RawQuery(q): RawQuery) -> Response {
    let target = url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "target")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    (StatusCode::FOUND, [(header::LOCATION, target)]).into_response()
}

const BIG: usize = 50 * 1024 * 1024;

async fn big() -> Response {
    typed("text/plain", vec![b'a'; BIG]).await
}

async fn stream_big() -> Response {
    let chunk = bytes::Bytes::from(vec![b'b'; 64 * 1024]);
    let stream = futures::stream::iter(
        (0..BIG / chunk.len()).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
    );
    (
        [(header::CONTENT_TYPE, "text/html")],
        Body::from_stream(stream),
    )
        .into_response()
}

async fn slow() -> Response {
    tokio::time::sleep(Duration::from_secs(30)).await;
    typed("text/plain", b"late".to_vec()).await
}

async fn searx(State(s): State<Arc<WebState>>, RawQuery(q): RawQuery) -> Response {
    let q = q.unwrap_or_default();
    record(&s, "/searx/search", &q);
    let query = url::form_urlencoded::parse(q.as_bytes())
        .find(|(k, _)| k == "q")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if s.searx_empty.load(Ordering::SeqCst) {
        return axum::Json(json!({"query": query, "results": []})).into_response();
    }
    // Results point back at this server's articles, one twice (to be de-duplicated).
    let host = format!("http://127.0.0.1:{}", s.port.load(Ordering::SeqCst));
    let results = json!([
        {"url": format!("{host}/article/alpha"), "title": format!("Alpha about {query}"), "content": "Alpha snippet", "engine": "x"},
        {"url": format!("{host}/article/alpha#section"), "title": "Alpha again", "content": "dup", "engine": "y"},
        {"url": format!("{host}/article/beta"), "title": "Beta", "content": "Beta snippet", "engine": "x"},
        {"url": "javascript:alert(1)", "title": "bad", "content": "", "engine": "x"}
    ]);
    axum::Json(json!({"query": query, "results": results})).into_response()
}

async fn ddg(State(s): State<Arc<WebState>>, headers: HeaderMap, body: String) -> Response {
    record(&s, "/ddg/", &body);
    let _ = headers;
    if s.captcha.load(Ordering::SeqCst) {
        let page = r#"<html><body><div class="anomaly-modal__title">Unfortunately, bots use DuckDuckGo too.</div>
            <form id="challenge-form" action="//duckduckgo.com/anomaly.js?sv=html"></form></body></html>"#;
        return ([(header::CONTENT_TYPE, "text/html")], page).into_response();
    }
    let page = r#"<html><body><div id="links">
      <div class="result results_links web-result"><h2 class="result__title">
        <a class="result__a" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fddg-one.example%2Fpage&amp;rut=x">DDG one</a></h2>
        <a class="result__snippet">First DuckDuckGo result</a></div>
      <div class="result results_links web-result"><h2><a class="result__a" href="https://ddg-two.example/">DDG two</a></h2>
        <a class="result__snippet">Second</a></div></div></body></html>"#;
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}
