//! What a destroyed sandbox leaves on the host, and removing it after the destroy's answer.
//!
//! A destroy answers once the sandbox is gone for every caller: its socket removed, its init
//! killed and its directory moved from `sandboxes/` to `gone/` in one rename, so that no
//! lookup, listing or second destroy finds it. Reaping the init, removing the cgroups and the
//! directory, and freeing the identity follow the answer. Only a sandbox that hands nothing on
//! to a later one (no persistent workspace, no volume) is destroyed this way; the rest are
//! removed before the answer.
//!
//! The supervisor locks the directory before moving it and holds the lock until it has freed
//! the identity. A supervisor that dies half-way leaves its directory unlocked in `gone/`,
//! which [`sweep`] removes.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use paddock_core::runtime::SandboxId;
use paddock_sys::cgroup::CgroupLayout;
use rustix::fs::{FlockOperation, Mode, OFlags};

use crate::layout::DataDir;
use crate::protocol::{self, Record};
use crate::supervisor::CGROUP_PARENT;

/// A sandbox directory moved to `gone/`, locked while its remains are removed.
pub struct Retired {
    pub dir: PathBuf,
    _lock: File,
}

/// Locks the sandbox's directory and moves it to `gone/`; `None` when it cannot (another
/// filesystem, an I/O error), and the caller removes everything before answering instead.
pub fn retire(dd: &DataDir, id: &SandboxId) -> Option<Retired> {
    let dir = dd.sandbox(id);
    let lock = File::open(&dir).ok()?;
    rustix::fs::flock(&lock, FlockOperation::LockExclusive).ok()?;
    let gone = dd.gone_dir();
    if let Err(e) = fs::create_dir(&gone)
        && e.kind() != std::io::ErrorKind::AlreadyExists
    {
        return None;
    }
    let to = dd.gone(id);
    fs::rename(&dir, &to).ok()?;
    Some(Retired { dir: to, _lock: lock })
}

/// Removes what destroys whose supervisor died half-way left in `gone/`: their cgroups (and
/// any process still in them), their directories and identities. Directories still locked
/// belong to a supervisor at work and are left alone.
pub fn sweep(dd: &DataDir) {
    let Ok(entries) = fs::read_dir(dd.gone_dir()) else { return };
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().and_then(|n| SandboxId::parse(n).ok()) else { continue };
        let Ok(dir) = File::open(entry.path()) else { continue };
        if rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        // Read through the locked directory: one its supervisor finished with is deleted and
        // has no record, so an identity it freed (which another sandbox may hold by now) is
        // never freed twice.
        let record = read_record_in(&dir);
        let _ = remove(dd, &id, &entry.path(), record.as_ref());
    }
}

/// The file in which a supervisor names itself (its pid) before anything else, so that a
/// sandbox directory it is still making is never taken for a half-made one.
pub const STARTING: &str = "starting";

/// How old a directory with no record must be before it can be half-made: covers the moment
/// between a launcher's fork and the supervisor's [`STARTING`] file.
const HALF_MADE_AFTER: Duration = Duration::from_secs(5);

/// Moves to `gone/` the directories of creates that will never finish: no record, its creator
/// gone (the server or CLI that made the directory holds a shared lock on it until the
/// supervisor answers), and its supervisor gone or never started. A `kill -9` of a server in
/// the middle of a create leaves these; [`sweep`] then removes their cgroups and processes.
/// Returns whether it moved any.
pub fn retire_half_made(dd: &DataDir, ids: &[SandboxId]) -> bool {
    let mut moved = false;
    for id in ids {
        let path = dd.sandbox(id);
        let Ok(dir) = File::open(&path) else { continue };
        let young = dir
            .metadata()
            .and_then(|m| m.modified())
            .map_or(true, |t| t.elapsed().unwrap_or_default() < HALF_MADE_AFTER);
        if young || rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        let exists = |name: &str| rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok();
        if exists("record.json") || supervisor_alive(&dir) {
            continue;
        }
        if fs::create_dir(dd.gone_dir()).is_err() && !dd.gone_dir().is_dir() {
            continue;
        }
        if fs::rename(&path, dd.gone(id)).is_ok() {
            crate::image::release(dd, id);
            moved = true;
        }
    }
    moved
}

/// Whether the supervisor named in the directory's [`STARTING`] file still runs.
fn supervisor_alive(dir: &File) -> bool {
    let Ok(fd) = rustix::fs::openat(dir, STARTING, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) else {
        return false;
    };
    let mut text = String::new();
    if File::from(fd).read_to_string(&mut text).is_err() {
        // Being written this moment: alive.
        return true;
    }
    // A pid that was reused since counts as alive: the directory waits, nothing is lost.
    text.trim()
        .parse::<i32>()
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok())
}

fn read_record_in(dir: &File) -> Option<Record> {
    let fd = rustix::fs::openat(dir, "record.json", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut bytes = Vec::new();
    File::from(fd).read_to_end(&mut bytes).ok()?;
    protocol::decode(&bytes).ok()
}

/// Kills whatever is left in the sandbox's cgroups and removes them, then its directory, then
/// (once its files are gone) its scratch identity.
pub fn remove(dd: &DataDir, id: &SandboxId, dir: &Path, record: Option<&Record>) -> Result<(), String> {
    if let Ok(layout) = CgroupLayout::detect() {
        let cg = layout.existing(CGROUP_PARENT, id.as_str());
        cg.kill_all(Duration::from_secs(10)).map_err(|e| format!("killing what is left of {id}: {e}"))?;
        cg.remove(Duration::from_secs(5)).map_err(|e| format!("removing the cgroup of {id}: {e}"))?;
    }
    fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    if let Some(record) = record {
        crate::supervisor::release_scratch_identity(dd, record);
    }
    Ok(())
}
