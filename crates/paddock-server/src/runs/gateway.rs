//! The gateway: a run's one way home, on a listener of its own (`--gateway-listen`).
//!
//! A driver calls it with `Authorization: Bearer $PADDOCK_TOKEN` at `$PADDOCK_GATEWAY`. The
//! token names its run, its attempt's epoch and its sandbox; every call is checked against the
//! run's row (this epoch current, this sandbox, an attempt under way, its lease not run out)
//! in the same statement that changes anything, so a stale attempt gets `409 STALE_ATTEMPT`
//! and changes nothing. The local runtime's forwarder opens each connection with a line that
//! names the sandbox it comes from; a token from another sandbox is refused there (`403`).
//! A sandbox that dials the gateway directly (a Kubernetes Pod) must call from an address the
//! runtime gives its sandbox (`SandboxInfo::addresses`); a token from elsewhere is refused too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use base64::Engine;
use serde::Deserialize;
use serde_json::json;

use super::Runs;
use super::origin::{Origin, SandboxAddresses};
use super::store::RunState;
use super::upload::{body_to_file, check_tar};
use crate::api::ApiJson;
use crate::error::{ApiError, ApiResult};
use crate::store::now_ms;

/// The largest event (or other JSON body) a driver may send; results are tars, bounded apart.
const MAX_EVENT: usize = 64 << 10;

/// The attempt a request is from: its token's run, epoch and sandbox.
struct Attempt {
    run: String,
    epoch: i64,
    sandbox: String,
}

impl FromRequestParts<Arc<Runs>> for Attempt {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, runs: &Arc<Runs>) -> Result<Self, ApiError> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .ok_or_else(|| {
                ApiError::unauthorized(
                    "MISSING_TOKEN",
                    "the gateway takes the run's token: send Authorization: Bearer $PADDOCK_TOKEN",
                )
            })?;
        let (run, epoch, sandbox) = runs.token_subject(token).ok_or_else(|| {
            ApiError::unauthorized("INVALID_TOKEN", "this token is not one this server gave a run's attempt")
        })?;
        if let Some(origin) = parts.extensions.get::<Origin>().cloned() {
            origin.vouch(&sandbox).await?;
        }
        Ok(Attempt { run, epoch, sandbox })
    }
}

/// Why a call of an attempt that is not current was refused, in words.
async fn stale(runs: &Runs, a: &Attempt) -> ApiError {
    let row = runs.store().get(&a.run).await.ok().flatten();
    let message = match row {
        None => format!("run {} does not exist", a.run),
        Some(r) if r.epoch != a.epoch => {
            format!("attempt epoch {} of run {} is stale: the current epoch is {}", a.epoch, a.run, r.epoch)
        }
        Some(r) if r.state.is_terminal() => format!("run {} has ended ({})", a.run, r.state.as_str()),
        Some(r) if r.sandbox_id.as_deref() != Some(a.sandbox.as_str()) => {
            format!("run {} does not run in sandbox {}", a.run, a.sandbox)
        }
        Some(r) if r.lease_expires_ms.is_some_and(|l| l < now_ms()) => {
            format!("the lease of attempt epoch {} of run {} has expired", a.epoch, a.run)
        }
        Some(r) => format!("run {} is {}, with no attempt under way", a.run, r.state.as_str()),
    };
    ApiError::new(StatusCode::CONFLICT, "STALE_ATTEMPT", message)
}

async fn heartbeat(State(runs): State<Arc<Runs>>, a: Attempt) -> ApiResult<Response> {
    let until = now_ms() + paddock_core::units::millis_i64(runs.opts.lease);
    let first = runs.store().get(&a.run).await?.is_some_and(|r| r.first_call_at_ms.is_none());
    if !runs.store().touch(&a.run, a.epoch, &a.sandbox, Some(until)).await? {
        return Err(stale(&runs, &a).await);
    }
    if first {
        runs.note_state(&a.run).await;
    }
    Ok(axum::Json(json!({
        "runId": a.run, "epoch": a.epoch,
        "leaseExpiresAt": crate::time_fmt::rfc3339(until),
    }))
    .into_response())
}

async fn inputs(State(runs): State<Arc<Runs>>, a: Attempt) -> ApiResult<Response> {
    if !runs.store().touch(&a.run, a.epoch, &a.sandbox, None).await? {
        return Err(stale(&runs, &a).await);
    }
    let path = runs.dir(&a.run).join("inputs.tar");
    match tokio::fs::File::open(&path).await {
        Ok(f) => {
            Ok(([(header::CONTENT_TYPE, "application/x-tar")], Body::from_stream(tokio_util::io::ReaderStream::new(f)))
                .into_response())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(ApiError::new(StatusCode::NOT_FOUND, "NO_INPUTS", "this run was submitted without inputs"))
        }
        Err(e) => Err(ApiError::internal(format!("reading the run's inputs: {e}"))),
    }
}

/// `Content-Digest: sha-256=:BASE64:` (RFC 9530), when the request carries one.
fn wanted_digest(headers: &HeaderMap) -> ApiResult<Option<Vec<u8>>> {
    let Some(v) = headers.get("content-digest") else { return Ok(None) };
    let v = v.to_str().map_err(|_| ApiError::bad_request("Content-Digest is not ASCII"))?;
    for item in v.split(',') {
        if let Some((alg, val)) = item.trim().split_once('=')
            && alg.trim().eq_ignore_ascii_case("sha-256")
        {
            let b64 = val.trim().trim_matches(':');
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| ApiError::bad_request("Content-Digest's sha-256 is not base64 between colons"))?;
            return Ok(Some(raw));
        }
    }
    Err(ApiError::bad_request("Content-Digest names no sha-256 digest, the only one this gateway checks"))
}

async fn result(State(runs): State<Arc<Runs>>, a: Attempt, headers: HeaderMap, body: Body) -> ApiResult<Response> {
    // Refused before a byte is kept when the attempt is not current.
    if !runs.store().touch(&a.run, a.epoch, &a.sandbox, None).await? {
        return Err(stale(&runs, &a).await);
    }
    let want = wanted_digest(&headers)?;
    let dir = runs.dir(&a.run);
    let mut nonce = [0u8; 8];
    rustix::rand::getrandom(&mut nonce, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| ApiError::internal(format!("getrandom: {e}")))?;
    // One name per upload: two uploads at once never write through each other's file.
    let tmp = dir.join(format!("result.tar.{}.{}.part", a.epoch, hex::encode(nonce)));
    let outcome = async {
        let got = body_to_file(body, &tmp, runs.opts.max_tar_bytes).await?;
        if let Some(want) = want
            && want != got
        {
            return Err(ApiError::bad_request(
                "the archive does not match its Content-Digest: it was damaged on the way",
            ));
        }
        let entries = check_tar(&runs, tmp.clone()).await?;
        // The rename comes after the row says this attempt's result is kept, and only then:
        // a stale attempt's upload never replaces the current one's.
        if !runs.store().set_result(&a.run, a.epoch, &a.sandbox).await? {
            return Err(stale(&runs, &a).await);
        }
        tokio::fs::rename(&tmp, dir.join("result.tar"))
            .await
            .map_err(|e| ApiError::internal(format!("keeping the result: {e}")))?;
        Ok(entries)
    }
    .await;
    let entries = match outcome {
        Ok(n) => n,
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(e);
        }
    };
    runs.note(&a.run, "result", json!({"epoch": a.epoch, "entries": entries})).await;
    Ok((StatusCode::CREATED, axum::Json(json!({"entries": entries}))).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DriverEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    data: serde_json::Value,
}

async fn event(State(runs): State<Arc<Runs>>, a: Attempt, ApiJson(ev): ApiJson<DriverEvent>) -> ApiResult<Response> {
    if ev.kind.is_empty() || ev.kind.len() > 64 || ev.kind.chars().any(char::is_control) {
        return Err(ApiError::bad_request("an event's type is 1 to 64 printable characters"));
    }
    let data = json!({"type": ev.kind, "data": ev.data, "epoch": a.epoch});
    match runs.store().driver_event(&a.run, a.epoch, &a.sandbox, &data).await? {
        Some(seq) => {
            let _ = runs.changed.send(a.run.clone());
            Ok((StatusCode::CREATED, axum::Json(json!({"seq": seq}))).into_response())
        }
        None => {
            let full = runs.store().events_after(&a.run, super::store::MAX_EVENTS - 1, 1).await?;
            if !full.is_empty() {
                return Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TOO_MANY_EVENTS",
                    format!(
                        "run {} holds {} events, the most a run keeps: send fewer, larger ones, or put detail in the result",
                        a.run,
                        super::store::MAX_EVENTS
                    ),
                ));
            }
            Err(stale(&runs, &a).await)
        }
    }
}

/// The run of the calling attempt, as the owner API shows it.
async fn whoami(State(runs): State<Arc<Runs>>, a: Attempt) -> ApiResult<Response> {
    let row = runs.get(&a.run).await?;
    if row.epoch != a.epoch || !matches!(row.state, RunState::Starting | RunState::Running) {
        return Err(stale(&runs, &a).await);
    }
    Ok(axum::Json(super::api::view(&row)).into_response())
}

pub fn router(runs: Arc<Runs>) -> Router {
    Router::new()
        .route("/v1/heartbeat", post(heartbeat))
        .route("/v1/inputs", get(inputs))
        .route("/v1/result", put(result).layer(DefaultBodyLimit::disable()))
        .route("/v1/events", post(event).layer(DefaultBodyLimit::max(MAX_EVENT)))
        .route("/v1/run", get(whoami))
        .route("/health", get(|| async { axum::Json(json!({"status": "ok"})) }))
        .fallback(|| async { ApiError::not_found("no such gateway route: see the gateway routes in /v1/openapi.json") })
        .layer(DefaultBodyLimit::max(MAX_EVENT))
        .layer(axum::middleware::from_fn(crate::unread::close_when_unread))
        .with_state(runs)
}

/// The forwarder's first line, if the connection starts with one: `None` when it does not
/// (a direct connection), `Err` when it starts like one but is malformed or does not carry
/// `secret` (then it is no forwarder, and the connection is closed).
async fn preamble(tcp: &mut tokio::net::TcpStream, secret: &str) -> std::io::Result<Option<String>> {
    use tokio::io::AsyncReadExt;
    let tag = format!("{} ", paddock_core::spec::GATEWAY_PREAMBLE);
    let mut peeked = vec![0u8; tag.len()];
    loop {
        let n = tcp.peek(&mut peeked).await?;
        if n == 0 || !tag.as_bytes().starts_with(&peeked[..n]) {
            return Ok(None);
        }
        if n == tag.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Byte by byte, so not one byte of the request after it is taken.
    let mut line = Vec::with_capacity(64);
    let mut b = [0u8; 1];
    while line.len() < 256 {
        tcp.read_exact(&mut b).await?;
        if b[0] == b'\n' {
            let text = String::from_utf8_lossy(&line).trim_end_matches('\r').to_owned();
            let mut words = text.strip_prefix(&tag).unwrap_or_default().split(' ');
            let (id, proof) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
            if !crate::api::constant_time_eq(proof.as_bytes(), secret.as_bytes()) {
                return Err(std::io::Error::other("a forwarder line without the forwarders' secret"));
            }
            return if paddock_core::runtime::SandboxId::parse(id).is_ok() && words.next().is_none() {
                Ok(Some(id.to_owned()))
            } else {
                Err(std::io::Error::other("a malformed forwarder line"))
            };
        }
        line.push(b[0]);
    }
    Err(std::io::Error::other("a forwarder line too long"))
}

/// Gateway connections by origin (the sandbox a forwarder names, else the peer's address),
/// each origin held to a share of the gateway's connections: one sandbox that opens many,
/// or trickles its bodies, leaves the rest for the others.
struct Origins {
    held: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    share: usize,
}

/// One connection's place in its origin's share, given back on drop.
struct OriginSlot {
    origins: Arc<Origins>,
    key: String,
}

impl Origins {
    /// An origin's share of `total` connections: an eighth, at least 4.
    fn new(total: usize) -> Arc<Self> {
        Arc::new(Self { held: Default::default(), share: (total / 8).max(4).min(total.max(1)) })
    }

    fn take(self: &Arc<Self>, key: String) -> Option<OriginSlot> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(key.clone()).or_insert(0);
        if *n >= self.share {
            return None;
        }
        *n += 1;
        Some(OriginSlot { origins: self.clone(), key })
    }
}

impl Drop for OriginSlot {
    fn drop(&mut self) {
        let mut held = self.origins.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// Binds the gateway and serves it for as long as the process lives; answers the address
/// sandboxes are given (the bound one, with an unspecified address made loopback).
/// `more` is served beside the run routes (the model route).
pub async fn listen(runs: Arc<Runs>, more: Option<Router>) -> std::io::Result<SocketAddr> {
    let listener = match runs.opts.gateway_listen {
        Some(addr) => tokio::net::TcpListener::bind(addr).await?,
        None => match tokio::net::TcpListener::bind(super::DEFAULT_GATEWAY).await {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                tracing::warn!(
                    "the gateway's default port {} is taken: serving it on a free port instead (sandboxes still find it at their own 127.0.0.1:8081); set --gateway-listen to choose",
                    super::DEFAULT_GATEWAY
                );
                tokio::net::TcpListener::bind((super::DEFAULT_GATEWAY.ip(), 0)).await?
            }
            Err(e) => return Err(e),
        },
    };
    let mut addr = listener.local_addr()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let _ = runs.gateway.set(addr);
    let app = match more {
        Some(more) => router(runs.clone()).merge(more),
        None => router(runs.clone()),
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(runs.opts.gateway_max_connections.max(1)));
    let origins = Origins::new(runs.opts.gateway_max_connections);
    let secret: Arc<str> = runs.key.gateway_secret().into();
    let addresses = SandboxAddresses::new(runs.rt.clone());
    tokio::spawn(async move {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(Duration::from_secs(30));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let (mut tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a gateway connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (app, http, secret, origins, addresses) =
                (app.clone(), http.clone(), secret.clone(), origins.clone(), addresses.clone());
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let from = match tokio::time::timeout(Duration::from_secs(10), preamble(&mut tcp, &secret)).await {
                    Ok(Ok(from)) => from,
                    _ => return,
                };
                let key = from.as_ref().map_or_else(|| format!("address {}", peer.ip()), |id| format!("sandbox {id}"));
                let Some(_origin) = origins.take(key) else {
                    tracing::warn!(
                        origin = from.as_deref().unwrap_or("(direct)"),
                        share = origins.share,
                        "a gateway connection past its origin's share was closed"
                    );
                    return;
                };
                let service = tower::ServiceExt::map_request(app, move |mut req: Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(Origin {
                        sandbox: from.clone(),
                        peer: peer.ip(),
                        addresses: addresses.clone(),
                    });
                    req
                });
                let service = hyper_util::service::TowerToHyperService::new(service);
                if let Err(e) = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service).await {
                    tracing::debug!(error = %e, "gateway connection closed with an error");
                }
                drop(slot);
            });
        }
    });
    Ok(addr)
}
