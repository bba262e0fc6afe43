//! The local runtime's entry: its options (egress and images) and how it opens.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use paddock_core::naming::NamingMode;
use paddock_core::runtime::Runtime;
use paddock_core::units::parse_bytes;

use super::{BoxFuture, Entry, RuntimeOpts, parse_pair};

pub const ENTRY: Entry = Entry {
    name: "local",
    about: "Namespaces, cgroups, seccomp and Landlock on this machine (no daemon, no cluster)",
    open,
    gateway_address,
    priority_tiers,
    prepull: Some(prepull),
};

/// The launcher `main` forked for this command, if it did (see `main`).
static FORKED_LAUNCHER: std::sync::Mutex<Option<paddock_runtime_local::launcher::Launcher>> =
    std::sync::Mutex::new(None);

/// Keeps the launcher `main` forked for the local runtime this command opens.
pub fn give_forked_launcher(launcher: paddock_runtime_local::launcher::Launcher) {
    if let Ok(mut slot) = FORKED_LAUNCHER.lock() {
        *slot = Some(launcher);
    }
}

fn open<'a>(
    opts: &'a RuntimeOpts,
    data_dir: &'a Path,
    naming: NamingMode,
    serving: bool,
) -> BoxFuture<'a, Result<Arc<dyn Runtime>>> {
    Box::pin(async move {
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
        let rt: Arc<dyn Runtime> = Arc::new(
            rt.with_images(opts.images.options())
                .with_egress(opts.egress.options())
                .with_volumes(paddock_runtime_local::VolumeOptions::new(&opts.volume_roots)?),
        );
        Ok(rt)
    })
}

fn gateway_address(opts: &RuntimeOpts) -> Result<Option<SocketAddr>> {
    match opts.kube.gateway_address {
        Some(at) => anyhow::bail!(
            "--gateway-address {at} is for the Kubernetes runtime: local sandboxes reach the gateway through a forwarder of their own; drop it, or set where the gateway listens with serve --gateway-listen"
        ),
        None => Ok(None),
    }
}

fn priority_tiers(opts: &RuntimeOpts) -> Result<Vec<String>> {
    if !opts.kube.priority_classes.is_empty() {
        anyhow::bail!(
            "--priority-class is for the Kubernetes runtime: its Pods get a PriorityClass; local sandboxes have none to give, so drop it"
        );
    }
    Ok(Vec::new())
}

/// The local runtime pulls into this host's store: with progress here, before the create.
fn prepull<'a>(opts: &'a RuntimeOpts, data_dir: &'a Path, image: Option<&'a str>) -> BoxFuture<'a, Result<()>> {
    Box::pin(async move {
        let images = opts.images.options();
        if images.offline {
            return Ok(());
        }
        let image = images.apply_alias(image);
        if let Ok(paddock_runtime_local::image::RootSource::Reference(r)) =
            paddock_runtime_local::image::resolve(image.as_deref())
        {
            crate::image_cmd::ensure_pulled(data_dir, &r, images.registries, images.limits).await?;
        }
        Ok(())
    })
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
