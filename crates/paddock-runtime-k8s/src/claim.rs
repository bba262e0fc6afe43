//! The claim model (agent-sandbox, as Hephaestus uses it): a sandbox is a `SandboxClaim` on a
//! `SandboxWarmPool` of a `SandboxTemplate`, one template and pool per profile (image, user,
//! resources). The controller hands the claim a pre-started Pod from the pool, or starts one
//! from the template when the pool is empty. Paddock then writes its labels and annotations
//! onto that Pod, so every other operation (exec, files, ports, list, renew, the reaper) treats
//! it as it treats a keeper Pod. Deletion goes through the claim, in the foreground, so a
//! deleted sandbox's Pod is gone when the call returns.
//!
//! The objects are built as JSON rather than typed: agent-sandbox publishes no Rust types,
//! and only a handful of fields are needed.

use std::collections::BTreeMap;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use paddock_core::runtime::SandboxId;
use paddock_core::spec::SandboxSpec;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::objects::{CREATED_ANNOTATION, EXPIRES_ANNOTATION, MANAGED_BY, SANDBOX_LABEL, SPEC_ANNOTATION};

pub const GROUP: &str = "extensions.agents.x-k8s.io";
pub const VERSION: &str = "v1beta1";
/// On a claimed Pod: the claim that owns it, so deleting the sandbox deletes the claim.
pub const CLAIM_ANNOTATION: &str = "paddock.dev/sandbox-claim";
/// On templates and pools: the profile's hash, so a pool never serves another profile.
pub const PROFILE_LABEL: &str = "paddock.dev/profile";
/// When a server last claimed from a profile (ms since the epoch), on its template: the reaper
/// deletes profiles idle for `KubeConfig::profile_idle`.
pub const LAST_USED_ANNOTATION: &str = "paddock.dev/last-used";

pub fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, VERSION, kind))
}

/// The name of a profile's template and pool: a hash of the Pod spec it starts, so equal
/// specs share one pool and a changed spec gets a new one instead of changing a live pool.
pub fn profile_name(pod_spec: &Value) -> String {
    let digest = Sha256::digest(pod_spec.to_string().as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("paddock-{hex}")
}

/// The claim of sandbox `id`: named after the id, so it never collides.
pub fn claim_name(id: &SandboxId) -> String {
    format!("paddock-{id}")
}

fn object(value: Value) -> Result<DynamicObject, serde_json::Error> {
    serde_json::from_value(value)
}

/// A profile's template. Its NetworkPolicy is given, with no rules: agent-sandbox's default
/// for a missing one allows the public internet, and a sandbox must reach nothing.
pub fn template(
    namespace: &str,
    name: &str,
    pod_spec: &Value,
    now_unix_ms: u64,
) -> Result<DynamicObject, serde_json::Error> {
    object(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "SandboxTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY: "paddock", PROFILE_LABEL: name},
            "annotations": {LAST_USED_ANNOTATION: now_unix_ms.to_string()},
        },
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {MANAGED_BY: "paddock"}},
                "spec": pod_spec,
            },
            "networkPolicyManagement": "Managed",
            "networkPolicy": {"ingress": [], "egress": []},
        },
    }))
}

pub fn warm_pool(namespace: &str, name: &str, replicas: u32) -> Result<DynamicObject, serde_json::Error> {
    object(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "SandboxWarmPool",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY: "paddock", PROFILE_LABEL: name},
        },
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": name}},
    }))
}

/// A sandbox's claim. It carries the sandbox's state too, so a claim whose Pod never got
/// Paddock's labels (a server killed in between) can still be found and reaped; and its
/// `shutdownTime` lets the controller delete an expired sandbox even when no server runs.
pub fn claim(
    namespace: &str,
    id: &SandboxId,
    pool: &str,
    spec: &SandboxSpec,
    created_unix_ms: u64,
    expires_unix_ms: Option<u64>,
) -> Result<DynamicObject, serde_json::Error> {
    let mut annotations = BTreeMap::from([
        (SPEC_ANNOTATION.to_owned(), serde_json::to_string(spec)?),
        (CREATED_ANNOTATION.to_owned(), created_unix_ms.to_string()),
    ]);
    let mut lifecycle = json!({"shutdownPolicy": "DeleteForeground"});
    if let Some(e) = expires_unix_ms {
        annotations.insert(EXPIRES_ANNOTATION.into(), e.to_string());
        lifecycle["shutdownTime"] = json!(rfc3339(e));
    }
    object(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "SandboxClaim",
        "metadata": {
            "name": claim_name(id),
            "namespace": namespace,
            "labels": {MANAGED_BY: "paddock", SANDBOX_LABEL: id.to_string()},
            "annotations": annotations,
        },
        "spec": {"warmPoolRef": {"name": pool}, "lifecycle": lifecycle},
    }))
}

/// When a profile's template was last used: its annotation, else its creation.
pub fn last_used(template: &DynamicObject) -> Option<u64> {
    let annotated = template.metadata.annotations.as_ref().and_then(|a| a.get(LAST_USED_ANNOTATION));
    annotated
        .and_then(|v| v.parse().ok())
        .or_else(|| template.metadata.creation_timestamp.as_ref().map(|t| t.0.as_millisecond().max(0).cast_unsigned()))
}

/// The pool a claim was made on.
pub fn pool_of(claim: &DynamicObject) -> Option<&str> {
    claim.data.pointer("/spec/warmPoolRef/name").and_then(Value::as_str)
}

/// The claim's `Ready` condition: `Some(true)` ready, `Some(false)` with a reason that will
/// not clear by waiting, `None` still in progress.
pub fn readiness(claim: &DynamicObject) -> (Option<bool>, String) {
    let conditions = claim.data.pointer("/status/conditions").and_then(Value::as_array);
    let ready = conditions.into_iter().flatten().find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"));
    let Some(ready) = ready else { return (None, "the controller has not picked the claim up yet".into()) };
    let reason = ready.get("reason").and_then(Value::as_str).unwrap_or_default();
    let message = ready.get("message").and_then(Value::as_str).unwrap_or_default();
    let why = format!("{reason}: {message}");
    match ready.get("status").and_then(Value::as_str) {
        Some("True") => (Some(true), why),
        // The controller refuses these for good; everything else (a pool its cache has not
        // seen yet included) is progress, bounded by the caller's deadline.
        _ if ["InvalidMetadata", "EnvVarsInjectionRejected", "VolumeClaimTemplatesError", "ClaimExpired"]
            .contains(&reason) =>
        {
            (Some(false), why)
        }
        _ => (None, why),
    }
}

/// The Pod a ready claim was given: the controller names it after the Sandbox.
pub fn pod_name(claim: &DynamicObject) -> Option<String> {
    claim.data.pointer("/status/sandbox/name").and_then(Value::as_str).map(str::to_owned)
}

/// RFC 3339 in UTC with second precision, as `metav1.Time` serialises.
pub fn rfc3339(unix_ms: u64) -> String {
    let secs = (unix_ms / 1000).cast_signed();
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm); no date crate needed
    // for one timestamp format.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_083_200_999), "2026-12-01T00:00:00Z");
        assert_eq!(rfc3339(4_102_444_799_000), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn profiles_are_named_by_content() {
        let a = profile_name(&json!({"containers": [{"image": "a"}]}));
        let b = profile_name(&json!({"containers": [{"image": "b"}]}));
        assert_ne!(a, b);
        assert_eq!(a, profile_name(&json!({"containers": [{"image": "a"}]})));
        assert!(a.starts_with("paddock-") && a.len() == "paddock-".len() + 12, "{a}");
    }

    #[test]
    fn template_denies_all_traffic_and_claim_deletes_in_the_foreground() {
        let t = template("ns", "paddock-abc", &json!({"containers": []}), 42).unwrap();
        assert_eq!(t.data["spec"]["networkPolicy"], json!({"ingress": [], "egress": []}));
        assert_eq!(last_used(&t), Some(42));
        assert_eq!(t.data["spec"]["networkPolicyManagement"], "Managed");
        let id = SandboxId::parse("sbx-0123456789ab").unwrap();
        let c = claim("ns", &id, "paddock-abc", &SandboxSpec::default(), 1, Some(1_796_083_200_000)).unwrap();
        assert_eq!(c.metadata.name.as_deref(), Some("paddock-sbx-0123456789ab"));
        assert_eq!(c.data["spec"]["warmPoolRef"]["name"], "paddock-abc");
        assert_eq!(c.data["spec"]["lifecycle"]["shutdownPolicy"], "DeleteForeground");
        assert_eq!(c.data["spec"]["lifecycle"]["shutdownTime"], "2026-12-01T00:00:00Z");
        assert_eq!(pool_of(&c), Some("paddock-abc"));
        let labels = c.metadata.labels.unwrap();
        assert_eq!(labels[SANDBOX_LABEL], "sbx-0123456789ab");
    }

    #[test]
    fn readiness_tells_progress_from_refusal() {
        let with = |status: &str, reason: &str| {
            let mut o = template("ns", "x", &json!({}), 0).unwrap();
            o.data["status"] =
                json!({"conditions": [{"type": "Ready", "status": status, "reason": reason, "message": "m"}]});
            o
        };
        assert_eq!(readiness(&with("True", "DependenciesReady")).0, Some(true));
        assert_eq!(readiness(&with("False", "SandboxNotReady")).0, None);
        assert_eq!(readiness(&with("False", "InvalidMetadata")).0, Some(false));
        assert_eq!(readiness(&with("False", "WarmPoolNotFound")).0, None);
        assert_eq!(readiness(&template("ns", "x", &json!({}), 0).unwrap()).0, None);
    }
}
