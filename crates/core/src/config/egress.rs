//! The `[egress]` config section and the egress policy: which hosts a session's sandbox may
//! reach through its host-side proxy.
//!
//! A policy is `off` (nothing), `any` (any public host: the SSRF rules of `[research]` still
//! apply, as they do to every policy) or a list of rules: host names (`example.org`),
//! wildcards (`*.wikipedia.org`, which matches `en.wikipedia.org`, not `wikipedia.org`
//! itself), IP addresses, and `any`; a rule written `!rule` denies what it matches, and a
//! denial wins over every allowance. Written as a string (`"off"`, `"any"`,
//! `"a.org,*.b.org,!c.b.org"`) or a JSON/TOML array of rules.
//!
//! "Never wider" is decided on the rules, not on samples: `within` says whether every host
//! one policy allows is allowed by another, conservatively (a policy it cannot prove inside
//! is refused, naming a rule that is not covered). The proxy checks the session's policy and
//! the admin's widest at every connection, so a config that narrows later narrows at once.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use super::egress_credentials::{CredentialValue, EgressCredential};
pub use super::egress_grammar::{MAX_POLICY_CHARS, MAX_RULE_CHARS};

/// One rule of a list policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EgressRule {
    /// Every public host (the SSRF rules still apply).
    Any,
    /// Exactly this host name (lower case, no trailing dot).
    Name(String),
    /// Every host under this domain (`*.x.org` is stored as `x.org`), not the domain itself.
    Suffix(String),
    /// This address, when the destination is written as it.
    Ip(IpAddr),
}

impl EgressRule {
    /// One rule, exactly as written (no spaces): the grammar `egress_grammar` states.
    fn parse(raw: &str) -> Result<EgressRule, String> {
        let bad = || format!("{raw:?} is not a host name, \"*.domain\", an IP address or \"any\"");
        // Brackets are for IPv6 only, one pair, as in a URL.
        if let Some(inner) = raw.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            return inner
                .parse::<Ipv6Addr>()
                .map(|ip| EgressRule::Ip(IpAddr::V6(ip)))
                .map_err(|_| bad());
        }
        if let Ok(ip) = raw.parse::<IpAddr>() {
            return Ok(EgressRule::Ip(ip));
        }
        // One trailing dot: a fully qualified name (or address) means the same host.
        let s = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
        if s == "any" {
            return Ok(EgressRule::Any);
        }
        if let Ok(ip) = s.parse::<Ipv4Addr>() {
            return Ok(EgressRule::Ip(IpAddr::V4(ip)));
        }
        let (suffix, name) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s.as_str()),
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        // No length of its own: a rule is at most MAX_RULE_CHARS as written.
        if name.is_empty() || !name.split('.').all(label_ok) {
            return Err(bad());
        }
        Ok(if suffix {
            EgressRule::Suffix(name.to_string())
        } else {
            EgressRule::Name(name.to_string())
        })
    }

    /// Whether this rule matches the destination host (already lower case, no trailing dot).
    fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (EgressRule::Any, _) => true,
            (EgressRule::Name(n), Host::Name(h)) => n == h,
            (EgressRule::Suffix(s), Host::Name(h)) => under(h, s),
            (EgressRule::Ip(a), Host::Ip(b)) => a == b,
            _ => false,
        }
    }

    /// Whether every host this rule matches, `outer` matches too.
    fn covered_by(&self, outer: &EgressRule) -> bool {
        match (outer, self) {
            (EgressRule::Any, _) => true,
            (_, EgressRule::Any) => false,
            (EgressRule::Name(a), EgressRule::Name(b)) => a == b,
            (EgressRule::Suffix(s), EgressRule::Name(n)) => under(n, s),
            (EgressRule::Suffix(s), EgressRule::Suffix(t)) => s == t || under(t, s),
            (EgressRule::Ip(a), EgressRule::Ip(b)) => a == b,
            _ => false,
        }
    }

    /// Whether some host is matched by both rules.
    fn overlaps(&self, other: &EgressRule) -> bool {
        self.covered_by(other) || other.covered_by(self)
    }
}

/// `host` is strictly under `domain` (`a.b.org` under `b.org`).
fn under(host: &str, domain: &str) -> bool {
    host.len() > domain.len()
        && host.ends_with(domain)
        && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EgressRule::Any => f.write_str("any"),
            EgressRule::Name(n) => f.write_str(n),
            EgressRule::Suffix(s) => write!(f, "*.{s}"),
            EgressRule::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// A destination as the proxy saw it named: a host name or a literal address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// Normalizes what a client wrote (`Example.ORG.`, `[::1]`, `10.0.0.1`).
    pub fn parse(raw: &str) -> Host {
        let s = raw.trim().trim_end_matches('.').to_ascii_lowercase();
        match s.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => Host::Name(s),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Which hosts a session may reach through its egress proxy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum EgressPolicy {
    /// Nothing leaves; the proxy refuses every connection.
    #[default]
    Off,
    /// Rules, at least one; `!rule` denials win over allowances.
    List {
        allow: Vec<EgressRule>,
        deny: Vec<EgressRule>,
    },
}

/// Why a destination is allowed or refused: the rule, as written, for the audit and the
/// refusal page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// `egress off`, `not in the allowlist`, `*.wikipedia.org`, `!ads.example` …
    pub rule: String,
}

impl EgressPolicy {
    /// `any`.
    pub fn any() -> EgressPolicy {
        EgressPolicy::List {
            allow: vec![EgressRule::Any],
            deny: Vec::new(),
        }
    }

    /// Parses `off`, `any` or comma-separated rules (spaces around each allowed).
    pub fn parse(raw: &str) -> Result<EgressPolicy, String> {
        let items: Vec<&str> = raw.split(',').collect();
        Self::from_items(&items)
    }

    /// Builds a policy from its rules (`off` alone, or rules and `!rules`).
    pub fn from_items<S: AsRef<str>>(items: &[S]) -> Result<EgressPolicy, String> {
        if items.len() > MAX_RULES {
            return Err(format!(
                "an egress policy has at most {MAX_RULES} rules; this one has {}",
                items.len()
            ));
        }
        let mut trimmed = Vec::with_capacity(items.len());
        for item in items {
            let item = item.as_ref();
            if item.chars().count() > MAX_RULE_CHARS {
                return Err(format!(
                    "a rule of an egress policy has at most {MAX_RULE_CHARS} characters; one has {}",
                    item.chars().count()
                ));
            }
            let item = item.trim_matches(' ');
            if item.is_empty() && items.len() > 1 {
                return Err(
                    "an egress policy has an empty rule (two commas together, or one at an end)"
                        .into(),
                );
            }
            trimmed.push(item);
        }
        let items: Vec<&str> = trimmed.into_iter().filter(|s| !s.is_empty()).collect();
        match items.as_slice() {
            [] => return Err(EMPTY.into()),
            [one] if one.eq_ignore_ascii_case("off") => return Ok(EgressPolicy::Off),
            _ => {}
        }
        let (mut allow, mut deny) = (Vec::new(), Vec::new());
        for item in items {
            if item.eq_ignore_ascii_case("off") {
                return Err("\"off\" stands alone: it cannot be combined with other rules".into());
            }
            match item.strip_prefix('!') {
                Some(rest) => deny.push(EgressRule::parse(rest)?),
                None => allow.push(EgressRule::parse(item)?),
            }
        }
        if allow.is_empty() {
            return Err(format!(
                "{EMPTY} (denials alone allow nothing: add \"any\")"
            ));
        }
        Ok(EgressPolicy::List { allow, deny })
    }

    pub fn is_off(&self) -> bool {
        matches!(self, EgressPolicy::Off)
    }

    /// Whether `host` may be reached, and by which rule.
    pub fn check(&self, host: &Host) -> Verdict {
        let (allow, deny) = match self {
            EgressPolicy::Off => return verdict(false, "egress off"),
            EgressPolicy::List { allow, deny } => (allow, deny),
        };
        if let Some(d) = deny.iter().find(|d| d.matches(host)) {
            return verdict(false, &format!("!{d}"));
        }
        match allow.iter().find(|a| a.matches(host)) {
            Some(a) => verdict(true, &a.to_string()),
            None => verdict(false, "not in the allowlist"),
        }
    }

    /// Ok when every host this policy allows, `widest` allows too; else the rule of this
    /// policy that reaches past `widest`, or the denial of `widest` it does not keep.
    pub fn within(&self, widest: &EgressPolicy) -> Result<(), String> {
        let (allow, deny) = match self {
            EgressPolicy::Off => return Ok(()),
            EgressPolicy::List { allow, deny } => (allow, deny),
        };
        let (w_allow, w_deny) = match widest {
            EgressPolicy::Off => {
                return Err("egress is off at most: only \"off\" is allowed".into());
            }
            EgressPolicy::List { allow, deny } => (allow, deny),
        };
        if let Some(a) = allow
            .iter()
            .find(|a| !w_allow.iter().any(|w| a.covered_by(w)))
        {
            return Err(format!(
                "{a:?} reaches past the widest policy allowed here ({widest})",
                a = a.to_string()
            ));
        }
        // Each denial of the widest must stay denied wherever this policy allows near it.
        for w in w_deny {
            let reached = allow.iter().any(|a| a.overlaps(w));
            if reached && !deny.iter().any(|d| w.covered_by(d)) {
                return Err(format!(
                    "the widest policy allowed here ({widest}) denies \"{w}\"; add \"!{w}\""
                ));
            }
        }
        Ok(())
    }

    /// The rules as written (`["off"]`, `["any"]`, `["a.org", "!b.a.org"]`).
    pub fn items(&self) -> Vec<String> {
        match self {
            EgressPolicy::Off => vec!["off".into()],
            EgressPolicy::List { allow, deny } => allow
                .iter()
                .map(ToString::to_string)
                .chain(deny.iter().map(|d| format!("!{d}")))
                .collect(),
        }
    }
}

/// The most rules one policy may have: policies arrive from API clients.
pub const MAX_RULES: usize = 256;
const EMPTY: &str = "an egress policy needs \"off\", \"any\" or at least one host to allow";

fn verdict(allowed: bool, rule: &str) -> Verdict {
    Verdict {
        allowed,
        rule: rule.to_string(),
    }
}

impl fmt::Display for EgressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.items().join(","))
    }
}

impl std::str::FromStr for EgressPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        EgressPolicy::parse(s)
    }
}

/// Serialized as a string (`"off"`, `"any"`) when it is one rule, else as an array of rules.
impl Serialize for EgressPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let items = self.items();
        match items.as_slice() {
            [one] => s.serialize_str(one),
            _ => items.serialize(s),
        }
    }
}

/// Read from a string (comma-separated rules) or an array of rules.
impl<'de> Deserialize<'de> for EgressPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        let parsed = match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "an egress policy is \"off\", \"any\", \"a.org,*.b.org\" or an array of such rules",
            )
        })? {
            Raw::One(s) if s.chars().count() > MAX_POLICY_CHARS => Err(format!(
                "an egress policy written as one string has at most {MAX_POLICY_CHARS} characters; write a longer one as an array of rules"
            )),
            Raw::One(s) => EgressPolicy::parse(&s),
            Raw::Many(v) => EgressPolicy::from_items(&v),
        };
        parsed.map_err(serde::de::Error::custom)
    }
}

/// `[egress]`: the host-side proxy through which a session's sandbox reaches the web.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// The policy of a session that asks for none.
    pub default: EgressPolicy,
    /// The widest policy any request may set (the admin's; nothing else can widen it).
    pub widest: EgressPolicy,
    /// Connections one session may hold open through its proxy at once.
    pub connections: u32,
    /// Bytes (both ways) one connection may carry before it is cut.
    pub connection_mb: u64,
    /// Bytes (both ways) one session may move through its proxy in all.
    pub session_mb: u64,
    /// New connections (or forwarded requests) one session may start per minute.
    pub requests_per_minute: u32,
    /// Seconds an open connection may move no byte either way before it is closed (a
    /// forgotten WebSocket or keep-alive would otherwise hold a `connections` slot).
    pub idle_secs: u64,
    /// Secrets the proxy adds to requests for exact hosts (TLS to those hosts is terminated
    /// by a per-session CA); the values come from the host's environment at load.
    pub credentials: Vec<EgressCredential>,
    /// A PEM file of extra roots the proxy trusts when it connects to a credential's host
    /// (beside the public web PKI): a private CA of the admin's, or the tests' local server.
    /// Empty: none.
    pub extra_roots_pem: String,
    /// A file (mode 0600) holding the 256-bit key, as 64 hex characters, that seals users'
    /// own credentials in the store. Empty (and no `credential_key_env`): users cannot
    /// attach credentials; the admin's above work without it.
    pub credential_key_file: String,
    /// Instead of the file: the name of sandboxd's environment variable holding the key.
    pub credential_key_env: String,
    /// The most credentials one user may attach.
    pub user_credentials: u32,
    /// The key, read at load from the file or the variable; never serialized.
    #[serde(skip)]
    pub credential_key: crate::egress::vault::CredentialKey,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            default: EgressPolicy::Off,
            widest: EgressPolicy::any(),
            connections: 64,
            connection_mb: 256,
            session_mb: 1024,
            requests_per_minute: 600,
            idle_secs: 300,
            credentials: Vec::new(),
            extra_roots_pem: String::new(),
            credential_key_file: String::new(),
            credential_key_env: String::new(),
            user_credentials: 16,
            credential_key: Default::default(),
        }
    }
}

impl EgressConfig {
    /// Checks the section at load: (key, message) on error.
    pub fn validate(&self) -> Result<(), (String, String)> {
        self.default.within(&self.widest).map_err(|m| {
            (
                "egress.default".into(),
                format!("must be within egress.widest: {m}"),
            )
        })?;
        for (key, v) in [
            ("egress.connections", u64::from(self.connections)),
            ("egress.connection_mb", self.connection_mb),
            ("egress.session_mb", self.session_mb),
            (
                "egress.requests_per_minute",
                u64::from(self.requests_per_minute),
            ),
            ("egress.idle_secs", self.idle_secs),
            ("egress.user_credentials", u64::from(self.user_credentials)),
        ] {
            if v == 0 {
                return Err((key.into(), "must be at least 1".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
