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
//! switch that adds `SSL_CERT_FILE` & co. to the proxy variables of its processes;
//! `uninstall` takes them out once no credential is left. There is a CA only while there is
//! a credential host, and Chromium's pin (`chromium_args`) is read at each of its starts, so
//! a session without credentials has neither.

use std::sync::{Arc, RwLock};

use async_trait::async_trait;

use super::ca::{LeafKey, SessionCa};
use super::mitm::{self, MitmCounters, UpstreamTls};
use super::mitm_trust::{ChromiumArgs, SandboxTrust, sandbox_trust, trust_dir};
use super::{Intercept, Plain};
use crate::config::EgressConfig;
use crate::config::egress::EgressCredential;
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

/// The credentials of the session now, and the CA constrained to exactly their hosts (None
/// while there are none).
struct State {
    credentials: Vec<EgressCredential>,
    ca: Option<Arc<SessionCa>>,
    /// Counts the CAs made: a start that wrote the trust files compares it afterwards, so a
    /// CA made again meanwhile (a credential attached while the proxy started) is written too.
    generation: u64,
}

/// One session's credential injection.
pub struct Injector {
    session: String,
    /// The key of every leaf of every CA this session has: Chromium's pin.
    leaf: LeafKey,
    tls: UpstreamTls,
    /// Replaced whole by `set_credentials`; a connection works on the snapshot it started with.
    state: RwLock<Arc<State>>,
}

impl std::fmt::Debug for Injector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injector")
            .field("hosts", &self.hosts())
            .finish_non_exhaustive()
    }
}

/// The credential for `host` (as the sandbox named it), if any.
fn find<'a>(credentials: &'a [EgressCredential], host: &str) -> Option<&'a EgressCredential> {
    let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
    credentials.iter().find(|c| c.host == host)
}

impl Injector {
    /// The injector of `session` with the admin's credentials only: None when there are none.
    pub fn for_config(
        session: &str,
        config: &EgressConfig,
    ) -> Result<Option<Injector>, InjectError> {
        if config.credentials.is_empty() {
            return Ok(None);
        }
        Injector::new(session, config, config.credentials.clone()).map(Some)
    }

    /// The injector of `session` with `credentials` (the admin's and its owner's; possibly
    /// none yet: a user may attach one while the session runs).
    pub fn new(
        session: &str,
        config: &EgressConfig,
        credentials: Vec<EgressCredential>,
    ) -> Result<Injector, InjectError> {
        let injector = Injector {
            session: session.to_string(),
            leaf: LeafKey::generate()?,
            tls: UpstreamTls::new(&config.extra_roots_pem)?,
            state: RwLock::new(Arc::new(State {
                credentials: Vec::new(),
                ca: None,
                generation: 0,
            })),
        };
        injector.set_credentials(credentials)?;
        Ok(injector)
    }

    fn state(&self) -> Arc<State> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the session's credentials: the next connection uses them. When their hosts
    /// changed, the CA is made again for exactly the new hosts (same leaf key) and true is
    /// returned: the sandbox's trust files must be written again (`install`).
    pub fn set_credentials(&self, credentials: Vec<EgressCredential>) -> Result<bool, InjectError> {
        let mut hosts: Vec<String> = credentials.iter().map(|c| c.host.clone()).collect();
        hosts.sort();
        let old = self.state();
        let old_hosts = old
            .ca
            .as_ref()
            .map(|c| c.hosts().to_vec())
            .unwrap_or_default();
        let changed = hosts != old_hosts;
        let ca = match (changed, hosts.is_empty()) {
            (false, _) => old.ca.clone(),
            (true, true) => None,
            (true, false) => Some(Arc::new(SessionCa::with_leaf(
                &self.session,
                &hosts,
                self.leaf.clone(),
            )?)),
        };
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(State {
            credentials,
            ca,
            generation: old.generation + u64::from(changed),
        });
        Ok(changed && !hosts.is_empty())
    }

    /// Which CA this is (it grows each time one is made again): what `install` wrote can be
    /// compared with what the sandbox must trust now.
    pub fn ca_generation(&self) -> u64 {
        self.state().generation
    }

    /// What the sandbox needs to trust this session's CA (public material only); None while
    /// no host has a credential.
    pub fn trust(&self) -> Option<SandboxTrust> {
        self.state().ca.as_deref().map(sandbox_trust)
    }

    /// The hosts whose TLS this injector terminates now.
    pub fn hosts(&self) -> Vec<String> {
        self.state()
            .credentials
            .iter()
            .map(|c| c.host.clone())
            .collect()
    }

    /// Whether the session has a CA now (at least one credential host).
    pub fn has_ca(&self) -> bool {
        self.state().ca.is_some()
    }

    /// Chromium's flag pinning the session's leaf key (the same for all its CAs).
    fn chromium_arg(&self) -> String {
        format!(
            "--ignore-certificate-errors-spki-list={}",
            self.leaf.spki_sha256()
        )
    }
}

#[async_trait]
impl Intercept for Injector {
    fn wants(&self, host: &str, _port: u16) -> bool {
        find(&self.state().credentials, host).is_some()
    }

    async fn serve(
        &self,
        client: tokio::io::DuplexStream,
        upstream: tokio::net::TcpStream,
        host: &str,
    ) -> Result<(), String> {
        let state = self.state();
        let cred =
            find(&state.credentials, host).ok_or_else(|| format!("{host} has no credential"))?;
        let ca = state
            .ca
            .as_ref()
            .ok_or_else(|| format!("{host} has no credential"))?;
        // The proxy counts and caps the bytes on the sandbox's side of this pipe.
        let counters = MitmCounters::default();
        mitm::intercept(client, upstream, host, cred, ca, &self.tls, &counters)
            .await
            .map_err(|e| e.to_string())
    }

    fn plain(&self, host: &str, _port: u16) -> Plain {
        match find(&self.state().credentials, host) {
            None => Plain::Forward,
            Some(c) if c.allow_http => Plain::Inject,
            Some(c) => Plain::Refuse(
                NEEDS_HTTPS.into(),
                format!(
                    "{} has a credential that the proxy adds over HTTPS only (it does not set \
                     allow_http); use https://{}/",
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
        let state = self.state();
        let cred = find(&state.credentials, host)
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
    let Some(trust) = injector.trust() else {
        return Ok(());
    };
    // The file helper makes the directory (`trust_dir()`) as it writes.
    for (path, data) in &trust.files {
        sandbox.write_file(path, data).await?;
    }
    sandbox.set_egress_trust(true);
    Ok(())
}

/// Takes the trust out of `sandbox` once `injector` has no CA any more (the session's last
/// credential went): its processes stop seeing the trust variables (before their next
/// command) and the files go. A Chromium already started keeps its pin, which pins a key
/// no certificate is made with any more.
pub async fn uninstall(sandbox: &dyn Sandbox, injector: &Injector) -> Result<(), SandboxError> {
    if injector.has_ca() {
        return Ok(());
    }
    sandbox.set_egress_trust(false);
    match sandbox.remove(trust_dir(), true).await {
        Err(SandboxError::NotFound { .. }) => Ok(()),
        other => other,
    }
}

/// The Chromium flags of a session with `injector`, read at each Chromium start: the pin
/// while the session has a CA (a credential host), nothing otherwise.
pub fn chromium_args(injector: Option<&Arc<Injector>>) -> ChromiumArgs {
    match injector {
        None => ChromiumArgs::default(),
        Some(i) => {
            let i = Arc::downgrade(i);
            ChromiumArgs::from_fn(move || match i.upgrade() {
                Some(i) if i.has_ca() => vec![i.chromium_arg()],
                _ => Vec::new(),
            })
        }
    }
}

#[cfg(test)]
#[path = "inject_tests.rs"]
mod tests;
