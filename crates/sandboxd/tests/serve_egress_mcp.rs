//! The egress of /mcp sandboxes (issue 24) through a real `serve`, the real engine and image
//! and the official Python MCP SDK (tests/mcp/client_egress.py): an MCP sandbox gets `[egress]
//! default` clamped exactly as a `POST /v1/sessions` without `egress` (the user's quota,
//! `[egress] widest`), its proxy runs and its bash sees the proxy variable, its connections
//! are audited on /v1 like an API session's, and `PUT /v1/sessions/{id}/egress` turns it off
//! for the next connection, which the proxy refuses naming the rule. A sandbox whose policy
//! is `off` (the default, or a quota narrower than the default) has no proxy variable and
//! reaches nothing. The "internet" is a local server opened by `[research] allow`/`ports`.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use serde_json::Value;

use crate::egress::support::echo_http;
use crate::mcp_common as common;
use crate::serve::{Env, Serve};

/// The SDK script against serve's /mcp with `key`: its JSON.
async fn sdk(serve: &Serve, key: &str, port: u16, put: &str) -> Value {
    let out = tokio::process::Command::new(common::python())
        .args([
            common::script("client_egress.py"),
            serve.url("/mcp"),
            key.to_string(),
            port.to_string(),
            put.to_string(),
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "client_egress.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `[research]` opening the local server, and `[egress]` with `default` (None: absent).
fn config(port: u16, default: Option<&str>) -> String {
    let default = default
        .map(|d| format!("default = {d:?}\n"))
        .unwrap_or_default();
    format!(
        "[research]\nallow = [\"localhost\"]\nports = [80, 443, {port}]\n[egress]\nwidest = \"any\"\n{default}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_sandbox_gets_the_default_egress_its_audit_and_a_put_that_turns_it_off() {
    let web = echo_http("127.0.0.1".parse().unwrap()).await;
    let env = Env::new(&config(web.port, Some("localhost"))).await;
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let out = sdk(&serve, &key, web.port, "put").await;

    let first = out["first"].as_str().unwrap();
    assert!(first.contains("[http://127.0.0.1:3128]"), "{out}");
    assert!(first.contains("api saw:\nGET /first"), "{out}");
    assert_eq!(out["sessions"].as_array().unwrap().len(), 1, "{out}");
    let egress = &out["egress"];
    assert_eq!(egress["policy"], serde_json::json!(["localhost"]), "{out}");
    let recent = egress["recent"].as_array().unwrap();
    assert!(
        recent
            .iter()
            .any(|r| r["host"] == "localhost" && r["allowed"] == true && r["rule"] == "localhost"),
        "the connection is audited: {out}"
    );

    assert_eq!(out["put"]["status"], 200, "{out}");
    assert_eq!(
        out["put"]["body"]["policy"],
        serde_json::json!(["off"]),
        "{out}"
    );
    let after = out["after"].as_str().unwrap();
    assert!(after.contains("[]"), "off unsets the variable: {out}");
    assert!(
        after.contains("egress off") && !after.contains("api saw"),
        "the proxy refuses, naming the rule: {out}"
    );
    let refused = out["egress_after"]["recent"].as_array().unwrap();
    assert!(
        refused
            .iter()
            .any(|r| r["allowed"] == false && r["rule"] == "egress off"),
        "{out}"
    );
    let heads = web.heads.lock().unwrap().clone();
    assert!(
        heads.iter().any(|h| h.contains("GET /first"))
            && !heads.iter().any(|h| h.contains("after-off")),
        "{heads:?}"
    );
}

/// `off` whichever way it comes: no `[egress] default` (off), or a default the user's quota
/// does not reach (clamped to off, as `POST /v1/sessions` clamps it).
#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_sandbox_is_off_without_a_default_or_beyond_its_users_quota() {
    let web = echo_http("127.0.0.1".parse().unwrap()).await;
    for (default, quota) in [
        (None, &[][..]),
        (Some("localhost"), &["--egress", "a.test"][..]),
    ] {
        let env = Env::new(&config(web.port, default)).await;
        let key = env.add_user("bob", quota);
        let serve = env.start();
        let out = sdk(&serve, &key, web.port, "keep").await;
        let first = out["first"].as_str().unwrap();
        assert!(
            first.contains("[]"),
            "{default:?}: no proxy variable: {out}"
        );
        assert!(!first.contains("api saw"), "{default:?}: {out}");
        assert_eq!(
            out["egress"]["policy"],
            serde_json::json!(["off"]),
            "{default:?}: {out}"
        );
    }
    assert!(
        web.heads.lock().unwrap().is_empty(),
        "nothing reached the server"
    );
}
