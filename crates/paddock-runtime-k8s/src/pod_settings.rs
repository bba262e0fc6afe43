//! What `paddock gate` cannot see from inside a sandbox and the Pod's spec shows: a Secret
//! handed in as a variable or a volume (inside it is only a value or a file), a projected
//! service-account token, and the Pod settings that keep the container from gaining anything
//! (as Hephaestus's gate checks the Pod settings of its templates). A claimed Pod is judged
//! the same way: its template is the cluster's, not Paddock's.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use paddock_core::runtime::SettingCheck;

/// The check names, stable for `paddock gate --skip NAME`.
pub const NO_SECRETS: &str = "no Secret as a variable or a volume";
pub const POD_SETTINGS: &str = "Pod settings";

/// Judges `pod`; `container` is the name of the sandbox's container (the others are init
/// containers Paddock runs before it starts, and sidecars a template may add, whose Secrets
/// count too).
pub fn judge(pod: &Pod, container: &str) -> Vec<SettingCheck> {
    let Some(spec) = pod.spec.as_ref() else {
        return vec![
            SettingCheck::new(NO_SECRETS, false, "the Pod has no spec"),
            SettingCheck::new(POD_SETTINGS, false, "the Pod has no spec"),
        ];
    };
    vec![secrets(spec), settings(spec, container)]
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers.iter().flatten().chain(spec.containers.iter())
}

fn secrets(spec: &PodSpec) -> SettingCheck {
    let mut found = Vec::new();
    for c in all_containers(spec) {
        for e in c.env.iter().flatten() {
            if let Some(r) = e.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()) {
                found.push(format!("variable {} of container {} from Secret {}", e.name, c.name, r.name));
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(r) = &e.secret_ref {
                found.push(format!("the variables of container {} from Secret {}", c.name, r.name));
            }
        }
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(s) = &v.secret {
            found.push(format!("volume {} of Secret {}", v.name, s.secret_name.as_deref().unwrap_or("?")));
        }
        for source in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(s) = &source.secret {
                found.push(format!("projected volume {} of Secret {}", v.name, s.name));
            }
            if source.service_account_token.is_some() {
                found.push(format!("projected volume {} with a service-account token", v.name));
            }
        }
    }
    if found.is_empty() {
        SettingCheck::new(NO_SECRETS, true, "none in the Pod's spec")
    } else {
        SettingCheck::new(
            NO_SECRETS,
            false,
            format!(
                "{}: whatever runs in the sandbox can read it; give credentials through the vault or the gateway instead",
                found.join("; ")
            ),
        )
    }
}

fn settings(spec: &PodSpec, container: &str) -> SettingCheck {
    let mut wrong = Vec::new();
    for (set, what) in [(spec.host_network, "hostNetwork"), (spec.host_pid, "hostPID"), (spec.host_ipc, "hostIPC")] {
        if set == Some(true) {
            wrong.push(format!("{what} is true"));
        }
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(h) = &v.host_path {
            wrong.push(format!("volume {} is the node's path {}", v.name, h.path));
        }
    }
    let pod_sc = spec.security_context.as_ref();
    match spec.containers.iter().find(|c| c.name == container) {
        None => wrong.push(format!("no container named {container}")),
        Some(c) => {
            let sc = c.security_context.as_ref();
            if sc.and_then(|s| s.privileged) == Some(true) {
                wrong.push("the container is privileged".into());
            }
            if sc.and_then(|s| s.allow_privilege_escalation) != Some(false) {
                wrong.push("allowPrivilegeEscalation is not false".into());
            }
            let caps = sc.and_then(|s| s.capabilities.as_ref());
            if !caps.and_then(|c| c.drop.as_ref()).is_some_and(|d| d.iter().any(|x| x.eq_ignore_ascii_case("ALL"))) {
                wrong.push("capabilities do not drop ALL".into());
            }
            if let Some(add) = caps.and_then(|c| c.add.as_ref()).filter(|a| !a.is_empty()) {
                wrong.push(format!("capabilities add {}", add.join(", ")));
            }
            let non_root = sc.and_then(|s| s.run_as_non_root).or(pod_sc.and_then(|s| s.run_as_non_root));
            let uid = sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user));
            if non_root != Some(true) && uid.is_none_or(|u| u == 0) {
                wrong.push("neither runAsNonRoot nor a non-zero runAsUser".into());
            }
            if uid == Some(0) {
                wrong.push("runAsUser is 0".into());
            }
            let seccomp = sc
                .and_then(|s| s.seccomp_profile.as_ref())
                .or(pod_sc.and_then(|s| s.seccomp_profile.as_ref()))
                .map(|p| p.type_.as_str());
            if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
                wrong
                    .push(format!("seccomp profile {} (want RuntimeDefault or Localhost)", seccomp.unwrap_or("unset")));
            }
        }
    }
    if wrong.is_empty() {
        SettingCheck::new(
            POD_SETTINGS,
            true,
            "no host namespaces or paths, non-root, no privilege escalation, capabilities dropped, seccomp",
        )
    } else {
        SettingCheck::new(POD_SETTINGS, false, format!("{}: harden the Pod (or its template)", wrong.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    /// Sets the value at JSON pointer `at`, whose parent exists.
    fn set(v: &mut serde_json::Value, at: &str, value: serde_json::Value) {
        let (parent, key) = at.rsplit_once('/').unwrap();
        match v.pointer_mut(parent).unwrap_or_else(|| panic!("{parent}")) {
            serde_json::Value::Array(a) => a[key.parse::<usize>().unwrap()] = value,
            serde_json::Value::Object(o) => drop(o.insert(key.to_owned(), value)),
            other => panic!("{at}: {other}"),
        }
    }

    /// Judges the hardened Pod with the value at `at` changed, asserts that check `name` fails
    /// and names `named`; returns every check.
    fn weakened(at: &str, value: serde_json::Value, name: &str, named: &str) -> Vec<SettingCheck> {
        let mut v = hardened();
        set(&mut v, at, value);
        let checks = judge(&pod(v), "sandbox");
        let c = checks.iter().find(|c| c.name == name).unwrap();
        assert!(!c.passed && c.detail.contains(named), "{at}: {c:?}");
        checks
    }

    fn hardened() -> serde_json::Value {
        json!({
            "metadata": {"name": "p"},
            "spec": {
                "automountServiceAccountToken": false,
                "securityContext": {"runAsUser": 1000, "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "initContainers": [{"name": "chown", "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}}],
                "containers": [{"name": "sandbox", "env": [{"name": "A", "value": "1"}],
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
                "volumes": [{"name": "tmp", "emptyDir": {}}],
            }
        })
    }

    #[test]
    fn a_hardened_pod_passes_both() {
        let checks = judge(&pod(hardened()), "sandbox");
        assert!(checks.iter().all(|c| c.passed), "{checks:?}");
        assert_eq!(checks.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), [NO_SECRETS, POD_SETTINGS]);
    }

    #[test]
    fn a_secret_as_a_variable_a_volume_or_a_projected_token_fails_and_is_named() {
        let cases = [
            (
                "/spec/containers/0/env",
                json!([{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "llm", "key": "k"}}}]),
                "variable KEY of container sandbox from Secret llm",
            ),
            (
                "/spec/initContainers/0/envFrom",
                json!([{"secretRef": {"name": "all"}}]),
                "the variables of container chown from Secret all",
            ),
            (
                "/spec/volumes",
                json!([{"name": "creds", "secret": {"secretName": "git"}}]),
                "volume creds of Secret git",
            ),
            (
                "/spec/volumes",
                json!([{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]),
                "projected volume kube-api-access with a service-account token",
            ),
            (
                "/spec/volumes",
                json!([{"name": "mixed", "projected": {"sources": [{"secret": {"name": "s"}}]}}]),
                "projected volume mixed of Secret s",
            ),
        ];
        for (at, value, named) in cases {
            let checks = weakened(at, value, NO_SECRETS, named);
            assert!(checks.iter().find(|c| c.name == POD_SETTINGS).unwrap().passed, "{at}");
        }
    }

    #[test]
    fn each_weakened_setting_fails_the_pod_settings_and_is_named() {
        let cases = [
            ("/spec/hostNetwork", json!(true), "hostNetwork is true"),
            ("/spec/hostPID", json!(true), "hostPID is true"),
            ("/spec/volumes/0", json!({"name": "tmp", "hostPath": {"path": "/var/run"}}), "the node's path /var/run"),
            ("/spec/containers/0/securityContext/allowPrivilegeEscalation", json!(true), "allowPrivilegeEscalation"),
            (
                "/spec/containers/0/securityContext/capabilities",
                json!({"drop": ["ALL"], "add": ["NET_RAW"]}),
                "capabilities add NET_RAW",
            ),
            ("/spec/containers/0/securityContext/capabilities", json!({}), "do not drop ALL"),
            ("/spec/securityContext/seccompProfile", json!({"type": "Unconfined"}), "seccomp profile Unconfined"),
            ("/spec/securityContext/runAsUser", json!(0), "runAsUser is 0"),
            ("/spec/containers/0/name", json!("other"), "no container named sandbox"),
        ];
        for (at, value, named) in cases {
            weakened(at, value, POD_SETTINGS, named);
        }
        // The privileged flag alone.
        let mut v = hardened();
        v["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
        assert!(judge(&pod(v), "sandbox")[1].detail.contains("privileged"));
    }
}
