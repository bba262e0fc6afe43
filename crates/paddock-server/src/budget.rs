//! One memory budget for everything the server holds whole while it serves a request: JSON
//! bodies (up to `JSON_BODY_LIMIT` each) and files edited in memory (`files/replace`). Every
//! such request reserves what it may hold before it reads anything, so a token holder who
//! sends many large bodies at once waits, then gets a 503 that says so, instead of taking the
//! server's memory from everyone. Streams (uploads, downloads, proxied ports) hold little and
//! reserve nothing.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// How long a request waits for room before it is turned away.
const WAIT: Duration = Duration::from_secs(10);

/// The budget, counted in KiB so a semaphore's permits cover terabytes.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    permits: Arc<Semaphore>,
    total_kib: u32,
}

fn kib(bytes: u64) -> u32 {
    bytes.div_ceil(1024).min(u32::MAX as u64) as u32
}

impl MemoryBudget {
    pub fn new(bytes: u64) -> Self {
        let total_kib = kib(bytes).max(1);
        Self { permits: Arc::new(Semaphore::new(total_kib as usize)), total_kib }
    }

    /// Reserves `bytes` (at most the whole budget) until the permit is dropped, waiting a
    /// while for other requests to finish.
    pub async fn reserve(&self, bytes: u64, what: &str) -> ApiResult<OwnedSemaphorePermit> {
        let n = kib(bytes).min(self.total_kib);
        match tokio::time::timeout(WAIT, self.permits.clone().acquire_many_owned(n)).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::unavailable(format!(
                "the server is holding as much request data in memory as it may ({} MiB, --max-request-memory), so {what} cannot start now: retry in a moment",
                self.total_kib / 1024
            ))),
        }
    }

    /// KiB free now.
    #[cfg(test)]
    fn available_kib(&self) -> usize {
        self.permits.available_permits()
    }
}

/// Reserves room for a request's body before it is read: its declared length, or the JSON
/// limit when it declares none. Uploads and proxied ports stream and pass straight through.
pub async fn reserve_body(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let streams = path.ends_with("/files/upload")
        || crate::proxied_port_of(path).is_some_and(|p| p != crate::EXECD_PORT && p != crate::EGRESS_PORT);
    let headers = req.headers();
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let chunked = headers.contains_key(axum::http::header::TRANSFER_ENCODING);
    let body = match declared {
        Some(n) => n,
        None if chunked => crate::JSON_BODY_LIMIT as u64,
        None => 0,
    };
    if streams || body == 0 {
        return next.run(req).await;
    }
    let bytes = body.min(crate::JSON_BODY_LIMIT as u64);
    match state.budget.reserve(bytes, "this request").await {
        Ok(permit) => {
            let response = next.run(req).await;
            drop(permit);
            response
        }
        Err(e) => {
            let mut r = e.into_response();
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_wait_for_room_and_give_it_back() {
        let b = MemoryBudget::new(4 << 20);
        let a = b.reserve(3 << 20, "a").await.unwrap();
        assert_eq!(b.available_kib(), 1024);
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move { b.reserve(2 << 20, "b").await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a reservation past the budget waits");
        drop(a);
        waiting.await.unwrap().unwrap();
        assert_eq!(b.available_kib(), 4096);
        // More than the whole budget is the whole budget, never a wait that cannot end.
        drop(b.reserve(1 << 40, "huge").await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_budget_turns_requests_away_with_a_reason() {
        let b = MemoryBudget::new(1 << 20);
        let _held = b.reserve(1 << 20, "a").await.unwrap();
        let e = b.reserve(1, "this request").await.unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.message.contains("--max-request-memory"), "{}", e.message);
    }
}
