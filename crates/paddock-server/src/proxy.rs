//! Routes that reach into one sandbox: `/sandboxes/{id}/proxy/{port}/...`.
//!
//! Port 44772 is the execd API and 18080 the egress policy API, both served by Paddock itself,
//! so nothing has to run inside the sandbox. Any other port is forwarded over HTTP/1.1 to a
//! server the sandbox runs on its own loopback, through a connection the runtime opens inside
//! the sandbox's network namespace.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::any;
use hyper_util::rt::TokioIo;
use tower::{Layer, ServiceExt};

use crate::api::{API_KEY_HEADER, ApiPath, EGRESS_PORT, InSandbox, SANDBOX_TOKEN_HEADER};
use crate::error::{ApiError, ApiResult};
use crate::proxy_pool::{PortKey, Sender};
use crate::state::AppState;

pub fn router(max_upload: u64) -> Router<AppState> {
    let max_upload = usize::try_from(max_upload).unwrap_or(usize::MAX);
    let execd = crate::execd::router()
        .layer(axum::middleware::from_fn(move |req: Request, next: Next| upload_limit(max_upload, req, next)));
    Router::new()
        .nest("/sandboxes/{id}/proxy/44772", execd)
        .nest("/sandboxes/{id}/proxy/18080", egress_router())
        .route("/sandboxes/{id}/proxy/{port}", any(forward))
        .route("/sandboxes/{id}/proxy/{port}/", any(forward))
        .route("/sandboxes/{id}/proxy/{port}/{*rest}", any(forward))
}

/// Only file uploads stream up to the upload limit. Every other execd route takes a JSON body
/// (or none) that is read whole into memory, so it keeps the small limit `app` sets: a few huge
/// bodies to `/command` must not be able to exhaust the server's memory.
async fn upload_limit(max_upload: usize, req: Request, next: Next) -> Response {
    if req.uri().path().ends_with("/files/upload") {
        let Ok(response) = DefaultBodyLimit::max(max_upload).layer(next).oneshot(req).await;
        response
    } else {
        next.run(req).await
    }
}

/// The egress policy API of a sandbox (OpenSandbox's sidecar routes, answered by this server).
fn egress_router() -> Router<AppState> {
    Router::new()
        .route("/policy", crate::egress::policy_routes())
        .merge(crate::vault::routes())
        .route("/", any(egress_not_served))
        .route("/{*rest}", any(egress_not_served))
}

/// `501 NOT_SUPPORTED` for egress routes Paddock does not serve.
async fn egress_not_served(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    let path = uri.path();
    let rest = path.split_once(&format!("/proxy/{EGRESS_PORT}")).map_or(path, |(_, r)| r);
    crate::execd::not_supported(
        &method,
        rest,
        "this is not an egress route Paddock serves: /policy and /credential-vault are".into(),
    )
}

/// `{port}` and, below it, `{*rest}` of a proxied route.
#[derive(serde::Deserialize)]
struct ProxyPath {
    port: String,
    rest: Option<String>,
}

async fn forward(
    State(state): State<AppState>,
    InSandbox(sid, _): InSandbox,
    ApiPath(p): ApiPath<ProxyPath>,
    mut req: Request,
) -> ApiResult<Response> {
    let port: u16 = p
        .port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request("the port must be a number from 1 to 65535"))?;
    // The execd and egress ports are answered by this server, never by the sandbox: a path
    // their routers do not match (the bare port, a trailing slash) is unserved, not a 502.
    if port == crate::api::EXECD_PORT || port == EGRESS_PORT {
        let rest = p.rest.as_ref().map(|r| format!("/{r}")).unwrap_or_default();
        let what = if port == EGRESS_PORT {
            "this is not an egress route Paddock serves: /policy and /credential-vault are".into()
        } else {
            crate::execd::unserved_execd_feature(&rest)
        };
        return Err(crate::execd::not_supported(req.method(), &rest, what));
    }
    let bad_gateway = |m: String| ApiError::new(axum::http::StatusCode::BAD_GATEWAY, "UPSTREAM_UNAVAILABLE", m);
    // A WebSocket (or any other upgrade): the client's side of the switch, taken before the
    // request moves on to the sandbox. Its connection is the upgrade's alone, never pooled.
    let client_upgrade = req.headers().contains_key(header::UPGRADE).then(|| hyper::upgrade::on(&mut req));
    // A tunnel's place is taken before the sandbox is dialed, and held until the tunnel ends.
    let tunnel = match client_upgrade {
        Some(_) => Some(state.tunnels.open(sid.as_str()).map_err(|full| {
            let why = match full {
                crate::tunnels::Full::All(n) => {
                    format!("{n} WebSockets are open through this server, its limit (--max-websockets)")
                }
                crate::tunnels::Full::Sandbox(n) => {
                    format!("{n} WebSockets are open to this sandbox, the limit of one (--max-websockets-per-sandbox)")
                }
            };
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "TOO_MANY_WEBSOCKETS",
                format!("{why}: close one, or retry later"),
            )
        })?),
        None => None,
    };
    let key = (sid.to_string(), port);
    let pooled = if client_upgrade.is_none() { state.pool.take(&key) } else { None };

    let rest = p.rest.as_deref().unwrap_or("");
    let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    let uri =
        format!("/{rest}{query}").parse().map_err(|_| ApiError::bad_request("the proxied path is not a valid URI"))?;
    *req.uri_mut() = uri;
    // The platform's credentials are never handed to code in the sandbox.
    let keyed_in_alias = req.extensions().get::<crate::api::KeyInAlias>().is_some();
    let headers = req.headers_mut();
    headers.remove(API_KEY_HEADER);
    headers.remove(SANDBOX_TOKEN_HEADER);
    headers.remove(crate::api::EXECD_TOKEN_HEADER);
    // X-API-Key may be the sandbox's own application's; it goes only when it is ours (the
    // server's key, or the tenant key this request was let in with).
    let ours = state
        .config
        .api_key
        .as_ref()
        .zip(headers.get(crate::api::API_KEY_ALIAS))
        .is_some_and(|(ours, given)| crate::api::constant_time_eq(given.as_bytes(), ours.as_bytes()));
    if ours || keyed_in_alias {
        headers.remove(crate::api::API_KEY_ALIAS);
    }
    headers.insert(
        header::HOST,
        HeaderValue::from_str(&format!("127.0.0.1:{port}")).expect("a host:port is a valid header"),
    );
    // A server in the sandbox that never answers must not hold the request forever.
    let (mut sender, req) = match pooled {
        Some(mut sender) => match sender.try_send_request(req).await {
            Ok(response) => return Ok(finish(&state, key, sender, response)),
            // Not sent at all (the connection went away while idle): a fresh one takes it.
            Err(mut e) if e.message().is_some() => {
                let req = e.take_message().expect("checked");
                (open(&state, &sid, port).await?, req)
            }
            Err(e) => return Err(bad_gateway(format!("port {port} in the sandbox did not answer: {}", e.error()))),
        },
        None => (open(&state, &sid, port).await?, req),
    };
    let mut response = tokio::time::timeout(Duration::from_secs(300), sender.send_request(req))
        .await
        .map_err(|_| bad_gateway(format!("port {port} in the sandbox did not answer within 300s")))?
        .map_err(|e| bad_gateway(format!("port {port} in the sandbox did not answer: {e}")))?;
    if let Some(client_upgrade) = client_upgrade
        && response.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS
    {
        let sandbox_upgrade = hyper::upgrade::on(&mut response);
        // Both sides switched: from here on the bytes are the protocol's, copied as they come
        // until either side closes or the tunnel sits idle.
        let idle = state.tunnels.idle();
        tokio::spawn(async move {
            let _place = tunnel;
            let (Ok(client), Ok(sandbox)) = tokio::join!(client_upgrade, sandbox_upgrade) else { return };
            crate::tunnels::relay(TokioIo::new(client), TokioIo::new(sandbox), idle).await;
        });
        return Ok(response.map(Body::new));
    }
    Ok(finish(&state, key, sender, response))
}

/// A new connection to `port` in the sandbox, speaking HTTP/1.1 (upgrades allowed).
async fn open(state: &AppState, sid: &paddock_core::runtime::SandboxId, port: u16) -> ApiResult<Sender> {
    let stream = state.rt.connect(sid, port).await.map_err(|e| match e {
        paddock_core::runtime::RuntimeError::Unavailable(m) => {
            ApiError::new(axum::http::StatusCode::BAD_GATEWAY, "UPSTREAM_UNAVAILABLE", m)
        }
        other => other.into(),
    })?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            "UPSTREAM_UNAVAILABLE",
            format!("talking HTTP to port {port} in the sandbox: {e}"),
        )
    })?;
    tokio::spawn(conn.with_upgrades());
    Ok(sender)
}

/// Hands the response on, and the connection back to the pool once the client has read the
/// response to its end (hyper's sender is ready again only then).
fn finish(
    state: &AppState,
    key: PortKey,
    mut sender: Sender,
    response: hyper::Response<hyper::body::Incoming>,
) -> Response {
    let pool = state.pool.clone();
    tokio::spawn(async move {
        if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(300), sender.ready()).await {
            pool.put(key, sender);
        }
    });
    response.map(Body::new)
}
