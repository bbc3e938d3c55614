//! The host's own addresses and its bridge networks, for the deny list: a Docker API on
//! TCP, a database bound to the public interface or a container on a bridge must not be
//! reachable through a fetch just because its address is not in a private range.

use std::net::IpAddr;

use ipnet::IpNet;

/// Interface name prefixes of bridges and virtual links (Docker, libvirt, podman, CNI):
/// their whole network is refused, not just the host's address on it.
const BRIDGE_PREFIXES: &[&str] = &["docker", "br-", "veth", "virbr", "cni", "podman", "lxc"];

/// Every address of every interface, and the whole network of bridge-like interfaces,
/// each with a label for refusals. Read once per Policy; an error reading interfaces
/// leaves the built-in ranges (which cover loopback and the private ranges) in charge.
pub(super) fn own_networks() -> Vec<(IpNet, String)> {
    // if-addrs: getifaddrs(3) behind a small, widely used crate, rather than our own FFI.
    let Ok(ifaces) = if_addrs::get_if_addrs() else {
        tracing::warn!("cannot list the host's interfaces; only the built-in deny list applies");
        return Vec::new();
    };
    let mut out = Vec::new();
    for iface in ifaces {
        let ip: IpAddr = iface.ip();
        out.push((
            IpNet::from(ip),
            format!(
                "one of this host's own addresses (interface {})",
                iface.name
            ),
        ));
        if BRIDGE_PREFIXES.iter().any(|p| iface.name.starts_with(p)) {
            let prefix = match &iface.addr {
                if_addrs::IfAddr::V4(v4) => u32::from(v4.netmask).count_ones() as u8,
                if_addrs::IfAddr::V6(v6) => u128::from(v6.netmask).count_ones() as u8,
            };
            if let Ok(net) = IpNet::new(ip, prefix) {
                out.push((
                    net.trunc(),
                    format!(
                        "on a container bridge network of this host ({} {})",
                        iface.name,
                        net.trunc()
                    ),
                ));
            }
        }
    }
    out
}
