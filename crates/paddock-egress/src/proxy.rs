//! The transparent TCP proxy. Every outbound TCP connection of the sandbox arrives here with
//! its original destination kept by conntrack; the proxy reads the client's first message,
//! judges it, and dials from the host's network namespace.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use paddock_core::vault::Scheme;

use crate::inject::Target;
use crate::intercept::Replay;
use crate::sniff::{Hello, sniff};
use crate::state::{Enforcer, Kind};

/// Most proxied connections one sandbox holds at once; beyond it new ones are reset.
pub const MAX_CONNECTIONS: usize = 1024;
/// How long the proxy waits for a client's first bytes before taking the protocol to be one
/// where the server speaks first (SSH servers, SMTP, databases).
const FIRST_BYTES: Duration = Duration::from_millis(300);
const WHOLE_HELLO: Duration = Duration::from_secs(10);
const DIAL: Duration = Duration::from_secs(10);
const RELAY_BUFFER: usize = 256 << 10;

pub async fn serve(enf: Arc<Enforcer>, listener: TcpListener) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (conn, _) = listener.accept().await?;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            enf.denied(Kind::Tcp, "(any)".into(), format!("more than {MAX_CONNECTIONS} connections open at once"));
            reset(conn);
            continue;
        };
        let enf = enf.clone();
        tokio::spawn(async move {
            handle(&enf, conn).await;
            drop(permit);
        });
    }
}

/// Closes with a reset, so the client fails at once instead of waiting.
fn reset(conn: TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(&conn, Some(Duration::ZERO));
    drop(conn);
}

/// Where the sandbox wanted to go, or why the connection is not judged at all.
fn original_destination(conn: &TcpStream) -> Result<SocketAddr, String> {
    let orig = rustix::net::sockopt::ip_original_dst(conn)
        .map_err(|e| format!("its original destination is unknown ({e})"))?;
    let local = conn.local_addr().map_err(|e| e.to_string())?;
    // A connection made straight to the proxy's own port has the listener as its "original"
    // destination; so does anything on the sandbox's own addresses.
    if IpAddr::V4(*orig.ip()) == local.ip() || orig.ip().is_loopback() {
        return Err("it was made to the egress proxy itself".into());
    }
    Ok(SocketAddr::V4(orig))
}

/// What the proxy will dial, or why not.
enum Verdict {
    Dial(Vec<SocketAddr>),
    Deny(String),
}

async fn judge(enf: &Enforcer, orig: SocketAddr, hello: &Hello) -> Verdict {
    // Where no name could be denied, the name it carries does not matter: judged by address.
    if let Hello::Unreadable { tls } = hello
        && !enf.policy().allows_every_name()
    {
        let what = if *tls { "TLS ClientHello" } else { "HTTP request head" };
        return Verdict::Deny(format!(
            "its {what} could not be read whole (malformed, over {} KiB, or not ended within {} s), so the name it carries cannot be judged",
            if *tls { crate::sniff::MAX_CLIENT_HELLO >> 10 } else { crate::sniff::MAX_HEAD >> 10 },
            WHOLE_HELLO.as_secs()
        ));
    }
    let policy = enf.policy();
    if let Some(name) = hello.name() {
        let decision = policy.decide_name(name);
        if !decision.allowed() {
            return Verdict::Deny(format!(
                "{name} is denied by the sandbox's egress policy: {}",
                policy.explain(decision)
            ));
        }
        let (mut ips, mut refused) = crate::dns::resolve(enf, name).await;
        // Addresses bound before a policy change are judged again: a deny rule added since
        // holds for them too.
        ips.retain(|ip| enf.reachable(*ip, Some(orig.port())).map_err(|e| refused.push(e)).is_ok());
        if ips.is_empty() {
            return Verdict::Deny(match refused.first() {
                Some(why) => format!("{name} resolves only to addresses the sandbox may not reach ({why})"),
                None => format!("{name} did not resolve to an address a sandbox may reach"),
            });
        }
        // Only addresses Paddock resolved for this name: the one the client picked if it is
        // among them, else the first. A name that lies about its address reaches nothing else.
        let mut targets: Vec<SocketAddr> = ips.iter().map(|ip| SocketAddr::new(*ip, orig.port())).collect();
        if let Some(i) = targets.iter().position(|t| *t == orig) {
            targets.swap(0, i);
        }
        return Verdict::Dial(targets);
    }
    let ip = orig.ip();
    if let Err(why) = enf.config.guard.check(ip) {
        return Verdict::Deny(why);
    }
    let decision = match policy.decide_ip_rules(ip, Some(orig.port())) {
        Some(d) => d,
        None => {
            // An address Paddock resolved for an allowed name (a protocol without SNI to a
            // name the policy allows, e.g. git over SSH) is allowed like that name.
            let names = enf.names_of(ip);
            match names.iter().map(|n| policy.decide_name(n)).find(|d| d.allowed()) {
                Some(d) => d,
                None => policy.decide_ip(ip, Some(orig.port())),
            }
        }
    };
    if decision.allowed() {
        Verdict::Dial(vec![orig])
    } else {
        Verdict::Deny(format!("{ip} is denied by the sandbox's egress policy: {}", policy.explain(decision)))
    }
}

async fn handle(enf: &Enforcer, mut conn: TcpStream) {
    let orig = match original_destination(&conn) {
        Ok(o) => o,
        Err(why) => {
            enf.denied(Kind::Tcp, "(direct)".into(), format!("connection refused: {why}"));
            return reset(conn);
        }
    };
    let (hello, first) = sniff(&mut conn, FIRST_BYTES, WHOLE_HELLO).await;
    let target = match hello.name() {
        Some(n) => format!("{n} ({orig})"),
        None => orig.to_string(),
    };
    let targets = match judge(enf, orig, &hello).await {
        Verdict::Dial(t) => t,
        Verdict::Deny(why) => {
            enf.denied(Kind::Tcp, target, why.clone());
            return refuse(conn, &hello, &why).await;
        }
    };
    let mut upstream = None;
    let mut last_err = String::new();
    for t in &targets {
        let dialed = match &enf.config.forward {
            Some(proxy) => proxy.connect(*t, DIAL).await,
            None => match tokio::time::timeout(DIAL, TcpStream::connect(t)).await {
                Ok(r) => r.map_err(|e| format!("{t}: {e}")),
                Err(_) => Err(format!("{t}: no answer within {}s", DIAL.as_secs())),
            },
        };
        match dialed {
            Ok(s) => {
                upstream = Some(s);
                break;
            }
            Err(e) => last_err = e,
        }
    }
    let Some(mut upstream) = upstream else {
        if enf.config.forward.is_some() {
            // The operator's proxy refused or failed: logged where the sandbox's owner looks,
            // since the sandbox sees only a reset.
            enf.denied(Kind::Tcp, target, last_err);
        } else {
            // Allowed but unreachable: not a policy denial, so it is not logged as one.
            tracing::debug!(%target, %last_err, "egress dial failed");
        }
        return reset(conn);
    };
    enf.allowed(Kind::Tcp);
    let _ = upstream.set_nodelay(true);
    let _ = conn.set_nodelay(true);
    // Connections to a host the vault binds are looked into; every other one is relayed as is.
    let vault = enf.vault();
    let port = orig.port();
    match (&hello, hello.name()) {
        (Hello::Http(_), Some(name)) if !vault.bindings.is_empty() => {
            let target = Target { scheme: Scheme::Http, host: name.to_string(), port };
            return crate::inject::relay(enf, conn, first, upstream, &target).await;
        }
        (Hello::Tls(_), Some(name)) if vault.takes(Scheme::Https, name, port) => {
            if let Some(i) = &enf.config.interception {
                return intercept(enf, i, conn, first, upstream, name, port).await;
            }
        }
        _ => {}
    }
    if upstream.write_all(&first).await.is_err() {
        return reset(conn);
    }
    // Large buffers: with tokio's 8 KiB default a bulk download costs a wakeup per 8 KiB.
    let _ = tokio::io::copy_bidirectional_with_sizes(&mut conn, &mut upstream, RELAY_BUFFER, RELAY_BUFFER).await;
}

/// Terminates the sandbox's TLS with a certificate from its own CA, dials the upstream with
/// TLS checked against the host's trust, and injects between the two.
async fn intercept(
    enf: &Enforcer,
    i: &crate::intercept::Interception,
    conn: TcpStream,
    first: Vec<u8>,
    upstream: TcpStream,
    name: &str,
    port: u16,
) {
    let target = format!("{name}:{port} (credential proxy)");
    let (acceptor, server_name) = match (i.acceptor(name), crate::intercept::Interception::server_name(name)) {
        (Ok(a), Ok(n)) => (a, n),
        (Err(e), _) | (_, Err(e)) => {
            enf.denied(Kind::Tcp, target, format!("no certificate could be made: {e}"));
            return reset(conn);
        }
    };
    let client = match tokio::time::timeout(WHOLE_HELLO, acceptor.accept(Replay::new(first, conn))).await {
        Ok(Ok(c)) => c,
        _ => return,
    };
    let up = match tokio::time::timeout(DIAL, i.connector().connect(server_name, upstream)).await {
        Ok(Ok(u)) => u,
        Ok(Err(e)) => {
            // The sandbox sees its handshake succeed and the connection close: the reason is
            // in the denial log, since TLS has no place for it.
            enf.denied(Kind::Tcp, target, format!("the upstream's TLS failed (no credential was sent): {e}"));
            return;
        }
        Err(_) => return,
    };
    let t = Target { scheme: Scheme::Https, host: name.to_string(), port };
    crate::inject::relay(enf, client, Vec::new(), up, &t).await;
}

/// Tells the client why, where the protocol lets words through: an HTTP 403 whose body and
/// `X-Paddock-Egress` header say it is a policy decision (so an agent stops retrying), a reset
/// otherwise (TLS has no way to carry text before the server's hello).
async fn refuse(mut conn: TcpStream, hello: &Hello, why: &str) {
    if matches!(hello, Hello::Http(_) | Hello::Unreadable { tls: false }) {
        let _ = conn.write_all(&forbidden("policy denied", why, "network policy")).await;
        let _ = conn.shutdown().await;
        return;
    }
    reset(conn)
}

/// An HTTP 403 whose body and `X-Paddock-Egress` header say the block is deliberate (so an
/// agent stops retrying).
pub(crate) fn forbidden(verb: &str, why: &str, by: &str) -> Vec<u8> {
    denial(
        "403 Forbidden",
        format!(
            "Paddock egress {verb} this request: {why}.\nThis is a deliberate block by the sandbox's {by}, not a network fault; retrying or using another route will not help.\n"
        ),
    )
}

/// A `502` for an upstream's answer that the `by` will not pass on, and why.
pub(crate) fn bad_gateway(why: &str, by: &str) -> Vec<u8> {
    denial(
        "502 Bad Gateway",
        format!(
            "Paddock egress refused the upstream's response: {why}.\nThis is a deliberate block by the sandbox's {by}, not a network fault.\n"
        ),
    )
}

/// A closing answer with `status` and a text body, marked as the enforcer's own.
fn denial(status: &str, body: String) -> Vec<u8> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nX-Paddock-Egress: denied\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    [head.into_bytes(), body.into_bytes()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Config;
    use paddock_core::egress::{Action, EgressPolicy, EgressRule};

    fn allow_all_but(denied: &[&str]) -> EgressPolicy {
        EgressPolicy {
            default_action: Action::Allow,
            egress: denied.iter().map(|t| EgressRule::new(Action::Deny, *t)).collect(),
        }
    }

    fn enforcer(policy: EgressPolicy) -> Arc<Enforcer> {
        let hosts = [("target.test".to_string(), vec!["198.51.100.7".parse().unwrap()])].into();
        Enforcer::new(policy, Config { hosts, ..Config::default() })
    }

    fn denied(v: Verdict) -> String {
        match v {
            Verdict::Deny(why) => why,
            Verdict::Dial(t) => panic!("dialled {t:?}"),
        }
    }

    #[tokio::test]
    async fn an_address_denied_by_ip_or_cidr_is_denied_by_every_way_of_naming_it() {
        let raw: SocketAddr = "198.51.100.7:80".parse().unwrap();
        let other: SocketAddr = "203.0.113.9:443".parse().unwrap();
        for rule in ["198.51.100.7", "198.51.100.0/24"] {
            let enf = enforcer(allow_all_but(&[rule]));
            assert!(denied(judge(&enf, raw, &Hello::Opaque).await).contains(rule));
            // A name that resolves to it, an SNI for that name sent to another address, a false
            // Host header: each would be dialled at the denied address.
            for hello in [Hello::Http(Some("target.test".into())), Hello::Tls(Some("target.test".into()))] {
                for orig in [raw, other] {
                    let why = denied(judge(&enf, orig, &hello).await);
                    assert!(why.contains("target.test resolves only to addresses") && why.contains(rule), "{why}");
                }
            }
            // The sandbox's own DNS gets no address for it either.
            assert!(crate::dns::resolve(&enf, "target.test").await.0.is_empty());
        }
        // Without the rule the same name is dialled at its address, and only there.
        let open = enforcer(allow_all_but(&["192.0.2.0/24"]));
        match judge(&open, other, &Hello::Tls(Some("target.test".into()))).await {
            Verdict::Dial(t) => assert_eq!(t, vec!["198.51.100.7:443".parse::<SocketAddr>().unwrap()]),
            Verdict::Deny(why) => panic!("{why}"),
        }
    }

    #[tokio::test]
    async fn an_address_bound_before_a_deny_rule_was_added_is_denied_after_it() {
        let enf = enforcer(EgressPolicy::allow_all());
        enf.bind("cached.test", &["203.0.113.20".parse().unwrap()], 300);
        let hello = Hello::Http(Some("cached.test".into()));
        let orig: SocketAddr = "203.0.113.20:80".parse().unwrap();
        assert!(matches!(judge(&enf, orig, &hello).await, Verdict::Dial(_)));
        enf.set_policy(allow_all_but(&["203.0.113.20/32"]));
        assert!(denied(judge(&enf, orig, &hello).await).contains("egress rule 0 (deny 203.0.113.20/32)"));
    }

    #[tokio::test]
    async fn a_first_message_that_cannot_be_read_whole_is_refused_even_where_its_address_is_allowed() {
        // Where every name is allowed its name cannot matter: judged by its address.
        let open = enforcer(EgressPolicy::allow_all());
        let orig: SocketAddr = "203.0.113.9:443".parse().unwrap();
        assert!(matches!(judge(&open, orig, &Hello::Unreadable { tls: true }).await, Verdict::Dial(_)));
        let enf = enforcer(allow_all_but(&["evil.test"]));
        let why = denied(judge(&enf, orig, &Hello::Unreadable { tls: true }).await);
        assert!(why.contains("TLS ClientHello could not be read whole"), "{why}");
        let why = denied(judge(&enf, orig, &Hello::Unreadable { tls: false }).await);
        assert!(why.contains("HTTP request head"), "{why}");
        assert!(matches!(judge(&enf, orig, &Hello::Opaque).await, Verdict::Dial(_)));
    }
}
