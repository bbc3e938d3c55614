//! What the sandbox needs to trust the session CA: two files, environment variables, and
//! Chromium's flag. Public material only (certificates and a key hash; no key).
//!
//! Files go under /tmp (the root file system is read-only; /tmp is the container's tmpfs):
//! `ca.pem`, the session CA alone, and `ca-bundle.pem`, the public web PKI (Mozilla's roots,
//! the same set the proxy checks upstreams against, so the bundle does not depend on the
//! image's own ca-certificates) followed by the session CA. OpenSSL-based programs (curl, python's ssl, git) read
//! `SSL_CERT_FILE`/`CURL_CA_BUNDLE`/`GIT_SSL_CAINFO`, requests and pip `REQUESTS_CA_BUNDLE`/
//! `PIP_CERT`, all the bundle; Node adds `NODE_EXTRA_CA_CERTS` (the CA alone) to its own.
//!
//! Chromium ignores those variables and reads trust anchors only from an NSS database
//! (certutil is not in the image, and building one on the host is heavy) or from enterprise
//! policy under /etc (read-only). What is left is `--ignore-certificate-errors-spki-list`,
//! which Chromium honours when `--user-data-dir` is set (it is). It ignores certificate
//! errors for any chain the *server presents* that contains a listed key, without checking
//! signatures; pinning the CA's key would therefore let any server that merely includes the
//! (public) CA certificate in its chain pass. So the pin is the **leaf key** instead, shared
//! by every leaf of the session: a server must hold that private key to finish the handshake,
//! and it exists only in sandboxd's memory. That is the least trust the flag can express; it
//! is per session, and it does nothing for hosts without a credential (their chains never
//! carry that key, so Chromium verifies them normally).

use std::sync::Arc;

use base64::Engine as _;

use super::ca::SessionCa;

/// Where the session CA alone is written in the sandbox.
pub const CA_PATH: &str = "/tmp/sandboxd-egress/ca.pem";
/// Where the bundle (public roots and the session CA) is written in the sandbox.
pub const BUNDLE_PATH: &str = "/tmp/sandboxd-egress/ca-bundle.pem";

/// The files, environment and Chromium arguments that make the sandbox trust one session CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxTrust {
    /// (absolute path in the sandbox, content); the directory must be created first.
    pub files: Vec<(String, Vec<u8>)>,
    /// Set for every process of the session (the shell, python, the browser).
    pub env: Vec<(String, String)>,
    /// Added to Chromium's argv.
    pub chromium_args: Vec<String>,
}

/// The directory of `CA_PATH` and `BUNDLE_PATH`.
pub fn trust_dir() -> &'static str {
    "/tmp/sandboxd-egress"
}

/// PEM of one DER certificate, 64 columns as OpenSSL writes it.
pub fn pem_cert(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 64);
    out.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// The variables that point the sandbox's programs at the files (the same for every session:
/// only the files' content differs).
pub fn trust_env() -> Vec<(String, String)> {
    let mut env = Vec::new();
    for name in [
        "SSL_CERT_FILE",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
    ] {
        env.push((name.to_string(), BUNDLE_PATH.to_string()));
    }
    env.push(("NODE_EXTRA_CA_CERTS".to_string(), CA_PATH.to_string()));
    env
}

/// Everything the sandbox of `ca`'s session needs to trust it.
pub fn sandbox_trust(ca: &SessionCa) -> SandboxTrust {
    let ca_pem = pem_cert(ca.cert_der());
    let mut bundle = String::new();
    for root in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
        bundle.push_str(&pem_cert(root));
    }
    bundle.push_str(&ca_pem);
    SandboxTrust {
        files: vec![
            (CA_PATH.to_string(), ca_pem.into_bytes()),
            (BUNDLE_PATH.to_string(), bundle.into_bytes()),
        ],
        env: trust_env(),
        chromium_args: vec![format!(
            "--ignore-certificate-errors-spki-list={}",
            ca.leaf_spki_sha256()
        )],
    }
}

/// Chromium's extra arguments as they are now (the session's credentials may come and go).
#[derive(Clone, Default)]
pub struct ChromiumArgs(Option<Arc<dyn Fn() -> Vec<String> + Send + Sync>>);

impl ChromiumArgs {
    /// Arguments read from `now` at each Chromium start.
    pub fn from_fn(now: impl Fn() -> Vec<String> + Send + Sync + 'static) -> Self {
        ChromiumArgs(Some(Arc::new(now)))
    }

    /// The arguments now.
    pub fn now(&self) -> Vec<String> {
        self.0.as_ref().map(|f| f()).unwrap_or_default()
    }

    /// Whether a Chromium started with `started` lacks an argument wanted now (a pin that
    /// appeared with the session's first credential): it must be started again to get it.
    /// An argument no longer wanted is no reason: a pin of a key no leaf uses does nothing.
    pub fn adds_to(&self, started: &[String]) -> bool {
        self.now().iter().any(|a| !started.contains(a))
    }
}
