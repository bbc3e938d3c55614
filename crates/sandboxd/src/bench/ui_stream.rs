//! `sandboxd bench stream`'s web UI row: the time from a streaming model's first piece of
//! text to the run page showing it in its live box (the host's chromium, headless, signed
//! in to a real server on loopback), beside the same piece reaching a plain SSE client of
//! the same run, in the same run. All three instants are read on the host's wall clock:
//! the page's as `performance.timeOrigin` plus the `performance.now()` its delta handler
//! noted (`data-live-ms`, whole milliseconds).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::server::BenchServer;
use super::server_runs::SseReader;
use super::stream::{Model, streaming_server};
use super::ui::{Chromium, chromium, eval, wait_for};
use chromiumoxide::Page;
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::SessionManager;

/// Model → page and model → SSE client, one pair per run.
pub struct FirstTokenUi {
    pub page: Vec<Duration>,
    pub sse: Vec<Duration>,
}

/// `n` runs, one at a time in one session, each watched by the page and an SSE client.
pub async fn bench_first_token_ui(
    manager: Arc<SessionManager>,
    config: Config,
    chromium_path: &str,
    n: usize,
) -> anyhow::Result<FirstTokenUi> {
    let (server, model, responder) = streaming_server(manager, config).await?;
    let result = measure(&server, &model, chromium_path, n).await;
    server.stop().await;
    responder.abort();
    result
}

/// An `Instant` of this process as wall-clock ms since the epoch.
fn wall_ms(at: Instant) -> f64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (now.saturating_sub(at.elapsed())).as_secs_f64() * 1000.0
}

fn ms(d: f64) -> Duration {
    Duration::from_secs_f64(d.max(0.0) / 1000.0)
}

/// A page of `browser` signed in with `key`.
async fn signed_in(browser: &Chromium, base: &str, key: &str) -> anyhow::Result<Page> {
    let page = browser.browser.new_page(format!("{base}/login")).await?;
    eval(&page, &format!("document.querySelector('#key').value = {key:?}; document.querySelector('form').submit(); true")).await?;
    wait_for(
        &page,
        "location.pathname === '/runs'",
        Duration::from_secs(20),
    )
    .await?;
    Ok(page)
}

async fn measure(
    server: &BenchServer,
    model: &Model,
    chromium_path: &str,
    n: usize,
) -> anyhow::Result<FirstTokenUi> {
    let key = &server.keys[0];
    let session = server.session(key).await?;
    let browser = chromium(chromium_path).await?;
    let page = signed_in(&browser, &server.base, key).await?;
    let mut out = FirstTokenUi {
        page: Vec::with_capacity(n),
        sse: Vec::with_capacity(n),
    };
    for i in 0..n {
        let body =
            json!({"task": format!("bench first token in the page {i}"), "session_id": session});
        let id = super::ui::start_run(&server.http, &server.base, key, body).await?;
        let resp = server
            .http
            .get(format!("{}/v1/runs/{id}/events", server.base))
            .bearer_auth(key)
            .send()
            .await?
            .error_for_status()?;
        page.goto(format!("{}/runs/{id}", server.base)).await?;
        // The page follows (its stream is open, so subscribed to the deltas): the model may
        // answer.
        wait_for(
            &page,
            "document.querySelector('#live').textContent === 'live'",
            Duration::from_secs(20),
        )
        .await?;
        model.go.notify_one();
        let mut reader = SseReader::new(resp);
        let mut got = None;
        while let Some(e) = reader.next().await? {
            if got.is_none() && e.kind == "delta" {
                got = Some(wall_ms(e.at));
            }
        }
        wait_for(
            &page,
            "!!document.body.dataset.liveMs",
            Duration::from_secs(20),
        )
        .await?;
        let shown = eval(
            &page,
            "performance.timeOrigin + Number(document.body.dataset.liveMs)",
        )
        .await?
        .as_f64();
        let sent = model
            .sent
            .lock()
            .ok()
            .and_then(|mut s| s.take())
            .map(wall_ms);
        match (sent, got, shown) {
            (Some(sent), Some(got), Some(shown)) => {
                out.sse.push(ms(got - sent));
                out.page.push(ms(shown - sent));
            }
            _ => anyhow::bail!("run {id}: the delta reached no follower"),
        }
    }
    // Its container goes now: the server's stop keeps the sessions (they outlive a serve).
    server.delete_session(key, &session).await;
    Ok(out)
}
