//! Which runtime this process drives: the one place that knows the runtimes by name. Everything
//! after it (the server, the CLI) holds an `Arc<dyn Runtime>`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use paddock_core::naming::NamingMode;
use paddock_core::preflight::CheckStatus;
use paddock_core::runtime::Runtime;
use paddock_core::units::{parse_bytes, parse_cpus, parse_duration};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// Namespaces, cgroups, seccomp and Landlock on this machine (no daemon, no cluster).
    Local,
    /// Pods on a Kubernetes cluster (keeper Pod + PVC + NetworkPolicy per sandbox).
    Kubernetes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IsolationKind {
    Gvisor,
    Kata,
    Firecracker,
}

#[derive(Debug, Clone, Args)]
pub struct RuntimeOpts {
    /// Where sandboxes run.
    #[arg(long = "runtime", global = true, env = "PADDOCK_RUNTIME", value_enum, default_value = "local")]
    pub kind: RuntimeKind,
    #[command(flatten)]
    pub kube: KubeOpts,
    #[command(flatten)]
    pub images: ImageOpts,
    #[command(flatten)]
    pub egress: EgressOpts,
    /// Let sandboxes mount host directories below DIR (OpenSandbox's `host` volumes; local
    /// runtime). Without one, host paths are refused. Repeatable.
    #[arg(
        long = "volume-root",
        global = true,
        value_name = "DIR",
        env = "PADDOCK_VOLUME_ROOTS",
        value_delimiter = ':'
    )]
    pub volume_roots: Vec<std::path::PathBuf>,
}

impl RuntimeOpts {
    /// Where the chosen runtime's sandboxes dial the runs' gateway, when they do not reach it
    /// through a forwarder of their own (`--gateway-address`, Kubernetes only).
    pub fn gateway_address(&self) -> Result<Option<std::net::SocketAddr>> {
        match (self.kind, self.kube.gateway_address) {
            (RuntimeKind::Local, Some(at)) => anyhow::bail!(
                "--gateway-address {at} is for the Kubernetes runtime: local sandboxes reach the gateway through a forwarder of their own; drop it, or set where the gateway listens with serve --gateway-listen"
            ),
            (_, at) => Ok(at),
        }
    }

    /// The run tiers `--priority-class` names (Kubernetes only: a local sandbox has no
    /// scheduler priority to give).
    pub fn priority_tiers(&self) -> Result<Vec<String>> {
        let tiers: Vec<String> = self.kube.priority_classes.iter().map(|(t, _)| t.clone()).collect();
        if self.kind == RuntimeKind::Local && !tiers.is_empty() {
            anyhow::bail!(
                "--priority-class is for the Kubernetes runtime: its Pods get a PriorityClass; local sandboxes have none to give, so drop it"
            );
        }
        Ok(tiers)
    }
}

/// What no sandbox may reach, whatever its policy (local runtime).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Egress (local runtime)")]
pub struct EgressOpts {
    /// Never let a sandbox reach this CIDR (on top of loopback, link-local and cloud metadata,
    /// multicast and this host's own addresses, which are always refused). Repeatable.
    #[arg(long = "egress-block", global = true, value_name = "CIDR")]
    pub block: Vec<ipnet::IpNet>,
    /// Let sandboxes whose policy allows it reach this part of the private ranges (10/8,
    /// 172.16/12, 192.168/16, 100.64/10, fc00::/7 are refused otherwise). Repeatable.
    #[arg(long = "egress-allow-private", global = true, value_name = "CIDR")]
    pub allow_private: Vec<ipnet::IpNet>,
    /// Resolve allowed names with this DNS server (`ip` or `ip:port`) instead of the ones in
    /// the host's /etc/resolv.conf. Repeatable.
    #[arg(long = "egress-dns", global = true, value_name = "ADDR", value_parser = parse_dns)]
    pub dns: Vec<std::net::SocketAddr>,
    /// Resolve NAME to IP for every sandbox, before DNS (a service on your network no resolver
    /// names). Policies and the blocked ranges still apply. Repeatable.
    #[arg(long = "egress-host", global = true, value_name = "NAME=IP", value_parser = parse_host)]
    pub hosts: Vec<(String, std::net::IpAddr)>,
    /// Trust upstreams signed by this CA (PEM) on connections the credential proxy decrypts,
    /// besides the host's trust store. Repeatable.
    #[arg(long = "egress-ca", global = true, value_name = "FILE")]
    pub upstream_cas: Vec<std::path::PathBuf>,
    /// Dial every connection a policy allows through this HTTP proxy, `http://[user:password@]
    /// host:port` (`CONNECT` to the address Paddock resolved and judged), for networks where
    /// nothing leaves but through one. DNS still goes to the resolvers; UDP and IPv6 stay
    /// refused. Give it in the environment to keep a password out of the process list.
    #[arg(long = "egress-proxy", global = true, value_name = "URL", env = "PADDOCK_EGRESS_PROXY", value_parser = parse_proxy, hide_env_values = true)]
    pub proxy: Option<paddock_runtime_local::ForwardProxy>,
}

fn parse_proxy(s: &str) -> Result<paddock_runtime_local::ForwardProxy, String> {
    paddock_runtime_local::ForwardProxy::parse(s, |host, port| {
        use std::net::ToSocketAddrs as _;
        let mut addrs =
            (host, port).to_socket_addrs().map_err(|e| format!("the proxy {host:?} does not resolve: {e}"))?;
        addrs.next().ok_or_else(|| format!("the proxy {host:?} resolves to no address"))
    })
}

fn parse_host(s: &str) -> Result<(String, std::net::IpAddr), String> {
    let (name, ip) = s.split_once('=').ok_or_else(|| format!("{s:?}: give NAME=IP"))?;
    let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() || name.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!("{s:?}: NAME must be a host name"));
    }
    let ip = ip.trim().parse().map_err(|_| format!("{s:?}: {ip:?} is not an IP address"))?;
    Ok((name, ip))
}

fn parse_dns(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse::<std::net::SocketAddr>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(|ip| std::net::SocketAddr::new(ip, 53)))
        .map_err(|_| format!("{s:?} is not an address: give ip or ip:port"))
}

impl EgressOpts {
    pub fn options(&self) -> paddock_runtime_local::EgressOptions {
        paddock_runtime_local::EgressOptions {
            blocked: self.block.clone(),
            allowed_private: self.allow_private.clone(),
            dns: self.dns.clone(),
            hosts: self.hosts.iter().fold(
                Default::default(),
                |mut m: std::collections::BTreeMap<_, Vec<_>>, (n, ip)| {
                    m.entry(n.clone()).or_default().push(*ip);
                    m
                },
            ),
            upstream_cas: self.upstream_cas.clone(),
            forward: self.proxy.clone(),
        }
    }
}

/// Where the local runtime gets OCI images from.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Images (local runtime)")]
pub struct ImageOpts {
    /// Pull REGISTRY's images from MIRROR first (`docker.io=mirror.example.com:5000`); a bare
    /// MIRROR is Docker Hub's, as in Docker's `registry-mirrors`. MIRROR is `host[:port]` or a
    /// URL (`http://host:port` speaks plain HTTP to it). Repeatable.
    #[arg(long = "registry-mirror", global = true, value_name = "[REGISTRY=]MIRROR", value_parser = parse_mirror)]
    pub mirrors: Vec<Mirror>,
    /// Speak plain HTTP to this registry (`host[:port]`); registries on loopback addresses
    /// always do. Repeatable.
    #[arg(long = "insecure-registry", global = true, value_name = "HOST")]
    pub insecure: Vec<String>,
    /// Trust the CA certificates in FILE (PEM) for registry HOST (`host[:port]`), beside the
    /// system's roots: for a private registry with its own CA. A loopback registry given one
    /// is spoken to over HTTPS. Repeatable.
    #[arg(long = "registry-ca", global = true, value_name = "HOST=FILE", value_parser = parse_registry_ca)]
    pub cas: Vec<paddock_image::RegistryCa>,
    /// Run REF whenever a sandbox asks for NAME (`python:3.11=registry.local/py:3.11`, or an
    /// unpacked root directory); repeatable.
    #[arg(long = "image-alias", global = true, value_name = "NAME=REF", value_parser = parse_pair)]
    pub aliases: Vec<(String, String)>,
    /// When a sandbox's image is not in the store: `missing` pulls it, `never` refuses (only
    /// imported or pulled images run).
    #[arg(long = "pull", global = true, value_enum, default_value = "missing")]
    pub pull: PullPolicy,
    /// Refuse a layer that unpacks to more than this (holes of sparse files included).
    #[arg(long = "image-max-layer", global = true, value_name = "BYTES", default_value = "16GiB", value_parser = parse_bytes)]
    pub max_layer: u64,
    /// Refuse an image whose layers unpack to more than this together.
    #[arg(long = "image-max", global = true, value_name = "BYTES", default_value = "32GiB", value_parser = parse_bytes)]
    pub max_image: u64,
    /// Refuse a layer with more entries (files, directories, links) than this.
    #[arg(long = "image-max-entries", global = true, value_name = "N", default_value_t = 1_000_000)]
    pub max_entries: u64,
    /// Refuse a layer that unpacks to more than N times its compressed size, past its first
    /// 64 MiB: a decompression bomb (real layers stay under 20).
    #[arg(long = "image-max-ratio", global = true, value_name = "N", default_value_t = 100)]
    pub max_ratio: u64,
    /// Refuse a pull or import that would make the image store hold more than this (its
    /// layers as unpacked); no bound by default but --min-free.
    #[arg(long = "image-store-max", global = true, value_name = "BYTES", value_parser = parse_bytes)]
    pub store_max: Option<u64>,
    /// Stop a pull or import before the image store's filesystem has less than this free.
    #[arg(long = "min-free", global = true, value_name = "BYTES", default_value = "1GiB", value_parser = parse_bytes)]
    pub min_free: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PullPolicy {
    Missing,
    Never,
}

impl ImageOpts {
    pub fn options(&self) -> paddock_runtime_local::ImageOptions {
        paddock_runtime_local::ImageOptions {
            registries: paddock_image::RegistryConfig {
                mirrors: self.mirrors.iter().map(|m| (m.registry.clone(), m.host.clone())).collect(),
                insecure: (self.insecure.iter().cloned())
                    .chain(self.mirrors.iter().filter(|m| m.plain_http).map(|m| m.host.clone()))
                    .collect(),
                cas: self.cas.clone(),
            },
            aliases: self.aliases.iter().cloned().collect(),
            offline: self.pull == PullPolicy::Never,
            limits: paddock_image::Limits {
                layer_bytes: self.max_layer,
                image_bytes: self.max_image,
                layer_entries: self.max_entries,
                ratio: self.max_ratio,
                store_bytes: self.store_max,
                min_free: self.min_free,
            },
        }
    }
}

fn parse_registry_ca(s: &str) -> Result<paddock_image::RegistryCa, String> {
    let (host, file) =
        parse_pair(s).map_err(|_| format!("{s:?} is not HOST=FILE (registry.lan:5000=/etc/paddock/ca.pem)"))?;
    paddock_image::RegistryCa::load(&host, std::path::Path::new(&file)).map_err(|e| e.to_string())
}

/// A `--registry-mirror`: pulls from `registry` try `host` first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub registry: String,
    pub host: String,
    /// Given as an `http://` URL.
    pub plain_http: bool,
}

fn parse_mirror(s: &str) -> Result<Mirror, String> {
    let (registry, mirror) = match s.split_once('=') {
        Some((r, m)) => (r.trim(), m.trim()),
        None => ("docker.io", s.trim()),
    };
    let (plain_http, rest) = match (mirror.strip_prefix("http://"), mirror.strip_prefix("https://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => (false, mirror),
    };
    let host = rest.trim_end_matches('/');
    let valid = |h: &str| {
        !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
    };
    if registry.is_empty() || !valid(registry) || !valid(host) {
        return Err(format!(
            "{s:?} is not [REGISTRY=]MIRROR: give a mirror's host[:port] or URL, such as mirror.example.com:5000 (for docker.io) or ghcr.io=http://127.0.0.1:5000; a mirror serves the registry's paths from its root"
        ));
    }
    Ok(Mirror { registry: registry.to_owned(), host: host.to_owned(), plain_http })
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((a, b)) if !a.trim().is_empty() && !b.trim().is_empty() => Ok((a.trim().to_owned(), b.trim().to_owned())),
        _ => Err(format!("{s:?} is not NAME=VALUE")),
    }
}

/// Options of `--runtime kubernetes` (the cluster comes from the in-cluster service account or
/// KUBECONFIG).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Kubernetes runtime")]
pub struct KubeOpts {
    /// The kubeconfig context to use (default: the in-cluster service account, else the
    /// kubeconfig's current context).
    #[arg(long, global = true, env = "PADDOCK_K8S_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace every sandbox object lives in; it must exist.
    #[arg(long, global = true, env = "PADDOCK_K8S_NAMESPACE", default_value = "paddock")]
    pub namespace: String,
    /// Image of sandboxes that name none.
    #[arg(long, global = true, env = "PADDOCK_K8S_IMAGE", default_value = "paddock.local/sandbox:1")]
    pub default_image: String,
    /// imagePullPolicy of sandbox Pods: IfNotPresent, Always or Never.
    #[arg(long, global = true, default_value = "IfNotPresent")]
    pub image_pull_policy: String,
    /// RuntimeClass of every sandbox Pod; give --isolation with it. The server refuses to start
    /// when the class does not exist.
    #[arg(long, global = true, requires = "isolation")]
    pub runtime_class: Option<String>,
    /// The isolation --runtime-class provides (declared, never guessed from its name).
    #[arg(long, global = true, value_enum, requires = "runtime_class")]
    pub isolation: Option<IsolationKind>,
    /// Run each sandbox Pod in a user namespace of its own (`hostUsers: false`); the nodes
    /// must support it.
    #[arg(long, global = true)]
    pub user_namespaces: bool,
    /// StorageClass of workspace PVCs (the cluster's default when not given).
    #[arg(long, global = true)]
    pub storage_class: Option<String>,
    /// Size of a new workspace PVC when a request gives none.
    #[arg(long, global = true, default_value = "1GiB", value_parser = parse_bytes)]
    pub workspace_pvc_size: u64,
    /// Give a workspace PVC's root to the sandbox user with a root init container that has only
    /// CAP_CHOWN: for provisioners that ignore fsGroup (hostPath). Not allowed under the
    /// `restricted` Pod Security Standard.
    #[arg(long, global = true)]
    pub chown_workspace: bool,
    /// CPU each sandbox Pod requests from the scheduler (e.g. 100m), at most its limit; without
    /// it a Pod requests its whole limit (Guaranteed QoS), so a node holds as many sandboxes as
    /// it has CPUs. With it a Pod is Burstable: its keeper's OOM score (999 for a small
    /// sandbox) is then barely below its commands' (1000), so a command that runs the Pod out
    /// of memory can take the whole sandbox with it, where a Guaranteed keeper (-997) is
    /// spared.
    #[arg(long, global = true, value_parser = parse_cpus)]
    pub cpu_request: Option<u32>,
    /// How long a new sandbox Pod may take to be Running and Ready.
    #[arg(long, global = true, default_value = "120s", value_parser = parse_duration)]
    pub ready_timeout: Duration,
    /// Where a created sandbox's Pod comes from: `keeper` (Paddock creates it) or `claim` (a
    /// SandboxClaim on an agent-sandbox warm pool; needs agent-sandbox installed). Workspaces
    /// always use keeper Pods.
    #[arg(long, global = true, value_enum, default_value = "keeper")]
    pub model: ModelKind,
    /// Pre-started Pods per warm pool (with --model claim): the default profile and the first
    /// four other profiles used keep this many.
    #[arg(long, global = true, default_value_t = 0)]
    pub warm_pool: u32,
    /// With --model claim: a profile (template and warm pool) other than the default that no
    /// server has claimed from for this long, and that no claim uses, is deleted. At least
    /// 10m: servers mark a profile they use about once a minute.
    #[arg(long, global = true, default_value = "1h", value_parser = parse_profile_idle)]
    pub profile_idle: Duration,
    /// The static `paddock-agent` that runs commands in sandbox Pods over one warm connection
    /// each (`dev/build-agent --release` builds it), or `none` for a `pods/exec` call per
    /// command. Default: a static `paddock-agent` beside this binary, or in its cargo target
    /// directory's static build; else `none`.
    #[arg(long = "k8s-agent", global = true, env = "PADDOCK_K8S_AGENT", value_name = "PATH|none")]
    pub agent: Option<String>,
    /// The address sandbox Pods reach the runs' gateway at: an address of the node the server
    /// runs on that `serve --gateway-listen` listens on (e.g. both 10.0.0.5:8081), or, for a
    /// server in the cluster, its Pod's. Each run's Pod may reach this address on this port and
    /// gets PADDOCK_GATEWAY=http://IP:PORT. Without it, runs are refused on Kubernetes.
    #[arg(long, global = true, value_name = "IP:PORT")]
    pub gateway_address: Option<std::net::SocketAddr>,
    /// The PriorityClass of the sandbox Pods of a run tier, e.g. `batch=paddock-batch`
    /// (repeatable; the class must exist). The cluster then evicts and preempts a lower tier's
    /// Pods first, and such an attempt is lost and runs again. Give batch a class with
    /// `preemptionPolicy: Never` so it never preempts. Tiers not given: the cluster's default.
    #[arg(long = "priority-class", global = true, value_name = "TIER=CLASS", value_parser = parse_priority_class)]
    pub priority_classes: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelKind {
    Keeper,
    Claim,
}

impl KubeOpts {
    pub(crate) fn config(&self, naming: NamingMode) -> Result<paddock_runtime_k8s::KubeConfig> {
        // gVisor runs a Pod under its own kernel with host users (google/gvisor#13303): a user
        // namespace is not what isolates it there, and asking for one is refused rather than
        // dropped unsaid.
        anyhow::ensure!(
            !(self.user_namespaces && self.isolation == Some(IsolationKind::Gvisor)),
            "--user-namespaces with --isolation gvisor: gVisor Pods keep host users (its own kernel is the boundary, google/gvisor#13303); drop --user-namespaces, or use it with another RuntimeClass (kata, firecracker) or none"
        );
        Ok(paddock_runtime_k8s::KubeConfig {
            context: self.context.clone(),
            namespace: self.namespace.clone(),
            default_image: self.default_image.clone(),
            image_pull_policy: self.image_pull_policy.clone(),
            naming,
            runtime_class: self.runtime_class.clone(),
            host_users_false: self.user_namespaces,
            workspace_default_bytes: self.workspace_pvc_size,
            storage_class: self.storage_class.clone(),
            ready_timeout: self.ready_timeout,
            chown_workspace: self.chown_workspace,
            cpu_request_millicpus: self.cpu_request,
            model: match self.model {
                ModelKind::Keeper => paddock_runtime_k8s::SandboxModel::Keeper,
                ModelKind::Claim => paddock_runtime_k8s::SandboxModel::Claim,
            },
            warm_pool: self.warm_pool,
            profile_idle: self.profile_idle,
            gateway_address: self.gateway_address,
            priority_classes: self.priority_class_map()?,
            isolation: self.isolation.map(|i| match i {
                IsolationKind::Gvisor => paddock_runtime_k8s::Isolation::Gvisor,
                IsolationKind::Kata => paddock_runtime_k8s::Isolation::Kata,
                IsolationKind::Firecracker => paddock_runtime_k8s::Isolation::Firecracker,
            }),
            agent: match self.agent.as_deref() {
                Some("none") => None,
                Some(path) => Some(PathBuf::from(path)),
                None => std::env::current_exe().ok().and_then(|exe| paddock_runtime_k8s::agent::find_beside(&exe)),
            },
            ..Default::default()
        })
    }
}

impl KubeOpts {
    fn priority_class_map(&self) -> Result<std::collections::BTreeMap<String, String>> {
        let mut map = std::collections::BTreeMap::new();
        for (tier, class) in &self.priority_classes {
            if let Some(other) = map.insert(tier.clone(), class.clone()) {
                anyhow::bail!(
                    "--priority-class gives tier {tier} twice ({other} and {class}): give each tier one class"
                );
            }
        }
        Ok(map)
    }
}

fn parse_priority_class(s: &str) -> Result<(String, String), String> {
    let (tier, class) = parse_pair(s).map_err(|_| format!("{s:?} is not TIER=CLASS, e.g. batch=paddock-batch"))?;
    // A PriorityClass is named as a DNS subdomain.
    let dns = class.len() <= 253
        && class.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if !dns {
        return Err(format!(
            "{class:?} is not a PriorityClass name: use lowercase letters, digits, '-' and '.', at most 253"
        ));
    }
    Ok((tier, class))
}

fn parse_profile_idle(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(600) {
        return Err(format!("{s} is too short: a profile in use is marked about once a minute; give at least 10m"));
    }
    Ok(d)
}

/// `paddock check`: whether this runtime can run sandboxes here, item by item. Exit status 0
/// only when everything needed passes.
pub async fn check(opts: &RuntimeOpts, data_dir: &Path, naming: NamingMode, probe: bool, json: bool) -> Result<u8> {
    // The runtime as a CLI command opens it, with this command line's options: what is
    // checked is what would serve.
    let rt = open(opts, data_dir, naming, false).await?;
    let report = rt.check(probe).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("paddock check: {} runtime, namespace {}", rt.capabilities().runtime, report.namespace);
        for item in &report.items {
            let mark = match item.status {
                CheckStatus::Pass => "ok  ",
                CheckStatus::Warn => "warn",
                CheckStatus::Fail => "FAIL",
            };
            println!("  {mark} {:<44} {}", item.check, item.detail);
        }
        if !report.missing.is_empty() {
            println!("missing permissions: {}", report.missing.join(", "));
        }
        println!("network policy: {}", report.network_policy);
        println!("{}", if report.ok() { "ready" } else { "NOT ready: fix the items marked FAIL" });
    }
    Ok(if report.ok() { 0 } else { 1 })
}

/// `paddock reap-pvcs`: one run of the workspace PVC reaper (Kubernetes only; a CronJob runs
/// it). Exit status 0 when the run completed.
pub async fn reap_pvcs(opts: &RuntimeOpts, naming: NamingMode, ttl: std::time::Duration, json: bool) -> Result<u8> {
    if opts.kind != RuntimeKind::Kubernetes {
        anyhow::bail!(
            "reap-pvcs reaps Kubernetes workspace PVCs: give --runtime kubernetes (local workspaces end with `paddock workspace rm`)"
        );
    }
    let rt = paddock_runtime_k8s::KubeRuntime::from_default_kubeconfig(opts.kube.config(naming)?).await?;
    let report = rt.reap_pvcs(ttl).await.context("reaping unused workspace PVCs")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let ns = &opts.kube.namespace;
        println!(
            "namespace {ns}: {} in use, {} unused within the TTL, {} deleted",
            report.in_use.len(),
            report.waiting.len(),
            report.deleted.len()
        );
        for name in &report.deleted {
            println!("  deleted {name}");
        }
    }
    Ok(0)
}

/// Pulls a sandbox's image with progress on stderr before a CLI create, when the chosen runtime
/// pulls into this host's store (the local one), instead of a create that waits in silence.
pub async fn prepull(opts: &RuntimeOpts, data_dir: &Path, image: Option<&str>) -> Result<()> {
    let images = opts.images.options();
    if opts.kind != RuntimeKind::Local || images.offline {
        return Ok(());
    }
    let image = images.apply_alias(image);
    if let Ok(paddock_runtime_local::image::RootSource::Reference(r)) =
        paddock_runtime_local::image::resolve(image.as_deref())
    {
        crate::image_cmd::ensure_pulled(data_dir, &r, images.registries, images.limits).await?;
    }
    Ok(())
}

/// The launcher `main` forked for this command, if it did (see `main`).
static FORKED_LAUNCHER: std::sync::Mutex<Option<paddock_runtime_local::launcher::Launcher>> =
    std::sync::Mutex::new(None);

/// Keeps the launcher `main` forked for the local runtime this command opens.
pub fn give_forked_launcher(launcher: paddock_runtime_local::launcher::Launcher) {
    if let Ok(mut slot) = FORKED_LAUNCHER.lock() {
        *slot = Some(launcher);
    }
}

/// Opens the chosen runtime. A server (`serving`) also starts the runtime's own background
/// work: reaping expired sandboxes on Kubernetes, the supervisor launcher of the local one.
pub async fn open(opts: &RuntimeOpts, data_dir: &Path, naming: NamingMode, serving: bool) -> Result<Arc<dyn Runtime>> {
    match opts.kind {
        RuntimeKind::Local => {
            let exe = std::env::current_exe().context("finding the paddock binary to start supervisors with")?;
            let mut rt = paddock_runtime_local::LocalRuntime::new(data_dir, exe, naming)?;
            // A CLI command uses the launcher `main` forked, if any: exec'ing one would cost
            // more than its one create saves (measured, `dev/bench/cli-ab`).
            let forked = FORKED_LAUNCHER.lock().ok().and_then(|mut l| l.take());
            if serving {
                // `main` forks one for an argument spelt `run` or `create`: not used here.
                if let Some(launcher) = forked {
                    launcher.close();
                }
                rt = rt.with_launcher();
            } else if let Some(launcher) = forked {
                rt = rt.with_forked_launcher(launcher);
            }
            Ok(Arc::new(
                rt.with_images(opts.images.options())
                    .with_egress(opts.egress.options())
                    .with_volumes(paddock_runtime_local::VolumeOptions::new(&opts.volume_roots)?),
            ))
        }
        RuntimeKind::Kubernetes => {
            let rt =
                Arc::new(paddock_runtime_k8s::KubeRuntime::from_default_kubeconfig(opts.kube.config(naming)?).await?);
            if serving {
                rt.preflight().await.context("the Kubernetes runtime cannot start")?;
                if let Some(handler) = rt.check_runtime_class().await.context("the Kubernetes runtime cannot start")? {
                    let class = opts.kube.runtime_class.as_deref().unwrap_or_default();
                    let isolation = opts.kube.isolation.map(|i| format!("{i:?}").to_lowercase()).unwrap_or_default();
                    eprintln!("paddock: sandbox Pods run under RuntimeClass {class} (handler {handler}, {isolation})");
                }
                rt.spawn_reaper();
            }
            Ok(rt)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_is_for_a_registry_or_docker_hub_and_may_be_a_url() {
        let m = |r: &str, h: &str, plain_http| Mirror { registry: r.into(), host: h.into(), plain_http };
        assert_eq!(parse_mirror("mirror.example.com:5000"), Ok(m("docker.io", "mirror.example.com:5000", false)));
        assert_eq!(parse_mirror("http://127.0.0.1:5000/"), Ok(m("docker.io", "127.0.0.1:5000", true)));
        assert_eq!(parse_mirror("https://m.example"), Ok(m("docker.io", "m.example", false)));
        assert_eq!(parse_mirror("ghcr.io=http://[::1]:5000"), Ok(m("ghcr.io", "[::1]:5000", true)));
        for bad in ["", "docker.io=", "=m:5000", "http://", "m.example/v2/library", "a b"] {
            assert!(parse_mirror(bad).unwrap_err().contains("[REGISTRY=]MIRROR"), "{bad:?}");
        }
    }
}
