//! Our MCP client against our own MCP server (the sandboxd binary), over stdio and over
//! streamable HTTP, on the real engine and image: tool listing straight from the registry,
//! bash, file write/read/list, error results, one container per session, removal on close,
//! a tool call longer than the idle timeout, and the bearer-token checks.
//!
//! Not covered here yet: python with a plot (image content) — the python tool lives in
//! another branch; the lead adds that case after merging.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::mcp_common as common;
use crate::support;

use std::time::Duration;

use common::{Containers, Listener, TOKEN};
use sandboxd_core::config::Config;
use sandboxd_core::mcp::config::{ServerConfig, Transport};
use sandboxd_core::mcp::lazy::LazySandbox;
use sandboxd_core::mcp::{McpClients, session_registry};
use sandboxd_core::tools::{ToolContext, ToolRegistry, ToolResult};

async fn call(reg: &ToolRegistry, name: &str, args: serde_json::Value) -> ToolResult {
    reg.execute(name, &args.to_string(), &ToolContext::default())
        .await
        .expect("tool call")
}

fn http_entry(name: &str, url: &str, token: &str) -> ServerConfig {
    ServerConfig {
        name: name.into(),
        transport: Transport::Http {
            url: url.into(),
            headers: vec![("Authorization".into(), format!("Bearer {token}"))],
        },
        keep_names: false,
        refresh_every: 5,
    }
}

/// Lists, runs bash, writes/reads/lists a file through `prefix`'s tools; returns the container id.
async fn exercise(clients: &McpClients, prefix: &str, guard: &mut Containers) -> String {
    let mut reg = ToolRegistry::new();
    let names = clients.register_into(&mut reg);
    for t in [
        "bash",
        "python",
        "str_replace_editor",
        "browser_use",
        "read_file",
        "write_file",
        "list_dir",
    ] {
        assert!(
            names.contains(&format!("{prefix}_{t}")),
            "{t} missing from {names:?}"
        );
    }
    // Names, descriptions and schemas are the registry's own, not a second copy.
    let manager = support::manager().await;
    let local = session_registry(
        LazySandbox::new(manager, support::owner()),
        &Config::default(),
    );
    for spec in local.specs() {
        let remote = reg
            .get(&format!("{prefix}_{}", spec.name))
            .expect("remote tool");
        assert_eq!(remote.description(), spec.description);
        assert_eq!(remote.parameters(), spec.parameters);
    }
    let (server, text) = &clients.instructions()[0];
    assert!(
        text.contains("NO network") && text.contains("/workspace"),
        "{server}: {text}"
    );

    let r = call(
        &reg,
        &format!("{prefix}_bash"),
        serde_json::json!({"command": "echo hi; hostname; pwd"}),
    )
    .await;
    assert!(!r.is_error(), "{r:?}");
    let lines: Vec<&str> = r.output.lines().collect();
    assert_eq!(lines[0], "hi");
    let id = lines[1].to_string();
    guard.add(&id);
    assert!(
        common::container_exists(&id),
        "the session container {id} should exist"
    );

    let r = call(
        &reg,
        &format!("{prefix}_bash"),
        serde_json::json!({"command": "sh -c 'exit 3'"}),
    )
    .await;
    assert!(r.output.contains("[exit code 3]"), "{r:?}");

    let body = "line one\nline two ünïcödé\n";
    let r = call(
        &reg,
        &format!("{prefix}_write_file"),
        serde_json::json!({"path": "dir/notes.txt", "content": body}),
    )
    .await;
    assert!(!r.is_error(), "{r:?}");
    let r = call(
        &reg,
        &format!("{prefix}_read_file"),
        serde_json::json!({"path": "/workspace/dir/notes.txt"}),
    )
    .await;
    assert_eq!(r.output, body);
    let r = call(
        &reg,
        &format!("{prefix}_list_dir"),
        serde_json::json!({"path": "/workspace/dir"}),
    )
    .await;
    assert!(r.output.contains("notes.txt"), "{r:?}");
    let r = call(
        &reg,
        &format!("{prefix}_bash"),
        serde_json::json!({"command": "cat dir/notes.txt | wc -l"}),
    )
    .await;
    assert_eq!(r.output.trim(), "2");

    // python with a plot: the figure arrives as MCP image content, as a PNG.
    let r = call(
        &reg,
        &format!("{prefix}_python"),
        serde_json::json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nsum(range(10))"}),
    )
    .await;
    assert!(!r.is_error(), "{r:?}");
    assert!(r.output.contains("45"), "{r:?}");
    let png = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        r.base64_image
            .as_deref()
            .expect("the plot comes back as an image"),
    )
    .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // The editor edits a file written by another tool.
    let r = call(
        &reg,
        &format!("{prefix}_str_replace_editor"),
        serde_json::json!({"command": "str_replace", "path": "/workspace/dir/notes.txt", "old_str": "line one", "new_str": "line 1"}),
    )
    .await;
    assert!(!r.is_error(), "{r:?}");
    let r = call(
        &reg,
        &format!("{prefix}_read_file"),
        serde_json::json!({"path": "/workspace/dir/notes.txt"}),
    )
    .await;
    assert!(r.output.starts_with("line 1\n"), "{r:?}");

    // Failures come back as readable tool errors.
    let r = call(
        &reg,
        &format!("{prefix}_read_file"),
        serde_json::json!({"path": "/workspace/missing.txt"}),
    )
    .await;
    assert!(r.is_error() && r.render().contains("missing.txt"), "{r:?}");
    let r = call(
        &reg,
        &format!("{prefix}_bash"),
        serde_json::json!({"command": 5}),
    )
    .await;
    assert!(r.is_error(), "{r:?}");
    id
}

#[tokio::test]
async fn stdio_client_against_own_server() {
    let mut guard = Containers::default();
    let clients = McpClients::connect(vec![common::stdio_self("self")]).await;
    assert!(clients.failures().is_empty(), "{:?}", clients.failures());
    let id = exercise(&clients, "mcp_self", &mut guard).await;
    clients.close().await;
    assert!(
        common::wait_gone(&id, Duration::from_secs(30)).await,
        "closing stdin must remove container {id}"
    );
}

#[tokio::test]
async fn http_client_against_own_server_and_isolation() {
    let mut guard = Containers::default();
    let listener = Listener::start(Some(TOKEN)).await;
    let a = McpClients::connect(vec![http_entry("a", &listener.url, TOKEN)]).await;
    assert!(a.failures().is_empty(), "{:?}", a.failures());
    let id_a = exercise(&a, "mcp_a", &mut guard).await;

    // A second session gets its own container; A's files are not there.
    let b = McpClients::connect(vec![http_entry("b", &listener.url, TOKEN)]).await;
    let mut reg_b = ToolRegistry::new();
    b.register_into(&mut reg_b);
    let r = call(&reg_b, "mcp_b_bash", serde_json::json!({"command": "hostname; ls /workspace | wc -l; test -e /workspace/dir/notes.txt && echo LEAK || echo absent"})).await;
    let lines: Vec<&str> = r.output.lines().collect();
    let id_b = lines[0].to_string();
    guard.add(&id_b);
    assert_ne!(id_a, id_b, "two sessions must get two containers");
    assert_eq!(lines[1..], ["0", "absent"], "{r:?}");

    // Closing A's session removes A's container only.
    a.close().await;
    assert!(
        common::wait_gone(&id_a, Duration::from_secs(30)).await,
        "closing the session must remove {id_a}"
    );
    assert!(common::container_exists(&id_b));
    let r = call(
        &reg_b,
        "mcp_b_bash",
        serde_json::json!({"command": "echo still-here"}),
    )
    .await;
    assert_eq!(r.output, "still-here");

    // Stopping the server removes the rest.
    b.close().await;
    listener.stop().await;
    assert!(common::wait_gone(&id_b, Duration::from_secs(30)).await);
}

#[tokio::test]
async fn a_tool_call_longer_than_the_idle_timeout_keeps_its_session() {
    let mut guard = Containers::default();
    let idle = [
        ("SANDBOXD_SESSIONS_IDLE_TIMEOUT_SECS", "1"),
        ("SANDBOXD_SESSIONS_REAP_INTERVAL_SECS", "1"),
    ];
    let listener = Listener::start_with_env(Some(TOKEN), &idle).await;
    let c = McpClients::connect(vec![http_entry("c", &listener.url, TOKEN)]).await;
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    let mut reg = ToolRegistry::new();
    c.register_into(&mut reg);
    let r = call(
        &reg,
        "mcp_c_bash",
        serde_json::json!({"command": "hostname"}),
    )
    .await;
    let id = r.output.trim().to_string();
    guard.add(&id);
    // Nothing passes on the session while the command runs, for four idle timeouts: neither
    // the manager's reaper nor rmcp's session keep-alive may take it.
    let r = call(
        &reg,
        "mcp_c_bash",
        serde_json::json!({"command": "echo $(cat /proc/sys/kernel/hostname) > /workspace/h; sleep 4; echo SLEPT-THROUGH"}),
    )
    .await;
    assert_eq!(r.output, "SLEPT-THROUGH", "{r:?}");
    let r = call(
        &reg,
        "mcp_c_bash",
        serde_json::json!({"command": "cat /workspace/h"}),
    )
    .await;
    assert_eq!(
        r.output.trim(),
        id,
        "the same container, its files kept: {r:?}"
    );
    c.close().await;
    listener.stop().await;
    assert!(common::wait_gone(&id, Duration::from_secs(30)).await);
}

#[tokio::test]
async fn bearer_token_is_required() {
    let listener = Listener::start(Some(TOKEN)).await;
    let http = reqwest::Client::new();
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let post = |auth: Option<String>| {
        let mut req = http
            .post(&listener.url)
            .header("Accept", "application/json, text/event-stream")
            .json(&init);
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        req.send()
    };
    assert_eq!(post(None).await.unwrap().status(), 401);
    assert_eq!(
        post(Some("Bearer wrong-token-0123456789".into()))
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        post(Some(TOKEN.into())).await.unwrap().status(),
        401,
        "the Bearer scheme is required"
    );
    let ok = post(Some(format!("Bearer {TOKEN}"))).await.unwrap();
    assert_eq!(ok.status(), 200);

    // Our client with a wrong token: reported as a startup failure, not a panic.
    let bad = McpClients::connect(vec![http_entry(
        "bad",
        &listener.url,
        "wrong-token-0123456789",
    )])
    .await;
    assert_eq!(bad.failures().len(), 1);
    assert!(bad.server_names().is_empty());
    listener.stop().await;
}

#[tokio::test]
async fn non_loopback_listen_without_token_refuses_to_start() {
    let out = tokio::process::Command::new(common::bin())
        .args(["mcp", "--listen", "0.0.0.0:0"])
        .env_remove("SANDBOXD_MCP_TOKEN")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to listen on 0.0.0.0") && err.contains("SANDBOXD_MCP_TOKEN"),
        "{err}"
    );
}

/// The `sandboxd bench` MCP round trip works and cleans up; prints its table row
/// (SANDBOXD_TEST_MCP_BENCH_N sets the number of calls, default 50).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_function_runs_and_cleans_up() {
    let n = std::env::var("SANDBOXD_TEST_MCP_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let manager = support::manager().await;
    let result = sandboxd::bench::mcp::bench_mcp_call(manager.clone(), Config::default(), n)
        .await
        .expect("bench");
    assert_eq!(result.samples.len(), n);
    assert!(result.percentile(0.5) <= result.percentile(0.99));
    eprintln!("{}", result.table_row());
    assert!(
        manager.live().await.is_empty(),
        "the bench must remove its sandbox"
    );
}

#[tokio::test]
async fn closing_the_client_set_frees_its_remote_tools() {
    let clients = McpClients::connect(vec![common::stdio_self("self")]).await;
    assert!(clients.failures().is_empty(), "{:?}", clients.failures());
    let mut reg = ToolRegistry::new();
    let names = clients.register_into(&mut reg);
    assert!(!names.is_empty());
    let tool = std::sync::Arc::downgrade(reg.get(&names[0]).expect("a remote tool"));
    drop(reg);
    assert!(
        tool.upgrade().is_some(),
        "the client set still holds it while open"
    );
    clients.close().await;
    drop(clients);
    assert!(
        tool.upgrade().is_none(),
        "a remote tool outlived its closed client set (an Arc cycle)"
    );
}
