//! What a sandbox's `/` is made of on this machine. The local runtime pulls no images: it runs
//! the host's own root read-only, or a root filesystem already unpacked in a directory.

use std::path::PathBuf;

use paddock_core::runtime::RuntimeError;

/// The image name that means the host's own root filesystem.
pub const HOST: &str = "host";

/// Image references the local runtime accepts, in words.
pub const ACCEPTED: &str =
    "\"host\" (the host's root filesystem, read-only) or the absolute path of an unpacked root filesystem";

/// A resolved image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootSource {
    Host,
    Dir(PathBuf),
}

/// Resolves a spec's image name; `None` is the host. Whether a directory exists is checked by
/// the supervisor, which is the one that opens it.
pub fn resolve(image: Option<&str>) -> Result<RootSource, RuntimeError> {
    match image {
        None | Some(HOST) => Ok(RootSource::Host),
        Some(path) if path.starts_with('/') => Ok(RootSource::Dir(PathBuf::from(path))),
        Some(other) => Err(RuntimeError::Unsupported(format!(
            "image {other:?} cannot be run: the local runtime pulls no images; use {ACCEPTED}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_and_references_resolve_or_say_what_is_accepted() {
        assert_eq!(resolve(None).unwrap(), RootSource::Host);
        assert_eq!(resolve(Some("host")).unwrap(), RootSource::Host);
        assert_eq!(resolve(Some("/srv/root")).unwrap(), RootSource::Dir("/srv/root".into()));
        let e = resolve(Some("python:3.11")).unwrap_err();
        assert_eq!(e.code(), "NOT_SUPPORTED");
        assert!(e.to_string().contains("\"python:3.11\"") && e.to_string().contains("unpacked"), "{e}");
    }
}
