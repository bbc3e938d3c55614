//! The egress proxy's per-connection limits in time and rate, from inside a real sandbox:
//! starts beyond `[egress] requests_per_minute` are refused with rule `rate` and the reason,
//! and an open tunnel that moves no byte for `[egress] idle_secs` is closed with rule `idle`
//! while one that keeps moving bytes past that time is not.

use std::sync::Arc;

use sandboxd_core::config::EgressConfig;
use sandboxd_core::egress::EgressProxy;

use super::support::{self, Collect, Switch, curl, opts};
use crate::support as base;

#[tokio::test]
async fn requests_beyond_the_rate_are_refused_with_the_rule_and_audited() {
    let web = support::http_server("rate").await;
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    // Three a minute: the bucket refills one start every 20 s, far longer than six curls take.
    let config = EgressConfig {
        requests_per_minute: 3,
        ..EgressConfig::default()
    };
    let audit = Arc::new(Collect::default());
    let deps = support::deps(config, &[web.port], Switch::new("good.test"), audit.clone());
    let proxy = EgressProxy::start(sb.clone(), deps).await.unwrap();
    let one = curl(&format!(
        "-o /workspace/body -w '%{{http_code}} ' -D /workspace/head http://good.test:{}/n",
        web.port
    ));
    let script = format!(
        "for i in 1 2 3 4 5 6; do {one} 2>/dev/null; \
         grep -i '^x-sandboxd-refused' /workspace/head | tr -d '\\r' >> /workspace/rules; done; \
         echo; cat /workspace/rules; cat /workspace/body"
    );
    let out = sb.shell(&script, opts()).await.unwrap();
    let text = out.stdout_lossy();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap_or_default().trim(),
        "200 200 200 403 403 403",
        "{out:?}"
    );
    for _ in 0..3 {
        assert_eq!(
            lines.next().unwrap_or_default(),
            "X-Sandboxd-Refused: rate",
            "{out:?}"
        );
    }
    // The refusal's body (the last one's) says which setting refused it.
    assert!(text.contains("requests_per_minute"), "{out:?}");
    assert_eq!(
        web.hits(),
        3,
        "the refused requests never reached the server"
    );
    let records = audit
        .wait("three allowed and three refused by rate", |r| r.len() == 6)
        .await;
    let allowed: Vec<_> = records.iter().filter(|r| r.allowed).collect();
    assert_eq!(allowed.len(), 3, "{records:#?}");
    assert!(
        allowed.iter().all(|r| r.rule == "good.test"),
        "{records:#?}"
    );
    let refused: Vec<_> = records.iter().filter(|r| !r.allowed).collect();
    assert_eq!(refused.len(), 3, "{records:#?}");
    for r in refused {
        assert_eq!((r.rule.as_str(), r.host.as_str()), ("rate", "good.test"));
        let reason = r.reason.as_deref().unwrap_or_default();
        assert!(reason.contains("3 requests per minute"), "{reason}");
        assert_eq!(r.bytes_down, 0, "{r:?}");
    }
    proxy.stop().await;
}

/// Opens a tunnel to good.test and keeps it silent, and a second one that trickles a request
/// head one byte a second for `trickle` seconds; prints how each ended.
const TUNNELS: &str = r#"
import socket, sys, threading, time
port, trickle = int(sys.argv[1]), int(sys.argv[2])
def tunnel():
    s = socket.create_connection(("127.0.0.1", 3128), 30)
    s.settimeout(120)
    s.sendall(b"CONNECT good.test:%d HTTP/1.1\r\nHost: good.test\r\n\r\n" % port)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    return s
out = {}
def silent():
    s = tunnel()
    out["silent"] = "closed" if s.recv(4096) == b"" else "data"
def busy():
    s = tunnel()
    s.sendall(b"GET /busy HTTP/1.1\r\nHost: good.test\r\nX-Slow: ")
    for _ in range(trickle):
        time.sleep(1)
        s.sendall(b"a")
    s.sendall(b"\r\n\r\n")
    body = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        body += chunk
    out["busy"] = "answered" if b"hello idle /busy" in body else repr(body)
threads = [threading.Thread(target=f) for f in (silent, busy)]
for t in threads: t.start()
for t in threads: t.join()
print(out["silent"], out["busy"])
"#;

#[tokio::test]
async fn a_silent_tunnel_is_closed_after_idle_secs_and_a_busy_one_is_not() {
    let web = support::http_server("idle").await;
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    let config = EgressConfig {
        idle_secs: 2,
        ..EgressConfig::default()
    };
    let audit = Arc::new(Collect::default());
    let deps = support::deps(config, &[web.port], Switch::new("good.test"), audit.clone());
    let proxy = EgressProxy::start(sb.clone(), deps).await.unwrap();
    sb.write_file("/workspace/tunnels.py", TUNNELS.as_bytes())
        .await
        .unwrap();
    // The busy tunnel moves a byte a second for 6 s: three times the idle limit in all.
    let cmd = format!("python3 /workspace/tunnels.py {} 6 2>&1", web.port);
    let out = sb.shell(&cmd, opts()).await.unwrap();
    assert_eq!(out.stdout_lossy().trim(), "closed answered", "{out:?}");
    let records = audit.wait("both tunnels recorded", |r| r.len() == 2).await;
    let idle: Vec<_> = records.iter().filter(|r| r.rule == "idle").collect();
    assert_eq!(idle.len(), 1, "only the silent tunnel is cut: {records:#?}");
    let cut = idle[0];
    assert!(cut.allowed, "it was allowed, then cut: {cut:?}");
    assert_eq!((cut.bytes_up, cut.bytes_down), (0, 0), "{cut:?}");
    let reason = cut.reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("2 s") && reason.contains("idle_secs"),
        "{reason}"
    );
    let busy = records.iter().find(|r| r.rule != "idle").unwrap();
    assert_eq!(
        (busy.rule.as_str(), busy.reason.as_deref()),
        ("good.test", None),
        "{busy:?}"
    );
    assert!(busy.bytes_down > 0, "{busy:?}");
    proxy.stop().await;
}
