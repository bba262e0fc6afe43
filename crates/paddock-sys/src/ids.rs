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

/// Like [`write_id_maps`], and also maps every other id from 1 to 65534 inside to Paddock's
/// shared owner range on the host: `nobody` (65534) to `others` itself, any other id `i` to
/// `others + i`. Those ids exist so the file API can give files to other owners (`nobody`,
/// `www-data`, any id an image's files name); no process of the sandbox runs as one, and none
/// can become one: it holds no capability to change its ids. Root (0) stays unmapped.
///
/// Must be called by a process that is privileged over the parent namespace (the supervisor).
pub fn write_id_maps_with_others(pid: u32, inside: (u32, u32), host: (u32, u32), others: (u32, u32)) -> Result<()> {
    write_ranges(pid, &id_map_with_others(inside.0, host.0, others.0), &id_map_with_others(inside.1, host.1, others.1))
}

/// `nobody` inside a sandbox, the biggest id mapped there besides the sandbox's own.
pub const NOBODY: u32 = 65534;

/// The host id inside id `id` (1..=[`NOBODY`], not the sandbox's own) maps to, given the
/// others range starting at `others`.
pub fn other_host_id(others: u32, id: u32) -> u32 {
    debug_assert!((1..=NOBODY).contains(&id), "id {id} is no other owner's");
    others + id % NOBODY
}

/// `(inside, host, count)` lines: `own` to `host`, and every other id in 1..=65534 to
/// [`other_host_id`]. At most four lines, far under the kernel's 340.
pub fn id_map_with_others(own: u32, host: u32, others: u32) -> Vec<(u32, u32, u32)> {
    let mut lines = vec![(own, host, 1)];
    let mut range = |from: u32, to: u32| {
        if from <= to {
            lines.push((from, other_host_id(others, from), to - from + 1));
        }
    };
    if (1..NOBODY).contains(&own) {
        range(1, own - 1);
        range(own + 1, NOBODY - 1);
    } else {
        range(1, NOBODY - 1);
    }
    if own != NOBODY {
        range(NOBODY, NOBODY);
    }
    lines
}

fn write_maps(pid: u32, uids: &[(u32, u32)], gids: &[(u32, u32)]) -> Result<()> {
    let ones = |m: &[(u32, u32)]| m.iter().map(|&(i, h)| (i, h, 1)).collect::<Vec<_>>();
    write_ranges(pid, &ones(uids), &ones(gids))
}

/// Writes `(inside, host, count)` lines as the uid and gid maps of the user namespace of `pid`.
pub(crate) fn write_ranges(pid: u32, uids: &[(u32, u32, u32)], gids: &[(u32, u32, u32)]) -> Result<()> {
    let lines = |m: &[(u32, u32, u32)]| m.iter().map(|(i, h, n)| format!("{i} {h} {n}\n")).collect::<String>();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every inside id in 1..=65534 is mapped exactly once, the own id to `host` and the rest
    /// into the others range; 0 (root) never is.
    fn check(own: u32) {
        let (host, others) = (1_001_000_007, 1_002_000_000);
        let lines = id_map_with_others(own, host, others);
        assert!(lines.len() <= 4, "{lines:?}");
        let lookup = |id: u32| {
            let hits: Vec<u32> =
                lines.iter().filter(|(i, _, n)| (*i..*i + *n).contains(&id)).map(|(i, h, _)| h + (id - i)).collect();
            assert!(hits.len() <= 1, "{id} mapped twice: {lines:?}");
            hits.first().copied()
        };
        assert_eq!(lookup(0), None, "root is never mapped: {lines:?}");
        assert_eq!(lookup(own), Some(host));
        for id in [1, 2, 33, 999, 1001, 65533] {
            if id != own {
                assert_eq!(lookup(id), Some(others + id), "{id}: {lines:?}");
            }
        }
        if own != NOBODY {
            assert_eq!(lookup(NOBODY), Some(others), "nobody keeps the range's first id: {lines:?}");
        }
        let mapped: u32 = lines.iter().map(|l| l.2).sum();
        let own_outside = !(1..=NOBODY).contains(&own);
        assert_eq!(mapped, NOBODY + u32::from(own_outside), "{lines:?}");
    }

    #[test]
    fn the_own_id_and_every_other_id_but_root_are_mapped_once() {
        for own in [1, 2, 1000, 65533, NOBODY, 70_000] {
            check(own);
        }
    }
}
