//! The browser benchmark for `sandboxd bench`: the first action (Chromium start included),
//! go_to_url of a local page with the state, and a screenshot action.
//! Targets: first action ≤ 3 s, go_to_url p50 ≤ 300 ms, screenshot p50 ≤ 200 ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::bench::stats::percentile;
use sandboxd_core::sandbox::Sandbox;
use sandboxd_core::tools::browser::BrowserUse;
use sandboxd_core::tools::{Tool, ToolContext};

const PAGE: &str = "<!doctype html><html><head><title>bench</title></head><body>\
    <h1>Benchmark page</h1><p>Some text.</p><a href='#a'>a link</a><button>a button</button>\
    <input placeholder='an input'><select><option>one</option><option>two</option></select>\
    <div style='height:3000px;background:linear-gradient(#fff,#00f)'></div></body></html>";

/// Timings of one run; the lists are sorted.
#[derive(Debug, Clone)]
pub struct BrowserBench {
    pub first_action: Duration,
    pub go_to_url: Vec<Duration>,
    pub screenshot: Vec<Duration>,
}

impl BrowserBench {
    /// Markdown table rows: what, p50, p95, target.
    pub fn table(&self) -> String {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
        let mut s = String::from("| browser | p50 | p95 | target |\n|---|---|---|---|\n");
        s.push_str(&format!(
            "| first action (Chromium start + go_to_url + state) | {} | — | ≤ 3 s |\n",
            ms(self.first_action)
        ));
        s.push_str(&format!(
            "| go_to_url of a local page, with state and screenshot (n={}) | {} | {} | p50 ≤ 300 ms |\n",
            self.go_to_url.len(),
            ms(percentile(&self.go_to_url, 0.5)),
            ms(percentile(&self.go_to_url, 0.95))
        ));
        s.push_str(&format!(
            "| screenshot action, with state (n={}) | {} | {} | p50 ≤ 200 ms |\n",
            self.screenshot.len(),
            ms(percentile(&self.screenshot, 0.5)),
            ms(percentile(&self.screenshot, 0.95))
        ));
        s
    }
}

/// Runs the benchmark in `sandbox` with a fresh browser, `n` samples per measurement.
pub async fn bench_browser(sandbox: Arc<dyn Sandbox>, n: usize) -> Result<BrowserBench, String> {
    sandbox
        .write_file("/workspace/.sandboxd-bench/index.html", PAGE.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let tool = BrowserUse::new(sandbox.clone());
    let ctx = ToolContext::default();
    let url = "file:///workspace/.sandboxd-bench/index.html";
    let call = |args: serde_json::Value| {
        let tool = &tool;
        let ctx = &ctx;
        async move {
            let started = Instant::now();
            let result = tool.execute(args, ctx).await.map_err(|e| e.to_string())?;
            if let Some(e) = result.error {
                return Err(e);
            }
            Ok(started.elapsed())
        }
    };
    let outcome = async {
        let first_action = call(json!({"action": "go_to_url", "url": url})).await?;
        let mut go_to_url = Vec::with_capacity(n);
        for i in 0..n {
            go_to_url
                .push(call(json!({"action": "go_to_url", "url": format!("{url}?{i}")})).await?);
        }
        let mut screenshot = Vec::with_capacity(n);
        for _ in 0..n {
            screenshot.push(call(json!({"action": "screenshot"})).await?);
        }
        go_to_url.sort();
        screenshot.sort();
        Ok(BrowserBench {
            first_action,
            go_to_url,
            screenshot,
        })
    }
    .await;
    tool.shutdown().await;
    let _ = sandbox.remove("/workspace/.sandboxd-bench", true).await;
    outcome
}
