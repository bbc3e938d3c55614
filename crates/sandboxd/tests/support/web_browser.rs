//! A real browser for the web UI's tests: Debian's `chromium` on the host, headless, with a
//! fresh profile, driven over CDP by chromiumoxide. The harness starts the process itself
//! (`--remote-debugging-port=0`, the DevTools URL read from its stderr), so it works with
//! chromiumoxide's default features off. Dropping the `WebBrowser` kills chromium.
//!
//! Page helpers: `goto`, `eval` (JSON back), `wait_for` (a JS condition, polled), `click`,
//! `type_into`, `screenshot` (PNG into target/ui-artifacts/).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chromiumoxide::Browser;
use chromiumoxide::Page;
use chromiumoxide::cdp::browser_protocol::emulation::SetDeviceMetricsOverrideParams;
use chromiumoxide::cdp::browser_protocol::page::CaptureScreenshotFormat;
use chromiumoxide::handler::HandlerConfig;
use chromiumoxide::page::ScreenshotParams;
use futures::StreamExt;
use serde_json::Value;

/// The chromium binary: SANDBOXD_TEST_CHROMIUM, else Debian's.
pub fn chromium_path() -> String {
    std::env::var("SANDBOXD_TEST_CHROMIUM").unwrap_or_else(|_| {
        for p in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
            if std::path::Path::new(p).exists() {
                return p.to_string();
            }
        }
        panic!("these tests need Debian's chromium on the host: apt-get install chromium (scripts/host-deps.sh does)")
    })
}

pub struct WebBrowser {
    child: Child,
    pub browser: Browser,
    handler: tokio::task::JoinHandle<()>,
    _profile: tempfile::TempDir,
}

impl WebBrowser {
    pub async fn start() -> WebBrowser {
        Self::start_with(&[]).await
    }

    /// With no network at all: every request goes to a proxy that is not there, so only
    /// file:// pages and what they embed can load.
    pub async fn start_offline() -> WebBrowser {
        Self::start_with(&[
            "--proxy-server=http://127.0.0.1:9",
            "--proxy-bypass-list=<-loopback>",
        ])
        .await
    }

    async fn start_with(extra: &[&str]) -> WebBrowser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(chromium_path())
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .args(extra)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split("DevTools listening on ").nth(1) {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let ws = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium printed no DevTools URL");
        let config = HandlerConfig {
            viewport: None,
            ..HandlerConfig::default()
        };
        let (browser, mut handler) = Browser::connect_with_config(ws, config).await.unwrap();
        let handler = tokio::spawn(async move { while handler.next().await.is_some() {} });
        WebBrowser {
            child,
            browser,
            handler,
            _profile: profile,
        }
    }

    pub async fn page(&self) -> Page {
        let page = self.browser.new_page("about:blank").await.unwrap();
        set_width(&page, 1280, 900).await;
        page
    }
}

impl Drop for WebBrowser {
    fn drop(&mut self) {
        self.handler.abort();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn set_width(page: &Page, width: i64, height: i64) {
    page.execute(
        SetDeviceMetricsOverrideParams::builder()
            .width(width)
            .height(height)
            .device_scale_factor(1.0)
            .mobile(width < 600)
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
}

pub async fn goto(page: &Page, url: &str) {
    page.goto(url).await.unwrap();
    let _ = page.wait_for_navigation().await;
}

/// Evaluates a JS expression (awaiting a promise) and returns its JSON value.
pub async fn eval(page: &Page, js: &str) -> Value {
    let r = page
        .evaluate(js)
        .await
        .unwrap_or_else(|e| panic!("eval {js}: {e}"));
    r.value().cloned().unwrap_or(Value::Null)
}

/// Polls a JS condition until it is truthy; panics with `what` and the page's text after
/// `limit`.
pub async fn wait_for(page: &Page, js: &str, limit: Duration, what: &str) {
    let start = Instant::now();
    loop {
        if let Ok(r) = page.evaluate(js).await
            && r.value()
                .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        {
            return;
        }
        if start.elapsed() > limit {
            let text = eval(
                page,
                "document.body ? document.body.innerText + ' | last message: ' + ((document.querySelector('#toast') || {}).textContent || '') : ''",
            )
            .await;
            panic!("{what}: not within {limit:?}; the page shows: {text}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub async fn click(page: &Page, selector: &str) {
    act(page, selector, None).await
}

/// Types into a field, focused by the DOM (a click could land elsewhere while the page is
/// still growing above it).
pub async fn type_into(page: &Page, selector: &str, text: &str) {
    act(page, selector, Some(text)).await
}

/// Clicks or types, retried briefly: right after a navigation CDP may still hand out nodes
/// of the document being replaced ("Could not find node with given id"), and an element
/// may not be shown yet.
async fn act(page: &Page, selector: &str, text: Option<&str>) {
    let mut last = String::new();
    // Bounded by time, not tries: on a loaded machine a page's script can take seconds to
    // enable what it handles.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        let done = match page.find_element(selector).await {
            Ok(el) => match text {
                None => dom_click(&el).await,
                Some(t) => match el.focus().await {
                    Ok(el) => el.type_str(t).await.map(|_| ()).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
            },
            Err(e) => Err(e.to_string()),
        };
        match done {
            Ok(()) => return,
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{selector}: {last}");
}

/// Where the tests keep their screenshots: target/ui-artifacts/.
pub fn artifacts_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/ui-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A full-page PNG screenshot saved as target/ui-artifacts/<name>.png; returns its path.
pub async fn screenshot(page: &Page, name: &str) -> PathBuf {
    let path = artifacts_dir().join(format!("{name}.png"));
    let bytes = page
        .screenshot(
            ScreenshotParams::builder()
                .format(CaptureScreenshotFormat::Png)
                .full_page(true)
                .build(),
        )
        .await
        .unwrap();
    std::fs::write(&path, &bytes).unwrap();
    path
}

/// Clicks a shown, enabled element through the DOM, checked and clicked in one turn of the
/// page's event loop. A mouse click lands where the element was when its box was measured,
/// a round trip earlier: on a run's page the timeline keeps growing above the answer box
/// while events arrive, and such a click can miss the button (seen under load).
async fn dom_click(el: &chromiumoxide::Element) -> Result<(), String> {
    let clicked = el
        .call_js_fn(
            "function() { if (this.disabled || !this.checkVisibility()) return false; this.click(); return true; }",
            false,
        )
        .await
        .map_err(|e| e.to_string())?;
    match clicked.result.value {
        Some(Value::Bool(true)) => Ok(()),
        _ => Err("the element is hidden or disabled".to_string()),
    }
}
