//! Name resolution that checks before anything connects.
//!
//! reqwest's connector connects to exactly the addresses its resolver returns, so checking
//! inside the resolver closes the DNS-rebinding gap of "resolve, check, let the client
//! resolve again": the answer checked is the answer used. A refused name fails the
//! connection with a `Refusal` inside the error chain, which the Fetcher digs out so the
//! model reads which rule refused. Literal-IP URLs never reach a resolver (hyper skips it),
//! which is why `Policy::check_url` checks them on every hop.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::ssrf::{Policy, Refusal};

/// Turns a name into addresses. The system one uses getaddrinfo; tests script answers.
#[async_trait]
pub trait NameResolver: Send + Sync {
    async fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// getaddrinfo on tokio's blocking pool (the lookup itself cannot be cancelled, so the
/// caller's timeout only stops waiting for it).
pub struct SystemResolver;

#[async_trait]
impl NameResolver for SystemResolver {
    async fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let addrs = tokio::net::lookup_host((host, 0)).await?;
        let mut ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
        ips.dedup();
        Ok(ips)
    }
}

/// Fixed answers, for tests and for a deployment that pins names (none by default).
pub struct StaticResolver(pub Vec<(String, Vec<IpAddr>)>);

#[async_trait]
impl NameResolver for StaticResolver {
    async fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(host))
            .map(|(_, a)| a.clone())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host}: no such host")))
    }
}

/// Resolves and checks: the whole name is refused if any answer is denied.
pub async fn resolve_checked(
    resolver: &dyn NameResolver,
    policy: &Policy,
    host: &str,
    timeout: Duration,
) -> Result<Vec<IpAddr>, ResolveError> {
    let addrs = match tokio::time::timeout(timeout, resolver.lookup(host)).await {
        Err(_) => return Err(ResolveError::Lookup(format!("resolving {host} timed out"))),
        Ok(Err(e)) => return Err(ResolveError::Lookup(format!("cannot resolve {host}: {e}"))),
        Ok(Ok(a)) => a,
    };
    policy
        .check_resolved(host, &addrs)
        .map_err(ResolveError::Refused)?;
    Ok(addrs)
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Refused(Refusal),
    #[error("{0}")]
    Lookup(String),
}

/// The reqwest hook: every name the client connects to passes `resolve_checked`.
pub struct CheckedResolve {
    pub policy: Arc<Policy>,
    pub resolver: Arc<dyn NameResolver>,
    pub timeout: Duration,
    /// The configured proxy's host name: the one name resolved without the checks.
    pub exempt: Option<String>,
}

impl reqwest::dns::Resolve for CheckedResolve {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let resolver = self.resolver.clone();
        let timeout = self.timeout;
        let host = name.as_str().to_string();
        let exempt = self.exempt.as_deref() == Some(host.to_ascii_lowercase().as_str());
        Box::pin(async move {
            let addrs = if exempt {
                match tokio::time::timeout(timeout, resolver.lookup(&host)).await {
                    Ok(r) => r?,
                    Err(_) => return Err(format!("resolving the proxy {host} timed out").into()),
                }
            } else {
                resolve_checked(resolver.as_ref(), &policy, &host, timeout).await?
            };
            tracing::debug!(host = %host, addrs = ?addrs, "research: resolved and checked");
            let out: reqwest::dns::Addrs =
                Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(out)
        })
    }
}

/// The Refusal inside a reqwest error chain, if a check refused the connection.
pub fn refusal_in(err: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(ResolveError::Refused(r)) = e.downcast_ref::<ResolveError>() {
            return Some(r.clone());
        }
        if let Some(r) = e.downcast_ref::<Refusal>() {
            return Some(r.clone());
        }
        cur = e.source();
    }
    None
}
