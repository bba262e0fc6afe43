//! User and group identity: id maps for a new user namespace and dropping every privilege.

use std::fs;

use rustix::thread::{CapabilitySet, CapabilitySets};

use crate::{Result, SysError};

/// Maps exactly one uid and one gid into the user namespace of `pid`: `inside` ids to `host`
/// ids. Nothing else is mapped: root inside the namespace does not exist, so no file of the
/// host can appear as owned by root inside and a setuid-root binary has no root to become.
///
/// Must be called by a process that is privileged over the parent namespace (the supervisor).
pub fn write_id_maps(pid: u32, inside: (u32, u32), host: (u32, u32)) -> Result<()> {
    write_maps(pid, &[(inside.0, host.0)], &[(inside.1, host.1)])
}

/// Like [`write_id_maps`], and also maps `nobody` inside (uid and gid 65534) to the host ids
/// `nobody_host`, so files can be given to nobody (a host identity no process of the sandbox
/// runs as, and that none can become: it holds no capability to change its ids). Skipped for
/// a sandbox user that is 65534 itself.
pub fn write_id_maps_with_nobody(
    pid: u32,
    inside: (u32, u32),
    host: (u32, u32),
    nobody_host: (u32, u32),
) -> Result<()> {
    const NOBODY: u32 = 65534;
    if inside.0 == NOBODY || inside.1 == NOBODY {
        return write_id_maps(pid, inside, host);
    }
    write_maps(pid, &[(inside.0, host.0), (NOBODY, nobody_host.0)], &[(inside.1, host.1), (NOBODY, nobody_host.1)])
}

fn write_maps(pid: u32, uids: &[(u32, u32)], gids: &[(u32, u32)]) -> Result<()> {
    let lines = |m: &[(u32, u32)]| m.iter().map(|(i, h)| format!("{i} {h} 1\n")).collect::<String>();
    let base = format!("/proc/{pid}");
    let uid_map = format!("{base}/uid_map");
    fs::write(&uid_map, lines(uids)).map_err(|e| SysError::path("write", uid_map, e))?;
    let gid_map = format!("{base}/gid_map");
    fs::write(&gid_map, lines(gids)).map_err(|e| SysError::path("write", gid_map, e))
}

/// Becomes `uid:gid` with no supplementary groups and no capabilities in any set, with an empty
/// bounding set, so nothing executed later (not even a setuid or file-capability binary) can
/// gain a privilege.
pub fn drop_to(uid: u32, gid: u32) -> Result<()> {
    use rustix::thread as t;
    t::set_thread_groups(&[]).map_err(|e| SysError::call("clear supplementary groups", e))?;
    let g = rustix::process::Gid::from_raw(gid);
    t::set_thread_res_gid(g, g, g).map_err(|e| SysError::call("setresgid", e))?;
    // Dropping from the bounding set needs CAP_SETPCAP, so it happens before the uid change.
    for cap in 0..=last_cap() {
        match t::remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(1u64 << cap)) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::INVAL => break,
            Err(e) => return Err(SysError::call("drop bounding capability", e)),
        }
    }
    t::clear_ambient_capability_set().map_err(|e| SysError::call("clear ambient capabilities", e))?;
    let u = rustix::process::Uid::from_raw(uid);
    t::set_thread_res_uid(u, u, u).map_err(|e| SysError::call("setresuid", e))?;
    // The kernel clears capabilities on a uid change only when leaving the namespace's root uid;
    // we were never it (root is unmapped), so clear them explicitly.
    let empty = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    t::set_capabilities(None, empty).map_err(|e| SysError::call("clear capabilities", e))?;
    Ok(())
}

fn last_cap() -> u32 {
    fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(63)
}
