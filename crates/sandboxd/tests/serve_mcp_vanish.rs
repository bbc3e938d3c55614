//! An /mcp sandbox of `sandboxd serve` removed outside sandboxd (`docker rm -f`), against a
//! real serve, engine and image with raw JSON-RPC: its session row ends with the reason, the
//! client's next call says why (its files are lost), and the call after it gets a new,
//! empty sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::serve_mcp_quota::client::{Cleanup, Mcp, sessions, wait_until};

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use serve::{Api, Env};

const REASON: &str = "its sandbox was removed outside sandboxd";

#[tokio::test]
async fn an_mcp_sandbox_removed_outside_sandboxd_ends_its_row_and_the_next_call_says_why() {
    let env = Env::new("idle_timeout_secs = 600").await;
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let mut cleanup = Cleanup(Vec::new());
    let m = Mcp::open(&serve, &key).await;
    m.bash("echo kept > /workspace/f", None).await;
    let rows: Vec<_> = sessions(&api)
        .await
        .into_iter()
        .filter(|s| s["kind"] == "mcp")
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = rows[0]["id"].as_str().unwrap().to_string();
    let container = env.container(&row).await;
    cleanup.0.push(container.clone());

    let out = std::process::Command::new("docker")
        .args(["rm", "-f", &container])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker rm -f: {out:?}");

    // The row ends with why, from the engine's event alone.
    let path = format!("/v1/sessions/{row}");
    wait_until(
        "the MCP sandbox's row ends",
        Duration::from_secs(30),
        async || {
            let (_, v) = api.json(Method::GET, &path, None).await;
            v["state"] == "ended"
        },
    )
    .await;
    let (s, v) = api.json(Method::GET, &path, None).await;
    assert_eq!((s, v["end_reason"].as_str()), (200, Some(REASON)), "{v}");

    // The next call says why, instead of running in a new sandbox without the files.
    let (err, text) = m.call("bash", json!({"command": "cat /workspace/f"})).await;
    assert!(err, "{text}");
    assert!(text.contains(REASON), "{text}");

    // The call after it gets a new sandbox (a new row), without the old files.
    let again = m
        .bash("cat /workspace/f 2>/dev/null || echo absent", None)
        .await;
    assert_eq!(again.trim(), "absent", "{again}");
    let live: Vec<_> = sessions(&api)
        .await
        .into_iter()
        .filter(|s| s["kind"] == "mcp" && s["state"] == "running")
        .collect();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_ne!(live[0]["id"], json!(row));
    cleanup
        .0
        .push(env.container(live[0]["id"].as_str().unwrap()).await);
}
