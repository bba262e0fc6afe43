//! A sandbox's credential vault over HTTP, in OpenSandbox's place for it (the egress
//! sidecar's `/credential-vault`, port 18080 through `/sandboxes/{id}/proxy/18080`) and in
//! Paddock's own API (`/v1/sandboxes/{id}/credential-vault`). Values go in and never come out:
//! every answer is the vault's sanitized state. Changes are checked whole against the
//! sandbox's egress policy and answered only once the runtime put them in force.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use paddock_core::runtime::SandboxId;
use paddock_core::vault::{CreateRequest, MutationRequest, Vault, VaultError};
use serde_json::json;

use crate::api::ApiJson;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Vault changes are read-modify-write: one at a time.
static CHANGES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/credential-vault", axum::routing::get(get_vault).post(create).patch(mutate).delete(delete))
        .route("/credential-vault/credentials", axum::routing::get(list_credentials))
        .route("/credential-vault/credentials/{name}", axum::routing::get(get_credential))
        .route("/credential-vault/bindings", axum::routing::get(list_bindings))
        .route("/credential-vault/bindings/{name}", axum::routing::get(get_binding))
}

fn id_of(p: &HashMap<String, String>) -> &str {
    p.get("id").map(String::as_str).unwrap_or_default()
}

fn no_vault(id: &SandboxId) -> ApiError {
    ApiError::not_found(format!("sandbox {id} has no credential vault: create one with POST …/credential-vault"))
}

pub(crate) fn refused(e: VaultError) -> ApiError {
    match e {
        VaultError::Invalid(m) => ApiError::bad_request(m),
        VaultError::NotFound(m) => ApiError::not_found(m),
        VaultError::Conflict(m) => ApiError::conflict(m),
    }
}

async fn current(state: &AppState, id: &str) -> ApiResult<(SandboxId, Option<Vault>)> {
    let (sid, _) = state.sandbox(id).await?;
    if !state.rt.capabilities().credential_vault {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "NOT_SUPPORTED", paddock_core::runtime::VAULT_UNSUPPORTED));
    }
    let vault = state.rt.vault(&sid).await?;
    Ok((sid, vault))
}

/// `412` for a vault that binds https hosts in a sandbox without the credential proxy.
pub(crate) fn proxy_disabled(sid: &str) -> ApiError {
    ApiError::new(
        StatusCode::PRECONDITION_FAILED,
        "CREDENTIAL_PROXY_DISABLED",
        format!(
            "sandbox {sid} was created without the credential proxy, so its https requests cannot be decrypted: bind the host over http, or create the sandbox with credentialProxy: {{enabled: true}}"
        ),
    )
}

/// Checks a new vault against what the sandbox can do and puts it in force.
async fn apply(state: &AppState, sid: &SandboxId, vault: Vault) -> ApiResult<()> {
    if vault.needs_credential_proxy() && !state.rt.get(sid).await?.spec.credential_proxy {
        return Err(proxy_disabled(sid.as_str()));
    }
    state.rt.set_vault(sid, Some(vault)).await?;
    Ok(())
}

async fn get_vault(State(state): State<AppState>, Path(p): Path<HashMap<String, String>>) -> ApiResult<Response> {
    let (sid, vault) = current(&state, id_of(&p)).await?;
    let vault = vault.ok_or_else(|| no_vault(&sid))?;
    Ok(axum::Json(vault.state()).into_response())
}

async fn create(
    State(state): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
    ApiJson(req): ApiJson<CreateRequest>,
) -> ApiResult<Response> {
    let _one = CHANGES.lock().await;
    let (sid, vault) = current(&state, id_of(&p)).await?;
    if vault.is_some() {
        return Err(ApiError::conflict(format!(
            "sandbox {sid} already has a credential vault: change it with PATCH, or DELETE it first"
        )));
    }
    let policy = state.rt.egress(&sid).await?.policy;
    let vault = Vault::create(req, &policy).map_err(refused)?;
    apply(&state, &sid, vault.clone()).await?;
    Ok((StatusCode::CREATED, axum::Json(vault.state())).into_response())
}

async fn mutate(
    State(state): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
    ApiJson(req): ApiJson<MutationRequest>,
) -> ApiResult<Response> {
    let _one = CHANGES.lock().await;
    let (sid, vault) = current(&state, id_of(&p)).await?;
    let vault = vault.ok_or_else(|| no_vault(&sid))?;
    let policy = state.rt.egress(&sid).await?.policy;
    let next = vault.mutate(req, &policy).map_err(refused)?;
    apply(&state, &sid, next.clone()).await?;
    Ok(axum::Json(next.state()).into_response())
}

async fn delete(State(state): State<AppState>, Path(p): Path<HashMap<String, String>>) -> ApiResult<Response> {
    let _one = CHANGES.lock().await;
    let (sid, vault) = current(&state, id_of(&p)).await?;
    if vault.is_none() {
        return Err(no_vault(&sid));
    }
    state.rt.set_vault(&sid, None).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `{revision, <key>}`: one list of the vault's sanitized state.
async fn listing(state: &AppState, id: &str, key: &str) -> ApiResult<Response> {
    let (sid, vault) = current(state, id).await?;
    let s = vault.ok_or_else(|| no_vault(&sid))?.state();
    Ok(axum::Json(json!({"revision": s["revision"], key: s[key]})).into_response())
}

async fn list_credentials(
    State(state): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
) -> ApiResult<Response> {
    listing(&state, id_of(&p), "credentials").await
}

async fn get_credential(State(state): State<AppState>, Path(p): Path<HashMap<String, String>>) -> ApiResult<Response> {
    let (sid, vault) = current(&state, id_of(&p)).await?;
    let vault = vault.ok_or_else(|| no_vault(&sid))?;
    let name = p.get("name").map(String::as_str).unwrap_or_default();
    let c = vault.credential_state(name).ok_or_else(|| ApiError::not_found(format!("credential not found: {name}")))?;
    Ok(axum::Json(c).into_response())
}

async fn list_bindings(State(state): State<AppState>, Path(p): Path<HashMap<String, String>>) -> ApiResult<Response> {
    listing(&state, id_of(&p), "bindings").await
}

async fn get_binding(State(state): State<AppState>, Path(p): Path<HashMap<String, String>>) -> ApiResult<Response> {
    let (sid, vault) = current(&state, id_of(&p)).await?;
    let vault = vault.ok_or_else(|| no_vault(&sid))?;
    let name = p.get("name").map(String::as_str).unwrap_or_default();
    let b = vault
        .bindings
        .iter()
        .find(|b| b.name == name)
        .ok_or_else(|| ApiError::not_found(format!("binding not found: {name}")))?;
    Ok(axum::Json(vault.binding_state(b)).into_response())
}
