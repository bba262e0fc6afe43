//! `paddock gate`: proves the sandbox boundary from inside a sandbox, on whichever runtime the
//! binary was given. A positive control first (a listener in the same sandbox must answer, or
//! the probe itself is broken and the gate is inconclusive), then the sandbox's one way home:
//! a gateway the gate serves itself must answer at `$PADDOCK_GATEWAY` with the gate's nonce
//! (on Kubernetes with `--gateway-address`; SKIP where the runtime gives no gateway), then
//! everything that must not
//! answer: what the runtime names (the API server, its endpoints, cluster DNS, the nodes'
//! kubelets; the host's own addresses), the cloud metadata address, the outside world and
//! another sandbox; and no service-account token, no capabilities, not root.
//!
//! What the gate tries can be changed: `--reach` adds an address that must answer, `--forbid`
//! and `--dns` add ones that must not, and `--no-outside-probes` leaves out the built-in outside
//! targets (public addresses and the cloud metadata address), for CI and tests, which must never
//! send a packet off the machine they run on.
//!
//! Probes run with what the image has: python3, else `nc` (busybox), else bash's `/dev/tcp`.
//! A TCP target fails the gate when a connection to it is accepted. Every target is something
//! that listens (the API server, kubelets, a listener the gate starts in the neighbour sandbox
//! or on this machine), so reaching it means a connection; a refusal cannot tell a firewall's
//! REJECT from a closed port, and is not counted as reaching it.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use paddock_core::runtime::{ExecRequest, IsolationTarget, Runtime, SandboxId, TargetKind};
use paddock_core::spec::SandboxSpec;
use serde::Serialize;
use tokio::io::AsyncReadExt;

/// Port of the positive control's listener in the probing sandbox.
const LISTEN_PORT: u16 = 48123;
/// Port of the neighbour's listener: not the control's, which the prober itself answers on.
const NEIGHBOUR_PORT: u16 = 48124;

const PROBE: &str = r#"
tcp() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError:
    print("silent")' "$1" "$2"
  elif command -v nc >/dev/null 2>&1; then
    out=$(timeout 6 nc -w 3 "$1" "$2" </dev/null 2>&1); rc=$?
    case "$out" in *refused*) echo refused ;; *) if [ "$rc" = 0 ]; then echo open; else echo silent; fi ;; esac
  elif command -v bash >/dev/null 2>&1; then
    out=$(timeout 6 bash -c "exec 3<>/dev/tcp/$1/$2" 2>&1); rc=$?
    case "$out" in *refused*) echo refused ;; *) if [ "$rc" = 0 ]; then echo open; else echo silent; fi ;; esac
  else
    echo noprobe
  fi
}
dns() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import socket, sys
q = bytes.fromhex("1234010000010000000000000a6b756265726e657465730764656661756c740373766307636c7573746572056c6f63616c0000010001")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
try:
    s.sendto(q, (sys.argv[1], int(sys.argv[2])))
    s.recvfrom(512)
    print("open")
except OSError:
    print("silent")' "$1" "$2"
  elif command -v nslookup >/dev/null 2>&1; then
    out=$(timeout 8 nslookup kubernetes.default "$1" 2>&1)
    case "$out" in *Name:*|*"can't find"*|*NXDOMAIN*) echo open ;; *) echo silent ;; esac
  else
    echo noprobe
  fi
}
serve() {
  if command -v python3 >/dev/null 2>&1; then
    exec python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
while True:
    s.accept()[0].close()' "$1"
  elif command -v nc >/dev/null 2>&1; then
    while true; do nc -l -p "$1" </dev/null >/dev/null 2>&1; done
  else
    echo noprobe
  fi
}
# Seconds since the sandbox's first process started (/proc/1/stat's starttime, in the
# 100 Hz clock ticks Linux and gVisor report to programs).
age() {
  awk -v s="$(sed 's/.*) //' /proc/1/stat | cut -d' ' -f20)" '{printf "%.1f", $1 - s/100}' /proc/uptime
}
startup_probe() {
  a1=$(age); r1=$(tcp "$1" "$2")
  while awk -v a="$(age)" 'BEGIN { exit !(a < 10) }'; do sleep 0.5; done
  a2=$(age); r2=$(tcp "$1" "$2")
  echo "$a1 $r1 $a2 $r2"
}
fetch() {
  if command -v curl >/dev/null 2>&1; then curl -sS -m 5 "$1" 2>&1
  # Bounded by timeout(1): busybox wget's own -T crashes in some builds.
  elif command -v wget >/dev/null 2>&1; then timeout 6 wget -q -O- "$1" 2>&1
  elif command -v python3 >/dev/null 2>&1; then
    python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1" 2>&1
  else echo noprobe; fi
}
wait_open() {
  i=0
  while [ $i -lt 50 ]; do
    r=$(tcp 127.0.0.1 "$1")
    [ "$r" = open ] && { echo open; return 0; }
    [ "$r" = noprobe ] && { echo noprobe; return 1; }
    sleep 0.2; i=$((i+1))
  done
  echo failed; return 1
}
"#;

#[derive(Debug, Serialize)]
struct Check {
    name: String,
    target: String,
    passed: bool,
    /// What happened, in words.
    detail: String,
    /// Left out by the user (`--skip NAME`): shown, not counted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    skipped: bool,
}

async fn sh(rt: &dyn Runtime, id: &SandboxId, script: &str) -> Result<(i32, String)> {
    let req = ExecRequest { timeout_ms: Some(120_000), ..ExecRequest::shell(&format!("{PROBE}\n{script}")) };
    let p = rt.exec(id, req).await.with_context(|| format!("running a probe in sandbox {id}"))?;
    drop(p.stdin);
    // Read while the probe runs, but stop at its exit: a listener it left running in the
    // background may keep a runtime's output stream open for as long as it lives.
    let (mut stdout, mut stderr) = (p.stdout, p.stderr);
    let reading = tokio::spawn(async move {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let _ = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        out
    });
    let mut control = p.control;
    let outcome = control.wait().await?;
    let out = match tokio::time::timeout(Duration::from_secs(3), reading).await {
        Ok(Ok(out)) => out,
        _ => Vec::new(),
    };
    Ok((outcome.exit_code, String::from_utf8_lossy(&out).into_owned()))
}

/// Starts a listener on `port` in sandbox `id` as a command of its own, in the foreground:
/// a background process left behind by a probe could keep a runtime's exec from ending.
async fn start_listener(rt: &dyn Runtime, id: &SandboxId, port: u16) -> Result<paddock_core::runtime::Process> {
    let req = ExecRequest { timeout_ms: Some(600_000), ..ExecRequest::shell(&format!("{PROBE}\nserve {port}")) };
    rt.exec(id, req).await.with_context(|| format!("starting a listener in sandbox {id}"))
}

async fn stop(listeners: Vec<paddock_core::runtime::Process>) {
    for mut p in listeners {
        let _ = p.control.signal(9).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), p.control.wait()).await;
    }
}

// What the gate tries besides what the runtime names (a plain comment: a doc comment here
// would replace the gate command's own help text).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TargetOptions {
    /// One more address a sandbox must reach (a gateway its policy allows, say), as
    /// NAME=HOST:PORT or HOST:PORT; repeatable. Probed over TCP: a connection must be accepted.
    #[arg(long, value_name = "NAME=HOST:PORT", value_parser = parse_named_target)]
    pub reach: Vec<IsolationTarget>,
    /// One more address a sandbox must not reach, as NAME=HOST:PORT or HOST:PORT; repeatable.
    /// An accepted TCP connection fails the gate.
    #[arg(long, value_name = "NAME=HOST:PORT", value_parser = parse_named_target)]
    pub forbid: Vec<IsolationTarget>,
    /// A DNS server the sandbox must get no answer from, as HOST or HOST:PORT (port 53);
    /// repeatable.
    #[arg(long = "dns", value_name = "HOST[:PORT]", value_parser = parse_dns_target)]
    pub dns_servers: Vec<IsolationTarget>,
    /// Leave out the built-in outside targets (the cloud metadata address 169.254.169.254:80,
    /// 1.1.1.1:443 and the public resolver 8.8.8.8:53) and every resolver of the sandbox's
    /// /etc/resolv.conf that is not an address of this machine: for CI and tests, which must
    /// never send a packet off the machine. Give stand-ins with --forbid and --dns, e.g.
    /// TEST-NET addresses (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24).
    #[arg(long)]
    pub no_outside_probes: bool,
    /// Leave out the check or the target named NAME (as the report names it, e.g. "cluster
    /// DNS" or "own user namespace or gVisor kernel"), where it does not apply: it is shown
    /// as SKIP and does not fail the gate. A target the runtime could not find ("not
    /// checked") fails the gate unless it is skipped. Repeatable.
    #[arg(long, value_name = "NAME")]
    pub skip: Vec<String>,
}

impl TargetOptions {
    fn skips(&self, name: &str) -> bool {
        self.skip.iter().any(|s| s.trim().eq_ignore_ascii_case(name))
    }
}

/// `NAME=HOST:PORT` or `HOST:PORT` (an IPv6 host in brackets: `[2001:db8::1]:443`).
fn parse_named_target(s: &str) -> Result<IsolationTarget, String> {
    let (name, addr) = match s.split_once('=') {
        Some((n, a)) if !n.trim().is_empty() => (Some(n.trim()), a),
        Some(_) => return Err(format!("{s:?} has an empty NAME: give NAME=HOST:PORT or HOST:PORT")),
        None => (None, s),
    };
    let (host, port) = split_host_port(addr)
        .ok_or_else(|| format!("{addr:?} is not HOST:PORT (e.g. 192.0.2.1:443 or [2001:db8::1]:443)"))?;
    let port = port.ok_or_else(|| format!("{addr:?} has no port: give HOST:PORT, e.g. {addr}:443"))?;
    Ok(IsolationTarget { name: name.unwrap_or(addr).to_owned(), host, port, kind: TargetKind::Tcp })
}

/// `HOST` or `HOST:PORT`, a DNS server (port 53 when none is given).
fn parse_dns_target(s: &str) -> Result<IsolationTarget, String> {
    let (host, port) =
        split_host_port(s).ok_or_else(|| format!("{s:?} is not HOST or HOST:PORT (e.g. 198.51.100.53)"))?;
    Ok(IsolationTarget { name: format!("DNS server {s}"), host, port: port.unwrap_or(53), kind: TargetKind::Dns })
}

/// Splits `host[:port]`; a host is an IP address or a DNS name, nothing a probe's shell line
/// could take for syntax.
fn split_host_port(s: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        h.parse::<std::net::Ipv6Addr>().ok()?;
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':')?)),
        }
    } else if s.parse::<std::net::Ipv6Addr>().is_ok() {
        (s, None)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
    if !name_ok {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p != 0)?),
        None => None,
    };
    Some((host.to_owned(), port))
}

/// Whether `host` is an address of the machine the gate runs on: a probe of it stays here.
fn on_this_machine(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_ok_and(|ip| std::net::UdpSocket::bind((ip, 0)).is_ok())
}

fn common_targets() -> Vec<IsolationTarget> {
    let t = |name: &str, host: &str, port: u16, kind: TargetKind| IsolationTarget {
        name: name.into(),
        host: host.into(),
        port,
        kind,
    };
    vec![
        t("cloud metadata", "169.254.169.254", 80, TargetKind::Tcp),
        t("the outside world (HTTPS)", "1.1.1.1", 443, TargetKind::Tcp),
        t("the outside world (DNS)", "8.8.8.8", 53, TargetKind::Dns),
    ]
}

async fn gate(
    rt: &dyn Runtime,
    sandbox: Option<String>,
    options: &TargetOptions,
    json: bool,
    gateway_address: Option<std::net::SocketAddr>,
    made: &mut Vec<SandboxId>,
) -> Result<u8> {
    let spec = || SandboxSpec { timeout_secs: Some(600), ..Default::default() };
    // The sandbox's one way home: a gateway of the gate's own, which must answer while
    // nothing else does.
    let gateway = match &sandbox {
        Some(_) => Err("an existing sandbox (--sandbox) has no way home to the gate".to_owned()),
        None => Gateway::open(rt, gateway_address).await?,
    };
    let a = match sandbox {
        Some(id) => SandboxId::parse(&id).with_context(|| format!("--sandbox {id}"))?,
        None => {
            eprintln!("gate: creating a sandbox to probe from");
            let mut probing = spec();
            if let Ok(g) = &gateway {
                probing.gateway = Some(g.address);
                probing.gateway_secret = Some(paddock_core::spec::GatewaySecret(g.secret.clone()));
            }
            let probing = probing.validated().context("the gate's sandbox")?;
            let info = rt.create(probing).await.context("creating the gate's sandbox")?;
            made.push(info.id.clone());
            info.id
        }
    };
    let found = rt.isolation_targets().await.context("looking up what the sandbox must not reach")?;
    // Port 0 stands for a listener on this machine: the gate's own, so something is there.
    let canary = std::net::TcpListener::bind(("0.0.0.0", 0)).context("listening on this machine for the gate")?;
    let canary_port = canary.local_addr()?.port();
    let named: Vec<IsolationTarget> = found
        .targets
        .iter()
        .map(|t| if t.port == 0 { IsolationTarget { port: canary_port, ..t.clone() } } else { t.clone() })
        .collect();
    eprintln!("gate: creating a second sandbox to be the neighbour");
    let b = rt.create(spec().validated()?).await.context("creating the gate's neighbour sandbox")?;
    made.push(b.id.clone());
    let mut checks = Vec::new();
    let mut not_applicable = None;
    let mut push = |name: &str, target: String, passed: bool, detail: String| {
        let skipped = options.skips(name);
        checks.push(Check { name: name.into(), target, passed: passed || skipped, detail, skipped });
    };
    // A network plugin can start a container a moment before its Pod's policies hold: the
    // fresh sandbox must have lost the way to what it must not reach 10 s after its start.
    let first = named.iter().find(|t| t.name.starts_with("Kubernetes API")).or(named.first());
    let mut startup = None;
    if let Some(t) = first.filter(|t| t.kind == TargetKind::Tcp) {
        eprintln!("gate: probing {} from the new sandbox {} until 10 s after its start", t.name, b.id);
        let (_, out) = sh(rt, &b.id, &format!("startup_probe '{}' {}", t.host.replace('\'', ""), t.port)).await?;
        startup = Some((
            format!("{}:{} (tcp)", t.host, t.port),
            startup_verdict(out.trim().lines().last().unwrap_or_default()),
        ));
    }

    // The positive control: a probe that cannot see an open port proves nothing.
    eprintln!("gate: positive control in {a}");
    let mut listeners = vec![start_listener(rt, &a, LISTEN_PORT).await?];
    let (_, out) = sh(rt, &a, &format!("wait_open {LISTEN_PORT}")).await?;
    let control = out.trim().lines().last().unwrap_or_default().to_owned();
    if control != "open" {
        let why = if out.contains("noprobe") {
            "the sandbox's image has neither python3, nc nor bash to probe with".to_owned()
        } else {
            format!("a listener in the sandbox could not be reached from the sandbox itself ({control:?})")
        };
        print(&checks, json, Some(&why));
        stop(listeners).await;
        return Ok(2);
    }
    push("positive control", format!("127.0.0.1:{LISTEN_PORT} in the sandbox"), true, "answered".into());
    match &gateway {
        Ok(g) => {
            eprintln!("gate: reaching the gate's gateway from {a}");
            let (_, out) = sh(rt, &a, "echo \"url $PADDOCK_GATEWAY\"; fetch \"$PADDOCK_GATEWAY/gate\"").await?;
            let (passed, detail) = gateway_verdict(&out, &g.nonce);
            push(GATEWAY_CHECK, format!("$PADDOCK_GATEWAY ({})", g.address), passed, detail);
        }
        // Shown as SKIP, never as a pass: nothing was tried.
        Err(why) => {
            not_applicable = Some(Check {
                name: GATEWAY_CHECK.into(),
                target: "$PADDOCK_GATEWAY".into(),
                passed: true,
                detail: format!("not checked: {why}"),
                skipped: true,
            });
        }
    }
    if let Some((target, (passed, detail))) = startup {
        push(STARTUP_CHECK, target, passed, detail);
    }

    let (_, ident) = sh(
        rt,
        &a,
        "id -u; grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status | awk '{print $2}' | tr '\\n' ' '; echo; \
         echo \"nnp $(awk '/^NoNewPrivs:/ {print $2}' /proc/self/status)\"; \
         echo \"userns $(awk '{print $1\",\"$2\",\"$3}' /proc/self/uid_map 2>/dev/null | tr '\\n' ' ')\"; \
         if dmesg 2>/dev/null | grep -q gVisor || grep -q 'Sun Jan 10 15:06:54 PST 2016' /proc/version 2>/dev/null; then echo kernel gvisor; else echo kernel host; fi; \
         ls /var/run/secrets/kubernetes.io/serviceaccount/token /run/secrets/kubernetes.io/serviceaccount/token 2>/dev/null | head -n1; echo end; \
         awk '/^nameserver/ {print $2}' /etc/resolv.conf 2>/dev/null",
    )
    .await?;
    let mut lines = ident.lines();
    let uid = lines.next().unwrap_or_default().trim().to_owned();
    push("not root", "uid".into(), !uid.is_empty() && uid != "0", format!("uid {uid}"));
    let caps = lines.next().unwrap_or_default().trim().to_owned();
    let no_caps = !caps.is_empty() && caps.split_whitespace().all(|c| c.trim_start_matches('0').is_empty());
    push("no capabilities", "CapEff CapPrm CapBnd".into(), no_caps, caps);
    // Set-id programs and file capabilities grant nothing once no_new_privs is set, so a
    // command cannot win back what the sandbox dropped.
    let nnp = lines.next().unwrap_or_default().trim_start_matches("nnp").trim().to_owned();
    push("no_new_privs", "NoNewPrivs in /proc/self/status".into(), nnp == "1", format!("NoNewPrivs {nnp}"));
    // Root in the sandbox must not be root of the node: a user namespace of its own (uid 0
    // inside is not uid 0 outside), or the gVisor kernel between it and the node's.
    let map = lines.next().unwrap_or_default().trim_start_matches("userns").trim().to_owned();
    let kernel = lines.next().unwrap_or_default().trim_start_matches("kernel").trim().to_owned();
    let (contained, why) = containment(&map, &kernel);
    push(USERNS_CHECK, "/proc/self/uid_map, the kernel".into(), contained, why);
    let token = lines.next().unwrap_or_default().trim().to_owned();
    let no_token = token == "end";
    if !no_token {
        lines.next();
    }
    // The resolvers the sandbox is told to use: on Kubernetes the cluster's DNS, on the host
    // root the host's own. A deny-all sandbox resolves nothing.
    let resolvers: Vec<String> =
        lines.map(|l| l.trim().to_owned()).filter(|l| !l.is_empty() && !l.starts_with("127.")).collect();
    push(
        "no service-account token",
        "/var/run/secrets/kubernetes.io/serviceaccount".into(),
        no_token,
        if no_token { "absent".into() } else { format!("found {token}") },
    );

    // What only the runtime sees of the sandbox (its Pod's spec): Secrets handed in, the
    // settings that keep it from gaining anything.
    match rt.sandbox_settings(&a).await {
        Ok(settings) => {
            for c in settings {
                push(&c.name, "the sandbox's settings".into(), c.passed, c.detail);
            }
        }
        Err(e) => push("sandbox settings", "the sandbox's settings".into(), false, format!("could not be read: {e}")),
    }
    let mut targets = named;
    if !options.no_outside_probes {
        targets.extend(common_targets());
    }
    targets.extend(options.forbid.iter().cloned());
    targets.extend(options.dns_servers.iter().cloned());
    for r in resolvers {
        if targets.iter().any(|t| t.host == r && t.kind == TargetKind::Dns) {
            continue;
        }
        if options.no_outside_probes && !on_this_machine(&r) {
            eprintln!("gate: not probing the resolver {r} of the sandbox's /etc/resolv.conf (--no-outside-probes)");
            continue;
        }
        targets.push(IsolationTarget {
            name: format!("DNS server from /etc/resolv.conf ({r})"),
            host: r,
            port: 53,
            kind: TargetKind::Dns,
        });
    }
    // The neighbour: a listener in the other sandbox, at the address it has.
    listeners.push(start_listener(rt, &b.id, NEIGHBOUR_PORT).await?);
    let (_, bout) = sh(
        rt,
        &b.id,
        &format!(
            "wait_open {NEIGHBOUR_PORT} >/dev/null; (hostname -i 2>/dev/null || echo 127.0.0.1) | awk '{{print $1}}'"
        ),
    )
    .await?;
    let neighbour = bout.trim().lines().last().unwrap_or("127.0.0.1").to_owned();
    targets.push(IsolationTarget {
        name: format!("another sandbox ({})", b.id),
        host: neighbour,
        port: NEIGHBOUR_PORT,
        kind: TargetKind::Tcp,
    });

    for t in &options.reach {
        eprintln!("gate: reaching {} at {}:{}", t.name, t.host, t.port);
        let (_, out) = sh(rt, &a, &format!("tcp '{}' {}", t.host, t.port)).await?;
        let seen = out.trim().lines().last().unwrap_or_default();
        let (passed, detail) = match seen {
            "open" => (true, "connection accepted".to_owned()),
            "refused" => (false, "refused: the sandbox cannot reach what it must".to_owned()),
            "silent" => (false, "no answer: the sandbox cannot reach what it must".to_owned()),
            other => (false, format!("the probe failed ({other:?})")),
        };
        push(&format!("reaches {}", t.name), format!("{}:{} (tcp)", t.host, t.port), passed, detail);
    }
    for t in &targets {
        eprintln!("gate: trying {} at {}:{}", t.name, t.host, t.port);
        let f = match t.kind {
            TargetKind::Tcp => "tcp",
            TargetKind::Dns => "dns",
        };
        let (_, out) = sh(rt, &a, &format!("{f} '{}' {}", t.host.replace('\'', ""), t.port)).await?;
        let (passed, detail) = verdict(out.trim().lines().last().unwrap_or_default(), t);
        push(&t.name, format!("{}:{} ({f})", t.host, t.port), passed, detail);
    }
    stop(listeners).await;
    for s in &found.skipped {
        eprintln!("gate: not checked: {}: {}", s.name, s.reason);
        push(
            &s.name,
            "not found".into(),
            false,
            format!(
                "not checked: {}; find why it could not be looked up, or pass --skip '{}' where it does not apply",
                s.reason, s.name
            ),
        );
    }
    checks.extend(not_applicable);
    for s in &options.skip {
        if !checks.iter().any(|c| c.name.eq_ignore_ascii_case(s.trim())) {
            eprintln!(
                "gate: warning: --skip {s:?} names no check of this gate (names are the report's first column; a typo skips nothing)"
            );
        }
    }
    let failed = checks.iter().filter(|c| !c.passed).count();
    print(&checks, json, None);
    if failed > 0 {
        if !json {
            eprintln!("gate: {failed} check(s) failed: the sandbox boundary does not hold");
        }
        return Ok(1);
    }
    Ok(0)
}

const USERNS_CHECK: &str = "own user namespace or gVisor kernel";
const GATEWAY_CHECK: &str = "reaches its gateway";

/// A gateway of the gate's own: it answers every request that reaches it with a nonce, so
/// the sandbox's answer proves the way home works end to end (a forwarder in the sandbox
/// accepts a connection whether or not its upstream answers).
struct Gateway {
    /// Where the sandbox's way home leads.
    address: std::net::SocketAddr,
    secret: String,
    nonce: String,
    _serving: tokio::task::JoinHandle<()>,
}

impl Gateway {
    /// Listens where the runtime's sandboxes can reach it: for a runtime that dials a given
    /// address (`--gateway-address`, Kubernetes), there (or on every address at its port when
    /// it is not this machine's); else on loopback, which the runtime's forwarder reaches.
    /// `Err` says why this runtime gives no way home.
    async fn open(rt: &dyn Runtime, given: Option<std::net::SocketAddr>) -> Result<std::result::Result<Self, String>> {
        let caps = rt.capabilities();
        if !caps.gateway {
            let why = caps.no_gateway_because.unwrap_or_else(|| "this runtime gives sandboxes no gateway".into());
            return Ok(Err(why));
        }
        let (listen, address) = match given {
            Some(at) if std::net::TcpListener::bind(std::net::SocketAddr::new(at.ip(), 0)).is_ok() => (at, None),
            Some(at) => (std::net::SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), at.port()), Some(at)),
            None => ((std::net::Ipv4Addr::LOCALHOST, 0).into(), None),
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening for the gate's gateway on {listen}"))?;
        let address = address.unwrap_or(listener.local_addr()?);
        let (secret, nonce) = (random_hex(), random_hex());
        let answer = format!("paddock-gate {nonce}\n");
        let serving = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else { return };
                let answer = answer.clone();
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    // The request (after a forwarder's first line, if any) is not looked at:
                    // whatever reaches this listener gets the nonce.
                    let mut buf = [0u8; 4096];
                    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await;
                    let reply = format!(
                        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                    let _ = conn.write_all(reply.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Ok(Ok(Self { address, secret, nonce, _serving: serving }))
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self._serving.abort();
    }
}

fn random_hex() -> String {
    let mut b = [0u8; 16];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What the sandbox printed for its gateway: `url $PADDOCK_GATEWAY`, then the answer.
fn gateway_verdict(out: &str, nonce: &str) -> (bool, String) {
    let url = out.lines().find_map(|l| l.strip_prefix("url ")).unwrap_or_default().trim().to_owned();
    if url.is_empty() {
        return (false, "the sandbox has no PADDOCK_GATEWAY: the runtime gave it no way home".into());
    }
    if out.contains(&format!("paddock-gate {nonce}")) {
        return (true, format!("{url} answered with the gate's nonce"));
    }
    if out.contains("noprobe") {
        return (false, "the sandbox's image has neither curl, wget nor python3 to call its gateway with".into());
    }
    let said = out.lines().filter(|l| !l.starts_with("url ")).collect::<Vec<_>>().join(" ");
    (
        false,
        format!(
            "{url} did not answer with the gate's nonce ({:?}): the sandbox cannot reach its way home",
            said.trim()
        ),
    )
}
const STARTUP_CHECK: &str = "unreachable 10 s after the start";

/// What `startup_probe` printed: `FIRST_AGE FIRST_RESULT FINAL_AGE FINAL_RESULT`.
fn startup_verdict(seen: &str) -> (bool, String) {
    let f: Vec<&str> = seen.split_whitespace().collect();
    let [first_age, first, final_age, last] = f[..] else {
        return (false, format!("the probe failed ({seen:?}): counted as a failure"));
    };
    let early = if first == "open" && first_age != final_age {
        format!("; it still answered {first_age} s after the start (the policy came late, but in time)")
    } else {
        String::new()
    };
    match last {
        "silent" | "refused" => (true, format!("{last} {final_age} s after the sandbox's start{early}")),
        "open" => (
            false,
            format!(
                "still reached {final_age} s after the sandbox's start: the network plugin applies a Pod's policies late; use one that applies them before or soon after the container starts"
            ),
        ),
        other => (false, format!("the probe failed ({other:?}): counted as a failure, not as silence")),
    }
}

/// Whether the sandbox's root is not the node's: `map` is its uid_map as `inside,outside,count`
/// lines, `kernel` is `gvisor` or `host`.
fn containment(map: &str, kernel: &str) -> (bool, String) {
    if kernel == "gvisor" {
        return (true, "the gVisor kernel".into());
    }
    let lines: Vec<&str> = map.split_whitespace().collect();
    // The initial user namespace maps every id to itself.
    let initial = lines.is_empty() || lines == ["0,0,4294967295"];
    if initial {
        (
            false,
            format!(
                "the node's own user namespace (uid_map {map:?}) and the node's kernel: root in the sandbox would be root of the node; use user namespaces (--user-namespaces) or gVisor (--isolation gvisor)"
            ),
        )
    } else {
        (true, format!("a user namespace of its own (uid_map {})", lines.join(" ")))
    }
}

/// Whether what the probe saw of `t` keeps the boundary, and why, in words.
fn verdict(seen: &str, t: &IsolationTarget) -> (bool, String) {
    let passed = seen == "silent" || seen == "refused";
    let detail = match seen {
        "silent" => "no answer".to_owned(),
        "refused" => "refused (rejected on the way, or nothing of it in reach)".to_owned(),
        "open" if t.kind == TargetKind::Dns => "a DNS answer came back".to_owned(),
        "open" => "connection accepted".to_owned(),
        other => format!("the probe failed ({other:?}): counted as a failure, not as silence"),
    };
    (passed, detail)
}

fn print(checks: &[Check], json: bool, inconclusive: Option<&str>) {
    if json {
        let v = serde_json::json!({
            "passed": inconclusive.is_none() && checks.iter().all(|c| c.passed),
            "inconclusive": inconclusive,
            "checks": checks,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return;
    }
    for c in checks {
        let verdict = match (c.skipped, c.passed) {
            (true, _) => "SKIP",
            (false, true) => "PASS",
            (false, false) => "FAIL",
        };
        println!("{verdict}  {:<45} {:<32} {}", c.name, c.target, c.detail);
    }
    if let Some(why) = inconclusive {
        println!("INCONCLUSIVE  {why}");
    }
}

/// Bounds the whole gate: a hung runtime call must not hang CI.
pub async fn run_bounded(
    rt: &dyn Runtime,
    sandbox: Option<String>,
    options: &TargetOptions,
    json: bool,
    gateway_address: Option<std::net::SocketAddr>,
) -> Result<u8> {
    // Exit 0 when every check passes, 1 when one fails, 2 when inconclusive; what the gate
    // made is removed whatever the outcome (but a hung runtime call is left to the timeout).
    let mut made = Vec::new();
    let outcome =
        tokio::time::timeout(Duration::from_secs(600), gate(rt, sandbox, options, json, gateway_address, &mut made))
            .await;
    for id in made {
        let _ = rt.destroy(&id).await;
    }
    match outcome {
        Ok(r) => r,
        Err(_) => bail!("the gate did not finish within 10 minutes: check that sandboxes start and answer"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_passes_only_with_the_nonce_from_the_sandboxs_own_gateway() {
        let (passed, detail) = gateway_verdict("url http://127.0.0.1:8081\npaddock-gate abc\n", "abc");
        assert!(passed && detail.contains("http://127.0.0.1:8081"), "{detail}");
        for (out, want) in [
            ("url \n", "no PADDOCK_GATEWAY"),
            ("url http://10.0.0.5:8081\npaddock-gate other\n", "did not answer"),
            ("url http://10.0.0.5:8081\nwget: download timed out\n", "download timed out"),
            ("url http://10.0.0.5:8081\nnoprobe\n", "neither curl"),
        ] {
            let (passed, detail) = gateway_verdict(out, "abc");
            assert!(!passed && detail.contains(want), "{out:?}: {detail}");
        }
    }

    #[test]
    fn the_startup_check_fails_only_on_a_connection_10_s_after_the_start() {
        assert!(startup_verdict("0.8 silent 10.1 silent").0);
        let (passed, detail) = startup_verdict("0.8 open 10.1 refused");
        assert!(passed && detail.contains("still answered 0.8 s after the start"), "{detail}");
        let (passed, detail) = startup_verdict("2.0 open 10.2 open");
        assert!(!passed && detail.contains("still reached 10.2 s") && detail.contains("network plugin"), "{detail}");
        for broken in ["", "0.8 open", "0.8 noprobe 10.1 noprobe", "a b c d e"] {
            assert!(!startup_verdict(broken).0, "{broken:?} passed");
        }
    }

    #[test]
    fn only_a_connection_or_a_dns_answer_fails_and_a_broken_probe_never_passes() {
        let t = |host: &str, kind| IsolationTarget { name: "x".into(), host: host.into(), port: 1, kind };
        let api = t("10.96.0.1", TargetKind::Tcp);
        assert!(verdict("silent", &api).0);
        assert!(verdict("refused", &api).0, "a NetworkPolicy's REJECT");
        assert!(!verdict("open", &api).0);
        assert!(!verdict("noprobe", &api).0, "a probe that did not run proves nothing");
        assert!(!verdict("", &api).0);
        assert!(!verdict("open", &t("127.0.0.1", TargetKind::Tcp)).0);
        assert!(!verdict("open", &t("10.96.0.10", TargetKind::Dns)).0);
    }

    #[test]
    fn root_in_the_sandbox_must_not_be_the_nodes() {
        assert!(!containment("0,0,4294967295", "host").0, "the initial user namespace");
        assert!(!containment("", "host").0, "an unreadable map proves nothing");
        let (ok, why) = containment("0,1000000,65536", "host");
        assert!(ok && why.contains("user namespace of its own"), "{why}");
        assert!(containment("1000,101000,1", "host").0, "the local runtime's map");
        assert!(containment("0,0,4294967295", "gvisor").0, "gVisor keeps host users");
        let skip = TargetOptions { skip: vec![" Cluster DNS ".into()], ..Default::default() };
        assert!(skip.skips("cluster DNS") && !skip.skips("nodes"));
    }

    #[test]
    fn targets_are_named_host_port_and_nothing_a_shell_could_read_as_syntax() {
        let t = parse_named_target("the gateway=192.0.2.10:8081").unwrap();
        assert_eq!(
            (t.name.as_str(), t.host.as_str(), t.port, t.kind),
            ("the gateway", "192.0.2.10", 8081, TargetKind::Tcp)
        );
        let t = parse_named_target("203.0.113.7:443").unwrap();
        assert_eq!((t.name.as_str(), t.host.as_str(), t.port), ("203.0.113.7:443", "203.0.113.7", 443));
        let t = parse_named_target("v6=[2001:db8::1]:443").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("2001:db8::1", 443));
        let t = parse_named_target("svc=gateway.paddock.svc:8081").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("gateway.paddock.svc", 8081));
        for bad in [
            "192.0.2.1",
            "x=192.0.2.1",
            "=192.0.2.1:1",
            "a=b:0",
            "a=b:65536",
            "a=$(id):1",
            "a='x':1",
            "a=:80",
            "[::1:80",
        ] {
            assert!(parse_named_target(bad).is_err(), "{bad}");
        }
        let d = parse_dns_target("198.51.100.53").unwrap();
        assert_eq!((d.host.as_str(), d.port, d.kind), ("198.51.100.53", 53, TargetKind::Dns));
        assert_eq!(parse_dns_target("198.51.100.53:5353").unwrap().port, 5353);
        assert_eq!(parse_dns_target("2001:db8::53").unwrap().host, "2001:db8::53");
        assert!(parse_dns_target("a b").is_err());
    }

    #[test]
    fn only_addresses_of_this_machine_count_as_on_it() {
        assert!(on_this_machine("127.0.0.1"));
        // TEST-NET-2 is never assigned to a machine: nothing is sent, the bind alone answers.
        assert!(!on_this_machine("198.51.100.1"));
        assert!(!on_this_machine("resolver.invalid"));
    }
}
