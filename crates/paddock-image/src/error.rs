//! The one error type of the crate: each variant is a class a caller can act on (retry, fix
//! the reference, give credentials, free disk, release the image), and each message says what
//! went wrong and what to do.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image not found: {0}")]
    NotFound(String),
    #[error("invalid image reference {0}")]
    InvalidReference(String),
    #[error("the registry refused access: {0}")]
    Unauthorized(String),
    #[error("registry error: {0}")]
    Registry(String),
    #[error("corrupt image content: {0}")]
    Corrupt(String),
    #[error(
        "no space left on the device holding the image store: {0}; free disk space (`paddock image prune` removes unused images) and pull again"
    )]
    NoSpace(String),
    #[error("the image is larger than this host allows: {0}; nothing of the layer was kept")]
    TooLarge(String),
    #[error("image in use: {0}")]
    InUse(String),
    #[error("unsupported image: {0}")]
    Unsupported(String),
    #[error("unusable image config: {0}")]
    Config(String),
    #[error("image store I/O error: {0}")]
    Io(String),
}

impl ImageError {
    /// An I/O error with what was being done; a full disk (or quota) becomes `NoSpace` so the
    /// caller can tell the user to free space rather than suspect the store.
    pub(crate) fn io(what: impl std::fmt::Display, e: io::Error) -> ImageError {
        match e.raw_os_error() {
            Some(code)
                if code == rustix::io::Errno::NOSPC.raw_os_error()
                    || code == rustix::io::Errno::DQUOT.raw_os_error() =>
            {
                ImageError::NoSpace(format!("{what}: {e}"))
            }
            _ => ImageError::Io(format!("{what}: {e}")),
        }
    }

    pub(crate) fn errno(what: impl std::fmt::Display, e: rustix::io::Errno) -> ImageError {
        ImageError::io(what, io::Error::from(e))
    }
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;
