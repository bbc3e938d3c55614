//! The A2A benchmark of `sandboxd bench serve`: the same one-step run (the instant fake model
//! of server_runs.rs, bash-free: it terminates at once) through A2A `SendMessage` (blocking,
//! `A2A-Version: 1.0`, until the task is completed) and through the runs API (POST /v1/runs,
//! then its event stream to the end, which is how a /v1 client learns a run completed),
//! interleaved in one session of one server, so the difference is what the A2A shell adds:
//! JSON-RPC, the wait for the task to settle, and the artifacts (listing /workspace).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::server::BenchServer;
use super::server_runs::{FakeModel, Model, SseReader};
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::SessionManager;

/// Both paths' times from request to a completed run, unsorted.
pub struct A2aBench {
    pub a2a: Vec<Duration>,
    pub v1: Vec<Duration>,
}

pub async fn bench_a2a(
    manager: Arc<SessionManager>,
    config: Config,
    samples: usize,
) -> anyhow::Result<A2aBench> {
    let model = FakeModel::start().await?;
    let server = BenchServer::start(manager, model.config(config), 1).await?;
    let result = interleaved(&server, &model.model, samples).await;
    server.stop().await;
    result
}

async fn interleaved(
    server: &BenchServer,
    model: &Model,
    samples: usize,
) -> anyhow::Result<A2aBench> {
    let key = server
        .keys
        .first()
        .ok_or_else(|| anyhow::anyhow!("the benchmark server has no user"))?;
    let session = server.session(key).await?;
    let mut out = A2aBench {
        a2a: Vec::new(),
        v1: Vec::new(),
    };
    // One of each first, unmeasured: the session's first run warms its tools.
    for i in 0..=samples {
        let a = timed_run(server, model, key, (&session, &format!("a{i}")), true).await;
        let v = timed_run(server, model, key, (&session, &format!("v{i}")), false).await;
        let (a, v) = match (a, v) {
            (Ok(a), Ok(v)) => (a, v),
            (Err(e), _) | (_, Err(e)) => {
                server.delete_session(key, &session).await;
                return Err(e);
            }
        };
        if i > 0 {
            out.a2a.push(a);
            out.v1.push(v);
        }
    }
    server.delete_session(key, &session).await;
    Ok(out)
}

/// One run through A2A (`a2a`) or /v1, from the request to knowing it completed.
async fn timed_run(
    server: &BenchServer,
    model: &Model,
    key: &str,
    (session, tag): (&str, &str),
    a2a: bool,
) -> anyhow::Result<Duration> {
    // Released before the request: the model answers at once, on both paths.
    model.gate(tag).notify_one();
    let t = Instant::now();
    if a2a {
        send_message(server, key, session, tag).await?;
    } else {
        run_and_follow(server, key, session, tag).await?;
    }
    Ok(t.elapsed())
}

/// SendMessage in the session's context, until the task is completed.
async fn send_message(
    server: &BenchServer,
    key: &str,
    session: &str,
    tag: &str,
) -> anyhow::Result<()> {
    let body = json!({"jsonrpc": "2.0", "id": tag, "method": "SendMessage", "params": {
        "message": {"messageId": tag, "role": "ROLE_USER", "contextId": session,
            "parts": [{"text": format!("bench tag={tag} steps=1")}]}}});
    let r: Value = server
        .http
        .post(format!("{}/a2a", server.base))
        .bearer_auth(key)
        .header("A2A-Version", "1.0")
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let state = &r["result"]["task"]["status"]["state"];
    anyhow::ensure!(state == "TASK_STATE_COMPLETED", "SendMessage answered {r}");
    Ok(())
}

/// POST /v1/runs in the session, then its events until the stream ends (the run ended).
async fn run_and_follow(
    server: &BenchServer,
    key: &str,
    session: &str,
    tag: &str,
) -> anyhow::Result<()> {
    let body = json!({"task": format!("bench tag={tag} steps=1"), "session_id": session});
    let id = super::ui::start_run(&server.http, &server.base, key, body).await?;
    let resp = server
        .http
        .get(format!("{}/v1/runs/{id}/events", server.base))
        .bearer_auth(key)
        .send()
        .await?
        .error_for_status()?;
    let mut reader = SseReader::new(resp);
    let mut last = None;
    while let Some(e) = reader.next().await? {
        last = Some(e);
    }
    let state = last.map(|e| e.data["state"].clone()).unwrap_or_default();
    anyhow::ensure!(state == "succeeded", "the /v1 run ended {state}");
    Ok(())
}
