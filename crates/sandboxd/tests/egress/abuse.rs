//! The egress proxy under abuse: a sandbox opening a thousand connections or pulling more
//! than a connection may carry is cut at the caps with records that say why; a second helper
//! finds the port taken; a helper that breaks the protocol loses its channel and exits.

use std::sync::Arc;
use std::time::Duration;

use sandboxd_core::config::EgressConfig;
use sandboxd_core::egress::{EgressError, EgressProxy};

use super::support::{self, Collect, Switch, curl, opts};
use crate::support as base;

#[tokio::test]
async fn a_thousand_connections_and_a_big_download_are_cut_at_the_caps() {
    let web = support::http_server("caps").await;
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    let config = EgressConfig {
        connections: 4,
        connection_mb: 1,
        ..EgressConfig::default()
    };
    let audit = Arc::new(Collect::default());
    let deps = support::deps(config, &[web.port], Switch::new("good.test"), audit.clone());
    let proxy = EgressProxy::start(sb.clone(), deps).await.unwrap();

    // 8 MiB asked for, 1 MiB (both ways) allowed.
    let big = curl(&format!(
        "-o /dev/null -w 'size=%{{size_download}}' http://good.test:{}/big",
        web.port
    ));
    let out = sb.shell(&big, opts()).await.unwrap();
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    let size: u64 = out
        .stdout_lossy()
        .trim_start_matches("size=")
        .parse()
        .unwrap();
    assert!(size > 0 && size < 1 << 20, "{out:?}");
    let rec = audit.of("good.test", 0).await;
    assert_eq!(rec.rule, "connection-bytes", "{rec:?}");
    assert_eq!(rec.bytes_up + rec.bytes_down, 1 << 20, "{rec:?}");
    assert!(rec.reason.unwrap().contains("connection_mb"));

    // A thousand connections one after another, the allowed ones held open: four tunnels,
    // every other connection refused with the rule.
    let script = format!(
        r#"
import socket
req = b"CONNECT good.test:{port} HTTP/1.1\r\nHost: good.test\r\n\r\n"
kept, counts = [], {{}}
for i in range(1000):
    s = socket.create_connection(("127.0.0.1", 3128), 30)
    s.sendall(req)
    head = b""
    while b"\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    status = head.split(b" ")[1].decode() if b" " in head else "none"
    refused_by = [l for l in head.split(b"\r\n") if l.startswith(b"X-Sandboxd-Refused")]
    counts[status] = counts.get(status, 0) + 1
    if status == "200":
        kept.append(s)
    else:
        s.close()
print(sorted(counts.items()))
open("/tmp/held", "w").write("held")
import sys
sys.stdin.read()
"#,
        port = web.port
    );
    sb.write_file("/workspace/many.py", script.as_bytes())
        .await
        .unwrap();
    // Run in the background so the four tunnels stay open while the test looks.
    let out = sb
        .shell(
            "(python3 /workspace/many.py > /workspace/many.out 2>&1 < /dev/zero &) ; \
             for i in $(seq 1200); do [ -e /tmp/held ] && break; sleep 0.1; done; cat /workspace/many.out",
            opts(),
        )
        .await
        .unwrap();
    assert_eq!(
        out.stdout_lossy().trim(),
        "[('200', 4), ('403', 996)]",
        "{out:?}"
    );
    let records = audit
        .wait("996 refusals by the connections cap", |r| {
            r.iter().filter(|r| r.rule == "connections").count() == 996
        })
        .await;
    assert!(
        records
            .iter()
            .filter(|r| r.rule == "connections")
            .all(|r| !r.allowed)
    );
    assert_eq!(proxy.stats().open_connections, 4);
    proxy.stop().await;
    // Stopping ended the four tunnels, each with its record.
    let records = audit.records.lock().unwrap().clone();
    assert_eq!(
        records
            .iter()
            .filter(|r| r.allowed && r.rule == "good.test")
            .count(),
        4
    );
}

#[tokio::test]
async fn a_second_helper_finds_the_port_taken_and_a_stopped_one_frees_it() {
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    let deps = || {
        support::deps(
            EgressConfig::default(),
            &[],
            Switch::new("any"),
            Arc::new(Collect::default()),
        )
    };
    let first = EgressProxy::start(sb.clone(), deps()).await.unwrap();
    let second = EgressProxy::start(sb.clone(), deps()).await;
    assert!(
        matches!(second, Err(EgressError::PortTaken)),
        "{:?}",
        second.err()
    );
    first.stop().await;
    let again = EgressProxy::start(sb.clone(), deps()).await.unwrap();
    assert!(again.is_running());
    again.stop().await;
}

/// A fake helper: says hello, then misbehaves as `argv[1]` says, then waits for the host to
/// close its stdin and leaves a mark that it saw it.
const FAKE: &str = r#"
import os, struct, sys
def frame(i, k, p=b""):
    return struct.pack(">IBI", i, k, len(p)) + p
out = os.fdopen(1, "wb", 0)
out.write(frame(0, 1, b"sandboxd-egress/1"))
mode = sys.argv[1]
if mode == "garbage":
    out.write(b"\xff" * 64)
elif mode == "unknown-id":
    out.write(frame(9, 3, b"x"))
elif mode == "credit":
    out.write(frame(1, 2) + frame(1, 6, struct.pack(">I", 1)))
elif mode == "huge":
    out.write(struct.pack(">IBI", 1, 3, 1 << 31))
elif mode == "reused-id":
    out.write(frame(1, 2) + frame(1, 2))
sys.stdin.buffer.read()
open("/tmp/fake-" + mode, "w").write("the host closed stdin")
"#;

#[tokio::test]
async fn a_helper_that_breaks_the_protocol_loses_its_channel() {
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    for mode in ["garbage", "unknown-id", "credit", "huge", "reused-id"] {
        let audit = Arc::new(Collect::default());
        let deps = support::deps(EgressConfig::default(), &[], Switch::new("any"), audit);
        let argv = ["/usr/bin/python3", "-c", FAKE, mode]
            .map(String::from)
            .to_vec();
        let proxy = EgressProxy::start_command(sb.clone(), deps, argv)
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while proxy.is_running() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{mode}: still running"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // `stop` returns once the helper exited: it saw its stdin closed first.
        proxy.stop().await;
        let mark = sb
            .shell(&format!("cat /tmp/fake-{mode}"), opts())
            .await
            .unwrap();
        assert_eq!(
            mark.stdout_lossy(),
            "the host closed stdin",
            "{mode}: {mark:?}"
        );
    }
}
