//! Paddock's egress enforcer. One runs per sandbox that may reach the outside: its listeners
//! live in the sandbox's network namespace (where every outbound TCP connection and DNS query
//! is redirected to them), and every socket it opens towards the outside lives in the host's.
//! So a sandbox reaches exactly what this code decides to dial for it:
//!
//! - DNS ([`dns`]): a name the policy denies gets NXDOMAIN with an Extended DNS Error naming
//!   the rule, and is never forwarded; an allowed one is relayed to the host's resolvers, and
//!   the addresses in the answer are remembered as that name's.
//! - TCP ([`proxy`]): the TLS ClientHello's server name or the HTTP `Host` is judged against
//!   the domain rules, and the connection is dialed to the addresses Paddock resolved for that
//!   name, never to the address the sandbox asked for. A connection without a name is judged
//!   by the IP rules, or allowed when Paddock resolved its address for an allowed name.
//! - The operator's [`guard::Guard`] (loopback, link-local and metadata, the host's own
//!   addresses, private ranges unless allowed) comes before every policy.
//! - In forward mode ([`forward`]) allowed connections are dialed through the operator's HTTP
//!   proxy (`CONNECT` to the judged address) instead of directly.

pub mod control;
pub mod dns;
pub mod forward;
pub mod guard;
pub mod inject;
pub mod intercept;
pub mod proxy;
mod responses;
pub mod sniff;
pub mod state;

pub use state::Enforcer;

/// The sockets an enforcer serves, made by the caller in the right network namespaces:
/// `proxy` and the DNS pair inside the sandbox's, `control` on the host.
pub struct Listeners {
    pub proxy: std::net::TcpListener,
    pub dns_udp: std::net::UdpSocket,
    pub dns_tcp: std::net::TcpListener,
    pub control: std::os::unix::net::UnixListener,
}

/// Serves until one of the listeners fails (it does not while its namespace lives).
pub async fn run(
    enf: std::sync::Arc<Enforcer>,
    l: Listeners,
    on_set: std::sync::Arc<dyn Fn(&paddock_core::egress::EgressPolicy) + Send + Sync>,
) -> std::io::Result<()> {
    l.proxy.set_nonblocking(true)?;
    l.dns_udp.set_nonblocking(true)?;
    l.dns_tcp.set_nonblocking(true)?;
    l.control.set_nonblocking(true)?;
    let proxy = tokio::net::TcpListener::from_std(l.proxy)?;
    let udp = tokio::net::UdpSocket::from_std(l.dns_udp)?;
    let dns_tcp = tokio::net::TcpListener::from_std(l.dns_tcp)?;
    let control = tokio::net::UnixListener::from_std(l.control)?;
    tokio::select! {
        r = proxy::serve(enf.clone(), proxy) => r,
        r = dns::serve_udp(enf.clone(), udp) => r,
        r = dns::serve_tcp(enf.clone(), dns_tcp) => r,
        r = control::serve(enf, control, on_set) => r,
    }
}
