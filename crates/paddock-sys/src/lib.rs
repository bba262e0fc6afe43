//! The system layer of Paddock: every raw syscall the local runtime needs, behind small safe
//! functions. This is the only crate allowed to contain `unsafe`; each block says why it is sound.
//!
//! Everything here is synchronous and meant to run in the single-threaded sandbox supervisor or
//! in its cloned children, never inside a multi-threaded async process.

#[cfg(feature = "async")]
pub mod asyncfd;
pub mod cgroup;
pub mod fdpass;
pub mod fence;
pub mod ids;
pub mod mounts;
pub mod oom_score;
pub mod overlay;
pub mod process;

use std::path::PathBuf;

/// A failed system operation, naming what was attempted and on what.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    #[error("{op} {path}: {source}")]
    Path {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: {source}")]
    Call {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

impl SysError {
    pub fn path(op: &'static str, path: impl Into<PathBuf>, source: impl Into<std::io::Error>) -> Self {
        SysError::Path { op, path: path.into(), source: source.into() }
    }
    pub fn call(op: &'static str, source: impl Into<std::io::Error>) -> Self {
        SysError::Call { op, source: source.into() }
    }
    /// The OS error number behind this error, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            SysError::Path { source, .. } | SysError::Call { source, .. } => source.raw_os_error(),
            SysError::Other(_) => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, SysError>;
