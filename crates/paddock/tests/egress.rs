//! Egress policy on the local runtime, against a private "outside world" (`e2e/egress_world.py`:
//! a network namespace of the test's own with DNS, HTTP and HTTPS servers and a test CA) and
//! never a real outside host. Every sandbox is first proven confined (uid 1000, no
//! capabilities); the targets denied are the world's own addresses, the host's end of the
//! test's veth, and a link-local address in the world's namespace that stands in for the cloud
//! metadata address (no test aims at the real one, nor at any address off this machine).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::{Env, sh};
use paddock_core::egress::{Action, EgressPolicy, EgressRule};
use paddock_core::runtime::Runtime;
use paddock_core::spec::{NetworkPolicy, SandboxSpec};

struct World {
    child: Child,
    ca: String,
    ca_path: String,
    dns: String,
    ip: String,
    raw_ip: String,
    host_ip: String,
    /// A link-local address in the world's namespace: stands in for the cloud metadata address.
    link_local_ip: String,
}

impl World {
    fn up(tag: &str, net: &str) -> Self {
        common::require_root();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../e2e/egress_world.py");
        let name = format!("{tag}{}", std::process::id() % 10000);
        let mut child = Command::new("python3")
            .args([script, "--name", &name, "--net", net])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the test world");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("the world did not start: {e}: {line:?}"));
        let s = |k: &str| v[k].as_str().unwrap().to_owned();
        World {
            ca: std::fs::read_to_string(s("ca")).unwrap(),
            ca_path: s("ca"),
            dns: s("dns"),
            ip: s("ip"),
            raw_ip: s("raw_ip"),
            host_ip: s("host_ip"),
            link_local_ip: s("link_local_ip"),
            child,
        }
    }

    /// A runtime that resolves with the world's DNS and may reach the world's two addresses
    /// (they are in a private range, which is refused unless the operator allows it).
    fn env(&self) -> Env {
        let mut env = Env::new();
        env.rt = env.rt.clone().with_egress(self.options());
        env
    }

    fn options(&self) -> paddock_runtime_local::EgressOptions {
        paddock_runtime_local::EgressOptions {
            blocked: vec![],
            allowed_private: vec![
                format!("{}/32", self.ip).parse().unwrap(),
                format!("{}/32", self.raw_ip).parse().unwrap(),
            ],
            dns: vec![format!("{}:53", self.dns).parse().unwrap()],
            ..Default::default()
        }
    }
}

impl World {
    /// The world's CA at `/tmp/ca.pem` in the sandbox, for curl's `--cacert`.
    async fn put_ca(&self, env: &Env, id: &paddock_core::runtime::SandboxId) {
        let request = paddock_core::runtime::ExecRequest::shell("cat > /tmp/ca.pem");
        let put = common::exec(&env.rt, id, request, Some(self.ca.clone().into_bytes())).await;
        assert_eq!(put.code(), 0, "{}", put.stderr);
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Closing its stdin tears the world down.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn rules(default: Action, rules: &[(Action, &str)]) -> EgressPolicy {
    EgressPolicy { default_action: default, egress: rules.iter().map(|(a, t)| EgressRule::new(*a, *t)).collect() }
}

fn spec(policy: EgressPolicy) -> SandboxSpec {
    SandboxSpec { network: NetworkPolicy::Egress(policy), ..Default::default() }
}

/// A DNS query from inside the sandbox, to whatever server its resolv.conf names: the rcode,
/// and the Extended DNS Error text if any.
const DNS_QUERY: &str = r#"
import socket, struct, sys
name = sys.argv[1]
q = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 1)
q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack("!HH", 1, 1)
q += b"\0" + struct.pack("!HHIH", 41, 1232, 0, 0)
server = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
try:
    s.sendto(q, (server, 53))
    r = s.recv(4096)
except OSError as e:
    print("error", e.errno)
    sys.exit(0)
print("rcode", r[3] & 15, r[12:].decode(errors="replace"))
"#;

async fn dns(env: &Env, id: &paddock_core::runtime::SandboxId, name: &str) -> String {
    let script = format!("python3 -c '{}' {name}", DNS_QUERY.replace('\'', "'\\''"));
    let out = sh(&env.rt, id, &script).await;
    assert_eq!(out.code(), 0, "{}", out.stderr);
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_policy_reaches_only_what_it_allows_and_says_why_it_denies() {
    let world = World::up("r", "10.77.41");
    let env = world.env();
    let id = env
        .confined(spec(rules(Action::Deny, &[(Action::Allow, "allowed.test"), (Action::Allow, "*.wild.test")])))
        .await;
    world.put_ca(&env, &id).await;
    // A listener on the host's own end of the world's link: no sandbox may reach it.
    let host_listener = std::net::TcpListener::bind((world.host_ip.as_str(), 0)).unwrap();
    host_listener.set_nonblocking(true).unwrap();
    let host_port = host_listener.local_addr().unwrap().port();

    // Allowed names answer over HTTPS with plain curl: no proxy settings anywhere.
    let ok = sh(&env.rt, &id, "env | grep -i _proxy; curl -sS -m 10 --cacert /tmp/ca.pem https://allowed.test/ https://x.wild.test/ http://a.b.wild.test/").await;
    assert_eq!(
        ok.stdout,
        "hello from outside host=allowed.test sni=allowed.test\nhello from outside host=x.wild.test sni=x.wild.test\nhello from outside host=a.b.wild.test sni=-\n",
        "{}",
        ok.stderr
    );

    // A denied name: NXDOMAIN with the rule in the Extended DNS Error, and curl cannot resolve it.
    let denied = dns(&env, &id, "denied.test").await;
    assert!(denied.starts_with("rcode 3 ") && denied.contains("denied by the sandbox's egress policy"), "{denied}");
    assert_eq!(sh(&env.rt, &id, "curl -sS -m 5 https://denied.test/").await.code(), 6);

    // The wrong name to an allowed address: the proxy judges the SNI, and resets.
    let spoof = sh(
        &env.rt,
        &id,
        &format!("curl -sS -m 5 --cacert /tmp/ca.pem --resolve denied.test:443:{} https://denied.test/", world.ip),
    )
    .await;
    assert_ne!(spoof.code(), 0, "a denied SNI got through: {}", spoof.stdout);
    assert!(!spoof.stdout.contains("hello"));

    // A raw address no rule allows and no allowed name resolved to: a 403 that says why.
    let raw = sh(&env.rt, &id, &format!("curl -sS -m 5 -w '%{{http_code}}' http://{}/", world.raw_ip)).await;
    assert!(raw.stdout.ends_with("403") && raw.stdout.contains("egress policy denied"), "{raw:?}");

    // UDP other than DNS never leaves: the sandbox's send fails at once.
    let udp = sh(
        &env.rt,
        &id,
        &format!("python3 -c 'import socket; socket.socket(2, 2).sendto(b\"x\", (\"{}\", 9999))' 2>&1", world.ip),
    )
    .await;
    assert!(udp.stdout.contains("Operation not permitted"), "{udp:?}");

    // The host's own address and the metadata address, by name and by address.
    assert!(dns(&env, &id, "hostaddr.test").await.starts_with("rcode 3"), "not an allowed name");
    for target in [format!("{}:{host_port}", world.host_ip), world.link_local_ip.clone()] {
        let out = sh(&env.rt, &id, &format!("curl -sS -m 5 -o /dev/null -w '%{{http_code}}' http://{target}/")).await;
        assert_eq!(out.stdout, "403", "{target}: {out:?}");
    }
    assert!(host_listener.accept().is_err(), "a connection reached the host's own address");

    // The sandbox cannot touch what enforces its policy: the table, the route, the listeners.
    let tamper = sh(
        &env.rt,
        &id,
        "nft flush ruleset; echo nft=$?; ip route del default; echo route=$?; ip link set pdk0 down; echo link=$?",
    )
    .await;
    assert!(
        tamper.stdout.contains("nft=1") && tamper.stdout.contains("route=2") && tamper.stdout.contains("link=2"),
        "{tamper:?}"
    );
    let direct = sh(&env.rt, &id, "for p in $(ss -Hltn | awk '{print $4}' | grep '^127.0.0.1:' | cut -d: -f2); do curl -sS -m 3 -o /dev/null -w '%{http_code} ' -H 'Host: allowed.test' http://127.0.0.1:$p/; done").await;
    assert!(!direct.stdout.contains("200"), "a direct connection to the enforcer went through: {direct:?}");
    let still = sh(
        &env.rt,
        &id,
        "curl -sS -m 10 --cacert /tmp/ca.pem https://allowed.test/; curl -sS -m 5 https://denied.test/; echo $?",
    )
    .await;
    assert_eq!(still.stdout, "hello from outside host=allowed.test sni=allowed.test\n6\n", "{}", still.stderr);

    // A change applies to the very next connection, without restarting anything.
    env.rt
        .set_egress(
            &id,
            rules(Action::Deny, &[(Action::Deny, "allowed.test"), (Action::Allow, "denied.test")]).validated().unwrap(),
        )
        .await
        .unwrap();
    let flipped = sh(
        &env.rt,
        &id,
        "curl -sS -m 10 --cacert /tmp/ca.pem https://denied.test/; curl -sS -m 5 https://allowed.test/; echo $?",
    )
    .await;
    assert_eq!(flipped.stdout, "hello from outside host=denied.test sni=denied.test\n6\n", "{}", flipped.stderr);

    let status = env.rt.egress(&id).await.unwrap();
    assert_eq!(status.enforcement, paddock_core::egress::Enforcement::DnsProxy);
    assert!(
        status.counters.connections_allowed >= 3 && status.counters.connections_denied >= 3,
        "{:?}",
        status.counters
    );
    assert!(status.counters.dns_denied >= 2);
    assert!(status.denials.iter().any(|d| d.kind == "tcp" && d.target.contains(&world.raw_ip)), "{:?}", status.denials);
    assert!(
        status.denials.iter().any(|d| d.reason.contains("egress rule 0 (deny allowed.test)")),
        "{:?}",
        status.denials
    );
    let metrics = env.rt.metrics(&id).await.unwrap();
    assert_eq!(metrics.egress.unwrap().connections_denied, status.counters.connections_denied);

    // The enforcer ends with its sandbox.
    env.rt.destroy(&id).await.unwrap();
    let gone = (0..50).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        !enforcer_running(id.as_str())
    });
    assert!(gone, "the egress enforcer of {id} outlived its sandbox");
}

fn enforcer_running(id: &str) -> bool {
    enforcer_pid(id).is_some()
}

fn enforcer_pid(id: &str) -> Option<std::path::PathBuf> {
    std::fs::read_dir("/proc").unwrap().flatten().map(|p| p.path()).find(|p| {
        std::fs::read(p.join("cmdline"))
            .map(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("__egress") && c.contains(id)
            })
            .unwrap_or(false)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_has_no_route_and_no_dns_until_a_change_opens_it() {
    let world = World::up("d", "10.77.42");
    let env = world.env();
    let id = env.confined(SandboxSpec::default()).await;
    let status = env.rt.egress(&id).await.unwrap();
    assert_eq!((status.policy.mode(), status.enforcement.as_str()), ("deny_all", "network-namespace"));
    let routes = sh(&env.rt, &id, "ip route; ip -6 route").await;
    assert!(!routes.stdout.contains("default"), "a deny-all sandbox has a way out: {}", routes.stdout);
    // No DNS at all: the query cannot even be sent.
    let q = dns(&env, &id, "allowed.test").await;
    assert_eq!(q.trim(), "error 101", "ENETUNREACH expected: {q}");
    assert_ne!(sh(&env.rt, &id, &format!("curl -sS -m 3 http://{}/", world.ip)).await.code(), 0);

    // Opened while it runs.
    env.rt.set_egress(&id, EgressPolicy::allow_all().validated().unwrap()).await.unwrap();
    let out = sh(&env.rt, &id, "curl -sS -m 10 http://allowed.test/").await;
    assert_eq!(out.stdout, "hello from outside host=allowed.test sni=-\n", "{}", out.stderr);
    // And closed again.
    env.rt.set_egress(&id, EgressPolicy::deny_all().validated().unwrap()).await.unwrap();
    assert_eq!(sh(&env.rt, &id, "curl -sS -m 5 http://allowed.test/").await.code(), 6);
}

/// A sandbox that only needs its gateway gets an enforcer without the veth and the redirect
/// table (a faster start; its namespace has no route out), and a policy that opens anything
/// replaces that enforcer with one that has them, the gateway's listener included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_sandbox_starts_without_rules_and_a_change_puts_them_in() {
    let world = World::up("g", "10.77.47");
    let env = world.env();
    // The gateway's upstream is a listener of this test that answers one line.
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gateway = upstream.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut conn in upstream.incoming().flatten() {
            // The forwarder's line, then the request's head: read before answering.
            let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while std::io::BufRead::read_line(&mut reader, &mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let _ = std::io::Write::write_all(&mut conn, b"HTTP/1.0 200 OK\r\n\r\nhome\n");
        }
    });
    let id = env.confined(SandboxSpec { gateway: Some(gateway), ..Default::default() }).await;
    let bare = env.data().join("sandboxes").join(id.as_str()).join("egress.bare");
    assert!(bare.exists(), "a deny-all gateway sandbox's enforcer has no rules");
    let routes = sh(&env.rt, &id, "ip route").await;
    let links = sh(&env.rt, &id, "ip link").await;
    assert!(!routes.stdout.contains("default") && !links.stdout.contains("pdk0"), "{}{}", routes.stdout, links.stdout);
    let home = sh(&env.rt, &id, "curl -sS -m 5 \"$PADDOCK_GATEWAY/\"").await;
    assert!(home.stdout.ends_with("home\n"), "the gateway answers: {} {}", home.stdout, home.stderr);
    assert_ne!(sh(&env.rt, &id, &format!("curl -sS -m 3 http://{}/", world.ip)).await.code(), 0);

    env.rt.set_egress(&id, EgressPolicy::allow_all().validated().unwrap()).await.unwrap();
    assert!(!bare.exists(), "the enforcer was replaced by one with rules");
    let out = sh(&env.rt, &id, "curl -sS -m 10 http://allowed.test/").await;
    assert_eq!(out.stdout, "hello from outside host=allowed.test sni=-\n", "{}", out.stderr);
    let home = sh(&env.rt, &id, "curl -sS -m 5 \"$PADDOCK_GATEWAY/\"").await;
    assert!(home.stdout.ends_with("home\n"), "the gateway still answers: {} {}", home.stdout, home.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_all_still_refuses_the_host_metadata_loopback_and_private_ranges() {
    let world = World::up("a", "10.77.43");
    let env = world.env();
    let id = env.confined(spec(EgressPolicy::allow_all())).await;
    // The enforcer itself: not root, filtered, no_new_privs, and not dumpable (its /proc
    // files then belong to root, so no process of its uid can read its memory).
    let proc = enforcer_pid(id.as_str()).expect("the enforcer runs");
    let status = std::fs::read_to_string(proc.join("status")).unwrap();
    let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(str::trim).unwrap_or("").to_owned();
    assert!(!field("Uid:").starts_with("0"), "{status}");
    assert_eq!((field("Seccomp:"), field("NoNewPrivs:")), ("2".into(), "1".into()), "{status}");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(proc.join("mem")).unwrap()), 0, "dumpable");
    let out = sh(&env.rt, &id, &format!("curl -sS -m 10 http://allowed.test/ http://{}/", world.raw_ip)).await;
    assert_eq!(
        out.stdout,
        format!("hello from outside host=allowed.test sni=-\nhello from outside host={} sni=-\n", world.raw_ip),
        "{}",
        out.stderr
    );
    // Private and link-local addresses no rule allows, all routed into the world's namespace
    // (never off this machine, should the guard fail).
    let unallowed_private = format!("{}.9", world.raw_ip.rsplit_once('.').unwrap().0);
    for target in [world.host_ip.clone(), world.link_local_ip.clone(), unallowed_private] {
        let out = sh(&env.rt, &id, &format!("curl -sS -m 5 -o /dev/null -w '%{{http_code}}' http://{target}/")).await;
        assert_eq!(out.stdout, "403", "{target}: {out:?}");
    }
    // Names that resolve only to refused addresses (DNS rebinding) resolve to nothing.
    for name in ["rebind.test", "hostaddr.test", "metadata.test"] {
        let q = dns(&env, &id, name).await;
        assert!(q.starts_with("rcode 0 ") && q.contains("no sandbox may reach"), "{name}: {q}");
        assert_eq!(sh(&env.rt, &id, &format!("curl -sS -m 5 http://{name}/")).await.code(), 6, "{name}");
    }
}

/// An IP or CIDR deny rule holds for every way of reaching the address: by its address, by a
/// name that resolves to it (DNS drops the answer), by a false `Host` header or a TLS SNI sent
/// to another address (the proxy would dial the name's address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_rule_for_an_address_holds_for_every_name_that_leads_there() {
    let world = World::up("n", "10.77.44");
    let env = world.env();
    let id = env.confined(spec(EgressPolicy::allow_all())).await;
    world.put_ca(&env, &id).await;
    // Before the rule: the name reaches the world's address.
    let open = sh(&env.rt, &id, "curl -sS -m 10 http://allowed.test/").await;
    assert_eq!(open.stdout, "hello from outside host=allowed.test sni=-\n", "{}", open.stderr);

    for rule in [world.ip.clone(), format!("{}/32", world.ip)] {
        env.rt.set_egress(&id, rules(Action::Allow, &[(Action::Deny, &rule)]).validated().unwrap()).await.unwrap();
        let raw = sh(&env.rt, &id, &format!("curl -sS -m 5 -w '%{{http_code}}' http://{}/", world.ip)).await;
        assert!(raw.stdout.ends_with("403"), "{rule}: {raw:?}");
        // The name: no address for it.
        let q = dns(&env, &id, "allowed.test").await;
        assert!(q.starts_with("rcode 0 ") && q.contains(&format!("egress rule 0 (deny {rule})")), "{rule}: {q}");
        assert_eq!(sh(&env.rt, &id, "curl -sS -m 5 http://allowed.test/").await.code(), 6, "{rule}");
        // A false Host to an address the policy allows: a 403 naming the rule, not the page.
        let host = sh(
            &env.rt,
            &id,
            &format!("curl -sS -m 5 -w ' %{{http_code}}' -H 'Host: allowed.test' http://{}/", world.raw_ip),
        )
        .await;
        assert!(host.stdout.ends_with(" 403") && host.stdout.contains(&format!("deny {rule}")), "{rule}: {host:?}");
        // The SNI of the name, sent to the allowed address: reset, never answered.
        let sni = sh(
            &env.rt,
            &id,
            &format!(
                "curl -sS -m 5 --cacert /tmp/ca.pem --resolve allowed.test:443:{} https://allowed.test/",
                world.raw_ip
            ),
        )
        .await;
        assert!(sni.code() != 0 && !sni.stdout.contains("hello"), "{rule}: {sni:?}");
        // The other address stays reachable.
        let other = sh(&env.rt, &id, &format!("curl -sS -m 10 http://{}/", world.raw_ip)).await;
        assert_eq!(other.stdout, format!("hello from outside host={} sni=-\n", world.raw_ip), "{}", other.stderr);
    }
    let status = env.rt.egress(&id).await.unwrap();
    assert!(
        status.denials.iter().any(|d| d.reason.contains("allowed.test resolves only to addresses")),
        "{:?}",
        status.denials
    );
}

/// An address the host gains after a sandbox's enforcer started (a new interface, a VPN, a
/// DHCP lease) is the host's too: refused as the host's other addresses are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_the_host_gains_later_is_refused_like_its_others() {
    let world = World::up("h", "10.77.45");
    let env = world.env();
    let id = env.confined(spec(EgressPolicy::allow_all())).await;
    // A TEST-NET address on a veth pair of this test's own (both ends in the host's namespace),
    // added only now.
    let link = format!("pdkh{}", std::process::id() % 100_000);
    let addr = "198.51.100.77";
    struct Dummy(String);
    impl Drop for Dummy {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["link", "del", &self.0]).status();
        }
    }
    let peer = format!("{link}p");
    assert!(
        Command::new("ip")
            .args(["link", "add", &link, "type", "veth", "peer", "name", &peer])
            .status()
            .unwrap()
            .success()
    );
    let _dummy = Dummy(link.clone());
    assert!(Command::new("ip").args(["addr", "add", &format!("{addr}/32"), "dev", &link]).status().unwrap().success());
    assert!(Command::new("ip").args(["link", "set", &link, "up"]).status().unwrap().success());
    let listener = std::net::TcpListener::bind((addr, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();

    let out = sh(&env.rt, &id, &format!("curl -sS -m 5 -w ' %{{http_code}}' http://{addr}:{port}/")).await;
    assert!(out.stdout.ends_with(" 403") && out.stdout.contains("an address of the host itself"), "{out:?}");
    assert!(listener.accept().is_err(), "a connection reached the host's new address");
    // The world stays reachable: only the host's address is refused.
    let ok = sh(&env.rt, &id, "curl -sS -m 10 http://allowed.test/").await;
    assert_eq!(ok.stdout, "hello from outside host=allowed.test sni=-\n", "{}", ok.stderr);
}

/// Rules scoped to TCP ports (OpenSandbox 1.2's `ports`): an address allowed on one port only,
/// and a denial of a port for every address, which holds for an allowed name's address too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_scoped_to_ports_hold_on_those_ports_only() {
    let world = World::up("p", "10.77.48");
    let env = world.env();
    let ported =
        |action, target: &str, ports: &[u32]| EgressRule { action, target: target.into(), ports: Some(ports.to_vec()) };
    let policy = EgressPolicy {
        default_action: Action::Deny,
        egress: vec![
            ported(Action::Allow, &world.raw_ip, &[80]),
            EgressRule::new(Action::Allow, "allowed.test"),
            ported(Action::Deny, "", &[443]),
        ],
    };
    let id = env.confined(spec(policy)).await;
    world.put_ca(&env, &id).await;
    let http = sh(&env.rt, &id, &format!("curl -sS -m 10 http://{}/", world.raw_ip)).await;
    assert_eq!(http.stdout, format!("hello from outside host={} sni=-\n", world.raw_ip), "{}", http.stderr);
    // The same address on a port its rule does not name.
    let https = sh(&env.rt, &id, &format!("curl -sS -m 5 -k https://{}/", world.raw_ip)).await;
    assert!(https.code() != 0 && !https.stdout.contains("hello"), "{https:?}");
    // An allowed name: its port 80 is open, its 443 is denied by the rule of ports only.
    let name = sh(&env.rt, &id, "curl -sS -m 10 http://allowed.test/").await;
    assert_eq!(name.stdout, "hello from outside host=allowed.test sni=-\n", "{}", name.stderr);
    let tls = sh(&env.rt, &id, "curl -sS -m 5 --cacert /tmp/ca.pem https://allowed.test/").await;
    assert!(tls.code() != 0 && !tls.stdout.contains("hello"), "{tls:?}");
    let status = env.rt.egress(&id).await.unwrap();
    assert!(status.denials.iter().any(|d| d.reason.contains("egress rule 2 (deny ports 443)")), "{:?}", status.denials);
    assert!(status.denials.iter().any(|d| d.target.contains(&format!("{}:443", world.raw_ip))), "{:?}", status.denials);
    // A change moves the port: 443 opens for the address, 80 closes.
    env.rt
        .set_egress(
            &id,
            EgressPolicy { default_action: Action::Deny, egress: vec![ported(Action::Allow, &world.raw_ip, &[443])] }
                .validated()
                .unwrap(),
        )
        .await
        .unwrap();
    let moved = sh(
        &env.rt,
        &id,
        &format!("curl -sS -m 10 -k https://{0}/; curl -sS -m 5 -w ' %{{http_code}}' http://{0}/", world.raw_ip),
    )
    .await;
    assert!(moved.stdout.starts_with(&format!("hello from outside host={} sni=-\n", world.raw_ip)), "{moved:?}");
    assert!(moved.stdout.ends_with(" 403") && moved.stdout.contains("defaultAction"), "{moved:?}");
    env.rt.destroy(&id).await.unwrap();
}

/// Forward mode (`--egress-proxy`): what a policy allows is dialed through the operator's
/// CONNECT proxy (the world's, which logs each request), by the address Paddock judged and
/// with the proxy's credential; a wrong credential reaches nothing and says why in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_mode_dials_through_the_operators_proxy_with_its_credential() {
    let world = World::up("f", "10.77.49");
    let connects = std::path::Path::new(&world.ca_path).with_file_name("connects.log");
    let through = |password: &str| {
        let mut env = world.env();
        let url = format!("http://paddock:{password}@{}:3128", world.ip);
        let forward = paddock_runtime_local::ForwardProxy::parse(&url, |h, _| Err(h.to_string())).unwrap();
        let mut options = world.options();
        options.forward = Some(forward);
        env.rt = env.rt.clone().with_egress(options);
        env
    };
    let env = through("proxy-pass");
    let policy = EgressPolicy {
        default_action: Action::Deny,
        egress: vec![EgressRule::new(Action::Allow, "allowed.test"), EgressRule::new(Action::Allow, &world.raw_ip)],
    };
    let id = env.confined(spec(policy.clone())).await;
    world.put_ca(&env, &id).await;
    let out = sh(
        &env.rt,
        &id,
        &format!("curl -sS -m 10 --cacert /tmp/ca.pem https://allowed.test/ http://{}/", world.raw_ip),
    )
    .await;
    assert_eq!(
        out.stdout,
        format!(
            "hello from outside host=allowed.test sni=allowed.test\nhello from outside host={} sni=-\n",
            world.raw_ip
        ),
        "{}",
        out.stderr
    );
    let log = std::fs::read_to_string(&connects).unwrap_or_default();
    let auth = "Basic cGFkZG9jazpwcm94eS1wYXNz";
    assert!(log.contains(&format!("{}:443 {auth}\n", world.ip)), "the name went as its address: {log}");
    assert!(log.contains(&format!("{}:80 {auth}\n", world.raw_ip)), "{log}");
    assert!(!log.contains(".test"), "no name is sent to the proxy: {log}");
    // What the policy denies never reaches the proxy.
    let before = log.lines().count();
    let denied = sh(&env.rt, &id, "curl -sS -m 5 http://denied.test/; echo $?").await;
    assert!(denied.stdout.ends_with("6\n"), "{denied:?}");
    assert_eq!(std::fs::read_to_string(&connects).unwrap().lines().count(), before);
    env.rt.destroy(&id).await.unwrap();

    let wrong = through("not-the-password");
    let id = wrong.confined(spec(policy)).await;
    let out = sh(&wrong.rt, &id, &format!("curl -sS -m 10 http://{}/", world.raw_ip)).await;
    assert!(out.code() != 0 && !out.stdout.contains("hello"), "{out:?}");
    let status = wrong.rt.egress(&id).await.unwrap();
    assert!(
        status.denials.iter().any(|d| d.reason.contains("forward proxy") && d.reason.contains("407")),
        "{:?}",
        status.denials
    );
    wrong.rt.destroy(&id).await.unwrap();
}
