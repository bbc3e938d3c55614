//! The egress proxy of one session: the live web for a sandbox that has no network device.
//!
//! Inside the container a helper listens on the sandbox's own loopback (`PROXY_ADDR`) and
//! carries every connection to the host over the exec channel; the host decides each one:
//! the SSRF rules and ports of `[research]` first (the name resolved here, every address
//! checked, the connection made to a checked address), then the session's `EgressPolicy`
//! (read from its `PolicySource` at every connection, so a change takes effect for the next
//! one) within the admin's widest, then the caps. Every connection, allowed or refused,
//! becomes an `EgressRecord` for the `EgressAudit`.
//!
//! This module names no store and no HTTP framework: serve and the CLI give it their
//! `PolicySource` and `EgressAudit`.

use std::fmt;

pub mod ca;
pub mod inject;
pub mod mitm;
mod mitm_body;
mod mitm_http;
pub mod mitm_trust;
pub mod user_credentials;
pub mod vault;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

mod channel;
mod conn;
mod decide;
mod frame;
mod http;
mod idle;
mod proxy;

pub use crate::config::egress::{EgressPolicy, Host, Verdict};
pub use proxy::{EgressDeps, EgressError, EgressProxy, EgressStats};

/// Where programs in the sandbox find the proxy (`HTTP_PROXY=http://127.0.0.1:3128`).
pub const PROXY_HOST: &str = "127.0.0.1";
pub const PROXY_PORT: u16 = 3128;

/// The environment a process in the sandbox gets while the session's policy is not `off`.
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://{PROXY_HOST}:{PROXY_PORT}");
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.push((name.to_string(), url.clone()));
    }
    // Loopback inside the sandbox is the sandbox's own (its browser, its servers).
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    env
}

/// The session's current policy, read at every new connection.
#[async_trait]
pub trait PolicySource: Send + Sync {
    /// The policy now; an error refuses the connection (rule `policy-unavailable`).
    async fn policy(&self) -> Result<EgressPolicy, String>;
}

/// A policy that never changes (the CLI's `--egress`, tests).
pub struct FixedPolicy(pub EgressPolicy);

#[async_trait]
impl PolicySource for FixedPolicy {
    async fn policy(&self) -> Result<EgressPolicy, String> {
        Ok(self.0.clone())
    }
}

/// The seam for TLS interception (credentials injected for hosts that have one): a CONNECT
/// that passed every check, whose destination `wants` says, is handed to `serve` instead of
/// being tunneled. The proxy still counts and caps the bytes between the sandbox and `client`.
#[async_trait]
pub trait Intercept: Send + Sync {
    /// Whether this destination (as the sandbox named it, normalised) is to be handed over.
    fn wants(&self, host: &str, port: u16) -> bool;

    /// Serves one connection: `client` is the sandbox's side, just after the proxy answered
    /// `200 Connection Established`; `upstream` is connected to the checked address.
    async fn serve(
        &self,
        client: tokio::io::DuplexStream,
        upstream: tokio::net::TcpStream,
        host: &str,
    ) -> Result<(), String>;

    /// What to do with a plain `http://` request to this destination (after every check):
    /// forward it as any other (the default), hand it to `serve_plain`, or refuse it.
    fn plain(&self, _host: &str, _port: u16) -> Plain {
        Plain::Forward
    }

    /// Serves one plain-HTTP connection `plain` said `Inject` for: `client` starts with the
    /// request head (origin-form, as the proxy rewrote it) and its body; no TLS either side.
    async fn serve_plain(
        &self,
        _client: tokio::io::DuplexStream,
        _upstream: tokio::net::TcpStream,
        _host: &str,
    ) -> Result<(), String> {
        Err("this interceptor serves no plain HTTP".into())
    }
}

/// The interceptor's word on a plain-HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plain {
    /// Not the interceptor's: forwarded untouched.
    Forward,
    /// Handed to `Intercept::serve_plain`.
    Inject,
    /// Refused before any connection: (rule, reason) for the sandbox and the audit.
    Refuse(String, String),
}

/// One connection through a session's proxy, allowed or refused: what the audit keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRecord {
    /// The API session id (or the CLI's session id).
    pub session: String,
    /// The user the session belongs to (empty for the CLI).
    pub owner: String,
    /// `CONNECT`, or the forwarded request's method.
    pub method: String,
    /// The destination as the sandbox named it (a host name or an address).
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// The rule that decided: a policy rule (`*.wikipedia.org`, `!ads.example`,
    /// `not in the allowlist`, `egress off`), an SSRF rule (`denied-address`, `port`, …)
    /// or a cap (`connections`, `connection-bytes`, `session-bytes`, `rate`).
    pub rule: String,
    /// Why it was refused or cut, for the sandbox's error page and the audit.
    pub reason: Option<String>,
    /// Bytes from the sandbox to the destination.
    pub bytes_up: u64,
    /// Bytes from the destination to the sandbox.
    pub bytes_down: u64,
    /// When the connection was accepted (ms since the epoch).
    pub started_ms: i64,
    pub duration_ms: u64,
}

impl fmt::Display for EgressRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.allowed { "allowed" } else { "refused" };
        write!(
            f,
            "{} {}:{} {verdict} by {} ({} B up, {} B down, {} ms)",
            self.method,
            self.host,
            self.port,
            self.rule,
            self.bytes_up,
            self.bytes_down,
            self.duration_ms
        )
    }
}

/// Where records go: the store and the session's current run in serve, the run's sink in the
/// CLI. Called once per connection, when it ends (or is refused); must not block long.
#[async_trait]
pub trait EgressAudit: Send + Sync {
    async fn record(&self, record: EgressRecord);
}

/// An audit that only logs (under the `sandboxd::egress` target, as every audit also does).
pub struct LogOnly;

#[async_trait]
impl EgressAudit for LogOnly {
    async fn record(&self, _record: EgressRecord) {}
}

/// The `tracing` target of every egress record, on every front end.
pub const TRACE_TARGET: &str = "sandboxd::egress";
