//! The injector's choices (which hosts, which plain-HTTP requests) and its plain-HTTP relay
//! against a real TCP server: the header arrives, the echoed secret is masked.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::config::egress::{CredentialValue, EgressCredential};

const SECRET: &str = "s3cr3t-inject-test-7f1d";

fn config(allow_http: bool) -> EgressConfig {
    EgressConfig {
        credentials: vec![EgressCredential {
            host: "api.inject.test".into(),
            header: "Authorization".into(),
            value_env: "INJECT_TEST_TOKEN".into(),
            prefix: "Bearer ".into(),
            allow_http,
            value: CredentialValue::new(SECRET),
        }],
        ..EgressConfig::default()
    }
}

#[test]
fn no_credentials_no_injector() {
    let none = Injector::for_config("s1", &EgressConfig::default()).unwrap();
    assert!(none.is_none());
    assert!(chromium_args(None).now().is_empty());
}

#[test]
fn it_wants_exactly_the_credential_hosts() {
    let i = Injector::for_config("s1", &config(false)).unwrap().unwrap();
    assert!(i.wants("api.inject.test", 443));
    assert!(
        i.wants("API.Inject.Test.", 8443),
        "normalised as the proxy names it"
    );
    for other in [
        "inject.test",
        "x.api.inject.test",
        "api.inject.test.evil",
        "10.0.0.1",
    ] {
        assert!(!i.wants(other, 443), "{other}");
        assert_eq!(i.plain(other, 80), Plain::Forward, "{other}");
    }
    assert_eq!(i.hosts(), ["api.inject.test".to_string()]);
    let i = Arc::new(i);
    let args = chromium_args(Some(&i)).now();
    assert_eq!(args.len(), 1);
    assert!(args[0].starts_with("--ignore-certificate-errors-spki-list="));
}

/// Chromium's pin is there exactly while the session has a CA (a credential host), read at
/// each start: none before the first credential, the pin after, and a browser started
/// without it is told to start again (`adds_to`); none again once the last one went.
#[test]
fn the_pin_comes_and_goes_with_the_credentials() {
    let i = Arc::new(Injector::new("s1", &config(false), Vec::new()).unwrap());
    let args = chromium_args(Some(&i));
    assert!(!i.has_ca() && args.now().is_empty() && i.trust().is_none());
    assert!(!args.adds_to(&[]));
    assert!(i.set_credentials(config(false).credentials).unwrap());
    assert!(i.has_ca() && i.trust().is_some());
    let pinned = args.now();
    assert_eq!(pinned.len(), 1, "{pinned:?}");
    assert!(args.adds_to(&[]), "a browser started before it lacks it");
    assert!(!args.adds_to(&pinned));
    assert!(!i.set_credentials(Vec::new()).unwrap());
    assert!(!i.has_ca() && args.now().is_empty() && i.trust().is_none());
    assert!(
        !args.adds_to(&pinned),
        "a pin no longer wanted is no reason to restart"
    );
}

#[test]
fn plain_http_to_a_credential_host_is_refused_unless_the_credential_allows_it() {
    let strict = Injector::for_config("s1", &config(false)).unwrap().unwrap();
    match strict.plain("api.inject.test", 80) {
        Plain::Refuse(rule, reason) => {
            assert_eq!(rule, NEEDS_HTTPS);
            assert!(reason.contains("https://api.inject.test/"), "{reason}");
            assert!(!reason.contains(SECRET));
        }
        other => panic!("{other:?}"),
    }
    let lax = Injector::for_config("s1", &config(true)).unwrap().unwrap();
    assert_eq!(lax.plain("api.inject.test", 80), Plain::Inject);
}

/// The CA's generation grows exactly when the set of credential hosts changes (what a proxy
/// start compares after writing the trust files, so a credential attached meanwhile is not
/// missed), and never when the same hosts come again.
#[test]
fn the_ca_generation_counts_the_cas_made() {
    let i = Injector::for_config("s1", &config(false)).unwrap().unwrap();
    let first = i.ca_generation();
    assert_eq!(first, 1, "the first CA");
    assert!(!i.set_credentials(config(false).credentials).unwrap());
    assert_eq!(i.ca_generation(), first, "same hosts, same CA");
    let mut two = config(false).credentials;
    let mut other = two[0].clone();
    other.host = "api.other.test".into();
    two.push(other);
    assert!(i.set_credentials(two).unwrap());
    assert_eq!(i.ca_generation(), first + 1, "a new host, a new CA");
    assert!(
        !i.set_credentials(Vec::new()).unwrap(),
        "no host: no CA to trust"
    );
    assert_eq!(
        i.ca_generation(),
        first + 2,
        "the CA is gone: trust changes too"
    );
}

/// A server that answers every request with its head echoed in the body.
async fn echo_server() -> (std::net::SocketAddr, tokio::task::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the relay closed before a full head");
            head.extend_from_slice(&buf[..n]);
        }
        let body = head.clone();
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(reply.as_bytes()).await.unwrap();
        s.write_all(&body).await.unwrap();
        s.shutdown().await.unwrap();
        String::from_utf8_lossy(&head).into_owned()
    });
    (addr, task)
}

#[tokio::test]
async fn serve_plain_sets_the_header_and_masks_the_echo() {
    let i = Injector::for_config("s1", &config(true)).unwrap().unwrap();
    let (addr, server) = echo_server().await;
    let upstream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sandbox, far) = tokio::io::duplex(64 * 1024);
    // What the proxy hands over: the origin-form head it rewrote, with the sandbox's own
    // (forged) header that the relay must replace.
    sandbox
        .write_all(b"GET /v1/x HTTP/1.1\r\nHost: api.inject.test\r\nAuthorization: Bearer forged\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let served = tokio::spawn(async move { i.serve_plain(far, upstream, "api.inject.test").await });
    let mut got = Vec::new();
    sandbox.read_to_end(&mut got).await.unwrap();
    served.await.unwrap().unwrap();
    let seen = server.await.unwrap();
    assert!(
        seen.contains(&format!("Authorization: Bearer {SECRET}\r\n")),
        "{seen}"
    );
    assert!(!seen.contains("forged"), "{seen}");
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.contains("Authorization: Bearer "), "{got}");
    assert!(
        !got.contains(SECRET),
        "the echoed secret reached the sandbox: {got}"
    );
}

#[tokio::test]
async fn serve_plain_refuses_a_credential_without_allow_http() {
    let i = Injector::for_config("s1", &config(false)).unwrap().unwrap();
    let (addr, _server) = echo_server().await;
    let upstream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (_sandbox, far) = tokio::io::duplex(1024);
    let err = i
        .serve_plain(far, upstream, "api.inject.test")
        .await
        .unwrap_err();
    assert!(err.contains("no credential for plain HTTP"), "{err}");
}
