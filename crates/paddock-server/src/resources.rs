//! Resource quantities as OpenSandbox's API writes them (`resourceLimits`), shared by the
//! sandbox and the run APIs.

use paddock_core::spec::SandboxSpec;

use crate::error::{ApiError, ApiResult};

/// Kubernetes-style memory quantity (`512Mi`, `2Gi`, `1G`, `1048576`) → bytes.
pub fn parse_memory(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let mult: f64 = match unit {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return None,
    };
    let v: f64 = num.parse().ok()?;
    let bytes = v * mult;
    (bytes.is_finite() && (1.0..1.8e19).contains(&bytes)).then_some(bytes as u64)
}

/// Kubernetes-style CPU quantity (`500m`, `1`, `0.5`) → millicpus.
pub fn parse_cpu(s: &str) -> Option<u32> {
    let s = s.trim();
    let milli = match s.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok()?,
        None => s.parse::<f64>().ok()? * 1000.0,
    };
    (milli.is_finite() && milli >= 1.0 && milli <= f64::from(u32::MAX)).then_some(milli.round() as u32)
}

/// Sets a spec's resources from `{name: quantity}` pairs, refusing names and quantities it
/// does not know with the way to write them.
pub fn apply<'a>(spec: &mut SandboxSpec, limits: impl Iterator<Item = (&'a String, &'a String)>) -> ApiResult<()> {
    for (k, v) in limits {
        match k.as_str() {
            "cpu" => {
                spec.resources.millicpus = parse_cpu(v).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "resourceLimits.cpu {v:?} is not a CPU quantity such as \"500m\" or \"2\""
                    ))
                })?
            }
            "memory" => {
                spec.resources.memory_bytes = parse_memory(v).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "resourceLimits.memory {v:?} is not a quantity such as \"512Mi\" or \"2Gi\""
                    ))
                })?
            }
            "pids" => {
                spec.resources.pids = v
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("resourceLimits.pids {v:?} is not a whole number")))?
            }
            "ephemeral-storage" | "tmp" => {
                spec.resources.tmp_bytes = parse_memory(v).ok_or_else(|| {
                    ApiError::bad_request(format!("resourceLimits.{k} {v:?} is not a quantity such as \"1Gi\""))
                })?
            }
            "workspace" => {
                spec.resources.workspace_bytes = Some(parse_memory(v).ok_or_else(|| {
                    ApiError::bad_request(format!("resourceLimits.workspace {v:?} is not a quantity such as \"10Gi\""))
                })?)
            }
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
