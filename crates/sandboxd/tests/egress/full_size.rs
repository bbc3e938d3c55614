//! The caps at full size (issue 24's "Caps" test): a sandbox pulling 1 GiB through its proxy
//! is cut at the session's byte cap to the byte, across four parallel connections; a thousand
//! connections held at once are cut at the connection cap (the default 64), the allowed ones
//! each left with an unread download; the test process's peak RSS stays flat through both
//! (the credit windows bound what the host holds per connection); and another session's
//! proxied request succeeds while the first one's pull and its thousand connections go on.

use std::sync::Arc;
use std::time::Duration;

use sandboxd_core::config::EgressConfig;
use sandboxd_core::egress::{EgressProxy, EgressRecord};
use sandboxd_core::sandbox::Sandbox;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use super::support::{self, Collect, Switch, curl, opts};
use crate::support as base;
use crate::support::rss::Peak;

const MIB: u64 = 1 << 20;
/// What the sandbox asks for in all: four downloads of 256 MiB.
const PULLS: u64 = 4;
const PULL_MIB: u64 = 256;
/// The session's byte cap in the pull: half of what is asked for.
const SESSION_MB: u64 = 512;
/// The most the test process's peak RSS may grow. The proxy holds at most two credit windows
/// (256 KiB each) and a 64 KiB read buffer per connection: 64 connections are ~37 MiB; the
/// rest is room for the runtime, the engine's streams and the server's buffers. A proxy that
/// buffered what the sandbox does not read would grow by hundreds of MiB here.
const RSS_BOUND_MIB: u64 = 200;

/// A server on the host: `GET /gig/N` answers N MiB of zeros, anything else a short page.
async fn bulk_server() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind(("0.0.0.0", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Some(path) = support::request_path(&mut s).await else {
                    return;
                };
                let path = path.split('?').next().unwrap_or_default();
                let mib: u64 = path
                    .rsplit('/')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|_| path.contains("/gig/"))
                    .unwrap_or(0);
                let (len, body) = if mib > 0 {
                    (mib * MIB, None)
                } else {
                    (6, Some(b"hello\n".as_slice()))
                };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                );
                if s.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                if let Some(body) = body {
                    let _ = s.write_all(body).await;
                    return;
                }
                let chunk = vec![0u8; 64 * 1024];
                for _ in 0..len / chunk.len() as u64 {
                    if s.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, task)
}

/// Four parallel GETs of `PULL_MIB` MiB through the proxy; prints the bytes each got.
fn pull_script(port: u16) -> String {
    format!(
        r#"
import json, socket, threading
got = [0] * {PULLS}
def pull(k):
    s = socket.create_connection(("127.0.0.1", 3128), 60)
    s.sendall(b"GET http://good.test:{port}/gig/{PULL_MIB}?%d HTTP/1.1\r\nHost: good.test\r\n\r\n" % k)
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        got[k] += len(b)
ts = [threading.Thread(target=pull, args=(k,)) for k in range({PULLS})]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(got))
"#
    )
}

/// A thousand CONNECTs, one after another, held open; each allowed tunnel asks for 64 MiB
/// that it never reads. Prints the statuses, then waits on stdin.
fn many_script(port: u16) -> String {
    format!(
        r#"
import socket, sys
req = b"CONNECT good.test:{port} HTTP/1.1\r\nHost: good.test\r\n\r\n"
kept, counts = [], {{}}
for i in range(1000):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.settimeout(60)
    s.connect(("127.0.0.1", 3128))
    s.sendall(req)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    status = head.split(b" ")[1].decode() if b" " in head else "none"
    counts[status] = counts.get(status, 0) + 1
    if status == "200":
        s.sendall(b"GET /gig/64 HTTP/1.1\r\nHost: good.test\r\n\r\n")
        kept.append(s)
    else:
        s.close()
print(sorted(counts.items()), flush=True)
open("/tmp/held", "w").write("held")
sys.stdin.read()
"#
    )
}

fn session_bytes_moved(records: &[EgressRecord]) -> u64 {
    records.iter().map(|r| r.bytes_up + r.bytes_down).sum()
}

/// Another session's request through its own proxy: it must succeed.
async fn other_session_request(sb: &Arc<dyn Sandbox>, port: u16) {
    let out = sb
        .shell(&curl(&format!("http://good.test:{port}/")), opts())
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(out.stdout_lossy(), "hello\n", "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_and_a_thousand_connections_are_cut_at_the_caps_with_the_host_flat() {
    let (port, server) = bulk_server().await;
    let m = base::manager().await;
    let ((a, _ga), (b, _gb)) = tokio::join!(base::session(&m), base::session(&m));
    let (sa, sb) = (a.sandbox.clone(), b.sandbox.clone());
    let other = support::deps(
        EgressConfig::default(),
        &[port],
        Switch::new("good.test"),
        Arc::new(Collect::default()),
    );
    let other = EgressProxy::start(sb.clone(), other).await.unwrap();
    sa.write_file("/workspace/pull.py", pull_script(port).as_bytes())
        .await
        .unwrap();
    sa.write_file("/workspace/many.py", many_script(port).as_bytes())
        .await
        .unwrap();
    let peak = Peak::start().await;

    // 1 GiB asked for, 512 MiB allowed to the session, shared by four connections.
    let config = EgressConfig {
        connection_mb: 4 * PULL_MIB,
        session_mb: SESSION_MB,
        ..EgressConfig::default()
    };
    let audit = Arc::new(Collect::default());
    let deps = support::deps(config, &[port], Switch::new("good.test"), audit.clone());
    let proxy = EgressProxy::start(sa.clone(), deps).await.unwrap();
    let pull = async {
        let opts = sandboxd_core::sandbox::ShellOptions {
            timeout: Duration::from_secs(300),
            ..sandboxd_core::sandbox::ShellOptions::default()
        };
        sa.shell("python3 /workspace/pull.py", opts).await.unwrap()
    };
    let meanwhile = async {
        // Once the pull is under way (waited for at most a minute: a bound, not a
        // measurement), the other session asks for a page.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while proxy.stats().bytes_down < 32 * MIB && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        other_session_request(&sb, port).await;
        proxy.stats().open_connections
    };
    let (out, open_then) = tokio::join!(pull, meanwhile);
    println!("the other session's request went while {open_then} pulls were open");
    let got: Vec<u64> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let records = audit
        .wait("the four pulls' records", |r| r.len() as u64 >= PULLS)
        .await;
    assert_eq!(
        session_bytes_moved(&records),
        SESSION_MB * MIB,
        "{records:#?}"
    );
    assert!(
        records.iter().any(|r| r.rule == "session-bytes"),
        "{records:#?}"
    );
    // Everything the proxy sent before the cut reached the client.
    let down: u64 = records.iter().map(|r| r.bytes_down).sum();
    assert_eq!(got.iter().sum::<u64>(), down, "{got:?} {records:#?}");
    // The budget is spent: the next connection is refused before it is made.
    let again = sa
        .shell(&curl(&format!("http://good.test:{port}/")), opts())
        .await
        .unwrap();
    assert!(again.stderr_lossy().contains("session-bytes"), "{again:?}");
    proxy.stop().await;
    let after_pull = peak.growth_mib();

    // A thousand connections against the default cap of 64, each allowed one stalled.
    let config = EgressConfig {
        requests_per_minute: 10_000,
        session_mb: 100_000,
        ..EgressConfig::default()
    };
    let cap = u64::from(config.connections);
    let audit = Arc::new(Collect::default());
    let deps = support::deps(config, &[port], Switch::new("good.test"), audit.clone());
    let proxy = EgressProxy::start(sa.clone(), deps).await.unwrap();
    let out = sa
        .shell(
            "rm -f /tmp/held; (python3 /workspace/many.py > /workspace/many.out 2>&1 < /dev/zero &) ; \
             for i in $(seq 1800); do [ -e /tmp/held ] && break; sleep 0.1; done; cat /workspace/many.out",
            opts(),
        )
        .await
        .unwrap();
    assert_eq!(
        out.stdout_lossy().trim(),
        format!("[('200', {cap}), ('403', {})]", 1000 - cap),
        "{out:?}"
    );
    let records = audit
        .wait("the refusals by the connections cap", |r| {
            r.iter().filter(|r| r.rule == "connections").count() as u64 == 1000 - cap
        })
        .await;
    assert!(
        records
            .iter()
            .filter(|r| r.rule == "connections")
            .all(|r| !r.allowed)
    );
    assert_eq!(proxy.stats().open_connections, cap);
    // The thousand are held (and the 64 stalled): the other session is still served.
    other_session_request(&sb, port).await;
    let stalled = proxy.stats().bytes_down;
    proxy.stop().await;
    other.stop().await;
    server.abort();

    let growth = peak.growth_mib();
    println!(
        "test process peak RSS: {} MiB; growth over the start: {after_pull} MiB after the 1 GiB pull, {growth} MiB after the 1,000 connections ({} MiB sent into the 64 stalled tunnels)",
        peak.peak_mib(),
        stalled / MIB
    );
    assert!(growth < RSS_BOUND_MIB, "the host grew by {growth} MiB");
}
