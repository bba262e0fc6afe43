//! The command-line options of `--runtime kubernetes` (clap), here with the runtime they
//! configure so that every binary that opens it (`paddock`, `paddock-bench`) takes the same
//! flags: the `cli` feature.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use paddock_core::naming::NamingMode;
use paddock_core::units::{parse_bytes, parse_cpus, parse_duration};

use crate::{Isolation, KubeConfig, SandboxModel};

/// Options that do not make a configuration, said in the flags' words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OptionsError(pub String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
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
    /// The runtime's configuration these options give, or what is wrong with them.
    pub fn config(&self, naming: NamingMode) -> Result<KubeConfig, OptionsError> {
        // gVisor runs a Pod under its own kernel with host users (google/gvisor#13303): a user
        // namespace is not what isolates it there, and asking for one is refused rather than
        // dropped unsaid.
        if self.user_namespaces && self.isolation == Some(IsolationKind::Gvisor) {
            return Err(OptionsError(
                "--user-namespaces with --isolation gvisor: gVisor Pods keep host users (its own kernel is the boundary, google/gvisor#13303); drop --user-namespaces, or use it with another RuntimeClass (kata, firecracker) or none".into(),
            ));
        }
        Ok(KubeConfig {
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
                ModelKind::Keeper => SandboxModel::Keeper,
                ModelKind::Claim => SandboxModel::Claim,
            },
            warm_pool: self.warm_pool,
            profile_idle: self.profile_idle,
            gateway_address: self.gateway_address,
            priority_classes: self.priority_class_map()?,
            isolation: self.isolation.map(|i| match i {
                IsolationKind::Gvisor => Isolation::Gvisor,
                IsolationKind::Kata => Isolation::Kata,
                IsolationKind::Firecracker => Isolation::Firecracker,
            }),
            agent: match self.agent.as_deref() {
                Some("none") => None,
                Some(path) => Some(PathBuf::from(path)),
                None => std::env::current_exe().ok().and_then(|exe| crate::agent::find_beside(&exe)),
            },
            ..Default::default()
        })
    }
}

impl KubeOpts {
    fn priority_class_map(&self) -> Result<std::collections::BTreeMap<String, String>, OptionsError> {
        let mut map = std::collections::BTreeMap::new();
        for (tier, class) in &self.priority_classes {
            if let Some(other) = map.insert(tier.clone(), class.clone()) {
                return Err(OptionsError(format!(
                    "--priority-class gives tier {tier} twice ({other} and {class}): give each tier one class"
                )));
            }
        }
        Ok(map)
    }
}

fn parse_priority_class(s: &str) -> Result<(String, String), String> {
    let (tier, class) = s
        .split_once('=')
        .map(|(t, c)| (t.trim().to_owned(), c.trim().to_owned()))
        .filter(|(t, c)| !t.is_empty() && !c.is_empty())
        .ok_or_else(|| format!("{s:?} is not TIER=CLASS, e.g. batch=paddock-batch"))?;
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        kube: KubeOpts,
    }

    fn parse(line: &str) -> Result<KubeOpts, String> {
        Line::try_parse_from(std::iter::once("x").chain(line.split_whitespace()))
            .map(|l| l.kube)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_options_make_the_configuration_and_refuse_in_the_flags_words() {
        let c = parse("--namespace n --model claim --warm-pool 2 --runtime-class k --isolation kata --priority-class batch=paddock-batch --k8s-agent none")
            .unwrap()
            .config(NamingMode::Hashed)
            .unwrap();
        assert_eq!((c.namespace.as_str(), c.model, c.warm_pool), ("n", SandboxModel::Claim, 2));
        assert_eq!((c.runtime_class.as_deref(), c.isolation), (Some("k"), Some(Isolation::Kata)));
        assert_eq!(c.priority_classes.get("batch").map(String::as_str), Some("paddock-batch"));
        assert_eq!(c.agent, None, "--k8s-agent none: pods/exec alone");
        let twice = parse("--priority-class batch=a --priority-class batch=b").unwrap().config(NamingMode::Hashed);
        assert!(twice.unwrap_err().0.contains("gives tier batch twice"));
        for (line, says) in [
            ("--priority-class batch=Not_A_Name", "is not a PriorityClass name"),
            ("--priority-class batch", "is not TIER=CLASS"),
            ("--profile-idle 5m", "give at least 10m"),
            ("--runtime-class k", "--isolation"),
        ] {
            let e = parse(line).err().unwrap_or_else(|| panic!("{line} was accepted"));
            assert!(e.contains(says), "{line}: {e}");
        }
    }
}
