//! A sandbox's credential vault over HTTP, in OpenSandbox's place for it (the egress
//! sidecar's `/credential-vault`, port 18080 through `/sandboxes/{id}/proxy/18080`) and in
//! Paddock's own API (`/v1/sandboxes/{id}/credential-vault`). Values go in and never come out:
//! every answer is the vault's sanitized state. Changes are checked whole against the
//! sandbox's egress policy and answered only once the runtime put them in force.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use paddock_core::runtime::SandboxId;
use paddock_core::vault::{CreateRequest, MutationRequest, Vault, VaultError};
use serde_json::json;

use crate::api::{ApiJson, ApiPath, InSandbox};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Vault changes are read-modify-write: one at a time.
static CHANGES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/credential-vault", axum::routing::get(get_vault).post(create).patch(mutate).delete(delete))
        .route("/credential-vault/{part}", axum::routing::get(part))
        .route("/credential-vault/{part}/{name}", axum::routing::get(part))
}

/// `credentials` or `bindings` (`{part}`), and one of them by `{name}`.
#[derive(serde::Deserialize)]
struct Part {
    part: String,
    name: Option<String>,
}

impl Part {
    /// The part's key in the vault's state, or a 404 for a path that names neither.
    fn key(&self) -> ApiResult<&'static str> {
        match self.part.as_str() {
            "credentials" => Ok("credentials"),
            "bindings" => Ok("bindings"),
            other => Err(ApiError::not_found(format!(
                "no vault route …/credential-vault/{other}: use …/credentials or …/bindings"
            ))),
        }
    }
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

async fn current(state: &AppState, sid: SandboxId) -> ApiResult<(SandboxId, Option<Vault>)> {
    if !state.rt.capabilities().credential_vault {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "NOT_SUPPORTED", paddock_core::runtime::VAULT_UNSUPPORTED));
    }
    let vault = state.rt.vault(&sid).await?;
    Ok((sid, vault))
}

/// The sandbox's vault, which must exist.
async fn existing(state: &AppState, sid: SandboxId) -> ApiResult<(SandboxId, Vault)> {
    let (sid, vault) = current(state, sid).await?;
    let vault = vault.ok_or_else(|| no_vault(&sid))?;
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

async fn get_vault(State(state): State<AppState>, InSandbox(sid, _): InSandbox) -> ApiResult<Response> {
    let (_, vault) = existing(&state, sid).await?;
    Ok(axum::Json(vault.state()).into_response())
}

async fn create(
    State(state): State<AppState>,
    InSandbox(sid, _): InSandbox,
    ApiJson(req): ApiJson<CreateRequest>,
) -> ApiResult<Response> {
    let _one = CHANGES.lock().await;
    let (sid, vault) = current(&state, sid).await?;
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
    InSandbox(sid, _): InSandbox,
    ApiJson(req): ApiJson<MutationRequest>,
) -> ApiResult<Response> {
    let _one = CHANGES.lock().await;
    let (sid, vault) = existing(&state, sid).await?;
    let policy = state.rt.egress(&sid).await?.policy;
    let next = vault.mutate(req, &policy).map_err(refused)?;
    apply(&state, &sid, next.clone()).await?;
    Ok(axum::Json(next.state()).into_response())
}

async fn delete(State(state): State<AppState>, InSandbox(sid, _): InSandbox) -> ApiResult<Response> {
    let _one = CHANGES.lock().await;
    let (sid, vault) = current(&state, sid).await?;
    if vault.is_none() {
        return Err(no_vault(&sid));
    }
    state.rt.set_vault(&sid, None).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET …/credential-vault/credentials` or `…/bindings`: `{revision, <part>}`, one list of the
/// vault's sanitized state; with `/{name}`, one of them.
async fn part(
    State(state): State<AppState>,
    InSandbox(sid, _): InSandbox,
    ApiPath(part): ApiPath<Part>,
) -> ApiResult<Response> {
    let key = part.key()?;
    let (_, vault) = existing(&state, sid).await?;
    let Some(name) = part.name else {
        let s = vault.state();
        return Ok(axum::Json(json!({"revision": s["revision"], key: s[key]})).into_response());
    };
    let found = if key == "credentials" {
        vault.credential_state(&name)
    } else {
        vault.bindings.iter().find(|b| b.name == name).map(|b| vault.binding_state(b))
    };
    let what = key.trim_end_matches('s');
    let found = found.ok_or_else(|| ApiError::not_found(format!("{what} not found: {name}")))?;
    Ok(axum::Json(found).into_response())
}
