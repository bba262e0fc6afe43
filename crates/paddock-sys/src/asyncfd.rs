//! Registering an owned descriptor with tokio's reactor, for the async clients of supervisors.

use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

/// Wraps a non-blocking descriptor so it can be awaited.
pub fn register(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd takes ownership of the OwnedFd, so the descriptor stays open (and
    // cannot be reused by another registration) for exactly as long as it is registered.
    unsafe { AsyncFd::register(fd) }.map_err(std::io::Error::from)
}
