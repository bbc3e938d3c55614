//! sandboxd against the official Python MCP SDK (PyPI `mcp`, 2.3.0) in both roles:
//! the SDK's client drives `sandboxd mcp --listen` (with a session, and statelessly with
//! explicit sandbox ids), and our client uses a tiny SDK server over stdio: tool names,
//! the child's environment, text/image/error results, list_changed refresh, a crash
//! mid-call with reconnect, a server failing at startup, and name clashes.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::mcp_common as common;

use std::time::Duration;

use common::{Containers, Listener, TOKEN};
use sandboxd_core::mcp::McpClients;
use sandboxd_core::mcp::config::{ServerConfig, Transport};
use sandboxd_core::tools::{ToolContext, ToolRegistry, ToolResult};
use serde_json::{Value, json};

async fn call(reg: &ToolRegistry, name: &str, args: Value) -> ToolResult {
    reg.execute(name, &args.to_string(), &ToolContext::default())
        .await
        .expect("tool call")
}

async fn run_sdk_client(url: &str, mode: &str) -> Value {
    let out = tokio::process::Command::new(common::python())
        .args([
            common::script("client_sdk.py"),
            url.to_string(),
            TOKEN.to_string(),
            mode.to_string(),
        ])
        .output()
        .await
        .expect("run the Python SDK client");
    assert!(
        out.status.success(),
        "client_sdk.py {mode} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client_sdk.py prints JSON")
}

#[tokio::test]
async fn python_sdk_client_against_sandboxd_listen() {
    let mut guard = Containers::default();
    let listener = Listener::start(Some(TOKEN)).await;

    // Handshake mode: one session, its own container, tools straight from the registry.
    let legacy = run_sdk_client(&listener.url, "legacy").await;
    let tools: Vec<&str> = legacy["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        tools,
        [
            "bash",
            "python",
            "str_replace_editor",
            "browser_use",
            "read_file",
            "write_file",
            "list_dir"
        ],
        "{legacy}"
    );
    assert!(
        legacy["instructions"]
            .as_str()
            .unwrap()
            .contains("NO network")
    );
    let bash = legacy["bash"].as_str().unwrap();
    assert!(bash.starts_with("hello-from-python\n"), "{legacy}");
    assert!(!legacy["bash_is_error"].as_bool().unwrap());
    let id = bash.lines().nth(1).unwrap().to_string();
    guard.add(&id);
    assert!(
        legacy["exit3"].as_str().unwrap().contains("[exit code 3]"),
        "{legacy}"
    );
    assert!(legacy["missing_is_error"].as_bool().unwrap(), "{legacy}");
    assert!(
        legacy["missing"].as_str().unwrap().contains("/nonexistent"),
        "{legacy}"
    );
    // The SDK sends DELETE when it exits: the session's container goes with it.
    assert!(
        common::wait_gone(&id, Duration::from_secs(30)).await,
        "session close must remove {id}"
    );

    // Default mode: SDK 2.x probes server/discover and goes stateless (2026-07-28): it must
    // use sandbox_create / sandbox_id / sandbox_close, and a forged id is refused.
    let auto = run_sdk_client(&listener.url, "auto").await;
    let bash = auto["bash"].as_str().unwrap();
    assert!(bash.starts_with("hello-from-python\n"), "{auto}");
    let id = bash.lines().nth(1).unwrap().to_string();
    guard.add(&id);
    assert!(
        auto["sandbox_id"]
            .as_str()
            .is_some_and(|s| s.starts_with("sbx-")),
        "the SDK's default mode should be stateless: {auto}"
    );
    let tools: Vec<&str> = auto["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(tools[..2], ["sandbox_create", "sandbox_close"], "{auto}");
    assert!(auto["forged_is_error"].as_bool().unwrap(), "{auto}");
    assert!(
        auto["closed"].as_str().unwrap().contains("removed"),
        "{auto}"
    );
    assert!(
        common::wait_gone(&id, Duration::from_secs(30)).await,
        "closing must remove {id}"
    );
    listener.stop().await;
}

#[tokio::test]
async fn our_client_against_python_sdk_server() {
    let clients = McpClients::connect(vec![common::py_server("py", false)]).await;
    assert!(clients.failures().is_empty(), "{:?}", clients.failures());
    let mut reg = ToolRegistry::new();
    let mut names = clients.register_into(&mut reg);
    names.sort();
    assert_eq!(
        names,
        [
            "mcp_py_crash",
            "mcp_py_echo_text",
            "mcp_py_env_names",
            "mcp_py_fail",
            "mcp_py_grow",
            "mcp_py_image"
        ]
    );
    let msgs = clients.system_messages();
    assert_eq!(msgs.len(), 1);
    assert!(
        msgs[0].contains("\"py\"") && msgs[0].contains("pyserver echoes text"),
        "{msgs:?}"
    );

    let r = call(&reg, "mcp_py_echo_text", json!({"text": "hello"})).await;
    assert_eq!(r, ToolResult::ok("echo: hello"));
    // Only PATH and the listed variable reach the child (Python may add LC_CTYPE).
    let r = call(&reg, "mcp_py_env_names", json!({})).await;
    let seen: Vec<&str> = r.output.split(',').filter(|v| *v != "LC_CTYPE").collect();
    assert_eq!(seen, ["GREETING", "PATH"], "{r:?}");
    let r = call(&reg, "mcp_py_image", json!({})).await;
    assert!(
        r.base64_image
            .as_deref()
            .is_some_and(|b| b.starts_with("iVBOR")),
        "{r:?}"
    );
    let r = call(&reg, "mcp_py_fail", json!({})).await;
    assert!(r.is_error() && r.render().contains("always fails"), "{r:?}");
    let r = call(&reg, "mcp_py_echo_text", json!({})).await;
    assert!(
        r.is_error() && r.render().contains("text"),
        "arguments are checked against the remote schema: {r:?}"
    );

    // list_changed: the new tool shows up on the next refresh, and is announced.
    assert!(clients.refresh(&mut reg).await.is_empty());
    let r = call(&reg, "mcp_py_grow", json!({})).await;
    assert_eq!(r.output, "grew");
    let mut changes = Vec::new();
    for _ in 0..50 {
        changes = clients.refresh(&mut reg).await;
        if !changes.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(changes.len(), 1, "no list_changed seen");
    assert_eq!(changes[0].added, ["mcp_py_extra"]);
    assert!(
        changes[0]
            .announcement()
            .contains("new tools available: mcp_py_extra")
    );
    let r = call(&reg, "mcp_py_extra", json!({"x": 2})).await;
    assert_eq!(r.output, "extra 2");

    // A crash mid-call is an error observation; the next call restarts the server.
    let r = call(&reg, "mcp_py_crash", json!({})).await;
    assert!(r.is_error(), "{r:?}");
    let text = r.render();
    assert!(
        text.contains("restarted on the next call") && text.contains("crashing on purpose"),
        "{text}"
    );
    let r = call(&reg, "mcp_py_echo_text", json!({"text": "again"})).await;
    assert_eq!(r.output, "echo: again", "the next call must reconnect");
    // The fresh process has the original tool list: `extra` is announced as removed.
    let changes = clients.refresh(&mut reg).await;
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].removed, ["mcp_py_extra"]);
    assert!(reg.get("mcp_py_extra").is_none());
    clients.close().await;
}

#[tokio::test]
async fn failing_server_is_skipped_and_clashes_keep_the_first() {
    let broken = ServerConfig {
        name: "broken".into(),
        transport: Transport::Stdio {
            command: "/nonexistent/mcp-server".into(),
            args: vec![],
            env: vec![],
            host: true,
        },
        keep_names: false,
        refresh_every: 5,
    };
    let clients = McpClients::connect(vec![
        broken,
        common::py_server("one", true),
        common::py_server("two", true),
    ])
    .await;
    assert_eq!(clients.failures().len(), 1);
    assert_eq!(clients.failures()[0].0, "broken");
    assert!(
        clients.failures()[0].1.contains("/nonexistent/mcp-server"),
        "{:?}",
        clients.failures()
    );
    let mut reg = ToolRegistry::new();
    let names = clients.register_into(&mut reg);
    // keep_names: sanitized originals; the second server's identical names lose.
    assert_eq!(names.len(), 6, "{names:?}");
    assert!(names.contains(&"echo_text".to_string()));
    let t = reg.get("echo_text").unwrap();
    assert_eq!(t.name(), "echo_text");
    let r = call(&reg, "echo_text", json!({"text": "x"})).await;
    assert_eq!(r.output, "echo: x");
    clients.close().await;
}

#[tokio::test]
async fn denied_environment_is_refused_at_parse_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mcp.json");
    let py = common::python().display().to_string();
    let script = common::script("server_sdk.py");
    let text = json!({"mcpServers": {
        "ok": {"command": py, "args": [script], "host": true},
        "evil": {"command": py, "args": [script], "env": {"LD_PRELOAD": "/tmp/x.so"}, "host": true},
        "evil2": {"command": py, "args": [script], "env": {"PYTHONPATH": "/tmp"}, "host": true}
    }});
    std::fs::write(&path, text.to_string()).unwrap();
    let clients = sandboxd_core::mcp::connect_all(&path).await.unwrap();
    assert_eq!(clients.server_names(), ["ok"]);
    let mut failed: Vec<String> = clients
        .failures()
        .iter()
        .map(|(s, m)| format!("{s}: {m}"))
        .collect();
    failed.sort();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(
        failed
            .iter()
            .any(|f| f.starts_with("evil: ") && f.contains("LD_PRELOAD")),
        "{failed:?}"
    );
    assert!(
        failed
            .iter()
            .any(|f| f.starts_with("evil2: ") && f.contains("PYTHONPATH")),
        "{failed:?}"
    );
    clients.close().await;
}

#[tokio::test]
async fn stateless_sandbox_left_open_is_reaped_when_idle() {
    let mut guard = Containers::default();
    let env = [
        // Long enough that the SDK client's own exit, on a loaded machine, is not mistaken
        // for the idleness this test waits for.
        ("SANDBOXD_SESSIONS_IDLE_TIMEOUT_SECS", "10"),
        ("SANDBOXD_SESSIONS_REAP_INTERVAL_SECS", "1"),
    ];
    let listener = Listener::start_with_env(Some(TOKEN), &env).await;
    let out = run_sdk_client(&listener.url, "auto-keep").await;
    assert!(out["sandbox_id"].is_string(), "{out}");
    let id = out["bash"]
        .as_str()
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .to_string();
    guard.add(&id);
    assert!(
        common::container_exists(&id),
        "nothing closed the sandbox yet"
    );
    assert!(
        common::wait_gone(&id, Duration::from_secs(60)).await,
        "an idle stateless sandbox must be reaped"
    );
    listener.stop().await;
}
