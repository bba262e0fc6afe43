//! Host identities: every sandbox runs as a host uid/gid of its own.
//!
//! Per-user kernel limits (inotify instances, descriptors in flight over Unix sockets, queued
//! real-time signals, user namespaces) are counted per host uid. With one identity shared by
//! all sandboxes, one sandbox that exhausts such a limit breaks the same operations in every
//! other one. So each sandbox gets a slot in a range reserved for Paddock, and only its own
//! uid and gid are mapped into its user namespace.
//!
//! A persistent workspace owns its identity for as long as it exists, so the files it keeps
//! stay its own across sandboxes (only one sandbox uses a workspace at a time). A sandbox
//! without one takes a fresh identity and gives it back when it is destroyed, once its
//! processes and files are gone. Slots are files under `<data>/ids/`, claimed with
//! `O_EXCL`, so two processes never hand out one slot and a restart forgets none.

use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;

use paddock_core::runtime::RuntimeError;
use paddock_core::spec::User;
use serde::{Deserialize, Serialize};

use crate::layout::DataDir;

/// The first host uid (and gid) of Paddock's range. Above the ids of earlier versions
/// (`HOST_ID_OFFSET` + the sandbox's own uid), below the top of the 32-bit id space.
pub const BASE: u32 = 1_001_000_000;
/// How many identities the range holds.
pub const SLOTS: u32 = 1_000_000;

/// The host uid and gid a sandbox runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIds {
    pub uid: u32,
    pub gid: u32,
    /// The slot in Paddock's range; `None` for a workspace made before identities were per
    /// sandbox, which keeps the shared identity its files belong to.
    pub slot: Option<u32>,
}

impl HostIds {
    fn of_slot(slot: u32) -> Self {
        Self { uid: BASE + slot, gid: BASE + slot, slot: Some(slot) }
    }

    /// The identity every sandbox shared before: `HOST_ID_OFFSET` + its own uid.
    pub fn shared(user: &User) -> Self {
        Self { uid: user.host_uid(), gid: user.host_gid(), slot: None }
    }
}

fn sys(context: impl std::fmt::Display) -> impl Fn(std::io::Error) -> RuntimeError {
    move |e| RuntimeError::from_io(&context, &e)
}

/// Claims a free identity for `owner` (a sandbox id, or `workspace <name>`).
pub fn allocate(dd: &DataDir, owner: &str) -> Result<HostIds, RuntimeError> {
    let dir = dd.ids();
    fs::create_dir_all(&dir).map_err(sys(format!("creating {}", dir.display())))?;
    // Random slots: a claim is one O_EXCL create, with no lock and no scan of what is taken.
    for _ in 0..64 {
        let mut b = [0u8; 4];
        rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| RuntimeError::System(format!("getrandom: {e}")))?;
        let slot = u32::from_le_bytes(b) % SLOTS;
        let path = dir.join(slot.to_string());
        match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
            Ok(mut f) => {
                f.write_all(owner.as_bytes()).map_err(sys(format!("writing {}", path.display())))?;
                return Ok(HostIds::of_slot(slot));
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(sys(format!("claiming {}", path.display()))(e)),
        }
    }
    Err(RuntimeError::Exhausted(format!(
        "no free host identity found in {}: remove sandboxes or workspaces that are no longer needed",
        dir.display()
    )))
}

/// Gives an identity back. Only for one whose processes and files are gone.
pub fn release(dd: &DataDir, ids: &HostIds) {
    if let Some(slot) = ids.slot {
        let _ = fs::remove_file(dd.ids().join(slot.to_string()));
    }
}

/// The identity of workspace `name`, claiming one when `create` and it has none yet. A
/// workspace that has files but no identity was made by an earlier version: it keeps the
/// shared identity its files belong to.
pub fn of_workspace(dd: &DataDir, name: &str, user: &User, create: bool) -> Result<HostIds, RuntimeError> {
    let path = dd.workspace_identity(name);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| RuntimeError::System(format!("{} is damaged ({e}): restore or remove it", path.display()))),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if !create {
                return Ok(HostIds::shared(user));
            }
            let ids = allocate(dd, &format!("workspace {name}"))?;
            let written = fs::write(&path, serde_json::to_vec(&ids).expect("ids serialize"));
            if let Err(e) = written {
                release(dd, &ids);
                return Err(sys(format!("writing {}", path.display()))(e));
            }
            Ok(ids)
        }
        Err(e) => Err(sys(format!("reading {}", path.display()))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_distinct_recorded_and_given_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dd = DataDir::new(tmp.path());
        let ids: Vec<_> = (0..50).map(|i| allocate(&dd, &format!("sbx-{i}")).unwrap()).collect();
        let mut uids: Vec<_> = ids.iter().map(|i| i.uid).collect();
        uids.sort();
        uids.dedup();
        assert_eq!(uids.len(), 50, "two sandboxes got one identity");
        for i in &ids {
            assert!((BASE..BASE + SLOTS).contains(&i.uid) && i.uid == i.gid, "{i:?}");
        }
        let claimed = fs::read_dir(dd.ids()).unwrap().count();
        assert_eq!(claimed, 50, "every identity is recorded on disk");
        for i in &ids {
            release(&dd, i);
        }
        assert_eq!(fs::read_dir(dd.ids()).unwrap().count(), 0);
    }

    #[test]
    fn a_workspace_keeps_its_identity_and_old_ones_keep_the_shared_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dd = DataDir::new(tmp.path());
        fs::create_dir_all(dd.workspace("w")).unwrap();
        let user = User::default();
        assert_eq!(of_workspace(&dd, "w", &user, false).unwrap(), HostIds::shared(&user));
        let first = of_workspace(&dd, "w", &user, true).unwrap();
        assert!(first.slot.is_some());
        assert_eq!(of_workspace(&dd, "w", &user, false).unwrap(), first);
        assert_eq!(of_workspace(&dd, "w", &user, true).unwrap(), first);
    }
}
