//! Every API error is `{code, message}` with the status that fits it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use paddock_core::runtime::{FileErrorKind, RuntimeError};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

#[derive(Serialize)]
struct Body<'a> {
    code: &'a str,
    message: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "CONFLICT", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", message)
    }
    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message)
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        let status = match &e {
            RuntimeError::InvalidArgument(_) | RuntimeError::InvalidSpec(_) => StatusCode::BAD_REQUEST,
            RuntimeError::NotFound(_) => StatusCode::NOT_FOUND,
            RuntimeError::Conflict(_) => StatusCode::CONFLICT,
            RuntimeError::File { kind, .. } => match kind {
                FileErrorKind::NotFound => StatusCode::NOT_FOUND,
                FileErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
                FileErrorKind::AlreadyExists | FileErrorKind::DirectoryNotEmpty => StatusCode::CONFLICT,
                FileErrorKind::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
                _ => StatusCode::BAD_REQUEST,
            },
            // A paused or stopped sandbox is a state conflict the client can act on.
            RuntimeError::Unavailable(_) => StatusCode::CONFLICT,
            // A request this runtime cannot serve is the client's to change, not a server fault
            // (and a 5xx would make the SDK retry it).
            RuntimeError::Unsupported(_) => StatusCode::BAD_REQUEST,
            RuntimeError::Exhausted(_) => StatusCode::SERVICE_UNAVAILABLE,
            RuntimeError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            RuntimeError::Upstream(_) => StatusCode::BAD_GATEWAY,
            RuntimeError::System(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self { status, code: e.code(), message: e.to_string() }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        Self::internal(format!("state database: {e}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&Body { code: self.code, message: &self.message }).unwrap_or_default();
        let mut r = (self.status, body).into_response();
        r.headers_mut().insert(axum::http::header::CONTENT_TYPE, "application/json".parse().expect("static header"));
        r.extensions_mut().insert(ErrorCode(self.code));
        r
    }
}

/// Set on error responses so the metrics layer can count errors by code.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

pub type ApiResult<T> = Result<T, ApiError>;
