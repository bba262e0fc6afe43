//! Paddock's Kubernetes runtime. In Dawn's keeper model (the default, and always for
//! workspaces) per sandbox one keeper Pod that only sleeps, one deny-all NetworkPolicy, and per
//! workspace one RWO PVC mounted at `/workspace`; in the claim model (`claim`) a created
//! sandbox is an agent-sandbox `SandboxClaim` on a warm pool.
//! Commands and file operations are `pods/exec` calls into the keeper; `connect` is
//! `pods/portforward`. The cluster's objects are the only state: labels and annotations carry
//! each sandbox's id, spec and expiry, so several servers can share a namespace.
//!
//! The server's Role in the namespace needs: `pods` create get list delete patch;
//! `pods/exec` and `pods/portforward` create get; `persistentvolumeclaims` create get list
//! delete; `networking.k8s.io` `networkpolicies` create get delete; `events` list; with the
//! claim model also `extensions.agents.x-k8s.io` `sandboxtemplates` create list patch delete, `sandboxwarmpools`
//! list create patch delete, `sandboxclaims` create get list patch delete (`check::CLAIM_NEEDED`). Sandbox
//! Pods get no token. Deny-all NetworkPolicies need a CNI that enforces them.

pub mod agent;
pub mod check;
pub mod claim;
#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
mod config;
mod environ;
pub mod exec;
pub mod files;
pub mod gate;
pub mod objects;
mod pod_settings;
mod pods;
#[cfg(feature = "probes")]
pub mod probes;
mod profiles;
pub mod reap_pvcs;
pub mod runtime_class;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy as KubePolicy;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions};
use paddock_core::naming::{NamingMode, ThreadId, sanitize_hashed};
use paddock_core::runtime::{
    ByteReader, Capabilities, Duplex, ExecRequest, FileOp, FileReply, NetworkFeature, Process, Runtime, RuntimeError,
    SandboxId, SandboxInfo, SandboxMetrics, VolumeKind,
};
use paddock_core::spec::{NetworkPolicy, SandboxSpec, ValidatedSpec, WorkspaceRef};
use paddock_core::volume::VolumeSource;
use tokio::io::AsyncReadExt;

use crate::objects::{Names, PodPhase, Shape};
use paddock_core::units::unix_ms as now_ms;

mod port;

pub use config::{Isolation, KubeConfig, SandboxModel};
use config::{NO_GATEWAY_IN_CLAIMS, no_gateway_because};
pub use environ::{METRICS_SCRIPT, parse_metrics};
use environ::{parse_environ, sandbox_env, with_request_env};

/// The Kubernetes runtime. Cloning is cheap and shares the client.
#[derive(Clone)]
pub struct KubeRuntime {
    config: KubeConfig,
    pods: Api<Pod>,
    claims: Api<PersistentVolumeClaim>,
    policies: Api<KubePolicy>,
    events: Api<Event>,
    templates: Api<DynamicObject>,
    pools: Api<DynamicObject>,
    sandbox_claims: Api<DynamicObject>,
    /// Profiles whose template and pool this process has made sure of, and when.
    profiles: Arc<Mutex<HashMap<String, std::time::Instant>>>,
    /// How commands reach Pods.
    transport: exec::Transport,
    /// Why the configured agent cannot be used; `preflight` reports it.
    agent_error: Option<String>,
    /// Where sandboxes this server ran commands in live, for the agent's fast path.
    located: Arc<Mutex<HashMap<SandboxId, Arc<Located>>>>,
}

/// A sandbox's Pod (name and uid) and its spec's environment, which never change.
#[derive(Debug, Clone)]
struct Located {
    pod: String,
    uid: String,
    env: BTreeMap<String, String>,
}

/// Sandboxes `located` holds before it drops those whose agent is not connected.
const MAX_LOCATED: usize = 4096;
/// A sandbox whose environment is larger than this is looked up on every command instead
/// (4096 of the largest environments a spec may carry would hold a lot of memory).
const MAX_LOCATED_ENV: usize = 16 << 10;

const POLL: Duration = Duration::from_millis(250);
/// Profiles (besides the default) whose warm pools get `warm_pool` Pods.
const MAX_WARM_PROFILES: usize = 4;
/// Profiles (templates + pools) one namespace holds at most; sandboxes of any further shape
/// get keeper Pods.
const MAX_PROFILES: usize = 32;
/// How long a server trusts that a profile it made sure of still exists (the reaper of any
/// server may delete an idle one); after that the next claim checks and touches it again.
const PROFILE_RECHECK: Duration = Duration::from_secs(60);
/// How long a deleted Pod or PVC may take to disappear before we stop waiting.
const GONE_TIMEOUT: Duration = Duration::from_secs(60);

fn random<const N: usize>() -> Result<[u8; N], RuntimeError> {
    let mut b = [0u8; N];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| RuntimeError::System(format!("reading random bytes: {e}")))?;
    Ok(b)
}

/// Maps an API error; `what` says what was being done.
fn api_error(what: &str, e: kube::Error) -> RuntimeError {
    match e {
        kube::Error::Api(s) => {
            let msg = format!("{what}: {}", s.message);
            match s.code {
                404 => RuntimeError::NotFound(msg),
                409 => RuntimeError::Conflict(msg),
                403 if s.message.contains("exceeded quota") => RuntimeError::Exhausted(msg),
                403 => RuntimeError::System(format!("{msg} (check the server's RBAC role in the namespace)")),
                400 | 422 => RuntimeError::InvalidArgument(msg),
                429 | 503 | 504 => RuntimeError::Unavailable(msg),
                _ => RuntimeError::System(msg),
            }
        }
        other => RuntimeError::Unavailable(format!("{what}: the Kubernetes API is not reachable: {other}")),
    }
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl KubeRuntime {
    pub fn new(client: Client, config: KubeConfig) -> Self {
        let ns = config.namespace.as_str();
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let (binary, agent_error) = match config.agent.as_deref().map(agent::AgentBinary::load) {
            None => (None, None),
            Some(Ok(b)) => (Some(b), None),
            Some(Err(e)) => (None, Some(e)),
        };
        let transport =
            exec::Transport { pods: pods.clone(), agents: Arc::new(agent::Agents::new(binary, pods.clone())) };
        Self {
            transport,
            agent_error,
            located: Arc::default(),
            pods,
            claims: Api::namespaced(client.clone(), ns),
            policies: Api::namespaced(client.clone(), ns),
            events: Api::namespaced(client.clone(), ns),
            templates: Api::namespaced_with(client.clone(), ns, &claim::resource("SandboxTemplate")),
            pools: Api::namespaced_with(client.clone(), ns, &claim::resource("SandboxWarmPool")),
            sandbox_claims: Api::namespaced_with(client, ns, &claim::resource("SandboxClaim")),
            profiles: Arc::default(),
            config,
        }
    }

    /// Connects with the in-cluster service account, else `KUBECONFIG` / `~/.kube/config`.
    pub async fn from_default_kubeconfig(config: KubeConfig) -> Result<Self, RuntimeError> {
        let client = match &config.context {
            Some(context) => client::for_context(context).await?,
            None => client::infer().await?,
        };
        Ok(Self::new(client, config))
    }

    pub fn config(&self) -> &KubeConfig {
        &self.config
    }

    /// A user command started by the Pod's agent; `None` when the request was never sent
    /// (the connection was gone), so the caller may use `pods/exec`.
    async fn exec_through_agent(
        &self,
        sender: agent::Sender,
        pod: String,
        spec: paddock_agent_wire::ExecSpec,
        timeout: Option<Duration>,
    ) -> Option<Result<Process, RuntimeError>> {
        match agent::exec(sender.clone(), &pod, &spec).await {
            Ok((running, oom)) => {
                Some(Ok(exec::process(running, exec::Control::Agent(sender, oom), &pod, spec.token, timeout)))
            }
            Err(agent::RunError::Failed(e)) => Some(Err(e)),
            Err(agent::RunError::NotSent(e)) => {
                tracing::debug!(pod, error = %e, "the agent's connection is gone: pods/exec instead");
                self.transport.agents.forget_closed(&pod);
                None
            }
        }
    }

    /// The environment the image gives the keeper (its `Env`, as the container runtime set
    /// it), read from the keeper's `/proc/1/environ`; empty when it cannot be read (commands
    /// then get the spec's environment alone, as before).
    async fn image_env(&self, pod: &str) -> BTreeMap<String, String> {
        let argv = vec!["cat".to_owned(), "/proc/1/environ".to_owned()];
        let read = async { exec::collect(self.transport.start(pod, argv, false).await?, None).await };
        match tokio::time::timeout(exec::HELPER_TIMEOUT, read).await {
            Ok(Ok((0, out, _))) => parse_environ(&out),
            Ok(Ok((code, _, err))) => {
                tracing::debug!(pod, code, err = %String::from_utf8_lossy(&err), "cannot read the image's environment");
                BTreeMap::new()
            }
            Ok(Err(e)) => {
                tracing::debug!(pod, error = %e, "cannot read the image's environment");
                BTreeMap::new()
            }
            Err(_) => BTreeMap::new(),
        }
    }

    fn remember(&self, id: &SandboxId, located: Located) {
        if located.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > MAX_LOCATED_ENV {
            return;
        }
        let mut map = self.located.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_LOCATED {
            let agents = &self.transport.agents;
            map.retain(|_, l| agents.ready(&l.pod, &l.uid).is_some());
        }
        if map.len() < MAX_LOCATED {
            map.insert(id.clone(), Arc::new(located));
        }
    }

    fn transport_summary(&self) -> String {
        match &self.config.agent {
            Some(path) if self.transport.agents.enabled() => {
                format!("commands go through the agent {} in each Pod", path.display())
            }
            _ => "every command is a pods/exec call (no agent: see --k8s-agent)".into(),
        }
    }

    /// Checks that the API answers and the namespace can be used; says what to fix if not.
    pub async fn preflight(&self) -> Result<String, RuntimeError> {
        if let Some(e) = &self.agent_error {
            return Err(RuntimeError::InvalidArgument(format!("the agent cannot be used: {e}")));
        }
        let ns = &self.config.namespace;
        let lp = ListParams::default().labels(objects::SANDBOX_LABEL).limit(1);
        match self.pods.list(&lp).await {
            Ok(_) if self.config.model == SandboxModel::Claim => {
                let pool = self.ensure_profile(&self.prepare(ValidatedSpec::default())?).await?;
                Ok(format!(
                    "Kubernetes reachable in namespace {ns:?}; sandboxes are claims on warm pool {pool} ({} pre-started); {}",
                    self.config.warm_pool,
                    self.transport_summary()
                ))
            }
            Ok(_) => Ok(format!(
                "Kubernetes reachable; sandbox Pods can be listed in namespace {ns:?}; {}",
                self.transport_summary()
            )),
            Err(e) => {
                Err(api_error(&format!("listing Pods in namespace {ns:?} (does it exist? may this server use it?)"), e))
            }
        }
    }

    /// Deletes expired sandboxes every `reap_interval`. Several servers may run one each: a
    /// deletion is conditional on the Pod's uid, so a replacement Pod is never hit.
    pub fn spawn_reaper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(me.config.reap_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = me.reap_expired().await {
                    tracing::warn!(error = %e, "reaping expired sandboxes");
                }
            }
        })
    }

    /// Deletes every sandbox whose expiry has passed; returns how many.
    pub async fn reap_expired(&self) -> Result<usize, RuntimeError> {
        let now = now_ms();
        let mut n = 0;
        let pods = self.list_pods().await?;
        for pod in &pods {
            if pod.metadata.deletion_timestamp.is_none() && objects::expired(pod, now) {
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                // One stubborn Pod must not keep the others alive.
                match self.delete_sandbox_pod(pod, false).await {
                    Ok(()) => {
                        tracing::info!(pod = name, "expired sandbox deleted");
                        n += 1;
                    }
                    Err(e) => tracing::warn!(pod = name, error = %e, "deleting an expired sandbox"),
                }
            }
        }
        if self.config.model == SandboxModel::Claim {
            n += self.reap_orphan_claims(&pods, now).await?;
            n += self.reap_idle_profiles(now).await?;
        }
        Ok(n)
    }

    fn shape(&self, image: &str) -> Shape {
        Shape {
            namespace: self.config.namespace.clone(),
            image: image.to_owned(),
            image_pull_policy: self.config.image_pull_policy.clone(),
            runtime_class: self.config.runtime_class.clone(),
            host_users_false: self.config.host_users_false,
            cpu_request_millicpus: self.config.cpu_request_millicpus,
            chown_image: self.config.chown_workspace.then(|| self.config.default_image.clone()),
            priority_classes: self.config.priority_classes.clone(),
        }
    }

    fn no_gateway_because(&self) -> Option<&'static str> {
        no_gateway_because(&self.config)
    }

    /// Fills in what the runtime decides of a validated spec: the image, the gateway.
    fn prepare(&self, spec: ValidatedSpec) -> Result<SandboxSpec, RuntimeError> {
        let mut spec = spec.into_inner();
        if spec.gateway.is_some() {
            // No forwarder in the Pod: it dials the gateway at the address Pods reach it by,
            // which its NetworkPolicy opens (that address, that port) and its environment
            // names; the token alone says which attempt a call is from.
            // A thread's sandbox is a keeper Pod whatever the model.
            let claimed = self.config.model == SandboxModel::Claim && spec.workspace.is_none();
            let at = match (self.config.gateway_address, claimed) {
                (Some(at), false) => at,
                _ => {
                    let why = self.no_gateway_because().unwrap_or(NO_GATEWAY_IN_CLAIMS);
                    return Err(RuntimeError::Unsupported(format!("a gateway (the way home runs need): {why}")));
                }
            };
            spec.gateway = Some(at);
            spec.gateway_secret = None;
            paddock_core::spec::expand_gateway(&mut spec.env, &format!("http://{at}"));
        }
        for v in &spec.volumes {
            match &v.source {
                VolumeSource::Host { .. } => {
                    return Err(RuntimeError::Unsupported(format!(
                        "volume {}: host paths are not mounted on Kubernetes (a node's directories are not the sandbox's): use a named volume (pvc)",
                        v.name
                    )));
                }
                VolumeSource::Named { delete_with_sandbox: true, name, .. } => {
                    return Err(RuntimeError::Unsupported(format!(
                        "volume {}: deleteOnSandboxTermination is not supported: named volumes are kept until `paddock volume rm {name}` or DELETE /v1/volumes/{name}",
                        v.name
                    )));
                }
                VolumeSource::Named { name, .. } if name.starts_with("paddock-") => {
                    return Err(RuntimeError::InvalidArgument(format!(
                        "volume {}: names starting with paddock- are Paddock's own claims (workspaces): choose another name",
                        v.name
                    )));
                }
                VolumeSource::Named { .. } => {}
            }
        }
        // Exhaustive on purpose: a new network mode must be handled here before it compiles.
        match &spec.network {
            NetworkPolicy::LoopbackOnly => {}
            NetworkPolicy::Egress(p) if p.denies_everything() => spec.network = NetworkPolicy::LoopbackOnly,
            NetworkPolicy::Egress(_) if self.config.model == SandboxModel::Claim => {
                return Err(RuntimeError::Unsupported(
                    "egress rules are not supported with --model claim (a warm pool's NetworkPolicy is its template's, shared by every claim): use the keeper model for sandboxes with egress".into(),
                ));
            }
            NetworkPolicy::Egress(p) => {
                objects::egress_rules(p).map_err(RuntimeError::Unsupported)?;
            }
        }
        match spec.image.as_deref() {
            None => spec.image = Some(self.config.default_image.clone()),
            // The local runtime's names for a root filesystem mean nothing to a kubelet.
            Some(i) if i == "host" || i.starts_with('/') => {
                return Err(RuntimeError::Unsupported(format!(
                    "image {i:?} is a root filesystem of the local runtime: the Kubernetes runtime runs container images; name one (such as {:?}) or none for that default",
                    self.config.default_image
                )));
            }
            Some(_) => {}
        }
        if spec.credential_proxy {
            return Err(RuntimeError::InvalidArgument(format!(
                "credentialProxy: {}",
                paddock_core::runtime::VAULT_UNSUPPORTED
            )));
        }
        if spec.image_auth.is_some() {
            return Err(RuntimeError::Unsupported(
                "image credentials per request are not supported on the Kubernetes runtime: give the namespace's service account an imagePullSecret for the registry instead".into(),
            ));
        }
        if spec.working_dir.is_some() {
            return Err(RuntimeError::Unsupported(
                "a working directory is set by the image on the Kubernetes runtime".into(),
            ));
        }
        Ok(spec)
    }
}

#[async_trait::async_trait]
impl Runtime for KubeRuntime {
    async fn isolation_targets(&self) -> Result<paddock_core::runtime::IsolationTargets, RuntimeError> {
        Ok(gate::targets(self.pods.clone().into_client()).await)
    }

    async fn sandbox_settings(&self, id: &SandboxId) -> Result<Vec<paddock_core::runtime::SettingCheck>, RuntimeError> {
        let pod = self.find(id).await?;
        Ok(pod_settings::judge(&pod, objects::CONTAINER))
    }

    async fn check(&self, probe: bool) -> Result<paddock_core::preflight::Report, RuntimeError> {
        Ok(self.preflight_report(probe).await)
    }

    async fn health(&self) -> Result<(), RuntimeError> {
        // One small list proves the API server answers and the namespace's Pods are readable.
        self.pods.list(&ListParams::default().limit(1)).await.map(drop).map_err(|e| api_error("listing Pods", e))
    }

    async fn volumes(&self) -> Result<Vec<paddock_core::volume::NamedVolume>, RuntimeError> {
        let lp = ListParams::default().labels(&format!("{}={}", objects::MANAGED_BY, objects::VOLUME_MANAGER));
        let claims = self.claims.list(&lp).await.map_err(|e| api_error("listing volume PVCs", e))?;
        let pods = self.pods.list(&ListParams::default()).await.map_err(|e| api_error("listing Pods", e))?;
        let mut out = Vec::new();
        for c in claims.items {
            let Some(name) = c.metadata.name.clone() else { continue };
            if c.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let size_bytes = c
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .and_then(|q| paddock_core::units::parse_bytes(&q.0).ok())
                .unwrap_or(0);
            let created_unix_ms =
                c.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_millisecond().max(0).cast_unsigned());
            let used_by = pods
                .items
                .iter()
                .filter(|p| crate::reap_pvcs::mounted(std::slice::from_ref(*p)).contains(&name))
                .filter_map(|p| {
                    p.metadata.labels.as_ref()?.get(objects::SANDBOX_LABEL).and_then(|s| SandboxId::parse(s).ok())
                })
                .collect();
            out.push(paddock_core::volume::NamedVolume {
                name,
                size_bytes,
                used_bytes: None,
                created_unix_ms,
                used_by,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn delete_volume(&self, name: &str) -> Result<(), RuntimeError> {
        let listed = self.volumes().await?;
        let Some(v) = listed.iter().find(|v| v.name == name) else {
            return Err(RuntimeError::NotFound(format!(
                "no named volume {name}: see `paddock volume ls` (only volumes Paddock made are deleted here)"
            )));
        };
        if !v.used_by.is_empty() {
            let ids: Vec<String> = v.used_by.iter().map(|i| i.to_string()).collect();
            return Err(RuntimeError::Conflict(format!(
                "named volume {name} is mounted by sandbox {}: destroy {} first",
                ids.join(", "),
                if ids.len() == 1 { "it" } else { "them" }
            )));
        }
        match self.claims.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_code(&e, 404) => Ok(()),
            Err(e) => Err(api_error(&format!("deleting volume PVC {name}"), e)),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            runtime: "kubernetes".into(),
            pause: false,
            persistent_workspaces: true,
            run_as_other_user: false,
            images: format!(
                "container image references with a POSIX sh and busybox-level tools (default {}, pull policy {})",
                self.config.default_image, self.config.image_pull_policy
            ),
            network: vec![
                NetworkFeature::Deny,
                NetworkFeature::AllowAll,
                NetworkFeature::IpRules,
                NetworkFeature::PortRules,
                NetworkFeature::Change,
            ],
            metrics: true,
            volumes: vec![VolumeKind::Named],
            gateway: self.no_gateway_because().is_none(),
            // Pods dial the gateway themselves: only a run's token says who calls.
            gateway_names_sandbox: false,
            no_gateway_because: self.no_gateway_because().map(str::to_owned),
            default_workspace_bytes: Some(self.config.workspace_default_bytes),
            credential_vault: false,
            isolation: self.config.isolation.map_or("namespaces", Isolation::word).into(),
            // No device plugin resources or privileged Pods: neither devices nor containers inside.
            devices: Vec::new(),
            nested_containers: false,
        }
    }

    async fn create(&self, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        let me = self.clone();
        detached(async move { me.create_now(spec).await }).await
    }

    async fn get(&self, id: &SandboxId) -> Result<SandboxInfo, RuntimeError> {
        Self::info_of(&self.find(id).await?)
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>, RuntimeError> {
        let mut out: Vec<SandboxInfo> = self
            .list_pods()
            .await?
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(objects::info)
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process, RuntimeError> {
        request.validate()?;
        let cwd = exec::resolve_cwd(request.cwd.as_deref())?;
        let token = format!("{}", u64::from_le_bytes(random()?));
        let timeout = request.timeout_ms.map(Duration::from_millis);
        // A sandbox this server found before, whose Pod's agent is connected: no lookup. The
        // connection ends with the Pod, and the uid tells a thread's next Pod of the same
        // name apart, so this never reaches another sandbox.
        let through_agent = |sender: agent::Sender, pod: String, env: BTreeMap<String, String>| {
            let spec = paddock_agent_wire::ExecSpec {
                argv: request.argv.clone(),
                env,
                cwd: cwd.clone(),
                token: token.clone(),
                stdin: request.stdin,
            };
            self.exec_through_agent(sender, pod, spec, timeout)
        };
        let located = self.located.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned();
        if let Some(l) = &located
            && let Some(sender) = self.transport.agents.ready(&l.pod, &l.uid)
            && let Some(started) = through_agent(sender, l.pod.clone(), with_request_env(&l.env, &request.env)).await
        {
            return started;
        }
        let pod = self.find(id).await?;
        let info = Self::info_of(&pod)?;
        let name = self.ready_pod_of(id, &pod)?;
        // The sandbox's environment: the image's (read once per Pod), then the spec's.
        let base = match (&located, &pod.metadata.uid) {
            (Some(l), Some(uid)) if l.pod == name && l.uid == *uid => l.env.clone(),
            _ => {
                let base = sandbox_env(&self.image_env(&name).await, &info.spec.env);
                if let Some(uid) = &pod.metadata.uid {
                    self.remember(id, Located { pod: name.clone(), uid: uid.clone(), env: base.clone() });
                }
                base
            }
        };
        let env = with_request_env(&base, &request.env);
        if let Some(sender) = self.transport.agents.sender(&name, pod.metadata.uid.as_deref())
            && let Some(started) = through_agent(sender, name.clone(), env.clone()).await
        {
            return started;
        }
        let wrapped = exec::wrap(&token, &cwd, &env, &request.argv);
        if let Some(words) = wrapped.staged {
            let stage =
                vec!["sh".into(), "-c".into(), exec::STAGE_SCRIPT.into(), "paddock-stage".into(), token.clone()];
            let mut input: &[u8] = words.as_bytes();
            let (code, _, err) =
                exec::collect(self.transport.start(&name, stage, true).await?, Some(&mut input)).await?;
            if code != 0 {
                return Err(RuntimeError::Exhausted(format!(
                    "staging a large command line in sandbox {id}'s /tmp failed: {}",
                    String::from_utf8_lossy(&err).trim()
                )));
            }
        }
        let running = exec::start_pods_exec(&self.transport.pods, &name, wrapped.argv, request.stdin).await?;
        Ok(exec::process(running, exec::Control::Wrapper(Box::new(self.transport.clone())), &name, token, timeout))
    }

    async fn file(&self, id: &SandboxId, mut op: FileOp) -> Result<FileReply, RuntimeError> {
        if let FileOp::Chown { path, user, group } = &op {
            // A Pod's files all belong to its one user: giving one to the sandbox user is
            // checking that it exists; no other owner is one a Pod can hand files to.
            let other = |o: &Option<paddock_core::runtime::FileOwner>| {
                o.is_some_and(|o| o != paddock_core::runtime::FileOwner::SandboxUser)
            };
            if other(user) || other(group) {
                return Err(RuntimeError::Unsupported(
                    "giving files to another owner (nobody or any other user) is not supported on Kubernetes: a Pod's files belong to its one user"
                        .into(),
                ));
            }
            op = FileOp::Stat { path: path.clone() };
        }
        let argv = files::op_argv(&op)?;
        let (what, target) = match &op {
            FileOp::List { path } => ("list", files::resolve(path)?),
            FileOp::Stat { path } => ("stat", files::resolve(path)?),
            FileOp::Mkdir { path, .. } => ("mkdir", files::resolve(path)?),
            FileOp::Remove { path, .. } => ("remove", files::resolve(path)?),
            FileOp::Move { from, to } => ("move", format!("{} to {}", files::resolve(from)?, files::resolve(to)?)),
            FileOp::Chmod { path, .. } | FileOp::Chown { path, .. } => ("chmod", files::resolve(path)?),
        };
        let (code, out, err) = self.script(id, argv, None).await?;
        if code != 0 {
            return Err(files::failure(&format!("{what} {target}"), &err));
        }
        let stat_of = |path: String| {
            let line = String::from_utf8_lossy(&out);
            files::parse_stat(&path, line.trim())
                .map(FileReply::Stat)
                .ok_or_else(|| RuntimeError::System(format!("{what} {target}: unreadable stat output {line:?}")))
        };
        match op {
            FileOp::List { .. } => Ok(FileReply::List { entries: files::parse_list(&out) }),
            FileOp::Remove { .. } => Ok(FileReply::Done),
            FileOp::Move { to, .. } => stat_of(files::resolve(&to)?),
            FileOp::Stat { path }
            | FileOp::Mkdir { path, .. }
            | FileOp::Chmod { path, .. }
            | FileOp::Chown { path, .. } => stat_of(files::resolve(&path)?),
        }
    }

    async fn read_file(&self, id: &SandboxId, path: &str) -> Result<ByteReader, RuntimeError> {
        let argv = files::read_argv(path)?;
        let what = format!("read {}", files::resolve(path)?);
        let pod = self.ready_pod(id).await?;
        let running = self.transport.start(&pod, argv, false).await?;
        let exec::Running { mut stdout, mut stderr, done, .. } = running;
        let errors = tokio::spawn(async move {
            let mut buf = Vec::new();
            let _ = (&mut stderr).take(64 << 10).read_to_end(&mut buf).await;
            buf
        });
        // The first bytes (or the end) tell whether `cat` opened the file: errors opening it
        // are returned here, before any contents.
        let mut head = vec![0u8; 32 << 10];
        let n = stdout.read(&mut head).await.map_err(|e| RuntimeError::from_io(&what, &e))?;
        head.truncate(n);
        if n == 0 {
            let code = done.await.map_err(|_| RuntimeError::System(format!("{what}: the exec vanished")))??;
            let err = errors.await.unwrap_or_default();
            if code != 0 {
                return Err(files::failure(&what, &err));
            }
            return Ok(Box::new(std::io::Cursor::new(Vec::new())));
        }
        let outcome = Box::pin(async move {
            let code = done.await.map_err(|_| std::io::Error::other("the exec vanished"))?;
            let err = errors.await.unwrap_or_default();
            match code {
                Ok(0) => Ok(()),
                Ok(_) => Err(std::io::Error::other(files::failure(&what, &err).to_string())),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            }
        });
        Ok(Box::new(files::FileReader { head: std::io::Cursor::new(head), rest: stdout, outcome: Some(outcome) }))
    }

    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        mode: Option<u32>,
        mut data: ByteReader,
    ) -> Result<(), RuntimeError> {
        let argv = files::write_argv(path, mode)?;
        let what = format!("write {}", files::resolve(path)?);
        let (code, _, err) = self.script(id, argv, Some(&mut data)).await?;
        if code != 0 {
            return Err(files::failure(&what, &err));
        }
        Ok(())
    }

    async fn connect(&self, id: &SandboxId, port: u16) -> Result<Box<dyn Duplex>, RuntimeError> {
        if port == 0 {
            return Err(RuntimeError::InvalidArgument(
                "port 0 is not a port: give the port a server listens on".into(),
            ));
        }
        if port == paddock_agent_wire::PORT {
            return Err(RuntimeError::InvalidArgument(format!(
                "port {port} is Paddock's agent's in a Kubernetes sandbox: serve on another port"
            )));
        }
        let pod = self.ready_pod(id).await?;
        let mut pf = self.pods.portforward(&pod, &[port]).await.map_err(|e| exec::exec_error(&pod, e))?;
        let missing = || RuntimeError::System(format!("port-forward to Pod {pod} gave no stream for port {port}"));
        let stream = pf.take_stream(port).ok_or_else(missing)?;
        let error = pf.take_error(port).ok_or_else(missing)?;
        Ok(Box::new(port::PortStream::new(stream, Box::pin(error))))
    }

    /// The policy in the Pod's spec annotation, enforced by its NetworkPolicy (which counts
    /// nothing and logs no denials).
    async fn egress(&self, id: &SandboxId) -> Result<paddock_core::egress::EgressStatus, RuntimeError> {
        let info = self.get(id).await?;
        Ok(paddock_core::egress::EgressStatus::uncounted(
            info.spec.network.policy(),
            paddock_core::egress::Enforcement::NetworkPolicy,
        ))
    }

    /// Rewrites the sandbox's NetworkPolicy, then the spec on its Pod: new connections follow
    /// as soon as the cluster's network plugin applies it (how existing ones fare is the
    /// plugin's choice).
    async fn set_egress(
        &self,
        id: &SandboxId,
        policy: paddock_core::egress::ValidatedPolicy,
    ) -> Result<paddock_core::egress::EgressStatus, RuntimeError> {
        let pod = self.find(id).await?;
        let mut spec = Self::info_of(&pod)?.spec;
        spec.network = NetworkPolicy::Egress(policy.into_inner());
        // The Pod's spec as read back, with the new policy: checked whole, the policy with it.
        let mut spec = self.prepare(spec.validated()?)?;
        if pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(claim::CLAIM_ANNOTATION))
            && spec.network != NetworkPolicy::LoopbackOnly
        {
            return Err(RuntimeError::Unsupported(
                "egress rules are not supported for a sandbox claimed from a warm pool: its NetworkPolicy is the pool's".into(),
            ));
        }
        let names = match &spec.workspace {
            Some(w) => objects::thread_names(&w.thread, w.naming),
            None => objects::sandbox_names(id, &spec),
        };
        self.set_policy_rules(&names.network_policy, &spec).await?;
        spec.image_auth = None;
        let annotations = serde_json::json!({"metadata": {"annotations": {
            objects::SPEC_ANNOTATION: serde_json::to_string(&spec).map_err(|e| RuntimeError::System(e.to_string()))?
        }}});
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(&annotations))
            .await
            .map_err(|e| api_error(&format!("recording the egress policy on Pod {name}"), e))?;
        self.egress(id).await
    }

    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics, RuntimeError> {
        let (_, out, _) = self.script(id, vec!["sh".into(), "-c".into(), METRICS_SCRIPT.into()], None).await?;
        let mut m = parse_metrics(&String::from_utf8_lossy(&out));
        m.at_unix_ms = now_ms();
        Ok(m)
    }

    async fn pause(&self, _id: &SandboxId) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported(
            "the kubernetes runtime cannot pause a sandbox (Pods cannot be frozen); release it instead and acquire it again later (the workspace is kept), or use the local runtime".into(),
        ))
    }

    async fn resume(&self, _id: &SandboxId) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported(
            "the kubernetes runtime cannot pause or resume a sandbox; acquire the thread again instead".into(),
        ))
    }

    async fn renew(&self, id: &SandboxId, ttl: Duration) -> Result<SandboxInfo, RuntimeError> {
        if ttl.is_zero() {
            return Err(RuntimeError::InvalidArgument("a renewal must be positive".into()));
        }
        let pod = self.find(id).await?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let expires = now_ms().saturating_add(paddock_core::units::millis(ttl));
        let patch = serde_json::json!({
            "metadata": {
                // The uid guard keeps a renewal from landing on a replacement Pod.
                "uid": pod.metadata.uid,
                "annotations": {objects::EXPIRES_ANNOTATION: expires.to_string()},
            }
        });
        let patched = self
            .pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| api_error(&format!("renewing sandbox {id}"), e))?;
        if let Some(claim) = pod.metadata.annotations.as_ref().and_then(|a| a.get(claim::CLAIM_ANNOTATION)) {
            // The claim's own shutdown time is the backstop that works with no server running.
            let patch = serde_json::json!({
                "metadata": {"annotations": {objects::EXPIRES_ANNOTATION: expires.to_string()}},
                "spec": {"lifecycle": {"shutdownTime": claim::rfc3339(expires)}},
            });
            self.sandbox_claims
                .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| api_error(&format!("renewing sandbox claim {claim}"), e))?;
        }
        Self::info_of(&patched)
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let pod = self.find(id).await?;
        self.delete_sandbox_pod(&pod, true).await
    }

    async fn acquire(&self, thread: &ThreadId, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        let me = self.clone();
        let thread = thread.clone();
        detached(async move { me.acquire_now(&thread, spec).await }).await
    }

    async fn release(&self, thread: &ThreadId) -> Result<(), RuntimeError> {
        self.stop_thread(thread).await
    }

    async fn destroy_workspace(&self, thread: &ThreadId) -> Result<(), RuntimeError> {
        self.stop_thread(thread).await?;
        let lp = ListParams::default().labels(&format!(
            "{}={}",
            objects::THREAD_HASH_LABEL,
            sanitize_hashed(thread.as_str())
        ));
        let mut claims: Vec<String> = self
            .claims
            .list(&lp)
            .await
            .map_err(|e| api_error("listing a thread's PVCs", e))?
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        claims.extend(Self::all_thread_names(thread).into_iter().filter_map(|n| n.pvc));
        claims.sort();
        claims.dedup();
        for name in &claims {
            match self.claims.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_code(&e, 404) => {}
                Err(e) => return Err(api_error(&format!("deleting workspace PVC {name}"), e)),
            }
        }
        // A PVC still terminating would be re-bound, old data and all, by the next acquire.
        for name in &claims {
            self.wait_claim_gone(name).await?;
        }
        Ok(())
    }
}

/// Waits until no object `name` for which `same` holds exists any more; `what` names it and
/// `hint` says what to check when it outlives `GONE_TIMEOUT`.
async fn wait_gone<K>(
    api: &Api<K>,
    name: &str,
    same: impl Fn(&K) -> bool,
    what: impl Fn() -> String,
    hint: impl Fn() -> String,
) -> Result<(), RuntimeError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = tokio::time::Instant::now() + GONE_TIMEOUT;
    loop {
        match api.get_opt(name).await.map_err(|e| api_error(&format!("reading {}", what()), e))? {
            None => return Ok(()),
            Some(o) if !same(&o) => return Ok(()),
            Some(_) if tokio::time::Instant::now() > deadline => {
                return Err(RuntimeError::Timeout(format!(
                    "{} was deleted but still exists after {} s; {}",
                    what(),
                    GONE_TIMEOUT.as_secs(),
                    hint()
                )));
            }
            Some(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Runs a lifecycle step to its end even when the caller stops waiting (a dropped HTTP
/// request): a Pod is then either ready or cleaned up, never left Pending.
async fn detached<T: Send + 'static>(
    step: impl std::future::Future<Output = Result<T, RuntimeError>> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::spawn(step).await.map_err(|e| RuntimeError::System(format!("a lifecycle task failed: {e}")))?
}

impl KubeRuntime {
    async fn create_now(&self, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        let spec = self.prepare(spec)?;
        // A warm pool's Pods come from its template: a sandbox with a workspace or volumes of
        // its own gets a keeper Pod instead.
        if self.config.model == SandboxModel::Claim
            && spec.workspace.is_none()
            && spec.volumes.is_empty()
            && let Some(info) = self.create_claimed(&spec).await?
        {
            return Ok(info);
        }
        let id = SandboxId::from_random(random()?);
        let names = objects::sandbox_names(&id, &spec);
        if let (Some(w), Some(pvc)) = (&spec.workspace, &names.pvc) {
            self.ensure_claim(&w.thread, w.naming, pvc, &spec).await?;
        }
        self.ensure_volumes(&spec).await?;
        match self.start_pod(&id, &names, &spec).await? {
            Some(pod) => Self::info_of(&pod),
            None => Err(RuntimeError::Conflict(format!("Pod {} exists already; try again", names.pod))),
        }
    }

    async fn acquire_now(&self, thread: &ThreadId, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        let naming = spec.workspace.as_ref().filter(|w| &w.thread == thread).map_or(self.config.naming, |w| w.naming);
        let mut spec = self.prepare(spec)?;
        spec.workspace = Some(WorkspaceRef { thread: thread.clone(), naming });
        let names = objects::thread_names(thread, naming);
        let claim = names.pvc.clone().unwrap_or_default();
        self.ensure_claim(thread, naming, &claim, &spec).await?;
        self.ensure_volumes(&spec).await?;
        // Dawn's state machine; every branch converges on one Pod of this deterministic name,
        // however many servers acquire at once (the loser of a create gets 409 and waits).
        for _ in 0..5 {
            match self.pods.get_opt(&names.pod).await.map_err(|e| api_error("reading a thread's Pod", e))? {
                None => {
                    let id = SandboxId::from_random(random()?);
                    if let Some(pod) = self.start_pod(&id, &names, &spec).await? {
                        return Self::info_of(&pod);
                    }
                }
                Some(pod) => {
                    let ours = objects::info(&pod).is_some();
                    match objects::phase(&pod) {
                        PodPhase::Ready | PodPhase::Starting(None) if ours => {
                            // A crash between policy and Pod would otherwise leave it unprotected.
                            let id = Self::info_of(&pod)?.id;
                            self.ensure_policy(&id, &names, &spec).await?;
                            let ready = self.wait_ready(&names.pod, pod.metadata.uid.as_deref()).await?;
                            return Self::info_of(&ready);
                        }
                        _ => {
                            // Ended, stuck, or a keeper of another product (Dawn's own):
                            // replace it; the workspace stays.
                            self.delete_sandbox_pod(&pod, true).await?;
                        }
                    }
                }
            }
        }
        Err(RuntimeError::Conflict(format!(
            "thread {thread}: its Pod {} kept changing under concurrent acquires; try again",
            names.pod
        )))
    }

    fn ready_pod_of(&self, id: &SandboxId, pod: &Pod) -> Result<String, RuntimeError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        match objects::phase(pod) {
            PodPhase::Ready => Ok(name),
            PodPhase::Starting(None) => Err(RuntimeError::Unavailable(format!(
                "sandbox {id} is still starting (Pod {name}); try again in a moment"
            ))),
            PodPhase::Starting(Some(why)) | PodPhase::Gone(why) => Err(RuntimeError::Unavailable(format!(
                "sandbox {id} cannot run commands: {why}; destroy it and create a new one"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_gateway_needs_its_address_and_the_keeper_model_and_says_so() {
        let config = |gateway_address, model| super::KubeConfig { gateway_address, model, ..Default::default() };
        let at = Some("10.244.0.1:8081".parse().unwrap());
        assert_eq!(super::no_gateway_because(&config(at, super::SandboxModel::Keeper)), None);
        let why = super::no_gateway_because(&config(None, super::SandboxModel::Keeper)).unwrap();
        assert!(why.contains("--gateway-address IP:PORT"), "{why}");
        let why = super::no_gateway_because(&config(at, super::SandboxModel::Claim)).unwrap();
        assert!(why.contains("keeper model"), "{why}");
    }

    use super::*;
    #[test]
    fn the_image_environment_comes_between_the_defaults_and_the_spec() {
        let environ = b"PATH=/usr/local/go/bin:/usr/bin\0HOME=/\0HOSTNAME=paddock-x\0GOPATH=/go\0LANG=C.UTF-8\0\
                        bad-name=1\0A=image\0novalue\0KUBERNETES_SERVICE_HOST=10.96.0.1\0KUBERNETES_PORT=tcp://x\0\
                        KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1\0";
        let image = parse_environ(environ);
        assert_eq!(
            image,
            BTreeMap::from([
                ("A".to_owned(), "image".to_owned()),
                ("GOPATH".to_owned(), "/go".to_owned()),
                ("LANG".to_owned(), "C.UTF-8".to_owned()),
                ("PATH".to_owned(), "/usr/local/go/bin:/usr/bin".to_owned()),
            ])
        );
        let spec = BTreeMap::from([("A".to_owned(), "spec".to_owned())]);
        let env = sandbox_env(&image, &spec);
        assert_eq!(env["HOME"], "/workspace");
        assert_eq!(env["PATH"], "/usr/local/go/bin:/usr/bin");
        assert_eq!(env["A"], "spec");
        assert_eq!(env["GOPATH"], "/go");
        // Without an image PATH, the default; the request has the last word.
        let env = sandbox_env(&BTreeMap::new(), &BTreeMap::new());
        assert_eq!(env["PATH"], paddock_core::spec::DEFAULT_PATH);
        let request = BTreeMap::from([("HOME".to_owned(), "/tmp".to_owned())]);
        assert_eq!(with_request_env(&env, &request)["HOME"], "/tmp");
    }

    #[test]
    fn metrics_parse_v1_and_v2() {
        let v1 = parse_metrics("mem1 1048576\ncpu1 123456789\n");
        assert_eq!((v1.memory_used_bytes, v1.cpu_used_ns), (Some(1 << 20), Some(123_456_789)));
        let v2 = parse_metrics("mem2 2048\ncpu2 10\n");
        assert_eq!((v2.memory_used_bytes, v2.cpu_used_ns), (Some(2048), Some(10_000)));
        let none = parse_metrics("");
        assert_eq!((none.memory_used_bytes, none.cpu_used_ns), (None, None));
    }

    #[test]
    fn api_errors_are_classified() {
        let status = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.into(),
                ..kube::core::Status::failure(message, "x")
            }))
        };
        assert_eq!(api_error("x", status(404, "gone")).code(), "NOT_FOUND");
        assert_eq!(api_error("x", status(403, "exceeded quota: q")).code(), "RESOURCE_EXHAUSTED");
        assert_eq!(api_error("x", status(422, "bad")).code(), "INVALID_ARGUMENT");
        assert_eq!(api_error("x", status(409, "exists")).code(), "CONFLICT");
    }

    #[test]
    fn capabilities_say_what_kubernetes_can_do() {
        // Needs no cluster: the client is never used.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
            let client = Client::try_from(config).unwrap();
            let k = KubeRuntime::new(client, KubeConfig::default());
            let c = k.capabilities();
            assert_eq!(c.runtime, "kubernetes");
            assert!(!c.pause && c.persistent_workspaces && !c.run_as_other_user);
            assert!(c.network.contains(&NetworkFeature::IpRules) && !c.network.contains(&NetworkFeature::DomainRules));
            // Plain runc without --isolation; a declared class says its kind (a task asking for
            // a VM is refused on the first and run on the second).
            assert_eq!((c.isolation.as_str(), c.devices.is_empty(), c.nested_containers), ("namespaces", true, false));
            let vm = paddock_core::requires::Requirements { isolation: Some("vm".into()), ..Default::default() };
            assert!(vm.unmet(&c).is_some());
            let kata = KubeRuntime::new(
                Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap(),
                KubeConfig { isolation: Some(Isolation::Kata), ..KubeConfig::default() },
            );
            assert_eq!(kata.capabilities().isolation, "kata");
            assert_eq!(vm.unmet(&kata.capabilities()), None);
            let id = SandboxId::parse("sbx-000000000001").unwrap();
            assert_eq!(k.pause(&id).await.unwrap_err().code(), "NOT_SUPPORTED");
            assert_eq!(k.resume(&id).await.unwrap_err().code(), "NOT_SUPPORTED");
        });
    }
}

#[cfg(test)]
mod image_tests {
    use super::*;

    #[test]
    fn local_root_filesystems_are_refused_in_the_runtimes_own_words() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let client = Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
            let k = KubeRuntime::new(client, KubeConfig::default());
            for local in ["host", "/srv/rootfs"] {
                let spec = SandboxSpec { image: Some(local.into()), ..Default::default() };
                let e = k.prepare(spec.validated().unwrap()).unwrap_err();
                assert_eq!(e.code(), "NOT_SUPPORTED");
                assert!(e.to_string().contains("container images"), "{e}");
            }
            let defaulted = k.prepare(ValidatedSpec::default()).unwrap();
            assert_eq!(defaulted.image.as_deref(), Some("paddock.local/sandbox:1"));
            let named = k
                .prepare(SandboxSpec { image: Some("python:3.11".into()), ..Default::default() }.validated().unwrap())
                .unwrap();
            assert_eq!(named.image.as_deref(), Some("python:3.11"));
        });
    }
}
