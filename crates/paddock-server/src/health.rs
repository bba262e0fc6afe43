//! The server's own limits: its descriptor limit, raised at start, and `/health`, which stays
//! cheap but reports what makes the server fail other tenants' requests while it still runs.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use serde_json::json;

use crate::state::AppState;

/// Above this share of the descriptor limit, `/health` reports the server unhealthy: every
/// exec takes pipes and every connection a socket, so creates and execs start failing soon.
const DESCRIPTOR_ALARM_PERCENT: u64 = 90;
/// How long `/health` waits for the database before calling it unresponsive.
const DATABASE_DEADLINE: Duration = Duration::from_secs(2);

/// Raises the soft RLIMIT_NOFILE to the hard limit: the server holds a socket per connection
/// and pipes per running command, and the usual soft default (1024) runs out long before the
/// machine does. Returns (before, after); `None` means unlimited.
pub fn raise_descriptor_limit() -> (Option<u64>, Option<u64>) {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit { current: limit.maximum, maximum: limit.maximum };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "could not raise the open-file limit to the hard limit; the server may run out of descriptors");
            return (limit.current, limit.current);
        }
    }
    (limit.current, getrlimit(Resource::Nofile).current)
}

/// Descriptors the process has open, and its soft limit. Counting fails when no descriptor is
/// left to open the directory with, which is itself the answer.
#[expect(clippy::disallowed_methods, reason = "/proc/self/fd is kernel memory: listing it does not wait on a disk")]
fn descriptors() -> Result<(u64, Option<u64>), std::io::Error> {
    // Minus the one read_dir itself holds.
    let open = std::fs::read_dir("/proc/self/fd")?.count().saturating_sub(1) as u64;
    Ok((open, getrlimit(Resource::Nofile).current))
}

/// Runs one dependency check within [`DATABASE_DEADLINE`]; a failure or a timeout adds a
/// problem (`late` holds `{}` for the seconds waited) and reads `{"ok": false}`.
async fn bounded<E>(
    check: impl std::future::Future<Output = Result<(), E>>,
    problems: &mut Vec<String>,
    failed: impl FnOnce(E) -> String,
    late: &str,
) -> serde_json::Value {
    match tokio::time::timeout(DATABASE_DEADLINE, check).await {
        Ok(Ok(())) => json!({"ok": true}),
        Ok(Err(e)) => {
            problems.push(failed(e));
            json!({"ok": false})
        }
        Err(_) => {
            problems.push(late.replace("{}", &DATABASE_DEADLINE.as_secs().to_string()));
            json!({"ok": false})
        }
    }
}

pub async fn health(State(state): State<AppState>) -> Response {
    let mut problems = Vec::new();
    let fds = match tokio::task::spawn_blocking(descriptors).await {
        Ok(Ok((open, limit))) => {
            if let Some(limit) = limit.filter(|l| open * 100 > l * DESCRIPTOR_ALARM_PERCENT) {
                problems.push(format!(
                    "the server has {open} of its {limit} file descriptors open: execs and creates will fail; \
                     look for sandboxes with many background commands or clients holding connections, or raise the limit (LimitNOFILE)"
                ));
            }
            json!({"open": open, "limit": limit})
        }
        Ok(Err(e)) => {
            problems.push(format!("counting open descriptors failed ({e}): the server is probably out of them"));
            json!(null)
        }
        Err(e) => {
            problems.push(format!("counting open descriptors failed: {e}"));
            json!(null)
        }
    };
    let database = bounded(
        state.store.ping(),
        &mut problems,
        |e| format!("the state database does not answer: {e}"),
        "the state database did not answer within {}s: check the disk of the data directory",
    )
    .await;
    let runtime = bounded(
        state.rt.health(),
        &mut problems,
        |e| format!("the sandbox runtime is not usable: {e}"),
        "the sandbox runtime did not answer within {}s: creates and commands will time out",
    )
    .await;
    // A draining server still answers, but takes no new work: a load balancer's readiness
    // probe sends new sandboxes elsewhere.
    let draining = state.draining.load(std::sync::atomic::Ordering::SeqCst);
    if draining {
        problems.push("the server is shutting down: it creates no new sandboxes or runs".to_owned());
    }
    let (status, word) = match (problems.is_empty(), draining) {
        (_, true) => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
        (true, false) => (StatusCode::OK, "healthy"),
        (false, false) => (StatusCode::SERVICE_UNAVAILABLE, "unhealthy"),
    };
    let body =
        json!({"status": word, "problems": problems, "descriptors": fds, "database": database, "runtime": runtime});
    (status, axum::Json(body)).into_response()
}
