//! `paddock check`: a preflight a cluster admin runs before pointing Paddock at a namespace.
//!
//! Beyond asking the API what this identity may do (one SelfSubjectAccessReview per verb the
//! runtime uses), it proves that NetworkPolicies are enforced: a probe Pod connects to another
//! Pod, then a deny-all policy is applied to the prober and the same connection must fail. A
//! cluster whose CNI ignores NetworkPolicy would leave every "deny-all" sandbox open.

use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::KubeConfig;

/// One permission the runtime needs in its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub group: &'static str,
    pub resource: &'static str,
    pub subresource: &'static str,
    pub verb: &'static str,
    /// True for a cluster-scoped resource (checked without a namespace).
    pub cluster: bool,
}

const fn need(group: &'static str, resource: &'static str, subresource: &'static str, verb: &'static str) -> Need {
    Need { group, resource, subresource, verb, cluster: false }
}

/// Every verb the keeper model uses, as the Role that grants them lists them.
pub const NEEDED: &[Need] = &[
    need("", "pods", "", "create"),
    need("", "pods", "", "get"),
    need("", "pods", "", "list"),
    need("", "pods", "", "delete"),
    need("", "pods", "", "patch"),
    need("", "pods", "exec", "create"),
    need("", "pods", "exec", "get"),
    need("", "pods", "portforward", "create"),
    need("", "pods", "portforward", "get"),
    need("", "persistentvolumeclaims", "", "create"),
    need("", "persistentvolumeclaims", "", "get"),
    need("", "persistentvolumeclaims", "", "list"),
    need("", "persistentvolumeclaims", "", "delete"),
    need("networking.k8s.io", "networkpolicies", "", "create"),
    need("networking.k8s.io", "networkpolicies", "", "get"),
    need("networking.k8s.io", "networkpolicies", "", "delete"),
    need("", "events", "", "list"),
];

/// Needed too with `--model claim` (agent-sandbox's objects).
pub const CLAIM_NEEDED: &[Need] = &[
    need("extensions.agents.x-k8s.io", "sandboxtemplates", "", "create"),
    need("extensions.agents.x-k8s.io", "sandboxtemplates", "", "list"),
    need("extensions.agents.x-k8s.io", "sandboxtemplates", "", "patch"),
    need("extensions.agents.x-k8s.io", "sandboxtemplates", "", "delete"),
    need("extensions.agents.x-k8s.io", "sandboxwarmpools", "", "list"),
    need("extensions.agents.x-k8s.io", "sandboxwarmpools", "", "create"),
    need("extensions.agents.x-k8s.io", "sandboxwarmpools", "", "patch"),
    need("extensions.agents.x-k8s.io", "sandboxwarmpools", "", "delete"),
    need("extensions.agents.x-k8s.io", "sandboxclaims", "", "create"),
    need("extensions.agents.x-k8s.io", "sandboxclaims", "", "get"),
    need("extensions.agents.x-k8s.io", "sandboxclaims", "", "list"),
    need("extensions.agents.x-k8s.io", "sandboxclaims", "", "patch"),
    need("extensions.agents.x-k8s.io", "sandboxclaims", "", "delete"),
];

/// Needed only with a RuntimeClass.
pub const RUNTIME_CLASS_NEED: Need =
    Need { group: "node.k8s.io", resource: "runtimeclasses", subresource: "", verb: "get", cluster: true };

impl Need {
    /// `create pods/exec`.
    pub fn name(&self) -> String {
        let res = if self.subresource.is_empty() {
            self.resource.to_owned()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        };
        match self.group {
            "" => format!("{} {res}", self.verb),
            g => format!("{} {res}.{g}", self.verb),
        }
    }

    /// The Role (or ClusterRole) rule that grants it.
    pub fn rule(&self) -> String {
        let res = if self.subresource.is_empty() {
            self.resource.to_owned()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        };
        let kind = if self.cluster { "ClusterRole" } else { "Role" };
        format!("{kind} rule {{apiGroups: [\"{}\"], resources: [\"{res}\"], verbs: [\"{}\"]}}", self.group, self.verb)
    }
}

pub use paddock_core::preflight::{CheckStatus, Item, Report};

/// Runs every check; `probe` also proves NetworkPolicy enforcement with short-lived Pods.
pub async fn run(client: &Client, config: &KubeConfig, probe: bool) -> Report {
    let ns = config.namespace.clone();
    let mut report = Report { namespace: ns.clone(), ..Default::default() };
    match client.apiserver_version().await {
        Ok(v) => report.push("api", CheckStatus::Pass, format!("Kubernetes {}.{} answers", v.major, v.minor)),
        Err(e) => {
            report.push(
                "api",
                CheckStatus::Fail,
                format!("the Kubernetes API does not answer: {e}; check KUBECONFIG or the in-cluster service account"),
            );
            report.network_policy = "skipped".into();
            return report;
        }
    }
    match Api::<Namespace>::all(client.clone()).get_opt(&ns).await {
        Ok(Some(_)) => report.push("namespace", CheckStatus::Pass, format!("namespace {ns} exists")),
        Ok(None) => report.push(
            "namespace",
            CheckStatus::Fail,
            format!("namespace {ns} does not exist: create it (kubectl create namespace {ns}) or pass --namespace"),
        ),
        Err(e) => report.push(
            "namespace",
            CheckStatus::Warn,
            format!("cannot tell whether namespace {ns} exists ({e}); the checks below still apply to it"),
        ),
    }
    let mut needs: Vec<Need> = NEEDED.to_vec();
    if config.model == crate::SandboxModel::Claim {
        needs.extend_from_slice(CLAIM_NEEDED);
    }
    if config.runtime_class.is_some() {
        needs.push(RUNTIME_CLASS_NEED);
    }
    for need in &needs {
        match allowed(client, &ns, need).await {
            Ok(true) => report.push(&need.name(), CheckStatus::Pass, "allowed"),
            Ok(false) => {
                report.missing.push(need.name());
                report.push(&need.name(), CheckStatus::Fail, format!("not allowed: grant it with a {}", need.rule()));
            }
            Err(e) => report.push(
                &need.name(),
                CheckStatus::Fail,
                format!("could not ask ({e}): the identity needs `create selfsubjectaccessreviews`"),
            ),
        }
    }
    if let Some(class) = &config.runtime_class {
        match crate::runtime_class::check_exists(client, class).await {
            Ok(handler) => report.push(
                "runtimeclass",
                CheckStatus::Pass,
                format!("RuntimeClass {class} exists (handler {handler})"),
            ),
            Err(e) => report.push("runtimeclass", CheckStatus::Fail, e.to_string()),
        }
        if probe && report.missing.is_empty() {
            let (status, detail) = probe_runtime_class(client, config, class).await;
            report.push("runtimeclass-kernel", status, detail);
        }
    }
    if !probe {
        report.network_policy = "skipped".into();
        report.push(
            "networkpolicy",
            CheckStatus::Warn,
            "enforcement not probed (--no-probe): a CNI that ignores NetworkPolicy leaves sandboxes open",
        );
    } else if !report.missing.is_empty() {
        report.network_policy = "skipped".into();
        report.push("networkpolicy", CheckStatus::Warn, "enforcement not probed: grant the missing verbs first");
    } else {
        let verdict = probe_enforcement(client, config).await;
        report.network_policy = verdict.0.to_owned();
        report.push("networkpolicy", verdict.1, verdict.2);
    }
    if !config.host_users_false {
        report.push(
            "user-namespaces",
            CheckStatus::Warn,
            "off: sandbox Pods share the node's user ids (uid 1000 inside is uid 1000 on the node); where the nodes support it (Kubernetes >= 1.33 with containerd >= 2.0 or CRI-O >= 1.25, and idmap-capable volumes), --user-namespaces gives each Pod its own",
        );
    } else if probe && report.missing.is_empty() {
        let (status, detail) = probe_user_namespaces(client, config).await;
        report.push("user-namespaces", status, detail);
    } else {
        report.push(
            "user-namespaces",
            CheckStatus::Warn,
            "--user-namespaces is on but not probed: grant the missing verbs, or drop --no-probe",
        );
    }
    report
}

/// Whether a Pod with `hostUsers: false` starts on this cluster and really runs in a user
/// namespace of its own: some runtimes refuse such Pods, and one that ignored the field would
/// leave sandboxes sharing the node's ids while the operator believes otherwise.
async fn probe_user_namespaces(client: &Client, config: &KubeConfig) -> (CheckStatus, String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &config.namespace);
    let name = format!("paddock-probe-userns-{}", probe_tag());
    let outcome =
        read_in_probe_pod(&pods, config, &name, "userns", Duration::from_secs(45), "/proc/self/uid_map", |spec| {
            spec.host_users = Some(false);
        })
        .await
        .map(|map| map.split_whitespace().collect::<Vec<_>>().join(" "));
    match outcome {
        // The initial namespace maps every id to itself.
        Ok(map) if map == "0 0 4294967295" => (
            CheckStatus::Fail,
            "a Pod with hostUsers: false runs in the node's own user namespace: the container runtime ignores the field; run without --user-namespaces or upgrade the runtime".into(),
        ),
        Ok(map) => (CheckStatus::Pass, format!("Pods run in a user namespace of their own (uid_map {map})")),
        Err(why) => (
            CheckStatus::Fail,
            format!("a Pod with hostUsers: false cannot run here ({why}); run without --user-namespaces, or use nodes whose runtime supports user namespaces (containerd >= 2.0, CRI-O >= 1.25)"),
        ),
    }
}

/// Whether Pods under RuntimeClass `class` start, and run on a kernel of their own: a probe
/// Pod under the class and one without it read `/proc/version`, which gVisor's kernel and a
/// Kata or Firecracker VM's answer differently from the node's. A class whose Pods cannot start
/// is named with why (a VM class without `/dev/kvm` on the node fails here), and one whose
/// handler runs Pods on the node's kernel after all fails too.
async fn probe_runtime_class(client: &Client, config: &KubeConfig, class: &str) -> (CheckStatus, String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &config.namespace);
    let tag = probe_tag();
    let (inside, outside) = (format!("paddock-probe-class-{tag}"), format!("paddock-probe-node-{tag}"));
    let limit = Duration::from_secs(90);
    let (under_class, on_node) = tokio::join!(
        read_in_probe_pod(&pods, config, &inside, "runtimeclass", limit, "/proc/version", |spec| {
            spec.runtime_class_name = Some(class.to_owned());
        }),
        read_in_probe_pod(&pods, config, &outside, "runtimeclass", limit, "/proc/version", |_| {}),
    );
    class_verdict(class, config.isolation, under_class, on_node)
}

/// A short random suffix that keeps one check's probe Pods apart from another's.
fn probe_tag() -> String {
    crate::random::<4>().map(|b| b.iter().map(|x| format!("{x:02x}")).collect()).unwrap_or_else(|_| "0000".into())
}

/// Starts probe Pod `name` (its spec adjusted by `tweak`), waits until it runs or says why it
/// cannot, reads `path` in it, and deletes it whatever happened.
async fn read_in_probe_pod(
    pods: &Api<Pod>,
    config: &KubeConfig,
    name: &str,
    role: &str,
    limit: Duration,
    path: &str,
    tweak: impl FnOnce(&mut k8s_openapi::api::core::v1::PodSpec),
) -> Result<String, String> {
    let outcome = async {
        let mut pod = probe_pod(
            &config.namespace,
            name,
            role,
            config,
            &["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
        )
        .map_err(|e| e.to_string())?;
        if let Some(spec) = pod.spec.as_mut() {
            tweak(spec);
        }
        pods.create(&PostParams::default(), &pod).await.map_err(|e| format!("the API refused the Pod: {e}"))?;
        wait_running_or_stuck(pods, name, limit).await?;
        let (code, out, err) = exec_in(pods, name, vec!["cat".into(), path.into()]).await?;
        if code != 0 {
            return Err(format!("reading {path} failed: {}", String::from_utf8_lossy(&err).trim()));
        }
        Ok(String::from_utf8_lossy(&out).trim().to_owned())
    }
    .await;
    let _ = pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
    outcome
}

/// The verdict of [`probe_runtime_class`] from the kernels the two Pods saw.
fn class_verdict(
    class: &str,
    isolation: Option<crate::Isolation>,
    under_class: Result<String, String>,
    on_node: Result<String, String>,
) -> (CheckStatus, String) {
    let declared = isolation.map_or("its isolation", crate::Isolation::name);
    let under_class = match under_class {
        Ok(k) => k,
        Err(why) => {
            let kvm = if isolation.is_some_and(crate::Isolation::needs_kvm) {
                format!(
                    "; {declared} runs each Pod in a virtual machine and needs /dev/kvm on the node (on a cloud VM, nested virtualization): check `ls -l /dev/kvm` on the nodes the class schedules to"
                )
            } else {
                String::new()
            };
            return (CheckStatus::Fail, format!("a Pod under RuntimeClass {class} cannot run here ({why}){kvm}"));
        }
    };
    match on_node {
        Ok(node) if node == under_class => (
            CheckStatus::Fail,
            format!(
                "Pods under RuntimeClass {class} run on the node's own kernel ({node}), not behind {declared}: its handler is not what --isolation declares; fix the class's handler, or declare no isolation for it"
            ),
        ),
        Ok(node) => (
            CheckStatus::Pass,
            format!(
                "Pods under RuntimeClass {class} run on a kernel of their own ({under_class}), not the node's ({node})"
            ),
        ),
        Err(why) => (
            CheckStatus::Warn,
            format!(
                "a Pod under RuntimeClass {class} runs ({under_class}), but the node's kernel could not be read to compare ({why})"
            ),
        ),
    }
}

/// Waits until a probe Pod runs, or says why it cannot: its container's waiting reason, or
/// the latest warning event about it.
async fn wait_running_or_stuck(pods: &Api<Pod>, name: &str, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let pod = pods.get(name).await.map_err(|e| format!("reading probe Pod {name}: {e}"))?;
        let status = pod.status.unwrap_or_default();
        let waiting = status
            .container_statuses
            .iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
            .find(|w| w.reason.as_deref().is_some_and(|r| r != "ContainerCreating"))
            .map(|w| {
                format!("{}: {}", w.reason.as_deref().unwrap_or_default(), w.message.as_deref().unwrap_or_default())
            });
        match status.phase.as_deref() {
            Some("Running") => return Ok(()),
            Some("Failed" | "Succeeded") => {
                return Err(format!("the Pod ended: {}", status.message.or(status.reason).unwrap_or_default()));
            }
            _ if waiting.is_some() => return Err(waiting.unwrap_or_default()),
            _ if Instant::now() > deadline => {
                let events: Api<k8s_openapi::api::core::v1::Event> =
                    Api::namespaced(pods.clone().into_client(), pod.metadata.namespace.as_deref().unwrap_or_default());
                let lp = kube::api::ListParams::default().fields(&format!("involvedObject.name={name}"));
                let last = events
                    .list(&lp)
                    .await
                    .ok()
                    .and_then(|l| l.items.into_iter().rfind(|e| e.type_.as_deref() == Some("Warning")))
                    .and_then(|e| e.message);
                return Err(format!(
                    "not running after {} s{}",
                    limit.as_secs(),
                    last.map(|m| format!("; last warning: {}", m.trim())).unwrap_or_default()
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

async fn allowed(client: &Client, ns: &str, need: &Need) -> Result<bool, kube::Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(need.group.to_owned()),
                resource: Some(need.resource.to_owned()),
                subresource: (!need.subresource.is_empty()).then(|| need.subresource.to_owned()),
                verb: Some(need.verb.to_owned()),
                namespace: (!need.cluster).then(|| ns.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

const PROBE_LABEL: &str = "paddock.dev/probe";

/// A hardened probe Pod running `command` in the sandbox image.
fn probe_pod(
    ns: &str,
    name: &str,
    role: &str,
    config: &KubeConfig,
    command: &[&str],
) -> Result<Pod, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {PROBE_LABEL: role, "app.kubernetes.io/managed-by": "paddock"}},
        "spec": {
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": crate::objects::CONTAINER,
                "image": config.default_image,
                "imagePullPolicy": config.image_pull_policy,
                "command": command,
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
                "resources": {"limits": {"cpu": "100m", "memory": "32Mi"}},
            }],
        },
    }))
}

/// (verdict, status, detail).
async fn probe_enforcement(client: &Client, config: &KubeConfig) -> (&'static str, CheckStatus, String) {
    let ns = config.namespace.as_str();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let tag = probe_tag();
    let (server, prober, policy) = (
        format!("paddock-probe-server-{tag}"),
        format!("paddock-probe-client-{tag}"),
        format!("paddock-probe-deny-{tag}"),
    );
    let outcome = probe_steps(&pods, &policies, config, &server, &prober, &policy).await;
    // Whatever happened, nothing of the probe stays behind.
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    let _ = policies.delete(&policy, &DeleteParams::default()).await;
    let _ = pods.delete(&server, &now).await;
    let _ = pods.delete(&prober, &now).await;
    match outcome {
        Ok(true) => ("enforced", CheckStatus::Pass, "a deny-all NetworkPolicy stopped a connection that worked without it".into()),
        Ok(false) => (
            "not enforced",
            CheckStatus::Fail,
            "a deny-all NetworkPolicy did NOT stop a connection: this cluster's CNI does not enforce NetworkPolicy, so sandboxes would not be isolated on the network; install one that does (Calico, Cilium, kube-router)".into(),
        ),
        Err(why) => ("inconclusive", CheckStatus::Fail, format!("the enforcement probe could not run: {why}")),
    }
}

/// Ok(true): enforced; Ok(false): not enforced; Err: could not tell.
async fn probe_steps(
    pods: &Api<Pod>,
    policies: &Api<NetworkPolicy>,
    config: &KubeConfig,
    server: &str,
    prober: &str,
    policy: &str,
) -> Result<bool, String> {
    let ns = config.namespace.as_str();
    let serve = ["httpd", "-f", "-p", "8080", "-h", "/etc"];
    let idle = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"];
    for (name, role, command) in [(server, "server", &serve[..]), (prober, "client", &idle[..])] {
        let pod = probe_pod(ns, name, role, config, command).map_err(|e| e.to_string())?;
        pods.create(&PostParams::default(), &pod).await.map_err(|e| format!("creating probe Pod {name}: {e}"))?;
    }
    let ip = wait_running(pods, server, ns, &config.default_image).await?;
    wait_running(pods, prober, ns, &config.default_image).await?;
    let url = format!("http://{ip}:8080/hostname");
    // `timeout`, not wget's own -T: busybox 1.35's static wget crashes with -T.
    let fetch = |timeout: &str| ["timeout", timeout, "wget", "-q", "-O", "-", url.as_str()].map(str::to_owned).to_vec();
    // Without a policy the connection must work, or the probe proves nothing.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, _, err) = exec_in(pods, prober, fetch("3")).await?;
        if code == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the probe Pods cannot reach each other even without a policy ({})",
                String::from_utf8_lossy(&err).trim()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let deny: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": policy, "namespace": ns},
        "spec": {"podSelector": {"matchLabels": {PROBE_LABEL: "client"}}, "policyTypes": ["Egress"]},
    }))
    .map_err(|e| e.to_string())?;
    policies.create(&PostParams::default(), &deny).await.map_err(|e| format!("creating the probe's policy: {e}"))?;
    // Policies apply asynchronously: give the CNI a moment, then require the connection to fail.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, _, _) = exec_in(pods, prober, fetch("2")).await?;
        if code != 0 {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn exec_in(pods: &Api<Pod>, pod: &str, argv: Vec<String>) -> Result<(i32, Vec<u8>, Vec<u8>), String> {
    let running = crate::exec::start_pods_exec(pods, pod, argv, false).await.map_err(|e| e.to_string())?;
    crate::exec::collect(running, None).await.map_err(|e| e.to_string())
}

/// Waits until a probe Pod runs; returns its IP.
async fn wait_running(pods: &Api<Pod>, name: &str, ns: &str, image: &str) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let pod = pods.get(name).await.map_err(|e| format!("reading probe Pod {name}: {e}"))?;
        let status = pod.status.unwrap_or_default();
        if status.phase.as_deref() == Some("Running")
            && let Some(ip) = status.pod_ip
        {
            return Ok(ip);
        }
        if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) {
            return Err(format!("probe Pod {name} ended ({:?})", status.phase));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "probe Pod {name} did not run within 90s: see `kubectl -n {ns} describe pod {name}` (is the sandbox image {image:?} on the nodes, can the Pod be scheduled?)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

impl crate::KubeRuntime {
    /// Runs `paddock check` with this runtime's identity and configuration.
    pub(crate) async fn preflight_report(&self, probe: bool) -> Report {
        run(&self.pods.clone().into_client(), &self.config, probe).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_name_the_verb_and_the_rule_that_grants_it() {
        let exec = NEEDED.iter().find(|n| n.subresource == "exec" && n.verb == "create").unwrap();
        assert_eq!(exec.name(), "create pods/exec");
        assert_eq!(exec.rule(), r#"Role rule {apiGroups: [""], resources: ["pods/exec"], verbs: ["create"]}"#);
        let np = NEEDED.iter().find(|n| n.resource == "networkpolicies" && n.verb == "delete").unwrap();
        assert_eq!(np.name(), "delete networkpolicies.networking.k8s.io");
        assert!(RUNTIME_CLASS_NEED.rule().starts_with("ClusterRole rule"));
    }

    #[test]
    fn no_secrets_are_needed() {
        assert!(NEEDED.iter().all(|n| n.resource != "secrets"), "the runtime never reads Secrets");
    }

    #[test]
    fn a_report_fails_on_any_failed_item_only() {
        let mut r = Report::default();
        r.push("a", CheckStatus::Pass, "");
        r.push("b", CheckStatus::Warn, "");
        assert!(r.ok());
        r.push("c", CheckStatus::Fail, "");
        assert!(!r.ok());
    }

    #[test]
    fn a_runtime_class_passes_only_on_a_kernel_of_its_own_and_a_vm_class_that_cannot_start_names_kvm() {
        let linux = || Ok::<_, String>("Linux version 6.18.0 (debian)".to_owned());
        let (s, d) =
            class_verdict("kata", Some(crate::Isolation::Kata), Ok("Linux version 6.12.1 (kata)".into()), linux());
        assert_eq!(s, CheckStatus::Pass, "{d}");
        let (s, d) = class_verdict(
            "gvisor",
            Some(crate::Isolation::Gvisor),
            Ok("Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016".into()),
            linux(),
        );
        assert_eq!(s, CheckStatus::Pass, "{d}");
        // A handler that is runc after all: the node's kernel.
        let (s, d) = class_verdict("kata", Some(crate::Isolation::Kata), linux(), linux());
        assert_eq!(s, CheckStatus::Fail);
        assert!(d.contains("node's own kernel") && d.contains("Kata"), "{d}");
        // A VM class whose Pods cannot start: /dev/kvm is named; gVisor's failure is not about it.
        let stuck = || Err::<String, _>("RunContainerError: failed to create shim task".to_owned());
        let (s, d) = class_verdict("fc", Some(crate::Isolation::Firecracker), stuck(), linux());
        assert_eq!(s, CheckStatus::Fail);
        assert!(d.contains("/dev/kvm") && d.contains("failed to create shim task"), "{d}");
        let (_, d) = class_verdict("gvisor", Some(crate::Isolation::Gvisor), stuck(), linux());
        assert!(!d.contains("/dev/kvm"), "{d}");
        // The node's side unreadable: not a pass, not a failure of the class.
        let (s, _) = class_verdict("kata", Some(crate::Isolation::Kata), Ok("x".into()), Err("y".into()));
        assert_eq!(s, CheckStatus::Warn);
    }

    #[test]
    fn probe_pods_are_hardened() {
        let pod = probe_pod("ns", "p", "client", &KubeConfig::default(), &["true"]).unwrap();
        let v = serde_json::to_value(&pod).unwrap();
        assert_eq!(v["spec"]["automountServiceAccountToken"], false);
        assert_eq!(v["spec"]["securityContext"]["runAsNonRoot"], true);
        assert_eq!(v["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"][0], "ALL");
    }
}
