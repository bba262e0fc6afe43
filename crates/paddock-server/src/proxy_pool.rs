//! The port proxy's idle connections, apart from its handlers so that the server's state can
//! hold them without importing a handler.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;

/// Idle HTTP/1 connections to servers in sandboxes, per sandbox and port: opening one costs a
/// round trip through the supervisor and the init, more than the request itself.
#[derive(Default)]
pub struct Pool(Mutex<HashMap<PortKey, Vec<(Sender, Instant)>>>);

pub(crate) type Sender = hyper::client::conn::http1::SendRequest<Body>;
/// A sandbox id and a port in it.
pub(crate) type PortKey = (String, u16);

/// How long a connection stays idle in the pool: under the 5 s keep-alive of Node's servers,
/// so a pooled connection is not one its server is about to close.
const POOL_IDLE: Duration = Duration::from_secs(2);
const POOL_PER_PORT: usize = 16;

impl Pool {
    pub(crate) fn take(&self, key: &PortKey) -> Option<Sender> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let idle = map.get_mut(key)?;
        while let Some((sender, at)) = idle.pop() {
            if at.elapsed() < POOL_IDLE && sender.is_ready() && !sender.is_closed() {
                return Some(sender);
            }
        }
        map.remove(key);
        None
    }

    pub(crate) fn put(&self, key: PortKey, sender: Sender) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Forget stale entries of every port now and then, so a busy server's map stays small.
        if map.len() > 1024 {
            map.retain(|_, idle| idle.iter().any(|(_, at)| at.elapsed() < POOL_IDLE));
        }
        let idle = map.entry(key).or_default();
        if idle.len() < POOL_PER_PORT {
            idle.push((sender, Instant::now()));
        }
    }
}
