//! The credential relay against a real HTTP/1.1 server (hyper) over real TLS (the harness is
//! `mitm_harness_tests.rs`). The proxy's own checks (policy, SSRF, caps) are not here: they
//! come before `intercept` is called.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::harness::*;
use super::*;
use crate::config::egress::EgressConfig;

#[tokio::test]
async fn the_upstream_gets_the_credential_and_the_sandbox_never_sees_it() {
    let up = upstream().await;
    let mut s = connect(&up, tls_for(&up)).await;
    // Two pipelined requests on one connection, each sending its own Authorization.
    let got = exchange(
        &mut s,
        b"GET /echo HTTP/1.1\r\nHost: api.mitm.test\r\nAuthorization: Bearer sandbox-own\r\nAccept-Encoding: gzip\r\n\r\n\
          GET /echo-chunked HTTP/1.1\r\nHost: api.mitm.test:443\r\nauthorization: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    s.relay.await.unwrap().expect("the relay ends cleanly");
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for req in &seen {
        let auth: Vec<_> = req
            .headers
            .iter()
            .filter(|(k, _)| k == "authorization")
            .collect();
        assert_eq!(
            auth.len(),
            1,
            "exactly one Authorization reached the upstream"
        );
        assert_eq!(auth[0].1, format!("Bearer {SECRET}"));
        let enc: Vec<_> = req
            .headers
            .iter()
            .filter(|(k, _)| k == "accept-encoding")
            .collect();
        assert_eq!(enc.len(), 1);
        assert_eq!(enc[0].1, "identity");
    }
    assert!(
        !seen
            .iter()
            .any(|r| r.headers.iter().any(|(_, v)| v.contains("sandbox-own")))
    );
    let text = String::from_utf8_lossy(&got);
    assert!(
        !contains(&got, SECRET),
        "the sandbox received the secret:\n{text}"
    );
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
    let masked = format!("Bearer {}", "*".repeat(SECRET.len()));
    // Echoed in the body (plain, then split across chunks) and in a response header: masked.
    assert_eq!(text.matches(&masked).count(), 4, "{text}");
    assert_eq!(s.counters.requests.load(Ordering::Relaxed), 2);
    assert!(s.counters.up() > 0 && s.counters.down() as usize == got.len());
}

#[tokio::test]
async fn a_chunked_upload_and_a_5_mib_download_stream_through() {
    let up = upstream().await;
    let mut s = connect(&up, tls_for(&up)).await;
    let mut req = b"POST /upload HTTP/1.1\r\nHost: api.mitm.test\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n".to_vec();
    let mut sent = Vec::new();
    for i in 0..3 {
        let chunk = pattern(i * 7, 100_000);
        req.extend_from_slice(format!("{:x};ext=1\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(&chunk);
        req.extend_from_slice(b"\r\n");
        sent.extend_from_slice(&chunk);
    }
    req.extend_from_slice(b"0\r\nX-Trailer: dropped\r\n\r\n");
    req.extend_from_slice(b"GET /big HTTP/1.1\r\nHost: api.mitm.test\r\nConnection: close\r\n\r\n");
    s.sandbox.write_all(&req).await.unwrap();
    s.sandbox.flush().await.unwrap();
    // Read until the /big body has begun and half a MiB of it is here, then open the gate:
    // a relay that held the response whole would never get this far.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let body_start = loop {
        let n = s.sandbox.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "the relay closed early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        // The /big head is the one with its length; its body starts after its empty line.
        let start = memchr::memmem::find(&got, b"content-length: 5242880\r\n")
            .and_then(|i| memchr::memmem::find(&got[i..], b"\r\n\r\n").map(|j| i + j + 4));
        if let Some(start) = start
            && got.len() - start >= 512 * 1024
        {
            break start;
        }
    };
    up.gate.notify_one();
    s.sandbox.read_to_end(&mut got).await.unwrap();
    s.relay.await.unwrap().expect("the relay ends cleanly");
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen[0].path, "/upload");
    assert_eq!(seen[0].body_len, sent.len());
    assert_eq!(seen[0].body_sha, hex::encode(Sha256::digest(&sent)));
    let text = String::from_utf8_lossy(&got[..body_start]);
    assert!(text.starts_with("HTTP/1.1 100 Continue\r\n\r\n"), "{text}");
    assert!(text.contains(&format!("len={}", sent.len())), "{text}");
    assert_eq!(got.len() - body_start, BIG, "the whole body arrived");
    assert!(
        got[body_start..] == pattern(0, BIG)[..],
        "the body arrived intact"
    );
    assert!(!contains(&got, SECRET));
}

/// Each hostile request is answered with its status, and nothing reaches the upstream.
#[tokio::test]
async fn hostile_request_heads_are_refused_before_the_upstream() {
    let up = upstream().await;
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: api.mitm.test\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40_000)
    );
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (huge.into_bytes(), 431),
        (b"\x16\x03\x01 garbage \x00\xff\r\n\r\n".to_vec(), 400),
        (
            b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n".to_vec(),
            421,
        ),
        (b"GET https://evil.example/x HTTP/1.1\r\n\r\n".to_vec(), 421),
        (
            b"GET / HTTP/1.1\r\nHost: api.mitm.test\r\nHost: api.mitm.test\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".to_vec(),
            501,
        ),
        (b"GET / HTTP/1.0\r\n\r\n".to_vec(), 505),
        (
            format!("GET / HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(150)).into_bytes(),
            431,
        ),
    ];
    for (request, status) in cases {
        let mut s = connect(&up, tls_for(&up)).await;
        let got = exchange(&mut s, &request).await;
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with(&format!("HTTP/1.1 {status} ")),
            "{status}: {text}"
        );
        assert!(text.contains("sandboxd egress proxy: "), "{text}");
        match s.relay.await.unwrap() {
            Err(MitmError::BadRequest { status: st, .. }) => assert_eq!(st, status),
            other => panic!("{status}: {other:?}"),
        }
        assert!(!contains(&got, SECRET));
    }
    assert!(
        up.seen.lock().unwrap().is_empty(),
        "a hostile request reached the upstream"
    );
}

/// A connection that reaches its byte cap is cut there, mid-body.
#[tokio::test]
async fn the_byte_cap_cuts_the_connection() {
    let up = upstream().await;
    up.gate.notify_one();
    let counters = Arc::new(MitmCounters::with_cap(2 * 1024 * 1024));
    let mut s = connect_with(&up, tls_for(&up), counters.clone()).await;
    let got = exchange(&mut s, b"GET /big HTTP/1.1\r\nHost: api.mitm.test\r\n\r\n").await;
    assert!(matches!(s.relay.await.unwrap(), Err(MitmError::Cap(c)) if c == 2 * 1024 * 1024));
    assert!(got.len() < BIG, "the whole body passed the cap");
    let moved = counters.up() + counters.down();
    assert!(
        moved > 2 * 1024 * 1024 && moved <= 2 * 1024 * 1024 + 64 * 1024,
        "{moved}"
    );
}

#[tokio::test]
async fn a_compressed_response_is_refused_not_passed_on() {
    let up = upstream().await;
    let mut s = connect(&up, tls_for(&up)).await;
    let got = exchange(&mut s, b"GET /gzip HTTP/1.1\r\nHost: api.mitm.test\r\n\r\n").await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 502 "), "{text}");
    assert!(text.contains("compressed"), "{text}");
    assert!(!text.contains("not really gzip"), "{text}");
    assert!(matches!(
        s.relay.await.unwrap(),
        Err(MitmError::BadResponse { .. })
    ));
}

/// Without the test's root the upstream's certificate is refused: interception is not blind.
#[tokio::test]
async fn the_upstream_certificate_is_verified() {
    let up = upstream().await;
    let mut s = connect(&up, UpstreamTls::new("").unwrap()).await;
    let got = exchange(&mut s, b"GET /echo HTTP/1.1\r\nHost: api.mitm.test\r\n\r\n").await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 502 "), "{text}");
    assert!(matches!(
        s.relay.await.unwrap(),
        Err(MitmError::UpstreamTls { .. })
    ));
    assert!(up.seen.lock().unwrap().is_empty());
}

#[test]
fn only_credential_hosts_are_intercepted() {
    let config = EgressConfig {
        credentials: vec![credential()],
        ..EgressConfig::default()
    };
    assert_eq!(
        needs_intercept(&config, "API.mitm.test.").map(|c| c.host.as_str()),
        Some(HOST)
    );
    for other in [
        "example.org",
        "x.api.mitm.test",
        "mitm.test",
        "127.0.0.1",
        "",
    ] {
        assert!(needs_intercept(&config, other).is_none(), "{other}");
    }
    assert!(needs_intercept(&EgressConfig::default(), HOST).is_none());
}

#[test]
fn bad_extra_roots_are_named() {
    let err = UpstreamTls::new("/nonexistent/roots.pem")
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("egress.extra_roots_pem /nonexistent/roots.pem"),
        "{err}"
    );
    let mut empty = tempfile::NamedTempFile::new().unwrap();
    empty.write_all(b"no certificates here\n").unwrap();
    let err = UpstreamTls::new(empty.path().to_str().unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("holds no CERTIFICATE block"), "{err}");
}

/// ALPN: a client offering h2 and http/1.1 (curl, Chromium) gets http/1.1; one offering only
/// h2 fails the handshake instead of speaking a protocol the relay does not parse.
#[tokio::test]
async fn only_http_1_1_is_negotiated() {
    let up = upstream().await;
    let ca = Arc::new(SessionCa::new("alpn", &[HOST.to_string()]).unwrap());
    for (offer, expect) in [
        (
            vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Some(b"http/1.1".to_vec()),
        ),
        (vec![b"h2".to_vec()], None),
    ] {
        let (sandbox_end, proxy_end) = tokio::io::duplex(64 * 1024);
        let tcp = tokio::net::TcpStream::connect(up.addr).await.unwrap();
        let (ca2, tls) = (ca.clone(), tls_for(&up));
        let relay = tokio::spawn(async move {
            let counters = MitmCounters::default();
            intercept(proxy_end, tcp, HOST, &credential(), &ca2, &tls, &counters).await
        });
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = offer;
        let name = rustls::pki_types::ServerName::try_from(HOST).unwrap();
        let conn = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, sandbox_end)
            .await;
        match expect {
            Some(proto) => {
                let mut conn = conn.expect("h2 and http/1.1 offered: http/1.1 is chosen");
                assert_eq!(conn.get_ref().1.alpn_protocol(), Some(&proto[..]));
                let req = b"GET /echo HTTP/1.1\r\nHost: api.mitm.test\r\nConnection: close\r\n\r\n";
                conn.write_all(req).await.unwrap();
                let mut got = Vec::new();
                let _ = conn.read_to_end(&mut got).await;
                assert!(got.starts_with(b"HTTP/1.1 200 OK"));
                relay.await.unwrap().unwrap();
            }
            None => {
                let err = conn
                    .expect_err("an h2-only client was accepted")
                    .to_string();
                assert!(err.contains("NoApplicationProtocol"), "{err}");
                assert!(matches!(relay.await.unwrap(), Err(MitmError::ClientTls(_))));
            }
        }
    }
    assert_eq!(
        up.seen.lock().unwrap().len(),
        1,
        "only the http/1.1 client's request"
    );
}

#[test]
fn no_credentials_no_ca() {
    let none = SessionCa::for_config("s", &EgressConfig::default()).unwrap();
    assert!(none.is_none());
    let config = EgressConfig {
        credentials: vec![credential()],
        ..EgressConfig::default()
    };
    let ca = SessionCa::for_config("s", &config).unwrap().unwrap();
    assert_eq!(ca.hosts(), [HOST.to_string()]);
}
