//! Resource quantities and the network policy as OpenSandbox's create writes them
//! (`resourceLimits`, `networkPolicy`), shared by the sandbox and the run APIs.

use paddock_core::egress::{Action, EgressPolicy};
use paddock_core::spec::{NetworkPolicy, SandboxSpec};
use paddock_core::units::{parse_bytes, parse_cpus};

use crate::error::{ApiError, ApiResult};

/// A byte quantity as Kubernetes writes it (`512Mi`, `2Gi`, `1G` = 10⁹, `1048576`), parsed by
/// the same exact parser as the command line's; `what` names the field in the error.
pub fn bytes(what: &str, s: &str) -> ApiResult<u64> {
    parse_bytes(s).map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

/// A CPU quantity as Kubernetes writes it (`500m`, `1`, `0.5`) → millicpus.
pub fn cpus(what: &str, s: &str) -> ApiResult<u32> {
    parse_cpus(s).map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

/// Sets a spec's resources from `{name: quantity}` pairs, refusing names and quantities it
/// does not know with the way to write them.
pub fn apply<'a>(spec: &mut SandboxSpec, limits: impl Iterator<Item = (&'a String, &'a String)>) -> ApiResult<()> {
    for (k, v) in limits {
        match k.as_str() {
            "cpu" => spec.resources.millicpus = cpus("resourceLimits.cpu", v)?,
            "memory" => spec.resources.memory_bytes = bytes("resourceLimits.memory", v)?,
            "pids" => {
                spec.resources.pids = v
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("resourceLimits.pids {v:?} is not a whole number")))?
            }
            "ephemeral-storage" | "tmp" => spec.resources.tmp_bytes = bytes(&format!("resourceLimits.{k}"), v)?,
            "workspace" => spec.resources.workspace_bytes = Some(bytes("resourceLimits.workspace", v)?),
            "workspace-inodes" => {
                spec.resources.workspace_inodes = v.parse().map_err(|_| {
                    ApiError::bad_request(format!("resourceLimits.workspace-inodes {v:?} is not a whole number"))
                })?
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "resource {other:?} is not supported: use cpu, memory, pids, ephemeral-storage (/tmp), workspace or workspace-inodes"
                )));
            }
        }
    }
    Ok(())
}

/// A create's `networkPolicy` as a spec's network: deny-all without rules stays a namespace
/// with loopback only (no enforcer, no DNS), until a change asks for more.
pub fn network_of(policy: EgressPolicy) -> ApiResult<NetworkPolicy> {
    policy.validate().map_err(|e| ApiError::bad_request(format!("networkPolicy: {e}")))?;
    Ok(if policy.default_action == Action::Deny && policy.egress.is_empty() {
        NetworkPolicy::LoopbackOnly
    } else {
        NetworkPolicy::Egress(policy)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pairs: &[(&str, &str)]) -> ApiResult<SandboxSpec> {
        let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut spec = SandboxSpec::default();
        apply(&mut spec, owned.iter().map(|(k, v)| (k, v)))?;
        Ok(spec)
    }

    /// The API reads a quantity exactly as the command line does (`M` is 10⁶, `Mi` 2²⁰).
    #[test]
    fn quantities_mean_what_they_mean_on_the_command_line() {
        for (memory, cpu) in [("512Mi", "500m"), ("1G", "2"), ("1048576", "0.25"), ("1.5Gi", "1500m")] {
            let spec = limits(&[("memory", memory), ("cpu", cpu)]).unwrap();
            assert_eq!(spec.resources.memory_bytes, parse_bytes(memory).unwrap(), "{memory}");
            assert_eq!(spec.resources.millicpus, parse_cpus(cpu).unwrap(), "{cpu}");
        }
        assert_eq!(limits(&[("memory", "1M")]).unwrap().resources.memory_bytes, 1_000_000);
        assert_eq!(limits(&[("memory", "1Mi")]).unwrap().resources.memory_bytes, 1 << 20);
        for (k, bad) in [
            ("memory", "512m"),
            ("memory", ""),
            ("memory", "-1Gi"),
            ("memory", "1Xi"),
            ("memory", "1e999"),
            ("cpu", "0"),
            ("cpu", "0m"),
            ("cpu", "abc"),
            ("tmp", "1g"),
            ("workspace", "Gi"),
        ] {
            let err = limits(&[(k, bad)]).unwrap_err();
            assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST, "{k}={bad}");
            assert!(err.message.contains(k), "{k}={bad}: {}", err.message);
        }
        assert!(limits(&[("memory", "512m")]).unwrap_err().message.contains("512Mi"));
    }
}
