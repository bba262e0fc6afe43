//! Messages between a client, a sandbox's supervisor and the sandbox's init.
//!
//! Every connection carries one operation. Messages are JSON documents, one per `SOCK_SEQPACKET`
//! packet, with file descriptors attached where an operation needs them: the client's stdio
//! for an exec and a data pipe for a file transfer. The supervisor hands exec and file requests
//! (and the connection itself) to the init, which answers the client directly.

use std::collections::BTreeMap;

use paddock_core::runtime::{
    ExecOutcome, ExecRequest, FileErrorKind, FileOp, FileReply, RuntimeError, SandboxInfo, SandboxMetrics,
};
use serde::{Deserialize, Serialize};

/// Client → supervisor, on the supervisor's stdin: what to start.
#[derive(Debug, Serialize, Deserialize)]
pub struct Start {
    pub spec: paddock_core::spec::SandboxSpec,
    /// The image's layers when the root is an image from the store; `None` for `host` or a
    /// directory, which `spec.image` names.
    #[serde(default)]
    pub image: Option<ImageRoot>,
}

/// An image root the client resolved (and pulled) from the store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageRoot {
    /// Unpacked layer directories, lowest first.
    pub layers: Vec<std::path::PathBuf>,
    /// The on-disk uid and gid of the image's user, shown as the sandbox user.
    pub owner: (u32, u32),
}

/// Client → supervisor: the first message of a connection.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Descriptors: [stdin]? stdout stderr.
    Exec {
        request: ExecRequest,
        has_stdin: bool,
    },
    /// Descriptors: [data]? (the pipe a read or write moves contents through)
    File {
        op: FileCall,
        has_data: bool,
    },
    /// Answered with a TCP socket connected to this port on the sandbox's loopback.
    Connect {
        port: u16,
    },
    Info,
    /// Answered with `Network` and two descriptors: the sandbox's network namespace and a
    /// pidfd of its init (for the egress enforcer, which ends with the sandbox).
    Network,
    /// Answered with `Stats`.
    Stats,
    Pause,
    Resume,
    Renew {
        ttl_ms: u64,
    },
    Destroy,
}

/// Supervisor → init. The connection to answer on is the first descriptor.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InitRequest {
    Exec { argv: Vec<String>, cwd: String, env: BTreeMap<String, String>, timeout_ms: Option<u64>, has_stdin: bool },
    File { op: FileCall, has_data: bool },
    Connect { port: u16 },
}

/// A file operation as the local runtime carries it: the runtime's operations plus the two
/// that move contents through the attached data pipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FileCall {
    /// Streams a regular file's bytes into the data pipe.
    Read { path: String },
    /// Replaces a regular file with the bytes of the data pipe, creating parents. `room`: what
    /// the sandbox's memory holds and has left, which a file kept in memory may not outgrow
    /// (filled in by the supervisor, which can read the cgroup).
    Write {
        path: String,
        mode: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        room: Option<MemoryRoom>,
    },
    #[serde(untagged)]
    Meta(FileOp),
}

/// A sandbox's memory limit and what of it is free for a file kept in memory, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryRoom {
    pub limit: u64,
    pub free: u64,
}

/// Client → init, on an exec's connection while it runs.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Control {
    Signal { signal: i32 },
}

/// Supervisor or init → client.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    Ok,
    Info {
        info: Box<SandboxInfo>,
    },
    Stats {
        metrics: SandboxMetrics,
    },
    Started {
        pid: u32,
    },
    Exited {
        outcome: ExecOutcome,
    },
    File {
        reply: FileReply,
    },
    /// Part of a directory listing; the final `File` reply carries the rest.
    Entries {
        entries: Vec<paddock_core::runtime::FileStat>,
    },
    /// The connected socket is attached.
    Connected,
    /// The network namespace and the init's pidfd are attached.
    Network,
    Error {
        error: WireError,
    },
}

/// A [`RuntimeError`] on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireError {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_kind: Option<FileErrorKind>,
}

impl From<&RuntimeError> for WireError {
    fn from(e: &RuntimeError) -> Self {
        let file_kind = match e {
            RuntimeError::File { kind, .. } => Some(*kind),
            _ => None,
        };
        Self { code: e.code().to_owned(), message: e.to_string(), file_kind }
    }
}

impl From<WireError> for RuntimeError {
    fn from(w: WireError) -> Self {
        if let Some(kind) = w.file_kind {
            return RuntimeError::File { kind, message: w.message };
        }
        match w.code.as_str() {
            "INVALID_ARGUMENT" => RuntimeError::InvalidArgument(w.message),
            "NOT_FOUND" => RuntimeError::NotFound(w.message),
            "CONFLICT" => RuntimeError::Conflict(w.message),
            "UNAVAILABLE" => RuntimeError::Unavailable(w.message),
            "NOT_SUPPORTED" => RuntimeError::Unsupported(w.message),
            "RESOURCE_EXHAUSTED" => RuntimeError::Exhausted(w.message),
            "TIMEOUT" => RuntimeError::Timeout(w.message),
            "UPSTREAM_ERROR" => RuntimeError::Upstream(w.message),
            _ => RuntimeError::System(w.message),
        }
    }
}

/// What a sandbox's record file holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub info: SandboxInfo,
    pub supervisor_pid: u32,
    /// The sandbox init's pid on the host.
    pub init_pid: u32,
    /// The host identity the sandbox runs as (absent in records of earlier versions).
    #[serde(default)]
    pub host_ids: Option<crate::identity::HostIds>,
}

/// The supervisor's first line on stdout: ready, or why not.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Ready {
    Ready { record: Box<Record> },
    Failed { error: WireError },
}

pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    serde_json::to_vec(msg).expect("protocol messages always serialize")
}

pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, RuntimeError> {
    serde_json::from_slice(bytes)
        .map_err(|e| RuntimeError::System(format!("malformed message from the sandbox supervisor: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_calls_round_trip_with_the_runtime_ops_inside() {
        for call in [
            FileCall::Read { path: "/a".into() },
            FileCall::Write { path: "b".into(), mode: Some(0o600), room: None },
            FileCall::Meta(FileOp::Stat { path: "/c".into() }),
            FileCall::Meta(FileOp::Remove { path: "/d".into(), recursive: true }),
        ] {
            let back: FileCall = decode(&encode(&call)).unwrap();
            assert_eq!(back, call);
        }
    }

    #[test]
    fn typed_errors_survive_the_wire() {
        for e in [
            RuntimeError::Exhausted("disk".into()),
            RuntimeError::Unsupported("x".into()),
            RuntimeError::Timeout("t".into()),
        ] {
            assert_eq!(RuntimeError::from(WireError::from(&e)), e);
        }
    }
}
