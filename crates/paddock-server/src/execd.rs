//! The execd-compatible API (OpenSandbox's in-sandbox daemon), served by Paddock itself for
//! every sandbox through the runtime: commands run with `Runtime::exec`, files move with
//! `Runtime::file`/`read_file`/`write_file`, and bytes flow through the runtime's streams so
//! nothing is buffered whole.

mod code;
mod commands;
mod env;
mod files;
mod host;
pub mod openapi;
mod session;
mod text;

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use serde::Serialize;

pub use commands::{Commands, ENTRYPOINT_EXITED, MAX_RUNNING_PER_SANDBOX};
pub use env::ENV_FILE;
pub use host::ExecdState;

use crate::api::{ApiPath, InSandbox, SandboxLookup};

use crate::error::ApiResult;
use crate::store::now_ms;

/// The `{cmd}` of a command's routes.
#[derive(serde::Deserialize)]
pub(super) struct CommandParam {
    pub cmd: String,
}

/// The `{context}` of a code context's routes.
#[derive(serde::Deserialize)]
pub(super) struct ContextParam {
    pub context: String,
}

/// The `{session}` of a bash session's routes.
#[derive(serde::Deserialize)]
pub(super) struct SessionParam {
    pub session: String,
}

/// OpenSandbox's error for a body the route cannot use.
pub(super) fn invalid_body(message: impl Into<String>) -> crate::error::ApiError {
    crate::error::ApiError::new(axum::http::StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", message)
}

/// OpenSandbox's error for a query parameter the route needs; `what` says what it carries.
pub(super) fn missing_query(name: &str, what: &str) -> crate::error::ApiError {
    crate::error::ApiError::new(
        axum::http::StatusCode::BAD_REQUEST,
        "MISSING_QUERY",
        format!("missing query parameter '{name}': {what}"),
    )
}

/// A request's `timeout` in milliseconds: none (or 0) means no limit; a negative one is refused.
pub(super) fn timeout_ms(timeout: Option<i64>) -> crate::error::ApiResult<Option<u64>> {
    match timeout {
        None | Some(0) => Ok(None),
        Some(t) if t > 0 => Ok(Some(t.cast_unsigned())),
        Some(t) => Err(invalid_body(format!("timeout {t} must be a positive number of milliseconds"))),
    }
}

/// A fresh hex id of `N` random bytes, for ids and markers that must not collide (none is a
/// secret). getrandom(2) does not fail for small requests once the kernel's pool is ready;
/// should it, the time and a counter keep ids unique within this server.
pub(super) fn unique_hex<const N: usize>() -> String {
    let mut b = [0u8; N];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let seed = now_ms().cast_unsigned().rotate_left(20) ^ n;
        for (i, x) in b.iter_mut().enumerate() {
            // Bytes of the seed, each byte position told apart: truncation is the point.
            *x = seed.to_le_bytes()[i % 8] ^ (i / 8).to_le_bytes()[0];
        }
    }
    hex::encode(b)
}

/// Headers of a Server-Sent Events answer that no proxy may buffer.
pub(super) fn stream_headers(mut r: axum::response::Response) -> axum::response::Response {
    let h = r.headers_mut();
    h.insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("text/event-stream"));
    h.insert(axum::http::header::CACHE_CONTROL, axum::http::HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", axum::http::HeaderValue::from_static("no"));
    r
}

/// Routes relative to an execd base URL; the sandbox id is the `id` path parameter.
pub fn router<S>() -> Router<S>
where
    S: SandboxLookup + Clone + Send + Sync + 'static,
    ExecdState: axum::extract::FromRef<S>,
{
    Router::new()
        // Everything not routed below: an honest 501, never a forward into the sandbox. (Any
        // more specific route wins over the catch-all.)
        .route("/", axum::routing::any(not_served))
        .route("/{*rest}", axum::routing::any(not_served))
        .route("/ping", get(ping))
        .route("/command", post(commands::run).delete(commands::interrupt))
        .route("/command/status/{cmd}", get(commands::status))
        .route("/command/{cmd}/logs", get(commands::logs))
        .route("/files", axum::routing::delete(files::remove_files))
        .route("/files/info", get(files::info))
        .route("/files/upload", post(files::upload))
        .route("/files/download", get(files::download))
        .route("/files/mv", post(files::rename))
        .route("/files/permissions", post(files::chmod))
        .route("/files/search", get(files::search))
        .route("/files/replace", post(files::replace))
        .route("/directories", post(files::make_dirs).delete(files::remove_dirs))
        .route("/directories/list", get(files::list))
        .route("/metrics", get(metrics))
        .route("/code", post(code::run).delete(code::interrupt))
        .route("/code/context", post(code::create_context))
        .route("/code/contexts", get(code::list_contexts).delete(code::delete_contexts))
        .route("/code/contexts/{context}", get(code::get_context).delete(code::delete_context))
        .route("/session", post(session::create))
        .route("/session/{session}/run", post(session::run))
        .route("/session/{session}", axum::routing::delete(session::delete))
}

/// `GET /ping`: healthy only while the sandbox can run commands, so a paused or failed
/// sandbox is not reported healthy (the SDK's `is_healthy()` asks this).
async fn ping(State(state): State<ExecdState>, InSandbox(sandbox, row): InSandbox) -> ApiResult<()> {
    // Its entrypoint ended: the sandbox still runs commands, but it is not what was asked for.
    if row.reason.as_deref() == Some(ENTRYPOINT_EXITED) {
        return Err(crate::error::ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "SANDBOX_FAILED",
            format!("sandbox {sandbox} has failed: {}", row.message.as_deref().unwrap_or("its entrypoint ended")),
        ));
    }
    match state.rt.get(&sandbox).await?.state {
        paddock_core::runtime::SandboxState::Running => Ok(()),
        paddock_core::runtime::SandboxState::Paused => Err(crate::error::ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "SANDBOX_PAUSED",
            format!("sandbox {sandbox} is paused: resume it to run commands"),
        )),
        paddock_core::runtime::SandboxState::Failed => Err(crate::error::ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "SANDBOX_FAILED",
            format!("sandbox {sandbox} has failed: its processes are gone; delete it and create another"),
        )),
    }
}

/// `501 NOT_SUPPORTED` for an execd route Paddock does not serve, naming the feature and what
/// to use instead. Without it the request fell through to the port proxy and came back as a
/// 502 blaming the sandbox, which the SDK also retried for seconds.
async fn not_served(method: axum::http::Method, uri: axum::http::Uri) -> crate::error::ApiError {
    let path = uri.path();
    // The part after `/proxy/44772`, however the router was reached (direct or proxy mode).
    let rest = path.split_once("/proxy/44772").map_or(path, |(_, r)| r);
    not_supported(&method, rest, unserved_execd_feature(rest))
}

/// The 501 every unimplemented sandbox route answers.
pub(crate) fn not_supported(method: &axum::http::Method, path: &str, what: String) -> crate::error::ApiError {
    let path = if path.is_empty() { "/" } else { path };
    crate::error::ApiError::new(
        axum::http::StatusCode::NOT_IMPLEMENTED,
        "NOT_SUPPORTED",
        format!("{method} {path}: {what} (README, \"OpenSandbox compatibility\", lists what Paddock serves)"),
    )
}

/// What an execd path Paddock does not serve is for, and what to use instead.
pub(crate) fn unserved_execd_feature(path: &str) -> String {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let under = |p: &str| path == p || path.starts_with(&format!("{p}/"));
    if under("/v1/isolated") {
        "isolated sessions are not supported by Paddock: create another sandbox for each isolated task".into()
    } else if under("/v1/filesystem") {
        "file operations as another uid/gid (files_with_identity) are not supported: files belong to the sandbox user; use the plain file API".into()
    } else {
        match first {
            "pty" => "interactive terminals (PTY) are not supported by Paddock yet: run commands with POST /command (commands.run), or in the background and read their logs".into(),
            "proxy" => "execd's own port proxy is not served: ask GET /v1/sandboxes/{id}/endpoints/{port} for the port's endpoint".into(),
            "metrics" => "streamed metrics are not supported: poll GET /metrics (get_metrics)".into(),
            _ => "this is not an execd route Paddock serves".into(),
        }
    }
}

/// User and group names of a sandbox, from its own `/etc/passwd` and `/etc/group`.
#[derive(Debug, Default)]
struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    /// Parses `name:x:id:...` lines; anything else is skipped.
    fn parse_db(text: &str) -> HashMap<u32, String> {
        text.lines()
            .filter_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?.trim();
                let id = f.nth(1)?.trim().parse().ok()?;
                (!name.is_empty() && !name.starts_with('#')).then(|| (id, name.to_owned()))
            })
            // The first entry for an id wins, as getpwuid does.
            .fold(HashMap::new(), |mut m, (id, name)| {
                m.entry(id).or_insert(name);
                m
            })
    }
    fn user(&self, uid: u32) -> String {
        self.users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }
    fn group(&self, gid: u32) -> String {
        self.groups.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }
}

#[derive(Serialize)]
struct Metrics {
    cpu_count: f64,
    cpu_used_pct: f64,
    mem_total_mib: f64,
    mem_used_mib: f64,
    timestamp: i64,
}

/// Over how long CPU use is measured when no earlier sample of the sandbox is recent enough.
const CPU_SAMPLE: Duration = Duration::from_millis(100);

/// CPU use in percent of one CPU between two cumulative readings (nanoseconds, milliseconds).
fn cpu_percent(earlier: (u64, u64), later: (u64, u64)) -> Option<f64> {
    let (cpu, ms) = (later.0.checked_sub(earlier.0)?, later.1.checked_sub(earlier.1)?);
    (ms > 0).then(|| cpu as f64 / (ms as f64 * 1e6) * 100.0)
}

/// `GET /metrics`: the sandbox's limits and its CPU and memory use, as the runtime measures
/// them. CPU use is the rate since the previous call for this sandbox (within a minute), else
/// over a short sample.
async fn metrics(State(state): State<ExecdState>, InSandbox(sandbox, _): InSandbox) -> ApiResult<axum::Json<Metrics>> {
    let resources = state.rt.get(&sandbox).await?.spec.resources;
    const MIB: f64 = (1u64 << 20) as f64;
    let mut now = state.rt.metrics(&sandbox).await?;
    let sample = |m: &paddock_core::runtime::SandboxMetrics| m.cpu_used_ns.map(|c| (c, m.at_unix_ms));
    let mut earlier =
        state.commands.last_cpu_sample(&sandbox).filter(|(_, at)| now.at_unix_ms.saturating_sub(*at) < 60_000);
    if earlier.is_none() && now.cpu_used_ns.is_some() {
        earlier = sample(&now);
        tokio::time::sleep(CPU_SAMPLE).await;
        now = state.rt.metrics(&sandbox).await?;
    }
    if let Some(s) = sample(&now) {
        state.commands.remember_cpu_sample(&sandbox, s);
    }
    let cpu_used_pct = earlier.zip(sample(&now)).and_then(|(a, b)| cpu_percent(a, b)).unwrap_or(0.0);
    Ok(axum::Json(Metrics {
        cpu_count: f64::from(resources.millicpus) / 1000.0,
        cpu_used_pct,
        mem_total_mib: resources.memory_bytes as f64 / MIB,
        mem_used_mib: now.memory_used_bytes.unwrap_or(0) as f64 / MIB,
        timestamp: now_ms(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_percent_is_the_rate_between_readings() {
        assert_eq!(cpu_percent((0, 1000), (50_000_000, 1100)), Some(50.0));
        assert_eq!(cpu_percent((0, 1000), (200_000_000, 1100)), Some(200.0), "two busy CPUs");
        assert_eq!(cpu_percent((5, 1000), (5, 1000)), None, "no time passed");
        assert_eq!(cpu_percent((9, 1000), (5, 1100)), None, "a counter going back is no rate");
    }

    #[test]
    fn name_databases_parse() {
        let users = Names::parse_db(
            "root:x:0:0:root:/root:/bin/bash\n# comment\nbad\nalice:x:1000:1000::/home/a:/bin/sh\ndup:x:0:0\n",
        );
        assert_eq!(users.get(&0).map(String::as_str), Some("root"));
        assert_eq!(users.get(&1000).map(String::as_str), Some("alice"));
        assert_eq!(users.len(), 2);
        let names = Names { users, groups: Names::parse_db("wheel:x:10:alice\n") };
        assert_eq!(names.user(1000), "alice");
        assert_eq!(names.user(5), "5");
        assert_eq!(names.group(10), "wheel");
    }
}
