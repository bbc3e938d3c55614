//! The browser's lifecycle and isolation against the real engine: no network, a killed
//! Chromium comes back, a sandbox that dies under an action ends it as gone, shutdown leaves
//! nothing running, sessions never see each other's browser, and the tunnel serves exactly
//! one connection of this process.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::browser_support;
use crate::support;

use std::time::{Duration, Instant};

use browser_support::*;
use sandboxd_core::config::LimitRequest;
use sandboxd_core::sandbox::tunnel::Tunnel;
use sandboxd_core::sandbox::{ExecRequest, SandboxError};
use sandboxd_core::tools::browser::BrowserUse;
use sandboxd_core::tools::{Tool, ToolContext, ToolError};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn chromium_processes(sb: &dyn sandboxd_core::sandbox::Sandbox) -> String {
    let out = sb
        .exec(ExecRequest::shell_line("pgrep -a chromium || true"))
        .await
        .unwrap();
    out.stdout_lossy().trim().to_string()
}

/// SIGKILLs every Chromium process of the sandbox.
async fn kill_chromium(sb: &dyn sandboxd_core::sandbox::Sandbox) {
    let kill = sb
        .exec(ExecRequest::shell_line("pkill -9 chromium"))
        .await
        .unwrap();
    assert_eq!(kill.exit_code, Some(0), "{}", kill.stderr_lossy());
}

/// `args`' answer, which must carry the note that Chromium was restarted.
async fn restarted(tool: &BrowserUse, args: serde_json::Value) -> sandboxd_core::tools::ToolResult {
    let r = ok(tool, args).await;
    assert!(
        r.system
            .as_deref()
            .unwrap_or_default()
            .contains("restarted"),
        "{r:?}"
    );
    r
}

#[tokio::test]
async fn external_urls_fail_at_once_with_no_network() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let tool = BrowserUse::new(s.sandbox.clone());
    for url in [
        "https://example.com/",
        "http://10.1.2.3:8080/x",
        "http://localhost.attacker.net/",
    ] {
        let t = Instant::now();
        let r = call(&tool, json!({"action": "go_to_url", "url": url})).await;
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(
            r.error.unwrap().contains("the sandbox has no network"),
            "{url}"
        );
    }
    // Refused before anything started.
    assert!(tool.current_state().await.is_none());
    assert_eq!(chromium_processes(s.sandbox.as_ref()).await, "");
    // And with the browser running, for open_tab too.
    ok(&tool, json!({"action": "go_to_url", "url": "about:blank"})).await;
    let t = Instant::now();
    let r = call(
        &tool,
        json!({"action": "open_tab", "url": "https://example.org/"}),
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(r.error.unwrap().contains("the sandbox has no network"));
    tool.shutdown().await;
}

#[tokio::test]
async fn a_killed_chromium_is_restarted_with_a_note_and_shutdown_cleans_up() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = s.sandbox.clone();
    sb.write_file(&format!("{SITE}/page2.html"), PAGE2.as_bytes())
        .await
        .unwrap();
    let tool = BrowserUse::new(sb.clone());
    let url = format!("file://{SITE}/page2.html");
    let r = ok(&tool, json!({"action": "go_to_url", "url": url})).await;
    assert!(r.system.is_none());
    assert!(!chromium_processes(sb.as_ref()).await.is_empty());

    kill_chromium(sb.as_ref()).await;
    // Right away, before sandboxd could notice: the next action recovers and says so.
    let r = restarted(&tool, json!({"action": "go_to_url", "url": url})).await;
    assert!(r.output.contains("Title: \"Page two\""), "{}", r.output);
    // And once more after it had time to notice.
    kill_chromium(sb.as_ref()).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let r = restarted(&tool, json!({"action": "screenshot"})).await;
    assert!(r.output.contains("URL: \"about:blank\""), "{}", r.output);
    let r = ok(&tool, json!({"action": "go_to_url", "url": url})).await;
    assert!(r.system.is_none(), "{r:?}");
    // Killed right before an action that touches no page (a screenshot only reads the state):
    // whether the death is noticed before the action or only when the state is read, the
    // answer is the fresh browser's state and the note, never a missing state.
    kill_chromium(sb.as_ref()).await;
    let r = restarted(&tool, json!({"action": "screenshot"})).await;
    assert!(r.output.contains("URL: \"about:blank\""), "{}", r.output);
    let r = ok(&tool, json!({"action": "go_to_url", "url": url})).await;
    assert!(r.system.is_none(), "{r:?}");

    // Shutdown leaves no Chromium and no relay behind.
    tool.shutdown().await;
    assert!(tool.current_state().await.is_none());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(chromium_processes(sb.as_ref()).await, "");
    let socat = sb
        .exec(ExecRequest::shell_line("pgrep -a socat || true"))
        .await
        .unwrap();
    assert_eq!(socat.stdout_lossy().trim(), "");
}

/// A page that answers for a few seconds, then keeps its renderer busy for good: the state
/// read after the next action waits on it when the sandbox dies.
const BUSY_SOON: &str = "<!doctype html><html><head><title>Busy soon</title></head><body>\
    <p>busy soon</p><script>setTimeout(function () { for (;;) {} }, 3000);</script></body></html>";

/// Under gVisor an out-of-memory kill (from an exec beside the browser) takes the whole
/// sandbox; under runc, where it would take one process, the container is killed from outside
/// instead. The sandbox dies while the browser is reading the state after an action: the
/// action ends with the sandbox-gone error (under gVisor with the reason), not with a note
/// that the state could not be read, and not at the browser's own timeout.
#[tokio::test]
async fn a_sandbox_that_dies_under_the_browser_ends_its_action_as_gone() {
    let m = support::manager().await;
    let limits = LimitRequest {
        memory_mb: Some(512),
        ..Default::default()
    };
    let (s, _g) = support::session_with(&m, &limits).await;
    let sb = s.sandbox.clone();
    sb.write_file(&format!("{SITE}/busy.html"), BUSY_SOON.as_bytes())
        .await
        .unwrap();
    let tool = BrowserUse::new(sb.clone());
    let url = format!("file://{SITE}/busy.html");
    ok(&tool, json!({"action": "go_to_url", "url": url})).await;

    let gvisor = support::under_gvisor();
    let container = s.handle.clone();
    // Two seconds into the state read of the wait below (the page is busy by then).
    let death = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(7)).await;
        if gvisor {
            let mut bomb = ExecRequest::new([
                "python3",
                "-c",
                "x = bytearray(2048 * 1024 * 1024); print(len(x))",
            ]);
            bomb.timeout = Duration::from_secs(60);
            // The bomb's own exec ends with the sandbox; what matters is the browser's answer.
            let _ = sb.exec(bomb).await;
        } else {
            let kill = std::process::Command::new("docker")
                .args(["kill", &container])
                .output()
                .unwrap();
            assert!(kill.status.success(), "{kill:?}");
        }
    });
    let wait = json!({"action": "wait", "seconds": 5});
    let err = tool
        .execute(wait, &ToolContext::default())
        .await
        .expect_err("a dead sandbox has no browser to answer");
    let text = err.to_string();
    assert!(
        matches!(err, ToolError::Sandbox(SandboxError::SandboxGone { .. }))
            && !text.contains("did not answer"),
        "{text}"
    );
    if gvisor {
        // The backend's reason for the stop. Which of its two wordings it gives depends on
        // Docker's OOMKilled flag; one run of four on a loaded host did not get the OOM one
        // here (beside Chromium, the cause is not pinned down), so either gVisor reason is
        // accepted; the memory bomb's own wording is runtime_abuse's test.
        assert!(
            text.contains("under gVisor (runsc) the whole sandbox stops")
                || text.contains("ran out of memory (limit 512 MiB)"),
            "{text}"
        );
    }
    death.await.unwrap();
    // The next action starts no browser in vain: the sandbox is gone, and says so.
    let err = tool
        .execute(json!({"action": "screenshot"}), &ToolContext::default())
        .await
        .expect_err("the sandbox stays gone");
    assert!(
        matches!(err, ToolError::Sandbox(SandboxError::SandboxGone { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn two_sessions_see_only_their_own_browser() {
    let m = support::manager().await;
    let (a, _ga) = support::session(&m).await;
    let (b, _gb) = support::session(&m).await;
    // The same address in both containers serves different pages.
    for (s, name) in [(&a, "Alpha"), (&b, "Bravo")] {
        let page = format!(
            "<html><head><title>{name}</title></head><body><button>{name} button</button></body></html>"
        );
        s.sandbox
            .write_file(&format!("{SITE}/index.html"), page.as_bytes())
            .await
            .unwrap();
        let out = s
            .sandbox
            .shell(
                &format!(
                    "cd {SITE} && (python3 -m http.server 8000 --bind 127.0.0.1 > /tmp/http.log 2>&1 &) && \
                     for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done"
                ),
                Default::default(),
            )
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0));
    }
    let ta = BrowserUse::new(a.sandbox.clone());
    let tb = BrowserUse::new(b.sandbox.clone());
    let args = json!({"action": "go_to_url", "url": "http://localhost:8000/index.html"});
    let (ra, rb) = tokio::join!(ok(&ta, args.clone()), ok(&tb, args.clone()));
    assert!(
        ra.output.contains("Title: \"Alpha\"") && !ra.output.contains("Bravo"),
        "{}",
        ra.output
    );
    assert!(
        rb.output.contains("Title: \"Bravo\"") && !rb.output.contains("Alpha"),
        "{}",
        rb.output
    );
    // Each browser has only its own tab.
    let sa = ta.current_state().await.unwrap();
    let sb = tb.current_state().await.unwrap();
    assert_eq!(sa.tabs.len(), 1);
    assert_eq!(sb.tabs.len(), 1);
    assert_eq!(sa.title, "Alpha");
    assert_eq!(sb.title, "Bravo");
    ta.shutdown().await;
    tb.shutdown().await;
}

#[tokio::test]
async fn a_tunnel_serves_one_connection_of_this_process_only() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    serve_site(s.sandbox.as_ref()).await;

    // Our own connection gets through to the server inside the container.
    let tunnel = Tunnel::open(s.sandbox.clone(), 8000, "test-tunnel")
        .await
        .unwrap();
    let mut conn = tokio::net::TcpStream::connect(tunnel.addr()).await.unwrap();
    conn.write_all(b"GET /page2.html HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut body = Vec::new();
    conn.read_to_end(&mut body).await.unwrap();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.starts_with("HTTP/1.0 200") && body.contains("Second page"),
        "{body}"
    );
    // The listener is gone after that one connection.
    assert!(tokio::net::TcpStream::connect(tunnel.addr()).await.is_err());

    // A connection from another local process is dropped without a byte relayed.
    let tunnel = Tunnel::open(s.sandbox.clone(), 8000, "test-tunnel")
        .await
        .unwrap();
    let port = tunnel.addr().port();
    let other = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port} || exit 9; printf 'GET /page2.html HTTP/1.0\\r\\n\\r\\n' >&3; timeout 5 cat <&3"
        ))
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&other.stdout),
        "",
        "another process got through"
    );
    assert_ne!(
        other.status.code(),
        Some(9),
        "the other process could not even connect"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(tunnel.is_closed());
    // Nor can the rightful owner use it afterwards: a tunnel is one connection, then gone.
    assert!(tokio::net::TcpStream::connect(tunnel.addr()).await.is_err());
}
