//! The OpenSandbox lifecycle API (`/sandboxes...`) and Paddock's workspace API
//! (`/workspaces...`), over a runtime and the SQLite store.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, patch, post};
use paddock_core::naming::ThreadId;
use paddock_core::runtime::{RuntimeError, SandboxInfo, SandboxState};
use paddock_core::spec::SandboxSpec;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api::{ApiJson, ApiPath, InSandbox, SANDBOX_TOKEN_HEADER};
use crate::error::{ApiError, ApiResult};
use crate::execd::ENTRYPOINT_EXITED;
use crate::state::AppState;
use crate::store::{LifecycleState, SandboxRow, now_ms};
use crate::tenants::{TENANT_LABEL, Tenant, scoped, unscoped};
use crate::time_fmt::{parse_rfc3339, rfc3339};

/// What a sandbox runs when the request names no entrypoint: nothing, forever.
const DEFAULT_ENTRYPOINT: [&str; 3] = ["tail", "-f", "/dev/null"];

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(remove))
        .route("/sandboxes/{id}/metadata", patch(patch_metadata))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/renew-expiration", post(renew))
        .route("/sandboxes/{id}/endpoints/{port}", get(endpoint))
        .route("/sandboxes/{id}/diagnostics/logs", get(diagnostic_logs))
        .route("/sandboxes/{id}/diagnostics/events", get(diagnostic_events))
        .route("/metrics/events", post(|| async { StatusCode::NO_CONTENT }))
        .route("/workspaces/{thread}/acquire", post(acquire))
        .route("/workspaces/{thread}/release", post(release))
        .route("/workspaces/{thread}", delete(destroy_workspace))
        .route("/capabilities", get(capabilities))
        .route("/volumes", get(list_volumes))
        .route("/volumes/{name}", delete(delete_volume))
        .route("/sandboxes/{id}/snapshots", any(not_served))
        .route("/snapshots", any(not_served))
        .route("/snapshots/{id}", any(not_served))
        .route("/sandboxes/{id}/networkpolicy", crate::egress::policy_routes())
        .route("/sandboxes/{id}/egress", get(crate::egress::status))
        .nest("/sandboxes/{id}", crate::vault::routes())
        .route("/sandboxes/{id}/tickets", post(crate::routes::issue_ticket))
        .route("/sandboxes/{id}/signatures/revoke", post(crate::routes::revoke_signatures))
        .route("/templates", any(not_served))
        .route("/templates/{id}", any(not_served))
        .route("/pools", any(not_served))
        .route("/pools/{name}", any(not_served))
}

/// `GET /v1/openapi.json` (and `/openapi.json`): served without the key, like `/health`.
pub fn public_router() -> Router<AppState> {
    Router::new().route("/openapi.json", get(openapi))
}

/// `GET /v1/capabilities`: what the runtime behind this server supports, so clients and tests
/// ask instead of assuming (pause, persistent workspaces, images, network modes, metrics).
async fn capabilities(State(state): State<AppState>) -> axum::Json<paddock_core::runtime::Capabilities> {
    axum::Json(state.rt.capabilities())
}

/// `GET /v1/volumes`: the named volumes the runtime keeps (OpenSandbox's `pvc` volumes).
async fn list_volumes(
    State(state): State<AppState>,
    tenant: Tenant,
) -> ApiResult<axum::Json<Vec<paddock_core::volume::NamedVolume>>> {
    let mine = state
        .rt
        .volumes()
        .await?
        .into_iter()
        .filter_map(|mut v| {
            v.name = unscoped(&tenant, &v.name)?.to_owned();
            Some(v)
        })
        .collect();
    Ok(axum::Json(mine))
}

/// `DELETE /v1/volumes/{name}`: deletes a named volume and its files; 409 while mounted.
async fn delete_volume(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    paddock_core::volume::validate_volume_name(&name).map_err(|e| ApiError::bad_request(e.message))?;
    crate::tenants::check_user_name("volume", &name)?;
    state.rt.delete_volume(&scoped(&tenant, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// OpenSandbox lifecycle routes Paddock does not implement, as the paths they are served at.
const NOT_SERVED: [(&str, &str); 7] = [
    (
        "/sandboxes/{id}/snapshots",
        "snapshots are not supported: a persistent workspace (extensions.workspace, or /v1/workspaces) keeps /workspace across sandboxes",
    ),
    (
        "/snapshots",
        "snapshots are not supported: a persistent workspace (extensions.workspace, or /v1/workspaces) keeps /workspace across sandboxes",
    ),
    (
        "/snapshots/{id}",
        "snapshots are not supported: a persistent workspace (extensions.workspace, or /v1/workspaces) keeps /workspace across sandboxes",
    ),
    ("/templates", "templates are not supported: create sandboxes from an image"),
    ("/templates/{id}", "templates are not supported: create sandboxes from an image"),
    ("/pools", "pools are not supported: sandboxes start in milliseconds, so create them on demand"),
    ("/pools/{name}", "pools are not supported: sandboxes start in milliseconds, so create them on demand"),
];

/// `501 NOT_SUPPORTED` for a lifecycle route Paddock does not implement: an honest answer
/// instead of a 404 that reads like a wrong id.
async fn not_served(method: axum::http::Method, matched: axum::extract::MatchedPath) -> ApiError {
    let route = matched.as_str();
    let route = route.strip_prefix("/v1").unwrap_or(route);
    let what = NOT_SERVED.iter().find(|(p, _)| *p == route).map_or("not supported by Paddock", |(_, w)| w);
    crate::execd::not_supported(&method, route, what.to_owned())
}

// ---------------------------------------------------------------------------------------------
// Wire types

/// The body of a create, and of a workspace acquire (which names the workspace in its path).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSandboxRequest {
    image: Option<ImageSpec>,
    snapshot_id: Option<String>,
    template_id: Option<String>,
    platform: Option<Platform>,
    /// Absent: the server's default session length. `null`: no expiry, until deleted (when the
    /// server allows it). A number: that many seconds, at least 60, at most the maximum.
    #[serde(default, deserialize_with = "explicit_null")]
    timeout: Option<Option<i64>>,
    #[serde(default)]
    resource_limits: BTreeMap<String, String>,
    #[serde(default)]
    resource_requests: BTreeMap<String, String>,
    #[serde(default)]
    env: BTreeMap<String, Option<String>>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    lifecycle: Option<Value>,
    entrypoint: Option<Vec<String>>,
    network_policy: Option<paddock_core::egress::EgressPolicy>,
    credential_proxy: Option<CredentialProxy>,
    /// Paddock's: the credential vault the sandbox starts with (as `POST …/credential-vault`).
    credential_vault: Option<paddock_core::vault::CreateRequest>,
    #[serde(default)]
    secure_access: bool,
    #[serde(default)]
    volumes: Vec<ApiVolume>,
    #[serde(default)]
    extensions: BTreeMap<String, String>,
}

/// OpenSandbox's `Volume`: exactly one of `host`, `pvc`, `ossfs`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApiVolume {
    name: String,
    mount_path: String,
    #[serde(default)]
    read_only: Option<bool>,
    sub_path: Option<String>,
    host: Option<HostVolume>,
    pvc: Option<PvcVolume>,
    ossfs: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostVolume {
    path: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PvcVolume {
    claim_name: String,
    create_if_not_exists: Option<bool>,
    delete_on_sandbox_termination: Option<bool>,
    storage_class: Option<String>,
    storage: Option<String>,
    access_modes: Option<Vec<String>>,
}

impl ApiVolume {
    fn mount(self, tenant: &Tenant) -> ApiResult<paddock_core::volume::VolumeMount> {
        use paddock_core::volume::{VolumeMount, VolumeSource};
        let name = self.name;
        let source = match (self.host, self.pvc, self.ossfs) {
            // A host path is the operator's to share; a tenant reaches only what is its own.
            (Some(_), None, None) if !tenant.is_default() => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "HOST_VOLUME_FORBIDDEN",
                    format!(
                        "volume {name}: host paths may be mounted with the server's own key only; a tenant uses named volumes (pvc)"
                    ),
                ));
            }
            (Some(h), None, None) => VolumeSource::Host { path: h.path },
            (None, Some(p), None) => {
                if p.storage_class.is_some() {
                    return Err(ApiError::bad_request(format!(
                        "volume {name}: storageClass is not supported: named volumes have one kind of storage here; leave it out"
                    )));
                }
                if let Some(modes) = &p.access_modes
                    && let Some(m) = modes.iter().find(|m| {
                        !["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany", "ReadWriteOncePod"].contains(&m.as_str())
                    })
                {
                    return Err(ApiError::bad_request(format!("volume {name}: {m:?} is not an access mode")));
                }
                let size_bytes = p
                    .storage
                    .as_deref()
                    .map(|s| crate::resources::bytes(&format!("volume {name}: storage"), s))
                    .transpose()?;
                crate::tenants::check_user_name(&format!("volume {name}: claimName"), &p.claim_name)?;
                VolumeSource::Named {
                    name: scoped(tenant, &p.claim_name),
                    create: p.create_if_not_exists.unwrap_or(true),
                    delete_with_sandbox: p.delete_on_sandbox_termination.unwrap_or(false),
                    size_bytes,
                }
            }
            (None, None, Some(_)) => return Err(unsupported("mounting OSS buckets (ossfs volumes)")),
            _ => {
                return Err(ApiError::bad_request(format!("volume {name}: give exactly one of host, pvc and ossfs")));
            }
        };
        Ok(VolumeMount {
            name,
            mount_path: self.mount_path,
            read_only: self.read_only.unwrap_or(false),
            sub_path: self.sub_path,
            source,
        })
    }
}

/// Tells an explicit `null` (`Some(None)`) from an absent field (`None`).
fn explicit_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
    Option::<i64>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageSpec {
    uri: String,
    /// Registry credentials for a private image: given to the runtime for this create only,
    /// never stored.
    auth: Option<ImageAuth>,
}

#[derive(Debug, Deserialize)]
struct ImageAuth {
    username: String,
    password: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Platform {
    os: Option<String>,
    arch: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialProxy {
    #[serde(default)]
    enabled: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    last_transition_at: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SandboxJson {
    id: String,
    status: Status,
    entrypoint: Vec<String>,
    created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
    image: Value,
    metadata: BTreeMap<String, String>,
    extensions: BTreeMap<String, String>,
    platform: Value,
}

fn sandbox_json(row: &SandboxRow) -> SandboxJson {
    SandboxJson {
        id: row.id.clone(),
        status: Status {
            state: row.state.as_str().to_owned(),
            reason: row.reason.clone(),
            message: row.message.clone(),
            last_transition_at: rfc3339(row.updated_at_ms),
        },
        entrypoint: row.entrypoint.clone(),
        created_at: rfc3339(row.created_at_ms),
        expires_at: row.expires_at_ms.map(rfc3339),
        image: json!({ "uri": row.image }),
        metadata: row.metadata.clone(),
        extensions: row.extensions.clone(),
        platform: json!({ "os": "linux", "arch": host_arch() }),
    }
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

// ---------------------------------------------------------------------------------------------
// Request → spec

fn unsupported(what: &str) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::BAD_REQUEST,
        "NOT_SUPPORTED",
        format!("{what} is not supported by Paddock yet"),
    )
}

struct Planned {
    spec: paddock_core::spec::ValidatedSpec,
    image: String,
    /// `None`: the image's own command, else [`DEFAULT_ENTRYPOINT`].
    entrypoint: Option<Vec<String>>,
    thread: Option<ThreadId>,
}

fn plan(state: &AppState, tenant: &Tenant, req: CreateSandboxRequest) -> ApiResult<Planned> {
    if req.snapshot_id.is_some() {
        return Err(unsupported("restoring from a snapshot (snapshotId)"));
    }
    if req.template_id.is_some() {
        return Err(unsupported("creating from a template (templateId)"));
    }
    if req.lifecycle.is_some() {
        return Err(unsupported("lifecycle hooks"));
    }
    let credential_proxy = req.credential_proxy.is_some_and(|c| c.enabled);
    if credential_proxy && !state.rt.capabilities().credential_vault {
        return Err(ApiError::bad_request(format!("credentialProxy: {}", paddock_core::runtime::VAULT_UNSUPPORTED)));
    }
    if req.secure_access {
        return Err(unsupported("secureAccess (ingress gateway)"));
    }
    if let Some(p) = &req.platform {
        let os_ok = p.os.as_deref().is_none_or(|o| o == "linux");
        let arch_ok = p.arch.as_deref().is_none_or(|a| a == host_arch());
        if !os_ok || !arch_ok {
            return Err(ApiError::bad_request(format!(
                "this host runs linux/{}: a sandbox cannot have another platform",
                host_arch()
            )));
        }
    }
    let network = match req.network_policy {
        None => state.config.default_network.clone(),
        Some(np) => crate::resources::network_of(np)?,
    };
    // The runtime resolves the image and says in its own words what it cannot run.
    let image_auth = req
        .image
        .as_ref()
        .and_then(|i| i.auth.as_ref())
        .map(|a| paddock_core::spec::RegistryAuth { username: a.username.clone(), password: a.password.clone() });
    let image_ref = req.image.map(|i| i.uri);
    let image = image_ref.clone().unwrap_or_else(|| "default".into());
    let max = state.config.max_timeout.as_secs();
    let timeout_secs = match req.timeout {
        None => match state.config.default_timeout {
            Some(d) => Some(d.as_secs()),
            // OpenSandbox's schema: an omitted timeout is no expiry.
            None if state.config.allow_no_expiry => None,
            None => {
                return Err(ApiError::bad_request(format!(
                    "give a timeout (at most {max}s): this server allows no sandbox without expiry, and has no --default-timeout"
                )));
            }
        },
        Some(None) if state.config.allow_no_expiry => None,
        Some(None) => {
            return Err(ApiError::bad_request(format!(
                "timeout null (no expiry) is not allowed by this server: give a timeout of at most {max}s, or have its operator start it with --allow-no-expiry true"
            )));
        }
        Some(Some(t)) if t < 60 => {
            return Err(ApiError::bad_request(format!("timeout {t}s is below the minimum of 60s")));
        }
        Some(Some(t)) if t.cast_unsigned() > max => {
            return Err(ApiError::bad_request(format!(
                "timeout {t}s is above this server's maximum session length of {max}s: ask for less, or have its operator raise it with --max-timeout"
            )));
        }
        Some(Some(t)) => Some(t.cast_unsigned()),
    };
    let mut spec =
        SandboxSpec { image: image_ref, timeout_secs, image_auth, network, credential_proxy, ..Default::default() };
    spec.resources.workspace_bytes = state.config.workspace_bytes;
    spec.resources.workspace_inodes = state.config.workspace_inodes;
    let pids = req.resource_requests.iter().filter(|(k, _)| k.as_str() == "pids");
    crate::resources::apply(&mut spec, req.resource_limits.iter().chain(pids))?;
    spec.env = req.env.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
    // The model route: every sandbox reaches it through the gateway, and the caller's own
    // variables of the same names win. Where the gateway cannot tell sandboxes apart (Pods
    // dial it directly), only runs' sandboxes, whose token names them, get it.
    let caps = state.rt.capabilities();
    if caps.gateway && caps.gateway_names_sandbox {
        let vars = state.models.sandbox_env(tenant);
        if !vars.is_empty() {
            spec.gateway = state.runs.gateway_addr();
            spec.gateway_secret = Some(paddock_core::spec::GatewaySecret(state.token_key.gateway_secret()));
        }
        for (k, v) in vars {
            spec.env.entry(k).or_insert(v);
        }
    }
    validate_metadata(&req.metadata)?;
    spec.volumes = req.volumes.into_iter().map(|v| v.mount(tenant)).collect::<ApiResult<_>>()?;
    spec.labels = req.metadata;
    if !tenant.is_default() {
        spec.labels.insert(TENANT_LABEL.to_owned(), tenant.as_str().to_owned());
    }
    // Marks the sandbox as the API's, so that a reconcile never adopts it while its row is
    // being written (see `adopt`). Users cannot set it: `paddock.dev/` is reserved.
    spec.labels.insert(ORIGIN_LABEL.to_owned(), "api".to_owned());
    spec.labels.insert(BOOT_LABEL.to_owned(), state.boot.id().to_owned());
    // The one check of the spec: runtimes take it as it is.
    let spec = spec.validated().map_err(|e| ApiError::bad_request(e.to_string()))?;
    for key in req.extensions.keys() {
        if !KNOWN_EXTENSIONS.contains(&key.as_str()) {
            return Err(ApiError::bad_request(format!(
                "extensions.{key} is not supported: Paddock understands {}",
                KNOWN_EXTENSIONS.join(" and ")
            )));
        }
    }
    if let Some(v) = req.extensions.get(RENEW_ON_ACCESS) {
        let secs: u64 = v.trim().parse().map_err(|_| {
            ApiError::bad_request(format!("extensions.{RENEW_ON_ACCESS} {v:?} is not a whole number of seconds"))
        })?;
        if secs < 1 || secs > state.config.max_timeout.as_secs() {
            return Err(ApiError::bad_request(format!(
                "extensions.{RENEW_ON_ACCESS} must be from 1 to {} seconds (--max-timeout)",
                state.config.max_timeout.as_secs()
            )));
        }
        if timeout_secs.is_none() {
            return Err(ApiError::bad_request(format!(
                "extensions.{RENEW_ON_ACCESS} extends an expiry on access, and this sandbox has none (timeout null): give a timeout, or leave the extension out"
            )));
        }
    }
    let thread = req
        .extensions
        .get("workspace")
        .map(|t| {
            ThreadId::new(t.as_str()).map_err(|e| ApiError::bad_request(format!("extensions.workspace: {e}")))?;
            crate::tenants::check_user_name("extensions.workspace", t)?;
            ThreadId::new(scoped(tenant, t)).map_err(|e| ApiError::bad_request(format!("extensions.workspace: {e}")))
        })
        .transpose()?;
    let entrypoint = req.entrypoint;
    if entrypoint.as_ref().is_some_and(|e| e.is_empty() || e[0].is_empty()) {
        return Err(ApiError::bad_request("entrypoint must name a program, e.g. [\"tail\",\"-f\",\"/dev/null\"]"));
    }
    Ok(Planned { spec, image, entrypoint, thread })
}

/// Metadata follows Kubernetes label rules, so it can become labels on the Kubernetes runtime.
fn validate_metadata(m: &BTreeMap<String, String>) -> ApiResult<()> {
    for (k, v) in m {
        let name = k.rsplit('/').next().unwrap_or(k);
        let label_ok = |s: &str| {
            s.len() <= 63
                && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && s.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
                && s.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
        };
        if name.is_empty() || !label_ok(name) || k.len() > 253 {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_METADATA_FORMAT",
                format!("metadata key {k:?} is not a valid label key: use up to 63 letters, digits, '-', '_' or '.'"),
            ));
        }
        if k.starts_with("opensandbox.io/") || k.starts_with("paddock.dev/") {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_METADATA_FORMAT",
                format!("metadata key {k:?} uses a reserved prefix"),
            ));
        }
        if !label_ok(v) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_METADATA_FORMAT",
                format!(
                    "metadata value {v:?} of {k:?} is not a valid label value: up to 63 letters, digits, '-', '_' or '.'"
                ),
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Handlers

async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiJson(mut req): ApiJson<CreateSandboxRequest>,
) -> ApiResult<Response> {
    if state.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::unavailable(
            "the server is shutting down and creates no new sandboxes: retry on another server",
        ));
    }
    let started = Instant::now();
    let vault = vault_given(&mut req)?;
    let extensions = req.extensions.clone();
    let planned = plan(&state, &tenant, req)?;
    let vault = vault.map(|v| vault_for(&state, &planned, v)).transpose()?;
    let reservation = reserve(&state, &tenant, &planned).await?;
    // In a task of its own: a client that goes away mid-create must not leave a sandbox the
    // runtime made and the store never heard of.
    let made = tokio::spawn({
        let state = state.clone();
        async move {
            let info = match &planned.thread {
                Some(t) => state.rt.acquire(t, planned.spec.clone()).await?,
                None => state.rt.create(planned.spec.clone()).await?,
            };
            let row = record(&state, &info, &planned, extensions, &tenant).await;
            drop(reservation);
            match vault {
                Some(v) => install_vault(&state, row?, v).await,
                None => row,
            }
        }
    });
    let row = made.await.map_err(|e| ApiError::internal(format!("creating the sandbox failed: {e}")))??;
    state.metrics.create_seconds.observe(started.elapsed().as_secs_f64());
    let mut response = (StatusCode::ACCEPTED, axum::Json(sandbox_json(&row))).into_response();
    if let Ok(v) = format!("/v1/sandboxes/{}", row.id).parse() {
        response.headers_mut().insert(header::LOCATION, v);
    }
    Ok(response)
}

/// The vault a create gives: Paddock's `credentialVault` field, or the same JSON in
/// `extensions["paddock.credentialVault"]`, taken out of the request so that no value is kept
/// with the sandbox's extensions.
fn vault_given(req: &mut CreateSandboxRequest) -> ApiResult<Option<paddock_core::vault::CreateRequest>> {
    match (req.credential_vault.take(), req.extensions.remove(VAULT_EXTENSION)) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(format!(
            "give the credential vault in credentialVault or in extensions.{VAULT_EXTENSION}, not both"
        ))),
        (Some(v), None) => Ok(Some(v)),
        (None, Some(text)) => serde_json::from_str(&text).map(Some).map_err(|e| {
            ApiError::bad_request(format!(
                "extensions.{VAULT_EXTENSION} is not a credential vault ({e}): give {{\"credentials\": [...], \"bindings\": [...]}} as a JSON string"
            ))
        }),
        (None, None) => Ok(None),
    }
}

/// Checks a vault given at create against the planned sandbox, before anything is made.
fn vault_for(
    state: &AppState,
    planned: &Planned,
    req: paddock_core::vault::CreateRequest,
) -> ApiResult<paddock_core::vault::Vault> {
    if !state.rt.capabilities().credential_vault {
        return Err(ApiError::bad_request(format!("credentialVault: {}", paddock_core::runtime::VAULT_UNSUPPORTED)));
    }
    let vault =
        paddock_core::vault::Vault::create(req, &planned.spec.network.policy()).map_err(crate::vault::refused)?;
    if vault.needs_credential_proxy() && !planned.spec.credential_proxy {
        return Err(crate::vault::proxy_disabled("being created"));
    }
    Ok(vault)
}

/// Puts a create's vault in force; a sandbox whose vault cannot be is not left behind.
async fn install_vault(state: &AppState, row: SandboxRow, vault: paddock_core::vault::Vault) -> ApiResult<SandboxRow> {
    let sid = paddock_core::runtime::SandboxId::parse(&row.id)
        .map_err(|e| ApiError::internal(format!("the new sandbox's id {}: {e}", row.id)))?;
    if let Err(e) = state.rt.set_vault(&sid, Some(vault)).await {
        let _ = state.rt.destroy(&sid).await;
        state.commands.forget_sandbox(&row.id);
        state.store.delete(&row.id).await?;
        let e = ApiError::from(e);
        return Err(ApiError { message: format!("the credential vault could not be set: {}", e.message), ..e });
    }
    Ok(row)
}

/// Room for one more sandbox in the tenant's quotas (`tenants`), held until its row exists.
/// Reattaching to a thread's running sandbox makes none, so it needs none.
async fn reserve(
    state: &AppState,
    tenant: &Tenant,
    planned: &Planned,
) -> ApiResult<Option<crate::tenants::Reservation>> {
    let quotas = state.tenants.quotas(tenant);
    if quotas.sandboxes.is_none() && quotas.memory_bytes.is_none() {
        return Ok(None);
    }
    if let Some(t) = &planned.thread {
        let live = state.store.list().await?.into_iter().any(|r| {
            r.tenant == tenant.as_str()
                && matches!(r.state, LifecycleState::Running | LifecycleState::Paused)
                && r.extensions.get("workspace").map(|w| scoped(tenant, w)).as_deref() == Some(t.as_str())
        });
        if live {
            return Ok(None);
        }
    }
    let held = state.store.held_by(tenant.as_str()).await?;
    match state.tenants.reserve(tenant, held, planned.spec.resources.memory_bytes) {
        Ok(r) => Ok(Some(r)),
        Err((quota, e)) => {
            state.tenants.refused(tenant, quota);
            Err(e)
        }
    }
}

/// Stores a new sandbox (or returns the row of a reattached one) and starts its entrypoint.
async fn record(
    state: &AppState,
    info: &SandboxInfo,
    planned: &Planned,
    extensions: BTreeMap<String, String>,
    tenant: &Tenant,
) -> ApiResult<SandboxRow> {
    if let Some(row) = state.store.get(info.id.as_str()).await? {
        return Ok(row);
    }
    let now = now_ms();
    // A request without an entrypoint runs what the image runs, as a container would; an
    // image that says nothing (or the host's root) runs nothing, forever.
    let entrypoint = match &planned.entrypoint {
        Some(e) => e.clone(),
        None if !info.spec.image_command.is_empty() => info.spec.image_command.clone(),
        None => DEFAULT_ENTRYPOINT.map(String::from).to_vec(),
    };
    let row = SandboxRow {
        id: info.id.to_string(),
        state: LifecycleState::Running,
        reason: Some("SANDBOX_RUNNING".into()),
        message: None,
        image: planned.image.clone(),
        entrypoint: entrypoint.clone(),
        metadata: user_labels(&planned.spec.labels),
        extensions,
        created_at_ms: info.created_unix_ms.cast_signed(),
        // The runtime's own expiry, so the row and the sandbox never disagree (none: no expiry).
        expires_at_ms: info.expires_unix_ms.map(|e| e.cast_signed()),
        updated_at_ms: now,
        tenant: tenant.as_str().to_owned(),
        memory_bytes: planned.spec.resources.memory_bytes.min(i64::MAX as u64).cast_signed(),
    };
    if let Err(e) = state.store.insert(&row).await {
        // Someone recorded it meanwhile (a concurrent acquire of the same thread, or the
        // adoption of a sandbox the CLI made): that row stands, and the sandbox lives on.
        if let Ok(Some(existing)) = state.store.get(info.id.as_str()).await {
            return Ok(existing);
        }
        let _ = state.rt.destroy(&info.id).await;
        return Err(e.into());
    }
    if let Err(e) =
        state.commands.spawn_entrypoint(&axum::extract::FromRef::from_ref(state), &info.id, entrypoint).await
    {
        // Nothing half-made stays behind: the sandbox and its row go with the failed start.
        let _ = state.rt.destroy(&info.id).await;
        state.store.delete(&row.id).await?;
        return Err(ApiError { message: format!("the entrypoint could not be started: {}", e.message), ..e });
    }
    Ok(row)
}

/// Brings a row in line with what the runtime says, and returns it.
async fn refresh(state: &AppState, row: SandboxRow) -> ApiResult<SandboxRow> {
    // A sandbox Failed by its entrypoint still exists and may yet be deleted or expire; any
    // other Failed or Terminated row is final.
    let entrypoint_failed = row.state == LifecycleState::Failed && row.reason.as_deref() == Some(ENTRYPOINT_EXITED);
    if row.state == LifecycleState::Terminated || (row.state == LifecycleState::Failed && !entrypoint_failed) {
        return Ok(row);
    }
    let Ok(id) = paddock_core::runtime::SandboxId::parse(&row.id) else { return Ok(row) };
    let (new_state, reason, message) = match state.rt.get(&id).await {
        Ok(info) if entrypoint_failed && info.state != SandboxState::Failed => return Ok(row),
        Ok(info) => {
            let s = LifecycleState::of(info.state);
            (s, s.reason(), info.failure.filter(|_| s == LifecycleState::Failed))
        }
        Err(RuntimeError::NotFound(_)) => {
            let expired = row.expires_at_ms.is_some_and(|e| e <= now_ms() + 1000);
            let why = if expired { "the sandbox expired" } else { "the sandbox is gone" };
            (LifecycleState::Terminated, if expired { "SANDBOX_EXPIRED" } else { "SANDBOX_GONE" }, Some(why.to_owned()))
        }
        Err(e) => return Err(e.into()),
    };
    if new_state != row.state {
        if matches!(new_state, LifecycleState::Terminated | LifecycleState::Failed) {
            // Its commands can no longer run: drop their logs and registry entries.
            state.commands.forget_sandbox(&row.id);
            forget_use(state, &row.id);
        }
        state.store.set_state(&row.id, new_state, Some(reason), message.as_deref()).await?;
        return Ok(state.store.get(&row.id).await?.unwrap_or(row));
    }
    Ok(row)
}

async fn get_one(State(state): State<AppState>, InSandbox(_, row): InSandbox) -> ApiResult<Response> {
    Ok(axum::Json(sandbox_json(&refresh(&state, row).await?)).into_response())
}

async fn list(State(state): State<AppState>, tenant: Tenant, RawQuery(q): RawQuery) -> ApiResult<Response> {
    let mut states: Vec<String> = Vec::new();
    let mut metadata: Vec<(String, String)> = Vec::new();
    let (mut page, mut page_size): (Option<String>, Option<String>) = (None, None);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "state" => states.push(v.to_lowercase()),
            "metadata" => {
                for (mk, mv) in form_urlencoded::parse(v.as_bytes()) {
                    metadata.push((mk.into_owned(), mv.into_owned()));
                }
            }
            "page" => page = Some(v.into_owned()),
            "pageSize" => page_size = Some(v.into_owned()),
            _ => {}
        }
    }
    let number = |v: &Option<String>, default: usize, name: &str, max: usize| -> ApiResult<usize> {
        match v {
            None => Ok(default),
            Some(s) => match s.parse::<usize>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(ApiError::bad_request(format!("{name} must be a whole number from 1 to {max}"))),
            },
        }
    };
    let page = number(&page, 1, "page", usize::MAX)?;
    let page_size = number(&page_size, 20, "pageSize", 200)?;
    // Sandboxes made with the CLI since the last reconcile are listed too; if the runtime
    // cannot list them now, the known ones are still listed (the reaper tries again).
    if let Err(e) = adopt_all(&state).await {
        tracing::warn!("listing the runtime's sandboxes to adopt: {}", e.message);
    }
    let mut items = Vec::new();
    for row in state.store.list().await? {
        if row.tenant != tenant.as_str() {
            continue;
        }
        let row = refresh(&state, row).await?;
        if !states.is_empty() && !states.contains(&row.state.as_str().to_lowercase()) {
            continue;
        }
        if !metadata.iter().all(|(k, v)| row.metadata.get(k) == Some(v)) {
            continue;
        }
        items.push(sandbox_json(&row));
    }
    let total = items.len();
    let total_pages = total.div_ceil(page_size).max(1);
    let items: Vec<_> = items.into_iter().skip((page - 1).saturating_mul(page_size)).take(page_size).collect();
    Ok(axum::Json(json!({
        "items": items,
        "pagination": {
            "page": page, "pageSize": page_size, "totalItems": total,
            "totalPages": total_pages, "hasNextPage": page < total_pages
        }
    }))
    .into_response())
}

async fn remove(State(state): State<AppState>, InSandbox(sid, _): InSandbox) -> ApiResult<StatusCode> {
    let id = sid.as_str();
    match state.rt.destroy(&sid).await {
        Ok(()) | Err(RuntimeError::NotFound(_)) => {}
        Err(e) => return Err(e.into()),
    }
    state.commands.forget_sandbox(id);
    forget_use(&state, id);
    state.store.delete(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn patch_metadata(
    State(state): State<AppState>,
    InSandbox(sid, row): InSandbox,
    ApiJson(patch): ApiJson<BTreeMap<String, Option<String>>>,
) -> ApiResult<Response> {
    let id = sid.as_str();
    let mut metadata = row.metadata.clone();
    for (k, v) in patch {
        match v {
            Some(v) => metadata.insert(k, v),
            None => metadata.remove(&k),
        };
    }
    validate_metadata(&metadata)?;
    state.store.set_metadata(id, &metadata).await?;
    let (_, row) = state.sandbox(id).await?;
    Ok(axum::Json(sandbox_json(&row)).into_response())
}

/// A sandbox whose entrypoint ended keeps that state: pausing or resuming it would hide why.
fn refuse_failed(row: &SandboxRow) -> ApiResult<()> {
    if row.state == LifecycleState::Failed {
        return Err(ApiError::conflict(format!(
            "sandbox {} has failed ({}): delete it and create another",
            row.id,
            row.message.as_deref().unwrap_or("no reason recorded")
        )));
    }
    Ok(())
}

async fn pause(State(state): State<AppState>, InSandbox(sid, row): InSandbox) -> ApiResult<StatusCode> {
    let id = sid.as_str();
    refuse_failed(&refresh(&state, row).await?)?;
    state.rt.pause(&sid).await?;
    state.store.set_state(id, LifecycleState::Paused, Some("SANDBOX_PAUSED"), None).await?;
    Ok(StatusCode::ACCEPTED)
}

async fn resume(State(state): State<AppState>, InSandbox(sid, row): InSandbox) -> ApiResult<StatusCode> {
    let id = sid.as_str();
    refuse_failed(&refresh(&state, row).await?)?;
    state.rt.resume(&sid).await?;
    state.store.set_state(id, LifecycleState::Running, Some("SANDBOX_RUNNING"), None).await?;
    Ok(StatusCode::ACCEPTED)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RenewRequest {
    expires_at: String,
}

async fn renew(
    State(state): State<AppState>,
    InSandbox(sid, _): InSandbox,
    ApiJson(req): ApiJson<RenewRequest>,
) -> ApiResult<Response> {
    let id = sid.as_str();
    let at = parse_rfc3339(&req.expires_at).ok_or_else(|| {
        ApiError::bad_request(format!(
            "expiresAt {:?} is not an RFC 3339 time such as 2026-01-01T12:00:00Z",
            req.expires_at
        ))
    })?;
    let ttl = at - now_ms();
    if ttl <= 0 {
        return Err(ApiError::bad_request("expiresAt is in the past: renew to a time in the future"));
    }
    // The SDK's contract: a renewal may shorten or extend, and the create-time maximum
    // (--max-timeout) does not apply. Only a year bounds it, as it bounds every lifetime.
    const YEAR_MS: i64 = 366 * 24 * 3600 * 1000;
    if ttl > YEAR_MS {
        return Err(ApiError::bad_request(
            "expiresAt is more than a year away: renew to an earlier time, or create the sandbox with timeout null for no expiry",
        ));
    }
    state.rt.renew(&sid, Duration::from_millis(ttl.cast_unsigned())).await?;
    state.store.set_expires(id, Some(at)).await?;
    Ok(axum::Json(json!({ "expiresAt": rfc3339(at) })).into_response())
}

#[derive(Debug, Deserialize)]
struct EndpointQuery {
    use_server_proxy: Option<String>,
    expires: Option<String>,
}

/// The `{port}` of an endpoint's route, checked by the handler (its error names the range).
#[derive(Deserialize)]
struct PortParam {
    port: String,
}

async fn endpoint(
    State(state): State<AppState>,
    InSandbox(sid, row): InSandbox,
    ApiPath(PortParam { port }): ApiPath<PortParam>,
    Query(q): Query<EndpointQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let id = sid.as_str();
    renew_on_access(&state, id).await;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request(format!("port {port:?} must be a number from 1 to 65535")))?;
    let proxy = matches!(q.use_server_proxy.as_deref(), Some("true" | "True" | "1"));
    if proxy && q.expires.is_some() {
        return Err(ApiError::bad_request("use_server_proxy and expires cannot be combined"));
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| state.config.listen.to_string());
    // A signed endpoint is a self-contained URL: the signature in it opens this port of this
    // sandbox until `expires`, with no headers (a browser can open it).
    if let Some(expires) = q.expires.as_deref() {
        let expires: u64 = expires
            .trim()
            .parse()
            .map_err(|_| ApiError::bad_request(format!("expires {expires:?} is not a Unix time in seconds")))?;
        let endpoint = crate::routes::signed_endpoint(&state, &host, &row.id, port, expires).await?;
        return Ok(axum::Json(json!({ "endpoint": endpoint })).into_response());
    }
    // Both modes reach the sandbox through this server (its network has no other way in). In
    // direct mode the SDK sends only the endpoint's headers, so they carry the sandbox's token.
    let endpoint = format!("{host}/v1/sandboxes/{id}/proxy/{port}");
    let body = if proxy {
        json!({ "endpoint": endpoint })
    } else {
        // The egress port's headers carry a token that may change the policy; every other
        // port's carry the sandbox's own token, which may not.
        let token = if port == crate::api::EGRESS_PORT {
            state.token_key.egress_token(&row.id)
        } else {
            state.token_key.token(&row.id)
        };
        json!({ "endpoint": endpoint, "headers": { SANDBOX_TOKEN_HEADER: token, crate::api::EXECD_TOKEN_HEADER: token } })
    };
    Ok(axum::Json(body).into_response())
}

// ---------------------------------------------------------------------------------------------
// Diagnostics (OpenSandbox's diagnostic API: logs and events, inline)

#[derive(Debug, Deserialize)]
struct DiagnosticQuery {
    scope: Option<String>,
}

/// The scopes each diagnostic kind answers; `all` is both.
const LOG_SCOPES: [&str; 3] = ["container", "entrypoint", "all"];
const EVENT_SCOPES: [&str; 3] = ["lifecycle", "runtime", "all"];

fn diagnostic_scope(q: DiagnosticQuery, allowed: &[&str]) -> ApiResult<String> {
    let scope = q.scope.unwrap_or_else(|| "all".into());
    if !allowed.contains(&scope.as_str()) {
        return Err(ApiError::bad_request(format!("scope {scope:?} is not one of {}", allowed.join(", "))));
    }
    Ok(scope)
}

fn diagnostic(
    id: &str,
    kind: &str,
    scope: String,
    content: String,
    truncated: bool,
    warnings: Vec<String>,
) -> Response {
    let mut body = json!({
        "sandboxId": id, "kind": kind, "scope": scope, "delivery": "inline",
        "contentType": "text/plain; charset=utf-8", "truncated": truncated,
        "contentLength": content.len(), "content": content,
    });
    if !warnings.is_empty() {
        body["warnings"] = json!(warnings);
    }
    axum::Json(body).into_response()
}

/// What is known of a sandbox's entrypoint: this server's memory (up to 1 MiB of output) when
/// it started it, else the state database (the newest 64 KiB, kept across restarts).
async fn entrypoint_record(state: &AppState, id: &str) -> ApiResult<Option<crate::store::EntrypointLog>> {
    match state.commands.entrypoint_log(id, usize::MAX) {
        Some(log) => Ok(Some(log)),
        None => Ok(state.store.entrypoint_log(id).await?),
    }
}

/// `GET /sandboxes/{id}/diagnostics/logs?scope=`: the entrypoint's output (stdout and stderr
/// together), running or ended.
async fn diagnostic_logs(
    State(state): State<AppState>,
    InSandbox(sid, row): InSandbox,
    Query(q): Query<DiagnosticQuery>,
) -> ApiResult<Response> {
    let id = sid.as_str();
    let scope = diagnostic_scope(q, &LOG_SCOPES)?;
    let mut warnings = Vec::new();
    let (content, truncated) = match entrypoint_record(&state, id).await? {
        Some(log) => (String::from_utf8_lossy(&log.tail).into_owned(), log.truncated),
        None if row.entrypoint.is_empty() => {
            warnings.push("this sandbox runs no entrypoint (it was made with the CLI): there is no log".to_owned());
            (String::new(), false)
        }
        None => {
            warnings.push(
                "no output of the entrypoint is known: it was started by a server older than this one".to_owned(),
            );
            (String::new(), false)
        }
    };
    Ok(diagnostic(id, "logs", scope, content, truncated, warnings))
}

/// `GET /sandboxes/{id}/diagnostics/events?scope=`: the sandbox's lifecycle as text, one
/// event a line: created, entrypoint started and ended, its state now.
async fn diagnostic_events(
    State(state): State<AppState>,
    InSandbox(sid, row): InSandbox,
    Query(q): Query<DiagnosticQuery>,
) -> ApiResult<Response> {
    let id = sid.as_str();
    let scope = diagnostic_scope(q, &EVENT_SCOPES)?;
    let row = refresh(&state, row).await?;
    let mut lines =
        vec![format!("{} Created: sandbox {} from image {}", rfc3339(row.created_at_ms), row.id, row.image)];
    if let Some(log) = entrypoint_record(&state, id).await? {
        lines.push(format!("{} EntrypointStarted: {}", rfc3339(log.started_at_ms), log.command));
        if let Some(at) = log.finished_at_ms {
            let how = match (log.exit_code, &log.error) {
                (_, Some(e)) => e.clone(),
                (Some(c), None) => format!("exit status {c}"),
                (None, None) => "ended".to_owned(),
            };
            lines.push(format!("{} EntrypointExited: {how}", rfc3339(at)));
        }
    }
    let mut now = format!("{} {}", rfc3339(row.updated_at_ms), row.state);
    if let Some(r) = &row.reason {
        now.push_str(&format!(": {r}"));
    }
    if let Some(m) = &row.message {
        now.push_str(&format!(": {m}"));
    }
    lines.push(now);
    match row.expires_at_ms {
        Some(e) => lines.push(format!("{} Expires", rfc3339(e))),
        None => lines.push("- NoExpiry: the sandbox lives until deleted".to_owned()),
    }
    Ok(diagnostic(id, "events", scope, lines.join("\n") + "\n", false, Vec::new()))
}

// ---------------------------------------------------------------------------------------------
// Workspaces

/// The runtime's thread of a workspace the tenant names (`tenants::scoped`).
fn thread_of(tenant: &Tenant, raw: &str) -> ApiResult<ThreadId> {
    ThreadId::new(raw).map_err(|e| ApiError::bad_request(e.to_string()))?;
    crate::tenants::check_user_name("workspace", raw)?;
    ThreadId::new(scoped(tenant, raw)).map_err(|e| ApiError::bad_request(e.to_string()))
}

async fn acquire(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiPath(thread): ApiPath<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    if state.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down and creates no new sandboxes"));
    }
    thread_of(&tenant, &thread)?;
    // The body is optional: no body means the defaults.
    let mut req: CreateSandboxRequest = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSandboxRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?
    };
    req.extensions.insert("workspace".to_owned(), thread.clone());
    let vault = vault_given(&mut req)?;
    let extensions = req.extensions.clone();
    let planned = plan(&state, &tenant, req)?;
    let vault = vault.map(|v| vault_for(&state, &planned, v)).transpose()?;
    let t = planned.thread.clone().ok_or_else(|| ApiError::internal("a workspace acquire planned no thread"))?;
    let reservation = reserve(&state, &tenant, &planned).await?;
    let info = state.rt.acquire(&t, planned.spec.clone()).await?;
    state.activity.touch(info.id.as_str());
    let row = record(&state, &info, &planned, extensions, &tenant).await;
    drop(reservation);
    let row = match vault {
        Some(v) => install_vault(&state, row?, v).await?,
        None => row?,
    };
    let row = refresh(&state, row).await?;
    let mut body = serde_json::to_value(sandbox_json(&row)).unwrap_or_default();
    if let Some(w) = &info.workspace {
        body["workspace"] = json!({ "thread": thread, "name": w.name });
    }
    Ok(axum::Json(body).into_response())
}

async fn release(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiPath(thread): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let t = thread_of(&tenant, &thread)?;
    state.rt.release(&t).await?;
    forget_thread_rows(&state, &tenant, &thread).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn destroy_workspace(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiPath(thread): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let t = thread_of(&tenant, &thread)?;
    state.rt.destroy_workspace(&t).await?;
    forget_thread_rows(&state, &tenant, &thread).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Rows of a thread's sandboxes that are gone after a release.
async fn forget_thread_rows(state: &AppState, tenant: &Tenant, thread: &str) -> ApiResult<()> {
    for row in state.store.list().await? {
        if row.tenant == tenant.as_str() && row.extensions.get("workspace").map(String::as_str) == Some(thread) {
            let row = refresh(state, row).await?;
            if row.state == LifecycleState::Terminated {
                state.commands.forget_sandbox(&row.id);
                state.store.delete(&row.id).await?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Background work

/// Drops what the server keeps in memory of a sandbox's use, once the sandbox is gone.
fn forget_use(state: &AppState, id: &str) {
    state.activity.forget(id);
    state.renewals.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
}

/// The extensions a create may carry; any other is refused, never stored and ignored.
const KNOWN_EXTENSIONS: [&str; 3] = ["workspace", RENEW_ON_ACCESS, VAULT_EXTENSION];
/// The vault at create as a JSON string, for clients that can send only extensions (the
/// unmodified SDK); taken out before the extensions are stored.
pub const VAULT_EXTENSION: &str = "paddock.credentialVault";
/// OpenSandbox's renew intent: each access extends the expiry to this many seconds from then.
pub const RENEW_ON_ACCESS: &str = "access.renew.extend.seconds";

/// Extends a sandbox's expiry on access, when it was created with [`RENEW_ON_ACCESS`]: to that
/// many seconds from now, at most once per half of it (or per minute, if sooner), never
/// shortening it and never past `--max-timeout` from its creation. Errors are logged: an
/// access never fails for its renewal.
pub async fn renew_on_access(state: &AppState, id: &str) {
    let now = now_ms();
    {
        let last = state.renewals.lock().unwrap_or_else(|e| e.into_inner());
        if last.get(id).is_some_and(|t| now - *t < 1000) {
            return;
        }
    }
    let Ok(Some(row)) = state.store.get(id).await else { return };
    let Some(secs) = row.extensions.get(RENEW_ON_ACCESS).and_then(|v| v.trim().parse::<i64>().ok()) else { return };
    let Some(expires) = row.expires_at_ms else { return };
    let interval = (secs * 1000 / 2).min(60_000);
    {
        let mut last = state.renewals.lock().unwrap_or_else(|e| e.into_inner());
        if last.get(id).is_some_and(|t| now - *t < interval) {
            return;
        }
        last.insert(id.to_owned(), now);
    }
    let cap = row.created_at_ms + paddock_core::units::millis_i64(state.config.max_timeout);
    let at = (now + secs * 1000).min(cap);
    if at <= expires {
        return;
    }
    let Ok(sid) = paddock_core::runtime::SandboxId::parse(id) else { return };
    match state.rt.renew(&sid, Duration::from_millis(u64::try_from(at - now).unwrap_or(0))).await {
        Ok(_) => {
            if let Err(e) = state.store.set_expires(id, Some(at)).await {
                tracing::warn!(sandbox = id, error = %e, "recording a renewal on access");
            }
        }
        Err(e) => tracing::warn!(sandbox = id, error = %e, "renewing a sandbox on access"),
    }
}

/// The label the server puts on the sandboxes it creates.
const ORIGIN_LABEL: &str = "paddock.dev/origin";
/// The label naming the start of the server that creates a sandboxes (`AppState::boot`).
const BOOT_LABEL: &str = "paddock.dev/server";

/// How long a sandbox the API made may lack a row before it counts as orphaned (its create
/// died between the runtime and the store) and is adopted like any other: longer than a
/// create may take.
const ADOPT_API_SANDBOX_AFTER: Duration = Duration::from_secs(15 * 60);

/// A sandbox's labels as its metadata: without the ones Paddock reserves for itself.
fn user_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels.iter().filter(|(k, _)| !k.starts_with("paddock.dev/")).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Gives a sandbox the runtime has and the store does not (made with the CLI on this data
/// directory, or by a server on the same cluster) a row, so the API sees and manages it; it
/// runs no entrypoint. A sandbox the API is creating right now is left alone.
async fn adopt(state: &AppState, info: &SandboxInfo) -> ApiResult<Option<SandboxRow>> {
    // A run's sandbox is the run API's (`GET /v1/runs/{id}` names it), made and given back by
    // its attempt: the sandbox list leaves it out.
    if info.spec.labels.contains_key(crate::runs::RUN_LABEL) {
        return Ok(None);
    }
    let from_api = info.spec.labels.get(ORIGIN_LABEL).is_some_and(|v| v == "api");
    let age = Duration::from_millis(now_ms().cast_unsigned().saturating_sub(info.created_unix_ms));
    if from_api && age < ADOPT_API_SANDBOX_AFTER && create_may_be_under_way(state, info).await? {
        return Ok(None);
    }
    let state_name = LifecycleState::of(info.state);
    let reason = state_name.reason();
    // One the API made for a tenant before a crash stays that tenant's.
    let tenant = match info.spec.labels.get(TENANT_LABEL) {
        Some(t) if crate::tenants::validate_name(t).is_ok() => Tenant::named(t),
        _ => Tenant::default_tenant(),
    };
    let mut extensions = BTreeMap::new();
    if let Some(w) = &info.workspace {
        let name = unscoped(&tenant, w.thread.as_str()).unwrap_or(w.thread.as_str());
        extensions.insert("workspace".to_owned(), name.to_owned());
    }
    let row = SandboxRow {
        id: info.id.to_string(),
        state: state_name,
        reason: Some(reason.into()),
        message: info.failure.clone(),
        image: info.spec.image.clone().unwrap_or_else(|| "default".into()),
        entrypoint: Vec::new(),
        metadata: user_labels(&info.spec.labels),
        extensions,
        created_at_ms: info.created_unix_ms.cast_signed(),
        expires_at_ms: info.expires_unix_ms.map(|e| e.cast_signed()),
        updated_at_ms: now_ms(),
        tenant: tenant.as_str().to_owned(),
        memory_bytes: info.spec.resources.memory_bytes.min(i64::MAX as u64).cast_signed(),
    };
    // Another request may have adopted it (or the API recorded it) in the meantime.
    if state.store.insert(&row).await.is_err() {
        return Ok(state.store.get(&row.id).await?);
    }
    tracing::info!(sandbox = %row.id, "adopted a sandbox made outside this server");
    Ok(Some(row))
}

/// Whether the server that is creating `info` (made by the API, with no row yet) may still
/// record it: this server, or another one on this data directory that is alive, or one this
/// server cannot tell about (a server with a data directory of its own, on a cluster they
/// share). A sandbox whose server on this data directory died mid-create (`kill -9`, a crash)
/// is adopted at once; the others wait out `ADOPT_API_SANDBOX_AFTER`.
async fn create_may_be_under_way(state: &AppState, info: &SandboxInfo) -> ApiResult<bool> {
    let Some(boot) = info.spec.labels.get(BOOT_LABEL).cloned() else { return Ok(true) };
    if boot == state.boot.id() {
        return Ok(true);
    }
    let data_dir = state.config.data_dir.clone();
    let ended = tokio::task::spawn_blocking(move || crate::boot::ended(&data_dir, &boot)).await;
    Ok(!matches!(ended, Ok(true)))
}

/// The row of a sandbox the runtime has but the store does not yet, adopted now.
pub async fn adopt_one(state: &AppState, id: &paddock_core::runtime::SandboxId) -> ApiResult<Option<SandboxRow>> {
    match state.rt.get(id).await {
        Ok(info) => adopt(state, &info).await,
        Err(RuntimeError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Adopts every sandbox of the runtime the store does not know.
async fn adopt_all(state: &AppState) -> ApiResult<()> {
    let known: std::collections::HashSet<String> = state.store.list().await?.into_iter().map(|r| r.id).collect();
    for info in state.rt.list().await? {
        if !known.contains(info.id.as_str()) {
            adopt(state, &info).await?;
        }
    }
    Ok(())
}

/// Brings every stored sandbox in line with the runtime, and adopts the runtime's sandboxes
/// the store does not know; run at start and by the reaper.
pub async fn reconcile(state: &AppState) {
    if let Err(e) = adopt_all(state).await {
        tracing::warn!("listing the runtime's sandboxes to adopt: {}", e.message);
    }
    let Ok(rows) = state.store.list().await else { return };
    let mut counts: HashMap<LifecycleState, i64> = HashMap::new();
    for row in rows {
        if let Ok(row) = refresh(state, row).await {
            *counts.entry(row.state).or_default() += 1;
        }
    }
    for s in LifecycleState::ALL {
        let n = counts.get(&s).copied().unwrap_or(0);
        state.metrics.sandboxes.get_or_create(&crate::metrics::StateLabel { state: s.as_str().into() }).set(n);
    }
    if let Ok(usage) = crate::tenants::usage(state.store.pool()).await {
        for (tenant, n, memory, tokens) in usage {
            let label = crate::metrics::TenantLabel { tenant };
            state.metrics.tenant_sandboxes.get_or_create(&label).set(n);
            state.metrics.tenant_memory.get_or_create(&label).set(memory);
            state.metrics.tenant_model_tokens.get_or_create(&label).set(tokens);
        }
    }
}

/// Notices expired and vanished sandboxes. Expiry itself is enforced by each sandbox's
/// supervisor, so it holds even while this server is down.
pub async fn reaper(state: AppState) {
    let mut last_idle_sweep = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        reconcile(&state).await;
        if let Some(idle) = state.config.idle_timeout
            && last_idle_sweep.elapsed() >= IDLE_SWEEP.min(idle)
        {
            last_idle_sweep = Instant::now();
            reap_idle(&state, idle).await;
        }
    }
}

/// How often unused sandboxes are looked for (Dawn sweeps every minute).
const IDLE_SWEEP: Duration = Duration::from_secs(60);

/// Gives back every sandbox unused for `idle`: a thread's is released (its workspace is kept),
/// one without expiry deleted. A sandbox with a request or command in progress, or one a run
/// holds, is never idle; one with an expiry and no thread keeps it.
pub async fn reap_idle(state: &AppState, idle: Duration) {
    let Ok(rows) = state.store.list().await else { return };
    let held = state.runs.sandboxes_held().await;
    let now = now_ms();
    let idle_ms = paddock_core::units::millis_i64(idle);
    for row in rows {
        if row.state != LifecycleState::Running || held.contains(&row.id) {
            continue;
        }
        let thread = row.extensions.get("workspace").cloned();
        if thread.is_none() && row.expires_at_ms.is_some() {
            continue;
        }
        let Ok(sid) = paddock_core::runtime::SandboxId::parse(&row.id) else { continue };
        let (last, busy) = state.activity.of(&row.id).unwrap_or((row.created_at_ms, false));
        if busy || now - last.max(row.created_at_ms) < idle_ms || state.commands.running_for_clients(&sid) > 0 {
            continue;
        }
        let done = match &thread {
            Some(t) => match ThreadId::new(t.clone()) {
                Ok(t) => state.rt.release(&t).await,
                Err(_) => continue,
            },
            None => match state.rt.destroy(&sid).await {
                Err(RuntimeError::NotFound(_)) => Ok(()),
                other => other,
            },
        };
        match done {
            Ok(()) => {
                tracing::info!(sandbox = %row.id, thread = ?thread, idle_s = (now - last) / 1000, "gave back an idle sandbox");
                state.commands.forget_sandbox(&row.id);
                forget_use(state, &row.id);
                if let Err(e) = state.store.delete(&row.id).await {
                    tracing::warn!(sandbox = %row.id, error = %e, "forgetting an idle sandbox");
                }
            }
            Err(e) => tracing::warn!(sandbox = %row.id, error = %e, "giving back an idle sandbox"),
        }
    }
}

async fn openapi() -> Response {
    axum::Json(crate::lifecycle::openapi_document()).into_response()
}

/// The OpenAPI document of Paddock's own API (workspaces) and the lifecycle routes it serves.
pub fn openapi_document() -> Value {
    let mut doc = workspace_document();
    // The lifecycle routes too, as Paddock serves them, so that clients and the API fuzz run
    // (e2e/fuzz/run) see every route this server answers outside a sandbox's proxy.
    if let (Some(paths), Value::Object(more)) = (doc["paths"].as_object_mut(), lifecycle_paths()) {
        paths.extend(more);
    }
    if let (Some(schemas), Value::Object(more)) = (doc["components"]["schemas"].as_object_mut(), lifecycle_schemas()) {
        schemas.extend(more);
    }
    // Runs, and the gateway their drivers call.
    if let (Some(paths), Value::Object(more)) = (doc["paths"].as_object_mut(), crate::runs::api::openapi_paths()) {
        paths.extend(more);
    }
    if let Some(schemes) = doc["components"].as_object_mut() {
        let security = schemes.entry("securitySchemes").or_insert_with(|| json!({}));
        security["runToken"] =
            json!({"type": "http", "scheme": "bearer", "description": "$PADDOCK_TOKEN, inside a run's sandbox"});
    }
    // And each sandbox's execd API, as the server proxies it.
    if let (Some(paths), Value::Object(more)) = (doc["paths"].as_object_mut(), crate::execd::openapi::paths()) {
        paths.extend(more);
    }
    doc
}

fn lifecycle_paths() -> Value {
    let sandbox_ref = json!({"$ref": "#/components/schemas/Sandbox"});
    let error_ref = json!({"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let id = json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string"}});
    let ok =
        |what: &str, schema: Value| json!({"description": what, "content": {"application/json": {"schema": schema}}});
    let policy_status = json!({"type": "object", "required": ["status", "mode", "policy"], "properties": {
        "status": {"type": "string"}, "mode": {"type": "string", "enum": ["deny_all", "allow_all", "enforcing"]},
        "enforcementMode": {"type": "string"}, "reason": {"type": "string"},
        "policy": {"$ref": "#/components/schemas/NetworkPolicy"}}});
    let plain = |summary: &str, code: &str, what: &str| {
        json!({"summary": summary, "parameters": [id.clone()],
            "responses": {code: {"description": what}, "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}})
    };
    json!({
        "/sandboxes": {
            "post": {"summary": "Create a sandbox (OpenSandbox lifecycle API)",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CreateRequest"}}}},
                "responses": {"202": ok("The sandbox, starting", sandbox_ref.clone()), "400": error_ref.clone(), "401": error_ref.clone(),
                    "429": {"description": "QUOTA_EXCEEDED: the tenant's sandboxes or their memory are at its quota", "content": error_ref["content"].clone()}}},
            "get": {"summary": "List sandboxes",
                "parameters": [
                    {"name": "state", "in": "query", "schema": {"type": "string"}},
                    {"name": "metadata", "in": "query", "schema": {"type": "string"}, "description": "k=v&k2=v2, URL-encoded"},
                    {"name": "page", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                    {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}}],
                "responses": {"200": ok("A page of sandboxes", json!({"type": "object", "required": ["items", "pagination"], "properties": {
                    "items": {"type": "array", "items": sandbox_ref.clone()}, "pagination": {"type": "object"}}})),
                    "400": error_ref.clone(), "401": error_ref.clone()}}},
        "/sandboxes/{id}": {
            "get": {"summary": "One sandbox", "parameters": [id.clone()],
                "responses": {"200": ok("The sandbox", sandbox_ref.clone()), "401": error_ref.clone(), "404": error_ref.clone()}},
            "delete": plain("Destroy a sandbox", "204", "Destroyed")},
        "/sandboxes/{id}/metadata": {"patch": {"summary": "Set (string) or remove (null) metadata keys", "parameters": [id.clone()],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object",
                "additionalProperties": {"type": ["string", "null"]}}}}},
            "responses": {"200": ok("The sandbox", sandbox_ref.clone()), "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/pause": {"post": plain("Pause a sandbox", "202", "Paused")},
        "/sandboxes/{id}/resume": {"post": plain("Resume a paused sandbox", "202", "Resumed")},
        "/sandboxes/{id}/renew-expiration": {"post": {"summary": "Move a sandbox's expiry", "parameters": [id.clone()],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object",
                "required": ["expiresAt"], "additionalProperties": false,
                "properties": {"expiresAt": {"type": "string", "format": "date-time"}}}}}},
            "responses": {"200": {"description": "The new expiry"}, "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/diagnostics/logs": {"get": {"summary": "The entrypoint's output (OpenSandbox diagnostics)",
            "parameters": [id.clone(), {"name": "scope", "in": "query", "schema": {"type": "string", "enum": LOG_SCOPES}}],
            "responses": {"200": ok("Inline text", json!({"$ref": "#/components/schemas/Diagnostic"})),
                "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/diagnostics/events": {"get": {"summary": "The sandbox's lifecycle events (OpenSandbox diagnostics)",
            "parameters": [id.clone(), {"name": "scope", "in": "query", "schema": {"type": "string", "enum": EVENT_SCOPES}}],
            "responses": {"200": ok("Inline text", json!({"$ref": "#/components/schemas/Diagnostic"})),
                "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/endpoints/{port}": {"get": {"summary": "Where to reach a port of the sandbox",
            "parameters": [id.clone(), {"name": "port", "in": "path", "required": true, "schema": {"type": "integer", "minimum": 1, "maximum": 65535}},
                {"name": "use_server_proxy", "in": "query", "schema": {"type": "boolean"}},
                {"name": "expires", "in": "query", "schema": {"type": "integer"},
                    "description": "Unix seconds: a signed, self-contained route valid until then (at most 7 days)"}],
            "responses": {"200": {"description": "The endpoint"}, "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/networkpolicy": {
            "get": {"summary": "The sandbox's egress policy (OpenSandbox PolicyStatusResponse)", "parameters": [id.clone()],
                "responses": {"200": ok("The policy", policy_status.clone()), "401": error_ref.clone(), "404": error_ref.clone()}},
            "put": {"summary": "Replace the sandbox's egress policy", "parameters": [id.clone()],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NetworkPolicy"}}}},
                "responses": {"200": ok("The policy now", policy_status.clone()), "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}},
            "patch": {"summary": "Add rules before the existing ones (one rule per target)", "parameters": [id.clone()],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/NetworkRule"}}}}},
                "responses": {"200": ok("The policy now", policy_status.clone()), "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}},
            "delete": {"summary": "Remove the rules of these targets", "parameters": [id.clone()],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "array", "items": {"type": "string"}}}}},
                "responses": {"200": ok("The policy now", policy_status.clone()), "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/egress": {"get": {"summary": "The egress policy, how it is enforced, counters and the newest denials", "parameters": [id.clone()],
            "responses": {"200": {"description": "Egress status"}, "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/credential-vault": {
            "get": {"summary": "The sandbox's credential vault: names, revisions, matches and auth types, never a value (OpenSandbox CredentialVaultState)", "parameters": [id.clone()],
                "responses": {"200": {"description": "The vault"}, "401": error_ref.clone(), "404": error_ref.clone()}},
            "post": {"summary": "Create the vault: credentials (write-only values) and the bindings that inject them on the way out", "parameters": [id.clone()],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["credentials", "bindings"]}}}},
                "responses": {"201": {"description": "The vault (revision 1)"}, "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone(), "409": error_ref.clone(), "412": error_ref.clone()}},
            "patch": {"summary": "Change the vault at once: deletes, replaces, adds (expectedRevision guards against a lost update)", "parameters": [id.clone()],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object"}}}},
                "responses": {"200": {"description": "The vault now"}, "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone(), "409": error_ref.clone(), "412": error_ref.clone()}},
            "delete": {"summary": "Remove the vault", "parameters": [id.clone()],
                "responses": {"204": {"description": "Removed"}, "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/credential-vault/credentials": {"get": {"summary": "The vault's credentials (names and revisions)", "parameters": [id.clone()],
            "responses": {"200": {"description": "Credentials"}, "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/credential-vault/credentials/{name}": {"get": {"summary": "One credential (name and revision)",
            "parameters": [id.clone(), {"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "The credential"}, "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/credential-vault/bindings": {"get": {"summary": "The vault's bindings", "parameters": [id.clone()],
            "responses": {"200": {"description": "Bindings"}, "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/credential-vault/bindings/{name}": {"get": {"summary": "One binding",
            "parameters": [id.clone(), {"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "The binding"}, "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/signatures/revoke": {"post": {"summary": "Revoke every signed route and endpoint of the sandbox made so far, and its unused tickets", "parameters": [id.clone()],
            "responses": {"200": {"description": "The sandbox's new signing epoch and how many tickets were dropped"}, "401": error_ref.clone(), "404": error_ref.clone()}}},
        "/sandboxes/{id}/tickets": {"post": {"summary": "A single-use ticket for one request to a port (a browser's WebSocket handshake)", "parameters": [id.clone()],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["port"], "additionalProperties": false,
                "properties": {"port": {"type": "integer", "minimum": 1, "maximum": 65535}, "ttlSeconds": {"type": "integer", "minimum": 1, "maximum": 300}}}}}},
            "responses": {"200": {"description": "The ticket, its expiry, the route and the query parameter to add"}, "400": error_ref.clone(), "401": error_ref.clone(), "404": error_ref.clone()}}}
    })
}

fn lifecycle_schemas() -> Value {
    json!({
        "Diagnostic": {"type": "object", "required": ["sandboxId", "kind", "scope", "delivery", "contentType", "truncated"],
            "properties": {"sandboxId": {"type": "string"}, "kind": {"type": "string", "enum": ["logs", "events"]},
                "scope": {"type": "string"}, "delivery": {"type": "string", "enum": ["inline"]},
                "contentType": {"type": "string"}, "truncated": {"type": "boolean"}, "content": {"type": "string"},
                "contentLength": {"type": "integer"}, "warnings": {"type": "array", "items": {"type": "string"}}}},
        "NetworkRule": {"type": "object", "required": ["action"], "additionalProperties": false,
            "description": "target, ports or both; a domain target takes no ports",
            "properties": {
            "action": {"type": "string", "enum": ["allow", "deny"]},
            "target": {"type": ["string", "null"], "description": "a domain, *.domain, an IP or a CIDR; omitted with ports: every address"},
            "ports": {"type": ["array", "null"], "minItems": 1, "maxItems": 256, "uniqueItems": true,
                "items": {"type": "integer", "minimum": 1, "maximum": 65535},
                "description": "TCP destination ports the rule is scoped to"}}},
        "NetworkPolicy": {"type": "object", "additionalProperties": false, "properties": {
            "defaultAction": {"type": ["string", "null"], "enum": ["allow", "deny", null]},
            "egress": {"type": ["array", "null"], "items": {"$ref": "#/components/schemas/NetworkRule"}, "maxItems": 4096}}},
        "Volume": {"type": "object", "required": ["name", "mountPath"], "additionalProperties": false,
            "description": "Exactly one of host (a directory below the server's --volume-root) and pvc (a named volume, made on first use and kept until DELETE /v1/volumes/{name}); ossfs is refused.",
            "properties": {
                "name": {"type": "string"}, "mountPath": {"type": "string"}, "readOnly": {"type": ["boolean", "null"]},
                "subPath": {"type": ["string", "null"]},
                "host": {"type": ["object", "null"], "required": ["path"], "additionalProperties": false, "properties": {"path": {"type": "string"}}},
                "pvc": {"type": ["object", "null"], "required": ["claimName"], "additionalProperties": false, "properties": {
                    "claimName": {"type": "string"}, "createIfNotExists": {"type": ["boolean", "null"]},
                    "deleteOnSandboxTermination": {"type": ["boolean", "null"]}, "storageClass": {"type": ["string", "null"]},
                    "storage": {"type": ["string", "null"]}, "accessModes": {"type": ["array", "null"], "items": {"type": "string"}}}},
                "ossfs": {}}},
        "CreateRequest": {"type": "object",
            "description": "OpenSandbox's create body; fields Paddock cannot honour (snapshotId, templateId, lifecycle, secureAccess, ossfs volumes) are refused with 400; networkPolicy is enforced (no policy: the server's --default-egress).",
            "properties": {
                "image": {"type": "object", "required": ["uri"], "properties": {"uri": {"type": "string"}, "auth": {"type": "object", "required": ["username", "password"], "properties": {"username": {"type": "string"}, "password": {"type": "string"}}}}},
                "entrypoint": {"type": "array", "items": {"type": "string"}},
                "timeout": {"type": ["integer", "null"], "minimum": 60,
                    "description": "Seconds, at most the server's --max-timeout; absent: --default-timeout; null: no expiry (unless the server runs with --allow-no-expiry false)"},
                "resourceLimits": {"type": "object", "additionalProperties": {"type": "string"}},
                "resourceRequests": {"type": "object", "additionalProperties": {"type": "string"}},
                "env": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
                "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                "extensions": {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "workspace: a thread id whose persistent workspace becomes /workspace"},
                "platform": {"type": "object", "properties": {"os": {"type": "string"}, "arch": {"type": "string"}}},
                "networkPolicy": {"$ref": "#/components/schemas/NetworkPolicy"},
                "snapshotId": {"type": "string"}, "templateId": {"type": "string"},
                "secureAccess": {"type": "boolean"}, "lifecycle": {},
                "volumes": {"type": "array", "maxItems": 32, "items": {"$ref": "#/components/schemas/Volume"}},
                "credentialProxy": {"type": "object", "properties": {"enabled": {"type": "boolean"}}},
                "credentialVault": {"type": "object", "description": "Paddock's: the credential vault the sandbox starts with, as the body of POST /v1/sandboxes/{id}/credential-vault (also accepted as a JSON string in extensions[\"paddock.credentialVault\"]); values are never returned"}}}
    })
}

fn workspace_document() -> Value {
    let sandbox_ref = json!({"$ref": "#/components/schemas/Sandbox"});
    let error_ref = json!({"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let thread = json!({"name": "thread", "in": "path", "required": true, "schema": {"type": "string"},
        "description": "The agent's thread id (1 to 512 bytes, no control characters), URL-encoded."});
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Paddock", "version": env!("CARGO_PKG_VERSION"),
            "description": "Paddock's workspace and volume API, the OpenSandbox lifecycle routes it serves, and each sandbox's execd API as the server proxies it (/v1/sandboxes/{id}/proxy/44772/...). This document needs no key. OpenSandbox routes Paddock does not implement (snapshots, templates, pools, and execd's PTY and isolation routes) answer 501 NOT_SUPPORTED and are not listed here."},
        "servers": [{"url": "/v1"}],
        "security": [{"apiKey": []}],
        "paths": {
            "/workspaces/{thread}/acquire": {"post": {
                "summary": "Return the thread's running sandbox, or create one on its persistent workspace",
                "parameters": [thread],
                "requestBody": {"required": false, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AcquireRequest"}}}},
                "responses": {"200": {"description": "The sandbox", "content": {"application/json": {"schema": sandbox_ref}}},
                    "400": error_ref, "401": error_ref,
                    "429": {"description": "QUOTA_EXCEEDED: the tenant's sandboxes or their memory are at its quota", "content": error_ref["content"].clone()}}}},
            "/workspaces/{thread}/release": {"post": {
                "summary": "Stop the thread's sandbox and keep its workspace", "parameters": [thread],
                "responses": {"204": {"description": "Released"}, "400": error_ref, "401": error_ref}}},
            "/workspaces/{thread}": {"delete": {
                "summary": "Stop the thread's sandbox and delete its workspace", "parameters": [thread],
                "responses": {"204": {"description": "Deleted"}, "404": error_ref, "401": error_ref}}},
            "/volumes": {"get": {
                "summary": "The named volumes the runtime keeps, their size, use and the sandboxes that mount them",
                "responses": {"200": {"description": "Named volumes", "content": {"application/json": {"schema": {
                    "type": "array", "items": {"type": "object", "required": ["name", "sizeBytes", "createdUnixMs", "usedBy"],
                        "properties": {"name": {"type": "string"}, "sizeBytes": {"type": "integer"}, "usedBytes": {"type": "integer"},
                            "createdUnixMs": {"type": "integer"}, "usedBy": {"type": "array", "items": {"type": "string"}}}}}}}},
                    "401": error_ref, "501": error_ref}}},
            "/volumes/{name}": {"delete": {
                "summary": "Delete a named volume and its files (409 while a sandbox mounts it)",
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {"204": {"description": "Deleted"}, "400": error_ref, "401": error_ref, "404": error_ref, "409": error_ref, "501": error_ref}}},
            "/capabilities": {"get": {
                "summary": "What the runtime behind this server supports",
                "responses": {"200": {"description": "Capabilities", "content": {"application/json": {"schema": {
                    "type": "object",
                    "required": ["runtime", "pause", "persistent_workspaces", "run_as_other_user", "images", "network", "metrics", "volumes"],
                    "properties": {
                        "runtime": {"type": "string", "description": "local or kubernetes"},
                        "pause": {"type": "boolean"},
                        "persistent_workspaces": {"type": "boolean"},
                        "run_as_other_user": {"type": "boolean"},
                        "images": {"type": "string", "description": "the image references accepted, in words"},
                        "network": {"type": "array", "items": {"type": "string"}},
                        "metrics": {"type": "boolean"},
                        "volumes": {"type": "array", "items": {"type": "string"}, "description": "host, named"}}}}}},
                    "401": error_ref}}}
        },
        "components": {
            "securitySchemes": {"apiKey": {"type": "apiKey", "in": "header", "name": "OPEN-SANDBOX-API-KEY"},
                "sandboxToken": {"type": "apiKey", "in": "header", "name": crate::api::SANDBOX_TOKEN_HEADER,
                    "description": "a sandbox's own token, from its endpoint's headers: opens that sandbox's routes only"}},
            "schemas": {
                "Error": {"type": "object", "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}}},
                "AcquireRequest": {"type": "object", "additionalProperties": false,
                    "description": "The body of POST /v1/sandboxes (all fields optional here); extensions.workspace is set from the path.",
                    "properties": {
                    "timeout": {"type": "integer", "minimum": 60},
                    "resourceLimits": {"type": "object", "additionalProperties": {"type": "string"},
                        "description": "cpu (\"500m\"), memory (\"512Mi\"), pids, ephemeral-storage (/tmp, \"1Gi\"), workspace (size of /workspace, \"10Gi\"), workspace-inodes"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                    "image": {"type": "object", "properties": {"uri": {"type": "string"}}},
                    "entrypoint": {"type": "array", "items": {"type": "string"}}}},
                "Sandbox": {"type": "object", "required": ["id", "status", "entrypoint", "createdAt"], "properties": {
                    "id": {"type": "string"},
                    "status": {"type": "object", "properties": {"state": {"type": "string"}, "reason": {"type": "string"}, "message": {"type": "string"}}},
                    "entrypoint": {"type": "array", "items": {"type": "string"}},
                    "createdAt": {"type": "string", "format": "date-time"},
                    "expiresAt": {"type": "string", "format": "date-time"},
                    "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                    "workspace": {"type": "object", "properties": {"thread": {"type": "string"}, "name": {"type": "string"}}}}}
            }
        }
    })
}

impl crate::api::SandboxLookup for AppState {
    fn sandbox<'a>(&'a self, id: &'a str) -> crate::api::Lookup<'a> {
        Box::pin(AppState::sandbox(self, id))
    }
}

// Here rather than in `state`: adopting is the lifecycle's, and `state` imports no handler.
impl AppState {
    /// The row of a sandbox the API knows, or a 404 that says how to find the right id.
    pub async fn sandbox(&self, id: &str) -> ApiResult<(paddock_core::runtime::SandboxId, SandboxRow)> {
        let sid = paddock_core::runtime::SandboxId::parse(id)
            .map_err(|_| ApiError::not_found(format!("no sandbox {id:?}: list sandboxes with GET /v1/sandboxes")))?;
        if let Some(row) = self.store.get(id).await? {
            return Ok((sid, row));
        }
        // One made with the CLI on this data directory is as much this server's.
        match adopt_one(self, &sid).await? {
            Some(row) => Ok((sid, row)),
            None => Err(ApiError::not_found(format!("no sandbox {id}: list sandboxes with GET /v1/sandboxes"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_follows_label_rules() {
        let ok = BTreeMap::from([("team".to_owned(), "agents-1".to_owned()), ("a.b/c".to_owned(), String::new())]);
        validate_metadata(&ok).unwrap();
        for (k, v) in [("bad key", "v"), ("k", "bad value"), ("opensandbox.io/x", "v"), ("k", &"v".repeat(64)[..])] {
            let m = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            assert_eq!(validate_metadata(&m).unwrap_err().code, "INVALID_METADATA_FORMAT", "{k}={v}");
        }
    }

    #[test]
    fn absent_null_and_given_timeouts_differ() {
        let t = |body: &str| serde_json::from_str::<CreateSandboxRequest>(body).unwrap().timeout;
        assert_eq!(t(r#"{}"#), None);
        assert_eq!(t(r#"{"timeout":null}"#), Some(None));
        assert_eq!(t(r#"{"timeout":300}"#), Some(Some(300)));
    }

    #[test]
    fn unknown_create_fields_are_rejected() {
        let e = serde_json::from_str::<CreateSandboxRequest>(r#"{"image":{"uri":"host"},"bogus":1}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field"));
        serde_json::from_str::<CreateSandboxRequest>(
            r#"{"image":{"uri":"host"},"timeout":300,"resourceLimits":{"cpu":"1","memory":"2Gi"},"env":{"A":"1"},"metadata":{"tag":"t"},"entrypoint":["tail","-f","/dev/null"],"secureAccess":false}"#,
        )
        .unwrap();
    }
}
