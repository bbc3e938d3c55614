//! The SSRF rules: which URLs and addresses research requests may reach.
//!
//! Decisions are made on parsed values, never on strings: `url::Url` already turns the odd
//! IPv4 spellings (`0x7f.1`, `2130706433`, `017700000001`, `127.1`) into `Host::Ipv4`, and
//! every address is canonicalised (IPv4-mapped IPv6, NAT64) before it meets the deny list,
//! because `"::ffff:127.0.0.1".is_loopback()` is false in Rust. A refusal names the rule
//! and what the admin could configure; nothing the model sends can change a `Policy`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use url::{Host, Url};

use crate::config::ResearchConfig;

/// A request refused by one of the rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused by the `{rule}` rule: {detail}. {fix}")]
pub struct Refusal {
    /// Short rule name: scheme, userinfo, port, host, denied-address, denied-name,
    /// resolves-to-denied, only, redirects, body-size, content-type, resolve.
    pub rule: &'static str,
    pub detail: String,
    /// What the admin could configure (or that nothing can).
    pub fix: String,
}

impl Refusal {
    pub fn new(rule: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            rule,
            detail: detail.into(),
            fix: fix.into(),
        }
    }
}

/// Who asked: `only` restricts what the model fetches, not the admin's engine endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Model,
    Admin,
}

/// A host entry of `allow`, `deny` or `only`: a name ("wiki.lan", "*.corp.example") or a net.
#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Name(String),
    Suffix(String),
    Net(IpNet),
}

impl Entry {
    fn parse(key: &str, raw: &str) -> Result<Entry, String> {
        let s = raw.trim().trim_end_matches('.').to_ascii_lowercase();
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Entry::Net(net.trunc()));
        }
        if let Ok(ip) = s.trim_matches(['[', ']']).parse::<IpAddr>() {
            return Ok(Entry::Net(IpNet::from(canonical(ip))));
        }
        let (suffix, name) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s.as_str()),
        };
        let valid = !name.is_empty()
            && name
                .split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        if !valid {
            return Err(format!(
                "[research] {key}: {raw:?} is neither a host name, \"*.domain\", an IP address nor a CIDR"
            ));
        }
        Ok(if suffix {
            Entry::Suffix(name.to_string())
        } else {
            Entry::Name(name.to_string())
        })
    }

    fn matches_name(&self, host: &str) -> bool {
        match self {
            Entry::Name(n) => n == host,
            Entry::Suffix(s) => {
                host.len() > s.len() && host.ends_with(s.as_str()) && {
                    host.as_bytes()[host.len() - s.len() - 1] == b'.'
                }
            }
            Entry::Net(_) => false,
        }
    }

    fn matches_ip(&self, ip: IpAddr) -> bool {
        matches!(self, Entry::Net(n) if n.contains(&ip))
    }
}

/// What a checked URL points at.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// A literal address, already checked.
    Ip(IpAddr),
    /// A name; its addresses are checked by `Policy::check_resolved` when it is resolved.
    Name(String),
}

/// The admin's rules, built once from the config and the host's own addresses.
#[derive(Debug, Clone)]
pub struct Policy {
    allow: Vec<Entry>,
    deny: Vec<Entry>,
    only: Vec<Entry>,
    ports: Vec<u16>,
    /// The host's own addresses and its bridge networks, with a label for refusals.
    own: Vec<(IpNet, String)>,
}

/// Names refused whatever they resolve to: cloud metadata services.
const DENIED_NAMES: &[&str] = &[
    "metadata.google.internal",
    "metadata.azure.com",
    "metadata",
    "instance-data",
];

impl Policy {
    pub fn from_config(c: &ResearchConfig) -> Result<Policy, String> {
        let parse = |key: &str, list: &[String]| {
            list.iter()
                .map(|s| Entry::parse(key, s))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Policy {
            allow: parse("allow", &c.allow)?,
            deny: parse("deny", &c.deny)?,
            only: parse("only", &c.only)?,
            ports: c.ports.clone(),
            own: super::own_addrs::own_networks(),
        })
    }

    /// Parses the three lists without reading the host's interfaces: (key, message) on error.
    pub fn check_lists(c: &ResearchConfig) -> Result<(), (String, String)> {
        for (key, list) in [("allow", &c.allow), ("deny", &c.deny), ("only", &c.only)] {
            for raw in list {
                Entry::parse(key, raw).map_err(|m| (format!("research.{key}"), m))?;
            }
        }
        Ok(())
    }

    /// The URL rules: scheme, userinfo, port, literal addresses, denied names, `only`.
    pub fn check_url(&self, url: &Url, origin: Origin) -> Result<Target, Refusal> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal::new(
                "scheme",
                format!("{:?} URLs cannot be fetched", url.scheme()),
                "only http and https are supported; no setting changes this",
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refusal::new(
                "userinfo",
                "the URL carries a user name or password (user:pw@host)",
                "credentials in URLs are never sent; fetch the URL without them",
            ));
        }
        let port = url.port_or_known_default().unwrap_or(0);
        if !self.ports.contains(&port) {
            return Err(Refusal::new(
                "port",
                format!(
                    "port {port} is not one of the allowed ports {:?}",
                    self.ports
                ),
                format!("the admin can add {port} to [research] ports"),
            ));
        }
        let target = match url.host() {
            None => {
                return Err(Refusal::new(
                    "host",
                    "the URL has no host",
                    "give an absolute http(s) URL",
                ));
            }
            Some(Host::Ipv4(v4)) => Target::Ip(IpAddr::V4(v4)),
            Some(Host::Ipv6(v6)) => Target::Ip(IpAddr::V6(v6)),
            Some(Host::Domain(d)) => Target::Name(d.trim_end_matches('.').to_ascii_lowercase()),
        };
        match &target {
            Target::Ip(ip) => {
                self.check_ip(*ip, None)?;
                if origin == Origin::Model && !self.only_admits(None, *ip) {
                    return Err(self.only_refusal(&ip.to_string()));
                }
            }
            Target::Name(name) => {
                let explicitly_allowed = self.allow.iter().any(|e| e.matches_name(name));
                if !explicitly_allowed
                    && (DENIED_NAMES.contains(&name.as_str())
                        || name == "localhost"
                        || name.ends_with(".localhost"))
                {
                    return Err(Refusal::new(
                        "denied-name",
                        format!("{name} is a local or cloud-metadata name"),
                        format!("the admin can list {name:?} in [research] allow"),
                    ));
                }
                if self.deny.iter().any(|e| e.matches_name(name)) {
                    return Err(Refusal::new(
                        "denied-name",
                        format!("{name} is in [research] deny"),
                        "the admin can remove it from [research] deny",
                    ));
                }
                if origin == Origin::Model && !self.only.is_empty() {
                    let admitted = self.only.iter().any(|e| e.matches_name(name));
                    if !admitted {
                        return Err(self.only_refusal(name));
                    }
                }
            }
        }
        Ok(target)
    }

    fn only_admits(&self, name: Option<&str>, ip: IpAddr) -> bool {
        self.only.is_empty()
            || self
                .only
                .iter()
                .any(|e| e.matches_ip(canonical(ip)) || name.is_some_and(|n| e.matches_name(n)))
    }

    fn only_refusal(&self, what: &str) -> Refusal {
        Refusal::new(
            "only",
            format!("{what} is not in [research] only, which restricts web_fetch to listed hosts"),
            format!("the admin can add {what:?} to [research] only"),
        )
    }

    /// One address (a literal host, or one answer of a name `name`).
    pub fn check_ip(&self, ip: IpAddr, name: Option<&str>) -> Result<(), Refusal> {
        let ip = canonical(ip);
        let allowed = self
            .allow
            .iter()
            .any(|e| e.matches_ip(ip) || name.is_some_and(|n| e.matches_name(n)));
        if allowed {
            return Ok(());
        }
        let reason = builtin_denied(ip)
            .map(str::to_string)
            .or_else(|| {
                self.own
                    .iter()
                    .find(|(net, _)| net.contains(&ip))
                    .map(|(_, label)| label.clone())
            })
            .or_else(|| {
                self.deny
                    .iter()
                    .any(|e| e.matches_ip(ip))
                    .then(|| "listed in [research] deny".to_string())
            });
        match reason {
            None => Ok(()),
            Some(why) => {
                let (rule, subject) = match name {
                    Some(n) => ("resolves-to-denied", format!("{n} resolves to {ip}")),
                    None => ("denied-address", format!("{ip}")),
                };
                Err(Refusal::new(
                    rule,
                    format!("{subject}, which is {why}"),
                    format!(
                        "if this is an internal service meant to be reachable, the admin can list {:?} in [research] allow",
                        name.map(str::to_string).unwrap_or_else(|| ip.to_string())
                    ),
                ))
            }
        }
    }

    /// All answers for `name`: refused if **any** is denied, so no private address can slip
    /// in beside a public one (happy-eyeballs would try it).
    pub fn check_resolved(&self, name: &str, addrs: &[IpAddr]) -> Result<(), Refusal> {
        if addrs.is_empty() {
            return Err(Refusal::new(
                "resolve",
                format!("{name} has no addresses"),
                "check the host name",
            ));
        }
        for ip in addrs {
            self.check_ip(*ip, Some(name))?;
        }
        Ok(())
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Ip(ip) => write!(f, "{ip}"),
            Target::Name(n) => f.write_str(n),
        }
    }
}

/// IPv4-mapped (`::ffff:a.b.c.d`) and NAT64 (`64:ff9b::a.b.c.d`) addresses become the IPv4
/// address they carry, so the IPv4 rules apply to them.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                let o = v6.octets();
                IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
            } else {
                IpAddr::V6(v6)
            }
        }
        v4 => v4,
    }
}

/// Why a (canonical) address is never reachable, or None for a public one.
pub fn builtin_denied(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_denied(v4),
        IpAddr::V6(v6) => v6_denied(v6),
    }
}

fn v4_denied(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[(&str, &str)] = &[
        (
            "0.0.0.0/8",
            "an unspecified/\"this network\" address (0.0.0.0/8)",
        ),
        ("10.0.0.0/8", "a private address (10.0.0.0/8)"),
        (
            "100.64.0.0/10",
            "a carrier-grade NAT address (100.64.0.0/10)",
        ),
        ("127.0.0.0/8", "a loopback address (127.0.0.0/8)"),
        (
            "169.254.0.0/16",
            "a link-local address, where cloud metadata lives (169.254.0.0/16)",
        ),
        (
            "172.16.0.0/12",
            "a private address, where Docker's bridge networks live (172.16.0.0/12)",
        ),
        ("192.0.0.0/24", "an IETF protocol assignment (192.0.0.0/24)"),
        ("192.0.2.0/24", "a documentation address (192.0.2.0/24)"),
        ("192.88.99.0/24", "a 6to4 relay address (192.88.99.0/24)"),
        ("192.168.0.0/16", "a private address (192.168.0.0/16)"),
        ("198.18.0.0/15", "a benchmarking address (198.18.0.0/15)"),
        (
            "198.51.100.0/24",
            "a documentation address (198.51.100.0/24)",
        ),
        ("203.0.113.0/24", "a documentation address (203.0.113.0/24)"),
        ("224.0.0.0/4", "a multicast address (224.0.0.0/4)"),
        (
            "240.0.0.0/4",
            "a reserved or broadcast address (240.0.0.0/4)",
        ),
    ];
    RANGES.iter().find_map(|(net, label)| {
        net.parse::<ipnet::Ipv4Net>()
            .ok()
            .filter(|n| n.contains(&ip))
            .map(|_| *label)
    })
}

fn v6_denied(ip: Ipv6Addr) -> Option<&'static str> {
    const RANGES: &[(&str, &str)] = &[
        ("::/128", "the unspecified address (::)"),
        ("::1/128", "the loopback address (::1)"),
        ("::/96", "a deprecated IPv4-compatible address (::/96)"),
        (
            "64:ff9b:1::/48",
            "a local-use NAT64 address (64:ff9b:1::/48)",
        ),
        ("100::/64", "a discard-only address (100::/64)"),
        (
            "2001::/32",
            "a Teredo tunnel address, which can reach any IPv4 (2001::/32)",
        ),
        ("2001:2::/48", "a benchmarking address (2001:2::/48)"),
        ("2001:db8::/32", "a documentation address (2001:db8::/32)"),
        (
            "2002::/16",
            "a 6to4 address, which can reach any IPv4 (2002::/16)",
        ),
        ("3fff::/20", "a documentation address (3fff::/20)"),
        ("5f00::/16", "an SRv6 SID address (5f00::/16)"),
        (
            "fc00::/7",
            "a unique-local address, where the AWS IPv6 metadata lives (fc00::/7)",
        ),
        ("fe80::/10", "a link-local address (fe80::/10)"),
        ("fec0::/10", "a deprecated site-local address (fec0::/10)"),
        ("ff00::/8", "a multicast address (ff00::/8)"),
    ];
    RANGES.iter().find_map(|(net, label)| {
        net.parse::<ipnet::Ipv6Net>()
            .ok()
            .filter(|n| n.contains(&ip))
            .map(|_| *label)
    })
}
