//! Who the client is: the TCP peer, or, when the peer is one of the `[server]
//! trusted_proxies`, the address that proxy put in `X-Forwarded-For`.
//!
//! The header is written by anyone: a client can send any `X-Forwarded-For` it likes, and a
//! proxy appends the address it saw to what it got. So the header is read only when the peer
//! is a trusted proxy, and then from the right: each trusted proxy's hop is skipped, and the
//! first address that is not a trusted proxy is the client (anything left of it is what the
//! client claimed). A header that cannot be read there (not an address) means the peer is
//! used, as it is when there is no header: the throttle then counts the proxy itself, which
//! only the proxy's own failures can fill now that valid credentials are never throttled.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;

/// The header a reverse proxy adds the client's address to (nginx
/// `$proxy_add_x_forwarded_for`, Caddy's `reverse_proxy` by default).
pub const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// The client address of a request, put in its extensions by the access log layer (the
/// outermost), read by the throttle and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

/// The configured proxies whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

/// One `trusted_proxies` entry that is neither an IP address nor a CIDR network.
#[derive(Debug, thiserror::Error)]
#[error(
    "{entry:?} is not an IP address or a CIDR network (e.g. \"127.0.0.1\", \"10.0.0.0/8\", \"::1\")"
)]
pub struct BadProxy {
    pub entry: String,
}

impl TrustedProxies {
    /// Parses the config's list: addresses (`10.0.0.5`, `::1`) and networks (`10.0.0.0/8`).
    pub fn parse(list: &[String]) -> Result<Self, BadProxy> {
        let nets = list
            .iter()
            .map(|s| {
                let s = s.trim();
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map(|n| n.trunc())
                    .map_err(|_| BadProxy {
                        entry: s.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { nets })
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The client behind `peer`: the peer itself unless it is a trusted proxy that names
    /// another address in `X-Forwarded-For` (the right-most one that is not a trusted proxy).
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.trusts(peer) {
            return peer;
        }
        // Several headers are one list, in order (RFC 9110 §5.3).
        let mut hops: Vec<&str> = Vec::new();
        for value in headers.get_all(X_FORWARDED_FOR) {
            let Ok(v) = value.to_str() else {
                return peer;
            };
            hops.extend(v.split(','));
        }
        let mut client = peer;
        for hop in hops.iter().rev() {
            let Some(ip) = parse_hop(hop) else {
                // Not an address where one must be: nothing further left can be believed.
                return peer;
            };
            client = ip;
            if !self.trusts(ip) {
                return ip;
            }
        }
        // Every hop was a trusted proxy (or there was none): the left-most one.
        client
    }
}

/// One `X-Forwarded-For` element: an address, optionally with a port (`1.2.3.4:5`,
/// `[::1]:5`) or in brackets (`[::1]`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if hop.len() > 64 {
        return None;
    }
    let ip = hop
        .parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            hop.strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .and_then(|h| h.parse().ok())
        })?;
    Some(ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn proxies(list: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_FORWARDED_FOR, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn entries_are_addresses_or_networks() {
        assert!(TrustedProxies::parse(&["127.0.0.1".into(), " 10.0.0.0/8 ".into()]).is_ok());
        assert!(TrustedProxies::parse(&["::1".into(), "fd00::/8".into()]).is_ok());
        for bad in ["localhost", "10.0.0.0/33", "", "1.2.3.4:80"] {
            let err = TrustedProxies::parse(&[bad.to_string()]).unwrap_err();
            assert!(
                err.to_string().contains("not an IP address"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_peer_that_is_not_trusted_is_the_client_whatever_it_forwards() {
        let none = TrustedProxies::default();
        let h = xff(&["203.0.113.9"]);
        assert_eq!(none.client(ip("198.51.100.1"), &h), ip("198.51.100.1"));
        let some = proxies(&["10.0.0.0/8"]);
        assert_eq!(some.client(ip("198.51.100.1"), &h), ip("198.51.100.1"));
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client() {
        let p = proxies(&["127.0.0.1", "10.0.0.0/8"]);
        let peer = ip("127.0.0.1");
        // The client forged the first element; the proxy appended what it saw.
        let h = xff(&["1.1.1.1, 203.0.113.9"]);
        assert_eq!(p.client(peer, &h), ip("203.0.113.9"));
        // A chain of trusted proxies is skipped.
        let h = xff(&["1.1.1.1, 203.0.113.9, 10.1.2.3"]);
        assert_eq!(p.client(peer, &h), ip("203.0.113.9"));
        // Several headers are one list.
        let h = xff(&["1.1.1.1", "203.0.113.9, 10.1.2.3"]);
        assert_eq!(p.client(peer, &h), ip("203.0.113.9"));
        // Ports and brackets as some proxies write them; IPv4-mapped IPv6 as IPv4.
        assert_eq!(
            p.client(peer, &xff(&["[2001:db8::1]:443"])),
            ip("2001:db8::1")
        );
        assert_eq!(
            p.client(peer, &xff(&["::ffff:203.0.113.9"])),
            ip("203.0.113.9")
        );
        // Only trusted hops: the left-most.
        assert_eq!(
            p.client(peer, &xff(&["10.9.9.9, 10.1.2.3"])),
            ip("10.9.9.9")
        );
    }

    #[test]
    fn a_missing_or_malformed_header_means_the_peer() {
        let p = proxies(&["127.0.0.1"]);
        let peer = ip("127.0.0.1");
        assert_eq!(p.client(peer, &HeaderMap::new()), peer);
        for bad in ["garbage", "1.2.3.4, ", "unknown", "203.0.113.9, x"] {
            assert_eq!(p.client(peer, &xff(&[bad])), peer, "{bad}");
        }
        // What is left of the client's address is never read.
        assert_eq!(
            p.client(peer, &xff(&["garbage, 203.0.113.9"])),
            ip("203.0.113.9")
        );
        let mut h = HeaderMap::new();
        h.insert(
            X_FORWARDED_FOR,
            HeaderValue::from_bytes(b"\xff1.2.3.4").unwrap(),
        );
        assert_eq!(p.client(peer, &h), peer);
    }
}
