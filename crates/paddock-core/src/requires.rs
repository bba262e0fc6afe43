//! What a run or an evaluation's task needs of the sandbox it runs in, beyond an image and
//! resources: a kind of boundary, a host device, containers of its own. A server whose runtime
//! cannot give it refuses the work when it is submitted, naming what is missing and what would
//! give it (Dreadnode refuses an evaluation on a provider that cannot provide its environment),
//! rather than queueing a run that can only fail.

use serde::{Deserialize, Serialize};

use crate::runtime::Capabilities;

/// Boundaries a runtime may report (`Capabilities::isolation`) and a task may ask for; `vm` asks
/// for either virtual machine.
pub const ISOLATIONS: &[&str] = &["namespaces", "gvisor", "kata", "firecracker"];

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requirements {
    /// The boundary: one of [`ISOLATIONS`], or `vm` (kata or firecracker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// Host devices the sandbox must have, e.g. `/dev/kvm`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// The task runs containers of its own (docker-in-sandbox, buildkit, a test's kind cluster).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nested_containers: bool,
}

impl Requirements {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Why a runtime with `caps` cannot run this, or `None` when it can. Each reason names what
    /// is missing and where it could run instead.
    pub fn unmet(&self, caps: &Capabilities) -> Option<String> {
        let runtime = format!("this server's {} runtime (isolation: {})", caps.runtime, or_unknown(&caps.isolation));
        if let Some(want) = &self.isolation {
            if want != "vm" && !ISOLATIONS.contains(&want.as_str()) {
                return Some(format!(
                    "requires.isolation {want:?} is not a kind of boundary: give one of {}, or vm",
                    ISOLATIONS.join(", ")
                ));
            }
            let got = caps.isolation.as_str();
            let met = if want == "vm" { matches!(got, "kata" | "firecracker") } else { want == got };
            if !met {
                return Some(format!(
                    "requires.isolation {want}: {runtime} cannot give it; submit to a server whose sandboxes run under {want} (on Kubernetes: paddock serve --runtime-class CLASS --isolation {})",
                    if want == "vm" { "kata" } else { want }
                ));
            }
        }
        for device in &self.devices {
            if !device.starts_with("/dev/") || device.contains("/../") || device.ends_with("/..") {
                return Some(format!(
                    "requires.devices {device:?}: name a device by its path under /dev, e.g. /dev/kvm"
                ));
            }
            if !caps.devices.iter().any(|d| d == device) {
                let given = if caps.devices.is_empty() { "no host device".to_owned() } else { caps.devices.join(", ") };
                return Some(format!(
                    "requires.devices {device}: {runtime} gives its sandboxes {given}; submit to a server whose sandboxes have {device}"
                ));
            }
        }
        if self.nested_containers && !caps.nested_containers {
            return Some(format!(
                "requires.nestedContainers: {runtime} runs no containers inside a sandbox (no nested namespaces or mounts); build images outside, or submit to a server whose sandboxes allow them"
            ));
        }
        None
    }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "unknown" } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(isolation: &str, devices: &[&str], nested: bool) -> Capabilities {
        let mut c: Capabilities = serde_json::from_value(serde_json::json!({"runtime": "kubernetes", "pause": false,
            "persistent_workspaces": true, "run_as_other_user": false, "images": "", "network": [], "metrics": false}))
        .unwrap();
        c.isolation = isolation.into();
        c.devices = devices.iter().map(|d| (*d).to_owned()).collect();
        c.nested_containers = nested;
        c
    }

    fn needs(json: serde_json::Value) -> Requirements {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn what_a_runtime_gives_is_met_and_what_it_lacks_is_named() {
        let runc = caps("namespaces", &[], false);
        assert_eq!(Requirements::default().unmet(&runc), None);
        assert_eq!(needs(serde_json::json!({"isolation": "namespaces"})).unmet(&runc), None);
        let why = needs(serde_json::json!({"isolation": "gvisor"})).unmet(&runc).unwrap();
        assert!(why.contains("requires.isolation gvisor") && why.contains("--isolation gvisor"), "{why}");
        let why = needs(serde_json::json!({"devices": ["/dev/kvm"]})).unmet(&runc).unwrap();
        assert!(why.contains("/dev/kvm") && why.contains("no host device"), "{why}");
        let why = needs(serde_json::json!({"nestedContainers": true})).unmet(&runc).unwrap();
        assert!(why.contains("nestedContainers"), "{why}");

        let kata = caps("kata", &["/dev/kvm"], true);
        let all = needs(serde_json::json!({"isolation": "vm", "devices": ["/dev/kvm"], "nestedContainers": true}));
        assert_eq!(all.unmet(&kata), None);
        assert!(all.unmet(&caps("gvisor", &["/dev/kvm"], true)).unwrap().contains("requires.isolation vm"));
        assert!(needs(serde_json::json!({"isolation": "firecracker"})).unmet(&kata).is_some());
    }

    #[test]
    fn nonsense_is_refused_as_such() {
        let any = caps("namespaces", &["/dev/kvm"], true);
        let why = needs(serde_json::json!({"isolation": "steel"})).unmet(&any).unwrap();
        assert!(why.contains("is not a kind of boundary"), "{why}");
        for bad in ["kvm", "/etc/passwd", "/dev/../etc"] {
            let why = needs(serde_json::json!({"devices": [bad]})).unmet(&any).unwrap();
            assert!(why.contains("under /dev"), "{bad}: {why}");
        }
        assert!(
            serde_json::from_value::<Requirements>(serde_json::json!({"gpu": 1})).is_err(),
            "unknown keys are refused"
        );
    }
}
