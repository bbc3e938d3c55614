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
//! measured event is a replay. A run is posted to one server and followed on the same one or
//! on another replica of its store (`Route`, `placement`): replicas.rs measures both.

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
pub struct Model {
    /// Per run tag: released once its client follows the events.
    gates: Mutex<HashMap<String, Arc<Notify>>>,
    /// Per run tag: when each answer was handed over.
    answered: Mutex<HashMap<String, Vec<Instant>>>,
}

impl Model {
    /// The gate of run `tag`: `notify_one` releases its first answer (before or after it is asked).
    pub fn gate(&self, tag: &str) -> Arc<Notify> {
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
pub struct FakeModel {
    pub model: Arc<Model>,
    base_url: String,
    server: tokio::task::JoinHandle<()>,
}

impl FakeModel {
    pub async fn start() -> anyhow::Result<FakeModel> {
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
    pub fn config(&self, mut config: Config) -> Config {
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

/// Starts a run for `key` on `post` and follows its events to the end on `follow` (the same
/// server, or another replica of its store); the model's first answer waits until the stream
/// is open.
async fn traced_run(
    post: &BenchServer,
    follow: &BenchServer,
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
    let r = post
        .http
        .post(format!("{}/v1/runs", post.base))
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
    let resp = follow
        .http
        .get(format!("{}/v1/runs/{id}/events", follow.base))
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
    let route = Route {
        post: &server,
        follow: &server,
    };
    let result = latency_interleaved(&[route], &model.model, samples).await;
    server.stop().await;
    Ok(result?.remove(0))
}

/// Where a measured run is posted (and driven) and where its events are followed: one
/// server, or two replicas of one store.
#[derive(Clone, Copy)]
pub struct Route<'a> {
    pub post: &'a BenchServer,
    pub follow: &'a BenchServer,
}

/// Event latency over each route, a 20-step run on each in turn until every route has
/// `samples` samples by the model's clock, so that the routes share the machine's load.
/// Each route's runs use one session (the first run makes it on `post`), removed after.
pub async fn latency_interleaved(
    routes: &[Route<'_>],
    model: &Model,
    samples: usize,
) -> anyhow::Result<Vec<EventLatency>> {
    let mut out: Vec<EventLatency> = routes
        .iter()
        .map(|_| EventLatency {
            by_stamp: Vec::new(),
            by_answer: Vec::new(),
        })
        .collect();
    let mut sessions: Vec<Option<String>> = vec![None; routes.len()];
    let mut n = 0;
    let mut result = Ok(());
    'rounds: while out.iter().any(|l| l.by_answer.len() < samples) {
        for (i, route) in routes.iter().enumerate() {
            n += 1;
            match latency_run(*route, model, &format!("lat{n}"), &sessions[i]).await {
                Ok((session, l)) => {
                    sessions[i] = Some(session);
                    out[i].by_stamp.extend(l.by_stamp);
                    out[i].by_answer.extend(l.by_answer);
                }
                Err(e) => {
                    result = Err(e);
                    break 'rounds;
                }
            }
        }
    }
    for (route, session) in routes.iter().zip(&sessions) {
        if let Some(s) = session {
            route.post.delete_session(&route.post.keys[0], s).await;
        }
    }
    for l in &mut out {
        l.by_stamp.sort();
        l.by_answer.sort();
    }
    result.map(|()| out)
}

/// One 20-step run over `route` (in `session`, else a new one): its session and its samples.
async fn latency_run(
    route: Route<'_>,
    model: &Model,
    tag: &str,
    session: &Option<String>,
) -> anyhow::Result<(String, EventLatency)> {
    let key = route
        .post
        .keys
        .first()
        .ok_or_else(|| anyhow::anyhow!("the benchmark server has no user"))?;
    let trace = traced_run(
        route.post,
        route.follow,
        model,
        key,
        tag,
        20,
        session.as_deref(),
    )
    .await?;
    let mut out = EventLatency {
        by_stamp: Vec::new(),
        by_answer: Vec::new(),
    };
    for e in &trace.events {
        if let Some(at) = e.data["at"].as_str().and_then(parse_rfc3339) {
            out.by_stamp
                .push(e.wall.duration_since(at).unwrap_or(Duration::ZERO));
        }
    }
    let answers = model
        .answered
        .lock()
        .map(|a| a.get(tag).cloned().unwrap_or_default())
        .unwrap_or_default();
    let usage = trace
        .events
        .iter()
        .filter(|e| e.kind == "token_usage")
        .map(|e| e.at);
    for (answered, received) in answers.iter().zip(usage) {
        out.by_answer
            .push(received.saturating_duration_since(*answered));
    }
    Ok((trace.session_id, out))
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
    /// Two rounds of a load as one: runs, events, failures and samples together, the times
    /// added (so events/s is over both), the slowest start the slower.
    pub fn merge(mut self, other: Load) -> Load {
        self.users += other.users;
        self.completed += other.completed;
        self.failures.extend(other.failures);
        self.step_latency.extend(other.step_latency);
        self.step_latency.sort();
        self.events += other.events;
        self.wall += other.wall;
        self.event_window += other.event_window;
        self.slowest_start = self.slowest_start.max(other.slowest_start);
        self
    }

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

/// A finished run's user (its index in the keys) and trace, or why it failed.
type LoadTask = tokio::task::JoinHandle<(usize, anyhow::Result<RunTrace>)>;

/// The replica user `i`'s run is posted to and the one it is followed on: round-robin over
/// `n` replicas, followed on the next one (on the same one when there is only one).
fn placement(i: usize, n: usize) -> (usize, usize) {
    (i % n, (i + 1) % n)
}

/// One run of `steps` steps per user (the first server's keys), all released together by a
/// barrier, each placed on the servers by `placement`.
fn all_at_once(servers: &[Arc<BenchServer>], model: &Arc<Model>, steps: usize) -> Vec<LoadTask> {
    let keys = servers.first().map(|s| s.keys.clone()).unwrap_or_default();
    let start = Arc::new(tokio::sync::Barrier::new(keys.len()));
    let mut tasks = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        let (p, f) = placement(i, servers.len());
        let (post, follow) = (servers[p].clone(), servers[f].clone());
        let (model, start) = (model.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let tag = format!("load{i}");
            let trace = traced_run(&post, &follow, &model, &key, &tag, steps, None).await;
            (i, trace)
        }));
    }
    tasks
}

/// Each finished run's user and trace, and why the others failed.
async fn finished(tasks: Vec<LoadTask>) -> (Vec<(usize, RunTrace)>, Vec<String>) {
    let mut traces = Vec::new();
    let mut failures = Vec::new();
    for t in tasks {
        match t.await {
            Ok((i, Ok(trace))) => traces.push((i, trace)),
            Ok((_, Err(e))) => failures.push(e.to_string()),
            Err(e) => failures.push(e.to_string()),
        }
    }
    (traces, failures)
}

/// The load on one server of its own SQLite store, with `users` users.
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
    let result = load_on(std::slice::from_ref(&server), &model.model, steps).await;
    server.stop().await;
    result
}

/// One `steps`-step run per user of the first server's keys at once, placed over `servers`
/// (replicas of one store, or one server) by `placement`; each run's session is removed
/// through the server that made it. The servers keep running.
pub async fn load_on(
    servers: &[Arc<BenchServer>],
    model: &Arc<Model>,
    steps: usize,
) -> anyhow::Result<Load> {
    let first = servers
        .first()
        .ok_or_else(|| anyhow::anyhow!("a load needs a server"))?;
    let tasks = all_at_once(servers, model, steps);
    let began = Instant::now();
    let (traces, failures) = finished(tasks).await;
    let mut load = Load {
        users: first.keys.len(),
        completed: 0,
        failures,
        step_latency: Vec::new(),
        events: 0,
        wall: began.elapsed(),
        event_window: Duration::ZERO,
        slowest_start: Duration::ZERO,
    };
    for (i, trace) in &traces {
        load.add_timings(trace);
        let post = &servers[placement(*i, servers.len()).0];
        load.check_state(post, &first.keys[*i], trace, steps)
            .await?;
        post.delete_session(&first.keys[*i], &trace.session_id)
            .await;
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
    Ok(load)
}

impl Load {
    /// Counts the run as completed if `server` says it succeeded after `steps` steps.
    async fn check_state(
        &mut self,
        server: &BenchServer,
        key: &str,
        trace: &RunTrace,
        steps: usize,
    ) -> anyhow::Result<()> {
        let state: Value = server
            .http
            .get(format!("{}/v1/runs/{}", server.base, trace.id))
            .bearer_auth(key)
            .send()
            .await?
            .json()
            .await?;
        if state["state"] == "succeeded" && state["steps"] == json!(steps) {
            self.completed += 1;
        } else {
            self.failures.push(format!(
                "run {} ended {} after {} steps",
                trace.id, state["state"], state["steps"]
            ));
        }
        Ok(())
    }
}
