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
fn descriptors() -> Result<(u64, Option<u64>), std::io::Error> {
    // Minus the one read_dir itself holds.
    let open = std::fs::read_dir("/proc/self/fd")?.count().saturating_sub(1) as u64;
    Ok((open, getrlimit(Resource::Nofile).current))
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
    let database = match tokio::time::timeout(DATABASE_DEADLINE, state.store.ping()).await {
        Ok(Ok(())) => json!({"ok": true}),
        Ok(Err(e)) => {
            problems.push(format!("the state database does not answer: {e}"));
            json!({"ok": false})
        }
        Err(_) => {
            problems.push(format!(
                "the state database did not answer within {}s: check the disk of the data directory",
                DATABASE_DEADLINE.as_secs()
            ));
            json!({"ok": false})
        }
    };
    let runtime = match tokio::time::timeout(DATABASE_DEADLINE, state.rt.health()).await {
        Ok(Ok(())) => json!({"ok": true}),
        Ok(Err(e)) => {
            problems.push(format!("the sandbox runtime is not usable: {e}"));
            json!({"ok": false})
        }
        Err(_) => {
            problems.push(format!(
                "the sandbox runtime did not answer within {}s: creates and commands will time out",
                DATABASE_DEADLINE.as_secs()
            ));
            json!({"ok": false})
        }
    };
    let (status, word) =
        if problems.is_empty() { (StatusCode::OK, "healthy") } else { (StatusCode::SERVICE_UNAVAILABLE, "unhealthy") };
    let body =
        json!({"status": word, "problems": problems, "descriptors": fds, "database": database, "runtime": runtime});
    (status, axum::Json(body)).into_response()
}
