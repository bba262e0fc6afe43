//! Volumes a sandbox mounts besides its workspace: a host directory the operator allows, or a
//! named volume the runtime keeps until it is deleted (OpenSandbox's `host` and `pvc`).

use serde::{Deserialize, Serialize};

use crate::spec::SpecError;

/// One volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The mount's name within the sandbox (a DNS label), for messages.
    pub name: String,
    /// Where it appears inside the sandbox: an absolute, normalized path.
    pub mount_path: String,
    /// Read-only, enforced by the mount itself.
    #[serde(default)]
    pub read_only: bool,
    /// A directory within the volume to mount instead of its root (relative, no `..`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    pub source: VolumeSource,
}

/// What a volume is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum VolumeSource {
    /// A directory of the host, under a root the operator allows.
    Host { path: String },
    /// A volume the runtime manages by name (a PersistentVolumeClaim on Kubernetes).
    Named {
        name: String,
        /// Create it when it does not exist yet; otherwise a missing volume is an error.
        #[serde(default = "yes")]
        create: bool,
        /// Delete it once the sandbox that created it is destroyed.
        #[serde(default)]
        delete_with_sandbox: bool,
        /// Size of a volume made now, bytes; `None` is the runtime's default.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size_bytes: Option<u64>,
    },
}

/// A named volume, as `paddock volume ls` and `GET /v1/volumes` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamedVolume {
    pub name: String,
    pub size_bytes: u64,
    /// Bytes in use, when the runtime can tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    pub created_unix_ms: u64,
    /// Sandboxes that mount it now.
    pub used_by: Vec<crate::runtime::SandboxId>,
}

fn yes() -> bool {
    true
}

/// The most volumes one sandbox may mount.
pub const MAX_VOLUMES: usize = 32;

/// Mount paths that belong to the sandbox's own setup and cannot take a volume, at or below.
const RESERVED: &[&str] = &["/proc", "/sys", "/dev", "/run", "/workspace"];
/// Directories every sandbox gets fresh and writable: a volume may be mounted below one (the
/// mount point is made in it before anything runs), not on it.
pub const FRESH_DIRS: &[&str] = &["/tmp"];

fn err(message: impl Into<String>) -> SpecError {
    SpecError { field: "volumes", message: message.into() }
}

/// True for a DNS label: 1 to 63 of `a-z0-9-`, not starting or ending with `-`.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Checks a named volume's name: what becomes a directory (and a PVC's) name.
pub fn validate_volume_name(name: &str) -> Result<(), SpecError> {
    if is_dns_label(name) || (name.len() <= 253 && name.split('.').all(is_dns_label)) {
        Ok(())
    } else {
        Err(err(format!(
            "volume name {name:?} is not valid: use lowercase letters, digits, '-' and '.', at most 253 characters"
        )))
    }
}

/// Components of a relative path with no `.`, `..` or empty parts.
fn clean_relative(path: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = path.split('/').collect();
    let ok = !path.is_empty()
        && path.len() <= 4096
        && !path.contains('\0')
        && parts.iter().all(|p| !p.is_empty() && *p != "." && *p != ".." && p.len() <= 255);
    ok.then_some(parts)
}

fn under(path: &str, dir: &str) -> bool {
    path == dir || path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

impl VolumeMount {
    /// The mount path's components below `/`.
    pub fn target_components(&self) -> Vec<&str> {
        self.mount_path.trim_start_matches('/').split('/').collect()
    }

    fn validate(&self) -> Result<(), SpecError> {
        if !is_dns_label(&self.name) {
            return Err(err(format!(
                "{:?} is not a valid volume name: use a DNS label (lowercase letters, digits and '-')",
                self.name
            )));
        }
        let Some(rel) = self.mount_path.strip_prefix('/') else {
            return Err(err(format!("mountPath {:?} of {} must be an absolute path", self.mount_path, self.name)));
        };
        if clean_relative(rel).is_none() {
            return Err(err(format!(
                "mountPath {:?} of {} must be a normalized absolute path below / (no '.', '..' or '//')",
                self.mount_path, self.name
            )));
        }
        if let Some(r) = FRESH_DIRS.iter().find(|r| self.mount_path == **r) {
            return Err(err(format!(
                "mountPath {} of {} is the sandbox's own {r}: mount below it ({r}/logs) or under /mnt or /data",
                self.mount_path, self.name
            )));
        }
        if let Some(r) = RESERVED.iter().find(|r| under(&self.mount_path, r)) {
            return Err(err(format!(
                "mountPath {} of {} is at or below {r}, which the sandbox's own setup uses: mount under /mnt, /data or another new directory",
                self.mount_path, self.name
            )));
        }
        if let Some(sub) = &self.sub_path
            && clean_relative(sub.trim_end_matches('/')).is_none()
        {
            return Err(err(format!(
                "subPath {sub:?} of {} must be a relative path inside the volume, without '.' or '..'",
                self.name
            )));
        }
        match &self.source {
            VolumeSource::Host { path } => {
                if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
                    return Err(err(format!("host path {path:?} of {} must be an absolute path", self.name)));
                }
            }
            VolumeSource::Named { name, size_bytes, .. } => {
                validate_volume_name(name)?;
                if let Some(b) = size_bytes
                    && !(crate::spec::MIN_WORKSPACE..=crate::spec::MAX_WORKSPACE).contains(b)
                {
                    return Err(err(format!(
                        "the size of volume {name} is out of range: choose between {} and {}",
                        crate::units::format_bytes(crate::spec::MIN_WORKSPACE),
                        crate::units::format_bytes(crate::spec::MAX_WORKSPACE)
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Checks a sandbox's volumes together: each valid, names and mount paths distinct, no mount
/// path inside another (a volume cannot hold another's mount point).
pub fn validate_volumes(volumes: &[VolumeMount]) -> Result<(), SpecError> {
    if volumes.len() > MAX_VOLUMES {
        return Err(err(format!("{} volumes are too many: mount at most {MAX_VOLUMES}", volumes.len())));
    }
    for (i, v) in volumes.iter().enumerate() {
        v.validate()?;
        for w in &volumes[..i] {
            if w.name == v.name {
                return Err(err(format!("two volumes are named {}: give each its own name", v.name)));
            }
            if under(&v.mount_path, &w.mount_path) || under(&w.mount_path, &v.mount_path) {
                return Err(err(format!(
                    "volumes {} ({}) and {} ({}) overlap: mount each at its own path, neither inside the other",
                    w.name, w.mount_path, v.name, v.mount_path
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, at: &str) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: at.into(),
            read_only: false,
            sub_path: None,
            source: VolumeSource::Host { path: "/srv/data".into() },
        }
    }

    #[test]
    fn mount_paths_must_be_clean_absolute_and_outside_the_sandbox_setup() {
        assert!(validate_volumes(&[host("a", "/mnt/data"), host("b", "/data")]).is_ok());
        for bad in ["mnt", "/", "/mnt/../etc", "/mnt//x", "/mnt/./x", "/proc/x", "/workspace", "/tmp", "/dev"] {
            let e = validate_volumes(&[host("a", bad)]).unwrap_err();
            assert_eq!(e.field, "volumes", "{bad}");
        }
        assert!(validate_volumes(&[host("a", "/workspaces")]).is_ok(), "a prefix is not a parent");
        assert!(validate_volumes(&[host("a", "/tmp/opensandbox-e2e/logs")]).is_ok(), "below the fresh /tmp");
    }

    #[test]
    fn volumes_may_not_share_names_or_nest() {
        let e = validate_volumes(&[host("a", "/mnt/a"), host("a", "/mnt/b")]).unwrap_err();
        assert!(e.message.contains("two volumes"), "{e}");
        let e = validate_volumes(&[host("a", "/mnt/a"), host("b", "/mnt/a/b")]).unwrap_err();
        assert!(e.message.contains("overlap"), "{e}");
        assert!(validate_volumes(&[host("a", "/mnt/a"), host("b", "/mnt/ab")]).is_ok());
    }

    #[test]
    fn sub_paths_stay_inside_and_names_are_labels() {
        let mut v = host("a", "/mnt/a");
        for bad in ["../x", "/abs", "a/../../b", "", "a//b"] {
            v.sub_path = Some(bad.into());
            assert!(validate_volumes(std::slice::from_ref(&v)).is_err(), "{bad}");
        }
        v.sub_path = Some("datasets/train/".into());
        assert!(validate_volumes(std::slice::from_ref(&v)).is_ok());
        v.name = "Bad_Name".into();
        assert!(validate_volumes(&[v]).is_err());
        assert!(validate_volume_name("opensandbox-e2e-pvc-test").is_ok());
        assert!(validate_volume_name("../x").is_err());
        assert!(validate_volume_name("").is_err());
    }

    #[test]
    fn named_volumes_default_to_created_and_kept() {
        let v: VolumeSource = serde_json::from_str(r#"{"named": {"name": "data"}}"#).unwrap();
        assert_eq!(
            v,
            VolumeSource::Named { name: "data".into(), create: true, delete_with_sandbox: false, size_bytes: None }
        );
    }
}
