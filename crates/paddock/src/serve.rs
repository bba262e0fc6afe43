//! `paddock serve`: configuration, the API key, and the server's start-up message.

use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use paddock_core::runtime::Runtime;
use paddock_core::units::{parse_bytes, parse_duration};
use paddock_server::ServerConfig;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// API key clients send in OPEN-SANDBOX-API-KEY. Every local user can read it in `ps`:
    /// prefer --api-key-file or the PADDOCK_API_KEY environment variable. Without any of them,
    /// a key is created on first start and kept in the data directory.
    #[arg(long)]
    api_key: Option<String>,
    /// Read the API key from this file (its first line; keep the file 0600).
    #[arg(long, conflicts_with = "api_key")]
    api_key_file: Option<PathBuf>,
    /// Serve without any API key (loopback addresses only).
    #[arg(long, conflicts_with_all = ["api_key", "api_key_file"])]
    insecure_no_auth: bool,
    /// Session length of sandboxes created without a timeout. Without it, an omitted timeout
    /// means no expiry, as OpenSandbox's schema says (--idle-timeout then gives back a sandbox
    /// nobody uses).
    #[arg(long, value_parser = parse_duration)]
    default_timeout: Option<Duration>,
    /// Give back a sandbox nobody used for this long (no request to its commands, files, code
    /// or ports, no command running, no run): a thread's sandbox is released (its workspace
    /// kept), one without expiry is deleted; others keep their expiry. Swept every minute.
    /// `0` turns it off.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// Longest session a create request may ask for. 24 h by default, so the defaults of the
    /// OpenSandbox SDK's pool (a 24 h idle timeout) work.
    #[arg(long, default_value = "86400s", value_parser = parse_duration)]
    max_timeout: Duration,
    /// Whether a create may ask for no expiry (`timeout: null`, the SDK's `timeout=None`): the
    /// sandbox then lives until deleted. `--allow-no-expiry false` refuses such creates.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allow_no_expiry: bool,
    /// Largest file upload accepted.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    max_upload: u64,
    /// How long a quick runtime call (a file operation, starting a command, a connect) may take
    /// before the request fails with TIMEOUT: a hung sandbox never hangs the API.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    call_timeout: Duration,
    /// How long creating, acquiring, releasing or destroying a sandbox may take.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    lifecycle_timeout: Duration,
    /// Close a connection that takes longer than this to send a request's headers, or that sits
    /// idle this long between requests.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// Connections served at once; further ones wait until one closes.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Connections one peer address may hold; past it (and at --max-connections) the one that
    /// has gone longest without a request in flight is closed for the new one.
    #[arg(long, default_value_t = 512)]
    max_connections_per_peer: usize,
    /// WebSockets (and other upgrades) open through the port proxy at once; they leave
    /// --max-connections once upgraded, so they have a cap of their own.
    #[arg(long, default_value_t = 1024)]
    max_websockets: usize,
    /// WebSockets open to one sandbox at once.
    #[arg(long, default_value_t = 256)]
    max_websockets_per_sandbox: usize,
    /// Close a WebSocket through the port proxy that carried nothing either way for this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    ws_idle_timeout: Duration,
    /// Request data the server holds in memory at once: JSON bodies (2 MiB each at most) and
    /// files edited in place. Requests past it wait up to 10 s, then get a 503 to retry.
    #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
    max_request_memory: u64,
    /// Size cap of /workspace for sandboxes created without `resourceLimits.workspace`. A
    /// scratch workspace is memory (a tmpfs charged to the sandbox), so it is also at most the
    /// sandbox's memory; a persistent one is a disk image that keeps its size for life.
    /// Default: the runtime's (2 GiB locally; on Kubernetes `--workspace-pvc-size`).
    #[arg(long, value_parser = parse_bytes)]
    workspace_size: Option<u64>,
    /// Most files and directories /workspace may hold, for sandboxes created without
    /// `resourceLimits.workspace-inodes`.
    #[arg(long, default_value_t = paddock_core::spec::DEFAULT_WORKSPACE_INODES)]
    workspace_inodes: u64,
    /// The egress of sandboxes created without a `networkPolicy`: `deny` (loopback only, no
    /// DNS) or `allow-all` (everything but the addresses no sandbox may reach; see
    /// --egress-block and --egress-allow-private).
    #[arg(long, value_enum, default_value = "deny")]
    default_egress: DefaultEgress,
    /// Route `<sandbox-id>-<port>.DOMAIN` to that port of that sandbox by the Host header (point a
    /// wildcard DNS name and certificate of your ingress at this server); signed endpoints are
    /// then given in that form.
    #[arg(long, value_name = "DOMAIN")]
    sandbox_domain: Option<String>,
    /// How long running requests and run attempts may take to finish after SIGTERM; attempts
    /// still running then are requeued with a new epoch and run on the next start.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// A tier of runs, NAME=CONCURRENCY[:MEMORY], highest priority first (repeatable). Default:
    /// interactive=8 then batch=4. A waiting run of a higher tier preempts the newest attempt
    /// of a lower one when --capacity is full; the lowest tier never preempts.
    #[arg(long = "tier", value_name = "NAME=CONCURRENCY[:MEMORY]", value_parser = parse_tier)]
    tiers: Vec<paddock_server::runs::tiers::Tier>,
    /// How many runs (and optionally how much sandbox memory, overhead included) all tiers
    /// may hold together, N[:MEMORY]. Default: what this machine holds of 512 MiB sandboxes
    /// (four per CPU at most, and its memory less 1 GiB).
    #[arg(long, value_name = "N[:MEMORY]", value_parser = parse_capacity)]
    capacity: Option<paddock_server::runs::tiers::Capacity>,
    /// Where the runs' gateway listens on this host (local sandboxes reach it through their
    /// own 127.0.0.1:8081). Default 127.0.0.1:8081, or a free port when that one is taken; on
    /// Kubernetes with --gateway-address, that address (or every address at its port when
    /// it is not one of this machine's).
    #[arg(long, value_name = "ADDR:PORT")]
    gateway_listen: Option<SocketAddr>,
    /// Gateway connections held open at once; one sandbox (or one address connecting
    /// directly) may hold an eighth of them, at least 4.
    #[arg(long, default_value_t = 256)]
    gateway_max_connections: usize,
    /// How long a driver's heartbeat keeps its attempt's lease.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    run_lease: Duration,
    /// How long a run's driver has, from its admission, to make its first gateway call
    /// before its sandbox is taken back and the attempt counted as lost.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    run_start_deadline: Duration,
    /// Exit codes of a driver that ask for its run to run again (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "75,76")]
    requeue_exit_codes: Vec<i32>,
    /// An OpenAI-compatible model API every sandbox may call, without its key: sandboxes get
    /// PADDOCK_LLM_BASE (and each --llm-env) pointing at a route of the gateway that reaches
    /// only this upstream (normalised to one /v1) and adds the key on the way out.
    #[arg(long, value_name = "URL")]
    llm_base: Option<String>,
    /// The provider key for --llm-base, read from this file (its first line; keep it 0600).
    /// PADDOCK_LLM_KEY works too. Without either, calls go upstream without a key.
    #[arg(long, value_name = "PATH", requires = "llm_base")]
    llm_key_file: Option<PathBuf>,
    /// Another variable that sandboxes get the model route's URL in, e.g. OPENAI_BASE_URL or
    /// DREADNODE_LLM_BASE (repeatable).
    #[arg(long = "llm-env", value_name = "NAME")]
    llm_env: Vec<String>,
    /// A tenant's own model API (repeatable): its sandboxes' model route reaches this upstream
    /// instead of --llm-base's (tenants without one use --llm-base, or have no route).
    #[arg(long = "llm-tenant-base", value_name = "TENANT=URL")]
    llm_tenant_base: Vec<String>,
    /// The provider key of a tenant's --llm-tenant-base, read from this file (its first line;
    /// keep it 0600). Without one, that tenant's calls go upstream without a key.
    #[arg(long = "llm-tenant-key-file", value_name = "TENANT=PATH")]
    llm_tenant_key_file: Vec<String>,
    /// Tenants besides those of `paddock tenant add` (JSON: {"tenants": [{"name", "keySha256":
    /// [digest, ...], "quotas": {...}}]}; `paddock tenant digest` makes a key's digest). Read
    /// again while serving, so edits take effect within seconds.
    #[arg(long, value_name = "FILE")]
    tenants: Option<PathBuf>,
}

/// The model routes from the command line: the server's base and key (file or environment),
/// each tenant's own base and key file, and the aliases.
fn llm_config(args: &ServeArgs) -> Result<Option<paddock_server::llm::LlmConfig>> {
    use paddock_server::llm::{LlmConfig, Upstream, normalise_base};
    let default = match &args.llm_base {
        None => None,
        Some(base) => Some(Upstream {
            base: normalise_base(base).map_err(|e| anyhow::anyhow!("--llm-base {e}"))?,
            key: match &args.llm_key_file {
                Some(path) => Some(key_from(path).with_context(|| "reading --llm-key-file".to_string())?),
                None => std::env::var("PADDOCK_LLM_KEY").ok().filter(|k| !k.is_empty()),
            },
        }),
    };
    let pair = |flag: &str, given: &str| -> Result<(String, String)> {
        let (tenant, value) = given
            .split_once('=')
            .with_context(|| format!("{flag} {given:?}: give TENANT=VALUE, e.g. {flag} acme=..."))?;
        paddock_server::tenants::validate_name(tenant)
            .map_err(|e| anyhow::anyhow!("{flag} {given:?}: {e} (the default tenant's route is --llm-base)"))?;
        Ok((tenant.to_owned(), value.to_owned()))
    };
    let mut tenants = std::collections::BTreeMap::new();
    for given in &args.llm_tenant_base {
        let (tenant, base) = pair("--llm-tenant-base", given)?;
        let base = normalise_base(&base).map_err(|e| anyhow::anyhow!("--llm-tenant-base {tenant}: {e}"))?;
        anyhow::ensure!(
            tenants.insert(tenant.clone(), Upstream { base, key: None }).is_none(),
            "--llm-tenant-base names tenant {tenant} twice: give each tenant one upstream"
        );
    }
    for given in &args.llm_tenant_key_file {
        let (tenant, path) = pair("--llm-tenant-key-file", given)?;
        let upstream = tenants.get_mut(&tenant).with_context(|| {
            format!(
                "--llm-tenant-key-file {tenant}: tenant {tenant} has no --llm-tenant-base {tenant}=URL to send it to"
            )
        })?;
        let key = key_from(Path::new(&path)).with_context(|| format!("reading --llm-tenant-key-file {tenant}"))?;
        upstream.key = Some(key);
    }
    for name in &args.llm_env {
        paddock_core::spec::validate_env_name(name).map_err(|e| anyhow::anyhow!("--llm-env: {e}"))?;
    }
    // --llm-env alone is kept: it names the variables of the routes `paddock tenant set` gives.
    if default.is_none() && tenants.is_empty() && args.llm_env.is_empty() {
        return Ok(None);
    }
    Ok(Some(LlmConfig { default, tenants, env: args.llm_env.clone() }))
}

fn parse_tier(s: &str) -> Result<paddock_server::runs::tiers::Tier, String> {
    paddock_server::runs::tiers::parse_tier(s).map_err(|e| e.0)
}

fn parse_capacity(s: &str) -> Result<paddock_server::runs::tiers::Capacity, String> {
    paddock_server::runs::tiers::parse_capacity(s).map_err(|e| e.0)
}

impl ServeArgs {
    /// Where the gateway listens when `--gateway-listen` is not given but sandboxes reach it
    /// at `at` (`--gateway-address`): there, when it is an address of this machine (a node's,
    /// a Pod's), else on every address at its port.
    pub fn default_gateway_listen(&mut self, at: SocketAddr) {
        if self.gateway_listen.is_none() {
            let here = std::net::TcpListener::bind(SocketAddr::new(at.ip(), 0)).is_ok();
            let ip = if here { at.ip() } else { std::net::Ipv4Addr::UNSPECIFIED.into() };
            self.gateway_listen = Some(SocketAddr::new(ip, at.port()));
        }
    }

    /// Refuses a tier the runtime was given a setting for (`--priority-class`) that this
    /// server does not have: a typo would leave that tier's Pods at the default priority.
    pub fn check_tiers_named(&self, named: &[String]) -> anyhow::Result<()> {
        let tiers = run_options(self).tiers;
        for name in named {
            anyhow::ensure!(
                tiers.rank(name).is_some(),
                "--priority-class names tier {name}, which this server does not have (its tiers: {}); name one of them, or add it with serve --tier",
                tiers.names()
            );
        }
        Ok(())
    }
}

/// The runs' settings from the command line, with this machine's capacity by default.
fn run_options(args: &ServeArgs) -> paddock_server::runs::RunOptions {
    use paddock_server::runs::tiers::{self, Capacity, Tiers};
    let capacity = args.capacity.unwrap_or_else(|| {
        let (cpus, memory) = tiers::this_machine();
        Capacity { runs: tiers::machine_capacity(cpus, memory, paddock_core::spec::DEFAULT_MEMORY), memory: None }
    });
    let tiers = if args.tiers.is_empty() {
        Tiers::default_for(capacity)
    } else {
        Tiers { tiers: args.tiers.clone(), capacity }
    };
    let mut o = paddock_server::runs::RunOptions::defaults(tiers);
    o.gateway_listen = args.gateway_listen;
    o.gateway_max_connections = args.gateway_max_connections;
    o.lease = args.run_lease;
    o.start_deadline = args.run_start_deadline;
    o.requeue_codes = args.requeue_exit_codes.clone();
    o
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DefaultEgress {
    Deny,
    AllowAll,
}

/// Reads the stored API key, or creates one (0600) on first start.
fn stored_key(data_dir: &Path) -> Result<(String, bool)> {
    let path = data_dir.join("api-key");
    match std::fs::read_to_string(&path) {
        Ok(k) if !k.trim().is_empty() => return Ok((k.trim().to_owned(), false)),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let mut bytes = [0u8; 24];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).context("getrandom")?;
    let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut f, key.as_bytes())?;
    Ok((key, true))
}

/// The API key in a file given with --api-key-file: its first line, without surrounding blanks.
fn key_from(path: &Path) -> Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the API key file {} given with --api-key-file", path.display()))?;
    let key = text.lines().next().unwrap_or_default().trim();
    anyhow::ensure!(!key.is_empty(), "the API key file {} is empty: put the key on its first line", path.display());
    if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
        eprintln!("paddock: warning: the API key file {} is readable by other users: chmod 600 it", path.display());
    }
    Ok(key.to_owned())
}

pub async fn run(rt: Arc<dyn Runtime>, data_dir: &Path, args: ServeArgs) -> Result<u8> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PADDOCK_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    // Read here rather than by clap, so a key given on the command line is told apart from one
    // in the environment (only the former is visible to other users).
    let env_key = std::env::var("PADDOCK_API_KEY").ok().filter(|k| !k.is_empty());
    let runs = run_options(&args);
    let llm = llm_config(&args)?;
    let (api_key, key_note, key_from_file, location) = if args.insecure_no_auth {
        anyhow::ensure!(
            env_key.is_none(),
            "PADDOCK_API_KEY is set but --insecure-no-auth asks for no key: unset one of them"
        );
        (None, "no API key (--insecure-no-auth)".to_owned(), false, "none (--insecure-no-auth)".to_owned())
    } else if let Some(k) = args.api_key {
        eprintln!(
            "paddock: warning: --api-key puts the key in the process list, where every local user can read it (ps); \
             use --api-key-file PATH or the PADDOCK_API_KEY environment variable instead"
        );
        let location = "the one given to `paddock serve` with --api-key".to_owned();
        (Some(k), "the API key given with --api-key".to_owned(), false, location)
    } else if let Some(path) = &args.api_key_file {
        let location =
            format!("in the file {} (its first line)", std::path::absolute(path).unwrap_or(path.clone()).display());
        (Some(key_from(path)?), format!("the API key in {}", path.display()), false, location)
    } else if let Some(k) = env_key {
        let location = "the one in PADDOCK_API_KEY of the environment `paddock serve` was started with".to_owned();
        (Some(k), "the API key given in PADDOCK_API_KEY".to_owned(), false, location)
    } else {
        let (k, created) = stored_key(data_dir)?;
        let path = std::path::absolute(data_dir.join("api-key")).unwrap_or(data_dir.join("api-key"));
        let verb = if created { "created just now and stored in" } else { "stored in" };
        let location = format!("in the file {} (readable by root only)", path.display());
        (Some(k), format!("the API key {verb} the file {} (0600)", path.display()), true, location)
    };
    if let Some(path) = &args.tenants {
        let n = paddock_server::tenants::check_file(path).await?;
        anyhow::ensure!(
            !args.insecure_no_auth,
            "--tenants gives tenants their own API keys, and --insecure-no-auth serves without any: use one of them"
        );
        eprintln!("paddock: {n} tenants from {} (read again while serving)", path.display());
    }
    let config = ServerConfig {
        tenants_file: args.tenants.clone(),
        runs,
        llm,
        listen: args.listen,
        data_dir: data_dir.to_path_buf(),
        api_key: api_key.clone(),
        api_key_location: location,
        default_timeout: args.default_timeout,
        idle_timeout: (!args.idle_timeout.is_zero()).then_some(args.idle_timeout),
        max_timeout: args.max_timeout,
        allow_no_expiry: args.allow_no_expiry,
        max_upload_bytes: args.max_upload,
        deadlines: paddock_server::deadline::Deadlines {
            call: args.call_timeout,
            lifecycle: args.lifecycle_timeout,
            ..Default::default()
        },
        header_timeout: args.header_timeout,
        max_connections: args.max_connections,
        max_connections_per_peer: args.max_connections_per_peer,
        tunnels: paddock_server::tunnels::TunnelLimits {
            all: args.max_websockets,
            per_sandbox: args.max_websockets_per_sandbox,
            idle: args.ws_idle_timeout,
        },
        max_request_memory: args.max_request_memory,
        workspace_bytes: args.workspace_size,
        workspace_inodes: args.workspace_inodes,
        sandbox_domain: args.sandbox_domain.map(|d| d.trim_matches('.').to_ascii_lowercase()),
        default_network: match args.default_egress {
            DefaultEgress::Deny => paddock_core::spec::NetworkPolicy::LoopbackOnly,
            DefaultEgress::AllowAll => {
                paddock_core::spec::NetworkPolicy::Egress(paddock_core::egress::EgressPolicy::allow_all())
            }
        },
    };
    let state = paddock_server::build_state(config, rt).await?;
    let key_file =
        key_from_file.then(|| std::path::absolute(data_dir.join("api-key")).unwrap_or(data_dir.join("api-key")));
    let data = data_dir.display().to_string();
    let gateway = state.runs.gateway_addr();
    let tier_line = state
        .runs
        .options()
        .tiers
        .tiers
        .iter()
        .map(paddock_server::runs::tiers::describe)
        .collect::<Vec<_>>()
        .join(", ");
    let capacity = state.runs.options().tiers.capacity.runs;
    paddock_server::serve(state, args.drain_timeout, move |addr| {
        eprintln!("paddock: serving on http://{addr} (data in {data})");
        if let Some(g) = gateway {
            eprintln!("paddock: runs: {tier_line}; {capacity} at once in all; gateway on {g}");
        }
        eprintln!("paddock: clients authenticate with {key_note}");
        match (&api_key, key_file) {
            (Some(_), Some(file)) => eprintln!(
                "paddock: connect with  export OPEN_SANDBOX_DOMAIN={addr} OPEN_SANDBOX_API_KEY=$(cat {})",
                file.display()
            ),
            (Some(_), None) => eprintln!(
                "paddock: connect with  export OPEN_SANDBOX_DOMAIN={addr} OPEN_SANDBOX_API_KEY=<the key you set>"
            ),
            (None, _) => eprintln!("paddock: connect with  export OPEN_SANDBOX_DOMAIN={addr}"),
        }
    })
    .await?;
    Ok(0)
}
