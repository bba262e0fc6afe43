//! The Kubernetes runtime's entry: its options and how it opens, and `paddock reap-pvcs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use paddock_core::naming::NamingMode;
use paddock_core::runtime::Runtime;
use paddock_core::units::{parse_bytes, parse_cpus, parse_duration};

use super::{BoxFuture, Entry, RuntimeOpts, parse_pair};

pub const ENTRY: Entry = Entry {
    name: "kubernetes",
    about: "Pods on a Kubernetes cluster (keeper Pod + PVC + NetworkPolicy per sandbox)",
    open,
    gateway_address: |opts| Ok(opts.kube.gateway_address),
    priority_tiers: |opts| Ok(opts.kube.priority_classes.iter().map(|(t, _)| t.clone()).collect()),
    // Its sandboxes' images are pulled by the kubelet of the node a Pod lands on.
    prepull: None,
};

fn open<'a>(
    opts: &'a RuntimeOpts,
    _data_dir: &'a Path,
    naming: NamingMode,
    serving: bool,
) -> BoxFuture<'a, Result<Arc<dyn Runtime>>> {
    Box::pin(async move {
        let rt = Arc::new(paddock_runtime_k8s::KubeRuntime::from_default_kubeconfig(opts.kube.config(naming)?).await?);
        if serving {
            rt.preflight().await.context("the Kubernetes runtime cannot start")?;
            if let Some(handler) = rt.check_runtime_class().await.context("the Kubernetes runtime cannot start")? {
                let class = opts.kube.runtime_class.as_deref().unwrap_or_default();
                let isolation = opts.kube.isolation.map(|i| format!("{i:?}").to_lowercase()).unwrap_or_default();
                eprintln!("paddock: sandbox Pods run under RuntimeClass {class} (handler {handler}, {isolation})");
            }
            rt.spawn_reaper();
        }
        let rt: Arc<dyn Runtime> = rt;
        Ok(rt)
    })
}

/// `paddock reap-pvcs`: one run of the workspace PVC reaper (Kubernetes only; a CronJob runs
/// it). Exit status 0 when the run completed.
pub async fn reap_pvcs(opts: &RuntimeOpts, naming: NamingMode, ttl: std::time::Duration, json: bool) -> Result<u8> {
    if opts.runtime != ENTRY.name {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IsolationKind {
    Gvisor,
    Kata,
    Firecracker,
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
