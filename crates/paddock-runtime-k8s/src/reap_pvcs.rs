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

/// Dawn's reaper's mark (Unix seconds), read in `dawn-compat` naming so that a migrated
/// workspace keeps the age Dawn gave it, and cleared with ours.
pub const DAWN_UNBOUND_SINCE: &str = "dawn.sh/unbound-since";

/// A mark's time in Unix ms, if it is one, judged as Dawn's reaper judges its own: digits only,
/// not starting with 0, and not in the future. Anything else is re-marked, so a mark of 0 never
/// deletes at once and one from a clock ahead never keeps a workspace for ever.
fn valid_mark(raw: &str, now_ms: u64, unit_ms: u64) -> Option<u64> {
    if raw.is_empty() || raw.starts_with('0') || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms = raw.parse::<u64>().ok()?.checked_mul(unit_ms)?;
    (ms <= now_ms).then_some(ms)
}

/// When a run first saw this PVC unused, if a valid mark says so: ours, or in `dawn-compat`
/// naming Dawn's, whichever is older.
pub fn unused_since(pvc: &PersistentVolumeClaim, now_ms: u64, naming: NamingMode) -> Option<u64> {
    let marks = pvc.metadata.annotations.as_ref()?;
    let ours = marks.get(UNUSED_SINCE_ANNOTATION).and_then(|v| valid_mark(v, now_ms, 1));
    let dawns = match naming {
        NamingMode::DawnCompat => marks.get(DAWN_UNBOUND_SINCE).and_then(|v| valid_mark(v, now_ms, 1000)),
        NamingMode::Hashed => None,
    };
    ours.into_iter().chain(dawns).min()
}

/// Whether a PVC carries any mark (valid or not), to clear when it is used again.
fn marked(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata
        .annotations
        .as_ref()
        .is_some_and(|m| m.contains_key(UNUSED_SINCE_ANNOTATION) || m.contains_key(DAWN_UNBOUND_SINCE))
}

pub fn expired(since_ms: u64, now_ms: u64, ttl: Duration) -> bool {
    now_ms.saturating_sub(since_ms) > paddock_core::units::millis(ttl)
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
            let since = unused_since(pvc, now, self.config.naming);
            if used.contains(&name) {
                if marked(pvc) {
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

    /// Sets (`Some`) or clears (`None`) a PVC's unused-since mark; clearing takes Dawn's too.
    async fn mark(&self, name: &str, since: Option<u64>) -> Result<(), RuntimeError> {
        let patch = match since {
            Some(s) => serde_json::json!({"metadata": {"annotations": {UNUSED_SINCE_ANNOTATION: s.to_string()}}}),
            None => {
                serde_json::json!({"metadata": {"annotations": {UNUSED_SINCE_ANNOTATION: null, DAWN_UNBOUND_SINCE: null}}})
            }
        };
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
        assert!(!expired(5_000, 1_000, ttl), "a mark ahead of now is not past the TTL (and is re-marked)");
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
        assert_eq!(unused_since(&pvc, 1_000, NamingMode::Hashed), Some(42));
    }

    fn with_marks(marks: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "c", "annotations": marks}})).unwrap()
    }

    #[test]
    fn invalid_marks_are_none_and_dawns_counts_in_dawn_compat() {
        let now = 1_700_000_000_000;
        for bad in ["0", "", "0123", "12a", "-5", " 42", "99999999999999999999999", "1800000000000"] {
            let pvc = with_marks(serde_json::json!({UNUSED_SINCE_ANNOTATION: bad}));
            assert_eq!(unused_since(&pvc, now, NamingMode::Hashed), None, "{bad:?} is no mark (re-marked)");
        }
        // Dawn's mark is seconds; only dawn-compat reads it, and the older of the two counts.
        let pvc =
            with_marks(serde_json::json!({DAWN_UNBOUND_SINCE: "1600000000", UNUSED_SINCE_ANNOTATION: "1650000000000"}));
        assert_eq!(unused_since(&pvc, now, NamingMode::DawnCompat), Some(1_600_000_000_000));
        assert_eq!(unused_since(&pvc, now, NamingMode::Hashed), Some(1_650_000_000_000));
        let dawn_only = with_marks(serde_json::json!({DAWN_UNBOUND_SINCE: "1600000000"}));
        assert_eq!(unused_since(&dawn_only, now, NamingMode::DawnCompat), Some(1_600_000_000_000));
        assert!(marked(&dawn_only), "a used PVC's Dawn mark is cleared too");
        let future = with_marks(serde_json::json!({DAWN_UNBOUND_SINCE: "1800000000"}));
        assert_eq!(unused_since(&future, now, NamingMode::DawnCompat), None, "a mark in the future is re-marked");
    }
}
