//! Routes that reach into one sandbox: `/sandboxes/{id}/proxy/{port}/...`.
//!
//! Port 44772 is the execd API and 18080 the egress policy API, both served by Paddock itself,
//! so nothing has to run inside the sandbox. Any other port is forwarded over HTTP/1.1 to a
//! server the sandbox runs on its own loopback, through a connection the runtime opens inside
//! the sandbox's network namespace.

use std::collections::HashMap;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tower::{Layer, ServiceExt};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::{API_KEY_HEADER, EGRESS_PORT, SANDBOX_TOKEN_HEADER};

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

/// The egress policy API of a sandbox. Sandboxes have no egress at all for now, so the policy
/// is deny-all and cannot be changed; saying so beats pretending to accept rules.
fn egress_router() -> Router<AppState> {
    Router::new()
        .route("/policy", get(egress_policy).patch(egress_change).delete(egress_change))
        .route("/", any(egress_not_served))
        .route("/{*rest}", any(egress_not_served))
}

/// `501 NOT_SUPPORTED` for egress routes Paddock does not serve (the credential vault, ...).
async fn egress_not_served(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    let path = uri.path();
    let rest = path.split_once(&format!("/proxy/{EGRESS_PORT}")).map_or(path, |(_, r)| r);
    crate::execd::not_supported(&method, rest, unserved_egress_feature(rest))
}

fn unserved_egress_feature(path: &str) -> String {
    if path.trim_start_matches('/').starts_with("credential-vault") {
        "the credential vault is not supported: sandboxes have no network egress, so there is nothing to inject credentials into".into()
    } else {
        "this is not an egress route Paddock serves: GET /policy shows the (deny-all) policy".into()
    }
}

fn deny_all() -> serde_json::Value {
    json!({
        "status": "ok",
        "mode": "deny_all",
        "enforcementMode": "network-namespace",
        "reason": "the sandbox's network namespace has only loopback: no egress, no DNS",
        "policy": {"defaultAction": "deny", "egress": []}
    })
}

async fn egress_policy(State(state): State<AppState>, Path(p): Path<HashMap<String, String>>) -> ApiResult<Response> {
    state.sandbox(p.get("id").map(String::as_str).unwrap_or_default()).await?;
    Ok(axum::Json(deny_all()).into_response())
}

async fn egress_change(State(state): State<AppState>, Path(p): Path<HashMap<String, String>>) -> ApiResult<Response> {
    state.sandbox(p.get("id").map(String::as_str).unwrap_or_default()).await?;
    // An unbuilt feature, not a bad request: 501 like every other route Paddock does not serve.
    Err(ApiError::new(
        axum::http::StatusCode::NOT_IMPLEMENTED,
        "NOT_SUPPORTED",
        "egress rules are not supported yet: every sandbox is deny-all (loopback only); GET /policy shows it",
    ))
}

async fn forward(
    State(state): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
    mut req: Request,
) -> ApiResult<Response> {
    let id = p.get("id").map(String::as_str).unwrap_or_default();
    let port: u16 = p
        .get("port")
        .and_then(|s| s.parse().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request("the port must be a number from 1 to 65535"))?;
    let (sid, _) = state.sandbox(id).await?;
    // The execd and egress ports are answered by this server, never by the sandbox: a path
    // their routers do not match (the bare port, a trailing slash) is unserved, not a 502.
    if port == crate::EXECD_PORT || port == EGRESS_PORT {
        let rest = p.get("rest").map(|r| format!("/{r}")).unwrap_or_default();
        let what = if port == EGRESS_PORT {
            unserved_egress_feature(&rest)
        } else {
            crate::execd::unserved_execd_feature(&rest)
        };
        return Err(crate::execd::not_supported(req.method(), &rest, what));
    }
    if req.headers().contains_key(header::UPGRADE) {
        return Err(ApiError::bad_request("WebSocket and other upgrades are not proxied yet: use plain HTTP"));
    }
    let stream = state.rt.connect(&sid, port).await.map_err(|e| match e {
        paddock_core::runtime::RuntimeError::Unavailable(m) => {
            ApiError::new(axum::http::StatusCode::BAD_GATEWAY, "UPSTREAM_UNAVAILABLE", m)
        }
        other => other.into(),
    })?;
    let bad_gateway = |m: String| ApiError::new(axum::http::StatusCode::BAD_GATEWAY, "UPSTREAM_UNAVAILABLE", m);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| bad_gateway(format!("talking HTTP to port {port} in the sandbox: {e}")))?;
    tokio::spawn(conn);

    let rest = p.get("rest").map(String::as_str).unwrap_or("");
    let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    let uri =
        format!("/{rest}{query}").parse().map_err(|_| ApiError::bad_request("the proxied path is not a valid URI"))?;
    *req.uri_mut() = uri;
    // The platform's credentials are never handed to code in the sandbox.
    let headers = req.headers_mut();
    headers.remove(API_KEY_HEADER);
    headers.remove(SANDBOX_TOKEN_HEADER);
    headers.insert(
        header::HOST,
        HeaderValue::from_str(&format!("127.0.0.1:{port}")).expect("a host:port is a valid header"),
    );
    // A server in the sandbox that never answers must not hold the request forever.
    let response = tokio::time::timeout(std::time::Duration::from_secs(300), sender.send_request(req))
        .await
        .map_err(|_| bad_gateway(format!("port {port} in the sandbox did not answer within 300s")))?
        .map_err(|e| bad_gateway(format!("port {port} in the sandbox did not answer: {e}")))?;
    Ok(response.map(Body::new))
}
