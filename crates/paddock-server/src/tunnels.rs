//! Upgraded connections (WebSockets) through the port proxy. Once hyper hands a connection
//! over to an upgrade it no longer counts against `--max-connections`, and a relay that waits
//! for both directions to end holds its two descriptors for as long as either side stays open:
//! 9,950 idle ones took a server to its descriptor limit. So tunnels have caps of their own (in
//! all and per sandbox), end when either side closes, and close when idle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many tunnels may be open, and for how long one may carry nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelLimits {
    pub all: usize,
    pub per_sandbox: usize,
    pub idle: Duration,
}

impl Default for TunnelLimits {
    fn default() -> Self {
        TunnelLimits { all: 1024, per_sandbox: 256, idle: Duration::from_secs(600) }
    }
}

/// The open tunnels: a permit per tunnel, counted per sandbox.
pub struct Tunnels {
    limits: TunnelLimits,
    all: Arc<Semaphore>,
    per: Mutex<HashMap<String, usize>>,
}

/// One open tunnel's place; dropping it gives the place back.
pub struct Permit {
    tunnels: Arc<Tunnels>,
    sandbox: String,
    _all: OwnedSemaphorePermit,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut per = self.tunnels.per.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = per.get_mut(&self.sandbox) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.sandbox);
            }
        }
    }
}

/// Why a tunnel was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    All(usize),
    Sandbox(usize),
}

impl Tunnels {
    pub fn new(limits: TunnelLimits) -> Arc<Self> {
        let all = Arc::new(Semaphore::new(limits.all.max(1)));
        Arc::new(Tunnels { limits, all, per: Mutex::default() })
    }

    /// A place for one more tunnel to `sandbox`, if there is one.
    pub fn open(self: &Arc<Self>, sandbox: &str) -> Result<Permit, Full> {
        let mut per = self.per.lock().unwrap_or_else(|e| e.into_inner());
        let n = per.get(sandbox).copied().unwrap_or(0);
        if n >= self.limits.per_sandbox {
            return Err(Full::Sandbox(self.limits.per_sandbox));
        }
        let all = self.all.clone().try_acquire_owned().map_err(|_| Full::All(self.limits.all))?;
        per.insert(sandbox.to_owned(), n + 1);
        Ok(Permit { tunnels: self.clone(), sandbox: sandbox.to_owned(), _all: all })
    }

    /// Tunnels open now.
    pub fn open_now(&self) -> usize {
        self.limits.all.max(1) - self.all.available_permits()
    }

    pub fn idle(&self) -> Duration {
        self.limits.idle
    }
}

/// Copies bytes both ways until either side ends (or fails), or nothing moved for `idle`;
/// then both are shut down. `tokio::io::copy_bidirectional` waits for both directions to end,
/// which a peer that half-closes and then goes quiet never lets happen.
pub async fn relay<A, B>(a: A, b: B, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let moved = || last.store(paddock_core::units::millis(start.elapsed()), Ordering::Relaxed);
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let watchdog = async {
        loop {
            let since = start.elapsed().saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
            if since >= idle {
                return;
            }
            tokio::time::sleep(idle - since).await;
        }
    };
    tokio::select! {
        _ = copy_counting(&mut ar, &mut bw, &moved) => {}
        _ = copy_counting(&mut br, &mut aw, &moved) => {}
        () = watchdog => {}
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = aw.shutdown().await;
        let _ = bw.shutdown().await;
    })
    .await;
}

/// Copies `r` into `w` until `r` ends, calling `moved` after each piece.
async fn copy_counting<R, W>(r: &mut R, w: &mut W, moved: &impl Fn()) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        w.write_all(&buf[..n]).await?;
        w.flush().await?;
        moved();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn places_are_counted_in_all_and_per_sandbox_and_given_back() {
        let t = Tunnels::new(TunnelLimits { all: 3, per_sandbox: 2, idle: Duration::from_secs(1) });
        let a1 = t.open("a").unwrap();
        let _a2 = t.open("a").unwrap();
        assert_eq!(t.open("a").err(), Some(Full::Sandbox(2)));
        let _b1 = t.open("b").unwrap();
        assert_eq!(t.open("c").err(), Some(Full::All(3)));
        assert_eq!(t.open_now(), 3);
        drop(a1);
        assert!(t.open("a").is_ok(), "a closed tunnel gives its place back");
    }

    #[tokio::test]
    async fn a_relay_ends_when_either_side_closes_and_when_idle() {
        // One side closes: the other is shut down, though it never closed.
        let (mut client, a) = tokio::io::duplex(1024);
        let (b, mut server) = tokio::io::duplex(1024);
        let relaying = tokio::spawn(relay(a, b, Duration::from_secs(60)));
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), relaying).await.expect("the relay ended").unwrap();
        let mut rest = Vec::new();
        assert_eq!(server.read_to_end(&mut rest).await.unwrap(), 0, "the other side saw its end");

        // Nobody says anything: the relay ends after the idle time.
        let (_client, a) = tokio::io::duplex(1024);
        let (b, _server) = tokio::io::duplex(1024);
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), relay(a, b, Duration::from_millis(200))).await.expect("idle end");
        assert!(started.elapsed() >= Duration::from_millis(200));
    }
}
