//! `paddock serve`: an HTTP server in front of a [`Runtime`], compatible with OpenSandbox's
//! lifecycle and execd APIs (so the `opensandbox` SDK works unchanged), plus Paddock's own
//! workspace API. State lives in SQLite; sandboxes belong to the runtime and outlive the server.

pub mod activity;
pub mod api;
mod boot;
pub mod budget;
pub mod config;
pub mod conns;
pub mod deadline;
mod egress;
pub mod error;
pub mod execd;
pub mod health;
pub mod lifecycle;
pub mod llm;
pub mod metrics;
pub mod model_base;
pub mod model_usage;
pub mod proxy;
mod proxy_pool;
pub mod resources;
pub mod routes;
pub mod runs;
pub mod secrets;
mod slow;
pub mod state;
pub mod store;
pub mod tenants;
mod tickets;
pub mod time_fmt;
pub mod tunnels;
mod unread;
pub mod vault;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use paddock_core::runtime::Runtime;
use tower_http::request_id::{MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};

pub use api::{
    API_KEY_ALIAS, API_KEY_HEADER, ApiJson, EGRESS_PORT, EXECD_PORT, EXECD_TOKEN_HEADER, JSON_BODY_LIMIT,
    SANDBOX_TOKEN_HEADER,
};
use api::{KeyInAlias, constant_time_eq, json_too_large, proxied_port_of, sandbox_id_of};
pub use config::{ConfigError, ServerConfig};
use error::{ApiError, ErrorCode};
use state::AppState;

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    // The causes are part of the message, not chained sources, so they print once.
    #[error("opening the state database {path}: {cause}")]
    Store { path: String, cause: sqlx::Error },
    #[error("cannot listen on {addr} ({cause}): choose another --listen address or stop what uses it")]
    Listen { addr: std::net::SocketAddr, cause: std::io::Error },
    #[error(transparent)]
    Secret(#[from] secrets::SecretError),
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    #[error(
        "cannot listen for the runs' gateway ({cause}): choose another --gateway-listen address (port 0 picks a free one)"
    )]
    Gateway { cause: std::io::Error },
    #[error("{0}")]
    Llm(String),
    #[error(transparent)]
    Tenants(#[from] tenants::TenantError),
}

/// Starts the work a server does besides answering requests: runs are taken back from servers
/// that ended and admitted from now on. `serve` calls it once it listens (a server that cannot
/// listen must not start work it will not finish); a caller that serves the router some other
/// way calls it itself.
pub async fn start_background(state: &AppState) {
    state.runs.recover().await;
    tokio::spawn(state.runs.clone().schedule());
    tokio::spawn(state.tenants.clone().keep_fresh());
}

/// Builds the whole application around a runtime.
pub async fn build_state(mut config: ServerConfig, rt: Arc<dyn Runtime>) -> Result<AppState, ServeError> {
    // A workspace size the operator did not give is the runtime's (Kubernetes: its PVC size).
    config.workspace_bytes = config
        .workspace_bytes
        .or(rt.capabilities().default_workspace_bytes)
        .or(Some(paddock_core::spec::DEFAULT_WORKSPACE));
    config.validate()?;
    let (before, after) = health::raise_descriptor_limit();
    if before != after {
        tracing::info!(?before, ?after, "raised the open-file limit to the hard limit");
    }
    secrets::ensure_data_dir(&config.data_dir)?;
    let path = config.data_dir.join("server.db");
    secrets::prepare_database_file(&path)?;
    let token_key = Arc::new(secrets::TokenKey::load_or_create(&config.data_dir)?);
    let store = store::Store::open(&path)
        .await
        .map_err(|cause| ServeError::Store { path: path.display().to_string(), cause })?;
    let metrics = Arc::new(metrics::Metrics::default());
    let tenants = tenants::Tenants::open(store.pool().clone(), config.tenants_file.clone(), metrics.clone()).await?;
    let config_budget = config.max_request_memory;
    let config_data_dir = config.data_dir.clone();
    let rt: Arc<dyn Runtime> = Arc::new(deadline::Deadlined::new(rt, config.deadlines));
    let boot = Arc::new(boot::Boot::start(&config_data_dir)?);
    let models = llm::Routes::new(config.llm.clone().unwrap_or_default(), tenants.clone());
    let runs = runs::Runs::new(
        config.runs.clone(),
        rt.clone(),
        store.pool().clone(),
        token_key.clone(),
        runs::Home {
            data_dir: config_data_dir.clone(),
            boot: boot.id().to_owned(),
            workspace: (config.workspace_bytes, config.workspace_inodes),
            llm: models.clone(),
        },
    );
    let model_route =
        llm::router(llm::Llm::new(models.clone(), token_key.clone(), tenants.clone()).map_err(ServeError::Llm)?);
    runs::gateway::listen(runs.clone(), Some(model_route)).await.map_err(|cause| ServeError::Gateway { cause })?;
    let tunnels = tunnels::Tunnels::new(config.tunnels.clone());
    let state = AppState {
        models,
        rt,
        store,
        config: Arc::new(config),
        commands: Arc::new(execd::Commands::default()),
        metrics,
        draining: Arc::new(AtomicBool::new(false)),
        token_key,
        tickets: Default::default(),
        pool: Default::default(),
        tunnels,
        budget: budget::MemoryBudget::new(config_budget),
        boot,
        runs: runs.clone(),
        renewals: Default::default(),
        activity: Default::default(),
        tenants,
    };
    lifecycle::reconcile(&state).await;
    Ok(state)
}

#[derive(Clone, Default)]
struct MakeId;

impl MakeRequestId for MakeId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let mut b = [0u8; 16];
        rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).ok()?;
        HeaderValue::from_str(&hex::encode(b)).ok().map(RequestId::new)
    }
}

/// The router: lifecycle and workspace API under `/v1` and at the root, sandbox routes (execd,
/// egress, port proxy) under `/v1/sandboxes/{id}/proxy/{port}`, and the unauthenticated
/// `/health`, `/version`, `/metrics`.
pub fn app(state: AppState) -> Router {
    // Bodies are read (and room for them reserved) only once the credential is known good:
    // the budget's shares are by credential, which an unauthenticated client could vary.
    let api = lifecycle::router()
        .merge(runs::api::router())
        .route_layer(middleware::from_fn_with_state(state.budget.clone(), budget::reserve_body))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    let sandbox = proxy::router(state.config.max_upload_bytes)
        .route_layer(middleware::from_fn_with_state(state.budget.clone(), budget::reserve_body))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key_or_sandbox_token));
    let request_id = HeaderName::from_static("x-request-id");
    let inner = Router::new()
        .route("/health", get(health::health))
        .route("/version", get(|| async { axum::Json(serde_json::json!({"version": env!("CARGO_PKG_VERSION")})) }))
        .route("/metrics", get(metrics_text))
        .nest("/v1", lifecycle::public_router().merge(api.clone()).merge(sandbox.clone()))
        .merge(lifecycle::public_router())
        .merge(api)
        .merge(sandbox)
        .fallback(any(|| async { ApiError::not_found("no such route: see /v1/openapi.json for the API") }))
        .layer(DefaultBodyLimit::max(JSON_BODY_LIMIT))
        .layer(middleware::from_fn(too_large_as_json))
        .layer(middleware::from_fn_with_state(state.clone(), count_errors))
        .layer(middleware::from_fn(unread::close_when_unread))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestIdLayer::new(request_id, MakeId))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            ApiError::internal("the server hit a bug handling this request; it has been logged").into_response()
        }))
        .with_state(state.clone());
    // A layer on a router runs after its routing, so a routed request (Host, header, `/r/`) is
    // rewritten to the path form by an outer router that routes nothing itself.
    Router::new().fallback_service(inner).layer(middleware::from_fn_with_state(state, routes::ingress))
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    egress::refresh_metrics(&state).await;
    let mut r = state.metrics.encode().into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}

/// axum's body-limit rejection is plain text; every API error is `{code, message}`. Answers of
/// a sandbox's own server, forwarded by the port proxy, pass untouched.
async fn too_large_as_json(req: Request, next: Next) -> Response {
    let forwarded = proxied_port_of(req.uri().path()).is_some_and(|p| p != EXECD_PORT && p != EGRESS_PORT);
    let response = next.run(req).await;
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE
        && response.extensions().get::<ErrorCode>().is_none()
        && !forwarded
    {
        return json_too_large().into_response();
    }
    response
}

async fn count_errors(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
    let response = next.run(req).await;
    if let Some(ErrorCode(code)) = response.extensions().get::<ErrorCode>() {
        state.metrics.errors.get_or_create(&metrics::CodeLabel { code: (*code).to_owned() }).inc();
    }
    tracing::info!(request_id = %id, %method, %path, status = response.status().as_u16(), "request");
    response
}

/// The tenant whose API key the request carries: the server's own key is the default tenant,
/// and a tenant's key (`tenants`) its tenant. Without auth, everything is the default tenant's.
async fn api_key_tenant(state: &AppState, headers: &HeaderMap) -> Result<(tenants::Tenant, bool), ApiError> {
    let Some(expected) = &state.config.api_key else { return Ok((tenants::Tenant::default_tenant(), false)) };
    let (given, alias) = match headers.get(API_KEY_HEADER) {
        Some(v) => (Some(v), false),
        None => (headers.get(API_KEY_ALIAS), true),
    };
    match given {
        None => Err(ApiError::unauthorized(
            "MISSING_API_KEY",
            format!(
                "missing API key: send it in the OPEN-SANDBOX-API-KEY header (or X-API-Key; the SDK reads OPEN_SANDBOX_API_KEY); this server's key is {}",
                state.config.api_key_location
            ),
        )),
        Some(v) if constant_time_eq(v.as_bytes(), expected.as_bytes()) => {
            Ok((tenants::Tenant::default_tenant(), alias))
        }
        Some(v) => match v.to_str().ok().filter(|k| k.starts_with("pdk_")) {
            Some(k) => match state.tenants.resolve(k).await {
                Some(t) => Ok((t, alias)),
                None => Err(ApiError::unauthorized(
                    "INVALID_API_KEY",
                    "invalid API key: no tenant has this key (a rotated key stops working when its grace ends; ask the operator for the current one: paddock tenant rotate)",
                )),
            },
            None => Err(ApiError::unauthorized(
                "INVALID_API_KEY",
                format!(
                    "invalid API key in OPEN-SANDBOX-API-KEY: this server's key is {}",
                    state.config.api_key_location
                ),
            )),
        },
    }
}

/// Marks the request with its tenant, and refuses one for an object of another tenant with the
/// same 404 as for one that does not exist (so no tenant learns another's ids).
async fn admit(state: &AppState, req: &mut Request, tenant: tenants::Tenant, alias: bool) -> Result<(), ApiError> {
    let path = req.uri().path().to_owned();
    tenant_owns_path(state, &tenant, &path).await?;
    if alias {
        req.extensions_mut().insert(KeyInAlias);
    }
    req.extensions_mut().insert(tenant);
    Ok(())
}

/// The one place a sandbox's tenant is compared with the caller's, for every route under
/// `/sandboxes/{id}` (lifecycle, execd, egress, vault, port proxy, tickets, links).
async fn tenant_owns_path(state: &AppState, tenant: &tenants::Tenant, path: &str) -> Result<(), ApiError> {
    if tenant.is_default() && !state.tenants.any() {
        return Ok(());
    }
    let Some(id) = sandbox_id_of(path) else { return Ok(()) };
    let owner = state.store.tenant_of(&id).await?;
    let mine = match owner {
        Some(owner) => owner == tenant.as_str(),
        // Not recorded yet: only the default tenant may adopt what the CLI made.
        None => tenant.is_default(),
    };
    if mine {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("no sandbox {id}: list sandboxes with GET /v1/sandboxes")))
    }
}

async fn require_api_key(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let admitted = match api_key_tenant(&state, req.headers()).await {
        Ok((tenant, alias)) => admit(&state, &mut req, tenant, alias).await,
        Err(e) => Err(e),
    };
    match admitted {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Sandbox routes accept the API key (proxy mode) or the token of that very sandbox (direct
/// mode, where the SDK sends only the endpoint's headers). A token never opens another sandbox.
async fn require_key_or_sandbox_token(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if let Err(refused) = key_or_token(&state, &mut req).await {
        return refused.into_response();
    }
    // An authorised request to a sandbox is a use of it (the idle reaper's clock) until its
    // response has been sent, and renews it when it asked for that.
    match sandbox_id_of(req.uri().path()).filter(|id| paddock_core::runtime::SandboxId::parse(id).is_ok()) {
        Some(id) => {
            let using = state.activity.begin(&id);
            let renew = state.clone();
            tokio::spawn(async move { lifecycle::renew_on_access(&renew, &id).await });
            next.run(req).await.map(|body| activity::Held::wrap(body, using))
        }
        None => next.run(req).await,
    }
}

/// Whether a request may reach a sandbox's routes: the API key of the sandbox's tenant, a
/// route's own grant for that sandbox, or that very sandbox's token.
async fn key_or_token(state: &AppState, req: &mut Request) -> Result<(), ApiError> {
    let keyed = api_key_tenant(state, req.headers()).await;
    if let Ok((tenant, alias)) = keyed {
        return admit(state, req, tenant, alias).await;
    }
    // A signed route or a ticket opens the sandbox it was made for, and no other.
    if let Some(routes::RouteGrant(id)) = req.extensions().get::<routes::RouteGrant>()
        && sandbox_id_of(req.uri().path()).as_deref() == Some(id.as_str())
    {
        return Ok(());
    }
    // A token is checked against the id in the path, so it never opens another sandbox.
    let token = req.headers().get(SANDBOX_TOKEN_HEADER).or_else(|| req.headers().get(EXECD_TOKEN_HEADER));
    let Some((id, token)) = sandbox_id_of(req.uri().path()).zip(token) else { return keyed.map(drop) };
    // The egress port changes what the sandbox may reach, which the sandbox's own token must not
    // (whoever holds it runs code in the sandbox): it takes the API key or the egress token that
    // only an endpoint of port 18080, asked for with the API key, hands out. The sandbox's token
    // may still read the policy.
    if proxied_port_of(req.uri().path()) == Some(EGRESS_PORT) {
        if state.token_key.verify_egress(&id, token.as_bytes()) {
            return Ok(());
        }
        let reads = matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD);
        return match state.token_key.verify(&id, token.as_bytes()) {
            true if reads => Ok(()),
            true => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "EGRESS_NEEDS_API_KEY",
                "a sandbox token may read this sandbox's egress policy but not change it: send the API key, or the headers of this sandbox's endpoint for port 18080",
            )),
            false => Err(ApiError::unauthorized(
                "INVALID_SANDBOX_TOKEN",
                "this token does not open this sandbox's egress API",
            )),
        };
    }
    if state.token_key.verify(&id, token.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::unauthorized("INVALID_SANDBOX_TOKEN", "this token does not open this sandbox"))
    }
}

/// Without an API key, anything that can make this host send a request could drive the server:
/// a web page can, through DNS rebinding (its own name resolving to 127.0.0.1) or plain
/// cross-origin requests. So with --insecure-no-auth a request must name this server by a
/// loopback address and its port in Host, come from no web origin or a loopback one, and send
/// JSON as `application/json`, which a page cannot do cross-origin without a CORS preflight
/// (that this server never answers).
async fn local_only(port: u16, req: Request, next: Next) -> Response {
    match check_local(port, &req) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

fn check_local(port: u16, req: &Request) -> Result<(), ApiError> {
    let header = |name| req.headers().get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let host = header(axum::http::header::HOST).or_else(|| req.uri().authority().map(|a| a.to_string()));
    if !host.as_deref().is_some_and(|h| host_is_local(h, Some(port))) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "FORBIDDEN_HOST",
            format!(
                "without an API key this server answers only requests addressed to it by a loopback address (Host {host:?}): use http://127.0.0.1:{port}, or start it with an API key"
            ),
        ));
    }
    if let Some(origin) = header(axum::http::header::ORIGIN) {
        let local = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|authority| host_is_local(authority, None));
        if !local {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "FORBIDDEN_ORIGIN",
                format!(
                    "without an API key this server refuses requests from web pages of other origins ({origin}): call it from a program, or start it with an API key"
                ),
            ));
        }
    }
    let has_body = req.headers().contains_key(axum::http::header::TRANSFER_ENCODING)
        || header(axum::http::header::CONTENT_LENGTH).is_some_and(|n| n.trim() != "0");
    let path = req.uri().path();
    // Uploads are multipart, and the port proxy forwards whatever the sandbox's server takes.
    let not_json =
        path.ends_with("/files/upload") || proxied_port_of(path).is_some_and(|p| p != EXECD_PORT && p != EGRESS_PORT);
    if has_body && !not_json {
        let content_type = header(axum::http::header::CONTENT_TYPE).unwrap_or_default();
        let media = content_type.split(';').next().unwrap_or_default().trim();
        if !media.eq_ignore_ascii_case("application/json") {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UNSUPPORTED_MEDIA_TYPE",
                format!("this route takes JSON, sent as Content-Type: application/json (got {content_type:?})"),
            ));
        }
    }
    Ok(())
}

/// Whether a Host (or an Origin's authority) names this machine's loopback: `localhost` or a
/// loopback address, with `port` when one is required (a Host without a port means 80).
fn host_is_local(authority: &str, port: Option<u16>) -> bool {
    let (name, given) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((ip, rest)) => (ip, rest.strip_prefix(':')),
            None => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((name, p)) => (name, Some(p)),
            None => (authority, None),
        },
    };
    let loopback =
        name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    let port_ok = match (port, given) {
        (None, _) => true,
        (Some(want), Some(p)) => p.parse::<u16>().ok() == Some(want),
        (Some(want), None) => want == 80,
    };
    loopback && port_ok
}

/// Serves until SIGTERM or SIGINT, then drains for at most `drain`: the listener stays open,
/// but new sandboxes and runs are refused with 503 (and `/health` says draining), requests in
/// flight and running attempts finish, and then the server exits; sandboxes keep running.
/// `ready` is called with the bound address once the server accepts connections.
///
/// Connections are served by hyper directly (not `axum::serve`) for what a server facing slow
/// or hostile clients needs: a deadline on request headers, which hyper also applies while a
/// keep-alive connection waits for its next request, and a cap on connections served at once.
pub async fn serve(
    state: AppState,
    drain: Duration,
    ready: impl FnOnce(std::net::SocketAddr),
) -> Result<(), ServeError> {
    let addr = state.config.listen;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|cause| ServeError::Listen { addr, cause })?;
    let bound = listener.local_addr().unwrap_or(addr);
    start_background(&state).await;
    ready(bound);
    tokio::spawn(lifecycle::reaper(state.clone()));
    let draining = state.draining.clone();
    let runs = state.runs.clone();
    let max_connections = state.config.max_connections;
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let conns = conns::Conns::new(state.config.max_connections_per_peer);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(state.config.header_timeout);
    let no_auth = state.config.api_key.is_none();
    let stall = state.config.header_timeout;
    let tracked = conns.clone();
    let mut router = app(state)
        .layer(middleware::from_fn(move |req: Request, next: Next| slow::body_deadline(stall, req, next)))
        .layer(middleware::from_fn(move |req: Request, next: Next| in_flight(tracked.clone(), req, next)));
    if no_auth {
        let port = bound.port();
        router = router.layer(middleware::from_fn(move |req: Request, next: Next| local_only(port, req, next)));
    }

    // Draining is done by hand: hyper-util's graceful shutdown does not take a connection that
    // may be upgraded (a WebSocket through the port proxy).
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    tokio::pin!(shutdown);
    loop {
        // A slot first, then accept: at the cap, new connections wait in the kernel's backlog
        // instead of costing a descriptor and a task each. While they wait, the connection
        // longest without a request in flight (one trickling its headers) is closed for them.
        let slot = loop {
            if let Ok(slot) = slots.clone().try_acquire_owned() {
                break Some(slot);
            }
            conns.evict_idlest(None);
            tokio::select! {
                slot = slots.clone().acquire_owned() => break Some(slot.expect("the semaphore is never closed")),
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
                () = &mut shutdown => break None,
            }
        };
        let Some(slot) = slot else { break };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => (tcp, peer),
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted: pause
                    // rather than spin, and keep serving the connections already open.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Streamed events are small writes; without TCP_NODELAY each one after the first waits
        // for the client's delayed ACK (about 40 ms).
        // A peer past its share, all of whose connections are serving, is refused this one.
        let Some(registered) = conns.register(peer.ip()) else { continue };
        let _ = tcp.set_nodelay(true);
        let tcp = slow::WriteDeadline::new(tcp, stall);
        let this = registered.conn.clone();
        let this_conn = registered.conn.clone();
        let service = hyper_util::service::TowerToHyperService::new(tower::ServiceExt::map_request(
            router.clone(),
            move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(this.clone());
                req.extensions_mut().insert(budget::PeerIp(peer.ip()));
                req
            },
        ));
        let conn = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service).with_upgrades();
        let mut drain = drain_rx.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = async { drop(drain.wait_for(|d| *d).await) } => {
                    // A connection accepted just before the drain whose request has not been
                    // read yet would be closed unanswered by a graceful shutdown (hyper closes
                    // a connection with no request in flight): it gets a moment for its first
                    // request, which is then answered (a create with its 503) before it closes.
                    let mut early = None;
                    let grace = tokio::time::Instant::now() + FIRST_REQUEST_GRACE;
                    while !this_conn.has_begun() && tokio::time::Instant::now() < grace {
                        tokio::select! {
                            r = conn.as_mut() => { early = Some(r); break; }
                            () = tokio::time::sleep(Duration::from_millis(10)) => {}
                        }
                    }
                    match early {
                        Some(r) => r,
                        None => {
                            // Finish the request in flight, then close.
                            conn.as_mut().graceful_shutdown();
                            conn.await
                        }
                    }
                }
                // Closed to make room: it had no request in flight.
                () = registered.conn.close.notified() => Ok(()),
            };
            drop(registered);
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection closed with an error");
            }
            drop(slot);
        });
    }
    draining.store(true, Ordering::SeqCst);
    tracing::info!(
        "draining: no new sandboxes or runs; running requests and attempts finish (the gateway stays open); sandboxes keep running"
    );
    // A long stream must not hold the process forever once a drain began: each connection
    // finishes the request in flight, then closes.
    let _ = drain_tx.send(true);
    // Every connection holds a slot until it closes: all slots back means all closed.
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let connections = async {
        tokio::select! {
            _ = slots.acquire_many(all) => {}
            () = tokio::time::sleep(drain) => {}
        }
    };
    let done = async { tokio::join!(connections, runs.drain(drain)) };
    tokio::pin!(done);
    // Until then, new connections are still answered, one request each: a create gets its 503
    // and a client its reason, instead of a refused connection, and reads still work. They do
    // not hold the drain open.
    let late = Arc::new(tokio::sync::Semaphore::new(LATE_CONNECTIONS));
    let mut one_request = http.clone();
    one_request.keep_alive(false);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut done => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = late.clone().try_acquire_owned() else { continue };
        let _ = tcp.set_nodelay(true);
        let tcp = slow::WriteDeadline::new(tcp, stall);
        let service = hyper_util::service::TowerToHyperService::new(tower::ServiceExt::map_request(
            router.clone(),
            move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(budget::PeerIp(peer.ip()));
                req
            },
        ));
        let conn = one_request.serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    Ok(())
}

/// How long a connection accepted just before a drain may take to send its first request.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(2);

/// Connections answered at once while the server drains (one request each).
const LATE_CONNECTIONS: usize = 64;

/// Counts a request as in flight on its connection until its response has been sent, so the
/// connection is never closed to make room while it serves (`conns`).
async fn in_flight(conns: Arc<conns::Conns>, req: Request, next: Next) -> Response {
    match req.extensions().get::<Arc<conns::Conn>>().cloned() {
        Some(conn) => {
            let serving = conns.begin(&conn);
            next.run(req).await.map(|body| activity::Held::wrap(body, serving))
        }
        None => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_are_found_in_both_prefixes() {
        assert_eq!(sandbox_id_of("/v1/sandboxes/sbx-1/proxy/44772/ping").as_deref(), Some("sbx-1"));
        assert_eq!(sandbox_id_of("/sandboxes/sbx-2/proxy/1").as_deref(), Some("sbx-2"));
        assert_eq!(sandbox_id_of("/v1/workspaces/x"), None);
        assert_eq!(sandbox_id_of("/sandboxes/"), None);
    }

    #[test]
    fn only_loopback_hosts_with_our_port_are_local() {
        for ok in ["127.0.0.1:8080", "localhost:8080", "LOCALHOST:8080", "[::1]:8080", "127.1.2.3:8080"] {
            assert!(host_is_local(ok, Some(8080)), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1:9090",
            "127.0.0.1",
            "[::1]",
            "[::1",
            "10.0.0.1:8080",
            "localhost.evil.example:8080",
            "",
        ] {
            assert!(!host_is_local(bad, Some(8080)), "{bad}");
        }
        assert!(host_is_local("localhost", Some(80)));
        assert!(host_is_local("localhost:3000", None) && !host_is_local("evil.example", None));
        assert_eq!(proxied_port_of("/v1/sandboxes/sbx-1/proxy/8000/x"), Some(8000));
        assert_eq!(proxied_port_of("/sandboxes/sbx-1/proxy/44772"), Some(44772));
        assert_eq!(proxied_port_of("/v1/sandboxes/sbx-1/endpoints/8000"), None);
    }

    #[test]
    fn constant_time_eq_compares_bytes() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
