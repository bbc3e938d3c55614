//! `sandboxd serve` across restarts: after `kill -9` a session is re-attached (a file written
//! before is still readable through the API), a container no stored session owns is removed,
//! a session whose container vanished is ended; SIGTERM with requests and an MCP event stream
//! open finishes within the drain bound and keeps API sessions for the next start.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use std::time::Duration;

use reqwest::Method;
use sandboxd_core::store::{SessionState, Store};
use sandboxd_sqlite::SqliteStore;
use serde_json::json;

use serve::{Api, Env, container_of};

async fn runtime_id(env: &Env, id: &str) -> String {
    env.runtime_id(id).await
}

fn container_running(runtime_id: &str) -> bool {
    container_of(runtime_id, true)
}

fn container_exists(runtime_id: &str) -> bool {
    container_of(runtime_id, false)
}

#[tokio::test]
async fn kill_9_then_restart_reattaches_ends_and_removes_orphans() {
    let env = Env::new("").await;
    let key = env.add_user("ivy", &[]);
    let mut serve = env.start();
    let api = Api::new(&serve, &key);
    let kept = api.session().await;
    let orphan = api.session().await;
    let vanished = api.session().await;
    api.exec(&kept, "echo before the crash > /workspace/note.txt")
        .await;
    let (kept_rt, orphan_rt, vanished_container) = (
        runtime_id(&env, &kept).await,
        runtime_id(&env, &orphan).await,
        env.container(&vanished).await,
    );
    let first_pid = serve.pid();
    serve.kill9();

    // While it is down: one row disappears (its container is now nobody's), one container dies.
    let store = SqliteStore::open(&env.db()).await.unwrap();
    assert!(store.delete_session(&orphan).await.unwrap());
    drop(store);
    let _ = std::process::Command::new("docker")
        .args(["rm", "-f", &vanished_container])
        .output();

    let serve = env.start();
    let api = Api::new(&serve, &key);
    let r = api
        .req(
            Method::GET,
            &format!("/v1/sessions/{kept}/files/content?path=note.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await.unwrap(), "before the crash\n");
    let out = api.exec(&kept, "echo $((6*7))").await;
    assert_eq!(out["stdout"], "42\n", "the re-attached shell works: {out}");
    let (_, v) = api
        .json(Method::GET, &format!("/v1/sessions/{kept}"), None)
        .await;
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(
        v["limits"]["memory_mb"], 1024,
        "the stored limits came back: {v}"
    );

    assert!(container_running(&kept_rt));
    assert!(
        !container_exists(&orphan_rt),
        "the container no session owns was removed"
    );
    let store = SqliteStore::open(&env.db()).await.unwrap();
    let row = store.session(&vanished).await.unwrap().unwrap();
    assert_eq!(row.state, SessionState::Ended);
    assert!(row.end_reason.unwrap().contains("gone"));
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{vanished}/exec"),
            Some(json!({"command": "id"})),
        )
        .await;
    assert_eq!((s, serve::code(&v)), (409, "conflict"), "{v}");
    // Of every container the killed process made for this user or in its warm pool (the
    // sessions may have come from it), only the live session's is left.
    let id = env.user_ids()[0].clone();
    let owners = [format!("serve:{id}"), env.pool_owner()];
    serve::wait_for_leftovers(&owners, first_pid, &[kept_rt]).await;
}

#[tokio::test]
async fn sigterm_drains_within_the_bound_with_requests_and_streams_open() {
    let env = Env::new("").await;
    let key = env.add_user("jon", &[]);
    let mut serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    let rt = runtime_id(&env, &id).await;

    // A request that would take a minute, and an MCP session's open event stream (GET).
    let long = {
        let api = api.clone();
        let id = id.clone();
        tokio::spawn(async move {
            api.json(
                Method::POST,
                &format!("/v1/sessions/{id}/exec"),
                Some(json!({"command": "sleep 60"})),
            )
            .await
        })
    };
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let r = http
        .post(serve.url("/mcp"))
        .bearer_auth(&key)
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let _ = r.text().await;
    let _ = http
        .post(serve.url("/mcp"))
        .bearer_auth(&key)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", "2025-06-18")
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .unwrap();
    let stream = http
        .get(serve.url("/mcp"))
        .bearer_auth(&key)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    assert_eq!(
        stream.status().as_u16(),
        200,
        "the MCP event stream is open"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // drain_secs = 2 in this config: the process must be gone well within a few seconds.
    let took = serve.sigterm(Duration::from_secs(10));
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    let _ = long.await;
    assert!(
        container_running(&rt),
        "an API session is kept for the next start"
    );

    let serve = env.start();
    let api = Api::new(&serve, &key);
    let out = api.exec(&id, "echo back").await;
    assert_eq!(out["stdout"], "back\n");
}
