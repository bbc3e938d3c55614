//! `sandboxd mcp --listen` (the real binary) with three clients whose sandboxes attack the
//! server: three parallel `read_file`s of a 99 MB fake PNG, and a page that makes Chromium
//! send a 40 MB message. The server stays alive with bounded memory (its VmHWM, read from
//! /proc), and the other clients keep working.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::mcp_common as common;

use common::{Containers, Listener, TOKEN};
use sandboxd_core::mcp::McpClients;
use sandboxd_core::mcp::config::{ServerConfig, Transport};
use sandboxd_core::tools::{ToolContext, ToolRegistry, ToolResult};
use serde_json::json;

fn http_entry(name: &str, url: &str) -> ServerConfig {
    ServerConfig {
        name: name.into(),
        transport: Transport::Http {
            url: url.into(),
            headers: vec![("Authorization".into(), format!("Bearer {TOKEN}"))],
        },
        keep_names: false,
        refresh_every: 5,
    }
}

async fn call(reg: &ToolRegistry, name: &str, args: serde_json::Value) -> ToolResult {
    reg.execute(name, &args.to_string(), &ToolContext::default())
        .await
        .expect("tool call")
}

/// The server's peak resident size so far, in MiB.
fn vm_hwm_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server died");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        / 1024
}

#[tokio::test]
async fn hostile_sandboxes_do_not_hurt_the_server_or_its_other_clients() {
    let mut guard = Containers::default();
    let mut listener = Listener::start(Some(TOKEN)).await;
    let pid = listener.child.id().expect("server pid");
    let mut regs = Vec::new();
    let mut clients = Vec::new();
    for name in ["a", "b", "c"] {
        let c = McpClients::connect(vec![http_entry(name, &listener.url)]).await;
        assert!(c.failures().is_empty(), "{:?}", c.failures());
        let mut reg = ToolRegistry::new();
        c.register_into(&mut reg);
        let r = call(
            &reg,
            &format!("mcp_{name}_bash"),
            json!({"command": "hostname; printf '\\x89PNG\\r\\n\\x1a\\n' > /workspace/fake.png && head -c 99M /dev/zero >> /workspace/fake.png"}),
        )
        .await;
        assert!(r.error.is_none(), "{}", r.render());
        guard.add(r.output.lines().next().unwrap_or_default());
        regs.push((name, reg));
        clients.push(c);
    }
    let before = vm_hwm_mib(pid);

    // Three clients read the 99 MB "image" at once.
    let reads = regs.iter().map(|(name, reg)| async move {
        call(
            reg,
            &format!("mcp_{name}_read_file"),
            json!({"path": "fake.png"}),
        )
        .await
    });
    for r in futures::future::join_all(reads).await {
        let text = r.render();
        assert!(
            text.contains("over the 4194304-byte cap for images"),
            "{text}"
        );
    }
    let after_reads = vm_hwm_mib(pid);

    // Client a's page makes Chromium send a 40 MB message; b keeps working meanwhile.
    let (a, reg_a) = &regs[0];
    call(
        reg_a,
        &format!("mcp_{a}_write_file"),
        json!({"path": "big.html", "content": "<title>Big</title><script>setTimeout(() => console.log('x'.repeat(40 * 1024 * 1024)), 300)</script>"}),
    )
    .await;
    call(
        reg_a,
        &format!("mcp_{a}_browser_use"),
        json!({"action": "go_to_url", "url": "file:///workspace/big.html"}),
    )
    .await;
    // Until the cut is seen, or a generous deadline: how long Chromium takes to build the big
    // message depends on the machine's load, and is not what this test measures.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let mut notes = String::new();
    while std::time::Instant::now() < deadline {
        let r = call(
            reg_a,
            &format!("mcp_{a}_browser_use"),
            json!({"action": "wait", "seconds": 1}),
        )
        .await;
        let text = r.render();
        notes.push_str(&text);
        if notes.contains("sandboxd cut the connection") {
            break;
        }
        // On a loaded machine Chromium can be too slow to answer before it builds the big
        // message; sandboxd then restarts it on about:blank, and the page must be opened
        // again (as often as that happens, since the reopening can be cut short the same way).
        if text.contains("Chromium was stopped") || text.contains("URL: \"about:blank\"") {
            call(
                reg_a,
                &format!("mcp_{a}_browser_use"),
                json!({"action": "go_to_url", "url": "file:///workspace/big.html"}),
            )
            .await;
        }
    }
    assert!(notes.contains("sandboxd cut the connection"), "{notes}");
    let (b, reg_b) = &regs[1];
    let r = call(
        reg_b,
        &format!("mcp_{b}_bash"),
        json!({"command": "echo still-here"}),
    )
    .await;
    assert_eq!(r.output, "still-here");
    assert!(
        listener.child.try_wait().unwrap().is_none(),
        "the server died"
    );
    let after_browser = vm_hwm_mib(pid);
    println!(
        "server VmHWM: {before} MiB with 3 sandboxes up, {after_reads} MiB after 3 parallel 99 MB reads, {after_browser} MiB after the 40 MB CDP message"
    );
    assert!(after_reads < before + 100, "{before} → {after_reads} MiB");
    assert!(
        after_browser < before + 150,
        "{before} → {after_browser} MiB"
    );

    for c in clients {
        c.close().await;
    }
    listener.stop().await;
}
