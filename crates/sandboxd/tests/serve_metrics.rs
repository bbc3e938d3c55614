//! `GET /metrics` on a real serve (real engine and image, a scripted fake LLM), parsed by the
//! official Python client's parsers (tests/prom/parse.py, `prometheus_client`, from the venv
//! .ci/run makes): the counters move by exactly what a known sequence of calls does (a cold
//! create, 3 execs, a 404, a tool call, a run with one LLM turn); the route label is the
//! matched template, never the raw path; no key is 401 and a user's key 404; the
//! `[server] metrics_listen` address answers without a key, and only /metrics.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use reqwest::Method;
use serde_json::{Value, json};

use serve::runs::{ended_run, llm_config, start_run};
use serve::{Api, Env};
use support::fake_llm::{FakeLlm, Reply};

/// The interpreter of the venv with `prometheus_client`: SANDBOXD_TEST_PROM_PYTHON, else
/// .venv-prom in the repo (made by .ci/run).
fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SANDBOXD_TEST_PROM_PYTHON") {
        return PathBuf::from(p);
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-prom/bin/python");
    assert!(
        repo.exists(),
        "the Python Prometheus client is missing: python3 -m venv .venv-prom && .venv-prom/bin/pip install 'prometheus_client==0.21.1'"
    );
    repo
}

/// Samples by `name{k="v",…}` (labels sorted), as the Python parser read them.
type Samples = BTreeMap<String, f64>;

fn key(name: &str, labels: &[(&str, &str)]) -> String {
    let mut l: Vec<_> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    l.sort();
    format!("{name}{{{}}}", l.join(","))
}

async fn parse(text: &str, format: &str) -> Samples {
    use tokio::io::AsyncWriteExt;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/prom/parse.py");
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .arg(format)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start python");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "the parser refused the scrape: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut samples = Samples::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let labels: Vec<(String, String)> = v["labels"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let name = v["name"].as_str().unwrap();
        let prev = samples.insert(key(name, &labels), v["value"].as_f64().unwrap());
        assert!(prev.is_none(), "a sample twice: {line}");
    }
    samples
}

async fn scrape(api: &Api) -> Samples {
    let resp = api.req(Method::GET, "/metrics").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    parse(&resp.text().await.unwrap(), "prometheus").await
}

fn at(s: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.get(&key(name, labels)).copied().unwrap_or(0.0)
}

fn delta(before: &Samples, after: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    at(after, name, labels) - at(before, name, labels)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread")]
async fn counters_move_by_exactly_what_a_known_sequence_does() {
    let llm = FakeLlm::start(vec![Reply::tool(
        "terminate",
        json!({"status": "success", "answer": "done"}),
    )])
    .await;
    let metrics_port = free_port();
    let env = Env::new(&format!(
        "{}[pool]\nsize = 0\n[server]\ndrain_secs = 2\nauth_failures_per_minute = 10000\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\n",
        llm_config(&llm)
    ))
    .await;
    let admin_key = env.add_user("root", &["--admin"]);
    let user_key = env.add_user("bob", &[]);
    let serve = env.start();
    let admin = Api::new(&serve, &admin_key);
    let bob = Api::new(&serve, &user_key);

    // Refused without an admin's key: 401 with none, 404 with a user's.
    let anon = reqwest::get(serve.url("/metrics")).await.unwrap();
    assert_eq!(anon.status(), 401);
    let (s, _) = bob.json(Method::GET, "/metrics", None).await;
    assert_eq!(s, 404);

    let before = scrape(&admin).await;
    let id = bob.session().await;
    for _ in 0..3 {
        bob.exec(&id, "true").await;
    }
    let (s, _) = bob
        .json(Method::GET, "/v1/sessions/no-such-session", None)
        .await;
    assert_eq!(s, 404);
    let (s, v) = bob
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/bash"),
            Some(json!({"command": "echo hi"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let run = start_run(&bob, json!({"task": "finish", "session_id": id})).await;
    let run = ended_run(&bob, run["id"].as_str().unwrap()).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    let after = scrape(&admin).await;

    let d = |name: &str, labels: &[(&str, &str)]| delta(&before, &after, name, labels);
    let exec_route = [
        ("method", "POST"),
        ("route", "/v1/sessions/{id}/exec"),
        ("status", "200"),
    ];
    assert_eq!(d("sandboxd_http_requests_total", &exec_route), 3.0);
    let missing = [
        ("method", "GET"),
        ("route", "/v1/sessions/{id}"),
        ("status", "404"),
    ];
    assert_eq!(d("sandboxd_http_requests_total", &missing), 1.0);
    // The first scrape is counted once it answered; the refusals before it were counted too.
    let scrape_ok = [("method", "GET"), ("route", "/metrics"), ("status", "200")];
    assert_eq!(d("sandboxd_http_requests_total", &scrape_ok), 1.0);
    let refused = [("method", "GET"), ("route", "/metrics"), ("status", "401")];
    assert_eq!(at(&after, "sandboxd_http_requests_total", &refused), 1.0);
    // No raw path is a label value.
    assert!(
        !after
            .keys()
            .any(|k| k.contains(&id) || k.contains("no-such-session")),
        "a raw path became a label"
    );
    assert_eq!(d("sandboxd_exec_duration_seconds_count", &[]), 3.0);
    assert_eq!(
        d("sandboxd_session_creates_total", &[("claim", "cold")]),
        1.0
    );
    assert_eq!(
        d("sandboxd_session_creates_total", &[("claim", "warm")]),
        0.0
    );
    assert_eq!(
        d(
            "sandboxd_session_create_duration_seconds_count",
            &[("claim", "cold")]
        ),
        1.0
    );
    let bash = [("tool", "bash"), ("outcome", "ok")];
    assert_eq!(d("sandboxd_tool_call_duration_seconds_count", &bash), 1.0);
    let model = [("model", "fake-model"), ("outcome", "ok")];
    assert_eq!(d("sandboxd_llm_requests_total", &model), 1.0);
    let usage = &run["usage"];
    assert_eq!(
        d(
            "sandboxd_llm_tokens_total",
            &[("model", "fake-model"), ("kind", "prompt")]
        ),
        usage["prompt_tokens"].as_f64().unwrap()
    );
    assert_eq!(
        d(
            "sandboxd_llm_tokens_total",
            &[("model", "fake-model"), ("kind", "completion")]
        ),
        usage["completion_tokens"].as_f64().unwrap()
    );
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{run}");
    assert_eq!(
        d("sandboxd_runs_ended_total", &[("outcome", "succeeded")]),
        1.0
    );
    let live = [("state", "live"), ("backend", "docker")];
    assert_eq!(at(&after, "sandboxd_sessions", &live), 1.0);
    assert!(at(&after, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(at(&after, "process_open_fds", &[]) >= 3.0);
    assert!(at(&after, "process_cpu_seconds_total", &[]) > 0.0);

    // OpenMetrics when asked for, parsed by the strict OpenMetrics parser.
    let resp = admin
        .req(Method::GET, "/metrics")
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap();
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let open = parse(&resp.text().await.unwrap(), "openmetrics").await;
    assert_eq!(
        at(
            &open,
            "sandboxd_session_creates_total",
            &[("claim", "cold")]
        ),
        1.0
    );

    // The separate address: no key needed, nothing but /metrics.
    let base = format!("http://127.0.0.1:{metrics_port}");
    let resp = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let open = parse(&resp.text().await.unwrap(), "prometheus").await;
    assert_eq!(at(&open, "sandboxd_exec_duration_seconds_count", &[]), 3.0);
    let resp = reqwest::get(format!("{base}/v1/sessions")).await.unwrap();
    assert_eq!(resp.status(), 404);
}
