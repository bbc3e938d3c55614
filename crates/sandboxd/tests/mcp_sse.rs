//! The legacy HTTP+SSE MCP transport against the official Python SDK's SSE server (an entry
//! written as OpenManus writes it, `"type": "sse"`), and a hostile server whose endpoint
//! event points outside its own origin.

use crate::mcp_common as common;

use std::time::Duration;

use sandboxd_core::tools::{ToolContext, ToolRegistry};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn wait_listening(port: u16, child: &mut tokio::process::Child) {
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the SSE server exited before listening: {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the SSE server did not listen on {port} within 60 s");
}

fn servers_file(dir: &tempfile::TempDir, url: &str) -> std::path::PathBuf {
    let path = dir.path().join("mcp.json");
    let text = json!({"mcpServers": {"legacy": {"type": "sse", "url": url}}});
    std::fs::write(&path, text.to_string()).unwrap();
    path
}

#[tokio::test]
async fn an_sse_only_server_works_from_an_openmanus_style_entry() {
    let port = free_port();
    let mut server = tokio::process::Command::new(common::python())
        .args([
            common::script("server_sdk.py"),
            "--sse".into(),
            port.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the SDK's SSE server");
    wait_listening(port, &mut server).await;

    let dir = tempfile::tempdir().unwrap();
    let path = servers_file(&dir, &format!("http://127.0.0.1:{port}/sse"));
    let clients = sandboxd_core::mcp::connect_all(&path).await.unwrap();
    assert!(clients.failures().is_empty(), "{:?}", clients.failures());
    let mut reg = ToolRegistry::new();
    let names = clients.register_into(&mut reg);
    assert!(
        names.contains(&"mcp_legacy_echo_text".to_string()),
        "{names:?}"
    );
    for text in ["one", "two"] {
        let r = reg
            .execute(
                "mcp_legacy_echo_text",
                &json!({ "text": text }).to_string(),
                &ToolContext::default(),
            )
            .await
            .expect("tool call");
        assert_eq!(r.output, format!("echo: {text}"));
    }
    let r = reg
        .execute("mcp_legacy_fail", "{}", &ToolContext::default())
        .await
        .expect("tool call");
    let text = r.render();
    assert!(r.error.is_some() && text.contains("always fails"), "{text}");
    clients.close().await;
}

/// Answers one GET with an event stream whose endpoint is on another origin, then holds it.
async fn hostile_server(listener: tokio::net::TcpListener) {
    let (mut sock, _) = listener.accept().await.unwrap();
    let mut buf = [0u8; 4096];
    let _ = sock.read(&mut buf).await;
    let body = "event: endpoint\r\ndata: http://203.0.113.9:8000/messages/?session_id=x\r\n\r\n";
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(body.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
}

#[tokio::test]
async fn an_endpoint_outside_the_streams_origin_is_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(hostile_server(listener));
    let dir = tempfile::tempdir().unwrap();
    let path = servers_file(&dir, &format!("http://127.0.0.1:{port}/sse"));
    let clients = sandboxd_core::mcp::connect_all(&path).await.unwrap();
    let failures = clients.failures();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].1.contains("outside the origin") && failures[0].1.contains("203.0.113.9"),
        "{failures:?}"
    );
    clients.close().await;
    server.abort();
}
