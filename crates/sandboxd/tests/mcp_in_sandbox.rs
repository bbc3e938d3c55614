//! A stdio MCP server started inside the session's sandbox (the default) and, with
//! `"host": true`, on the host: the server reports its own cgroup, uid, network and view of a
//! host path, so the test sees where it really ran.

use crate::mcp_common as common;
use crate::support;

use sandboxd_core::mcp::McpClients;
use sandboxd_core::mcp::config::{ServerConfig, Transport};
use sandboxd_core::sandbox::ExecRequest;
use sandboxd_core::tools::{ToolContext, ToolRegistry};
use serde_json::Value;

fn probe(name: &str, command: &str, host_path: &str, host: bool) -> ServerConfig {
    let script = std::fs::read_to_string(common::script("probe_server.py")).unwrap();
    ServerConfig {
        name: name.into(),
        transport: Transport::Stdio {
            command: command.into(),
            args: vec!["-c".into(), script, host_path.into()],
            env: vec![],
            host,
        },
        keep_names: false,
        refresh_every: 0,
    }
}

async fn whereami(clients: &McpClients, tool: &str) -> Value {
    let mut reg = ToolRegistry::new();
    let names = clients.register_into(&mut reg);
    assert!(names.contains(&tool.to_string()), "{names:?}");
    let r = reg
        .execute(tool, "{}", &ToolContext::default())
        .await
        .expect("tool call");
    serde_json::from_str(&r.output).unwrap_or_else(|e| panic!("{e}: {}", r.output))
}

#[tokio::test]
async fn a_stdio_server_runs_inside_the_sessions_sandbox_by_default() {
    let m = support::manager().await;
    let (s, _cleanup) = support::session(&m).await;
    let host_dir = tempfile::tempdir().unwrap();
    let host_path = host_dir.path().display().to_string();

    let clients = McpClients::connect_in(
        vec![probe("probe", "python3", &host_path, false)],
        Some(s.sandbox.clone()),
    )
    .await;
    assert!(clients.failures().is_empty(), "{:?}", clients.failures());
    assert!(clients.host_servers().is_empty());
    let seen = whereami(&clients, "mcp_probe_whereami").await;
    clients.close().await;

    let shell = s
        .sandbox
        .exec(ExecRequest::new(["cat", "/proc/self/cgroup"]))
        .await
        .unwrap();
    let session_cgroup = String::from_utf8_lossy(&shell.stdout).trim().to_string();
    assert_eq!(
        seen["cgroup"],
        session_cgroup.as_str(),
        "the server is in the session's cgroup"
    );
    assert_eq!(seen["uid"], 1000, "{seen}");
    assert!(
        seen["net"].as_str().unwrap().starts_with("refused"),
        "{seen}"
    );
    assert_eq!(seen["host_path_exists"], false, "{seen}");
}

#[tokio::test]
async fn host_true_runs_on_the_host_and_a_missing_sandbox_is_a_clear_failure() {
    let host_dir = tempfile::tempdir().unwrap();
    let host_path = host_dir.path().display().to_string();
    let python = common::python().display().to_string();
    let clients = McpClients::connect(vec![
        probe("onhost", &python, &host_path, true),
        probe("nowhere", "python3", &host_path, false),
    ])
    .await;
    assert_eq!(clients.host_servers(), ["onhost"]);
    let failures = clients.failures();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].0 == "nowhere" && failures[0].1.contains("\"host\": true"),
        "{failures:?}"
    );
    let seen = whereami(&clients, "mcp_onhost_whereami").await;
    clients.close().await;
    assert_eq!(seen["host_path_exists"], true, "{seen}");
    let own_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    assert_eq!(
        seen["cgroup"],
        own_cgroup.trim(),
        "the host server shares the test's cgroup"
    );
}
