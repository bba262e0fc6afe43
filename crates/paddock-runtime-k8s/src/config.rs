//! How the runtime uses the cluster (`KubeConfig`), with the isolation a RuntimeClass gives
//! and where sandboxes come from.

use std::time::Duration;

use paddock_core::naming::NamingMode;

/// How the runtime uses the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeConfig {
    /// The kubeconfig context to use; `None`: the in-cluster service account, else the
    /// kubeconfig's current context.
    pub context: Option<String>,
    /// The namespace every object lives in; it must exist.
    pub namespace: String,
    /// The image of sandboxes whose spec names none. It needs a POSIX `sh` and busybox-level
    /// tools (`cat stat ls mkdir rm mv chmod dirname env setsid kill sleep`).
    pub default_image: String,
    /// `IfNotPresent`, `Always` or `Never`.
    pub image_pull_policy: String,
    /// How thread ids become object names when a spec does not say; `DawnCompat` adopts
    /// Dawn's PVCs.
    pub naming: NamingMode,
    /// A RuntimeClass (gVisor, Kata) for every sandbox Pod.
    pub runtime_class: Option<String>,
    /// Sets `hostUsers: false` (a user namespace per Pod; needs cluster support).
    pub host_users_false: bool,
    /// Size of a new workspace PVC when the spec gives none.
    pub workspace_default_bytes: u64,
    /// StorageClass of new workspace PVCs; `None` uses the cluster default.
    pub storage_class: Option<String>,
    /// How long a new Pod may take to be Running and Ready.
    pub ready_timeout: Duration,
    /// CPU request per Pod, at most its limit; `None` requests the limit (Guaranteed QoS,
    /// whose keeper the OOM killer spares: commands run at `oom_score_adj` 1000).
    pub cpu_request_millicpus: Option<u32>,
    /// How often `spawn_reaper` looks for expired sandboxes.
    pub reap_interval: Duration,
    /// Adds a root init container (image `default_image`, only `CAP_CHOWN`) that gives a
    /// workspace PVC's root directory to the sandbox user. Needed where the provisioner
    /// ignores `fsGroup`, as hostPath does (its volumes are root-owned 0750); not allowed
    /// under the `restricted` Pod Security Standard.
    pub chown_workspace: bool,
    /// How `create` gets a sandbox without a workspace: its own keeper Pod, or a claim on an
    /// agent-sandbox warm pool. Workspaces always use keeper Pods: a claim's volumes end with
    /// the claim, and a thread's must outlive its sandboxes.
    pub model: SandboxModel,
    /// Pre-started Pods kept in each warm pool (claim model only): the default profile's and
    /// those of the first few other profiles used.
    pub warm_pool: u32,
    /// The static `paddock-agent` binary to run commands through (see `agent`); `None` runs
    /// every command over `pods/exec`.
    pub agent: Option<std::path::PathBuf>,
    /// A claim profile (template and warm pool) other than the default one that no server
    /// has claimed from for this long, and that no claim uses, is deleted by the reaper.
    pub profile_idle: Duration,
    /// The address sandbox Pods reach the server's gateway at (a node address the server
    /// listens on, or the server Pod's; not a Service IP, which a NetworkPolicy's `ipBlock`
    /// never sees once kube-proxy rewrote it): with it, runs run on Kubernetes; without, a
    /// gateway is refused.
    pub gateway_address: Option<std::net::SocketAddr>,
    /// The PriorityClass of each run tier's sandbox Pods (`--priority-class TIER=CLASS`);
    /// empty: every Pod has the cluster's default priority.
    pub priority_classes: std::collections::BTreeMap<String, String>,
    /// What `runtime_class` is declared to give (`--isolation`), which `paddock check` proves.
    pub isolation: Option<Isolation>,
}

/// The boundary a RuntimeClass gives, as the operator declared it (never guessed from its
/// name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// A user-space kernel (runsc).
    Gvisor,
    /// A virtual machine per Pod, which needs `/dev/kvm` on the node.
    Kata,
    /// A Firecracker microVM per Pod, which needs `/dev/kvm` on the node.
    Firecracker,
}

impl Isolation {
    /// Its word in `Capabilities::isolation` and a task's `requires.isolation`.
    pub fn word(self) -> &'static str {
        match self {
            Self::Gvisor => "gvisor",
            Self::Kata => "kata",
            Self::Firecracker => "firecracker",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Gvisor => "gVisor",
            Self::Kata => "Kata",
            Self::Firecracker => "Firecracker",
        }
    }

    /// Whether the class runs a virtual machine, which needs hardware virtualization
    /// (`/dev/kvm`, nested virtualization on a cloud VM) on the node.
    pub fn needs_kvm(self) -> bool {
        matches!(self, Self::Kata | Self::Firecracker)
    }
}

pub(crate) const NO_GATEWAY_IN_CLAIMS: &str = "a claimed Pod's NetworkPolicy is its template's, which cannot open the gateway to one run: serve runs with the keeper model (--model keeper)";

/// Why a runtime of `config` gives sandboxes no gateway, if it gives none.
pub(crate) fn no_gateway_because(config: &KubeConfig) -> Option<&'static str> {
    match (config.gateway_address, config.model) {
        (None, _) => Some(
            "sandbox Pods need the address they reach it at: start the server with --gateway-address IP:PORT (an address of this node, or the server Pod's)",
        ),
        (Some(_), SandboxModel::Claim) => Some(NO_GATEWAY_IN_CLAIMS),
        (Some(_), SandboxModel::Keeper) => None,
    }
}

/// Where a created sandbox's Pod comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxModel {
    /// Paddock creates the Pod (Dawn's keeper model).
    #[default]
    Keeper,
    /// agent-sandbox's controller hands out a Pod for a `SandboxClaim` (Hephaestus's model).
    Claim,
}

impl Default for KubeConfig {
    fn default() -> Self {
        Self {
            context: None,
            namespace: "paddock".into(),
            default_image: "paddock.local/sandbox:1".into(),
            image_pull_policy: "IfNotPresent".into(),
            naming: NamingMode::Hashed,
            runtime_class: None,
            host_users_false: false,
            workspace_default_bytes: 1 << 30,
            storage_class: None,
            ready_timeout: Duration::from_secs(120),
            cpu_request_millicpus: None,
            reap_interval: Duration::from_secs(30),
            chown_workspace: false,
            model: SandboxModel::Keeper,
            warm_pool: 0,
            agent: None,
            profile_idle: Duration::from_secs(3600),
            gateway_address: None,
            priority_classes: Default::default(),
            isolation: None,
        }
    }
}
