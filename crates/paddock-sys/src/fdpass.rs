//! Messages with file descriptors attached (SCM_RIGHTS) over `SOCK_SEQPACKET` Unix sockets.
//!
//! Paddock hands the caller's own stdin/stdout/stderr (or pipes) straight to the sandboxed
//! process this way, so output never passes through the supervisor.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, SocketFlags, SocketType,
};

/// Most descriptors one message can carry.
pub const MAX_FDS: usize = 8;

/// Largest message body; requests are small JSON documents.
pub const MAX_MESSAGE: usize = 256 * 1024;

/// A connected pair of close-on-exec `SOCK_SEQPACKET` sockets.
pub fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

/// Sends one message with `fds` attached.
pub fn send(socket: impl AsFd, body: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other(format!("cannot attach {} descriptors (max {MAX_FDS})", fds.len())));
    }
    let sent = rustix::net::sendmsg(socket, &[IoSlice::new(body)], &mut control, SendFlags::NOSIGNAL)?;
    if sent != body.len() {
        return Err(std::io::Error::other("message was truncated on send"));
    }
    Ok(())
}

/// Sends one message, waiting (up to `timeout`) while the socket is full, for senders whose
/// socket is non-blocking but who must not drop the message.
pub fn send_waiting(
    socket: impl AsFd,
    body: &[u8],
    fds: &[BorrowedFd<'_>],
    timeout: std::time::Duration,
) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match send(&socket, body, fds) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer is not reading"));
                }
                let mut pfd = [rustix::event::PollFd::new(&socket, rustix::event::PollFlags::OUT)];
                let ts = rustix::time::Timespec::try_from(left).unwrap_or_default();
                let _ = rustix::event::poll(&mut pfd, Some(&ts));
            }
            other => return other,
        }
    }
}

/// Receives one message; returns its body (empty at end of stream) and the attached
/// descriptors, which arrive close-on-exec.
pub fn recv(socket: impl AsFd, flags: RecvFlags) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    // The message's length first (a peek with `MSG_TRUNC` reports a sequenced packet's whole
    // length), so that the buffer is the message's size: a zeroed `MAX_MESSAGE` buffer per
    // message cost every process 64 page faults and a 256 KiB memset for a request of a
    // hundred bytes. Peeking leaves the message and its descriptors queued.
    let (_, len) = rustix::net::recv(&socket, &mut [0u8; 0][..], flags | RecvFlags::PEEK | RecvFlags::TRUNC)?;
    // One too large is still taken off the queue (into no room), then refused below.
    let mut body = vec![0u8; if len <= MAX_MESSAGE { len } else { 0 }];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg =
        rustix::net::recvmsg(socket, &mut [IoSliceMut::new(&mut body)], &mut control, flags | RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if msg.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(std::io::Error::other(format!("message larger than {MAX_MESSAGE} bytes")));
    }
    body.truncate(msg.bytes);
    Ok((body, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_bytes_and_descriptors() {
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        send(&a, b"hello", &[w.as_fd()]).unwrap();
        drop(w);
        let (body, mut fds) = recv(&b, RecvFlags::empty()).unwrap();
        assert_eq!(body, b"hello");
        assert_eq!(fds.len(), 1);
        rustix::io::write(fds.pop().unwrap(), b"via fd").unwrap();
        let mut buf = [0u8; 16];
        let n = rustix::io::read(&r, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"via fd");
        drop(a);
        let (eof, fds) = recv(&b, RecvFlags::empty()).unwrap();
        assert!(eof.is_empty() && fds.is_empty());
    }

    #[test]
    fn each_message_arrives_whole_and_alone_and_an_oversized_one_is_refused_and_dropped() {
        let (a, b) = seqpacket_pair().unwrap();
        // Sockets on this machine may queue less than MAX_MESSAGE + 1 bytes by default.
        rustix::net::sockopt::set_socket_send_buffer_size(&a, 4 * MAX_MESSAGE).unwrap();
        let big = vec![7u8; MAX_MESSAGE];
        send(&a, &big, &[]).unwrap();
        send(&a, b"", &[]).unwrap();
        send(&a, &vec![1u8; MAX_MESSAGE + 1], &[]).unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        send(&a, b"after", &[r.as_fd()]).unwrap();
        drop((r, w));
        let (body, fds) = recv(&b, RecvFlags::empty()).unwrap();
        assert!(body == big && fds.is_empty(), "a message of MAX_MESSAGE bytes arrives whole");
        let (body, _) = recv(&b, RecvFlags::empty()).unwrap();
        assert!(body.is_empty(), "an empty message is empty");
        let err = recv(&b, RecvFlags::empty()).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
        let (body, fds) = recv(&b, RecvFlags::empty()).unwrap();
        assert_eq!((body.as_slice(), fds.len()), (&b"after"[..], 1), "the oversized one is gone, the next intact");
        let err = recv(&b, RecvFlags::DONTWAIT).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock, "nothing is left queued");
    }
}
