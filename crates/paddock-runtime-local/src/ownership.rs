//! Giving a sandbox's files to other owners, and back (`FileOp::Chown`).
//!
//! No process in a sandbox can change a file's owner: it holds no capability. The supervisor,
//! host root, does it for the file API, and only between the sandbox's own host identity and
//! the owners every sandbox shares ([`identity::OTHERS`]: nobody, and each other inside id
//! but root's), which no process runs as. It reaches the file through the sandbox's own root
//! (`/proc/<init>/root`, resolved in that root, never through a symlink out of it) and changes
//! a file only when it lies on the sandbox's own `/workspace` or `/tmp` mount (the shared
//! owners are the same host ids in every sandbox: on a shared volume another sandbox could
//! take the file back) and already belongs to the sandbox or to a shared owner, so it can
//! never take over a file of the host, of an image or of a volume.

use std::os::fd::OwnedFd;

use paddock_core::runtime::{FileErrorKind, FileOwner, FileReply, RuntimeError};
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use crate::identity;

fn file_err(kind: FileErrorKind, message: String) -> RuntimeError {
    RuntimeError::File { kind, message }
}

/// A sandbox's own uid and gid, on the host and inside.
#[derive(Debug, Clone, Copy)]
pub struct Ids {
    pub host: (u32, u32),
    pub inside: (u32, u32),
}

/// The host id an owner stands for in a sandbox whose own ids are `host` (on the host) and
/// `inside`.
fn host_id(owner: FileOwner, host: u32, inside: u32, shown: &str) -> Result<u32, RuntimeError> {
    Ok(match owner {
        FileOwner::SandboxUser => host,
        FileOwner::Nobody => identity::NOBODY,
        FileOwner::Id(id) if id == inside => host,
        FileOwner::Id(id) => {
            if let Some(why) = FileOwner::refusal(id) {
                return Err(RuntimeError::InvalidArgument(format!("chown {shown}: {why}")));
            }
            identity::shared_owner(id)
        }
    })
}

/// Changes the owner and group of `path` (inside the sandbox whose init is `init_pid` and
/// whose own ids are `ids`) as asked.
pub fn chown(
    init_pid: u32,
    ids: Ids,
    path: &str,
    user: Option<FileOwner>,
    group: Option<FileOwner>,
) -> Result<FileReply, RuntimeError> {
    let inside = crate::fileops::resolve(path)?;
    let shown = inside.display().to_string();
    let root: OwnedFd = rustix::fs::open(
        format!("/proc/{init_pid}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RuntimeError::from_io("opening the sandbox's root", &e.into()))?;
    let rel = inside.strip_prefix("/").unwrap_or(&inside);
    let rel = if rel.as_os_str().is_empty() { std::path::Path::new(".") } else { rel };
    let fd = rustix::fs::openat2(
        &root,
        rel,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => file_err(FileErrorKind::NotFound, format!("chown {shown}: no such file")),
        rustix::io::Errno::NOTDIR => file_err(FileErrorKind::NotADirectory, format!("chown {shown}: not a directory")),
        e => file_err(FileErrorKind::Other, format!("chown {shown}: {e}")),
    })?;
    // Only the sandbox's own storage: its workspace and /tmp. A volume (or anything else
    // shared) is another place where a file given to a shared owner (one id for every sandbox) would
    // be open to every other sandbox that mounts it.
    let mount_of = |fd: &OwnedFd| {
        rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, rustix::fs::StatxFlags::MNT_ID).map(|s| s.stx_mnt_id)
    };
    let file_mount = mount_of(&fd).map_err(|e| file_err(FileErrorKind::Other, format!("chown {shown}: {e}")))?;
    let own = ["workspace", "tmp"].iter().any(|dir| {
        rustix::fs::openat2(
            &root,
            *dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS,
        )
        .ok()
        .and_then(|d| mount_of(&d).ok())
            == Some(file_mount)
    });
    if !own {
        return Err(file_err(
            FileErrorKind::PermissionDenied,
            format!("chown {shown}: only files in /workspace and /tmp can change owner"),
        ));
    }
    let st = rustix::fs::fstat(&fd).map_err(|e| file_err(FileErrorKind::Other, format!("chown {shown}: {e}")))?;
    let own = |id: u32, mine: u32| id == mine || identity::is_shared_owner(id);
    if !own(st.st_uid, ids.host.0) || !own(st.st_gid, ids.host.1) {
        return Err(file_err(
            FileErrorKind::PermissionDenied,
            format!(
                "chown {shown}: only files of the sandbox user (or already given away through the file API) can change owner"
            ),
        ));
    }
    let uid = user.map(|o| host_id(o, ids.host.0, ids.inside.0, &shown)).transpose()?.map(rustix::fs::Uid::from_raw);
    let gid = group.map(|o| host_id(o, ids.host.1, ids.inside.1, &shown)).transpose()?.map(rustix::fs::Gid::from_raw);
    rustix::fs::chownat(&fd, "", uid, gid, AtFlags::EMPTY_PATH).map_err(|e| match e {
        rustix::io::Errno::ROFS => {
            file_err(FileErrorKind::PermissionDenied, format!("chown {shown}: read-only file system"))
        }
        rustix::io::Errno::OVERFLOW | rustix::io::Errno::INVAL => file_err(
            FileErrorKind::PermissionDenied,
            format!("chown {shown}: this filesystem (a volume) keeps its own owner: its files cannot be given away"),
        ),
        e => file_err(FileErrorKind::Other, format!("chown {shown}: {e}")),
    })?;
    Ok(FileReply::Done)
}
