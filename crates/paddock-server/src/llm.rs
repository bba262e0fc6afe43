//! The model route: a sandbox calls its model at `$PADDOCK_LLM_BASE` (and the aliases the
//! operator names, e.g. `OPENAI_BASE_URL`), a path on the gateway that reaches one upstream
//! (`paddock serve --llm-base`, or its tenant's own: `paddock tenant set T --llm-base URL`, or
//! `--llm-tenant-base TENANT=URL`) and nothing
//! else, with that upstream's provider key put in on the way out. The key never enters a
//! sandbox: not its environment, files or requests.
//!
//! Who calls is the sandbox the gateway forwarder names (a local sandbox), or the run whose
//! token is the bearer (a connection without a forwarder). What a sandbox sends as its own
//! credential is dropped. Each call is logged with its sandbox, model, status and tokens (from
//! a non-streamed answer's `usage`), never with its body.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::Response;
use axum::routing::any;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use crate::error::{ApiError, ApiResult};
pub use crate::model_base::normalise_base;
use crate::tenants::Tenant;

/// The route's path on the gateway; the sandbox's variables point at `<gateway>/llm/v1`.
pub const ROUTE: &str = "/llm/v1";
/// The most of a request body read to learn its model (chat requests are far smaller).
const MAX_REQUEST: usize = 8 << 20;
/// The most of a non-streamed answer read to learn its token count; larger ones pass as they come.
const MAX_ANSWER_INSPECTED: u64 = 4 << 20;

/// One model API the route reaches.
#[derive(Clone)]
pub struct Upstream {
    /// Its base, normalised to end in exactly one `/v1`.
    pub base: String,
    /// The provider key, sent upstream as `Authorization: Bearer`; `None` sends none.
    pub key: Option<String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base", &self.base)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The operator's model routes.
#[derive(Debug, Clone, Default)]
pub struct LlmConfig {
    /// The route of every tenant without its own (`--llm-base`); `None`: those have none.
    pub default: Option<Upstream>,
    /// Tenants' own routes (`--llm-tenant-base`), by tenant name.
    pub tenants: std::collections::BTreeMap<String, Upstream>,
    /// Variables besides `PADDOCK_LLM_BASE` that sandboxes get the route's URL in.
    pub env: Vec<String>,
}

impl LlmConfig {
    /// The upstream a tenant's sandboxes reach by the flags: its own, else the server's.
    fn upstream(&self, tenant: &Tenant) -> Option<&Upstream> {
        self.tenants.get(tenant.as_str()).or(self.default.as_ref())
    }
}

/// Where each tenant's calls go: its own route (`paddock tenant set --llm-base`, read again
/// as the tenants are), else its `--llm-tenant-base`, else `--llm-base`.
pub struct Routes {
    config: LlmConfig,
    tenants: Arc<crate::tenants::Tenants>,
}

impl Routes {
    pub fn new(config: LlmConfig, tenants: Arc<crate::tenants::Tenants>) -> Arc<Self> {
        Arc::new(Self { config, tenants })
    }

    fn has_route(&self, tenant: &Tenant) -> bool {
        self.tenants.model_route(tenant).is_some() || self.config.upstream(tenant).is_some()
    }

    /// The variables a sandbox of `tenant` gets: each names the route, under the runtime's
    /// gateway URL (`$PADDOCK_GATEWAY`, which the runtime expands:
    /// `paddock_core::spec::expand_gateway`). None when the tenant has no route.
    pub fn sandbox_env(&self, tenant: &Tenant) -> Vec<(String, String)> {
        if !self.has_route(tenant) {
            return Vec::new();
        }
        let value = format!("${}{ROUTE}", paddock_core::spec::GATEWAY_ENV);
        std::iter::once("PADDOCK_LLM_BASE".to_owned())
            .chain(self.config.env.iter().cloned())
            .map(|k| (k, value.clone()))
            .collect()
    }

    /// The upstream of a call by `tenant`'s sandbox, its key read now from a stored route's file.
    async fn upstream(&self, tenant: &Tenant) -> ApiResult<Upstream> {
        if let Some(route) = self.tenants.model_route(tenant) {
            let key = match &route.key_file {
                None => None,
                Some(path) => Some(read_key(path).await.map_err(|e| {
                    tracing::warn!(tenant = tenant.as_str(), "{e}");
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "MODEL_KEY_UNREADABLE",
                        format!(
                            "tenant {:?}'s model route has no usable provider key: {e}; the operator fixes the file or sets another (paddock tenant set {} --llm-key-file PATH)",
                            tenant.as_str(),
                            tenant.as_str()
                        ),
                    )
                })?),
            };
            return Ok(Upstream { base: route.base, key });
        }
        self.config.upstream(tenant).cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "NO_MODEL_ROUTE",
                format!(
                    "tenant {:?} has no model route: the operator gives it one with paddock tenant set {} --llm-base URL (or paddock serve --llm-base for every tenant)",
                    tenant.as_str(),
                    tenant.as_str()
                ),
            )
        })
    }
}

/// A provider key file's first line (what `--llm-key-file` reads too).
async fn read_key(path: &std::path::Path) -> Result<String, String> {
    let text = tokio::fs::read_to_string(path).await.map_err(|e| format!("reading {}: {e}", path.display()))?;
    let key = text.lines().next().unwrap_or("").trim();
    if key.is_empty() {
        return Err(format!("{} is empty: its first line is the key", path.display()));
    }
    Ok(key.to_owned())
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

pub struct Llm {
    routes: Arc<Routes>,
    client: Client<Https, Body>,
    key: Arc<crate::secrets::TokenKey>,
    /// Whose sandbox calls, and the tenants' model-token quotas.
    tenants: Arc<crate::tenants::Tenants>,
}

impl Llm {
    /// The route's handler. It is mounted whether or not any route exists yet, since
    /// `paddock tenant set` gives one to a running server.
    pub fn new(
        routes: Arc<Routes>,
        key: Arc<crate::secrets::TokenKey>,
        tenants: Arc<crate::tenants::Tenants>,
    ) -> Result<Arc<Self>, String> {
        let builder = match hyper_rustls::HttpsConnectorBuilder::new().with_native_roots() {
            Ok(b) => b,
            // A machine without CA certificates still serves: only an https upstream, which
            // no flag names, fails, with the reason.
            Err(e) if routes.config.default.is_none() && routes.config.tenants.is_empty() => {
                tracing::warn!("no CA certificates on this host ({e}): model routes to https upstreams will fail");
                let tls =
                    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                        .with_safe_default_protocol_versions()
                        .map_err(|e| format!("setting up TLS for the model route: {e}"))?
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls)
            }
            Err(e) => return Err(format!("reading this host's CA certificates for --llm-base: {e}")),
        };
        let https = builder.https_or_http().enable_http1().build();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
        Ok(Arc::new(Self { routes, client, key, tenants }))
    }
}

/// Headers that belong to one connection, or carry the caller's credentials: never forwarded.
fn dropped(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "authorization"
            | "proxy-authorization"
            | "x-api-key"
            | "api-key"
            | "cookie"
            // Answers come back uncompressed, so what they spent can be read from them.
            | "accept-encoding"
            | "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
    )
}

/// Who calls: the sandbox its forwarder named, else the run whose token is the bearer.
fn claimed(llm: &Llm, req: &Request) -> Result<String, Option<(String, i64, String)>> {
    if let Some(sandbox) = req.extensions().get::<crate::runs::origin::Origin>().and_then(|o| o.sandbox.clone()) {
        return Ok(sandbox);
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    Err(bearer.and_then(|t| llm.key.verify_run_token(t)))
}

async fn caller(llm: &Llm, claimed: Result<String, Option<(String, i64, String)>>) -> ApiResult<String> {
    let token = match claimed {
        Ok(sandbox) => return Ok(sandbox),
        Err(token) => token,
    };
    match token {
        // A token is signed for good: it is worth a call only while its attempt runs.
        Some((run, epoch, sandbox)) => {
            let store = crate::runs::store::RunStore::new(llm.tenants.pool().clone());
            if store.is_current(&run, epoch, &sandbox).await? {
                Ok(sandbox)
            } else {
                Err(ApiError::unauthorized(
                    "STALE_ATTEMPT",
                    format!(
                        "the token of run {run}'s attempt {epoch} is no longer current (the attempt ended, or its lease ran out): a run's token calls the model route only while its attempt runs"
                    ),
                ))
            }
        }
        None => Err(ApiError::unauthorized(
            "NOT_A_SANDBOX",
            "the model route answers sandboxes only: call it from inside one, at $PADDOCK_LLM_BASE",
        )),
    }
}

/// The tenant of the calling sandbox, refused with `429` when its model tokens are spent.
async fn admit(llm: &Llm, sandbox: &str) -> ApiResult<Tenant> {
    let pool = llm.tenants.pool();
    let tenant = match crate::tenants::tenant_of_sandbox(pool, sandbox).await? {
        Some(t) => Tenant::named(&t),
        None => Tenant::default_tenant(),
    };
    if let Some(max) = llm.tenants.quotas(&tenant).model_tokens {
        let used = crate::tenants::model_tokens_used(pool, tenant.as_str()).await?;
        if used >= max {
            llm.tenants.refused(&tenant, "modelTokens");
            return Err(crate::tenants::quota_refusal(
                &tenant,
                "modelTokens",
                format!("its sandboxes spent {used} of {max} model tokens"),
            ));
        }
    }
    Ok(tenant)
}

/// Counts what a call spent against its tenant, after the answer.
fn spend(llm: &Llm, tenant: &Tenant, tokens: u64) {
    if tokens == 0 {
        return;
    }
    let pool = llm.tenants.pool().clone();
    let tenant = tenant.as_str().to_owned();
    tokio::spawn(async move {
        if let Err(e) = crate::tenants::add_model_tokens(&pool, &tenant, tokens).await {
            tracing::warn!(%tenant, tokens, "counting model tokens: {e}");
        }
    });
}

/// Finds `"total_tokens": N` in a streamed answer (its last chunk has it when the client
/// asked for `stream_options.include_usage`), across chunk boundaries.
struct UsageScan {
    carry: Vec<u8>,
    found: Option<u64>,
}

impl UsageScan {
    const NEEDLE: &'static [u8] = b"\"total_tokens\"";

    fn feed(&mut self, chunk: &[u8]) {
        let mut text = std::mem::take(&mut self.carry);
        text.extend_from_slice(chunk);
        let mut at = 0;
        while let Some(i) = text[at..].windows(Self::NEEDLE.len()).position(|w| w == Self::NEEDLE) {
            let rest = &text[at + i + Self::NEEDLE.len()..];
            let rest = rest.iter().skip_while(|b| matches!(b, b' ' | b':' | b'\t')).copied();
            let digits: Vec<u8> = rest.take_while(u8::is_ascii_digit).collect();
            if let Some(n) = std::str::from_utf8(&digits).ok().and_then(|d| d.parse().ok()) {
                self.found = Some(n);
            }
            at += i + Self::NEEDLE.len();
        }
        // Keep enough of the tail to see a needle and its number split over two chunks.
        let keep = text.len().saturating_sub(64);
        self.carry = text[keep..].to_vec();
    }
}

async fn forward(State(llm): State<Arc<Llm>>, req: Request) -> ApiResult<Response> {
    let claim = claimed(&llm, &req);
    let sandbox = caller(&llm, claim).await?;
    if let Some(origin) = req.extensions().get::<crate::runs::origin::Origin>() {
        origin.vouch(&sandbox).await?;
    }
    let tenant = admit(&llm, &sandbox).await?;
    let upstream = llm.routes.upstream(&tenant).await?;
    let (parts, body) = req.into_parts();
    let rest = parts.uri.path().strip_prefix(ROUTE).unwrap_or("");
    let target = match parts.uri.query() {
        Some(q) => format!("{}{rest}?{q}", upstream.base),
        None => format!("{}{rest}", upstream.base),
    };
    let uri: Uri = target.parse().map_err(|_| ApiError::bad_request("the path is not valid upstream"))?;
    let bytes = http_body_util::Limited::new(body, MAX_REQUEST)
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request: {e}")))?
        .to_bytes();
    // A streamed completion reports its usage only when asked: asked for here, and the
    // usage-only event taken out again on the way back, so a quota cannot be streamed past.
    let (bytes, hide_usage) = match crate::model_usage::ask_for_usage(rest, &bytes).map_err(ApiError::bad_request)? {
        Some((asked, hide)) => (bytes::Bytes::from(asked), hide),
        None => (bytes, false),
    };
    let model = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["model"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut out = axum::http::Request::builder().method(parts.method.clone()).uri(uri);
    let headers = out.headers_mut().expect("a fresh builder");
    for (k, v) in &parts.headers {
        if !dropped(k) {
            headers.append(k, v.clone());
        }
    }
    if let Some(key) = &upstream.key {
        let mut v = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| ApiError::internal("the provider key is not a valid header value"))?;
        v.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, v);
    }
    let request = out.body(Body::from(bytes)).map_err(|e| ApiError::internal(format!("building the call: {e}")))?;
    let answer = llm.client.request(request).await.map_err(|e| {
        tracing::warn!(%sandbox, model, error = %e, "model call failed upstream");
        ApiError::new(StatusCode::BAD_GATEWAY, "UPSTREAM", format!("the model upstream did not answer: {e}"))
    })?;
    let status = answer.status();
    let (aparts, abody) = answer.into_parts();
    let mut response = Response::builder().status(status);
    let rh: &mut HeaderMap = response.headers_mut().expect("a fresh builder");
    for (k, v) in &aparts.headers {
        // A body whose usage event is taken out is shorter than the upstream said.
        if !dropped(k) || (*k == header::CONTENT_LENGTH && !hide_usage) {
            rh.append(k, v.clone());
        }
    }
    let streamed = aparts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let small = http_body::Body::size_hint(&abody).upper().is_some_and(|n| n <= MAX_ANSWER_INSPECTED);
    if streamed || !small {
        tracing::info!(%sandbox, model, status = status.as_u16(), streamed, "model call");
        // What a streamed answer spent is known at its end: counted when the body is done
        // (or dropped), from the usage its last chunk carries.
        let mut scan = UsageScan { carry: Vec::new(), found: None };
        let counted = Counted { llm: llm.clone(), tenant: tenant.clone(), tokens: 0 };
        let mut counted = Some(counted);
        let body = abody.map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                scan.feed(data);
                if let (Some(n), Some(c)) = (scan.found, counted.as_mut()) {
                    c.tokens = n;
                }
            }
            frame
        });
        let body = if hide_usage { Body::new(crate::model_usage::HideUsage::new(body)) } else { Body::new(body) };
        return response.body(body).map_err(|e| ApiError::internal(format!("answering: {e}")));
    }
    let bytes = abody
        .collect()
        .await
        .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "UPSTREAM", format!("reading the model's answer: {e}")))?
        .to_bytes();
    let tokens =
        serde_json::from_slice::<serde_json::Value>(&bytes).ok().and_then(|v| v["usage"]["total_tokens"].as_u64());
    tracing::info!(%sandbox, model, status = status.as_u16(), tokens, "model call");
    spend(&llm, &tenant, tokens.unwrap_or(0));
    response.body(Body::from(bytes)).map_err(|e| ApiError::internal(format!("answering: {e}")))
}

/// A streamed call's spend, counted when the stream (and this, inside its closure) drops.
struct Counted {
    llm: Arc<Llm>,
    tenant: Tenant,
    tokens: u64,
}

impl Drop for Counted {
    fn drop(&mut self) {
        spend(&self.llm, &self.tenant, self.tokens);
    }
}

pub fn router(llm: Arc<Llm>) -> Router {
    Router::new().route(&format!("{ROUTE}/{{*rest}}"), any(forward)).route(ROUTE, any(forward)).with_state(llm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_answers_usage_is_found_across_chunks() {
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\": 12}}\n\ndata: [DONE]\n\n";
        for split in 0..stream.len() {
            let mut scan = UsageScan { carry: Vec::new(), found: None };
            scan.feed(&stream[..split]);
            scan.feed(&stream[split..]);
            assert_eq!(scan.found, Some(12), "split at {split}");
        }
        let mut none = UsageScan { carry: Vec::new(), found: None };
        none.feed(b"data: {\"choices\":[]}\n\n");
        assert_eq!(none.found, None);
    }

    /// Routes over a fresh database, and the database's pool.
    async fn routes(c: LlmConfig) -> (tempfile::TempDir, Arc<Routes>, sqlx::SqlitePool) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("s.db")).await.unwrap();
        let pool = store.pool().clone();
        let tenants = crate::tenants::Tenants::open(pool.clone(), None, Default::default()).await.unwrap();
        (dir, Routes::new(c, tenants), pool)
    }

    #[tokio::test]
    async fn a_callers_credentials_are_never_forwarded_and_the_key_never_printed() {
        for h in ["authorization", "x-api-key", "api-key", "cookie", "proxy-authorization", "host"] {
            assert!(dropped(&HeaderName::from_static(h)), "{h}");
        }
        assert!(!dropped(&HeaderName::from_static("openai-beta")));
        let up = Upstream { base: "https://x/v1".into(), key: Some("sk-very-secret".into()) };
        let c = LlmConfig { default: Some(up.clone()), tenants: [("acme".into(), up)].into(), env: vec![] };
        assert!(!format!("{c:?}").contains("sk-very-secret"));
        let (_dir, r, _) = routes(LlmConfig { env: vec!["OPENAI_BASE_URL".into()], ..c }).await;
        let env = r.sandbox_env(&Tenant::default_tenant());
        assert_eq!(env[0], ("PADDOCK_LLM_BASE".to_owned(), "$PADDOCK_GATEWAY/llm/v1".to_owned()));
        assert_eq!(env[1].0, "OPENAI_BASE_URL");
    }

    async fn base(r: &Routes, t: &Tenant) -> Result<String, &'static str> {
        r.upstream(t).await.map(|u| u.base).map_err(|e| e.code)
    }

    #[tokio::test]
    async fn a_tenant_reaches_its_stored_route_else_its_flags_else_the_servers_else_none() {
        let up = |b: &str| Upstream { base: b.into(), key: None };
        let c = LlmConfig { default: None, tenants: [("acme".into(), up("https://acme/v1"))].into(), env: vec![] };
        let (acme, other) = (Tenant::named("acme"), Tenant::named("other"));
        let (_dir, r, pool) = routes(c.clone()).await;
        assert_eq!(base(&r, &acme).await, Ok("https://acme/v1".into()));
        assert_eq!(base(&r, &other).await, Err("NO_MODEL_ROUTE"));
        assert_eq!(base(&r, &Tenant::default_tenant()).await, Err("NO_MODEL_ROUTE"));
        assert!(r.sandbox_env(&other).is_empty(), "no route: no variables");
        assert!(!r.sandbox_env(&acme).is_empty());
        // A route of its own (paddock tenant set) comes before the flags.
        let own = crate::tenants::ModelRoute::new("http://192.0.2.9", None).unwrap();
        let key = crate::tenants::add_with_route(&pool, "other", &Default::default(), Some(&own)).await.unwrap();
        r.tenants.resolve(&key).await.unwrap();
        assert_eq!(base(&r, &other).await, Ok("http://192.0.2.9/v1".into()));
        assert!(!r.sandbox_env(&other).is_empty());
        let (_dir, r, _) = routes(LlmConfig { default: Some(up("https://all/v1")), ..c }).await;
        assert_eq!(base(&r, &other).await, Ok("https://all/v1".into()));
        assert_eq!(base(&r, &acme).await, Ok("https://acme/v1".into()));
    }
}
