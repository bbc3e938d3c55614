//! `sandboxd mcp` over stdio (the binary, driven by the official Python `mcp` SDK) on the
//! real engine and image: its sandbox removed outside sandboxd (`docker rm -f`) ends the
//! session at once (the server follows the engine's events, as serve does), so the client's
//! next call says why, and the call after it gets a new, empty sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::mcp_common as common;

use common::Containers;
use serde_json::Value;

const REASON: &str = "its sandbox was removed outside sandboxd";

#[tokio::test]
async fn the_next_call_after_the_stdio_servers_sandbox_vanished_says_why() {
    let mut guard = Containers::default();
    let out = tokio::process::Command::new(common::python())
        .args([common::script("client_vanish.py"), common::bin().into()])
        .output()
        .await
        .unwrap();
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client_vanish.py: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let first = seen["first"].as_str().unwrap();
    guard.add(first);
    assert_eq!(seen["removed"], true, "{seen}");

    // Every call after the removal failed (none ran in a new sandbox unannounced), and the
    // last of them said why.
    let errors = seen["errors"].as_array().unwrap();
    assert!(
        errors.iter().all(|e| e["error"] == true),
        "a call after the removal succeeded: {seen}"
    );
    let told = errors.last().unwrap()["text"].as_str().unwrap();
    assert!(told.contains(REASON), "{seen}");
    assert!(told.contains("new, empty sandbox"), "{seen}");

    // The call after it starts anew: another container, without the old files.
    let after = &seen["after"];
    assert_eq!(after["error"], false, "{seen}");
    let lines: Vec<&str> = after["text"].as_str().unwrap().lines().collect();
    guard.add(lines[0]);
    assert_ne!(lines[0], first, "a new sandbox: {seen}");
    assert_eq!(lines.get(1).copied(), Some("absent"), "{seen}");
}
