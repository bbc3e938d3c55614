//! Whether one connection may leave, and to which addresses: the checks, in order.
//!
//! 1. The URL rules of `[research]` (port, literal addresses, local and metadata names),
//!    which need no I/O.
//! 2. The session's policy and the admin's widest, both read now (`PolicySource`), both
//!    checked on the name as the client wrote it (after URL normalisation).
//! 3. The session's caps: requests per minute and bytes per session.
//! 4. Only then the name is resolved, every answer checked (`resolve_checked`), and the
//!    answers returned are the addresses the proxy connects to: nothing resolves twice, so
//!    no DNS rebinding. Resolving last means a sandbox whose policy is `off` cannot make the
//!    host look up names it chose (a DNS channel out of a sandbox with no network).
//!
//! The research `only` list is web_fetch's and is not applied here: egress has its own
//! allowlist, the policy.

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use url::Url;

use super::{EgressDeps, Host};
use crate::research::resolver::{ResolveError, resolve_checked};
use crate::research::ssrf::{Origin, Target};

/// How long a name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection the checks let through: where to connect and the policy rule that allowed it.
#[derive(Debug)]
pub(crate) struct Allowed {
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) rule: String,
}

/// A refused connection: the rule and why, for the client and the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) rule: String,
    pub(crate) reason: String,
}

pub(crate) fn refused(rule: &str, reason: impl Into<String>) -> Refused {
    Refused {
        rule: rule.to_string(),
        reason: reason.into(),
    }
}

/// The session's shared counters the caps are checked against.
pub(crate) struct Caps {
    rate: Mutex<Bucket>,
    /// Bytes moved both ways by all of the session's connections.
    pub(crate) session_bytes: AtomicU64,
    pub(crate) session_cap: u64,
    pub(crate) connection_cap: u64,
}

/// A token bucket: `per_minute` tokens at most, refilled evenly over a minute.
struct Bucket {
    per_minute: f64,
    tokens: f64,
    at: Instant,
}

impl Caps {
    pub(crate) fn new(deps: &EgressDeps) -> Caps {
        let per_minute = f64::from(deps.config.requests_per_minute.max(1));
        Caps {
            rate: Mutex::new(Bucket {
                per_minute,
                tokens: per_minute,
                at: Instant::now(),
            }),
            session_bytes: AtomicU64::new(0),
            session_cap: deps.config.session_mb.saturating_mul(1 << 20),
            connection_cap: deps.config.connection_mb.saturating_mul(1 << 20),
        }
    }

    /// Takes one request from the bucket, or refuses.
    fn take_request(&self) -> Result<(), Refused> {
        let Ok(mut b) = self.rate.lock() else {
            return Err(refused("rate", "the rate counter is unavailable"));
        };
        let now = Instant::now();
        let refill = now.duration_since(b.at).as_secs_f64() * b.per_minute / 60.0;
        b.tokens = (b.tokens + refill).min(b.per_minute);
        b.at = now;
        if b.tokens < 1.0 {
            return Err(refused(
                "rate",
                format!(
                    "this session may start {} requests per minute through its proxy ([egress] requests_per_minute)",
                    b.per_minute
                ),
            ));
        }
        b.tokens -= 1.0;
        Ok(())
    }

    fn check_session_bytes(&self) -> Result<(), Refused> {
        if self.session_bytes.load(Ordering::Acquire) >= self.session_cap {
            return Err(refused(
                "session-bytes",
                format!(
                    "this session has moved its {} MiB through the proxy ([egress] session_mb)",
                    self.session_cap >> 20
                ),
            ));
        }
        Ok(())
    }
}

/// Runs the checks for `url` (an `https://host:port/` for a CONNECT).
pub(crate) async fn decide(deps: &EgressDeps, caps: &Caps, url: &Url) -> Result<Allowed, Refused> {
    let target = deps
        .ssrf
        .check_url(url, Origin::Admin)
        .map_err(|r| refused(r.rule, r.to_string()))?;
    let port = url.port_or_known_default().unwrap_or(0);
    let host = match &target {
        Target::Ip(ip) => Host::Ip(*ip),
        Target::Name(n) => Host::Name(n.clone()),
    };
    let policy = deps.policy.policy().await.map_err(|e| {
        refused(
            "policy-unavailable",
            format!("the session's egress policy could not be read: {e}"),
        )
    })?;
    let verdict = policy.check(&host);
    if !verdict.allowed {
        return Err(refused(
            &verdict.rule,
            format!("{host} is refused by the session's egress policy ({policy})"),
        ));
    }
    let widest = deps.config.widest.check(&host);
    if !widest.allowed {
        return Err(refused(
            &widest.rule,
            format!("{host} is refused by the admin's widest egress policy ([egress] widest)"),
        ));
    }
    caps.take_request()?;
    caps.check_session_bytes()?;
    let ips: Vec<IpAddr> = match target {
        Target::Ip(ip) => vec![ip],
        Target::Name(name) => {
            resolve_checked(deps.resolver.as_ref(), &deps.ssrf, &name, RESOLVE_TIMEOUT)
                .await
                .map_err(|e| match e {
                    ResolveError::Refused(r) => refused(r.rule, r.to_string()),
                    ResolveError::Lookup(m) => refused("resolve", m),
                })?
        }
    };
    Ok(Allowed {
        addrs: ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect(),
        rule: verdict.rule,
    })
}
