//! Egress for local sandboxes: the per-sandbox enforcer process (`paddock __egress`) and how
//! the runtime starts it, asks it and changes its policy.
//!
//! A sandbox without egress keeps a network namespace with loopback only. One with egress gets,
//! inside that namespace, a veth pair whose two ends both stay there (a route is needed for a
//! connect to reach netfilter at all, and this one leads nowhere), and one static nftables
//! table that redirects every outbound TCP connection and every DNS query to the enforcer's
//! listeners and rejects all other traffic. The enforcer makes those listeners inside the
//! namespace and everything else in the host's, then drops to the sandbox's host identity. The
//! ruleset never changes after that; a policy change only swaps the enforcer's policy.
//!
//! The rules live in a namespace owned by the sandbox's user namespace, where the sandbox never
//! holds a capability. Even with the table gone, the namespace still has no link out: only the
//! enforcer's sockets cross to the host.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use paddock_core::egress::{EgressPolicy, EgressStatus};
use paddock_core::runtime::{RuntimeError, SandboxId};
use paddock_egress::control::{Reply as ControlReply, Request as ControlRequest};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::layout::DataDir;
use crate::protocol::{self, Reply, Request};

/// The operator's egress settings (`paddock serve --egress-…`), the same for every sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EgressOptions {
    /// Extra ranges no sandbox may reach.
    pub blocked: Vec<ipnet::IpNet>,
    /// Private ranges sandboxes may reach (all are refused otherwise).
    pub allowed_private: Vec<ipnet::IpNet>,
    /// DNS servers for allowed names; empty: the host's `/etc/resolv.conf`.
    pub dns: Vec<SocketAddr>,
    /// Names resolved to these addresses for every sandbox, before DNS (`--egress-host
    /// NAME=IP`): services on the operator's network that no resolver names. The policy and
    /// the guard still judge them.
    #[serde(default)]
    pub hosts: std::collections::BTreeMap<String, Vec<IpAddr>>,
    /// PEM files of CAs that upstreams of intercepted connections may be signed by, besides
    /// the host's trust store (`--egress-ca`).
    #[serde(default)]
    pub upstream_cas: Vec<PathBuf>,
    /// Dial every allowed connection through this HTTP proxy (`--egress-proxy`): a network
    /// where nothing leaves but through one. DNS still goes to the resolvers.
    #[serde(default)]
    pub forward: Option<paddock_egress::forward::ForwardProxy>,
}

/// What the runtime hands a starting enforcer on its stdin.
#[derive(Debug, Serialize, Deserialize)]
struct Start {
    policy: EgressPolicy,
    options: EgressOptions,
    /// The host identity to drop to once the sockets exist.
    uid: u32,
    gid: u32,
    /// The server's gateway, forwarded to from [`GATEWAY_INSIDE`] in the sandbox.
    #[serde(default)]
    gateway: Option<SocketAddr>,
    /// What the forwarder proves itself with to the gateway.
    #[serde(default)]
    gateway_secret: Option<paddock_core::spec::GatewaySecret>,
    /// Whether to put the veth and the redirect table in place. A sandbox whose policy denies
    /// everything and that only needs its gateway goes without: its namespace has no route out,
    /// so nothing but the forwarder's loopback listener is reachable, and its start is ~25 ms
    /// shorter. A later policy that opens anything restarts the enforcer with them.
    #[serde(default = "yes")]
    rules: bool,
    /// The credential vault in force.
    #[serde(default)]
    vault: Option<paddock_core::vault::Vault>,
    /// The credential proxy's CA key, for a sandbox made with it.
    #[serde(default)]
    ca_key: Option<paddock_core::vault::Secret>,
    /// The extra upstream CAs' PEM (read by the runtime, which may open the operator's files).
    #[serde(default)]
    upstream_cas: Vec<String>,
}

fn yes() -> bool {
    true
}

/// Marks a sandbox whose enforcer runs without the veth and the table ([`Start::rules`]).
fn bare_marker(dd: &DataDir, id: &SandboxId) -> PathBuf {
    dd.sandbox(id).join("egress.bare")
}

fn pid_file(dd: &DataDir, id: &SandboxId) -> PathBuf {
    dd.sandbox(id).join("egress.pid")
}

/// Stops a sandbox's enforcer (by the pid its start recorded, checked to be that enforcer) and
/// waits until its control socket no longer answers, so a new one can take its listeners.
async fn stop(dd: &DataDir, id: &SandboxId) -> Result<(), RuntimeError> {
    let pid = fs::read_to_string(pid_file(dd, id)).ok().and_then(|p| p.trim().parse::<i32>().ok());
    let ours = pid.filter(|p| {
        fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
            String::from_utf8_lossy(&c).contains("__egress") && String::from_utf8_lossy(&c).contains(id.as_str())
        })
    });
    if let Some(p) = ours.and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    }
    for _ in 0..100 {
        // A reset while it exits counts as not yet gone.
        if let Ok(None) = ask(dd, id, &ControlRequest::Status).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(RuntimeError::Unavailable(format!(
        "the egress enforcer of {id} did not stop for a policy that needs its rules"
    )))
}

/// Where a sandbox with a gateway finds it: its own loopback, where the enforcer listens
/// before any command runs (so no command can take the port), and which no rule redirects.
pub const GATEWAY_INSIDE: (&str, u16) = ("127.0.0.1", 8081);

/// Makes a spec that asks for a gateway get one: the enforcer (which forwards to it) runs even
/// under a policy that denies everything, and the sandbox's environment names the address.
pub fn give_gateway(spec: &mut paddock_core::spec::SandboxSpec) {
    use paddock_core::spec::NetworkPolicy;
    if spec.gateway.is_none() {
        return;
    }
    if spec.network == NetworkPolicy::LoopbackOnly {
        spec.network = NetworkPolicy::Egress(EgressPolicy::deny_all());
    }
    let (host, port) = GATEWAY_INSIDE;
    paddock_core::spec::expand_gateway(&mut spec.env, &format!("http://{host}:{port}"));
}

/// The sandbox's address on its veth: link-local, so it shadows no outside host.
const SANDBOX_ADDR: &str = "169.254.77.2";

fn control_socket(dd: &DataDir, id: &SandboxId) -> PathBuf {
    dd.sandbox(id).join("egress.sock")
}

/// The policy last set, kept for an enforcer that has to be started again.
fn policy_file(dd: &DataDir, id: &SandboxId) -> PathBuf {
    dd.sandbox(id).join("egress.json")
}

fn log_file(dd: &DataDir, id: &SandboxId) -> PathBuf {
    dd.sandbox(id).join("egress.log")
}

/// The policy in force for a sandbox: the last one set, else its spec's.
pub fn stored_policy(dd: &DataDir, id: &SandboxId) -> Option<EgressPolicy> {
    fs::read(policy_file(dd, id)).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

fn store_policy(dd: &DataDir, id: &SandboxId, policy: &EgressPolicy) -> Result<(), RuntimeError> {
    let path = policy_file(dd, id);
    let tmp = path.with_extension("json.tmp");
    let body = serde_json::to_vec(policy).map_err(|e| RuntimeError::System(e.to_string()))?;
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(&body)?;
        fs::rename(&tmp, &path)
    };
    write().map_err(|e| RuntimeError::from_io(format!("saving {}", path.display()), &e))
}

/// Asks the sandbox's enforcer; `Ok(None)` when none runs.
pub async fn ask(dd: &DataDir, id: &SandboxId, request: &ControlRequest) -> Result<Option<EgressStatus>, RuntimeError> {
    let path = control_socket(dd, id);
    let reply = tokio::time::timeout(Duration::from_secs(5), paddock_egress::control::call(&path, request)).await;
    match reply {
        Ok(Ok(ControlReply::Ok(status))) => Ok(Some(status)),
        Ok(Ok(ControlReply::Error(e))) => Err(RuntimeError::InvalidArgument(e)),
        Ok(Err(e)) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
            Ok(None)
        }
        Ok(Err(e)) => Err(RuntimeError::Unavailable(format!("the egress enforcer of {id} did not answer: {e}"))),
        Err(_) => Err(RuntimeError::Unavailable(format!("the egress enforcer of {id} did not answer within 5s"))),
    }
}

/// Puts `policy` in force: tells the running enforcer, or starts one. The policy was checked
/// (with its spec, as a `ValidatedPolicy`, or before it was stored), and the enforcer checks
/// what it is sent again, where it crosses into its process.
pub async fn apply(
    dd: &DataDir,
    exe: &Path,
    options: &EgressOptions,
    id: &SandboxId,
    host_ids: (u32, u32),
    policy: &EgressPolicy,
    gateway: Option<(SocketAddr, Option<paddock_core::spec::GatewaySecret>)>,
) -> Result<EgressStatus, RuntimeError> {
    store_policy(dd, id, policy)?;
    let rules = gateway.is_none() || !policy.denies_everything();
    // An enforcer started without its rules cannot open anything: a policy that does is put
    // in force by a new one that has them.
    if rules && bare_marker(dd, id).exists() {
        stop(dd, id).await?;
    }
    if let Some(status) = ask(dd, id, &ControlRequest::Set { policy: policy.clone() }).await? {
        return Ok(status);
    }
    let (uid, gid) = host_ids;
    let (gateway, gateway_secret) = gateway.map_or((None, None), |(a, s)| (Some(a), s));
    let mut upstream_cas = Vec::new();
    for path in &options.upstream_cas {
        upstream_cas.push(fs::read_to_string(path).map_err(|e| {
            RuntimeError::from_io(format!("reading the upstream CA {} (--egress-ca)", path.display()), &e)
        })?);
    }
    let config = Start {
        policy: policy.clone(),
        options: options.clone(),
        uid,
        gid,
        gateway,
        gateway_secret,
        rules,
        vault: crate::vault::load(dd, id)?,
        ca_key: crate::vault::ca_key(dd, id),
        upstream_cas,
    };
    if let Err(e) = start(dd, exe, id, config).await {
        // Another caller may have started one in the meantime (its listeners are then in the
        // way of ours): hand the policy to that one.
        return match ask(dd, id, &ControlRequest::Set { policy: policy.clone() }).await {
            Ok(Some(status)) => Ok(status),
            _ => Err(e),
        };
    }
    ask(dd, id, &ControlRequest::Status).await?.ok_or_else(|| {
        RuntimeError::Unavailable(format!(
            "the egress enforcer of {id} started but does not answer; see {}",
            log_file(dd, id).display()
        ))
    })
}

/// Saves a sandbox's vault and puts it in force in its running enforcer (starting one if the
/// sandbox's policy has it but it is gone).
pub async fn set_vault(
    dd: &DataDir,
    id: &SandboxId,
    vault: Option<&paddock_core::vault::Vault>,
) -> Result<bool, RuntimeError> {
    crate::vault::store(dd, id, vault)?;
    Ok(ask(dd, id, &ControlRequest::SetVault { vault: vault.cloned() }).await?.is_some())
}

/// Starts `paddock __egress` for a sandbox and waits until its rules and listeners are in
/// place, so nothing the sandbox runs afterwards sees it half set up.
async fn start(dd: &DataDir, exe: &Path, id: &SandboxId, start: Start) -> Result<(), RuntimeError> {
    let rules = start.rules;
    let log_path = log_file(dd, id);
    let log = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| RuntimeError::from_io(format!("opening {}", log_path.display()), &e))?;
    let mut command = tokio::process::Command::new(exe);
    paddock_sys::process::inherit_only_stdio(command.as_std_mut());
    let mut child = command
        .arg("__egress")
        .arg("--data-dir")
        .arg(dd.root())
        .arg("--id")
        .arg(id.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .env_clear()
        // Its own process group: a Ctrl-C meant for the CLI that created the sandbox must not
        // take the sandbox's egress with it.
        .process_group(0)
        .spawn()
        .map_err(|e| RuntimeError::from_io(format!("starting the egress enforcer {}", exe.display()), &e))?;
    if let Some(pid) = child.id() {
        let _ = fs::write(pid_file(dd, id), pid.to_string());
    }
    let marker = bare_marker(dd, id);
    let _ = if rules { fs::remove_file(&marker) } else { fs::write(&marker, b"") };
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all(&protocol::encode(&start))
        .await
        .map_err(|e| RuntimeError::from_io("configuring the egress enforcer", &e))?;
    drop(stdin);
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let read = stdout.read_line(&mut line);
    match tokio::time::timeout(Duration::from_secs(15), read).await {
        Ok(Ok(_)) if line.trim() == "ready" => Ok(()),
        Ok(_) if !line.trim().is_empty() => {
            Err(RuntimeError::System(format!("the egress enforcer of {id} could not start: {}", line.trim())))
        }
        _ => {
            let _ = child.start_kill();
            Err(RuntimeError::System(format!("the egress enforcer of {id} did not start; see {}", log_path.display())))
        }
    }
}

/// `paddock __egress --data-dir DIR --id ID`: the enforcer of one sandbox. Starts
/// single-threaded (it enters the sandbox's network namespace on its only thread), answers
/// `ready` or the reason it cannot on stdout, and serves until the sandbox's init exits.
pub fn main(data_dir: &Path, id: &SandboxId) -> i32 {
    let dd = DataDir::new(data_dir);
    match setup(&dd, id) {
        Ok((start, listeners, init)) => {
            println!("ready");
            let _ = std::io::stdout().flush();
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("paddock egress: cannot start the async runtime: {e}");
                    return 1;
                }
            };
            runtime.block_on(serve(start, listeners, init, id.clone()));
            0
        }
        Err(e) => {
            println!("{e}");
            eprintln!("paddock egress: {e}");
            1
        }
    }
}

/// What an enforcer serves: the egress listeners, and the gateway's when it forwards one.
struct Served {
    listeners: paddock_egress::Listeners,
    gateway: Option<std::net::TcpListener>,
}

fn setup(dd: &DataDir, id: &SandboxId) -> Result<(Start, Served, OwnedFd), String> {
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).map_err(|e| format!("reading the configuration: {e}"))?;
    let start: Start = serde_json::from_slice(&input).map_err(|e| format!("bad configuration: {e}"))?;
    // Checked where it crosses into this process, as a policy the control socket sends is.
    start.policy.validate().map_err(|e| format!("bad policy: {e}"))?;
    let (netns, init) = network_of(dd, id)?;
    let host_ns =
        File::open("/proc/thread-self/ns/net").map_err(|e| format!("opening this thread's network namespace: {e}"))?;
    let enter = |ns: &dyn AsFd| {
        rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
    };
    enter(&netns).map_err(|e| format!("entering the sandbox's network namespace: {e}"))?;
    let inside = (|| {
        let proxy = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("proxy listener: {e}"))?;
        let port = proxy.local_addr().map_err(|e| e.to_string())?.port();
        let dns_udp =
            std::net::UdpSocket::bind(("127.0.0.1", 53)).map_err(|e| format!("DNS listener (udp 53): {e}"))?;
        let dns_tcp =
            std::net::TcpListener::bind(("127.0.0.1", 53)).map_err(|e| format!("DNS listener (tcp 53): {e}"))?;
        let gateway = match start.gateway {
            Some(_) => Some(
                std::net::TcpListener::bind(GATEWAY_INSIDE)
                    .map_err(|e| format!("gateway listener ({}:{}): {e}", GATEWAY_INSIDE.0, GATEWAY_INSIDE.1))?,
            ),
            None => None,
        };
        if start.rules {
            install_rules(port)?;
        }
        Ok::<_, String>((proxy, dns_udp, dns_tcp, gateway))
    })();
    // Back to the host's namespace whatever happened: every socket made from here on (the
    // control socket, every upstream connection) lives there.
    enter(&host_ns).map_err(|e| format!("leaving the sandbox's network namespace: {e}"))?;
    let (proxy, dns_udp, dns_tcp, gateway) = inside?;
    let sock_path = control_socket(dd, id);
    let _ = fs::remove_file(&sock_path);
    let control = std::os::unix::net::UnixListener::bind(&sock_path)
        .map_err(|e| format!("binding {}: {e}", sock_path.display()))?;
    fs::set_permissions(&sock_path, fs::Permissions::from_mode(0o600)).map_err(|e| e.to_string())?;
    paddock_sys::ids::drop_to(start.uid, start.gid).map_err(|e| format!("dropping privileges: {e}"))?;
    // Still one thread: every thread the async runtime starts later inherits the filter.
    paddock_sys::fence::confine_helper().map_err(|e| format!("confining the enforcer: {e}"))?;
    Ok((start, Served { listeners: paddock_egress::Listeners { proxy, dns_udp, dns_tcp, control }, gateway }, init))
}

/// Asks the sandbox's supervisor for its network namespace and its init's pidfd.
fn network_of(dd: &DataDir, id: &SandboxId) -> Result<(OwnedFd, OwnedFd), String> {
    use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketFlags, SocketType};
    let sock = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .map_err(|e| format!("socket: {e}"))?;
    let addr = SocketAddrUnix::new(dd.socket(id)).map_err(|e| e.to_string())?;
    rustix::net::connect(&sock, &addr).map_err(|e| format!("connecting to the supervisor of {id}: {e}"))?;
    paddock_sys::fdpass::send(&sock, &protocol::encode(&Request::Network), &[]).map_err(|e| e.to_string())?;
    let (body, mut fds) = paddock_sys::fdpass::recv(&sock, RecvFlags::empty()).map_err(|e| e.to_string())?;
    match protocol::decode::<Reply>(&body) {
        Ok(Reply::Network) if fds.len() == 2 => {
            let init = fds.pop().expect("two");
            Ok((fds.pop().expect("two"), init))
        }
        Ok(Reply::Error { error }) => Err(error.message),
        _ => Err(format!("the supervisor of {id} did not hand over its network namespace")),
    }
}

/// Finds a system tool; the enforcer runs with an empty environment.
fn tool(name: &str) -> Result<PathBuf, String> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.exists()).ok_or_else(
        || {
            format!(
                "egress needs `{name}` on this host: install it (Debian: apt-get install {})",
                match name {
                    "nft" => "nftables",
                    _ => "iproute2",
                }
            )
        },
    )
}

fn run_with_input(program: &Path, args: &[&str], input: &str) -> Result<(), String> {
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_clear()
        .spawn()
        .map_err(|e| format!("running {}: {e}", program.display()))?;
    child.stdin.take().expect("piped").write_all(input.as_bytes()).map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{} failed: {}", program.display(), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The link, the route and the ruleset of an egress sandbox's namespace (run inside it).
/// Written as `ip` and `nft` input because nftables has no maintained, permissively licensed
/// Rust netlink library; `nft -f` replaces the table in one transaction, so a restarted
/// enforcer swaps in its new port atomically.
fn install_rules(proxy_port: u16) -> Result<(), String> {
    let ip = tool("ip")?;
    // `-force`: a restarted enforcer finds the link and route already there.
    run_with_input(
        &ip,
        &["-force", "-batch", "-"],
        &format!(
            "link add pdk0 type veth peer name pdk1\naddr add {SANDBOX_ADDR}/32 dev pdk0\nlink set pdk0 up\nlink set pdk1 up\nroute replace default dev pdk0\n"
        ),
    )
    .or_else(|e| if e.contains("File exists") { Ok(()) } else { Err(e) })?;
    let nft = tool("nft")?;
    run_with_input(&nft, &["-f", "-"], &ruleset(proxy_port))
}

fn ruleset(proxy_port: u16) -> String {
    format!(
        "table inet paddock\ndelete table inet paddock\n\
table inet paddock {{\n\
  chain nat_out {{\n\
    type nat hook output priority -100; policy accept;\n\
    meta nfproto ipv4 udp dport 53 redirect to :53\n\
    meta nfproto ipv4 tcp dport 53 redirect to :53\n\
    fib daddr type local return\n\
    meta nfproto ipv4 meta l4proto tcp redirect to :{proxy_port}\n\
  }}\n\
  chain filter_out {{\n\
    type filter hook output priority 0; policy accept;\n\
    oifname \"lo\" accept\n\
    ct status dnat accept\n\
    reject with icmpx admin-prohibited\n\
  }}\n\
}}\n"
    )
}

/// The host's own addresses (IPv4 from the FIB, IPv6 from `if_inet6`): they carry the host's
/// identity, so no sandbox may dial them.
fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Ok(trie) = fs::read_to_string("/proc/net/fib_trie") {
        let mut last = None;
        for line in trie.lines().map(str::trim) {
            if let Some(addr) = line.strip_prefix("|-- ") {
                last = addr.parse::<IpAddr>().ok();
            } else if line.contains("/32 host LOCAL")
                && let Some(a) = last.take()
                && !out.contains(&a)
            {
                out.push(a);
            }
        }
    }
    if let Ok(v6) = fs::read_to_string("/proc/net/if_inet6") {
        for line in v6.lines() {
            let hex = line.split_whitespace().next().unwrap_or("");
            if let Ok(bits) = u128::from_str_radix(hex, 16) {
                out.push(IpAddr::V6(bits.into()));
            }
        }
    }
    out
}

/// The host's resolvers, from `/etc/resolv.conf`.
fn host_resolvers() -> Vec<SocketAddr> {
    fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

async fn serve(start: Start, served: Served, init: OwnedFd, id: SandboxId) {
    let Served { listeners, gateway } = served;
    if let (Some(listener), Some(upstream)) = (gateway, start.gateway) {
        let line = format!(
            "{} {id} {}\r\n",
            paddock_core::spec::GATEWAY_PREAMBLE,
            start.gateway_secret.as_ref().map_or("", |s| s.0.as_str())
        );
        tokio::spawn(forward_gateway(listener, upstream, line));
    }
    let upstream = if start.options.dns.is_empty() { host_resolvers() } else { start.options.dns.clone() };
    let guard =
        paddock_egress::guard::Guard::new(host_addresses(), start.options.blocked, start.options.allowed_private);
    let interception = match &start.ca_key {
        Some(key) => {
            match paddock_egress::intercept::Interception::new(id.as_str(), key.expose(), &start.upstream_cas) {
                Ok(i) => Some(std::sync::Arc::new(i)),
                Err(e) => {
                    // Its https bindings then stay unused (their connections relayed opaque).
                    eprintln!("paddock egress: the credential proxy cannot start: {e}");
                    None
                }
            }
        }
        None => None,
    };
    let hosts = start.options.hosts.iter().map(|(n, ips)| (n.to_ascii_lowercase(), ips.clone())).collect();
    let enf = paddock_egress::Enforcer::new(
        start.policy,
        paddock_egress::state::Config { guard, upstream, hosts, interception, forward: start.options.forward },
    );
    enf.set_vault(start.vault);
    // The runtime saves each policy it sets before sending it; nothing to persist here.
    let on_set = std::sync::Arc::new(|_: &EgressPolicy| {});
    let ended = async {
        match paddock_sys::asyncfd::register(init) {
            Ok(fd) => {
                let _ = fd.readable().await;
            }
            Err(e) => {
                // Without the pidfd the enforcer cannot tell when to end; the supervisor's
                // teardown of the namespace closes its listeners instead.
                eprintln!("paddock egress: cannot watch the sandbox's init: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        r = paddock_egress::run(enf, listeners, on_set) => {
            if let Err(e) = r {
                eprintln!("paddock egress: stopped serving: {e}");
            }
        }
        () = ended => {}
    }
}

/// Relays each connection to the gateway from inside the sandbox to the server's gateway
/// listener, after a line that names the sandbox. It bypasses the policy and the guard on
/// purpose: this one upstream is the sandbox's way home, whatever else it may reach.
async fn forward_gateway(listener: std::net::TcpListener, upstream: SocketAddr, line: String) {
    let line: std::sync::Arc<str> = line.into();
    let listener = match listener.set_nonblocking(true).and_then(|()| tokio::net::TcpListener::from_std(listener)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("paddock egress: cannot serve the gateway listener: {e}");
            return;
        }
    };
    loop {
        let Ok((mut inside, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let line = line.clone();
        tokio::spawn(async move {
            let Ok(Ok(mut home)) =
                tokio::time::timeout(Duration::from_secs(10), tokio::net::TcpStream::connect(upstream)).await
            else {
                return;
            };
            let _ = inside.set_nodelay(true);
            let _ = home.set_nodelay(true);
            if home.write_all(line.as_bytes()).await.is_err() {
                return;
            }
            let _ = tokio::io::copy_bidirectional(&mut inside, &mut home).await;
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_ruleset_redirects_dns_and_tcp_and_rejects_the_rest() {
        let r = super::ruleset(40123);
        assert!(r.contains("udp dport 53 redirect to :53"));
        assert!(r.contains("tcp redirect to :40123"));
        assert!(r.contains("fib daddr type local return"), "the sandbox's own servers stay reachable");
        assert!(r.contains("reject with icmpx admin-prohibited"));
        assert!(r.starts_with("table inet paddock\ndelete table inet paddock\n"), "a restart replaces the table");
    }
}
