//! The connections the server holds, so that at its cap it can make room. A client that opens
//! connections and trickles their headers (and reconnects when closed) would otherwise hold
//! every slot in turn: about 1,100 such connections delayed `/health` by 22 s. So each peer
//! address may hold only a share of the slots, and at the cap (the server's, or a peer's) the
//! connection that has gone longest without a request in flight is closed for the new one:
//! a trickling connection has never had one, while a real client's request is served in
//! milliseconds and is never cut off.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A connection without a request in flight for this long may be closed to make room.
pub const MIN_IDLE: Duration = Duration::from_secs(1);

/// One connection, as the server and its requests see it.
#[derive(Debug)]
pub struct Conn {
    /// Milliseconds after `Conns::epoch` of its last request's start or end.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// A request has started on it.
    begun: std::sync::atomic::AtomicBool,
    /// Notified when the connection is to be closed.
    pub close: Notify,
}

impl Conn {
    /// Whether a request has started on this connection yet.
    pub fn has_begun(&self) -> bool {
        self.begun.load(Ordering::Relaxed)
    }
}

/// A request in flight on a connection: counted until its response has been sent or dropped.
pub struct InFlight {
    conn: Arc<Conn>,
    epoch: Instant,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn.last_ms.store(paddock_core::units::millis(self.epoch.elapsed()), Ordering::Relaxed);
        self.conn.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The server's connections, by peer.
pub struct Conns {
    epoch: Instant,
    per_peer: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    conns: HashMap<u64, (IpAddr, Arc<Conn>)>,
    peers: HashMap<IpAddr, usize>,
}

/// A connection's place in [`Conns`]; dropping it (the connection closed) gives it back.
pub struct Registered {
    conns: Arc<Conns>,
    id: u64,
    pub conn: Arc<Conn>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut inner = self.conns.lock();
        if let Some((peer, _)) = inner.conns.remove(&self.id)
            && let Some(n) = inner.peers.get_mut(&peer)
        {
            *n -= 1;
            if *n == 0 {
                inner.peers.remove(&peer);
            }
        }
    }
}

impl Conns {
    pub fn new(per_peer: usize) -> Arc<Self> {
        Arc::new(Conns { epoch: Instant::now(), per_peer: per_peer.max(1), inner: Mutex::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ms(&self) -> u64 {
        paddock_core::units::millis(self.epoch.elapsed())
    }

    /// Takes a place for a new connection from `peer`. At the peer's share, its idlest
    /// connection is closed first; `None` when none of them may be (all are serving).
    pub fn register(self: &Arc<Self>, peer: IpAddr) -> Option<Registered> {
        if self.lock().peers.get(&peer).copied().unwrap_or(0) >= self.per_peer && !self.evict_idlest(Some(peer)) {
            return None;
        }
        let conn = Arc::new(Conn {
            last_ms: AtomicU64::new(self.now_ms()),
            in_flight: AtomicUsize::new(0),
            begun: std::sync::atomic::AtomicBool::new(false),
            close: Notify::new(),
        });
        let mut inner = self.lock();
        let id = inner.next;
        inner.next += 1;
        inner.conns.insert(id, (peer, conn.clone()));
        *inner.peers.entry(peer).or_insert(0) += 1;
        Some(Registered { conns: self.clone(), id, conn })
    }

    /// A request starts on `conn`.
    pub fn begin(&self, conn: &Arc<Conn>) -> InFlight {
        conn.begun.store(true, Ordering::Relaxed);
        conn.in_flight.fetch_add(1, Ordering::Relaxed);
        conn.last_ms.store(self.now_ms(), Ordering::Relaxed);
        InFlight { conn: conn.clone(), epoch: self.epoch }
    }

    /// Closes the connection (of `peer`, if given) that has gone longest without a request in
    /// flight, if that is at least [`MIN_IDLE`]; whether one was.
    pub fn evict_idlest(&self, peer: Option<IpAddr>) -> bool {
        let now = self.now_ms();
        let min = paddock_core::units::millis(MIN_IDLE);
        let inner = self.lock();
        let idlest = inner
            .conns
            .values()
            .filter(|(p, c)| peer.is_none_or(|want| *p == want) && c.in_flight.load(Ordering::Relaxed) == 0)
            .map(|(_, c)| c)
            .filter(|c| now.saturating_sub(c.last_ms.load(Ordering::Relaxed)) >= min)
            .min_by_key(|c| c.last_ms.load(Ordering::Relaxed));
        match idlest {
            Some(c) => {
                // Never picked twice while it closes.
                c.last_ms.store(u64::MAX / 2, Ordering::Relaxed);
                c.close.notify_one();
                true
            }
            None => false,
        }
    }

    /// Connections held now.
    pub fn len(&self) -> usize {
        self.lock().conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_idlest_connection_without_a_request_is_closed_and_a_peer_keeps_to_its_share() {
        let conns = Conns::new(2);
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let first = conns.register(a).unwrap();
        let busy = conns.register(a).unwrap();
        let serving = conns.begin(&busy.conn);
        assert!(!conns.evict_idlest(None), "nothing has been idle long enough");
        tokio::time::sleep(MIN_IDLE + Duration::from_millis(50)).await;
        // A third from `a`: its idle one goes, its serving one stays.
        let third = conns.register(a).expect("room made in a's share");
        tokio::time::timeout(Duration::from_secs(1), first.conn.close.notified()).await.expect("the idle one closed");
        drop(first);
        assert_eq!(conns.len(), 2);
        // `a` is at its share with one serving and one just opened: nothing to close, refused.
        assert!(conns.register(a).is_none());
        // Another peer has its own share.
        let _other = conns.register(b).unwrap();
        drop(serving);
        drop((busy, third));
        assert_eq!(conns.len(), 1);
    }
}
