//! One memory budget for everything the server holds whole while it serves a request: JSON
//! bodies (up to `JSON_BODY_LIMIT` each) and files edited in memory (`files/replace`). Room is
//! reserved as a body's bytes arrive (never by what it declares), each client (the tenant its
//! key proved, or the sandbox its token opened) may hold only a share of the budget, and a body must arrive
//! whole within `BODY_TIME`. So slow or many bodies from one token wait, then get a 503 that
//! says so, while everyone else's requests go on. Streams (uploads, downloads, proxied ports,
//! run inputs) hold little and reserve nothing.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::error::{ApiError, ApiResult};

/// How long a request waits for room before it is turned away.
const WAIT: Duration = Duration::from_secs(10);
/// How long a JSON body may take to arrive whole, however it trickles (2 MiB in 30 s is
/// 70 KB/s): a stall bound alone lets a byte every few seconds hold its room for hours.
pub const BODY_TIME: Duration = Duration::from_secs(30);
/// Room is taken in steps of this as bytes arrive.
const STEP: u64 = 64 << 10;
/// A client may hold at most this fraction of the budget (and never less than two JSON
/// bodies' worth, so one request always fits).
const SHARE_DIVISOR: u32 = 8;

/// The address a connection came from, put on each of its requests by the listener.
#[derive(Debug, Clone, Copy)]
pub struct PeerIp(pub std::net::IpAddr);

/// The budget, counted in KiB so a semaphore's permits cover terabytes.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    permits: Arc<Semaphore>,
    total_kib: u32,
    share_kib: u32,
    /// Each client's share, by a keyed hash of who it is (its tenant, sandbox or address);
    /// an entry goes when its client holds nothing.
    shares: Shares,
    hasher: std::collections::hash_map::RandomState,
}

/// Each client's share of the budget, by a keyed hash of who it is.
type Shares = Arc<Mutex<HashMap<u64, Arc<Semaphore>>>>;

/// A client's key, its share, the map it is in, and the share's size in KiB.
struct Client {
    key: u64,
    share: Arc<Semaphore>,
    shares: Shares,
    size: u32,
}

fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// Room a request holds, in the whole budget and in its client's share; given back on drop.
pub struct Held {
    global: Option<OwnedSemaphorePermit>,
    own: Option<OwnedSemaphorePermit>,
    kib: u32,
    client: Option<Client>,
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.global.take());
        drop(self.own.take());
        if let Some(c) = self.client.take() {
            let mut map = c.shares.lock().unwrap_or_else(|e| e.into_inner());
            // Only the map and this request hold it, and nothing is reserved: forget it.
            if Arc::strong_count(&c.share) <= 2 && c.share.available_permits() == c.size as usize {
                map.remove(&c.key);
            }
        }
    }
}

impl MemoryBudget {
    pub fn new(bytes: u64) -> Self {
        let total_kib = kib(bytes).max(1);
        let floor = kib(2 * crate::api::JSON_BODY_LIMIT as u64).min(total_kib);
        Self {
            permits: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            share_kib: (total_kib / SHARE_DIVISOR).max(floor),
            shares: Arc::default(),
            hasher: Default::default(),
        }
    }

    fn full(&self, what: &str) -> ApiError {
        ApiError::unavailable(format!(
            "the server is holding as much request data in memory as it may ({} MiB, --max-request-memory), so {what} cannot go on now: retry in a moment",
            self.total_kib / 1024
        ))
    }

    /// Reserves `bytes` (at most the whole budget) until the permit is dropped, waiting a
    /// while for other requests to finish.
    pub async fn reserve(&self, bytes: u64, what: &str) -> ApiResult<OwnedSemaphorePermit> {
        let n = kib(bytes).min(self.total_kib);
        match tokio::time::timeout(WAIT, self.permits.clone().acquire_many_owned(n)).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(self.full(what)),
        }
    }

    /// Empty room for a client, to grow with `grow`.
    fn hold(&self, client: &str) -> Held {
        let key = self.hasher.hash_one(client);
        let sem = {
            let mut map = self.shares.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(key).or_insert_with(|| Arc::new(Semaphore::new(self.share_kib as usize))).clone()
        };
        let client = Client { key, share: sem, shares: self.shares.clone(), size: self.share_kib };
        Held { global: None, own: None, kib: 0, client: Some(client) }
    }

    /// Grows `held` to cover `bytes`, waiting for room until `until`. A client past its share
    /// is told so; a full budget says that.
    async fn grow(&self, held: &mut Held, bytes: u64, until: Instant) -> ApiResult<()> {
        let want = kib(bytes.div_ceil(STEP) * STEP).min(self.share_kib);
        if want <= held.kib {
            return Ok(());
        }
        let more = want - held.kib;
        let Some(client) = &held.client else { return Ok(()) };
        let own = match tokio::time::timeout_at(until, client.share.clone().acquire_many_owned(more)).await {
            Ok(Ok(p)) => p,
            _ => {
                return Err(ApiError::unavailable(format!(
                    "this client (its tenant, or the sandbox whose token it holds) already has {} MiB of request data in the server's memory, its share of --max-request-memory: finish or cancel its other requests, then retry",
                    self.share_kib / 1024
                )));
            }
        };
        let global = match tokio::time::timeout_at(until, self.permits.clone().acquire_many_owned(more)).await {
            Ok(Ok(p)) => p,
            _ => return Err(self.full("this request")),
        };
        for (slot, p) in [(&mut held.own, own), (&mut held.global, global)] {
            match slot {
                Some(h) => h.merge(p),
                None => *slot = Some(p),
            }
        }
        held.kib = want;
        Ok(())
    }

    /// KiB free now.
    #[cfg(test)]
    fn available_kib(&self) -> usize {
        self.permits.available_permits()
    }
}

/// Who a request is from, for its share, as authentication proved it (this runs inside the
/// routes' authentication): the tenant whose key it carries, else the sandbox whose token or
/// signed route opened it, else its address. Never a header as sent, which a client could
/// vary to get a new share each time.
fn client_of(req: &Request) -> String {
    if let Some(tenant) = req.extensions().get::<crate::tenants::Tenant>() {
        return format!("tenant {}", tenant.as_str());
    }
    if let Some(id) = crate::api::sandbox_id_of(req.uri().path()) {
        return format!("sandbox {id}");
    }
    match req.extensions().get::<PeerIp>() {
        Some(PeerIp(ip)) => format!("address {ip}"),
        None => "unknown".into(),
    }
}

/// Reads a JSON body whole before its handler runs, reserving room as its bytes arrive.
/// Uploads, proxied ports and run inputs stream and pass straight through.
pub async fn reserve_body(State(budget): State<MemoryBudget>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let streams = path.ends_with("/files/upload")
        || (path.ends_with("/inputs") && path.contains("/runs/"))
        || crate::api::proxied_port_of(path)
            .is_some_and(|p| p != crate::api::EXECD_PORT && p != crate::api::EGRESS_PORT);
    let headers = req.headers();
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let chunked = headers.contains_key(axum::http::header::TRANSFER_ENCODING);
    let has_body = declared.map_or(chunked, |n| n > 0);
    // A declared length past the limit is refused by the handler's extractor unread.
    if streams || !has_body || declared.is_some_and(|n| n > crate::api::JSON_BODY_LIMIT as u64) {
        return next.run(req).await;
    }
    let mut held = budget.hold(&client_of(&req));
    let (parts, body) = req.into_parts();
    match read_whole(&budget, &mut held, body).await {
        Ok(bytes) => {
            let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
            drop(held);
            response
        }
        Err(e) => {
            let busy = e.status == StatusCode::SERVICE_UNAVAILABLE;
            let mut r = e.into_response();
            if busy {
                r.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
            }
            r
        }
    }
}

async fn read_whole(budget: &MemoryBudget, held: &mut Held, mut body: Body) -> ApiResult<bytes::Bytes> {
    let until = Instant::now() + BODY_TIME;
    let mut buf = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(until, body.frame()).await {
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "BODY_TOO_SLOW",
                    format!(
                        "the request body did not arrive whole within {} s ({} bytes came): send it at once",
                        BODY_TIME.as_secs(),
                        buf.len()
                    ),
                ));
            }
            Ok(None) => return Ok(buf.freeze()),
            Ok(Some(Err(e))) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "BODY_ENDED_EARLY",
                    format!("the request body could not be read whole: {e}"),
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        let total = buf.len() as u64 + data.len() as u64;
        if total > crate::api::JSON_BODY_LIMIT as u64 {
            return Err(crate::api::json_too_large());
        }
        budget.grow(held, total, until.min(Instant::now() + WAIT)).await?;
        buf.extend_from_slice(&data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

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

    /// A body fed by the test: what is sent arrives, then it waits until `tx` is dropped.
    fn trickle() -> (tokio::sync::mpsc::Sender<&'static [u8]>, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<&'static [u8]>(16);
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(|b| Ok::<_, std::io::Error>(bytes::Bytes::from_static(b)));
        (tx, Body::from_stream(stream))
    }

    #[tokio::test(start_paused = true)]
    async fn room_follows_the_bytes_that_arrived_and_a_client_gets_only_its_share() {
        let b = MemoryBudget::new(64 << 20);
        assert_eq!(b.share_kib, 8 << 10);
        // A body that declares 2 MiB and sends one byte holds one step, not 2 MiB.
        let (tx, body) = trickle();
        tx.send(b"{").await.unwrap();
        let slow = {
            let b = b.clone();
            tokio::spawn(async move {
                let mut held = b.hold("credential slow");
                let r = read_whole(&b, &mut held, body).await;
                (r.map(|x| x.len()), held.kib)
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(b.available_kib(), (64 << 10) - 64, "one 64 KiB step for one byte");
        // However it trickles, it ends at BODY_TIME with a 408, and gives its room back.
        let (r, _) = slow.await.unwrap();
        let e = r.unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::REQUEST_TIMEOUT, "BODY_TOO_SLOW"), "{}", e.message);
        drop(tx);
        assert_eq!(b.available_kib(), 64 << 10);
        assert!(b.shares.lock().unwrap().is_empty(), "a client holding nothing is forgotten");

        // One client fills its share (8 MiB) and is refused more, naming the share ...
        let mut greedy: Vec<Held> = Vec::new();
        for _ in 0..4 {
            let mut h = b.hold("credential greedy");
            b.grow(&mut h, 2 << 20, Instant::now() + WAIT).await.unwrap();
            greedy.push(h);
        }
        let mut more = b.hold("credential greedy");
        let e = b.grow(&mut more, 1, Instant::now() + WAIT).await.unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.message.contains("its share of --max-request-memory"), "{}", e.message);
        // ... while another client's request still fits at once.
        let mut other = b.hold("address 192.0.2.9");
        b.grow(&mut other, 2 << 20, Instant::now() + WAIT).await.unwrap();
        drop((greedy, more, other));
        assert_eq!(b.available_kib(), 64 << 10);
        assert!(b.shares.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_whole_body_is_read_and_one_past_the_json_limit_is_refused() {
        let b = MemoryBudget::new(64 << 20);
        let mut held = b.hold("c");
        let body = Body::from(vec![b'x'; 100_000]);
        assert_eq!(read_whole(&b, &mut held, body).await.unwrap().len(), 100_000);
        assert_eq!(held.kib, 128, "two steps");
        let (tx, body) = trickle();
        let big: &'static [u8] = Box::leak(vec![b'x'; crate::api::JSON_BODY_LIMIT].into_boxed_slice());
        tx.send(big).await.unwrap();
        tx.send(b"!").await.unwrap();
        drop(tx);
        let mut held = b.hold("c");
        let e = read_whole(&b, &mut held, body).await.unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
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
