//! Tenants: several API keys, each of a tenant that sees and touches only what it made.
//!
//! The server's own key (the `api-key` file, or `PADDOCK_API_KEY`) is the tenant `default`.
//! Other tenants live in the database (`paddock tenant add|ls|rotate|rm|set`) or in a file
//! (`--tenants FILE`); their keys are kept as SHA-256 digests only. A key is 256 random bits,
//! so a digest is as good as a slow password hash against guessing, and it lets a request be
//! checked with one map lookup instead of a key-stretching function per request.
//!
//! A running server reads the tenants again every [`RELOAD_EVERY`] (a removal or a quota
//! change takes effect then), and looks up a key it does not know in the database at once, so
//! a key that `paddock tenant add` or `rotate` printed works on its first request.
//!
//! Ownership: a sandbox row and a run row carry their tenant, and the request's tenant is
//! compared with it in one place for each (`lib::tenant_owns_path`, `runs::api::RunPath`).
//! Workspaces and volumes are named by their users, so each tenant has names of its own: the
//! runtime sees `t.<tenant>.<name>` (see [`scoped`]), which no name given through the API can
//! be (the prefix is refused).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::Row;
use sqlx::sqlite::SqlitePool;

use crate::error::ApiError;
use crate::store::now_ms;

/// The tenant of the server's own key, and of everything made before tenants or by the CLI.
pub const DEFAULT_TENANT: &str = "default";
/// The label a sandbox carries its tenant in, so that one adopted after a crash stays its.
pub const TENANT_LABEL: &str = "paddock.dev/tenant";
/// Names a tenant's workspaces and volumes have in the runtime: `t.<tenant>.<name>`.
pub const SCOPE_PREFIX: &str = "t.";
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);
/// How long a rotated key keeps working when `rotate` is given no grace.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);
const MAX_NAME: usize = 40;

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant(pub Arc<str>);

impl Tenant {
    pub fn default_tenant() -> Self {
        Self(Arc::from(DEFAULT_TENANT))
    }

    pub fn named(name: &str) -> Self {
        Self(Arc::from(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_default(&self) -> bool {
        &*self.0 == DEFAULT_TENANT
    }
}

/// The request's tenant, put there by the authentication middleware; a route served without
/// one (no auth configured) acts for the default tenant.
impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Tenant>().cloned().unwrap_or_else(Tenant::default_tenant))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error(
        "tenant name {0:?} is not valid: use 1 to {MAX_NAME} lowercase letters, digits and '-', starting with a letter"
    )]
    BadName(String),
    #[error("tenant name \"default\" is the server's own key (the api-key file): pick another name")]
    Reserved,
    #[error("there is already a tenant {0:?}: rotate its key with `paddock tenant rotate {0}`")]
    Exists(String),
    #[error("there is no tenant {0:?}: list them with `paddock tenant ls`")]
    NotFound(String),
    #[error("quota {0}")]
    BadQuota(String),
    #[error("model route: {0}")]
    BadRoute(String),
    #[error("reading the tenants file {path}: {message}")]
    File { path: String, message: String },
    #[error("the tenants database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("making a key: {0}")]
    Random(String),
}

pub fn validate_name(name: &str) -> Result<(), TenantError> {
    if name == DEFAULT_TENANT {
        return Err(TenantError::Reserved);
    }
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok { Ok(()) } else { Err(TenantError::BadName(name.to_owned())) }
}

/// What a tenant may hold at once. Absent: no limit of that kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quotas {
    /// Sandboxes that exist (running, paused or failed), made through the sandbox API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<u64>,
    /// The sum of those sandboxes' memory limits, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Unfinished runs (queued to running) per tier.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runs: BTreeMap<String, u64>,
    /// Tokens its sandboxes may spend through the model route, in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_tokens: Option<u64>,
}

impl Quotas {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A tenant's own model route: its sandboxes' `$PADDOCK_LLM_BASE` reaches `base` (normalised
/// to one `/v1`), with the first line of `key_file` as the provider key. The key is read from
/// the file as each call goes out, never stored here: replacing the file rotates it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelRoute {
    pub base: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

impl ModelRoute {
    /// Checks the base (and normalises it) and makes the key file's path absolute, so that a
    /// route reads the same from any working directory.
    pub fn new(base: &str, key_file: Option<&Path>) -> Result<Self, TenantError> {
        let base = crate::model_base::normalise_base(base).map_err(TenantError::BadRoute)?;
        let key_file = match key_file {
            None => None,
            Some(p) if p.is_absolute() => Some(p.to_owned()),
            Some(p) => Some(
                std::path::absolute(p).map_err(|e| TenantError::BadRoute(format!("key file {}: {e}", p.display())))?,
            ),
        };
        Ok(Self { base, key_file })
    }
}

/// `429 QUOTA_EXCEEDED`, naming the quota.
pub fn quota_refusal(tenant: &Tenant, quota: &str, detail: String) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "QUOTA_EXCEEDED",
        format!(
            "quota {quota} of tenant {:?} is reached: {detail}; free some up, or have the operator raise it (paddock tenant set {} ...)",
            tenant.as_str(),
            tenant.as_str()
        ),
    )
}

/// A new key: `pdk_` and 256 random bits in hex, the form `add` and `rotate` print.
pub fn new_key() -> Result<String, TenantError> {
    let mut b = [0u8; 32];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| TenantError::Random(e.to_string()))?;
    Ok(format!("pdk_{}", hex::encode(b)))
}

pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A key's digest as `--tenants FILE` and the database keep it.
pub fn digest_hex(key: &str) -> String {
    hex::encode(digest(key))
}

// ---------------------------------------------------------------------------------------------
// Names of workspaces and volumes

/// The runtime's name of a tenant's workspace or volume `name`: unchanged for the default
/// tenant, `t.<tenant>.<name>` for any other.
pub fn scoped(tenant: &Tenant, name: &str) -> String {
    if tenant.is_default() { name.to_owned() } else { format!("{SCOPE_PREFIX}{}.{name}", tenant.as_str()) }
}

/// The tenant's own name of a runtime name, or `None` when it is another tenant's.
pub fn unscoped<'a>(tenant: &Tenant, runtime_name: &'a str) -> Option<&'a str> {
    match runtime_name.strip_prefix(SCOPE_PREFIX) {
        None => tenant.is_default().then_some(runtime_name),
        Some(rest) => {
            let (owner, name) = rest.split_once('.')?;
            (!tenant.is_default() && owner == tenant.as_str()).then_some(name)
        }
    }
}

/// Refuses a name given through the API that could stand for another tenant's.
pub fn check_user_name(what: &str, name: &str) -> Result<(), ApiError> {
    if name.starts_with(SCOPE_PREFIX) {
        return Err(ApiError::bad_request(format!(
            "{what} {name:?}: names starting with {SCOPE_PREFIX:?} are reserved for tenants' own names; pick another"
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The database

/// A tenant as `paddock tenant ls` shows it: never a key, only each key's id (the first 8
/// hex digits of its digest) and when it stops working.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantInfo {
    pub name: String,
    pub quotas: Quotas,
    /// Its own model route (`paddock tenant set --llm-base`); never a key, only its file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_route: Option<ModelRoute>,
    pub keys: Vec<KeyInfo>,
    pub created_at_ms: i64,
    /// From `--tenants FILE` (read-only here) rather than the database.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub from_file: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyInfo {
    pub id: String,
    pub created_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
}

/// Adds a tenant and returns its first key (shown once, kept only as a digest).
pub async fn add(pool: &SqlitePool, name: &str, quotas: &Quotas) -> Result<String, TenantError> {
    add_with_route(pool, name, quotas, None).await
}

/// [`add`], with its own model route from the start.
pub async fn add_with_route(
    pool: &SqlitePool,
    name: &str,
    quotas: &Quotas,
    route: Option<&ModelRoute>,
) -> Result<String, TenantError> {
    validate_name(name)?;
    let now = now_ms();
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO tenants (name, quotas, model_route, created_at_ms) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
    )
    .bind(name)
    .bind(serde_json::to_string(quotas).unwrap_or_else(|_| "{}".into()))
    .bind(route.map(|r| serde_json::to_string(r).unwrap_or_default()))
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        return Err(TenantError::Exists(name.to_owned()));
    }
    finish_with_key(tx, name, now).await
}

/// Adds a new key of the tenant and commits: the key, to be shown once.
async fn finish_with_key(
    mut tx: sqlx::Transaction<'_, sqlx::Sqlite>,
    name: &str,
    now: i64,
) -> Result<String, TenantError> {
    let key = new_key()?;
    sqlx::query("INSERT INTO tenant_keys (digest, tenant, created_at_ms) VALUES (?, ?, ?)")
        .bind(digest_hex(&key))
        .bind(name)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(key)
}

/// Gives a tenant a new key; its current ones keep working for `grace` (zero: not at all).
pub async fn rotate(pool: &SqlitePool, name: &str, grace: Duration) -> Result<String, TenantError> {
    let now = now_ms();
    let until = now.saturating_add(paddock_core::units::millis_i64(grace));
    let mut tx = pool.begin().await?;
    let known: Option<String> =
        sqlx::query_scalar("SELECT name FROM tenants WHERE name = ?").bind(name).fetch_optional(&mut *tx).await?;
    if known.is_none() {
        return Err(TenantError::NotFound(name.to_owned()));
    }
    sqlx::query("UPDATE tenant_keys SET expires_at_ms = MIN(COALESCE(expires_at_ms, ?1), ?1) WHERE tenant = ?2")
        .bind(until)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    // Keys past their grace are of no use to anyone: forget their digests.
    sqlx::query("DELETE FROM tenant_keys WHERE tenant = ? AND expires_at_ms <= ?")
        .bind(name)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    finish_with_key(tx, name, now).await
}

/// Removes a tenant and its keys. What it made stays (the CLI on the data directory sees it).
pub async fn remove(pool: &SqlitePool, name: &str) -> Result<(), TenantError> {
    let mut tx = pool.begin().await?;
    sqlx::query("DELETE FROM tenant_keys WHERE tenant = ?").bind(name).execute(&mut *tx).await?;
    let gone = sqlx::query("DELETE FROM tenants WHERE name = ?").bind(name).execute(&mut *tx).await?;
    if gone.rows_affected() == 0 {
        return Err(TenantError::NotFound(name.to_owned()));
    }
    tx.commit().await?;
    Ok(())
}

/// Replaces a tenant's quotas.
pub async fn set_quotas(pool: &SqlitePool, name: &str, quotas: &Quotas) -> Result<(), TenantError> {
    let done = sqlx::query("UPDATE tenants SET quotas = ? WHERE name = ?")
        .bind(serde_json::to_string(quotas).unwrap_or_else(|_| "{}".into()))
        .bind(name)
        .execute(pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(TenantError::NotFound(name.to_owned()));
    }
    Ok(())
}

/// Gives a tenant its own model route, or takes it away (`None`: the server's `--llm-base`
/// again, if any). A running server uses it within [`RELOAD_EVERY`].
pub async fn set_model_route(pool: &SqlitePool, name: &str, route: Option<&ModelRoute>) -> Result<(), TenantError> {
    let json = route.map(|r| serde_json::to_string(r).unwrap_or_default());
    let done =
        sqlx::query("UPDATE tenants SET model_route = ? WHERE name = ?").bind(json).bind(name).execute(pool).await?;
    if done.rows_affected() == 0 {
        return Err(TenantError::NotFound(name.to_owned()));
    }
    Ok(())
}

/// A stored route; one that no longer reads (written by hand) is left out with a warning
/// rather than taking the tenant's other settings with it.
fn stored_route(name: &str, json: Option<String>) -> Option<ModelRoute> {
    serde_json::from_str(&json?)
        .inspect_err(|e| tracing::warn!(tenant = name, "the tenant's stored model route does not read: {e}"))
        .ok()
}

/// Every tenant of the database, by name.
pub async fn list(pool: &SqlitePool) -> Result<Vec<TenantInfo>, TenantError> {
    let now = now_ms();
    let rows = sqlx::query("SELECT name, quotas, model_route, created_at_ms FROM tenants ORDER BY name")
        .fetch_all(pool)
        .await?;
    let keys = sqlx::query(
        "SELECT digest, tenant, created_at_ms, expires_at_ms FROM tenant_keys
         WHERE expires_at_ms IS NULL OR expires_at_ms > ? ORDER BY created_at_ms",
    )
    .bind(now)
    .fetch_all(pool)
    .await?;
    let mut by_tenant: HashMap<String, Vec<KeyInfo>> = HashMap::new();
    for k in keys {
        let d: String = k.try_get("digest")?;
        by_tenant.entry(k.try_get("tenant")?).or_default().push(KeyInfo {
            id: d.chars().take(8).collect(),
            created_at_ms: k.try_get("created_at_ms")?,
            expires_at_ms: k.try_get("expires_at_ms")?,
        });
    }
    rows.iter()
        .map(|r| {
            let name: String = r.try_get("name")?;
            let quotas: String = r.try_get("quotas")?;
            Ok(TenantInfo {
                keys: by_tenant.remove(&name).unwrap_or_default(),
                quotas: serde_json::from_str(&quotas).unwrap_or_default(),
                model_route: stored_route(&name, r.try_get("model_route")?),
                created_at_ms: r.try_get("created_at_ms")?,
                from_file: false,
                name,
            })
        })
        .collect()
}

/// The tenant of a sandbox, made through the sandbox API or for a run's attempt.
pub async fn tenant_of_sandbox(pool: &SqlitePool, sandbox: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT tenant FROM sandboxes WHERE id = ?1 UNION ALL SELECT tenant FROM runs WHERE sandbox_id = ?1 LIMIT 1",
    )
    .bind(sandbox)
    .fetch_optional(pool)
    .await
}

/// Per tenant: sandboxes that exist, their memory, and model tokens spent (for `/metrics`).
pub async fn usage(pool: &SqlitePool) -> Result<Vec<(String, i64, i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT t, SUM(n), SUM(m), SUM(k) FROM (
           SELECT tenant AS t, COUNT(*) AS n, COALESCE(SUM(memory_bytes), 0) AS m, 0 AS k FROM sandboxes
             WHERE state != 'Terminated' GROUP BY tenant
           UNION ALL SELECT tenant, 0, 0, model_tokens FROM tenant_usage
           UNION ALL SELECT name, 0, 0, 0 FROM tenants
         ) GROUP BY t",
    )
    .fetch_all(pool)
    .await
}

/// Model tokens a tenant's sandboxes spent so far.
pub async fn model_tokens_used(pool: &SqlitePool, tenant: &str) -> Result<u64, sqlx::Error> {
    let used: Option<i64> = sqlx::query_scalar("SELECT model_tokens FROM tenant_usage WHERE tenant = ?")
        .bind(tenant)
        .fetch_optional(pool)
        .await?;
    Ok(used.unwrap_or(0).max(0).cast_unsigned())
}

pub async fn add_model_tokens(pool: &SqlitePool, tenant: &str, tokens: u64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO tenant_usage (tenant, model_tokens) VALUES (?1, ?2)
         ON CONFLICT (tenant) DO UPDATE SET model_tokens = model_tokens + ?2",
    )
    .bind(tenant)
    .bind(tokens.min(i64::MAX as u64).cast_signed())
    .execute(pool)
    .await
    .map(drop)
}

// ---------------------------------------------------------------------------------------------
// The tenants file

/// `--tenants FILE`: `{"tenants": [{"name", "keySha256": [hex, ...], "quotas": {...}}]}`.
/// It holds digests, never keys: `paddock tenant digest` prints one for a key.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TenantsFile {
    tenants: Vec<FileTenant>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileTenant {
    name: String,
    key_sha256: Vec<String>,
    #[serde(default)]
    quotas: Quotas,
    /// Its own model route, as `paddock tenant set --llm-base` gives one.
    #[serde(default)]
    model_route: Option<ModelRoute>,
}

/// Read again on every reload, on a tokio worker: hence `tokio::fs`.
async fn read_file(path: &Path) -> Result<Vec<FileTenant>, TenantError> {
    let err = |message: String| TenantError::File { path: path.display().to_string(), message };
    let text = tokio::fs::read_to_string(path).await.map_err(|e| err(e.to_string()))?;
    let mut file: TenantsFile = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
    for t in &mut file.tenants {
        validate_name(&t.name).map_err(|e| err(e.to_string()))?;
        if let Some(route) = &mut t.model_route {
            *route = ModelRoute::new(&route.base, route.key_file.as_deref())
                .map_err(|e| err(format!("tenant {}: {e}", t.name)))?;
        }
        for d in &t.key_sha256 {
            if d.len() != 64 || hex::decode(d).is_err() {
                return Err(err(format!(
                    "tenant {}: {d:?} is not a SHA-256 digest in hex (64 digits): make one with `paddock tenant digest`",
                    t.name
                )));
            }
        }
    }
    Ok(file.tenants)
}

/// Checks a tenants file before the server starts, so a typo is an error, not a tenant locked out.
pub async fn check_file(path: &Path) -> Result<usize, TenantError> {
    read_file(path).await.map(|t| t.len())
}

// ---------------------------------------------------------------------------------------------
// What the server holds

#[derive(Default)]
struct Loaded {
    keys: HashMap<[u8; 32], (Tenant, Option<i64>)>,
    quotas: HashMap<Arc<str>, Quotas>,
    routes: HashMap<Arc<str>, ModelRoute>,
}

/// The keys and quotas a running server honours, read again from the database and the file.
pub struct Tenants {
    pool: SqlitePool,
    file: Option<PathBuf>,
    loaded: std::sync::RwLock<Loaded>,
    /// Creates under way per tenant, counted against its sandbox quota until their rows exist.
    pending: std::sync::Mutex<HashMap<Arc<str>, (u64, u64)>>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Tenants {
    pub async fn open(
        pool: SqlitePool,
        file: Option<PathBuf>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Result<Arc<Self>, TenantError> {
        let me = Arc::new(Self { metrics, pool, file, loaded: Default::default(), pending: Default::default() });
        me.reload().await?;
        Ok(me)
    }

    async fn reload(&self) -> Result<(), TenantError> {
        let mut next = Loaded::default();
        let now = now_ms();
        let rows = sqlx::query(
            "SELECT k.digest, k.tenant, k.expires_at_ms, t.quotas FROM tenant_keys k JOIN tenants t ON t.name = k.tenant
             WHERE k.expires_at_ms IS NULL OR k.expires_at_ms > ?",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        for r in rows {
            let d: String = r.try_get("digest")?;
            let Some(d) = hex::decode(&d).ok().and_then(|d| <[u8; 32]>::try_from(d).ok()) else { continue };
            let name: String = r.try_get("tenant")?;
            let quotas: String = r.try_get("quotas")?;
            let tenant = Tenant::named(&name);
            next.quotas.entry(tenant.0.clone()).or_insert_with(|| serde_json::from_str(&quotas).unwrap_or_default());
            next.keys.insert(d, (tenant, r.try_get("expires_at_ms")?));
        }
        let routes: Vec<(String, Option<String>)> =
            sqlx::query_as("SELECT name, model_route FROM tenants WHERE model_route IS NOT NULL")
                .fetch_all(&self.pool)
                .await?;
        for (name, json) in routes {
            if let Some(route) = stored_route(&name, json) {
                next.routes.insert(Arc::from(name.as_str()), route);
            }
        }
        if let Some(path) = &self.file {
            for t in read_file(path).await? {
                let tenant = Tenant::named(&t.name);
                for d in &t.key_sha256 {
                    if let Some(d) = hex::decode(d).ok().and_then(|d| <[u8; 32]>::try_from(d).ok()) {
                        next.keys.insert(d, (tenant.clone(), None));
                    }
                }
                next.quotas.insert(tenant.0.clone(), t.quotas);
                if let Some(route) = t.model_route {
                    next.routes.insert(tenant.0.clone(), route);
                }
            }
        }
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }

    /// Reads the tenants again every [`RELOAD_EVERY`]; a bad file keeps the last good view.
    pub async fn keep_fresh(self: Arc<Self>) {
        loop {
            tokio::time::sleep(RELOAD_EVERY).await;
            if let Err(e) = self.reload().await {
                tracing::warn!("reading the tenants again: {e}");
            }
        }
    }

    fn lookup(&self, d: &[u8; 32]) -> Option<Tenant> {
        let loaded = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        let (tenant, expires) = loaded.keys.get(d)?;
        expires.is_none_or(|e| e > now_ms()).then(|| tenant.clone())
    }

    /// The tenant whose key this is, if any.
    pub async fn resolve(&self, key: &str) -> Option<Tenant> {
        let d = digest(key);
        if let Some(t) = self.lookup(&d) {
            return Some(t);
        }
        // A key the CLI added since the last reload works on its first use: one indexed
        // lookup of its digest (a wrong key costs the same, never a whole reload).
        let row: Option<(String, Option<i64>, String, Option<String>)> = sqlx::query_as(
            "SELECT k.tenant, k.expires_at_ms, t.quotas, t.model_route FROM tenant_keys k JOIN tenants t ON t.name = k.tenant
             WHERE k.digest = ? AND (k.expires_at_ms IS NULL OR k.expires_at_ms > ?)",
        )
        .bind(hex::encode(d))
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await
        .inspect_err(|e| tracing::warn!("looking up a tenant key: {e}"))
        .ok()
        .flatten();
        let (name, expires, quotas, route) = row?;
        let tenant = Tenant::named(&name);
        // Its model route too: a tenant added with one creates sandboxes that have it at once.
        let route = stored_route(&name, route);
        let mut loaded = self.loaded.write().unwrap_or_else(|p| p.into_inner());
        loaded.quotas.entry(tenant.0.clone()).or_insert_with(|| serde_json::from_str(&quotas).unwrap_or_default());
        if let Some(route) = route {
            loaded.routes.entry(tenant.0.clone()).or_insert(route);
        }
        loaded.keys.insert(d, (tenant.clone(), expires));
        Some(tenant)
    }

    /// Whether any tenant besides the default one exists (else ownership needs no checking).
    pub fn any(&self) -> bool {
        !self.loaded.read().unwrap_or_else(|p| p.into_inner()).quotas.is_empty()
    }

    pub fn quotas(&self, tenant: &Tenant) -> Quotas {
        if tenant.is_default() {
            return Quotas::default();
        }
        self.loaded.read().unwrap_or_else(|p| p.into_inner()).quotas.get(&tenant.0).cloned().unwrap_or_default()
    }

    /// The tenant's own model route (`paddock tenant set --llm-base`, or the tenants file).
    pub fn model_route(&self, tenant: &Tenant) -> Option<ModelRoute> {
        self.loaded.read().unwrap_or_else(|p| p.into_inner()).routes.get(&tenant.0).cloned()
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Counts a refusal by a quota (`/metrics`: `paddock_quota_refusals_total`).
    pub fn refused(&self, tenant: &Tenant, quota: &str) {
        self.metrics.quota_refused(tenant.as_str(), quota);
    }

    /// Reserves room for one sandbox of `memory` bytes against the tenant's quotas, given
    /// what its existing sandboxes hold (`held`: count, memory). The reservation ends when the
    /// returned guard drops, after the create recorded its row or failed.
    pub fn reserve(
        self: &Arc<Self>,
        tenant: &Tenant,
        held: (u64, u64),
        memory: u64,
    ) -> Result<Reservation, (&'static str, ApiError)> {
        let q = self.quotas(tenant);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let p = pending.entry(tenant.0.clone()).or_default();
        let (count, bytes) = (held.0 + p.0, held.1 + p.1);
        if let Some(max) = q.sandboxes
            && count + 1 > max
        {
            return Err(("sandboxes", quota_refusal(tenant, "sandboxes", format!("{count} of {max} sandboxes exist"))));
        }
        if let Some(max) = q.memory_bytes
            && bytes.saturating_add(memory) > max
        {
            let f = paddock_core::units::format_bytes;
            return Err((
                "memory",
                quota_refusal(
                    tenant,
                    "memory",
                    format!("its sandboxes hold {} of {}, and this one asks for {}", f(bytes), f(max), f(memory)),
                ),
            ));
        }
        p.0 += 1;
        p.1 += memory;
        Ok(Reservation { tenants: self.clone(), tenant: tenant.0.clone(), memory })
    }
}

/// A create's room in its tenant's quotas while it is under way.
pub struct Reservation {
    tenants: Arc<Tenants>,
    tenant: Arc<str>,
    memory: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut pending = self.tenants.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pending.get_mut(&self.tenant) {
            p.0 = p.0.saturating_sub(1);
            p.1 = p.1.saturating_sub(self.memory);
        }
    }
}

#[cfg(test)]
#[expect(clippy::disallowed_methods, reason = "a test's fixtures may block: each test has a runtime of its own")]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tenants_file_gives_model_routes_normalised_and_refuses_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.json");
        let digest = digest_hex("k");
        let file = |route: &str| {
            std::fs::write(
                &path,
                format!(r#"{{"tenants": [{{"name": "acme", "keySha256": ["{digest}"], "modelRoute": {route}}}]}}"#),
            )
            .unwrap();
        };
        file(r#"{"base": "http://192.0.2.7//v1/", "keyFile": "/run/keys/acme"}"#);
        let read = read_file(&path).await.unwrap();
        let route = read[0].model_route.as_ref().unwrap();
        assert_eq!(route.base, "http://192.0.2.7/v1");
        assert_eq!(route.key_file.as_deref(), Some(Path::new("/run/keys/acme")));
        for bad in [r#"{"base": "ftp://x"}"#, r#"{"base": "http://x", "key": "sk-inline"}"#] {
            file(bad);
            let e = read_file(&path).await.unwrap_err().to_string();
            assert!(e.contains("tenants.json"), "{bad}: {e}");
        }
    }

    #[test]
    fn names_are_checked() {
        for ok in ["acme", "team-7", "a"] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "Acme", "7team", "a_b", "a.b", "team-", &"x".repeat(41)] {
            assert!(matches!(validate_name(bad), Err(TenantError::BadName(_))), "{bad}");
        }
        assert!(matches!(validate_name("default"), Err(TenantError::Reserved)));
    }

    #[test]
    fn each_tenant_has_names_of_its_own() {
        let (a, b, d) = (Tenant::named("acme"), Tenant::named("beta"), Tenant::default_tenant());
        assert_eq!(scoped(&d, "work"), "work");
        assert_eq!(scoped(&a, "work"), "t.acme.work");
        assert_eq!(unscoped(&a, "t.acme.work"), Some("work"));
        assert_eq!(unscoped(&b, "t.acme.work"), None);
        assert_eq!(unscoped(&d, "t.acme.work"), None);
        assert_eq!(unscoped(&a, "work"), None);
        assert_eq!(unscoped(&d, "work"), Some("work"));
        // No name a user gives can be another tenant's.
        assert!(check_user_name("workspace", "t.acme.work").is_err());
        assert!(check_user_name("workspace", "tea").is_ok());
    }

    #[test]
    fn keys_are_random_and_only_digests_are_compared() {
        let (k1, k2) = (new_key().unwrap(), new_key().unwrap());
        assert_ne!(k1, k2);
        assert!(k1.starts_with("pdk_") && k1.len() == 68);
        assert_eq!(digest(&k1), digest(&k1.clone()));
        assert_ne!(digest(&k1), digest(&k2));
    }

    #[tokio::test]
    async fn add_rotate_and_remove_take_effect_for_a_running_server() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("s.db")).await.unwrap();
        let pool = store.pool().clone();
        let tenants = Tenants::open(pool.clone(), None, Default::default()).await.unwrap();
        assert!(!tenants.any());
        let quotas = Quotas { sandboxes: Some(2), ..Default::default() };
        let k1 = add(&pool, "acme", &quotas).await.unwrap();
        assert!(matches!(add(&pool, "acme", &quotas).await, Err(TenantError::Exists(_))));
        // Honoured on its first use, without waiting for the periodic reload.
        assert_eq!(tenants.resolve(&k1).await, Some(Tenant::named("acme")));
        assert!(tenants.any());
        assert_eq!(tenants.quotas(&Tenant::named("acme")), quotas);
        // Rotated with a grace: both keys work; without one, only the new key.
        let k2 = rotate(&pool, "acme", Duration::from_secs(60)).await.unwrap();
        tenants.reload().await.unwrap();
        assert_eq!(tenants.resolve(&k1).await, Some(Tenant::named("acme")));
        assert_eq!(tenants.resolve(&k2).await, Some(Tenant::named("acme")));
        let k3 = rotate(&pool, "acme", Duration::ZERO).await.unwrap();
        tenants.reload().await.unwrap();
        assert_eq!(tenants.resolve(&k1).await, None);
        assert_eq!(tenants.resolve(&k2).await, None);
        assert_eq!(tenants.resolve(&k3).await, Some(Tenant::named("acme")));
        let listed = list(&pool).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].keys.len(), 1, "expired keys are not listed: {listed:?}");
        // Nothing of a key is in the database (or its log) but its digest.
        for f in ["s.db", "s.db-wal"] {
            let bytes = std::fs::read(dir.path().join(f)).unwrap_or_default();
            for k in [&k1, &k2, &k3] {
                assert!(!bytes.windows(k.len() - 4).any(|w| w == &k.as_bytes()[4..]), "{f} holds a key");
            }
        }
        remove(&pool, "acme").await.unwrap();
        tenants.reload().await.unwrap();
        assert_eq!(tenants.resolve(&k3).await, None);
        assert!(matches!(remove(&pool, "acme").await, Err(TenantError::NotFound(_))));
    }

    #[tokio::test]
    async fn reservations_hold_the_quota_while_creates_are_under_way() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("s.db")).await.unwrap();
        let pool = store.pool().clone();
        let quotas = Quotas { sandboxes: Some(2), memory_bytes: Some(3 << 30), ..Default::default() };
        add(&pool, "acme", &quotas).await.unwrap();
        let tenants = Tenants::open(pool, None, Default::default()).await.unwrap();
        let acme = Tenant::named("acme");
        let r1 = tenants.reserve(&acme, (0, 0), 1 << 30).unwrap();
        let r2 = tenants.reserve(&acme, (0, 0), 1 << 30).unwrap();
        let (quota, e) = tenants.reserve(&acme, (0, 0), 1 << 30).err().unwrap();
        assert_eq!(quota, "sandboxes");
        assert_eq!((e.status, e.code), (StatusCode::TOO_MANY_REQUESTS, "QUOTA_EXCEEDED"));
        assert!(e.message.contains("quota sandboxes"), "{}", e.message);
        drop(r1);
        let (_, e) = tenants.reserve(&acme, (0, 0), 3 << 30).err().unwrap();
        assert!(e.message.contains("quota memory"), "{}", e.message);
        drop(r2);
        tenants.reserve(&acme, (1, 1 << 30), 2 << 30).unwrap();
        // The default tenant has no quotas.
        tenants.reserve(&Tenant::default_tenant(), (1000, u64::MAX / 2), 1 << 30).unwrap();
    }
}
