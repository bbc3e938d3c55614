//! `sandboxd bench ui`: the web UI in a real browser (the host's chromium, headless) against
//! an in-process `serve` on loopback whose model is a local responder that always calls
//! bash `true`. Two measurements, each beside a baseline taken in the same run:
//! - first paint of a finished 200-step run: from navigation to the whole timeline drawn,
//!   beside fetching the same events as raw SSE (`?follow=false`) over HTTP;
//! - event to page: from an event's `at` (when the agent emitted it) to its element in the
//!   page, beside the same events reaching a plain SSE client.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use chromiumoxide::{Browser, Page};
use futures::StreamExt;
use serde_json::{Value, json};

use sandboxd_core::config::Config;
use sandboxd_core::sandbox::SessionManager;
use sandboxd_core::store::{NewUser, Store};
use sandboxd_server::Server;
use sandboxd_sqlite::SqliteStore;

/// The samples of both measurements and their baselines.
pub struct UiBench {
    pub first_paint: Vec<Duration>,
    pub raw_replay: Vec<Duration>,
    pub event_to_page: Vec<Duration>,
    pub event_to_sse: Vec<Duration>,
    pub steps: u64,
}

/// The responder's delay before each answer, in ms (0 for the 200-step run).
type Delay = Arc<std::sync::atomic::AtomicU64>;

async fn answer(State(delay): State<Delay>, Json(_b): Json<Value>) -> Json<Value> {
    let ms = delay.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Json(json!({
        "id": "ui-bench", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
            "content": "Running `true` **again**.",
            "tool_calls": [{"id": format!("call_{}", uuid::Uuid::new_v4().simple()), "type": "function",
                "function": {"name": "bash", "arguments": "{\"command\":\"printf '\\\\033[32mok\\\\033[0m\\\\n'\"}"}}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    }))
}

async fn responder(delay: Delay) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state(delay);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}/v1"))
}

/// The host's chromium, headless, and the driver connected to it.
pub(super) struct Chromium {
    child: std::process::Child,
    pub(super) browser: Browser,
    _profile: tempfile::TempDir,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) async fn chromium(path: &str) -> anyhow::Result<Chromium> {
    use std::io::BufRead as _;
    let profile = tempfile::tempdir()?;
    let mut child = std::process::Command::new(path)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stderr"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(url) = line.split("DevTools listening on ").nth(1) {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let ws = rx.recv_timeout(Duration::from_secs(30))?;
    let (browser, mut handler) = Browser::connect(ws).await?;
    tokio::spawn(async move { while handler.next().await.is_some() {} });
    Ok(Chromium {
        child,
        browser,
        _profile: profile,
    })
}

pub(super) async fn eval(page: &Page, js: &str) -> anyhow::Result<Value> {
    Ok(page
        .evaluate(js)
        .await?
        .value()
        .cloned()
        .unwrap_or(Value::Null))
}

pub(super) async fn wait_for(page: &Page, js: &str, limit: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(v) = eval(page, js).await
            && v == Value::Bool(true)
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    anyhow::bail!("the page did not reach `{js}` within {limit:?}")
}

/// Wall-clock ms of an event's `at`.
fn at_ms(ev: &Value) -> Option<i64> {
    let at = ev.get("at")?.as_str()?;
    Some(
        chrono::DateTime::parse_from_rfc3339(at)
            .ok()?
            .timestamp_millis(),
    )
}

pub async fn bench_ui(
    manager: Arc<SessionManager>,
    mut config: Config,
    chromium_path: &str,
    n: usize,
) -> anyhow::Result<UiBench> {
    let dir = std::env::temp_dir().join(format!(
        "sandboxd-uibench-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)?;
    config.data_dir = Some(dir.clone());
    let delay = Delay::default();
    config.llm.base_url = responder(delay.clone()).await?;
    config.llm.model = "bench".into();
    config.llm.api_key = "bench".into();
    let store = SqliteStore::open(&dir.join("sandboxd.db")).await?;
    let (key, stored) = sandboxd_server::auth::new_key(None);
    store
        .add_user(NewUser {
            name: "bench".into(),
            admin: false,
            key: stored,
            quota: Default::default(),
        })
        .await?;
    let server = Server::start(config, Arc::new(store), manager, "127.0.0.1:0".parse()?).await?;
    let base = format!("http://{}", server.addr);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(async move {
        let _ = stop_rx.await;
    }));
    let http = reqwest::Client::new();
    let out = measure(&http, &base, &key, chromium_path, &delay, n).await;
    let _ = stop_tx.send(());
    let _ = serving.await;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// POST /v1/runs; the run's id.
pub async fn start_run(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    body: Value,
) -> anyhow::Result<String> {
    let run: Value = http
        .post(format!("{base}/v1/runs"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(run["id"].as_str().unwrap_or_default().to_string())
}

/// The events of a run as SSE, split into their JSON.
fn sse_events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

async fn measure(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    chromium_path: &str,
    delay: &Delay,
    n: usize,
) -> anyhow::Result<UiBench> {
    let finished = finished_run(http, base, key).await?;

    let browser = chromium(chromium_path).await?;
    let page = browser.browser.new_page(format!("{base}/login")).await?;
    eval(&page, &format!("document.querySelector('#key').value = {key:?}; document.querySelector('form').submit(); true")).await?;
    wait_for(
        &page,
        "location.pathname === '/runs'",
        Duration::from_secs(20),
    )
    .await?;

    let mut out = UiBench {
        first_paint: Vec::new(),
        raw_replay: Vec::new(),
        event_to_page: Vec::new(),
        event_to_sse: Vec::new(),
        steps: finished.steps,
    };
    for i in 0..n + 1 {
        let (paint, raw) = first_paint(http, base, key, &page, &finished).await?;
        if i > 0 {
            out.first_paint.push(paint);
            out.raw_replay.push(raw);
        }
    }
    live(http, base, key, &page, delay, &mut out).await?;
    Ok(out)
}

/// The finished 200-step run the first-paint measurement shows.
struct FinishedRun {
    id: String,
    events_url: String,
    /// Its last event: the page is drawn when it has rendered this one.
    last_seq: u64,
    steps: u64,
}

async fn finished_run(
    http: &reqwest::Client,
    base: &str,
    key: &str,
) -> anyhow::Result<FinishedRun> {
    let id = start_run(
        http,
        base,
        key,
        json!({"task": "200 steps of bash", "max_steps": 200}),
    )
    .await?;
    let events_url = format!("{base}/v1/runs/{id}/events");
    // The stream ends once the run has ended and every event was sent.
    let all = http
        .get(&events_url)
        .bearer_auth(key)
        .send()
        .await?
        .text()
        .await?;
    let events = sse_events(&all);
    let last_seq = events.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
    let run: Value = http
        .get(format!("{base}/v1/runs/{id}"))
        .bearer_auth(key)
        .send()
        .await?
        .json()
        .await?;
    let steps = run["steps"].as_u64().unwrap_or(0);
    Ok(FinishedRun {
        id,
        events_url,
        last_seq,
        steps,
    })
}

/// One sample: the page's own time to draw the whole finished run, and beside it the time
/// to fetch the same events as raw SSE.
async fn first_paint(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    page: &Page,
    run: &FinishedRun,
) -> anyhow::Result<(Duration, Duration)> {
    page.goto(format!("{base}/runs/{}", run.id)).await?;
    wait_for(
        page,
        &format!("document.body.dataset.rendered === '{}'", run.last_seq),
        Duration::from_secs(30),
    )
    .await?;
    let ms = eval(page, "Number(document.body.dataset.renderedMs)")
        .await?
        .as_f64()
        .unwrap_or(f64::NAN);
    let t = Instant::now();
    let _ = http
        .get(format!("{}?follow=false", run.events_url))
        .bearer_auth(key)
        .send()
        .await?
        .bytes()
        .await?;
    let raw = t.elapsed();
    Ok((Duration::from_secs_f64(ms / 1000.0), raw))
}

/// Live: a run whose model answers after 150 ms, watched by the page and a plain SSE client;
/// each event's delay to both goes into `out`.
async fn live(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    page: &Page,
    delay: &Delay,
    out: &mut UiBench,
) -> anyhow::Result<()> {
    page.evaluate_on_new_document(
        "window.__shown = {}; new MutationObserver((ms) => { for (const m of ms) for (const n of m.addedNodes) { if (n.nodeType === 1) for (const e of [n, ...n.querySelectorAll('[data-seq]')]) if (e.dataset && e.dataset.seq && !(e.dataset.seq in window.__shown)) window.__shown[e.dataset.seq] = Date.now(); } }).observe(document, {childList: true, subtree: true});",
    )
    .await?;
    delay.store(150, std::sync::atomic::Ordering::Relaxed);
    let id = start_run(
        http,
        base,
        key,
        json!({"task": "watch me live", "max_steps": 30}),
    )
    .await?;
    let sse = follow_sse(http, format!("{base}/v1/runs/{id}/events"), key);
    page.goto(format!("{base}/runs/{id}")).await?;
    let got = sse.await?;
    let last = got.last().and_then(|(e, _)| e["seq"].as_u64()).unwrap_or(0);
    wait_for(
        page,
        &format!("document.body.dataset.rendered === '{last}'"),
        Duration::from_secs(30),
    )
    .await?;
    let shown = eval(page, "window.__shown").await?;
    // Events emitted before the page was following are replays, not live: skip the first 3.
    for (ev, received) in got.iter().skip(3) {
        let (Some(seq), Some(at)) = (ev["seq"].as_u64(), at_ms(ev)) else {
            continue;
        };
        out.event_to_sse
            .push(Duration::from_millis((received - at).max(0) as u64));
        if let Some(t) = shown.get(seq.to_string()).and_then(Value::as_i64) {
            out.event_to_page
                .push(Duration::from_millis((t - at).max(0) as u64));
        }
    }
    Ok(())
}

/// A plain SSE client on `sse_url`: each event with the time (ms) it arrived, until the
/// stream ends.
fn follow_sse(
    http: &reqwest::Client,
    sse_url: String,
    key: &str,
) -> tokio::task::JoinHandle<Vec<(Value, i64)>> {
    let http = http.clone();
    let key = key.to_string();
    tokio::spawn(async move {
        let mut got: Vec<(Value, i64)> = Vec::new();
        let Ok(mut resp) = http.get(&sse_url).bearer_auth(&key).send().await else {
            return got;
        };
        let mut buf = String::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            let now = chrono::Utc::now().timestamp_millis();
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let frame: String = buf.drain(..end + 2).collect();
                for ev in sse_events(&frame) {
                    got.push((ev, now));
                }
            }
        }
        got
    })
}
