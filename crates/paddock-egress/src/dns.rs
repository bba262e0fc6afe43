//! DNS answered from the policy. A denied name is never forwarded (query names carry data
//! out); it gets NXDOMAIN without an SOA, so no resolver caches it past a policy change, and
//! an Extended DNS Error (RFC 8914) whose text names the rule. An allowed name is relayed to
//! the host's resolvers; its addresses are checked against the operator's guard and bound to
//! the name for the TCP proxy. Sandboxes get no IPv6 route, so AAAA (and HTTPS/SVCB, which
//! carry address hints and ECH keys) are answered empty, and clients fall back to IPv4 at once.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::{Name, RData, RecordType};
use paddock_core::egress::normalize_name;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::state::{Enforcer, Kind};

/// RFC 8914 option code and the info code used for every denial: 15, "Blocked".
const EDE: u16 = 15;
const EDE_BLOCKED: u16 = 15;
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

fn edns_with_text(text: &str) -> Edns {
    let mut data = EDE_BLOCKED.to_be_bytes().to_vec();
    data.extend(text.as_bytes().iter().take(400));
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    edns.options_mut().insert(EdnsOption::Unknown(EDE, data));
    edns
}

fn reply_to(query: &Message, code: ResponseCode) -> Message {
    let mut m = Message::new(query.metadata.id, MessageType::Response, query.metadata.op_code);
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.metadata.response_code = code;
    m.queries = query.queries.clone();
    if query.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        m.set_edns(edns);
    }
    m
}

/// Answers one query (UDP payload or TCP frame); `None` for bytes that are not a query.
pub async fn answer(enf: &Enforcer, bytes: &[u8]) -> Option<Vec<u8>> {
    let query = match Message::from_vec(bytes) {
        Ok(q) => q,
        Err(_) if bytes.len() >= 12 => {
            // Too malformed to parse: FORMERR with the client's id, so it stops waiting.
            let mut m = Message::new(u16::from_be_bytes([bytes[0], bytes[1]]), MessageType::Response, OpCode::Query);
            m.metadata.response_code = ResponseCode::FormErr;
            return m.to_vec().ok();
        }
        Err(_) => return None,
    };
    if query.metadata.message_type != MessageType::Query {
        return None;
    }
    if query.metadata.op_code != OpCode::Query || query.queries.len() != 1 {
        return reply_to(&query, ResponseCode::NotImp).to_vec().ok();
    }
    let q = &query.queries[0];
    let name = normalize_name(&q.name().to_ascii());
    let policy = enf.policy();
    let decision = policy.decide_name(&name);
    if !decision.allowed() {
        let reason = format!("{name} is denied by the sandbox's egress policy: {}", policy.explain(decision));
        enf.denied(Kind::Dns, name, reason.clone());
        let mut m = reply_to(&query, ResponseCode::NXDomain);
        if query.edns.is_some() {
            m.set_edns(edns_with_text(&reason));
        }
        return m.to_vec().ok();
    }
    enf.allowed(Kind::Dns);
    if let Some((ips, _)) = static_answer(enf, &name) {
        let mut m = reply_to(&query, ResponseCode::NoError);
        if q.query_type() == RecordType::A {
            for ip in ips {
                if let IpAddr::V4(v4) = ip {
                    m.answers.push(hickory_proto::rr::Record::from_rdata(
                        q.name().clone(),
                        STATIC_TTL,
                        RData::A(hickory_proto::rr::rdata::A(v4)),
                    ));
                }
            }
        }
        return m.to_vec().ok();
    }
    if matches!(q.query_type(), RecordType::AAAA | RecordType::HTTPS | RecordType::SVCB) {
        return reply_to(&query, ResponseCode::NoError).to_vec().ok();
    }
    let mut upstream_query = query.clone();
    upstream_query.metadata.id = rand_id();
    let Ok(wire) = upstream_query.to_vec() else {
        return reply_to(&query, ResponseCode::FormErr).to_vec().ok();
    };
    let Some(mut reply) = ask_upstream(&enf.config.upstream, &wire, upstream_query.metadata.id).await else {
        return reply_to(&query, ResponseCode::ServFail).to_vec().ok();
    };
    reply.metadata.id = query.metadata.id;
    let (kept, refused) = filter_answers(enf, &name, &mut reply);
    if kept.is_empty() && !refused.is_empty() {
        let reason = format!("{name} resolved only to addresses no sandbox may reach: {}", refused.join("; "));
        enf.denied(Kind::Dns, name, reason.clone());
        let mut m = reply_to(&query, ResponseCode::NoError);
        if query.edns.is_some() {
            m.set_edns(edns_with_text(&reason));
        }
        return m.to_vec().ok();
    }
    reply.to_vec().ok()
}

const STATIC_TTL: u32 = 60;

/// The operator's own address for a name (`--egress-host`), checked by the guard like any
/// answer and bound to the name.
fn static_answer(enf: &Enforcer, name: &str) -> Option<(Vec<IpAddr>, Vec<String>)> {
    let ips = enf.config.hosts.get(name)?;
    let mut refused = Vec::new();
    let kept: Vec<IpAddr> =
        ips.iter().copied().filter(|ip| enf.reachable(*ip, None).map_err(|e| refused.push(e)).is_ok()).collect();
    enf.bind(name, &kept, STATIC_TTL);
    Some((kept, refused))
}

/// Drops IPv6 and address-hint records and the addresses the guard or the policy's IP rules
/// refuse (as rebinding answers are); binds the rest to the name. Returns the addresses kept and the reasons for those dropped.
fn filter_answers(enf: &Enforcer, name: &str, reply: &mut Message) -> (Vec<IpAddr>, Vec<String>) {
    let mut kept = Vec::new();
    let mut refused = Vec::new();
    let mut ttl = u32::MAX;
    let mut keep = |r: &hickory_proto::rr::Record| match &r.data {
        RData::A(a) => match enf.reachable(IpAddr::V4(a.0), None) {
            Ok(()) => {
                kept.push(IpAddr::V4(a.0));
                ttl = ttl.min(r.ttl);
                true
            }
            Err(e) => {
                refused.push(e);
                false
            }
        },
        RData::AAAA(_) | RData::HTTPS(_) | RData::SVCB(_) => false,
        _ => true,
    };
    reply.answers.retain(&mut keep);
    reply.additionals.retain(|r| !matches!(r.data, RData::A(_) | RData::AAAA(_)));
    enf.bind(name, &kept, ttl);
    (kept, refused)
}

fn rand_id() -> u16 {
    let mut b = [0u8; 2];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).ok();
    u16::from_be_bytes(b)
}

/// Sends a query to each upstream in turn (UDP, then TCP when the answer was truncated).
async fn ask_upstream(upstream: &[SocketAddr], wire: &[u8], id: u16) -> Option<Message> {
    for server in upstream {
        let Ok(Some(reply)) = tokio::time::timeout(UPSTREAM_TIMEOUT, udp_exchange(*server, wire, id)).await else {
            continue;
        };
        if !reply.metadata.truncation {
            return Some(reply);
        }
        if let Ok(Some(reply)) = tokio::time::timeout(UPSTREAM_TIMEOUT, tcp_exchange(*server, wire, id)).await {
            return Some(reply);
        }
    }
    None
}

async fn udp_exchange(server: SocketAddr, wire: &[u8], id: u16) -> Option<Message> {
    let bind: SocketAddr = if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let sock = UdpSocket::bind(bind).await.ok()?;
    sock.connect(server).await.ok()?;
    sock.send(wire).await.ok()?;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = sock.recv(&mut buf).await.ok()?;
        // A reply to another id is stale or forged: keep waiting for ours.
        if let Ok(m) = Message::from_vec(&buf[..n])
            && m.metadata.id == id
        {
            return Some(m);
        }
    }
}

async fn tcp_exchange(server: SocketAddr, wire: &[u8], id: u16) -> Option<Message> {
    let mut s = TcpStream::connect(server).await.ok()?;
    let mut framed = u16::try_from(wire.len()).ok()?.to_be_bytes().to_vec();
    framed.extend_from_slice(wire);
    s.write_all(&framed).await.ok()?;
    let len = s.read_u16().await.ok()?;
    let mut buf = vec![0u8; len.into()];
    s.read_exact(&mut buf).await.ok()?;
    Message::from_vec(&buf).ok().filter(|m| m.metadata.id == id)
}

/// The IPv4 addresses of a name, as the proxy dials them: from a recent answer the sandbox
/// got, else asked of the upstream resolvers now (and checked against the guard and the
/// policy's IP rules). Also says why any address of the answer was dropped.
pub async fn resolve(enf: &Enforcer, name: &str) -> (Vec<IpAddr>, Vec<String>) {
    if let Some(answer) = static_answer(enf, name) {
        return answer;
    }
    if let Some(ips) = enf.cached(name) {
        return (ips, Vec::new());
    }
    let Ok(qname) = Name::from_ascii(format!("{name}.")) else {
        return (Vec::new(), Vec::new());
    };
    let mut q = Message::new(rand_id(), MessageType::Query, OpCode::Query);
    q.metadata.recursion_desired = true;
    q.add_query(hickory_proto::op::Query::query(qname, RecordType::A));
    let Ok(wire) = q.to_vec() else {
        return (Vec::new(), Vec::new());
    };
    match ask_upstream(&enf.config.upstream, &wire, q.metadata.id).await {
        Some(mut reply) => filter_answers(enf, name, &mut reply),
        None => (Vec::new(), Vec::new()),
    }
}

/// Serves DNS over UDP on a socket in the sandbox's network namespace.
pub async fn serve_udp(enf: std::sync::Arc<Enforcer>, sock: UdpSocket) -> std::io::Result<()> {
    let sock = std::sync::Arc::new(sock);
    let mut buf = vec![0u8; 4096];
    // Queries are answered concurrently, but a sandbox cannot queue unbounded work.
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    loop {
        let (n, peer) = sock.recv_from(&mut buf).await?;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let (enf, sock, query) = (enf.clone(), sock.clone(), buf[..n].to_vec());
        tokio::spawn(async move {
            if let Some(reply) = answer(&enf, &query).await {
                let _ = sock.send_to(&reply, peer).await;
            }
            drop(permit);
        });
    }
}

/// Serves DNS over TCP (length-prefixed frames, RFC 1035 §4.2.2).
pub async fn serve_tcp(enf: std::sync::Arc<Enforcer>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    loop {
        let (mut conn, _) = listener.accept().await?;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let enf = enf.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(30), async {
                while let Ok(len) = conn.read_u16().await {
                    let mut q = vec![0u8; len.into()];
                    conn.read_exact(&mut q).await.ok()?;
                    let reply = answer(&enf, &q).await?;
                    let mut framed = u16::try_from(reply.len()).ok()?.to_be_bytes().to_vec();
                    framed.extend(reply);
                    conn.write_all(&framed).await.ok()?;
                }
                Some(())
            })
            .await;
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Config;
    use paddock_core::egress::{Action, EgressPolicy, EgressRule};

    fn query(name: &str, t: RecordType) -> Vec<u8> {
        let mut q = Message::new(0x4242, MessageType::Query, OpCode::Query);
        q.metadata.recursion_desired = true;
        q.add_query(hickory_proto::op::Query::query(Name::from_ascii(name).unwrap(), t));
        q.set_edns(Edns::new());
        q.to_vec().unwrap()
    }

    #[tokio::test]
    async fn a_denied_name_gets_nxdomain_with_the_rule_and_is_never_forwarded() {
        let policy =
            EgressPolicy { default_action: Action::Deny, egress: vec![EgressRule::new(Action::Allow, "ok.test")] };
        // No upstream at all: a forwarded query would get SERVFAIL, not NXDOMAIN.
        let enf = Enforcer::new(policy, Config::default());
        let reply = Message::from_vec(&answer(&enf, &query("evil.test.", RecordType::A)).await.unwrap()).unwrap();
        assert_eq!(reply.metadata.id, 0x4242);
        assert_eq!(reply.metadata.response_code, ResponseCode::NXDomain);
        assert!(reply.authorities.is_empty(), "no SOA, so the denial is not cached");
        let ede = reply.edns.as_ref().unwrap().options().as_ref().iter().find_map(|(_, o)| match o {
            EdnsOption::Unknown(15, d) => Some(String::from_utf8_lossy(&d[2..]).into_owned()),
            _ => None,
        });
        assert!(ede.unwrap().contains("the policy's defaultAction (deny)"));
        assert_eq!(enf.counters().dns_denied, 1);
        assert_eq!(enf.status().denials[0].target, "evil.test");

        let aaaa = Message::from_vec(&answer(&enf, &query("ok.test.", RecordType::AAAA)).await.unwrap()).unwrap();
        assert_eq!((aaaa.metadata.response_code, aaaa.answers.len()), (ResponseCode::NoError, 0));
        let a = Message::from_vec(&answer(&enf, &query("ok.test.", RecordType::A)).await.unwrap()).unwrap();
        assert_eq!(a.metadata.response_code, ResponseCode::ServFail, "allowed, but no upstream answers");
        assert_eq!(answer(&enf, b"\x00\x01").await, None);
    }

    #[tokio::test]
    async fn an_answer_pointing_at_an_address_the_policy_denies_is_dropped_with_the_rule() {
        let policy = EgressPolicy {
            default_action: Action::Allow,
            egress: vec![EgressRule::new(Action::Deny, "198.51.100.0/24")],
        };
        let hosts = [
            ("pinned.test".to_string(), vec!["198.51.100.7".parse().unwrap(), "203.0.113.3".parse().unwrap()]),
            ("gone.test".to_string(), vec!["198.51.100.8".parse().unwrap()]),
        ]
        .into();
        let enf = Enforcer::new(policy, Config { hosts, ..Config::default() });
        let a = Message::from_vec(&answer(&enf, &query("pinned.test.", RecordType::A)).await.unwrap()).unwrap();
        let ips: Vec<String> = a.answers.iter().map(|r| r.data.to_string()).collect();
        assert_eq!(ips, vec!["203.0.113.3".to_string()], "only the address the policy allows");
        let none = Message::from_vec(&answer(&enf, &query("gone.test.", RecordType::A)).await.unwrap()).unwrap();
        assert!(none.answers.is_empty());
    }
}
