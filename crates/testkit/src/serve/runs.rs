//! The runs API's test plumbing, shared by the `serve_runs*` tests: the fake LLM's config
//! section, a run's SSE events read and parsed (to the end, a count, or an event of a kind),
//! starting and reading runs, and the checks that events are numbered 1..n in order.

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use super::Api;
use crate::fake_llm::FakeLlm;

pub fn llm_config(llm: &FakeLlm) -> String {
    format!(
        "[llm]\nbase_url = {:?}\nmodel = \"fake-model\"\napi_key = \"sk-fake\"\nmax_retries = 1\n",
        llm.base_url()
    )
}

pub const SERVER: &str = "[server]\ndrain_secs = 2\nbody_limit_kb = 64\nupload_limit_mb = 4\nauth_failures_per_minute = 10000\n";

/// One SSE event as received.
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    pub id: u64,
    pub event: String,
    pub data: Value,
}

/// Reads SSE events from a response until it ends or `stop_after` events came.
pub async fn read_sse(resp: reqwest::Response, stop_after: Option<usize>) -> Vec<Sse> {
    let mut resp = resp;
    read_sse_on(&mut resp, &mut String::new(), stop_after).await
}

/// `read_sse` on a stream that stays open: `buf` keeps what was read past the last event.
pub async fn read_sse_on(
    resp: &mut reqwest::Response,
    buf: &mut String,
    stop_after: Option<usize>,
) -> Vec<Sse> {
    let mut out = Vec::new();
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse().ok();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if let Some(id) = id {
                out.push(Sse {
                    id,
                    event,
                    data: serde_json::from_str(&data).unwrap(),
                });
                if stop_after == Some(out.len()) {
                    return out;
                }
            }
        }
        match tokio::time::timeout(Duration::from_secs(120), resp.chunk()).await {
            Ok(Ok(Some(c))) => buf.push_str(&String::from_utf8_lossy(&c)),
            Ok(Ok(None)) => return out,
            Ok(Err(e)) => panic!("stream failed: {e}"),
            Err(_) => panic!("no event within 120 s; got {out:?}"),
        }
    }
}

pub async fn events(
    api: &Api,
    run: &str,
    query: &str,
    last_event_id: Option<u64>,
) -> reqwest::Response {
    let mut r = api.req(Method::GET, &format!("/v1/runs/{run}/events{query}"));
    if let Some(n) = last_event_id {
        r = r.header("Last-Event-ID", n.to_string());
    }
    let resp = r.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    resp
}

/// Follows the run to its end and returns every event.
pub async fn follow_all(api: &Api, run: &str) -> Vec<Sse> {
    read_sse(events(api, run, "", None).await, None).await
}

/// Follows the run until an event of type `kind` and returns the events so far.
pub async fn until(api: &Api, run: &str, kind: &str) -> Vec<Sse> {
    until_with(api, run, kind, "").await
}

/// Follows the run until an event of type `kind` whose JSON contains `needle`.
pub async fn until_with(api: &Api, run: &str, kind: &str, needle: &str) -> Vec<Sse> {
    let resp = events(api, run, "", None).await;
    let mut resp = resp;
    let mut got = Vec::new();
    let mut buf = String::new();
    loop {
        let c = tokio::time::timeout(Duration::from_secs(120), resp.chunk())
            .await
            .expect("an event in time")
            .unwrap()
            .unwrap_or_else(|| panic!("the stream ended before {kind}: {got:?}"));
        buf.push_str(&String::from_utf8_lossy(&c));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            // Only the run's events (with an id), not the live `delta`s of its text.
            let stored = block.lines().any(|l| l.starts_with("id: "));
            if let Some(data) = block
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .filter(|_| stored)
            {
                let v: Value = serde_json::from_str(data).unwrap();
                let t = v["type"].as_str().unwrap().to_string();
                got.push(v);
                if t == kind && data.contains(needle) {
                    return got
                        .into_iter()
                        .map(|d| Sse {
                            id: d["seq"].as_u64().unwrap(),
                            event: d["type"].as_str().unwrap().into(),
                            data: d,
                        })
                        .collect();
                }
            }
        }
    }
}

pub async fn start_run(api: &Api, body: Value) -> Value {
    let (s, v) = api.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(s, 201, "start run: {v}");
    v
}

pub async fn get_run(api: &Api, run: &str) -> Value {
    let (s, v) = api
        .json(Method::GET, &format!("/v1/runs/{run}"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    v
}

/// The run once it has ended (polled, at most 30 s). A run whose serve was killed ends once
/// another replica, or the next start, finds that serve's lease run out (`[server] lease_secs`
/// and a half), not at once.
pub async fn ended_run(api: &Api, run: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = get_run(api, run).await;
        let state = v["state"].as_str().unwrap_or_default();
        if !["queued", "running", "waiting_for_human"].contains(&state) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run has not ended: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn kinds(evs: &[Sse]) -> Vec<String> {
    evs.iter().map(|e| e.event.clone()).collect()
}

pub fn assert_numbered(evs: &[Sse], from: u64) {
    let ids: Vec<u64> = evs.iter().map(|e| e.id).collect();
    let want: Vec<u64> = (from..from + evs.len() as u64).collect();
    assert_eq!(ids, want, "ids are consecutive from {from}");
    for e in evs {
        assert_eq!(e.data["seq"].as_u64(), Some(e.id));
        assert_eq!(e.data["type"].as_str(), Some(e.event.as_str()));
    }
}
