//! `/session`: persistent bash sessions (the SDK's `create_session` / `run_in_session` /
//! `delete_session`). A session is a bash driver of `code` (one shell per session, so `cd`,
//! variables and exports persist between runs); its runs stream events like `/command`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::ExecdState;
use super::code::{Kind, Language, start_run};
use super::commands::expand_home;
use super::{ApiPath, InSandbox, SessionParam, invalid_body};
use crate::error::{ApiError, ApiResult};

#[derive(Deserialize)]
struct CreateSession {
    cwd: Option<String>,
}

#[derive(Deserialize)]
struct RunInSession {
    command: Option<String>,
    cwd: Option<String>,
    /// Milliseconds; the run is interrupted after it.
    timeout: Option<i64>,
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "SESSION_NOT_FOUND",
        format!("no bash session {id:?} in this sandbox: create one with POST /session"),
    )
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8], hint: &str) -> ApiResult<T> {
    // The SDK sends no body at all when it has nothing to say.
    let body = if body.iter().all(u8::is_ascii_whitespace) { &b"{}"[..] } else { body };
    serde_json::from_slice(body).map_err(|e| invalid_body(format!("invalid session request: {e}: {hint}")))
}

/// `POST /session {cwd?}` → 200 `{session_id}`.
pub async fn create(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    body: Bytes,
) -> ApiResult<Response> {
    let req: CreateSession = parse(&body, "send {} or {\"cwd\": \"/workspace\"}")?;
    let cwd = req.cwd.filter(|c| !c.is_empty()).map(expand_home);
    let ctx = state.commands.contexts.create(&state, &sandbox, Language::Bash, Kind::Session, cwd).await?;
    Ok(axum::Json(json!({"session_id": ctx.id})).into_response())
}

/// `POST /session/{session}/run {command, cwd?, timeout?}`: the run's events, as `/command`'s.
pub async fn run(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    ApiPath(SessionParam { session: id }): ApiPath<SessionParam>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: RunInSession = parse(&body, "send {\"command\": \"...\"}")?;
    let command = req
        .command
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| invalid_body("no command given: send a non-empty \"command\""))?;
    let timeout = super::timeout_ms(req.timeout)?.map(Duration::from_millis);
    let ctx = state.commands.contexts.get(&sandbox, &id, Kind::Session).ok_or_else(|| not_found(&id))?;
    let cwd = req.cwd.filter(|c| !c.is_empty()).map(expand_home);
    Ok(start_run(state, sandbox, ctx, command, cwd, timeout))
}

/// `DELETE /session/{session}`: ends the session's shell.
pub async fn delete(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    ApiPath(SessionParam { session: id }): ApiPath<SessionParam>,
) -> ApiResult<StatusCode> {
    state.commands.contexts.remove(&sandbox, &id, Kind::Session).ok_or_else(|| not_found(&id))?;
    Ok(StatusCode::OK)
}
