//! Addresses no sandbox may reach whatever its policy says: checked on every address Paddock
//! is about to dial and every address a DNS answer carries (against DNS rebinding).

use std::net::IpAddr;

use ipnet::IpNet;
use paddock_core::egress::canonical;

/// Ranges that are private to some network: reachable only where the operator allows them.
const PRIVATE: &[&str] =
    &["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "198.18.0.0/15", "fc00::/7"];

/// Ranges never reachable: this host (loopback, unspecified), the link (link-local, which
/// holds the cloud metadata address 169.254.169.254), multicast and broadcast.
const NEVER: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "fe80::/10",
    "ff00::/8",
    "fd00:ec2::254/128",
];

/// The operator's list, fixed when the enforcer starts, and the host's own addresses, which
/// are also asked of the kernel on every check (an address gained later counts too).
#[derive(Debug, Clone, Default)]
pub struct Guard {
    own: Vec<IpAddr>,
    blocked: Vec<IpNet>,
    allowed_private: Vec<IpNet>,
    /// Whether a bind tells local from foreign addresses here (false where the host lets
    /// sockets bind foreign addresses: then only the snapshot `own` is known).
    live_v4: bool,
    live_v6: bool,
}

/// Whether `ip` is one of this host's addresses now. A socket binds only a local address
/// (EADDRNOTAVAIL otherwise), so this asks the kernel's own table, current to the moment;
/// the alternative, following netlink address events, would leave a window between an
/// address appearing and the event being read. Only "not available" means foreign: any other
/// failure (out of descriptors) counts as the host's, so the check fails closed.
fn is_local_now(ip: IpAddr) -> bool {
    match std::net::UdpSocket::bind(std::net::SocketAddr::new(ip, 0)) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() != Some(rustix::io::Errno::ADDRNOTAVAIL.raw_os_error()),
    }
}

/// `net.ipv4.ip_nonlocal_bind` (or its IPv6 twin) lets any address bind: the live check
/// would then call everything local.
#[expect(clippy::disallowed_methods, reason = "/proc/sys is kernel memory, read when the enforcer starts")]
fn nonlocal_bind(family: &str) -> bool {
    std::fs::read_to_string(format!("/proc/sys/net/{family}/ip_nonlocal_bind")).is_ok_and(|v| v.trim() != "0")
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().filter_map(|s| s.parse().ok()).collect()
}

impl Guard {
    /// `own`: the host's addresses (they carry the host's identity); `blocked`: the operator's
    /// extra ranges; `allowed_private`: private ranges the operator lets sandboxes reach.
    pub fn new(own: Vec<IpAddr>, blocked: Vec<IpNet>, allowed_private: Vec<IpNet>) -> Self {
        Self {
            own: own.into_iter().map(canonical).collect(),
            blocked,
            allowed_private,
            live_v4: !nonlocal_bind("ipv4"),
            live_v6: !nonlocal_bind("ipv6"),
        }
    }

    /// `Err` says why the address is never reachable.
    pub fn check(&self, ip: IpAddr) -> Result<(), String> {
        let ip = canonical(ip);
        if nets(NEVER).iter().any(|n| n.contains(&ip)) || ip == IpAddr::from([255, 255, 255, 255]) {
            return Err(format!(
                "{ip} is loopback, link-local (cloud metadata), multicast or unspecified, which no sandbox may reach"
            ));
        }
        let live = match ip {
            IpAddr::V4(_) => self.live_v4,
            IpAddr::V6(_) => self.live_v6,
        };
        if self.own.contains(&ip) || (live && is_local_now(ip)) {
            return Err(format!("{ip} is an address of the host itself, which no sandbox may reach"));
        }
        if self.blocked.iter().any(|n| n.contains(&ip)) {
            return Err(format!("{ip} is on the operator's blocked list (--egress-block)"));
        }
        if nets(PRIVATE).iter().any(|n| n.contains(&ip)) && !self.allowed_private.iter().any(|n| n.contains(&ip)) {
            return Err(format!(
                "{ip} is in a private range, which sandboxes may reach only where the operator allows it (--egress-allow-private)"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_link_and_private_addresses_are_refused_unless_the_operator_allows_them() {
        let g = Guard::new(
            vec!["203.0.113.7".parse().unwrap()],
            vec!["198.51.100.0/24".parse().unwrap()],
            vec!["10.77.0.0/16".parse().unwrap()],
        );
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "::1",
            "::ffff:127.0.0.1",
            "203.0.113.7",
            "198.51.100.9",
            "10.1.0.1",
            "192.168.1.1",
            "0.0.0.0",
            "224.0.0.1",
        ] {
            assert!(g.check(ip.parse().unwrap()).is_err(), "{ip} passed");
        }
        for ip in ["10.77.3.4", "93.184.216.34", "2001:db8::1"] {
            assert!(g.check(ip.parse().unwrap()).is_ok(), "{ip} refused");
        }
        assert!(g.check("10.1.0.1".parse().unwrap()).unwrap_err().contains("--egress-allow-private"));
    }

    #[test]
    fn an_address_of_the_host_is_refused_even_when_it_was_not_in_the_snapshot() {
        // The address this host would send from towards a TEST-NET address: a UDP connect
        // only picks a route and a source, it sends nothing.
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        probe.connect("192.0.2.1:9").expect("this host has a route besides loopback");
        let ip = probe.local_addr().unwrap().ip();
        assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
        // Its range allowed, so only "it is the host's" can refuse it.
        let g = Guard::new(vec![], vec![], vec![IpNet::from(ip)]);
        assert!(g.live_v4, "net.ipv4.ip_nonlocal_bind is on here, so only the snapshot is known");
        let why = g.check(ip).unwrap_err();
        assert!(why.contains("an address of the host itself"), "{why}");
        assert!(g.check("192.0.2.77".parse().unwrap()).is_ok(), "a TEST-NET address is not the host's");
    }
}
