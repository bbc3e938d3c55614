//! Credential injection: the one case where the egress proxy looks inside TLS.
//!
//! For a CONNECT to a host that has an `[[egress.credentials]]` entry (`needs_intercept`),
//! the proxy, after every check it makes for any connection, hands `intercept` the client's
//! byte stream and a TCP stream to the checked address. `intercept` terminates TLS towards
//! the sandbox with a leaf of the session CA (ALPN: http/1.1 only), opens TLS to the upstream
//! verified against the public web PKI plus the admin's `extra_roots_pem`, and relays
//! HTTP/1.1 requests one by one (`mitm_http.rs`): the credential header set on each, the
//! value masked in everything sent back. Every other host is tunneled untouched by the proxy.
//!
//! The secret's value appears in no error, log line or return value: errors carry only our
//! own words, the host and byte counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite};

use super::ca::{CaError, SessionCa};
use crate::config::egress::{EgressConfig, EgressCredential};

/// ring: the provider reqwest 0.12 compiles; named explicitly because the tree enables both
/// ring and aws-lc-rs in rustls, where the implicit default would refuse to choose.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The credential for `host` (as the sandbox named it), if the proxy must intercept it.
pub fn needs_intercept<'a>(config: &'a EgressConfig, host: &str) -> Option<&'a EgressCredential> {
    let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
    config.credentials.iter().find(|c| c.host == host)
}

#[derive(Debug, thiserror::Error)]
pub enum MitmError {
    #[error("egress.extra_roots_pem {path}: {message}")]
    Roots { path: String, message: String },
    #[error("{host}: the credential is for {cred_host}")]
    WrongHost { host: String, cred_host: String },
    #[error("the credential for {0} has no value (the config was not loaded)")]
    NoValue(String),
    #[error(transparent)]
    Ca(#[from] CaError),
    #[error("TLS with the sandbox failed: {0}")]
    ClientTls(String),
    #[error("TLS to {host} failed: {message}")]
    UpstreamTls { host: String, message: String },
    /// The sandbox sent something the relay refuses; it got `status` with this reason.
    #[error("request refused ({status}): {reason}")]
    BadRequest { status: u16, reason: String },
    /// The upstream answered something the relay cannot pass on safely.
    #[error("response from {host} refused: {reason}")]
    BadResponse { host: String, reason: String },
    #[error("the connection reached its byte cap ({0} bytes)")]
    Cap(u64),
    #[error("connection error: {0}")]
    Io(String),
}

impl From<std::io::Error> for MitmError {
    fn from(e: std::io::Error) -> Self {
        MitmError::Io(e.to_string())
    }
}

/// What one intercepted connection moved, updated as it goes: the caller keeps it, so the
/// audit has the counts even when the connection fails or the caller drops the future.
#[derive(Debug, Default)]
pub struct MitmCounters {
    /// Plaintext bytes written to the upstream (heads and bodies).
    pub bytes_up: AtomicU64,
    /// Plaintext bytes written to the sandbox.
    pub bytes_down: AtomicU64,
    /// Requests relayed to the upstream.
    pub requests: AtomicU64,
    /// Both ways together at most this many bytes (0: no cap of its own).
    pub cap: u64,
}

impl MitmCounters {
    pub fn with_cap(cap: u64) -> MitmCounters {
        MitmCounters {
            cap,
            ..MitmCounters::default()
        }
    }

    pub(crate) fn add(&self, up: bool, n: usize) -> Result<(), MitmError> {
        let counter = if up { &self.bytes_up } else { &self.bytes_down };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        let total = self.bytes_up.load(Ordering::Relaxed) + self.bytes_down.load(Ordering::Relaxed);
        if self.cap > 0 && total > self.cap {
            return Err(MitmError::Cap(self.cap));
        }
        Ok(())
    }

    pub fn up(&self) -> u64 {
        self.bytes_up.load(Ordering::Relaxed)
    }

    pub fn down(&self) -> u64 {
        self.bytes_down.load(Ordering::Relaxed)
    }
}

/// The TLS client the proxy uses towards credential hosts: built once at start.
#[derive(Clone)]
pub struct UpstreamTls {
    config: Arc<rustls::ClientConfig>,
}

impl UpstreamTls {
    /// The public web PKI (webpki-roots, Mozilla's set) and the certificates of
    /// `[egress] extra_roots_pem` (a path; empty for none).
    pub fn new(extra_roots_pem: &str) -> Result<UpstreamTls, MitmError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if !extra_roots_pem.is_empty() {
            let err = |message: String| MitmError::Roots {
                path: extra_roots_pem.to_string(),
                message,
            };
            let certs: Vec<CertificateDer<'static>> =
                CertificateDer::pem_file_iter(extra_roots_pem)
                    .map_err(|e| err(e.to_string()))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| err(e.to_string()))?;
            if certs.is_empty() {
                return Err(err("holds no CERTIFICATE block".into()));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| err(e.to_string()))?;
            }
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| MitmError::Io(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(UpstreamTls {
            config: Arc::new(config),
        })
    }
}

/// Serves one leaf whatever the client asked for: the proxy already knows the host (from the
/// checked CONNECT), and a client that named another gets a certificate it will refuse.
#[derive(Debug)]
struct OneLeaf(Arc<CertifiedKey>);

impl ResolvesServerCert for OneLeaf {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Intercepts one CONNECT to `host`: TLS both ways, then the HTTP/1.1 relay with `cred`.
/// Returns when either side closes; `counters` has the bytes either way.
pub async fn intercept<C, U>(
    client: C,
    upstream: U,
    host: &str,
    cred: &EgressCredential,
    ca: &SessionCa,
    tls: &UpstreamTls,
    counters: &MitmCounters,
) -> Result<(), MitmError>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    let host = credential_host(host, cred, true)?;
    let leaf = ca.leaf_for(&host)?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| MitmError::Io(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(OneLeaf(leaf)));
    // HTTP/2 would need a second relay; a client offering only h2 fails the handshake.
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let client = tokio_rustls::TlsAcceptor::from(Arc::new(server))
        .accept(client)
        .await
        .map_err(|e| MitmError::ClientTls(e.to_string()))?;
    let name = ServerName::try_from(host.clone()).map_err(|e| MitmError::UpstreamTls {
        host: host.clone(),
        message: e.to_string(),
    })?;
    let upstream = tokio_rustls::TlsConnector::from(tls.config.clone())
        .connect(name, upstream)
        .await;
    let mut client = client;
    let upstream = match upstream {
        Ok(u) => u,
        Err(e) => {
            let message = e.to_string();
            let reason = format!("TLS to {host} failed: {message}");
            super::mitm_body::refuse(&mut client, 502, &reason, counters).await;
            return Err(MitmError::UpstreamTls { host, message });
        }
    };
    super::mitm_http::relay(client, upstream, &host, cred, counters).await
}

/// The relay of `intercept` over plain TCP both ways: a credential with `allow_http`.
pub async fn relay_plain<C, U>(
    client: C,
    upstream: U,
    host: &str,
    cred: &EgressCredential,
    counters: &MitmCounters,
) -> Result<(), MitmError>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    let host = credential_host(host, cred, cred.allow_http)?;
    super::mitm_http::relay(client, upstream, &host, cred, counters).await
}

/// The destination, normalised, when `cred` is its credential, may be used (`usable`) and
/// has a value; the one check both relays make before any byte is read.
fn credential_host(host: &str, cred: &EgressCredential, usable: bool) -> Result<String, MitmError> {
    let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
    if cred.host != host || !usable {
        return Err(MitmError::WrongHost {
            host,
            cred_host: cred.host.clone(),
        });
    }
    if cred.value.is_empty() {
        return Err(MitmError::NoValue(host));
    }
    Ok(host)
}

#[cfg(test)]
#[path = "mitm_harness_tests.rs"]
mod harness;
#[cfg(test)]
#[path = "mitm_tests.rs"]
mod tests;
