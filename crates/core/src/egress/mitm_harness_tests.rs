//! The credential relay's test harness: a local HTTPS API (hyper, over rustls, with a
//! self-signed certificate trusted through `extra_roots_pem`) that records what it received,
//! and a sandbox side: a tokio duplex stream whose TLS client trusts only the session CA.

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use rustls::pki_types::ServerName;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use super::*;
use crate::config::egress::{CredentialValue, EgressCredential};

pub(super) const HOST: &str = "api.mitm.test";
pub(super) const SECRET: &str = "s3cr3t-token-ONLY-the-upstream-may-see-9f2c";
pub(super) const BIG: usize = 5 * 1024 * 1024;

/// What the upstream received, per request.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) path: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body_len: usize,
    pub(super) body_sha: String,
}

pub(super) struct Upstream {
    pub(super) addr: SocketAddr,
    pub(super) seen: Arc<Mutex<Vec<Seen>>>,
    pub(super) roots: tempfile::NamedTempFile,
    /// The /big response stops after its first MiB until the client has its first half.
    pub(super) gate: Arc<Notify>,
}

pub(super) type Body = BoxBody<Bytes, Infallible>;

pub(super) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

pub(super) fn pattern(from: usize, len: usize) -> Bytes {
    (from..from + len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// `/echo`: the headers it got, in the body and one response header; `/echo-chunked`: the
/// same, chunked, the secret split across two chunks; `/big`: 5 MiB; `/gzip`: claims gzip.
pub(super) async fn answer(
    req: Request<hyper::body::Incoming>,
    up: Arc<Mutex<Vec<Seen>>>,
    gate: Arc<Notify>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    up.lock().unwrap().push(Seen {
        path: path.clone(),
        headers: headers.clone(),
        body_len: body.len(),
        body_sha: hex::encode(Sha256::digest(&body)),
    });
    let echoed: String = headers.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
    let auth = headers
        .iter()
        .find(|(k, _)| k == "authorization")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let resp = Response::builder().header("x-echo-auth", auth);
    Ok(match path.as_str() {
        "/echo" => resp.body(full(echoed)).unwrap(),
        "/echo-chunked" => {
            let cut = echoed
                .find(SECRET)
                .map(|i| i + SECRET.len() / 2)
                .unwrap_or(0);
            let (a, b) = echoed.split_at(cut);
            let frames = vec![
                Ok(Frame::data(Bytes::from(a.to_string()))),
                Ok(Frame::data(Bytes::from(b.to_string()))),
            ];
            resp.body(StreamBody::new(futures::stream::iter(frames)).boxed())
                .unwrap()
        }
        "/big" => {
            let stream = futures::stream::unfold(0usize, move |sent| {
                let gate = gate.clone();
                async move {
                    if sent >= BIG {
                        return None;
                    }
                    if sent == 1024 * 1024 {
                        gate.notified().await;
                    }
                    let n = (BIG - sent).min(64 * 1024);
                    Some((Ok(Frame::data(pattern(sent, n))), sent + n))
                }
            });
            resp.header("content-length", BIG)
                .body(StreamBody::new(stream).boxed())
                .unwrap()
        }
        "/gzip" => resp
            .header("content-encoding", "gzip")
            .body(full("not really gzip"))
            .unwrap(),
        _ => resp
            .body(full(format!(
                "len={} sha={}",
                body.len(),
                hex::encode(Sha256::digest(&body))
            )))
            .unwrap(),
    })
}

pub(super) async fn upstream() -> Upstream {
    let cert = rcgen::generate_simple_self_signed(vec![HOST.to_string()]).unwrap();
    let mut roots = tempfile::NamedTempFile::new().unwrap();
    roots.write_all(cert.cert.pem().as_bytes()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Notify::new());
    let (s, g) = (seen.clone(), gate.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, s, g) = (acceptor.clone(), s.clone(), g.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |req| answer(req, s.clone(), g.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Upstream {
        addr,
        seen,
        roots,
        gate,
    }
}

pub(super) fn credential() -> EgressCredential {
    EgressCredential {
        host: HOST.into(),
        header: "Authorization".into(),
        value_env: "MITM_TEST_TOKEN".into(),
        prefix: "Bearer ".into(),
        allow_http: false,
        value: CredentialValue::new(SECRET),
    }
}

/// One intercepted connection: the sandbox's TLS stream, and the relay's result and counters.
pub(super) struct Session {
    pub(super) sandbox: tokio_rustls::client::TlsStream<tokio::io::DuplexStream>,
    pub(super) relay: tokio::task::JoinHandle<Result<(), MitmError>>,
    pub(super) counters: Arc<MitmCounters>,
}

pub(super) async fn connect(up: &Upstream, tls: UpstreamTls) -> Session {
    connect_with(up, tls, Arc::new(MitmCounters::default())).await
}

/// `connect` with the caller's counters (and so its byte cap).
pub(super) async fn connect_with(
    up: &Upstream,
    tls: UpstreamTls,
    counters: Arc<MitmCounters>,
) -> Session {
    let ca = Arc::new(SessionCa::new("test-session", &[HOST.to_string()]).unwrap());
    let (sandbox_end, proxy_end) = tokio::io::duplex(64 * 1024);
    let tcp = TcpStream::connect(up.addr).await.unwrap();
    let (c, ca2) = (counters.clone(), ca.clone());
    let relay = tokio::spawn(async move {
        intercept(proxy_end, tcp, HOST, &credential(), &ca2, &tls, &c).await
    });
    // The sandbox trusts the session CA and nothing else.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let sandbox = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(HOST).unwrap(), sandbox_end)
        .await
        .expect("the sandbox trusts the session CA's leaf");
    Session {
        sandbox,
        relay,
        counters,
    }
}

pub(super) fn tls_for(up: &Upstream) -> UpstreamTls {
    UpstreamTls::new(up.roots.path().to_str().unwrap()).unwrap()
}

/// Sends `request`, reads until the relay closes; every byte the sandbox received.
pub(super) async fn exchange(s: &mut Session, request: &[u8]) -> Vec<u8> {
    // The relay may refuse and close before all of it is written: what matters is the answer.
    let _ = s.sandbox.write_all(request).await;
    let _ = s.sandbox.flush().await;
    let mut got = Vec::new();
    let _ = s.sandbox.read_to_end(&mut got).await;
    got
}

pub(super) fn contains(hay: &[u8], needle: &str) -> bool {
    memchr::memmem::find(hay, needle.as_bytes()).is_some()
}
