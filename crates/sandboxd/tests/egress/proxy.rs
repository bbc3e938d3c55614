//! The egress proxy against the real engine and image: a sandbox with no network device
//! reaches allowed local servers through 127.0.0.1:3128 (HTTP forwarded, HTTPS by CONNECT),
//! everything else is refused with the rule that refused it, and the SSRF rules hold
//! through the proxy exactly as they do for web_fetch.

use std::sync::Arc;

use sandboxd_core::config::EgressConfig;
use sandboxd_core::egress::EgressProxy;

use super::support::{self, Collect, Switch, curl, opts};
use crate::support as base;

#[tokio::test]
async fn the_sandbox_has_only_lo_and_no_route_out_with_or_without_the_proxy() {
    let web = support::http_server("direct").await;
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    let out = sb.shell("ls /sys/class/net", opts()).await.unwrap();
    assert_eq!(
        out.stdout_lossy().split_whitespace().collect::<Vec<_>>(),
        ["lo"]
    );
    let host = support::host_address();
    let direct = format!(
        "curl -sS --max-time 20 http://{host}:{}/ ; echo exit=$?",
        web.port
    );
    let off = sb.shell(&direct, opts()).await.unwrap();
    assert!(!off.stdout_lossy().contains("exit=0"), "{off:?}");
    assert!(!off.stdout_lossy().contains("hello"), "{off:?}");
    // With an allowlist proxy running, a client that does not use it is still cut off.
    let audit = Arc::new(Collect::default());
    let deps = support::deps(
        EgressConfig::default(),
        &[web.port],
        Switch::new("good.test"),
        audit,
    );
    let proxy = EgressProxy::start(sb.clone(), deps).await.unwrap();
    let on = sb.shell(&direct, opts()).await.unwrap();
    assert!(!on.stdout_lossy().contains("exit=0"), "{on:?}");
    let raw = sb
        .shell("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 5)\" 2>&1 | tail -1", opts())
        .await
        .unwrap();
    assert!(
        raw.stdout_lossy().contains("Network is unreachable"),
        "{raw:?}"
    );
    assert_eq!(web.hits(), 0);
    assert!(proxy.is_running());
    proxy.stop().await;
}

#[tokio::test]
async fn allowed_hosts_are_reached_by_http_and_connect_and_others_refused_with_the_rule() {
    let web = support::http_server("plain").await;
    let (tls, pem) = support::https_server("tls").await;
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    sb.write_file("/workspace/ca.pem", pem.as_bytes())
        .await
        .unwrap();
    let audit = Arc::new(Collect::default());
    let deps = support::deps(
        EgressConfig::default(),
        &[web.port, tls.port],
        Switch::new("good.test"),
        audit.clone(),
    );
    let proxy = EgressProxy::start(sb.clone(), deps).await.unwrap();

    let get = sb
        .shell(
            &curl(&format!("http://good.test:{}/page", web.port)),
            opts(),
        )
        .await
        .unwrap();
    assert_eq!(get.stdout_lossy(), "hello plain /page\n", "{get:?}");
    let rec = audit.of("good.test", 0).await;
    assert!(
        rec.allowed && rec.rule == "good.test" && rec.method == "GET",
        "{rec:?}"
    );
    assert!(rec.bytes_up > 0 && rec.bytes_down > 0, "{rec:?}");

    let https = format!(
        "--cacert /workspace/ca.pem https://good.test:{}/secure",
        tls.port
    );
    let got = sb.shell(&curl(&https), opts()).await.unwrap();
    assert_eq!(got.stdout_lossy(), "hello tls /secure\n", "{got:?}");
    let rec = audit.of("good.test", 1).await;
    assert!(
        rec.allowed && rec.method == "CONNECT" && rec.port == tls.port,
        "{rec:?}"
    );

    // Another host: a CONNECT gets a 403 naming the rule, a forwarded GET an HTML page.
    let other = sb
        .shell(
            &curl(&format!("-k https://other.test:{}/", tls.port)),
            opts(),
        )
        .await
        .unwrap();
    assert_ne!(other.exit_code, Some(0));
    assert!(other.stderr_lossy().contains("403"), "{other:?}");
    assert!(
        other
            .stderr_lossy()
            .contains("X-Sandboxd-Refused: not in the allowlist"),
        "{other:?}"
    );
    let page = sb
        .shell(
            &curl(&format!("'http://other.test:{}/<x>'", web.port)),
            opts(),
        )
        .await
        .unwrap();
    let body = page.stdout_lossy();
    assert!(
        body.contains("<h1>Refused by sandboxd's egress proxy</h1>"),
        "{page:?}"
    );
    assert!(
        body.contains("not in the allowlist") && !body.contains("<x>"),
        "{body}"
    );
    let rec = audit.of("other.test", 1).await;
    assert!(
        !rec.allowed && rec.rule == "not in the allowlist",
        "{rec:?}"
    );
    assert_eq!((web.hits(), tls.hits()), (1, 1));
    let stats = proxy.stats();
    assert_eq!(
        (stats.connections_total, stats.connections_refused),
        (4, 2),
        "{stats:?}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn ssrf_through_the_proxy_is_refused_and_the_secret_server_sees_nothing() {
    let secret = support::http_server("secret").await;
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    let audit = Arc::new(Collect::default());
    let deps = support::deps(
        EgressConfig::default(),
        &[secret.port],
        Switch::new("any"),
        audit.clone(),
    );
    let proxy = EgressProxy::start(sb.clone(), deps).await.unwrap();
    let host = support::host_address();
    let p = secret.port;
    let cases = [
        (
            format!("-p http://127.0.0.1:{p}/"),
            "denied-address",
            "127.0.0.1",
        ),
        ("-p http://127.0.0.1:22/".to_string(), "port", "127.0.0.1"),
        (
            format!("-p http://mixed.test:{p}/"),
            "resolves-to-denied",
            "mixed.test",
        ),
        (
            "-p http://169.254.169.254/".to_string(),
            "denied-address",
            "169.254.169.254",
        ),
        (
            format!("-p http://{host}:{p}/"),
            "denied-address",
            &host.to_string(),
        ),
        (format!("http://localhost:{p}/"), "denied-name", "localhost"),
        (format!("http://0x7f.1:{p}/"), "denied-address", "127.0.0.1"),
        (
            format!("http://[::ffff:127.0.0.1]:{p}/"),
            "denied-address",
            "[::ffff:7f00:1]",
        ),
    ];
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for (args, rule, recorded) in &cases {
        let out = sb.shell(&curl(args), opts()).await.unwrap();
        assert!(
            out.stderr_lossy()
                .contains(&format!("X-Sandboxd-Refused: {rule}")),
            "{args}: {out:?}"
        );
        let nth = seen.entry(recorded.to_string()).or_default();
        let rec = audit.of(recorded, *nth).await;
        *nth += 1;
        assert!(!rec.allowed && rec.rule == *rule, "{args}: {rec:?}");
    }
    assert_eq!(secret.hits(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn a_policy_change_takes_effect_on_the_next_connection() {
    let web = support::http_server("switch").await;
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    let audit = Arc::new(Collect::default());
    let policy = Switch::new("off");
    let deps = support::deps(
        EgressConfig::default(),
        &[web.port],
        policy.clone(),
        audit.clone(),
    );
    let proxy = EgressProxy::start(sb.clone(), deps).await.unwrap();
    let url = curl(&format!("http://good.test:{}/", web.port));
    let out = sb.shell(&url, opts()).await.unwrap();
    assert!(
        out.stderr_lossy()
            .contains("X-Sandboxd-Refused: egress off"),
        "{out:?}"
    );
    policy.set("*.example,good.test");
    let out = sb.shell(&url, opts()).await.unwrap();
    assert_eq!(out.stdout_lossy(), "hello switch /\n", "{out:?}");
    policy.set("any,!good.test");
    let out = sb.shell(&url, opts()).await.unwrap();
    assert!(
        out.stderr_lossy()
            .contains("X-Sandboxd-Refused: !good.test"),
        "{out:?}"
    );
    let rules: Vec<String> = audit
        .wait("three records", |r| r.len() == 3)
        .await
        .into_iter()
        .map(|r| r.rule)
        .collect();
    assert_eq!(rules, ["egress off", "good.test", "!good.test"]);
    // The admin's widest still bounds a session policy that is wider. `stop` returns once
    // the helper has exited, so the next one finds the port free.
    proxy.stop().await;
    let config = EgressConfig {
        widest: "other.test".parse().unwrap(),
        ..EgressConfig::default()
    };
    let audit = Arc::new(Collect::default());
    let deps = support::deps(config, &[web.port], Switch::new("any"), audit.clone());
    let proxy = EgressProxy::start(sb.clone(), deps).await.unwrap();
    let out = sb.shell(&url, opts()).await.unwrap();
    assert!(
        out.stderr_lossy()
            .contains("X-Sandboxd-Refused: not in the allowlist"),
        "{out:?}"
    );
    assert_eq!(web.hits(), 1);
    proxy.stop().await;
}

/// Serves what it is handed itself: answers the tunnel's first request with its own text.
struct Answering;

#[async_trait::async_trait]
impl sandboxd_core::egress::Intercept for Answering {
    fn wants(&self, host: &str, _port: u16) -> bool {
        host == "good.test"
    }

    async fn serve(
        &self,
        mut client: tokio::io::DuplexStream,
        _upstream: tokio::net::TcpStream,
        host: &str,
    ) -> Result<(), String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = client.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("the client left".into());
            }
            head.extend_from_slice(&buf[..n]);
        }
        let body = format!("intercepted {host}\n");
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        client
            .write_all(reply.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        client.shutdown().await.map_err(|e| e.to_string())
    }
}

#[tokio::test]
async fn a_connect_the_interceptor_wants_is_handed_to_it_and_still_counted() {
    let web = support::http_server("tunneled").await;
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    let audit = Arc::new(Collect::default());
    let deps = support::deps(
        EgressConfig::default(),
        &[web.port],
        Switch::new("good.test,other.test"),
        audit.clone(),
    );
    let proxy = EgressProxy::start_intercepting(sb.clone(), deps, Arc::new(Answering))
        .await
        .unwrap();
    // -p: a CONNECT tunnel even for http://, so the request inside is what the interceptor reads.
    let got = sb
        .shell(&curl(&format!("-p http://good.test:{}/", web.port)), opts())
        .await
        .unwrap();
    assert_eq!(got.stdout_lossy(), "intercepted good.test\n", "{got:?}");
    let rec = audit.of("good.test", 0).await;
    assert!(
        rec.allowed && rec.method == "CONNECT" && rec.bytes_down > 0 && rec.bytes_up > 0,
        "{rec:?}"
    );
    // Another allowed host is tunneled untouched.
    let other = sb
        .shell(
            &curl(&format!("-p http://other.test:{}/", web.port)),
            opts(),
        )
        .await
        .unwrap();
    assert_eq!(other.stdout_lossy(), "hello tunneled /\n", "{other:?}");
    // The interceptor got the connection to the checked address but did not use it.
    assert_eq!(web.hits(), 2);
    proxy.stop().await;
}
