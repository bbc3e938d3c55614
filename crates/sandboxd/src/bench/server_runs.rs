//! The runs benchmarks of `sandboxd bench serve`, through the runs API (POST /v1/runs, GET
//! /v1/runs/{id}/events as SSE) of a real server on loopback, with a fake OpenAI-compatible
//! model on loopback that answers at once. The model scripts each run from its task: "bench
//! steps=K" gets K-1 bash calls, then terminate.
//! - event latency: an event's `at` stamp (made when the agent emits it, before the store
//!   commits it and the stream sends it) against the moment the SSE client parsed it; and,
//!   finer than `at`'s milliseconds, the fake model handing over its answer against the
//!   client receiving the `token_usage` event the agent emits right after reading it.
//! - load: 20 users, each starting a 5-step run at once; every run must succeed. Step
//!   latency is the time between one step's `thinking` event and the next (the last: to
//!   `run_finished`) as the client receives them; events/s is what the store committed and
//!   streamed per second over the whole load.
//!
//! Every run's first model request waits until its client follows the event stream, so no
//! measured event is a replay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::server::BenchServer;
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::SessionManager;

/// The fake model: answers by the script in the task, records when it answered.
#[derive(Default)]
struct Model {
    /// Per run tag: released once its client follows the events.
    gates: Mutex<HashMap<String, Arc<Notify>>>,
    /// Per run tag: when each answer was handed over.
    answered: Mutex<HashMap<String, Vec<Instant>>>,
}

impl Model {
    fn gate(&self, tag: &str) -> Arc<Notify> {
        let mut g = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        g.entry(tag.to_string()).or_default().clone()
    }
}

/// The tag and step count of a run, from its task ("bench <tag> steps=<K>"), and the tool
/// results since the task (earlier runs of the session do not count).
fn script(body: &Value) -> (String, usize, usize) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let last_user = messages
        .iter()
        .rposition(|m| m["role"] == "user" && m_text(m).contains("bench "))
        .unwrap_or(0);
    let task = messages.get(last_user).map(m_text).unwrap_or_default();
    let mut tag = String::new();
    let mut steps = 5;
    for word in task.split_whitespace() {
        if let Some(k) = word.strip_prefix("steps=") {
            steps = k.parse().unwrap_or(5);
        } else if let Some(t) = word.strip_prefix("tag=") {
            tag = t.to_string();
        }
    }
    let results = messages
        .iter()
        .skip(last_user)
        .filter(|m| m["role"] == "tool")
        .count();
    (tag, steps.max(1), results)
}

fn m_text(m: &Value) -> String {
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

async fn answer(State(model): State<Arc<Model>>, Json(body): Json<Value>) -> Json<Value> {
    let (tag, steps, done) = script(&body);
    if done == 0 {
        model.gate(&tag).notified().await;
    }
    let (name, args) = if done + 1 < steps {
        ("bash", json!({"command": "true"}).to_string())
    } else {
        ("terminate", json!({"status": "success"}).to_string())
    };
    let reply = Json(json!({
        "id": format!("bench-{tag}-{done}"), "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": format!("call_{done}"), "type": "function",
                "function": {"name": name, "arguments": args}}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    }));
    if let Ok(mut a) = model.answered.lock() {
        a.entry(tag).or_default().push(Instant::now());
    }
    reply
}

/// The fake model on a loopback port; aborted on drop.
struct FakeModel {
    model: Arc<Model>,
    base_url: String,
    server: tokio::task::JoinHandle<()>,
}

impl FakeModel {
    async fn start() -> anyhow::Result<FakeModel> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let model = Arc::new(Model::default());
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(model.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeModel {
            model,
            base_url: format!("http://{addr}/v1"),
            server,
        })
    }

    /// The server's config with this model as its LLM.
    fn config(&self, mut config: Config) -> Config {
        config.llm.base_url = self.base_url.clone();
        config.llm.api_key = "bench".into();
        config.llm.model = "bench".into();
        config.llm.api_type = "openai".into();
        config.llm.max_retries = 0;
        config
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// One event as the client received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    pub wall: SystemTime,
    pub kind: String,
    pub data: Value,
}

/// Reads an SSE response event by event (comment lines skipped).
pub struct SseReader {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            buf: Vec::new(),
        }
    }

    pub async fn next(&mut self) -> anyhow::Result<Option<Received>> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let (at, wall) = (Instant::now(), SystemTime::now());
                let text = String::from_utf8_lossy(&block);
                let mut kind = String::from("message");
                let mut data = Vec::new();
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        kind = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data.join("\n"))?;
                return Ok(Some(Received {
                    at,
                    wall,
                    kind,
                    data,
                }));
            }
            match self.resp.chunk().await? {
                Some(b) => self.buf.extend_from_slice(&b),
                None => return Ok(None),
            }
        }
    }
}

/// One run through the API: started, followed to its end; its events as received.
struct RunTrace {
    id: String,
    session_id: String,
    started: Instant,
    events: Vec<Received>,
}

/// Starts a run for `key` and follows its events to the end; the model's first answer
/// waits until the stream is open.
async fn traced_run(
    server: &BenchServer,
    model: &Model,
    key: &str,
    tag: &str,
    steps: usize,
    session_id: Option<&str>,
) -> anyhow::Result<RunTrace> {
    let mut body =
        json!({"task": format!("bench tag={tag} steps={steps}"), "max_steps": steps + 1});
    if let Some(s) = session_id {
        body["session_id"] = json!(s);
    }
    let started = Instant::now();
    let r = server
        .http
        .post(format!("{}/v1/runs", server.base))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(
        r.status().as_u16() == 201,
        "POST /v1/runs answered {}: {}",
        r.status(),
        r.text().await.unwrap_or_default()
    );
    let run: Value = r.json().await?;
    let id = run["id"].as_str().unwrap_or_default().to_string();
    let session_id = run["session_id"].as_str().unwrap_or_default().to_string();
    let resp = server
        .http
        .get(format!("{}/v1/runs/{id}/events", server.base))
        .bearer_auth(key)
        .send()
        .await?
        .error_for_status()?;
    model.gate(tag).notify_one();
    let mut reader = SseReader::new(resp);
    let mut events = Vec::new();
    // To the stream's end: it ends once the run is in a terminal state and all is sent.
    while let Some(e) = reader.next().await? {
        events.push(e);
    }
    Ok(RunTrace {
        id,
        session_id,
        started,
        events,
    })
}

/// Event latency samples: by `at` (every live event; ms resolution, so up to 1 ms high) and
/// by the model's answer against `token_usage` (µs resolution; includes the answer's trip).
pub struct EventLatency {
    pub by_stamp: Vec<Duration>,
    pub by_answer: Vec<Duration>,
}

pub async fn bench_event_latency(
    manager: Arc<SessionManager>,
    config: Config,
    samples: usize,
) -> anyhow::Result<EventLatency> {
    let model = FakeModel::start().await?;
    let server = BenchServer::start(manager, model.config(config), 1).await?;
    let result = latency_runs(&server, &model.model, samples).await;
    server.stop().await;
    result
}

async fn latency_runs(
    server: &BenchServer,
    model: &Model,
    samples: usize,
) -> anyhow::Result<EventLatency> {
    let key = server.keys[0].clone();
    let steps = 20;
    let mut out = EventLatency {
        by_stamp: Vec::new(),
        by_answer: Vec::new(),
    };
    let mut session: Option<String> = None;
    let mut n = 0;
    while out.by_answer.len() < samples {
        let tag = format!("lat{n}");
        n += 1;
        let trace = traced_run(server, model, &key, &tag, steps, session.as_deref()).await?;
        session = Some(trace.session_id.clone());
        for e in &trace.events {
            if let Some(at) = e.data["at"].as_str().and_then(parse_rfc3339) {
                out.by_stamp
                    .push(e.wall.duration_since(at).unwrap_or(Duration::ZERO));
            }
        }
        let answers = model
            .answered
            .lock()
            .map(|a| a.get(&tag).cloned().unwrap_or_default())
            .unwrap_or_default();
        let usage: Vec<Instant> = trace
            .events
            .iter()
            .filter(|e| e.kind == "token_usage")
            .map(|e| e.at)
            .collect();
        for (answered, received) in answers.iter().zip(&usage) {
            out.by_answer
                .push(received.saturating_duration_since(*answered));
        }
    }
    if let Some(s) = session {
        server.delete_session(&key, &s).await;
    }
    out.by_stamp.sort();
    out.by_answer.sort();
    Ok(out)
}

fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| SystemTime::from(t.with_timezone(&chrono::Utc)))
}

/// The load benchmark's results.
pub struct Load {
    pub users: usize,
    pub completed: usize,
    pub failures: Vec<String>,
    pub step_latency: Vec<Duration>,
    pub events: usize,
    pub wall: Duration,
    /// From the first event any client received to the last.
    pub event_window: Duration,
    /// From the first POST to the first step of the slowest run (session creation included).
    pub slowest_start: Duration,
}

impl Load {
    /// A run's events: how many, its start (POST to first step) and each step's latency
    /// (one `thinking` to the next, the last to `run_finished`).
    fn add_timings(&mut self, trace: &RunTrace) {
        self.events += trace.events.len();
        let marks: Vec<Instant> = trace
            .events
            .iter()
            .filter(|e| e.kind == "thinking" || e.kind == "run_finished")
            .map(|e| e.at)
            .collect();
        if let Some(first) = marks.first() {
            self.slowest_start = self
                .slowest_start
                .max(first.saturating_duration_since(trace.started));
        }
        self.step_latency.extend(
            marks
                .windows(2)
                .map(|w| w[1].saturating_duration_since(w[0])),
        );
    }
}

/// A finished run's key and trace, or why it failed.
type LoadTask = tokio::task::JoinHandle<(String, anyhow::Result<RunTrace>)>;

/// One run of `steps` steps per user, all released together by a barrier.
fn all_at_once(
    server: &Arc<BenchServer>,
    model: &Arc<Model>,
    users: usize,
    steps: usize,
) -> Vec<LoadTask> {
    let start = Arc::new(tokio::sync::Barrier::new(users));
    let mut tasks = Vec::new();
    for (i, key) in server.keys.clone().into_iter().enumerate() {
        let (server, model, start) = (server.clone(), model.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let tag = format!("load{i}");
            let trace = traced_run(&server, &model, &key, &tag, steps, None).await;
            (key, trace)
        }));
    }
    tasks
}

/// Each finished run's key and trace, and why the others failed.
async fn finished(tasks: Vec<LoadTask>) -> (Vec<(String, RunTrace)>, Vec<String>) {
    let mut traces = Vec::new();
    let mut failures = Vec::new();
    for t in tasks {
        match t.await {
            Ok((key, Ok(trace))) => traces.push((key, trace)),
            Ok((_, Err(e))) => failures.push(e.to_string()),
            Err(e) => failures.push(e.to_string()),
        }
    }
    (traces, failures)
}

pub async fn bench_load(
    manager: Arc<SessionManager>,
    mut config: Config,
    users: usize,
    steps: usize,
) -> anyhow::Result<Load> {
    config.sessions.max = config.sessions.max.max(users + 4);
    config.sessions.max_per_owner = config.sessions.max_per_owner.max(users + 4);
    let model = FakeModel::start().await?;
    let server = Arc::new(BenchServer::start(manager, model.config(config), users).await?);
    let tasks = all_at_once(&server, &model.model, users, steps);
    let began = Instant::now();
    let (traces, failures) = finished(tasks).await;
    let wall = began.elapsed();
    let mut load = Load {
        users,
        completed: 0,
        failures,
        step_latency: Vec::new(),
        events: 0,
        wall,
        event_window: Duration::ZERO,
        slowest_start: Duration::ZERO,
    };
    for (key, trace) in &traces {
        load.add_timings(trace);
        let state: Value = server
            .http
            .get(format!("{}/v1/runs/{}", server.base, trace.id))
            .bearer_auth(key)
            .send()
            .await?
            .json()
            .await?;
        if state["state"] == "succeeded" && state["steps"] == json!(steps) {
            load.completed += 1;
        } else {
            load.failures.push(format!(
                "run {} ended {} after {} steps",
                trace.id, state["state"], state["steps"]
            ));
        }
        server.delete_session(key, &trace.session_id).await;
    }
    let firsts = traces
        .iter()
        .filter_map(|(_, t)| t.events.first().map(|e| e.at));
    let lasts = traces
        .iter()
        .filter_map(|(_, t)| t.events.last().map(|e| e.at));
    if let (Some(a), Some(b)) = (firsts.min(), lasts.max()) {
        load.event_window = b.saturating_duration_since(a);
    }
    load.step_latency.sort();
    if let Ok(server) = Arc::try_unwrap(server) {
        server.stop().await;
    }
    Ok(load)
}
