//! The Kubernetes objects of a sandbox, built as pure values, and the way back from a Pod to a
//! `SandboxInfo`. Labels and annotations are the only record of a sandbox: any server reading
//! the namespace sees the same sandboxes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use paddock_core::naming::{NamingMode, ThreadId, resource_name, sanitize_hashed};
use paddock_core::runtime::{SandboxId, SandboxInfo, SandboxState, WorkspaceInfo};
use paddock_core::spec::SandboxSpec;
use serde_json::{Value, json};

pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const SANDBOX_LABEL: &str = "paddock.dev/sandbox";
/// The run tier of the attempt a Pod holds (`SandboxSpec::tier`).
pub const TIER_LABEL: &str = "paddock.dev/tier";
/// The name of a named volume on its PVC. Such PVCs are managed by `paddock-volume`, not
/// `paddock`, so the workspace reaper never touches them: they live until deleted.
pub const VOLUME_LABEL: &str = "paddock.dev/volume";
pub const VOLUME_MANAGER: &str = "paddock-volume";
pub const THREAD_HASH_LABEL: &str = "paddock.dev/thread-hash";
pub const DAWN_THREAD_LABEL: &str = "dawn.sh/thread";
pub const SPEC_ANNOTATION: &str = "paddock.dev/spec";
pub const CREATED_ANNOTATION: &str = "paddock.dev/created-at";
pub const EXPIRES_ANNOTATION: &str = "paddock.dev/expires-at";
pub const THREAD_ANNOTATION: &str = "paddock.dev/thread";
pub const NETPOL_ANNOTATION: &str = "paddock.dev/network-policy";
pub const WORKSPACE_ANNOTATION: &str = "paddock.dev/workspace";
/// The keeper Pod's only container; every exec targets it.
pub const CONTAINER: &str = "sandbox";

/// Sleeps in short slices so TERM is answered at once instead of after the kubelet's grace
/// period; needs nothing beyond a POSIX `sh` and `sleep`.
pub const KEEPER_COMMAND: [&str; 3] = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"];

/// Names of one sandbox's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub pod: String,
    pub network_policy: String,
    /// The workspace PVC, when the sandbox has a persistent workspace.
    pub pvc: Option<String>,
}

/// The deterministic names of a thread's keeper Pod, PVC and NetworkPolicy; Dawn's exact
/// names in `DawnCompat` mode so its volumes are adopted.
pub fn thread_names(thread: &ThreadId, mode: NamingMode) -> Names {
    let s = resource_name(thread, mode);
    match mode {
        NamingMode::Hashed => Names {
            pod: format!("paddock-{s}"),
            network_policy: format!("paddock-net-{s}"),
            pvc: Some(format!("paddock-vol-{s}")),
        },
        NamingMode::DawnCompat => Names {
            pod: format!("dawn-sbx-{s}"),
            network_policy: format!("dawn-sbx-net-{s}"),
            pvc: Some(format!("dawn-sbx-vol-{s}")),
        },
    }
}

/// Names of a sandbox made by `create`: the Pod is named after the random id, a workspace (if
/// any) keeps its thread's PVC name.
pub fn sandbox_names(id: &SandboxId, spec: &SandboxSpec) -> Names {
    Names {
        pod: format!("paddock-{id}"),
        network_policy: format!("paddock-net-{id}"),
        pvc: spec.workspace.as_ref().and_then(|w| thread_names(&w.thread, w.naming).pvc),
    }
}

/// Settings of the cluster side that shape every object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub namespace: String,
    pub image: String,
    pub image_pull_policy: String,
    pub runtime_class: Option<String>,
    pub host_users_false: bool,
    pub cpu_request_millicpus: Option<u32>,
    /// An operator-trusted image whose root init container hands a fresh workspace volume to
    /// the sandbox user, for provisioners that ignore `fsGroup` (hostPath).
    pub chown_image: Option<String>,
    /// The PriorityClass of a sandbox that holds an attempt of each run tier
    /// (`SandboxSpec::tier`); a tier not here gets the cluster's default priority.
    pub priority_classes: BTreeMap<String, String>,
}

/// Labels shared by a thread's Pod, PVC and NetworkPolicy.
pub fn thread_labels(thread: &ThreadId, mode: NamingMode) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(THREAD_HASH_LABEL.to_owned(), sanitize_hashed(thread.as_str()))]);
    match mode {
        NamingMode::Hashed => {
            labels.insert(MANAGED_BY.into(), "paddock".into());
        }
        NamingMode::DawnCompat => {
            labels.insert(MANAGED_BY.into(), "dawn".into());
            labels.insert(DAWN_THREAD_LABEL.into(), resource_name(thread, mode));
        }
    }
    labels
}

pub fn pod_labels(id: &SandboxId, spec: &SandboxSpec) -> BTreeMap<String, String> {
    let mut labels = match &spec.workspace {
        Some(w) => thread_labels(&w.thread, w.naming),
        None => BTreeMap::from([(MANAGED_BY.to_owned(), "paddock".to_owned())]),
    };
    labels.insert(SANDBOX_LABEL.into(), id.to_string());
    // A tier name is a valid label value (the server checks it: lowercase, digits, `-`).
    if let Some(tier) = &spec.tier {
        labels.insert(TIER_LABEL.into(), tier.clone());
    }
    labels
}

/// The Pod selector of a sandbox's NetworkPolicy. A thread's policy selects by thread, so it
/// keeps covering the Pod when a later acquire replaces it under a new sandbox id.
fn policy_selector(id: &SandboxId, spec: &SandboxSpec) -> BTreeMap<String, String> {
    match &spec.workspace {
        Some(w) => {
            let (k, v) = match w.naming {
                NamingMode::Hashed => (THREAD_HASH_LABEL, sanitize_hashed(w.thread.as_str())),
                NamingMode::DawnCompat => (DAWN_THREAD_LABEL, resource_name(&w.thread, w.naming)),
            };
            BTreeMap::from([(k.to_owned(), v)])
        }
        None => BTreeMap::from([(SANDBOX_LABEL.to_owned(), id.to_string())]),
    }
}

/// The keeper Pod: one non-root container that only sleeps; commands arrive over pods/exec.
pub fn pod(
    shape: &Shape,
    id: &SandboxId,
    names: &Names,
    spec: &SandboxSpec,
    created_unix_ms: u64,
    expires_unix_ms: Option<u64>,
) -> Result<Pod, serde_json::Error> {
    let pod_spec = pod_spec(shape, spec, names.pvc.as_deref(), true);
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.pod,
            "namespace": shape.namespace,
            "labels": pod_labels(id, spec),
            "annotations": sandbox_annotations(names, spec, created_unix_ms, expires_unix_ms)?,
        },
        "spec": pod_spec,
    }))
}

/// The annotations that carry a sandbox's state on its Pod.
pub fn sandbox_annotations(
    names: &Names,
    spec: &SandboxSpec,
    created_unix_ms: u64,
    expires_unix_ms: Option<u64>,
) -> Result<BTreeMap<String, String>, serde_json::Error> {
    let mut annotations = BTreeMap::from([
        (SPEC_ANNOTATION.to_owned(), serde_json::to_string(spec)?),
        (CREATED_ANNOTATION.to_owned(), created_unix_ms.to_string()),
    ]);
    // A claimed Pod's policy belongs to its template, not to Paddock: it has no name here.
    if !names.network_policy.is_empty() {
        annotations.insert(NETPOL_ANNOTATION.into(), names.network_policy.clone());
    }
    if let Some(e) = expires_unix_ms {
        annotations.insert(EXPIRES_ANNOTATION.into(), e.to_string());
    }
    if let Some(w) = &spec.workspace {
        annotations.insert(THREAD_ANNOTATION.into(), w.thread.to_string());
    }
    if let Some(pvc) = &names.pvc {
        annotations.insert(WORKSPACE_ANNOTATION.into(), pvc.clone());
    }
    Ok(annotations)
}

/// What a sandbox's container logs may take of its node's disk, bytes.
pub const LOG_BYTES: u64 = 64 << 20;
/// The size of a sandbox's in-memory `/run`, bytes.
pub const RUN_BYTES: u64 = 16 << 20;

/// The hardened Pod spec of a sandbox: `pvc` is its workspace claim (else an emptyDir);
/// `with_env` bakes the spec's environment in (a warm-pool template cannot: commands get it
/// at exec time instead, as they do anyway). No `PATH` or `HOME` of Paddock's is set: the
/// keeper keeps the image's, which commands then get (see `image_env` in the runtime).
pub fn pod_spec(shape: &Shape, spec: &SandboxSpec, pvc: Option<&str>, with_env: bool) -> Value {
    let r = &spec.resources;
    let env: Vec<Value> =
        if with_env { spec.env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect() } else { Vec::new() };
    let cpu_request = shape.cpu_request_millicpus.map_or(r.millicpus, |c| c.min(r.millicpus));
    let workspace_volume = match pvc {
        Some(claim) => json!({"name": "workspace", "persistentVolumeClaim": {"claimName": claim}}),
        None => match r.workspace_bytes {
            Some(b) => json!({"name": "workspace", "emptyDir": {"sizeLimit": b.to_string()}}),
            None => json!({"name": "workspace", "emptyDir": {}}),
        },
    };
    // Ephemeral storage: what its node-backed emptyDirs (/tmp, a scratch /workspace) may hold
    // plus its logs, requested as much as limited (the node's disk is not over-committed, and
    // the Pod's QoS, which only CPU and memory decide, is unchanged); with an uncapped scratch
    // workspace there is no bound to give.
    let ephemeral = match (pvc, r.workspace_bytes) {
        (Some(_), _) => Some(0),
        (None, Some(b)) => Some(b),
        (None, None) => None,
    }
    .map(|scratch| r.tmp_bytes.saturating_add(scratch).saturating_add(LOG_BYTES).to_string());
    let mut requests = json!({"cpu": format!("{cpu_request}m"), "memory": r.memory_bytes.to_string()});
    let mut limits = json!({"cpu": format!("{}m", r.millicpus), "memory": r.memory_bytes.to_string()});
    if let Some(e) = ephemeral {
        requests["ephemeral-storage"] = json!(e);
        limits["ephemeral-storage"] = json!(e);
    }
    let mut pod_spec = json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsUser": spec.user.uid,
            "runAsGroup": spec.user.gid,
            "fsGroup": spec.user.gid,
            // The kubelet chowns a fresh PVC once instead of on every mount.
            "fsGroupChangePolicy": "OnRootMismatch",
            "runAsNonRoot": true,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": CONTAINER,
            "image": shape.image,
            "imagePullPolicy": shape.image_pull_policy,
            "command": KEEPER_COMMAND,
            // No workingDir: the image's `WorkingDir` is where commands that name no
            // directory start (`/workspace` when it is `/`), as on the local runtime.
            "env": env,
            "resources": {"requests": requests, "limits": limits},
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": true,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "run", "mountPath": "/run"},
                {"name": "workspace", "mountPath": "/workspace"},
            ],
        }],
        "volumes": [
            {"name": "tmp", "emptyDir": {"sizeLimit": r.tmp_bytes.to_string()}},
            workspace_volume,
            // A writable /run (pid files, sockets) in memory, as Dawn's and Hephaestus's Pods
            // have; it counts against the container's memory.
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": RUN_BYTES.to_string()}},
        ],
    });
    // One Pod volume per claim (a claim listed twice in a Pod, once read-only, never becomes
    // ready), read-only only when every mount of it is; each mount keeps its own flag.
    let claims = named_claims(spec);
    for (i, (claim, read_only)) in claims.iter().enumerate() {
        pod_spec["volumes"].as_array_mut().expect("volumes is a list").push(
            json!({"name": format!("vol-{i}"), "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}),
        );
    }
    for v in &spec.volumes {
        // Host paths never reach a Pod (refused earlier): only named volumes, as PVCs.
        if let paddock_core::volume::VolumeSource::Named { name, .. } = &v.source {
            let i = claims.iter().position(|(c, _)| c == name).expect("every claim is listed");
            let mut mount = json!({"name": format!("vol-{i}"), "mountPath": v.mount_path, "readOnly": v.read_only});
            if let Some(sub) = &v.sub_path {
                mount["subPath"] = json!(sub.trim_end_matches('/'));
            }
            pod_spec["containers"][0]["volumeMounts"].as_array_mut().expect("volumeMounts is a list").push(mount);
        }
    }
    // Writable named volumes, as the init container sees them (whole, at /volumes/<i>), with
    // the directories of their subPaths: on storage that ignores fsGroup they are root's.
    let mut volume_dirs: Vec<String> = Vec::new();
    let mut volume_mounts: Vec<Value> = Vec::new();
    for v in &spec.volumes {
        let paddock_core::volume::VolumeSource::Named { name, .. } = &v.source else { continue };
        if v.read_only {
            continue;
        }
        let i = claims.iter().position(|(c, _)| c == name).expect("every claim is listed");
        let at = format!("/volumes/{i}");
        if !volume_dirs.contains(&at) {
            volume_mounts.push(json!({"name": format!("vol-{i}"), "mountPath": at}));
            volume_dirs.push(at.clone());
        }
        let mut dir = at;
        for part in v.sub_path.iter().flat_map(|s| s.split('/')).filter(|p| !p.is_empty()) {
            dir = format!("{dir}/{part}");
            volume_dirs.push(dir.clone());
        }
    }
    if let Some(image) = &shape.chown_image
        && (pvc.is_some() || !volume_dirs.is_empty())
    {
        let owner = format!("{}:{}", spec.user.uid, spec.user.gid);
        // The workspace is the sandbox user's whoever had it; a volume's directory is made if
        // missing and taken only from root (one a sandbox made is left as it is).
        let mut script = String::from("o=$1; shift\n");
        let mut mounts = Vec::new();
        if pvc.is_some() {
            script.push_str(r#"[ "$(stat -c %u:%g /workspace)" = "$o" ] || chown "$o" /workspace || exit 1"#);
            script.push('\n');
            mounts.push(json!({"name": "workspace", "mountPath": "/workspace"}));
        }
        script.push_str(
            r#"for d in "$@"; do if [ -L "$d" ]; then echo "$d is a symbolic link" >&2; exit 1; fi; [ -d "$d" ] || mkdir "$d" || exit 1; [ "$(stat -c %u:%g "$d")" != 0:0 ] || chown -h "$o" "$d" || exit 1; done"#,
        );
        mounts.extend(volume_mounts);
        let mut command = vec![json!("sh"), json!("-c"), json!(script), json!("chown"), json!(owner)];
        command.extend(volume_dirs.into_iter().map(Value::from));
        pod_spec["initContainers"] = json!([{
            "name": "workspace-owner",
            "image": image,
            "imagePullPolicy": shape.image_pull_policy,
            "command": command,
            // What the sandbox container asks for: it adds nothing to scheduling, and the Pod
            // keeps the sandbox container's QoS class. A Guaranteed Pod's keeper has an OOM
            // score (-997) far below its commands' (1000): see `exec::WRAPPER`.
            "resources": pod_spec["containers"][0]["resources"].clone(),
            // Root only for these chowns: no other capability, no escalation.
            "securityContext": {
                "runAsUser": 0,
                "runAsGroup": 0,
                "runAsNonRoot": false,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
            },
            "volumeMounts": mounts,
        }]);
    }
    if shape.host_users_false {
        pod_spec["hostUsers"] = json!(false);
    }
    if let Some(rc) = &shape.runtime_class {
        pod_spec["runtimeClassName"] = json!(rc);
    }
    // The kubelet evicts a lower priority first under node pressure, and the scheduler
    // preempts it to place a higher one: batch attempts go before a turn someone waits for,
    // and come back as lost attempts that run again.
    if let Some(class) = spec.tier.as_ref().and_then(|t| shape.priority_classes.get(t)) {
        pod_spec["priorityClassName"] = json!(class);
    }
    pod_spec
}

/// A thread's workspace: one RWO claim, created once and kept across sandboxes.
pub fn pvc(
    namespace: &str,
    name: &str,
    thread: &ThreadId,
    mode: NamingMode,
    bytes: u64,
    storage_class: Option<&str>,
) -> Result<PersistentVolumeClaim, serde_json::Error> {
    let metadata = json!({
        "name": name,
        "namespace": namespace,
        "labels": thread_labels(thread, mode),
        "annotations": {THREAD_ANNOTATION: thread.as_str()},
    });
    rwo_claim(metadata, bytes, storage_class)
}

/// A ReadWriteOnce claim of `bytes`.
fn rwo_claim(
    metadata: Value,
    bytes: u64,
    storage_class: Option<&str>,
) -> Result<PersistentVolumeClaim, serde_json::Error> {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": bytes.to_string()}},
    });
    if let Some(sc) = storage_class {
        spec["storageClassName"] = json!(sc);
    }
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}),
    )
}

/// The claims of `spec`'s named volumes, each once, in order, with whether every mount of it
/// is read-only.
fn named_claims(spec: &SandboxSpec) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    for v in &spec.volumes {
        if let paddock_core::volume::VolumeSource::Named { name, .. } = &v.source {
            match out.iter_mut().find(|(c, _)| c == name) {
                Some((_, ro)) => *ro &= v.read_only,
                None => out.push((name.clone(), v.read_only)),
            }
        }
    }
    out
}

/// A named volume (OpenSandbox's `pvc` with `createIfNotExists`): one claim, kept until it is
/// deleted through Paddock.
pub fn named_volume_pvc(
    namespace: &str,
    name: &str,
    bytes: u64,
    storage_class: Option<&str>,
) -> Result<PersistentVolumeClaim, serde_json::Error> {
    let metadata =
        json!({"name": name, "namespace": namespace, "labels": {MANAGED_BY: VOLUME_MANAGER, VOLUME_LABEL: name}});
    rwo_claim(metadata, bytes, storage_class)
}

/// Ranges a NetworkPolicy never opens, whatever a sandbox's policy: the cluster's own (Pod,
/// Service and node networks live in private ranges), link-local (the node's metadata
/// service), loopback. A rule that would allow any of them is refused.
const INTERNAL_V4: [&str; 8] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "198.18.0.0/15",
];
const INTERNAL_V6: [&str; 3] = ["fc00::/7", "fe80::/10", "::1/128"];

fn overlaps(a: &ipnet::IpNet, b: &ipnet::IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// A policy as NetworkPolicy egress rules, or why it cannot be one. A NetworkPolicy sees
/// addresses only: IP and CIDR rules map onto `ipBlock`s (deny rules become `except`s, which
/// is OpenSandbox's deny-before-allow for addresses), `allow` by default onto everything but
/// the cluster-internal ranges plus the cluster's DNS; an allow rule scoped to ports is a rule
/// of its own with those TCP ports (without a target: every address but the cluster's). A
/// domain rule cannot be enforced, nor can a deny rule scoped to ports (a NetworkPolicy only
/// allows), so they are refused rather than left open.
pub fn egress_rules(policy: &paddock_core::egress::EgressPolicy) -> Result<Vec<serde_json::Value>, String> {
    use paddock_core::egress::{Action, Target};
    if policy.denies_everything() {
        return Ok(Vec::new());
    }
    let mut allow = Vec::new();
    let mut deny = Vec::new();
    // (rule index, networks, ports) of allow rules scoped to ports; no networks: every address
    // outside the cluster.
    let mut ported: Vec<(usize, Vec<ipnet::IpNet>, Vec<u32>)> = Vec::new();
    for (i, rule) in policy.egress.iter().enumerate() {
        let what = format!("egress rule {i} ({} {})", rule.action, rule.describe());
        if let Some(ports) = &rule.ports {
            if rule.action == Action::Deny {
                return Err(format!(
                    "{what}: a deny rule scoped to ports is not enforced on the Kubernetes runtime (a NetworkPolicy can only allow ports); deny the whole address, allow only the ports it may use, or use the local runtime"
                ));
            }
            let nets = match rule.target.trim() {
                "" => Vec::new(),
                t => match Target::parse(t).map_err(|e| format!("egress rule {i}: {e}"))? {
                    Target::Net(net) => vec![net],
                    _ => return Err(format!("{what}: a domain rule cannot have ports")),
                },
            };
            ported.push((i, nets, ports.clone()));
            continue;
        }
        match Target::parse(&rule.target).map_err(|e| format!("egress rule {i}: {e}"))? {
            Target::Net(net) => match rule.action {
                Action::Allow => allow.push((i, net)),
                Action::Deny => deny.push(net),
            },
            _ => {
                return Err(format!(
                    "{what}: domain rules are not enforced on the Kubernetes runtime (a NetworkPolicy sees addresses only); give IPs or CIDRs, or use the local runtime"
                ));
            }
        }
    }
    let internal: Vec<ipnet::IpNet> =
        INTERNAL_V4.iter().chain(INTERNAL_V6.iter()).map(|c| c.parse().expect("valid")).collect();
    let opened = allow
        .iter()
        .map(|(i, net)| (*i, net))
        .chain(ported.iter().flat_map(|(i, nets, _)| nets.iter().map(move |n| (*i, n))));
    for (i, net) in opened {
        if let Some(inner) = internal.iter().find(|n| overlaps(n, net)) {
            return Err(format!(
                "egress rule {i} (allow {net}) overlaps {inner}, a cluster-internal, link-local or loopback range, which the Kubernetes runtime never opens to a sandbox"
            ));
        }
    }
    let block = |cidr: &ipnet::IpNet, except: Vec<String>| {
        if except.is_empty() {
            json!({"ipBlock": {"cidr": cidr.to_string()}})
        } else {
            json!({"ipBlock": {"cidr": cidr.to_string(), "except": except}})
        }
    };
    let inside = |outer: &ipnet::IpNet| -> Vec<String> {
        deny.iter()
            .filter(|d| outer.contains(&d.network()) && d.prefix_len() > outer.prefix_len())
            .map(|d| d.to_string())
            .collect()
    };
    let open =
        |net: &ipnet::IpNet| !deny.iter().any(|d| d.contains(&net.network()) && d.prefix_len() <= net.prefix_len());
    // Every address outside the cluster, but what deny rules name.
    let outside = || -> Vec<serde_json::Value> {
        [("0.0.0.0/0", &INTERNAL_V4[..]), ("::/0", &INTERNAL_V6[..])]
            .into_iter()
            .map(|(all, ranges)| {
                let all: ipnet::IpNet = all.parse().expect("valid");
                let mut except: Vec<String> = ranges.iter().map(|r| r.to_string()).collect();
                for d in inside(&all) {
                    if !except.contains(&d) {
                        except.push(d);
                    }
                }
                block(&all, except)
            })
            .collect()
    };
    if policy.default_action == Action::Deny {
        let peers: Vec<serde_json::Value> =
            allow.iter().filter(|(_, net)| open(net)).map(|(_, net)| block(net, inside(net))).collect();
        let mut rules = if peers.is_empty() { Vec::new() } else { vec![json!({"to": peers})] };
        for (_, nets, ports) in &ported {
            let to: Vec<serde_json::Value> = if nets.is_empty() {
                outside()
            } else {
                nets.iter().filter(|n| open(n)).map(|n| block(n, inside(n))).collect()
            };
            if !to.is_empty() {
                let ports: Vec<serde_json::Value> =
                    ports.iter().map(|p| json!({"protocol": "TCP", "port": p})).collect();
                rules.push(json!({"to": to, "ports": ports}));
            }
        }
        return Ok(rules);
    }
    // Allowed by default: an allow rule scoped to ports adds nothing (denials come first).
    Ok(vec![
        json!({"to": outside()}),
        // Names resolve through the cluster's DNS, and nothing else of the cluster is reachable.
        json!({
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }),
    ])
}

/// The egress rules of a sandbox's NetworkPolicy: its egress policy's, and the way to the
/// server's gateway when it has one (its address alone, on its port alone).
pub fn policy_rules(spec: &SandboxSpec) -> Result<Vec<serde_json::Value>, String> {
    let mut rules = egress_rules(&spec.network.policy())?;
    if let Some(g) = spec.gateway {
        let cidr = match g.ip() {
            std::net::IpAddr::V4(ip) => format!("{ip}/32"),
            std::net::IpAddr::V6(ip) => format!("{ip}/128"),
        };
        rules.push(json!({"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": g.port()}]}));
    }
    Ok(rules)
}

/// Denies all ingress of the sandbox's Pod and all egress its policy does not allow (deny-all:
/// no rules, DNS included): with both policy types listed, only the rules given are allowed.
pub fn network_policy(
    namespace: &str,
    id: &SandboxId,
    names: &Names,
    spec: &SandboxSpec,
) -> Result<NetworkPolicy, serde_json::Error> {
    let labels = match &spec.workspace {
        Some(w) => thread_labels(&w.thread, w.naming),
        None => pod_labels(id, spec),
    };
    let mut np = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": names.network_policy, "namespace": namespace, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": policy_selector(id, spec)},
            "policyTypes": ["Ingress", "Egress"],
        },
    });
    // Deny-all lists no rules at all, as before policies had any.
    let rules = policy_rules(spec).unwrap_or_default();
    if !rules.is_empty() {
        np["spec"]["egress"] = serde_json::Value::Array(rules);
    }
    serde_json::from_value(np)
}

/// Where a Pod is in its life, as far as a sandbox is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodPhase {
    /// Running with its container ready: commands can be run.
    Ready,
    /// Scheduled or starting; `Some` says why it cannot start on its own (bad image, ...).
    Starting(Option<String>),
    /// Ended, unknown or being deleted: it will never serve again.
    Gone(String),
}

/// Waiting reasons that do not clear up by waiting longer.
const STUCK_REASONS: [&str; 7] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
];

pub fn phase(pod: &Pod) -> PodPhase {
    if pod.metadata.deletion_timestamp.is_some() {
        return PodPhase::Gone("the Pod is being deleted".into());
    }
    let Some(status) = &pod.status else { return PodPhase::Starting(None) };
    let container = status.container_statuses.iter().flatten().find(|c| c.name == CONTAINER);
    match status.phase.as_deref() {
        Some("Running") => {
            if container.is_some_and(|c| c.ready) {
                PodPhase::Ready
            } else if let Some(t) = container.and_then(|c| c.state.as_ref()).and_then(|s| s.terminated.as_ref()) {
                PodPhase::Gone(format!("the keeper container ended ({})", t.reason.as_deref().unwrap_or("exited")))
            } else {
                PodPhase::Starting(None)
            }
        }
        Some("Pending") | None => {
            let waiting = container.and_then(|c| c.state.as_ref()).and_then(|s| s.waiting.as_ref());
            let stuck = waiting.filter(|w| w.reason.as_deref().is_some_and(|r| STUCK_REASONS.contains(&r)));
            PodPhase::Starting(stuck.map(|w| {
                format!("{}: {}", w.reason.as_deref().unwrap_or_default(), w.message.as_deref().unwrap_or("no details"))
            }))
        }
        Some(other) => {
            let why = status.reason.as_deref().or(status.message.as_deref());
            let term = container
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.reason.as_deref());
            PodPhase::Gone(match why.or(term) {
                Some(r) => format!("the Pod is {other} ({r})"),
                None => format!("the Pod is {other}"),
            })
        }
    }
}

/// The sandbox a Pod carries, from its labels and annotations only.
pub fn info(pod: &Pod) -> Option<SandboxInfo> {
    let labels = pod.metadata.labels.as_ref()?;
    let annotations = pod.metadata.annotations.as_ref()?;
    let id = SandboxId::parse(labels.get(SANDBOX_LABEL)?).ok()?;
    let spec: SandboxSpec = serde_json::from_str(annotations.get(SPEC_ANNOTATION)?).ok()?;
    let created_unix_ms = annotations.get(CREATED_ANNOTATION).and_then(|v| v.parse().ok()).unwrap_or(0);
    let expires_unix_ms = annotations.get(EXPIRES_ANNOTATION).and_then(|v| v.parse().ok());
    let workspace = spec.workspace.as_ref().map(|w| WorkspaceInfo {
        thread: w.thread.clone(),
        name: annotations
            .get(WORKSPACE_ANNOTATION)
            .cloned()
            .unwrap_or_else(|| thread_names(&w.thread, w.naming).pvc.unwrap_or_default()),
    });
    let (state, failure) = match phase(pod) {
        PodPhase::Ready | PodPhase::Starting(None) => (SandboxState::Running, None),
        PodPhase::Starting(Some(why)) | PodPhase::Gone(why) => (SandboxState::Failed, Some(why)),
    };
    let status = pod.status.as_ref();
    let mut addresses: Vec<std::net::IpAddr> =
        status.and_then(|s| s.pod_ips.as_ref()).into_iter().flatten().filter_map(|ip| ip.ip.parse().ok()).collect();
    if addresses.is_empty() {
        addresses.extend(status.and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ip.parse::<std::net::IpAddr>().ok()));
    }
    Some(SandboxInfo { id, state, spec, created_unix_ms, expires_unix_ms, workspace, failure, addresses })
}

/// Whether a Pod's sandbox has outlived its expiry at `now`.
pub fn expired(pod: &Pod, now_unix_ms: u64) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXPIRES_ANNOTATION))
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|e| e <= now_unix_ms)
}

#[cfg(test)]
mod tests {
    use paddock_core::spec::WorkspaceRef;

    use super::*;

    fn shape() -> Shape {
        Shape {
            namespace: "ns".into(),
            image: "paddock.local/sandbox:1".into(),
            image_pull_policy: "IfNotPresent".into(),
            runtime_class: None,
            host_users_false: false,
            cpu_request_millicpus: None,
            chown_image: None,
            priority_classes: BTreeMap::new(),
        }
    }

    fn id() -> SandboxId {
        SandboxId::parse("sbx-0123456789ab").unwrap()
    }

    fn thread_spec(raw: &str, naming: NamingMode) -> SandboxSpec {
        SandboxSpec {
            workspace: Some(WorkspaceRef { thread: ThreadId::new(raw).unwrap(), naming }),
            ..Default::default()
        }
    }

    fn to_json<T: serde::Serialize>(v: &T) -> Value {
        serde_json::to_value(v).unwrap()
    }

    #[test]
    fn the_gate_finds_no_secret_and_a_hardened_pod_in_the_keeper_pod_and_its_chown_step() {
        let mut spec = SandboxSpec::default();
        spec.workspace =
            Some(paddock_core::spec::WorkspaceRef { thread: ThreadId::new("t").unwrap(), naming: NamingMode::Hashed });
        for shape in [shape(), Shape { chown_image: Some("trusted:1".into()), ..shape() }] {
            let names = thread_names(&ThreadId::new("t").unwrap(), NamingMode::Hashed);
            let p = pod(&shape, &id(), &names, &spec, 1000, None).unwrap();
            let checks = crate::pod_settings::judge(&p, CONTAINER);
            assert_eq!(checks.len(), 2);
            assert!(checks.iter().all(|c| c.passed), "{checks:?}");
        }
    }

    #[test]
    fn a_sandbox_with_a_gateway_may_reach_that_address_on_that_port_only() {
        let mut spec = SandboxSpec { gateway: Some("10.244.0.1:18781".parse().unwrap()), ..Default::default() };
        let names = sandbox_names(&id(), &spec);
        let np = to_json(&network_policy("ns", &id(), &names, &spec).unwrap());
        assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(
            np["spec"]["egress"],
            json!([{"to": [{"ipBlock": {"cidr": "10.244.0.1/32"}}], "ports": [{"protocol": "TCP", "port": 18781}]}])
        );
        assert!(np["spec"].get("ingress").is_none());
        // Beside the egress policy's own rules, and in IPv6 too.
        spec.gateway = Some("[fd00::1]:8081".parse().unwrap());
        spec.network = paddock_core::spec::NetworkPolicy::Egress(paddock_core::egress::EgressPolicy::allow_all());
        let rules = policy_rules(&spec).unwrap();
        assert_eq!(rules.len(), egress_rules(&spec.network.policy()).unwrap().len() + 1);
        assert_eq!(rules.last().unwrap()["to"][0]["ipBlock"]["cidr"], "fd00::1/128");
        // Without a gateway, deny-all has no rule at all.
        let plain = to_json(&network_policy("ns", &id(), &names, &SandboxSpec::default()).unwrap());
        assert!(plain["spec"].get("egress").is_none(), "{plain}");
    }

    #[test]
    fn keeper_pod_is_hardened() {
        let mut spec = SandboxSpec::default();
        spec.env.insert("A".into(), "1".into());
        let names = sandbox_names(&id(), &spec);
        assert_eq!(names.pod, "paddock-sbx-0123456789ab");
        assert_eq!(names.pvc, None);
        let p = to_json(&pod(&shape(), &id(), &names, &spec, 1000, Some(2000)).unwrap());
        let s = &p["spec"];
        assert_eq!(s["automountServiceAccountToken"], false);
        assert_eq!(s["enableServiceLinks"], false);
        assert_eq!(s["restartPolicy"], "Never");
        assert!(s.get("hostUsers").is_none() && s.get("runtimeClassName").is_none());
        assert_eq!(
            s["securityContext"],
            json!({"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch",
                   "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
        );
        let c = &s["containers"][0];
        assert_eq!(c["name"], "sandbox");
        assert_eq!(c["image"], "paddock.local/sandbox:1");
        assert_eq!(c["command"], json!(KEEPER_COMMAND));
        assert_eq!(
            c["securityContext"],
            json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true,
                   "capabilities": {"drop": ["ALL"]}})
        );
        let disk = (268435456 + paddock_core::spec::DEFAULT_WORKSPACE + LOG_BYTES).to_string();
        assert_eq!(
            c["resources"],
            json!({"requests": {"cpu": "1000m", "memory": "536870912", "ephemeral-storage": disk},
                   "limits": {"cpu": "1000m", "memory": "536870912", "ephemeral-storage": disk}})
        );
        assert_eq!(c["volumeMounts"][1], json!({"name": "run", "mountPath": "/run"}), "a writable /run");
        // Only the spec's variables: the keeper keeps the image's PATH (commands get it).
        assert_eq!(c["env"], json!([{"name": "A", "value": "1"}]));
        assert_eq!(
            s["volumes"],
            json!([{"name": "tmp", "emptyDir": {"sizeLimit": "268435456"}},
                   {"name": "workspace", "emptyDir": {"sizeLimit": paddock_core::spec::DEFAULT_WORKSPACE.to_string()}},
                   {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": RUN_BYTES.to_string()}}])
        );
        let m = &p["metadata"];
        assert_eq!(m["labels"], json!({MANAGED_BY: "paddock", SANDBOX_LABEL: "sbx-0123456789ab"}));
        assert_eq!(m["annotations"][CREATED_ANNOTATION], "1000");
        assert_eq!(m["annotations"][EXPIRES_ANNOTATION], "2000");
        assert_eq!(m["annotations"][NETPOL_ANNOTATION], "paddock-net-sbx-0123456789ab");
        let back: SandboxSpec = serde_json::from_str(m["annotations"][SPEC_ANNOTATION].as_str().unwrap()).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn named_volumes_become_pvc_mounts_and_their_claims_escape_the_reaper() {
        use paddock_core::volume::{VolumeMount, VolumeSource};
        let named = |name: &str, at: &str, sub: Option<&str>, ro| VolumeMount {
            name: name.into(),
            mount_path: at.into(),
            read_only: ro,
            sub_path: sub.map(Into::into),
            source: VolumeSource::Named {
                name: "data".into(),
                create: true,
                delete_with_sandbox: false,
                size_bytes: None,
            },
        };
        let spec = SandboxSpec {
            volumes: vec![
                named("a", "/mnt/data", None, false),
                named("b", "/mnt/train", Some("datasets/train/"), true),
            ],
            ..Default::default()
        };
        let s = pod_spec(&shape(), &spec, None, true);
        assert_eq!(
            s["volumes"].as_array().unwrap()[3..],
            [json!({"name": "vol-0", "persistentVolumeClaim": {"claimName": "data", "readOnly": false}})],
            "one Pod volume per claim"
        );
        assert_eq!(
            s["containers"][0]["volumeMounts"].as_array().unwrap()[3..],
            [
                json!({"name": "vol-0", "mountPath": "/mnt/data", "readOnly": false}),
                json!({"name": "vol-0", "mountPath": "/mnt/train", "readOnly": true, "subPath": "datasets/train"})
            ]
        );
        let chown = Shape { chown_image: Some("trusted:1".into()), ..shape() };
        let init = &pod_spec(&chown, &spec, None, true)["initContainers"][0];
        assert_eq!(init["volumeMounts"], json!([{"name": "vol-0", "mountPath": "/volumes/0"}]));
        assert_eq!(
            init["command"].as_array().unwrap()[5..],
            [json!("/volumes/0")],
            "the read-only mount's subPath is not made"
        );
        let c = to_json(&named_volume_pvc("ns", "data", 1 << 30, Some("fast")).unwrap());
        assert_eq!(c["metadata"]["labels"], json!({MANAGED_BY: VOLUME_MANAGER, VOLUME_LABEL: "data"}));
        assert_eq!(c["spec"]["resources"]["requests"]["storage"], "1073741824");
        assert_eq!(c["spec"]["storageClassName"], "fast");
        assert_ne!(VOLUME_MANAGER, "paddock", "the workspace reaper selects managed-by=paddock");
    }

    #[test]
    fn a_run_tiers_pod_gets_its_priority_class_and_other_pods_the_default() {
        let shape =
            Shape { priority_classes: BTreeMap::from([("batch".to_owned(), "paddock-batch".to_owned())]), ..shape() };
        let pod_of = |tier: Option<&str>| {
            let spec = SandboxSpec { tier: tier.map(str::to_owned), ..Default::default() };
            to_json(&pod(&shape, &id(), &sandbox_names(&id(), &spec), &spec, 1, None).unwrap())
        };
        let batch = pod_of(Some("batch"));
        assert_eq!(batch["spec"]["priorityClassName"], "paddock-batch");
        assert_eq!(batch["metadata"]["labels"][TIER_LABEL], "batch");
        // A tier the operator mapped to no class, and a plain sandbox: the cluster's default.
        let interactive = pod_of(Some("interactive"));
        assert!(interactive["spec"].get("priorityClassName").is_none(), "{interactive}");
        assert_eq!(interactive["metadata"]["labels"][TIER_LABEL], "interactive");
        let plain = pod_of(None);
        assert!(plain["spec"].get("priorityClassName").is_none());
        assert!(plain["metadata"]["labels"].get(TIER_LABEL).is_none());
    }

    #[test]
    fn optional_pod_settings() {
        let shape = Shape {
            runtime_class: Some("kata".into()),
            host_users_false: true,
            cpu_request_millicpus: Some(100),
            ..shape()
        };
        let mut spec = SandboxSpec::default();
        spec.resources.workspace_bytes = Some(64 << 20);
        let p = to_json(&pod(&shape, &id(), &sandbox_names(&id(), &spec), &spec, 1, None).unwrap());
        assert_eq!(p["spec"]["hostUsers"], false);
        assert_eq!(p["spec"]["runtimeClassName"], "kata");
        assert_eq!(p["spec"]["containers"][0]["resources"]["requests"]["cpu"], "100m");
        assert_eq!(p["spec"]["volumes"][1], json!({"name": "workspace", "emptyDir": {"sizeLimit": "67108864"}}));
        assert!(p["metadata"]["annotations"].get(EXPIRES_ANNOTATION).is_none());
    }

    #[test]
    fn thread_pod_mounts_its_claim() {
        let spec = thread_spec("Thread_ABC", NamingMode::Hashed);
        let t = ThreadId::new("Thread_ABC").unwrap();
        let names = thread_names(&t, NamingMode::Hashed);
        let h = sanitize_hashed("Thread_ABC");
        assert_eq!(names.pod, format!("paddock-{h}"));
        assert_eq!(names.pvc.as_deref(), Some(format!("paddock-vol-{h}").as_str()));
        let p = to_json(&pod(&shape(), &id(), &names, &spec, 1, None).unwrap());
        assert_eq!(
            p["spec"]["volumes"][1],
            json!({"name": "workspace", "persistentVolumeClaim": {"claimName": format!("paddock-vol-{h}")}})
        );
        assert_eq!(p["metadata"]["labels"][THREAD_HASH_LABEL], h);
        assert_eq!(p["metadata"]["annotations"][THREAD_ANNOTATION], "Thread_ABC");
        assert_eq!(p["metadata"]["annotations"][WORKSPACE_ANNOTATION], format!("paddock-vol-{h}"));
        assert!(p["spec"].get("initContainers").is_none());
        let chown = Shape { chown_image: Some("trusted:1".into()), ..shape() };
        let p = to_json(&pod(&chown, &id(), &names, &spec, 1, None).unwrap());
        let init = &p["spec"]["initContainers"][0];
        assert_eq!(init["image"], "trusted:1");
        assert_eq!(init["command"][4], "1000:1000");
        assert_eq!(init["securityContext"]["capabilities"], json!({"drop": ["ALL"], "add": ["CHOWN"]}));
        assert_eq!(init["volumeMounts"], json!([{"name": "workspace", "mountPath": "/workspace"}]));
        assert_eq!(init["command"].as_array().unwrap().len(), 5, "no volume directories");
        // Requests equal to limits in both containers: the Pod stays Guaranteed.
        let sandbox = &p["spec"]["containers"][0]["resources"];
        assert_eq!(init["resources"], *sandbox);
        assert_eq!(sandbox["requests"], sandbox["limits"]);
        let no_ws = SandboxSpec::default();
        let p = to_json(&pod(&chown, &id(), &sandbox_names(&id(), &no_ws), &no_ws, 1, None).unwrap());
        assert!(p["spec"].get("initContainers").is_none(), "an emptyDir needs no chown");
    }

    #[test]
    fn dawn_compat_names_and_labels() {
        let t = ThreadId::new("Thread_ABC").unwrap();
        let names = thread_names(&t, NamingMode::DawnCompat);
        assert_eq!(
            names,
            Names {
                pod: "dawn-sbx-thread-abc".into(),
                network_policy: "dawn-sbx-net-thread-abc".into(),
                pvc: Some("dawn-sbx-vol-thread-abc".into()),
            }
        );
        let claim = to_json(&pvc("ns", "dawn-sbx-vol-thread-abc", &t, NamingMode::DawnCompat, 1 << 30, None).unwrap());
        assert_eq!(claim["metadata"]["labels"][MANAGED_BY], "dawn");
        assert_eq!(claim["metadata"]["labels"][DAWN_THREAD_LABEL], "thread-abc");
        let spec = thread_spec("Thread_ABC", NamingMode::DawnCompat);
        let np = to_json(&network_policy("ns", &id(), &names, &spec).unwrap());
        assert_eq!(np["spec"]["podSelector"], json!({"matchLabels": {DAWN_THREAD_LABEL: "thread-abc"}}));
        let p = to_json(&pod(&shape(), &id(), &names, &spec, 1, None).unwrap());
        assert_eq!(p["metadata"]["labels"][MANAGED_BY], "dawn");
        assert_eq!(p["metadata"]["labels"][DAWN_THREAD_LABEL], "thread-abc");
        assert_eq!(p["metadata"]["labels"][SANDBOX_LABEL], "sbx-0123456789ab");
    }

    #[test]
    fn claim_shape() {
        let t = ThreadId::new("t1").unwrap();
        let c = to_json(&pvc("ns", "paddock-vol-x", &t, NamingMode::Hashed, 1 << 30, Some("standard")).unwrap());
        assert_eq!(
            c["spec"],
            json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1073741824"}},
                   "storageClassName": "standard"})
        );
        assert_eq!(c["metadata"]["annotations"][THREAD_ANNOTATION], "t1");
        assert_eq!(c["metadata"]["labels"][MANAGED_BY], "paddock");
        let c = to_json(&pvc("ns", "x", &t, NamingMode::Hashed, 1, None).unwrap());
        assert!(c["spec"].get("storageClassName").is_none());
    }

    #[test]
    fn network_policy_denies_everything() {
        let spec = SandboxSpec::default();
        let np = to_json(&network_policy("ns", &id(), &sandbox_names(&id(), &spec), &spec).unwrap());
        assert_eq!(
            np["spec"],
            json!({"podSelector": {"matchLabels": {SANDBOX_LABEL: "sbx-0123456789ab"}}, "policyTypes": ["Ingress", "Egress"]})
        );
        assert_eq!(np["metadata"]["name"], "paddock-net-sbx-0123456789ab");
        let spec = thread_spec("t1", NamingMode::Hashed);
        let np = to_json(&network_policy("ns", &id(), &sandbox_names(&id(), &spec), &spec).unwrap());
        assert_eq!(np["spec"]["podSelector"]["matchLabels"], json!({THREAD_HASH_LABEL: sanitize_hashed("t1")}));
    }

    fn with_status(mut p: Pod, status: Value) -> Pod {
        p.status = Some(serde_json::from_value(status).unwrap());
        p
    }

    #[test]
    fn pods_read_back_as_sandboxes() {
        let spec = thread_spec("t1", NamingMode::Hashed);
        let t = ThreadId::new("t1").unwrap();
        let p = pod(&shape(), &id(), &thread_names(&t, NamingMode::Hashed), &spec, 5, Some(9)).unwrap();
        let running = with_status(
            p.clone(),
            json!({"phase": "Running", "containerStatuses": [{"name": "sandbox", "ready": true, "restartCount": 0,
                   "image": "i", "imageID": ""}]}),
        );
        let i = info(&running).unwrap();
        assert_eq!(i.id, id());
        assert_eq!(i.state, SandboxState::Running);
        assert_eq!((i.created_unix_ms, i.expires_unix_ms), (5, Some(9)));
        assert_eq!(i.workspace.unwrap().name, format!("paddock-vol-{}", sanitize_hashed("t1")));
        assert!(expired(&running, 9) && !expired(&running, 8));
        let stuck = with_status(
            p.clone(),
            json!({"phase": "Pending", "containerStatuses": [{"name": "sandbox", "ready": false, "restartCount": 0,
                   "image": "i", "imageID": "", "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "no"}}}]}),
        );
        assert_eq!(phase(&stuck), PodPhase::Starting(Some("ErrImageNeverPull: no".into())));
        assert_eq!(info(&stuck).unwrap().state, SandboxState::Failed);
        let done = with_status(p.clone(), json!({"phase": "Succeeded"}));
        assert_eq!(phase(&done), PodPhase::Gone("the Pod is Succeeded".into()));
        assert_eq!(info(&with_status(p.clone(), json!({"phase": "Pending"}))).unwrap().state, SandboxState::Running);
        let mut foreign = p;
        foreign.metadata.labels.as_mut().unwrap().remove(SANDBOX_LABEL);
        assert!(info(&foreign).is_none());
    }

    #[test]
    fn egress_policies_map_to_ip_blocks_and_refuse_what_a_network_policy_cannot_enforce() {
        use paddock_core::egress::{Action, EgressPolicy, EgressRule};
        let p = |default, rules: &[(Action, &str)]| EgressPolicy {
            default_action: default,
            egress: rules.iter().map(|(a, t)| EgressRule::new(*a, *t)).collect(),
        };
        assert_eq!(egress_rules(&EgressPolicy::deny_all()).unwrap(), Vec::<serde_json::Value>::new());
        let allow =
            egress_rules(&p(Action::Deny, &[(Action::Allow, "203.0.113.0/24"), (Action::Deny, "203.0.113.128/25")]))
                .unwrap();
        assert_eq!(
            allow,
            vec![json!({"to": [{"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.128/25"]}}]})]
        );
        let all = egress_rules(&p(Action::Allow, &[(Action::Deny, "198.51.100.7")])).unwrap();
        let v4 = &all[0]["to"][0]["ipBlock"];
        assert_eq!(v4["cidr"], "0.0.0.0/0");
        for must in ["10.0.0.0/8", "169.254.0.0/16", "192.168.0.0/16", "198.51.100.7/32"] {
            assert!(v4["except"].as_array().unwrap().contains(&json!(must)), "{must} not excepted: {v4}");
        }
        assert_eq!(all[1]["ports"][0]["port"], 53, "allow-all resolves names through the cluster DNS");
        for (policy, why) in [
            (p(Action::Deny, &[(Action::Allow, "pypi.org")]), "domain rules"),
            (p(Action::Deny, &[(Action::Allow, "10.96.0.1")]), "cluster-internal"),
            (p(Action::Deny, &[(Action::Allow, "0.0.0.0/0")]), "cluster-internal"),
            (p(Action::Deny, &[(Action::Allow, "169.254.169.254")]), "link-local"),
        ] {
            assert!(egress_rules(&policy).unwrap_err().contains(why), "{policy:?}");
        }
    }

    #[test]
    fn allow_rules_scoped_to_ports_become_rules_with_tcp_ports_and_port_denials_are_refused() {
        use paddock_core::egress::{Action, EgressPolicy, EgressRule};
        let ported = |action, target: &str, ports: &[u32]| EgressRule {
            action,
            target: target.into(),
            ports: Some(ports.to_vec()),
        };
        let policy = EgressPolicy {
            default_action: Action::Deny,
            egress: vec![
                EgressRule::new(Action::Deny, "203.0.113.9"),
                ported(Action::Allow, "203.0.113.0/24", &[443, 8443]),
                ported(Action::Allow, "", &[22]),
            ],
        };
        let rules = egress_rules(&policy).unwrap();
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert_eq!(
            rules[0],
            json!({"to": [{"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.9/32"]}}],
                   "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 8443}]})
        );
        let every = &rules[1];
        assert_eq!(every["ports"], json!([{"protocol": "TCP", "port": 22}]));
        let v4 = &every["to"][0]["ipBlock"];
        assert_eq!(v4["cidr"], "0.0.0.0/0");
        for must in ["10.0.0.0/8", "169.254.0.0/16", "203.0.113.9/32"] {
            assert!(v4["except"].as_array().unwrap().contains(&json!(must)), "{must} not excepted: {v4}");
        }
        assert_eq!(every["to"][1]["ipBlock"]["cidr"], "::/0");
        let refused = EgressPolicy { default_action: Action::Allow, egress: vec![ported(Action::Deny, "", &[25])] };
        assert!(egress_rules(&refused).unwrap_err().contains("deny rule scoped to ports"));
        let inside =
            EgressPolicy { default_action: Action::Deny, egress: vec![ported(Action::Allow, "10.96.0.0/12", &[443])] };
        assert!(egress_rules(&inside).unwrap_err().contains("cluster-internal"));
    }
}
