//! A sandbox's egress policy over HTTP, in OpenSandbox's two places for it: the egress
//! sidecar's `/policy` (port 18080, reached through `/sandboxes/{id}/proxy/18080`) and the
//! lifecycle server's `/sandboxes/{id}/networkpolicy`. Both answer a `PolicyStatusResponse`;
//! PATCH takes rules (new ones first, one per target), DELETE takes targets, PUT/POST replace
//! the whole policy. Paddock's own `GET /v1/sandboxes/{id}/egress` adds the counters and the
//! newest denials.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use paddock_core::egress::{EgressPolicy, EgressRule, EgressStatus, Enforcement};
use serde_json::{Value, json};

use crate::api::{ApiJson, InSandbox};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// OpenSandbox's `PolicyStatusResponse`.
fn policy_status(s: &EgressStatus) -> Value {
    let reason = match (s.policy.mode(), s.enforcement) {
        ("deny_all", Enforcement::NetworkNamespace) => {
            "the sandbox's network namespace has only loopback: no egress, no DNS"
        }
        ("deny_all", _) => "every connection and DNS query is denied",
        ("allow_all", _) => {
            "everything is allowed but the addresses no sandbox may reach (this host, link-local and metadata, private ranges the operator did not allow)"
        }
        _ => "DNS is answered and TCP connections are dialed by Paddock according to the rules",
    };
    json!({
        "status": "ok",
        "mode": s.policy.mode(),
        "enforcementMode": s.enforcement,
        "reason": reason,
        "policy": s.policy,
    })
}

async fn current(
    state: &AppState,
    sid: paddock_core::runtime::SandboxId,
) -> ApiResult<(paddock_core::runtime::SandboxId, EgressStatus)> {
    let status = state.rt.egress(&sid).await?;
    Ok((sid, status))
}

async fn set(state: &AppState, sid: &paddock_core::runtime::SandboxId, policy: EgressPolicy) -> ApiResult<Response> {
    let policy = policy.validated().map_err(ApiError::bad_request)?;
    let status = state.rt.set_egress(sid, policy).await?;
    Ok(axum::Json(policy_status(&status)).into_response())
}

/// GET, PUT/POST, PATCH and DELETE of a policy, the same in both places.
pub fn policy_routes() -> axum::routing::MethodRouter<AppState> {
    axum::routing::get(get_policy).put(replace).post(replace).patch(patch_rules).delete(delete_rules)
}

pub async fn get_policy(State(state): State<AppState>, InSandbox(sid, _): InSandbox) -> ApiResult<Response> {
    let (_, status) = current(&state, sid).await?;
    Ok(axum::Json(policy_status(&status)).into_response())
}

pub async fn replace(
    State(state): State<AppState>,
    InSandbox(sid, _): InSandbox,
    ApiJson(policy): ApiJson<EgressPolicy>,
) -> ApiResult<Response> {
    set(&state, &sid, policy).await
}

pub async fn patch_rules(
    State(state): State<AppState>,
    InSandbox(sid, _): InSandbox,
    ApiJson(rules): ApiJson<Vec<EgressRule>>,
) -> ApiResult<Response> {
    let (sid, status) = current(&state, sid).await?;
    set(&state, &sid, status.policy.patched(&rules)).await
}

pub async fn delete_rules(
    State(state): State<AppState>,
    InSandbox(sid, _): InSandbox,
    ApiJson(targets): ApiJson<Vec<String>>,
) -> ApiResult<Response> {
    let (sid, status) = current(&state, sid).await?;
    let (policy, removed) = status.policy.without(&targets);
    if removed == 0 {
        // Idempotent, as OpenSandbox's sidecar: nothing changes, and the reply says so.
        let mut body = policy_status(&status);
        body["reason"] = json!("no matching targets found");
        return Ok(axum::Json(body).into_response());
    }
    set(&state, &sid, policy).await
}

/// `GET /v1/sandboxes/{id}/egress`: the policy, how it is enforced, what was counted and the
/// newest denials (oldest first).
pub async fn status(State(state): State<AppState>, InSandbox(sid, _): InSandbox) -> ApiResult<Response> {
    let (_, status) = current(&state, sid).await?;
    Ok(axum::Json(status).into_response())
}

/// Copies every running sandbox's egress counters into `/metrics` (asked of all at once,
/// each for at most a second: a stuck enforcer must not stall the scrape).
pub async fn refresh_metrics(state: &AppState) {
    let Ok(rows) = state.store.list().await else { return };
    let mut asks = tokio::task::JoinSet::new();
    for row in rows.into_iter().filter(|r| r.state == crate::store::LifecycleState::Running) {
        let Ok(sid) = paddock_core::runtime::SandboxId::parse(&row.id) else { continue };
        let rt = state.rt.clone();
        asks.spawn(async move {
            let m = tokio::time::timeout(std::time::Duration::from_secs(1), rt.metrics(&sid)).await;
            (sid, m.ok().and_then(Result::ok).and_then(|m| m.egress))
        });
    }
    let m = &state.metrics;
    m.egress_connections.clear();
    m.egress_dns.clear();
    while let Some(answer) = asks.join_next().await {
        let Ok((sid, Some(c))) = answer else { continue };
        let label = |verdict: &str| crate::metrics::EgressLabel { sandbox: sid.to_string(), verdict: verdict.into() };
        m.egress_connections.get_or_create(&label("allowed")).inc_by(c.connections_allowed);
        m.egress_connections.get_or_create(&label("denied")).inc_by(c.connections_denied);
        m.egress_dns.get_or_create(&label("allowed")).inc_by(c.dns_allowed);
        m.egress_dns.get_or_create(&label("denied")).inc_by(c.dns_denied);
    }
}
