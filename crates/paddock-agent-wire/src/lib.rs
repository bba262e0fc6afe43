//! The wire format between Paddock's Kubernetes runtime and its agent in a sandbox Pod.
//!
//! The agent listens on the Pod's own loopback only ([`PORT`]); the server reaches it through
//! one `pods/portforward` stream per Pod and speaks HTTP/2 over it (prior knowledge), so many
//! commands share one warm connection. `POST /run` starts a command: the request body is a
//! [`SPEC`] frame and then [`STDIN`] frames (the body's end is the command's EOF); the response
//! body is [`STDOUT`]/[`STDERR`] frames and one [`EXIT`] (a big-endian `i32`, a shell's
//! `128 + n` for death by signal `n`) or [`ERROR`] frame. `POST /exec` starts a user command
//! ([`ExecSpec`]) the same way; `POST /signal?token=T&signal=N` (no body) signals one.
//! `GET /id` answers `ID PROTOCOL`: the id the agent was started with (a hash of its binary)
//! and [`PROTOCOL`], so a server replaces only an agent it cannot speak to. `POST /exit` ends
//! it.
//!
//! A frame is one kind byte, a big-endian `u32` length and that many bytes. The agent runs
//! with the sandbox's own uid, so the sandbox can replace it: the server treats every byte it
//! sends as untrusted ([`Decoder`] bounds each frame by [`MAX_FRAME`]).

use bytes::{Buf, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// The agent's port on the Pod's loopback; the runtime refuses to proxy it.
pub const PORT: u16 = 44770;
/// The port the code-interpreter SDK probes for readiness: the agent accepts and closes.
pub const READINESS_PORT: u16 = 44771;

pub const SPEC: u8 = 0;
pub const STDIN: u8 = 1;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const EXIT: u8 = 3;
pub const ERROR: u8 = 4;

/// The protocol this build speaks; agents of other builds that speak it are used as they are.
pub const PROTOCOL: &str = "1";

/// Largest frame the server accepts from an agent (output comes in 32 KiB frames; an agent
/// the sandbox replaced may send anything).
pub const MAX_FRAME: usize = 64 << 10;

/// Each side's HTTP/2 windows: per stream, and per connection, which holds every stream's so
/// that streams nobody reads never stall the others (signals, new commands).
pub const STREAM_WINDOW: u32 = 256 << 10;
pub const MAX_STREAMS: u32 = 256;
pub const CONNECTION_WINDOW: u32 = STREAM_WINDOW * MAX_STREAMS;
/// Largest spec the agent accepts: a command line of up to 1 MiB, JSON-escaped.
pub const MAX_SPEC: usize = 8 << 20;
const HEADER: usize = 5;

/// A user command for `POST /exec`: started as the runtime's `sh` wrapper would, minus the
/// shell. It runs in `cwd` with exactly `env`, in a process group of its own that
/// `POST /signal` reaches by `token`; its EXIT frame carries a fifth byte, 1 when the
/// container's memory limit killed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    /// Empty: the agent's own starting directory (the image's `WorkingDir`), or `/workspace`
    /// when that is `/`.
    pub cwd: String,
    pub token: String,
    pub stdin: bool,
}

/// What `POST /run` starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    /// Program and arguments; the program is looked up in the agent's `PATH`.
    pub argv: Vec<String>,
    /// Whether the command reads the request body as its input (else `/dev/null`).
    pub stdin: bool,
}

/// A frame's bytes.
pub fn encode(kind: u8, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER + data.len());
    b.extend_from_slice(&[kind]);
    // Callers send chunks far below 4 GiB; a larger one would be cut, never wrap.
    b.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    b.extend_from_slice(data);
    b.freeze()
}

/// A malformed stream of frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameTooLarge(pub usize, pub usize);

impl std::fmt::Display for FrameTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a frame of {} bytes is over the limit of {}", self.0, self.1)
    }
}

/// Splits a byte stream into frames, whatever the chunks it arrives in.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    limit: usize,
}

impl Default for Decoder {
    /// A decoder of at most [`MAX_FRAME`] per frame.
    fn default() -> Self {
        Self::with_limit(MAX_FRAME)
    }
}

impl Decoder {
    pub fn with_limit(limit: usize) -> Self {
        Self { buf: BytesMut::new(), limit }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Bytes)>, FrameTooLarge> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.limit {
            return Err(FrameTooLarge(len, self.limit));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let kind = self.buf[0];
        self.buf.advance(HEADER);
        Ok(Some((kind, self.buf.split_to(len).freeze())))
    }

    /// Whether bytes of an unfinished frame are left.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// The exit code a shell would report for a wait status: `128 + n` for death by signal `n`.
pub fn exit_code(code: Option<i32>, signal: Option<i32>) -> i32 {
    match (code, signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 255,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_any_chunking() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&encode(STDOUT, b"hello"));
        wire.extend_from_slice(&encode(STDERR, b""));
        wire.extend_from_slice(&encode(EXIT, &7i32.to_be_bytes()));
        for step in [1, 2, 3, 7, wire.len()] {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for chunk in wire.chunks(step) {
                d.push(chunk);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert!(d.is_empty());
            assert_eq!(got.len(), 3, "chunks of {step}");
            assert_eq!(got[0], (STDOUT, Bytes::from_static(b"hello")));
            assert_eq!(got[1], (STDERR, Bytes::new()));
            assert_eq!(got[2].1.as_ref(), 7i32.to_be_bytes());
        }
    }

    #[test]
    fn an_oversized_frame_is_refused_before_it_is_buffered() {
        let mut d = Decoder::default();
        d.push(&[STDOUT, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d.next_frame(), Err(FrameTooLarge(u32::MAX as usize, MAX_FRAME)));
        let mut d = Decoder::with_limit(MAX_SPEC);
        d.push(&encode(SPEC, &vec![b'x'; MAX_FRAME + 1]));
        assert_eq!(d.next_frame().unwrap().unwrap().1.len(), MAX_FRAME + 1);
    }

    #[test]
    fn signals_read_as_a_shell_reports_them() {
        assert_eq!(exit_code(Some(3), None), 3);
        assert_eq!(exit_code(None, Some(9)), 137);
    }
}
