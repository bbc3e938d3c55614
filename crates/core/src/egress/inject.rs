//! `Injector`: the `Intercept` of a session whose `[egress]` has credentials. It holds the
//! session's CA (its key only in this process's memory) and the upstream TLS client, and
//! wants exactly the hosts that have a credential; every other host stays a plain tunnel.
//!
//! Plain HTTP to a credential host: with the credential's `allow_http` the request goes
//! through the same relay as inside TLS (`mitm_http.rs`: the header set, the value masked in
//! the answer), over plain TCP; without it the request is refused before any connection,
//! rule `credential-needs-https`: the secret is never sent in cleartext, and the request is
//! never forwarded without it either (the sandbox would not know why the API refused it).
//!
//! `install` puts the public half into the sandbox: the CA files (mitm_trust.rs) and the
//! switch that adds `SSL_CERT_FILE` & co. to the proxy variables of its processes.

use std::sync::Arc;

use async_trait::async_trait;

use super::ca::SessionCa;
use super::mitm::{self, MitmCounters, UpstreamTls, needs_intercept};
use super::mitm_trust::{SandboxTrust, sandbox_trust};
use super::{Intercept, Plain};
use crate::config::EgressConfig;
use crate::sandbox::{Sandbox, SandboxError};

/// The rule of a refused plain-HTTP request to a credential host.
pub const NEEDS_HTTPS: &str = "credential-needs-https";

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("the session CA: {0}")]
    Ca(#[from] super::ca::CaError),
    #[error("the upstream TLS client: {0}")]
    Tls(#[from] mitm::MitmError),
}

/// One session's credential injection.
pub struct Injector {
    /// The `[egress]` section the credentials came from (only its credentials are read).
    config: EgressConfig,
    ca: SessionCa,
    tls: UpstreamTls,
}

impl std::fmt::Debug for Injector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injector")
            .field("hosts", &self.ca.hosts())
            .finish_non_exhaustive()
    }
}

impl Injector {
    /// The injector of `session` under `config`: None when no host has a credential.
    pub fn for_config(
        session: &str,
        config: &EgressConfig,
    ) -> Result<Option<Injector>, InjectError> {
        let Some(ca) = SessionCa::for_config(session, config)? else {
            return Ok(None);
        };
        let tls = UpstreamTls::new(&config.extra_roots_pem)?;
        let config = EgressConfig {
            credentials: config.credentials.clone(),
            ..EgressConfig::default()
        };
        Ok(Some(Injector { config, ca, tls }))
    }

    /// What the sandbox needs to trust this session's CA (public material only).
    pub fn trust(&self) -> SandboxTrust {
        sandbox_trust(&self.ca)
    }

    /// The hosts whose TLS this injector terminates.
    pub fn hosts(&self) -> &[String] {
        self.ca.hosts()
    }
}

#[async_trait]
impl Intercept for Injector {
    fn wants(&self, host: &str, _port: u16) -> bool {
        needs_intercept(&self.config, host).is_some()
    }

    async fn serve(
        &self,
        client: tokio::io::DuplexStream,
        upstream: tokio::net::TcpStream,
        host: &str,
    ) -> Result<(), String> {
        let cred = needs_intercept(&self.config, host)
            .ok_or_else(|| format!("{host} has no credential"))?;
        // The proxy counts and caps the bytes on the sandbox's side of this pipe.
        let counters = MitmCounters::default();
        mitm::intercept(client, upstream, host, cred, &self.ca, &self.tls, &counters)
            .await
            .map_err(|e| e.to_string())
    }

    fn plain(&self, host: &str, _port: u16) -> Plain {
        match needs_intercept(&self.config, host) {
            None => Plain::Forward,
            Some(c) if c.allow_http => Plain::Inject,
            Some(c) => Plain::Refuse(
                NEEDS_HTTPS.into(),
                format!(
                    "{} has a credential that the proxy adds over HTTPS only (its [egress] \
                     credential does not set allow_http); use https://{}/",
                    c.host, c.host
                ),
            ),
        }
    }

    async fn serve_plain(
        &self,
        client: tokio::io::DuplexStream,
        upstream: tokio::net::TcpStream,
        host: &str,
    ) -> Result<(), String> {
        let cred = needs_intercept(&self.config, host)
            .filter(|c| c.allow_http)
            .ok_or_else(|| format!("{host} has no credential for plain HTTP"))?;
        let counters = MitmCounters::default();
        mitm::relay_plain(client, upstream, host, cred, &counters)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Writes the trust files into `sandbox` and turns on the trust variables of its processes.
/// Called once the session's proxy runs with `injector` (files of another replica's CA are
/// not overwritten by a proxy that did not start).
pub async fn install(sandbox: &dyn Sandbox, injector: &Injector) -> Result<(), SandboxError> {
    let trust = injector.trust();
    // The file helper makes the directory (`trust_dir()`) as it writes.
    for (path, data) in &trust.files {
        sandbox.write_file(path, data).await?;
    }
    sandbox.set_egress_trust(true);
    Ok(())
}

/// The Chromium flags of a session with `injector` (none without).
pub fn chromium_args(injector: Option<&Arc<Injector>>) -> Vec<String> {
    injector
        .map(|i| i.trust().chromium_args)
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "inject_tests.rs"]
mod tests;
