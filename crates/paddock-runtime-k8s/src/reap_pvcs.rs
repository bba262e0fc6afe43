//! `paddock reap-pvcs`: workspaces nobody uses any more. A thread's PVC outlives its Pods on
//! purpose, so an abandoned thread leaves one behind for ever. Each run marks a managed PVC
//! that no Pod mounts with the time it was first seen unused, clears the mark of one that is
//! used again, and deletes one unused for longer than the TTL. The mark lives on the PVC, so
//! runs (a CronJob) need no state of their own.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use paddock_core::naming::NamingMode;
use paddock_core::runtime::RuntimeError;
use serde::Serialize;

use crate::objects::MANAGED_BY;

/// On a managed PVC no Pod uses: when a run first saw it unused (Unix ms).
pub const UNUSED_SINCE_ANNOTATION: &str = "paddock.dev/unused-since";

/// What one run did, PVC by PVC.
#[derive(Debug, Default, Serialize)]
pub struct PvcReport {
    /// Used by a Pod: kept (their stale marks cleared).
    pub in_use: Vec<String>,
    /// Unused, newly marked or still within the TTL.
    pub waiting: Vec<String>,
    /// Unused for longer than the TTL: deleted.
    pub deleted: Vec<String>,
}

/// The PVCs a Pod in the list mounts.
pub(crate) fn mounted(pods: &[Pod]) -> HashSet<String> {
    pods.iter()
        .filter_map(|p| p.spec.as_ref())
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()))
        .collect()
}

/// When a run first saw this PVC unused, if one did.
pub fn unused_since(pvc: &PersistentVolumeClaim) -> Option<u64> {
    pvc.metadata.annotations.as_ref()?.get(UNUSED_SINCE_ANNOTATION)?.parse().ok()
}

pub fn expired(since_ms: u64, now_ms: u64, ttl: Duration) -> bool {
    now_ms.saturating_sub(since_ms) > ttl.as_millis() as u64
}

impl crate::KubeRuntime {
    /// One reaper run over the namespace's PVCs made by Paddock (and Dawn's, in
    /// `dawn-compat` naming). Any API error but not-found ends the run with that error.
    pub async fn reap_pvcs(&self, ttl: Duration) -> Result<PvcReport, RuntimeError> {
        let managers = match self.config.naming {
            NamingMode::Hashed => "paddock",
            NamingMode::DawnCompat => "paddock,dawn",
        };
        let lp = ListParams::default().labels(&format!("{MANAGED_BY} in ({managers})"));
        let pvcs = self.claims.list(&lp).await.map_err(|e| crate::api_error("listing workspace PVCs", e))?.items;
        let pods = self.pods.list(&ListParams::default()).await.map_err(|e| crate::api_error("listing Pods", e))?;
        let used = mounted(&pods.items);
        let now = crate::now_ms();
        let mut report = PvcReport::default();
        for pvc in pvcs.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let name = pvc.metadata.name.clone().unwrap_or_default();
            let since = unused_since(pvc);
            if used.contains(&name) {
                if since.is_some() {
                    self.mark(&name, None).await?;
                }
                report.in_use.push(name);
                continue;
            }
            match since {
                None => {
                    self.mark(&name, Some(now)).await?;
                    report.waiting.push(name);
                }
                Some(s) if !expired(s, now, ttl) => report.waiting.push(name),
                Some(_) => {
                    // Look again right before deleting: an acquire may just have started a
                    // Pod on it.
                    let fresh = self
                        .pods
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| crate::api_error("listing Pods", e))?;
                    if mounted(&fresh.items).contains(&name) {
                        self.mark(&name, None).await?;
                        report.in_use.push(name);
                        continue;
                    }
                    // The uid precondition keeps a PVC re-created under the same name since
                    // the list (a new acquire of the thread) from being deleted.
                    let dp = DeleteParams {
                        preconditions: Some(kube::api::Preconditions {
                            uid: pvc.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    match self.claims.delete(&name, &dp).await {
                        Ok(_) => report.deleted.push(name),
                        Err(e) if crate::is_code(&e, 404) || crate::is_code(&e, 409) => {}
                        Err(e) => return Err(crate::api_error(&format!("deleting unused PVC {name}"), e)),
                    }
                }
            }
        }
        Ok(report)
    }

    /// Sets (`Some`) or clears (`None`) a PVC's unused-since mark.
    async fn mark(&self, name: &str, since: Option<u64>) -> Result<(), RuntimeError> {
        let value = since.map(|s| serde_json::Value::String(s.to_string())).unwrap_or(serde_json::Value::Null);
        let patch = serde_json::json!({"metadata": {"annotations": {UNUSED_SINCE_ANNOTATION: value}}});
        match self.claims.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(e) if crate::is_code(&e, 404) => Ok(()),
            Err(e) => Err(crate::api_error(&format!("marking PVC {name}"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ttl_counts_from_the_first_unused_sighting() {
        let ttl = Duration::from_secs(3600);
        assert!(!expired(1_000, 1_000 + 3_600_000, ttl), "exactly the TTL is not past it");
        assert!(expired(1_000, 1_001 + 3_600_000, ttl));
        assert!(!expired(5_000, 1_000, ttl), "a mark from a clock ahead of ours never expires early");
    }

    #[test]
    fn mounted_claims_are_found_in_pod_volumes() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [], "volumes": [
                {"name": "w", "persistentVolumeClaim": {"claimName": "paddock-vol-x"}},
                {"name": "t", "emptyDir": {}},
            ]},
        }))
        .unwrap();
        assert_eq!(mounted(&[pod]), HashSet::from(["paddock-vol-x".to_owned()]));
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "annotations": {UNUSED_SINCE_ANNOTATION: "42"}}
        }))
        .unwrap();
        assert_eq!(unused_since(&pvc), Some(42));
    }
}
