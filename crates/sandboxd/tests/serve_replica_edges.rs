//! Issue 22's edges, against real `sandboxd serve` processes on a real PostgreSQL (a
//! throw-away cluster of this test's own, since it is stopped and started) and the real
//! engine: a store that goes away is a 503 `store_unavailable` with `Retry-After` (and /readyz
//! says the store is down) until it is back, and nothing committed before is lost; failed
//! sign-ins are counted in the store, so two replicas count into one window; and an MCP
//! session (or a stateless `sandbox_id`) begun on one replica is served by another with the
//! same sandbox, while another user's session id is a 404 there.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::serve_mcp_quota::client::Mcp;
use serve::runs::{SERVER, follow_all, llm_config, start_run};
use serve::{Api, Env, Serve, code};
use support::fake_llm::{FakeLlm, Reply};

/// A PostgreSQL cluster of one test (scripts/pg-test.sh), removed when dropped.
struct Cluster {
    url: String,
    dir: String,
}

impl Cluster {
    /// None when the Postgres tests are skipped on purpose (SANDBOXD_TEST_PG=skip).
    fn start() -> Option<Cluster> {
        if std::env::var("SANDBOXD_TEST_PG").as_deref() == Ok("skip") {
            eprintln!("SKIPPED: a test on PostgreSQL (SANDBOXD_TEST_PG=skip); nothing was tested");
            return None;
        }
        let out = script(&["start"]);
        let var = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}='")))
                .and_then(|v| v.strip_suffix('\''))
                .unwrap_or_else(|| panic!("pg-test.sh start printed no {name}: {out}"))
                .to_string()
        };
        Some(Cluster {
            url: var("SANDBOXD_TEST_PG_URL"),
            dir: var("SANDBOXD_TEST_PG_DIR"),
        })
    }

    /// The config section that puts serve's store in this cluster.
    fn store(&self) -> String {
        format!("[store]\nurl = {:?}\n", self.url)
    }

    fn halt(&self) {
        script(&["halt", &self.dir]);
    }

    fn resume(&self) {
        script(&["resume", &self.dir]);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../scripts/pg-test.sh"
            ))
            .args(["stop", &self.dir])
            .output();
    }
}

fn script(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/pg-test.sh"
        ))
        .args(args)
        .output()
        .expect("run scripts/pg-test.sh");
    assert!(
        out.status.success(),
        "pg-test.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// GET `path`: its status, Retry-After and JSON body.
async fn get(api: &Api, path: &str) -> (u16, Option<String>, Value) {
    let r = api.req(Method::GET, path).send().await.unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, retry, r.json().await.unwrap_or(Value::Null))
}

/// Polls GET `path` until it answers `status` (at most `limit`); the last answer.
async fn until_status(api: &Api, path: &str, status: u16, limit: Duration) -> Value {
    let start = Instant::now();
    loop {
        let (s, _, v) = get(api, path).await;
        if s == status {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "GET {path} still answers {s} after {limit:?}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_goes_away_is_a_503_until_it_is_back_and_nothing_committed_is_lost() {
    let Some(pg) = Cluster::start() else { return };
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "bash",
            json!({"command": "echo kept > /workspace/kept.txt"}),
        ),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    let env = Env::new(&format!("{}{SERVER}{}", llm_config(&llm), pg.store())).await;
    let key = env.add_user("ada", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(&api, json!({"task": "write a file", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let before = follow_all(&api, &id).await;
    assert!(before.len() >= 3, "the run's events: {before:?}");
    let run_path = format!("/v1/runs/{id}");
    let events_path = format!("/v1/runs/{id}/events?follow=false");
    let (_, _, done) = get(&api, &run_path).await;
    assert_eq!(done["state"], "succeeded", "{done}");

    pg.halt();
    let (status, retry, body) = get(&api, &run_path).await;
    assert_eq!(status, 503, "a request while the store is down: {body}");
    assert_eq!(code(&body), "store_unavailable", "{body}");
    assert!(
        retry.as_deref().is_some_and(|s| s.parse::<u64>().is_ok()),
        "Retry-After: {retry:?}"
    );
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("cannot reach its store"), "{msg}");
    let ready = reqwest::get(serve.url("/readyz")).await.unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let ready: Value = ready.json().await.unwrap();
    assert!(
        ready["checks"]["store"]
            .as_str()
            .is_some_and(|s| s.contains("unavailable")),
        "/readyz names the store: {ready}"
    );
    let live = reqwest::get(serve.url("/healthz")).await.unwrap();
    assert_eq!(
        live.status().as_u16(),
        200,
        "/healthz is the process, not the store"
    );

    pg.resume();
    let again = until_status(&api, &run_path, 200, Duration::from_secs(30)).await;
    assert_eq!(again["state"], "succeeded", "{again}");
    let r = api.req(Method::GET, &events_path).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let after = serve::runs::read_sse(r, None).await;
    assert_eq!(
        after, before,
        "every committed event is still there, once, in order"
    );
    let ready = until_status(&api, "/readyz", 200, Duration::from_secs(10)).await;
    assert_eq!(ready["checks"]["store"], "ok", "{ready}");
    // And the service works again: the run's session still runs commands.
    let session = run["session_id"].as_str().unwrap();
    let out = api.exec(session, "cat /workspace/kept.txt").await;
    assert_eq!(out["stdout"], "kept\n", "{out}");
}

/// GET /v1/me with `key` from `serve`: the status.
async fn me(serve: &Serve, key: &str) -> u16 {
    reqwest::Client::new()
        .get(serve.url("/v1/me"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_authentications_on_two_replicas_count_into_one_window() {
    let Some(pg) = Cluster::start() else { return };
    let config = format!(
        "[server]\ndrain_secs = 2\nauth_failures_per_minute = 4\n{}",
        pg.store()
    );
    let (env_a, env_b) = (Env::new(&config).await, Env::new(&config).await);
    let key = env_a.add_user("ben", &[]);
    let (a, b) = (env_a.start(), env_b.start());
    let wrong = "sbx_not-a-key-of-anyone";
    // Four failures spread over the replicas fill the one window of 127.0.0.1.
    for serve in [&a, &b, &a, &b] {
        assert_eq!(me(serve, wrong).await, 401);
    }
    assert_eq!(
        me(&a, wrong).await,
        429,
        "the fifth failure, on either replica"
    );
    assert_eq!(me(&b, wrong).await, 429);
    // A valid key is never refused, on either.
    assert_eq!(me(&a, &key).await, 200);
    assert_eq!(me(&b, &key).await, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_session_moves_between_replicas_with_its_sandbox() {
    let Some(pg) = Cluster::start() else { return };
    let config = format!("{SERVER}{}", pg.store());
    let (env_a, env_b) = (Env::new(&config).await, Env::new(&config).await);
    let alice = env_a.add_user("alice", &[]);
    let bob = env_a.add_user("bob", &[]);
    let (a, b) = (env_a.start(), env_b.start());

    // A session begun on A: a file written there is read through B, no new initialize.
    let on_a = Mcp::open(&a, &alice).await;
    on_a.bash("echo from-a > /workspace/moved.txt", None).await;
    let sid = on_a.sid.clone().unwrap();
    let on_b = Mcp::join(&b, &alice, &sid);
    let text = on_b
        .bash(
            "cat /workspace/moved.txt; echo via-b >> /workspace/moved.txt",
            None,
        )
        .await;
    assert!(
        text.contains("from-a"),
        "B serves A's session with its sandbox: {text}"
    );
    let text = on_a.bash("cat /workspace/moved.txt", None).await;
    assert!(
        text.contains("via-b"),
        "and A still does, the same sandbox: {text}"
    );

    // Another user's session id is unknown on every replica.
    let bobs = Mcp::join(&b, &bob, &sid);
    let r = bobs
        .post(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
        .await;
    assert_eq!(r.status().as_u16(), 404, "bob naming alice's session on B");
    assert_eq!(bobs.delete(None).await, 404, "nor may he close it");

    // A stateless sandbox made on A is used and closed through B.
    let sa = Mcp::stateless(&a, &alice);
    let sb = Mcp::stateless(&b, &alice);
    let sandbox = sa.create().await;
    sa.bash("echo stateless > /workspace/s.txt", Some(&sandbox))
        .await;
    let text = sb.bash("cat /workspace/s.txt", Some(&sandbox)).await;
    assert!(text.contains("stateless"), "{text}");
    let (err, text) = sb
        .call("sandbox_close", json!({"sandbox_id": sandbox}))
        .await;
    assert!(!err, "sandbox_close on B: {text}");
    let (err, text) = sa
        .call("bash", json!({"command": "true", "sandbox_id": sandbox}))
        .await;
    // A held it: its call fails now (the container is gone), never reaching another one.
    assert!(err, "closed for A too: {text}");

    // One sandbox for the moved session, counted once; closing it on B ends it.
    let api = Api::new(&a, &alice);
    let mcp_sessions = async || {
        let (_, me) = api.json(Method::GET, "/v1/me", None).await;
        me["usage"]["active_mcp_sessions"].as_u64().unwrap()
    };
    assert_eq!(mcp_sessions().await, 1, "one sandbox across both replicas");
    assert_eq!(
        on_b.delete(None).await,
        202,
        "alice closes her session on B"
    );
    let start = Instant::now();
    while mcp_sessions().await != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the closed session's sandbox is still counted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
