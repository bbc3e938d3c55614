//! `sandboxd bench metrics`: what one `/metrics` scrape costs with the registry as 1,000
//! sessions' activity leaves it, in process (the scrape's own work: the census, the encoding;
//! its HTTP is any route's). The activity: 1,000 creates (half warm), three execs and a call
//! of each built-in tool per session, runs of every outcome, LLM requests, egress records,
//! and a request of every route of the API document under eight statuses (the label sets a
//! long-lived replica accumulates). The census says 1,000 live sessions. The scrape reads
//! the manager's counts, never each session, so its cost follows the label sets, not the
//! sessions.

use std::time::{Duration, Instant};

use sandboxd_core::metrics::{Census, Claim, LlmCall, Recorder};
use sandboxd_server::metrics::Metrics;

use crate::bench::stats::percentile;

/// The sample: sorted scrape times, the body's bytes and its samples (non-comment lines).
pub struct Scrape {
    pub times: Vec<Duration>,
    pub bytes: usize,
    pub samples: usize,
}

const TOOLS: [&str; 9] = [
    "bash",
    "python_execute",
    "str_replace_editor",
    "browser_use",
    "web_search",
    "web_fetch",
    "planning",
    "terminate",
    "mcp",
];

fn routes() -> Vec<(&'static str, String)> {
    let doc: serde_json::Value =
        serde_json::from_str(&sandboxd_server::openapi::document_json()).unwrap_or_default();
    let mut out = Vec::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, ops) in paths {
            for (method, m) in [
                ("get", "GET"),
                ("post", "POST"),
                ("put", "PUT"),
                ("delete", "DELETE"),
            ] {
                if ops.get(method).is_some() {
                    out.push((m, path.clone()));
                }
            }
        }
    }
    out
}

fn fill(m: &Metrics, sessions: usize) {
    let ms = Duration::from_millis;
    for i in 0..sessions {
        let claim = if i % 2 == 0 { Claim::Warm } else { Claim::Cold };
        m.session_created(claim, ms(40 + (i % 700) as u64));
        for _ in 0..3 {
            m.exec(ms(2 + (i % 50) as u64));
        }
        for t in TOOLS {
            m.tool_call(t, ms((i % 900) as u64), i % 17 == 0);
        }
        m.run_ended(["succeeded", "failed", "cancelled", "interrupted"][i % 4]);
        m.llm_request(LlmCall {
            model: "gpt-4o",
            took: ms(800),
            ok: i % 23 != 0,
            prompt_tokens: 1500,
            completion_tokens: 200,
        });
        m.egress(i % 5 != 0, 4096, 65536);
        m.store_call("user_by_key", ms(1));
    }
    for (method, route) in routes() {
        for status in [200, 201, 204, 400, 401, 404, 409, 429] {
            m.http(method, route.clone(), status, ms(3));
        }
    }
}

/// `iterations` scrapes of a registry filled as by `sessions` sessions.
pub fn scrape(sessions: usize, iterations: usize) -> Scrape {
    let m = Metrics::new("docker", 4);
    fill(&m, sessions);
    let census = Census {
        live: sessions,
        starting: 0,
        warm: 4,
        filling: 0,
    };
    let mut times = Vec::with_capacity(iterations);
    let mut body = String::new();
    for _ in 0..iterations.max(1) {
        let t = Instant::now();
        body = m.render(census, false).unwrap_or_default();
        times.push(t.elapsed());
    }
    times.sort();
    let samples = body.lines().filter(|l| !l.starts_with('#')).count();
    Scrape {
        times,
        bytes: body.len(),
        samples,
    }
}

/// The Markdown rows for BENCHMARKS.md.
pub fn report(sessions: usize, iterations: usize) -> String {
    let s = scrape(sessions, iterations);
    let at = |q: f64| percentile(&s.times, q).as_secs_f64() * 1e3;
    format!(
        "| `/metrics` scrape, {sessions} sessions' activity ({} samples, {} KiB) | {:.2} | {:.2} |",
        s.samples,
        s.bytes / 1024,
        at(0.5),
        at(0.99)
    )
}
