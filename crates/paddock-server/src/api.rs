//! What every part of the HTTP API shares: its header names and well-known ports, the body
//! limit of JSON requests and the JSON extractor that keeps to it, where a path names a
//! sandbox or a proxied port, and the extractors of path parameters (`ApiPath`, and
//! `InSandbox` for a route under `/sandboxes/{id}`). A leaf: it knows no handler, and the
//! router's state only through `SandboxLookup`.

use std::future::Future;
use std::pin::Pin;

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use paddock_core::runtime::SandboxId;

use crate::error::{ApiError, ApiResult};
use crate::store::SandboxRow;

/// Header carrying the OpenSandbox API key.
pub const API_KEY_HEADER: &str = "open-sandbox-api-key";
/// Header carrying a sandbox's own token, given out with its endpoints.
pub const SANDBOX_TOKEN_HEADER: &str = "x-paddock-sandbox-token";
/// The same token under OpenSandbox's name for execd's credential (its clients carry it, and
/// 1.3 makes it the default): accepted and given out beside Paddock's.
pub const EXECD_TOKEN_HEADER: &str = "x-execd-access-token";
/// The API key under the name the Go SDK sends it in server-proxy mode.
pub const API_KEY_ALIAS: &str = "x-api-key";
/// Largest body a JSON route reads (a create may carry up to 1 MiB of environment); only file
/// uploads accept more, up to `--max-upload`.
pub const JSON_BODY_LIMIT: usize = 2 << 20;
/// The execd port the SDK resolves right after create.
pub const EXECD_PORT: u16 = 44772;
/// The egress sidecar port the SDK resolves right after create.
pub const EGRESS_PORT: u16 = 18080;

pub(crate) fn json_too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
        format!(
            "the request body is larger than {} MiB, the limit of JSON requests: send less (files go through /files/upload)",
            JSON_BODY_LIMIT >> 20
        ),
    )
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The API key came in `X-API-Key`, which the port proxy then strips (a sandbox's own
/// application may use that header for itself, so it goes only when it was ours).
#[derive(Clone, Copy)]
pub(crate) struct KeyInAlias;

/// `/v1/sandboxes/<id>/proxy/<port>/...` → `<port>`.
pub(crate) fn proxied_port_of(path: &str) -> Option<u16> {
    let rest = path.strip_prefix("/v1").unwrap_or(path).strip_prefix("/sandboxes/")?;
    let mut parts = rest.split('/');
    parts.next()?;
    (parts.next()? == "proxy").then_some(())?;
    parts.next()?.parse().ok()
}

/// `/v1/sandboxes/<id>/...` or `/sandboxes/<id>/...` → `<id>`.
pub(crate) fn sandbox_id_of(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v1").unwrap_or(path).strip_prefix("/sandboxes/")?;
    rest.split('/').next().filter(|s| !s.is_empty()).map(str::to_owned)
}

/// A JSON body whose rejection is a `{code, message}` 400 instead of axum's plain text.
pub struct ApiJson<T>(pub T);

impl<S, T> axum::extract::FromRequest<S> for ApiJson<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request<Body>, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    return Err(json_too_large());
                }
                Err(ApiError::bad_request(format!("invalid JSON body: {}", rejection.body_text())))
            }
        }
    }
}

/// Path parameters, by name (`ApiPath<Cmd>` with `struct Cmd { cmd: String }`), whose
/// rejection (a segment that is not UTF-8 once decoded) is a `{code, message}` 400 instead of
/// axum's plain text.
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(Self(v)),
            Err(rejection) => Err(ApiError::bad_request(format!("invalid path: {}", rejection.body_text()))),
        }
    }
}

/// How a handler finds the sandbox a request names: the API's own rows, and one the server
/// has not seen yet adopted (the lifecycle's business, hence behind a trait the router's
/// state implements).
pub trait SandboxLookup: Send + Sync {
    fn sandbox<'a>(&'a self, id: &'a str) -> Lookup<'a>;
}

/// A lookup under way.
pub type Lookup<'a> = Pin<Box<dyn Future<Output = ApiResult<(SandboxId, SandboxRow)>> + Send + 'a>>;

#[derive(serde::Deserialize)]
struct IdParam {
    id: String,
}

/// The sandbox the route's `id` path parameter names, which must exist (else a 404 that says
/// how to find the right id), and its row: the first step of every handler under
/// `/sandboxes/{id}`, as an extractor.
pub struct InSandbox(pub SandboxId, pub SandboxRow);

impl<S> FromRequestParts<S> for InSandbox
where
    S: SandboxLookup + Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath(IdParam { id }) = ApiPath::from_request_parts(parts, state).await?;
        let (id, row) = state.sandbox(&id).await?;
        Ok(Self(id, row))
    }
}
