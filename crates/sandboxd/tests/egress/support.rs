//! The egress tests' "internet": plain HTTP and HTTPS servers on the host that count their
//! visitors, a policy the test switches, an audit that collects, and the deps of a proxy
//! whose SSRF rules open exactly the test's names (`good.test`, `other.test` → 127.0.0.1).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandboxd_core::config::EgressConfig;
use sandboxd_core::egress::{EgressAudit, EgressDeps, EgressPolicy, EgressRecord, PolicySource};
use sandboxd_core::research::config::ResearchConfig;
use sandboxd_core::research::resolver::StaticResolver;
use sandboxd_core::research::ssrf::Policy;
use sandboxd_core::sandbox::ShellOptions;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// A local server: where it listens (on every interface) and how many connections it got.
pub struct Web {
    pub port: u16,
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Web {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Web {
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Reads a request's head (at most 16 KiB) and gives its path; None when the peer left first.
pub async fn request_path<S: AsyncRead + Unpin>(s: &mut S) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    Some(text.split(' ').nth(1).unwrap_or("/").to_string())
}

/// Answers one request: `/big` is 8 MiB of `x`, anything else `hello <name> <path>`.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, name: &str) {
    let Some(path) = request_path(&mut s).await else {
        return;
    };
    if path == "/big" {
        let total = 8usize << 20;
        let head =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\nConnection: close\r\n\r\n");
        if s.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..total / chunk.len() {
            if s.write_all(&chunk).await.is_err() {
                return;
            }
        }
    } else {
        let body = format!("hello {name} {path}\n");
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = s.write_all(reply.as_bytes()).await;
    }
    let _ = s.shutdown().await;
}

/// A plain HTTP server on 0.0.0.0 (so the host's own addresses reach it too).
pub async fn http_server(name: &'static str) -> Web {
    let listener = TcpListener::bind(("0.0.0.0", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer(s, name));
        }
    });
    Web { port, hits, task }
}

/// An HTTPS server for `good.test` with a fresh self-signed certificate (returned as PEM).
pub async fn https_server(name: &'static str) -> (Web, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["good.test".to_string()]).unwrap();
    let pem = cert.cert.pem();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(("0.0.0.0", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    answer(tls, name).await;
                }
            });
        }
    });
    (Web { port, hits, task }, pem)
}

/// A policy the test changes while the proxy runs.
pub struct Switch(pub Mutex<EgressPolicy>);

impl Switch {
    pub fn new(policy: &str) -> Arc<Switch> {
        Arc::new(Switch(Mutex::new(EgressPolicy::parse(policy).unwrap())))
    }

    pub fn set(&self, policy: &str) {
        *self.0.lock().unwrap() = EgressPolicy::parse(policy).unwrap();
    }
}

#[async_trait]
impl PolicySource for Switch {
    async fn policy(&self) -> Result<EgressPolicy, String> {
        Ok(self.0.lock().unwrap().clone())
    }
}

/// Collects the records, and wakes whoever waits for them.
#[derive(Default)]
pub struct Collect {
    pub records: Mutex<Vec<EgressRecord>>,
    changed: Notify,
}

#[async_trait]
impl EgressAudit for Collect {
    async fn record(&self, record: EgressRecord) {
        self.records.lock().unwrap().push(record);
        self.changed.notify_waiters();
    }
}

impl Collect {
    /// Waits (at most a minute: a bound, not a measurement) until `pred` holds for the
    /// records, and returns them.
    pub async fn wait(
        &self,
        what: &str,
        pred: impl Fn(&[EgressRecord]) -> bool,
    ) -> Vec<EgressRecord> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let notified = self.changed.notified();
            {
                let records = self.records.lock().unwrap();
                if pred(&records) {
                    return records.clone();
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let records = self.records.lock().unwrap();
                panic!("never saw {what}; the records: {records:#?}");
            }
        }
    }

    /// Waits for the record of a connection to `host`, the `nth` (from 0) such.
    pub async fn of(&self, host: &str, nth: usize) -> EgressRecord {
        let found = self
            .wait(&format!("record {nth} of {host}"), |r| {
                r.iter().filter(|r| r.host == host).count() > nth
            })
            .await;
        found
            .into_iter()
            .filter(|r| r.host == host)
            .nth(nth)
            .unwrap()
    }
}

/// The deps of a proxy for a test: `[research]` opens `good.test` and `other.test` (both
/// 127.0.0.1) on `ports` (plus 80 and 443); `mixed.test` resolves to a private and a
/// public address.
pub fn deps(
    config: EgressConfig,
    ports: &[u16],
    policy: Arc<Switch>,
    audit: Arc<Collect>,
) -> EgressDeps {
    let research = ResearchConfig {
        allow: vec!["good.test".into(), "other.test".into()],
        ports: [80, 443].iter().chain(ports).copied().collect(),
        ..ResearchConfig::default()
    };
    let local: IpAddr = "127.0.0.1".parse().unwrap();
    let resolver = StaticResolver(vec![
        ("good.test".into(), vec![local]),
        ("other.test".into(), vec![local]),
        (
            "mixed.test".into(),
            vec![
                "93.184.216.34".parse().unwrap(),
                "10.1.2.3".parse().unwrap(),
            ],
        ),
    ]);
    EgressDeps {
        config,
        ssrf: Arc::new(Policy::from_config(&research).unwrap()),
        resolver: Arc::new(resolver),
        policy,
        audit,
        session: "egress-test".into(),
        owner: "test".into(),
    }
}

/// The host's address on its default route (no packet is sent), else Docker's bridge.
pub fn host_address() -> IpAddr {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:80").map(|_| s))
        .and_then(|s| s.local_addr());
    match probe {
        Ok(SocketAddr::V4(a)) if !a.ip().is_unspecified() => IpAddr::V4(*a.ip()),
        _ => "172.17.0.1".parse().unwrap(),
    }
}

pub fn opts() -> ShellOptions {
    ShellOptions {
        timeout: Duration::from_secs(120),
        ..ShellOptions::default()
    }
}

/// `curl` through the proxy, verbose (the proxy's answer headers land on stderr).
pub fn curl(args: &str) -> String {
    format!("curl -sS -v --max-time 60 --proxy http://127.0.0.1:3128 {args}")
}

/// An HTTPS "API" for `names` (self-signed; `root_pem` is its certificate): it keeps every
/// request head it saw and answers with it (`api saw:\n<head>`), so a test sees what the
/// proxy sent and what the sandbox got back.
pub struct Https {
    pub port: u16,
    pub heads: Arc<Mutex<Vec<String>>>,
    pub cert_der: Vec<u8>,
    pub root_pem: String,
}

pub async fn echo_https(bind: IpAddr, names: Vec<String>) -> Https {
    let cert = rcgen::generate_simple_self_signed(names).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind((bind, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    echo_one(tls, seen).await;
                }
            });
        }
    });
    Https {
        port,
        heads,
        cert_der: cert.cert.der().to_vec(),
        root_pem: cert.cert.pem(),
    }
}

/// `echo_https` over plain HTTP (no certificate: `cert_der` and `root_pem` are empty).
pub async fn echo_http(bind: IpAddr) -> Https {
    let listener = tokio::net::TcpListener::bind((bind, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(echo_one(s, seen.clone()));
        }
    });
    Https {
        port,
        heads,
        cert_der: Vec::new(),
        root_pem: String::new(),
    }
}

/// One connection of an echo server: the request head kept and answered with.
async fn echo_one<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, seen: Arc<Mutex<Vec<String>>>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    seen.lock().unwrap().push(text.clone());
    let body = format!("api saw:\n{text}");
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(reply.as_bytes()).await;
    let _ = s.shutdown().await;
}
