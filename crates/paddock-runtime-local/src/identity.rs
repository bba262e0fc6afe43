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
//! `O_EXCL`, so two processes never hand out one slot and a restart forgets none; each claim
//! is first made host-wide under [`HOST_CLAIMS`], so two Paddock instances on one host (other
//! data directories, a CLI beside a server) never hand one identity to two sandboxes either.

use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use paddock_core::runtime::RuntimeError;
use paddock_core::spec::User;
use serde::{Deserialize, Serialize};

use crate::layout::DataDir;

/// Where every sandbox's ids lived on the host before identities were per sandbox (and where a
/// workspace made then still lives): inside uid `u` is host uid `HOST_ID_OFFSET + u` (gids
/// alike). A dedicated, unnamed range: no real host user owns sandbox files or shares per-user
/// kernel limits with sandboxes.
pub const HOST_ID_OFFSET: u32 = 1_000_000_000;

/// The first host uid (and gid) of Paddock's range. Above the ids of earlier versions
/// (`HOST_ID_OFFSET` + the sandbox's own uid), below the top of the 32-bit id space.
pub const BASE: u32 = 1_001_000_000;
/// How many identities the range holds.
pub const SLOTS: u32 = 1_000_000;
/// The host uid and gid of `nobody` (65534) inside every sandbox: just above the range, never
/// a sandbox's own identity. Files given to nobody through the file API get it; no process
/// runs as it.
pub const NOBODY: u32 = BASE + SLOTS;
/// The first host id of the owners every sandbox shares: inside id `i` (1..=65533, not the
/// sandbox's own) is `OTHERS + i` on the host, and nobody is `OTHERS` itself. Like nobody, they
/// are owners the file API gives files to, never an identity a process has.
pub const OTHERS: u32 = NOBODY;
/// The last host id of that range.
pub const OTHERS_END: u32 = OTHERS + paddock_sys::ids::NOBODY - 1;

/// Whether `host_id` is one of the owners every sandbox shares (nobody included).
pub fn is_shared_owner(host_id: u32) -> bool {
    (OTHERS..=OTHERS_END).contains(&host_id)
}

/// The host id of inside id `id` (1..=65534, not the sandbox's own).
pub fn shared_owner(id: u32) -> u32 {
    paddock_sys::ids::other_host_id(OTHERS, id)
}
/// Host-wide claims of every instance: `<slot>` holding the data directory and owner.
pub const HOST_CLAIMS: &str = "/var/lib/paddock-ids";

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
        Self { uid: HOST_ID_OFFSET.saturating_add(user.uid), gid: HOST_ID_OFFSET.saturating_add(user.gid), slot: None }
    }
}

fn sys(context: impl std::fmt::Display) -> impl Fn(std::io::Error) -> RuntimeError {
    move |e| RuntimeError::from_io(&context, &e)
}

/// Claims a free identity for `owner` (a sandbox id, or `workspace <name>`).
pub fn allocate(dd: &DataDir, owner: &str) -> Result<HostIds, RuntimeError> {
    allocate_in(dd, Path::new(HOST_CLAIMS), owner)
}

/// Makes the host-wide claim of `slot`; `false` when another instance holds it.
fn claim_host_wide(host: &Path, slot: u32, what: &str) -> Result<bool, RuntimeError> {
    let path = host.join(slot.to_string());
    match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
        Ok(mut f) => {
            f.write_all(what.as_bytes()).map_err(sys(format!("writing {}", path.display())))?;
            Ok(true)
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(sys(format!("claiming {}", path.display()))(e)),
    }
}

/// Claims this data directory's slots host-wide, for claims made before claims were
/// host-wide; a slot another instance holds too stays as it is (its sandbox already runs).
pub fn register_host_wide(dd: &DataDir) {
    register_in(dd, Path::new(HOST_CLAIMS));
}

fn register_in(dd: &DataDir, host: &Path) {
    // Once per data directory: later claims are made host-wide as they are taken.
    let done = dd.ids().join(".host-wide");
    if done.exists() {
        return;
    }
    let Ok(entries) = fs::read_dir(dd.ids()) else { return };
    if fs::create_dir_all(host).is_err() {
        return;
    }
    let _ = fs::set_permissions(host, fs::Permissions::from_mode(0o700));
    for entry in entries.flatten() {
        if let Some(slot) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
            let _ = claim_host_wide(host, slot, &format!("{}", dd.root().display()));
        }
    }
    let _ = crate::layout::write_private(&done, b"");
}

fn allocate_in(dd: &DataDir, host: &Path, owner: &str) -> Result<HostIds, RuntimeError> {
    let dir = dd.ids();
    fs::create_dir_all(&dir).map_err(sys(format!("creating {}", dir.display())))?;
    fs::create_dir_all(host).map_err(sys(format!("creating {}", host.display())))?;
    fs::set_permissions(host, fs::Permissions::from_mode(0o700)).map_err(sys(format!("chmod {}", host.display())))?;
    // Random slots: a claim is one O_EXCL create, with no lock and no scan of what is taken.
    for _ in 0..64 {
        let mut b = [0u8; 4];
        rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| RuntimeError::System(format!("getrandom: {e}")))?;
        let slot = u32::from_le_bytes(b) % SLOTS;
        if !claim_host_wide(host, slot, &format!("{} {owner}", dd.root().display()))? {
            continue;
        }
        let path = dir.join(slot.to_string());
        match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
            Ok(mut f) => {
                f.write_all(owner.as_bytes()).map_err(sys(format!("writing {}", path.display())))?;
                return Ok(HostIds::of_slot(slot));
            }
            // Claimed here by an instance from before host-wide claims: keep both claims.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => {
                let _ = fs::remove_file(host.join(slot.to_string()));
                return Err(sys(format!("claiming {}", path.display()))(e));
            }
        }
    }
    Err(RuntimeError::Exhausted(format!(
        "no free host identity found in {}: remove sandboxes or workspaces that are no longer needed",
        dir.display()
    )))
}

/// Gives an identity back. Only for one whose processes and files are gone.
pub fn release(dd: &DataDir, ids: &HostIds) {
    release_in(dd, Path::new(HOST_CLAIMS), ids)
}

fn release_in(dd: &DataDir, host: &Path, ids: &HostIds) {
    if let Some(slot) = ids.slot {
        let _ = fs::remove_file(dd.ids().join(slot.to_string()));
        let _ = fs::remove_file(host.join(slot.to_string()));
    }
}

/// The identity of workspace `name`, claiming one when `create` and it has none yet. A
/// workspace that has files but no identity was made by an earlier version: it keeps the
/// shared identity its files belong to.
pub fn of_workspace(dd: &DataDir, name: &str, user: &User, create: bool) -> Result<HostIds, RuntimeError> {
    of_workspace_in(dd, Path::new(HOST_CLAIMS), name, user, create)
}

fn of_workspace_in(dd: &DataDir, host: &Path, name: &str, user: &User, create: bool) -> Result<HostIds, RuntimeError> {
    let path = dd.workspace_identity(name);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| RuntimeError::System(format!("{} is damaged ({e}): restore or remove it", path.display()))),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if !create {
                return Ok(HostIds::shared(user));
            }
            let ids = allocate_in(dd, host, &format!("workspace {name}"))?;
            let written = crate::layout::write_private(&path, serde_json::to_vec(&ids).expect("ids serialize"));
            if let Err(e) = written {
                release_in(dd, host, &ids);
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
        let dd = DataDir::new(tmp.path().join("data"));
        let host = tmp.path().join("host-claims");
        let ids: Vec<_> = (0..50).map(|i| allocate_in(&dd, &host, &format!("sbx-{i}")).unwrap()).collect();
        let mut uids: Vec<_> = ids.iter().map(|i| i.uid).collect();
        uids.sort();
        uids.dedup();
        assert_eq!(uids.len(), 50, "two sandboxes got one identity");
        for i in &ids {
            assert!((BASE..BASE + SLOTS).contains(&i.uid) && i.uid == i.gid, "{i:?}");
        }
        let claimed = fs::read_dir(dd.ids()).unwrap().count();
        assert_eq!(claimed, 50, "every identity is recorded on disk");
        assert_eq!(fs::read_dir(&host).unwrap().count(), 50, "and host-wide");
        for i in &ids {
            release_in(&dd, &host, i);
        }
        assert_eq!(fs::read_dir(dd.ids()).unwrap().count(), 0);
        assert_eq!(fs::read_dir(&host).unwrap().count(), 0);
    }

    #[test]
    fn two_instances_never_share_an_identity_even_when_one_predates_host_wide_claims() {
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("host-claims");
        let (a, b) = (DataDir::new(tmp.path().join("a")), DataDir::new(tmp.path().join("b")));
        // Instance a claimed slots before claims were host-wide: only in its own directory.
        fs::create_dir_all(a.ids()).unwrap();
        for slot in 0..200u32 {
            fs::write(a.ids().join(slot.to_string()), "old").unwrap();
        }
        register_in(&a, &host);
        assert_eq!(fs::read_dir(&host).unwrap().count(), 200);
        // Instance b can then never pick one of a's slots.
        for slot in 0..200u32 {
            assert!(!claim_host_wide(&host, slot, "b").unwrap(), "slot {slot} handed out twice");
        }
        let ids = allocate_in(&b, &host, "sbx-b").unwrap();
        assert!(ids.slot.unwrap() >= 200);
    }

    #[test]
    fn a_workspace_keeps_its_identity_and_old_ones_keep_the_shared_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dd = DataDir::new(tmp.path().join("data"));
        let host = tmp.path().join("host-claims");
        fs::create_dir_all(dd.workspace("w")).unwrap();
        let user = User::default();
        assert_eq!(of_workspace_in(&dd, &host, "w", &user, false).unwrap(), HostIds::shared(&user));
        let first = of_workspace_in(&dd, &host, "w", &user, true).unwrap();
        assert!(first.slot.is_some());
        assert_eq!(of_workspace_in(&dd, &host, "w", &user, false).unwrap(), first);
        assert_eq!(of_workspace_in(&dd, &host, "w", &user, true).unwrap(), first);
    }
}
