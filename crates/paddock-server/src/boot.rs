//! This start of the server, and whether another start on the same data directory has ended.
//!
//! Every sandbox the API creates carries its server's boot id. A server that dies between the
//! runtime's create and the row in the store leaves a sandbox no row names; the next start
//! must adopt it at once (the API and the runtime are one view), but never a sandbox that a
//! live server is still creating, or it would take a create in flight for an orphan. Each
//! start holds an exclusive lock on `<data>/servers/<boot>` for as long as it lives, which the
//! kernel drops the moment the process dies, however it dies: a lock that can be taken is a
//! server that ended. A heartbeat could not say so at once after a `kill -9`.

use std::fs::{self, File};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;

/// A server's start: its id and the lock that says it is alive.
#[derive(Debug)]
pub struct Boot {
    id: String,
    _lock: File,
}

/// This start could not be marked as alive.
#[derive(Debug, thiserror::Error)]
#[error("marking this server as alive in {path}: {cause}: check that the data directory is writable")]
pub struct BootError {
    path: String,
    cause: std::io::Error,
}

fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("servers")
}

impl Boot {
    /// Takes a new boot id and holds its lock; removes the files of starts that ended a day
    /// ago or more (their sandboxes were adopted by then).
    #[expect(clippy::disallowed_methods, reason = "runs once at startup, before the server serves anything")]
    pub fn start(data_dir: &Path) -> Result<Self, BootError> {
        let dir = dir(data_dir);
        let err = |path: &Path| {
            let path = path.display().to_string();
            move |cause| BootError { path, cause }
        };
        fs::create_dir_all(&dir).map_err(err(&dir))?;
        prune(&dir);
        let mut bytes = [0u8; 8];
        rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).map_err(|e| err(&dir)(e.into()))?;
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let path = dir.join(&id);
        let lock = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(err(&path))?;
        rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive).map_err(|e| err(&path)(e.into()))?;
        Ok(Self { id, _lock: lock })
    }

    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Whether the server that started as `boot` on this data directory has ended. `false` when
/// that cannot be told (no such start here: a server with a data directory of its own).
#[expect(clippy::disallowed_methods, reason = "its callers run it under spawn_blocking")]
pub fn ended(data_dir: &Path, boot: &str) -> bool {
    if boot.is_empty() || !boot.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    let Ok(file) = File::open(dir(data_dir).join(boot)) else { return false };
    rustix::fs::flock(&file, FlockOperation::NonBlockingLockShared).is_ok()
}

/// [`ended`], but a start of this data directory whose file is gone counts as ended too: a
/// live start's file is never removed (see [`prune`]), so a pruned one belonged to a server that
/// ended a day or more ago. For records that name their server's start (runs), never for
/// sandboxes a server of another data directory may be making.
pub fn ended_or_gone(data_dir: &Path, boot: &str) -> bool {
    let valid = !boot.is_empty() && boot.bytes().all(|b| b.is_ascii_hexdigit());
    valid && (!dir(data_dir).join(boot).exists() || ended(data_dir, boot))
}

/// Removes the files of starts that ended over a day ago.
#[expect(clippy::disallowed_methods, reason = "called by `Boot::start`, at startup")]
fn prune(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let day_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
    for entry in entries.flatten() {
        let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < day_ago);
        // Removed under the lock, so a start that is alive is never unlinked.
        let unlocked = || {
            File::open(entry.path())
                .is_ok_and(|f| rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok())
        };
        if old && unlocked() {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_is_alive_while_held_and_ended_once_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let boot = Boot::start(dir.path()).unwrap();
        let id = boot.id().to_owned();
        assert_eq!(id.len(), 16);
        assert!(!ended(dir.path(), &id), "a live start counts as ended");
        let other = Boot::start(dir.path()).unwrap();
        assert_ne!(other.id(), id);
        drop(boot);
        assert!(ended(dir.path(), &id));
        assert!(!ended(dir.path(), other.id()));
        // What this directory never saw, or what is no boot id, cannot be told.
        for unknown in ["0123456789abcdef", "", "../x", "servers"] {
            assert!(!ended(dir.path(), unknown), "{unknown}");
        }
    }
}
