//! A writable root made of read-only image layers.
//!
//! The layers of an image are unpacked once on the host and shared by every sandbox that runs
//! the image; they must never change. Each sandbox gets an overlay of them with an upper layer
//! of its own on a size-capped tmpfs (its pages are charged to the memory cgroup of the sandbox
//! that writes them, and it is gone with the sandbox's mount namespace).
//!
//! Ownership: the layers keep the ids their image gave them (mostly root). Each layer is shown
//! to the overlay through an idmapped mount that maps the owner of the image's files (root, or
//! the image's `User`) to the sandbox's host identity, so inside the sandbox the sandbox user
//! owns what the image's user owned and can change it (copy-up into its own upper layer); every
//! other on-disk id from 1 to 65534 maps to the host id the sandbox shows as that same id (the
//! owners every sandbox shares, see `ids::id_map_with_others`), so `mail`'s files stay
//! `mail`'s; root, when it is not the owner, stays unmapped and reads as `nobody`. The layers
//! themselves are mounted read-only, so nothing that reaches them through these mounts, a
//! stray recursive removal included, can change the shared files.
//!
//! Everything here runs in the supervisor (host root, single-threaded) inside its own private
//! mount namespace, which the sandbox's init copies when it is cloned.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, MoveMountFlags, OpenTreeFlags};

use crate::process::{Forked, exit_now, fork};
use crate::{Result, SysError};

/// The parts of a layered root, all below one directory of the sandbox.
#[derive(Debug, Clone)]
pub struct LayeredRoot {
    /// Unpacked layer directories, lowest first.
    pub layers: Vec<PathBuf>,
    /// The on-disk uid and gid shown as the sandbox user.
    pub owner: (u32, u32),
    /// The sandbox's host identity.
    pub host: (u32, u32),
    /// The first host uid and gid of the owners every sandbox shares (other on-disk ids).
    pub others: (u32, u32),
    /// Size cap of everything the sandbox writes to its root, bytes.
    pub upper_bytes: u64,
    /// Inode cap of the same.
    pub upper_inodes: u64,
}

impl LayeredRoot {
    /// Mounts the layers, the upper tmpfs and the overlay below `dir` and returns the merged
    /// root (`dir/root`), the layers' ids mapped through the namespace `userns` is making
    /// (started early by the caller, see [`PendingUserns`]). The caller must be host root in a
    /// private mount namespace.
    pub fn mount(&self, dir: &Path, userns: PendingUserns) -> Result<PathBuf> {
        mkdir(dir)?;
        let layers_dir = dir.join("layers");
        mkdir(&layers_dir)?;
        let userns = userns.finish(
            &crate::ids::id_map_with_others(self.owner.0, self.host.0, self.others.0),
            &crate::ids::id_map_with_others(self.owner.1, self.host.1, self.others.1),
        )?;
        let mut names = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let at = layers_dir.join(i.to_string());
            mkdir(&at)?;
            attach_idmapped(layer, &at, &userns)?;
            names.push(i.to_string());
        }
        if names.is_empty() {
            // An image with no layers is an empty root; overlayfs needs one lower layer.
            mkdir(&layers_dir.join("empty"))?;
            names.push("empty".into());
        }
        let upper = dir.join("upper");
        mkdir(&upper)?;
        let options = format!("size={},nr_inodes={},mode=0755", self.upper_bytes, self.upper_inodes);
        mount_fs("tmpfs", &upper, "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, &options)?;
        mkdir(&upper.join("u"))?;
        mkdir(&upper.join("w"))?;
        let root = dir.join("root");
        mkdir(&root)?;
        // The highest layer comes first in `lowerdir`. Relative names keep the option string
        // short whatever the data directory's path: a legacy mount's options fit in one page,
        // and images have up to 127 layers.
        names.reverse();
        let options = format!("lowerdir={},upperdir=../upper/u,workdir=../upper/w", names.join(":"));
        with_cwd(&layers_dir, || {
            mount_fs("overlay", &root, "overlay", MountFlags::NOSUID | MountFlags::NODEV, &options)
        })?;
        Ok(root)
    }
}

/// A user namespace that maps exactly on-disk `owner` to host `host`, for idmapped mounts.
pub fn idmap_userns(owner: (u32, u32), host: (u32, u32)) -> Result<OwnedFd> {
    userns_with_maps(&[(owner.0, host.0, 1)], &[(owner.1, host.1, 1)])
}

/// A user namespace with these `(inside, host, count)` uid and gid maps, for idmapped mounts.
fn userns_with_maps(uids: &[(u32, u32, u32)], gids: &[(u32, u32, u32)]) -> Result<OwnedFd> {
    PendingUserns::start()?.finish(uids, gids)
}

/// A user namespace being made for idmapped mounts, before its id maps are known.
///
/// A user namespace lives as long as a process or a descriptor holds it: a forked child
/// creates it and waits; [`PendingUserns::finish`] writes its maps, opens it and lets the child
/// exit. Starting it early lets the child's scheduling and `unshare` run on another core while
/// the caller does other work (a create's critical path otherwise waits for both).
#[derive(Debug)]
pub struct PendingUserns {
    pid: u32,
    ready: OwnedFd,
    /// Closing it ends the child.
    hold: Option<OwnedFd>,
}

impl PendingUserns {
    /// Forks the child that makes the namespace. Fails unless the caller is single-threaded
    /// (see [`fork`]).
    pub fn start() -> Result<Self> {
        let (ready_r, ready_w) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| SysError::call("pipe", e))?;
        let (hold_r, hold_w) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| SysError::call("pipe", e))?;
        match fork()? {
            Forked::Child => {
                drop((ready_r, hold_w));
                // SAFETY: this forked child is single-threaded (fork copies only the calling
                // thread); CLONE_NEWUSER only changes this process's credentials.
                let ok = unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER) }.is_ok();
                let _ = rustix::io::write(&ready_w, if ok { b"y" } else { b"n" });
                // Holds the namespace until the parent has opened it and closes its end.
                let _ = rustix::io::read(&hold_r, &mut [0u8; 1]);
                exit_now(0)
            }
            Forked::Parent(pid) => Ok(PendingUserns { pid, ready: ready_r, hold: Some(hold_w) }),
        }
    }

    /// Waits for the namespace, gives it these `(inside, host, count)` uid and gid maps and
    /// returns it.
    pub fn finish(mut self, uids: &[(u32, u32, u32)], gids: &[(u32, u32, u32)]) -> Result<OwnedFd> {
        let mut answer = [0u8; 1];
        let n = rustix::io::read(&self.ready, &mut answer).map_err(|e| SysError::call("read", e))?;
        if n != 1 || answer[0] != b'y' {
            return Err(SysError::Other(
                "cannot create a user namespace for an idmapped mount: enable user namespaces (sysctl user.max_user_namespaces above 0)".into(),
            ));
        }
        crate::ids::write_ranges(self.pid, uids, gids)?;
        let path = format!("/proc/{}/ns/user", self.pid);
        let ns = fs::File::open(&path).map(OwnedFd::from).map_err(|e| SysError::path("open", path, e));
        self.end();
        ns
    }

    /// Lets the child exit and collects it.
    fn end(&mut self) {
        if let Some(hold) = self.hold.take() {
            drop(hold);
            let _ = rustix::process::waitpid(
                rustix::process::Pid::from_raw(self.pid.cast_signed()),
                rustix::process::WaitOptions::empty(),
            );
        }
    }
}

impl Drop for PendingUserns {
    fn drop(&mut self) {
        self.end();
    }
}

/// Mounts `layer` at `at` read-only, nosuid and nodev, with its ids mapped through `userns`.
pub fn attach_idmapped(layer: &Path, at: &Path, userns: &OwnedFd) -> Result<()> {
    let what = || format!("{} -> {}", layer.display(), at.display());
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        layer,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| SysError::path("open layer", what(), e))?;
    attach(tree, at, Some(userns), true).map_err(|e| SysError::path("attach layer", what(), e))
}

/// A detached copy of the mount at directory `dir` (an `O_PATH` descriptor, so no path is
/// resolved again), for [`attach_tree`]. Only that one mount is copied, none mounted below it.
/// Made in the mount namespace `dir` was opened in; attachable in another one later.
pub fn clone_dir(dir: BorrowedFd<'_>) -> Result<OwnedFd> {
    rustix::mount::open_tree(
        dir,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_EMPTY_PATH,
    )
    .map_err(|e| SysError::call("open_tree", e))
}

/// Mounts detached `tree` at `at`: nosuid and nodev, read-only when asked, with its ids
/// mapped through `userns` when given.
pub fn attach_tree(tree: OwnedFd, at: &Path, userns: Option<&OwnedFd>, read_only: bool) -> Result<()> {
    attach(tree, at, userns, read_only).map_err(|e| SysError::path("attach mount", at, e))
}

fn attach(tree: OwnedFd, at: &Path, userns: Option<&OwnedFd>, read_only: bool) -> std::io::Result<()> {
    let mut attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if read_only {
        attr_set |= MOUNT_ATTR_RDONLY;
    }
    if userns.is_some() {
        attr_set |= MOUNT_ATTR_IDMAP;
    }
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |u| u64::from(u.as_raw_fd().cast_unsigned())),
    };
    mount_setattr(tree.as_fd(), c"", libc::AT_EMPTY_PATH as libc::c_uint, &attr)?;
    rustix::mount::move_mount(&tree, "", rustix::fs::CWD, at, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(std::io::Error::from)
}

#[repr(C)]
pub(crate) struct MountAttr {
    pub attr_set: u64,
    pub attr_clr: u64,
    pub propagation: u64,
    pub userns_fd: u64,
}

pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// mount_setattr(2), which rustix does not wrap.
pub(crate) fn mount_setattr(
    dir: std::os::fd::BorrowedFd<'_>,
    path: &std::ffi::CStr,
    flags: libc::c_uint,
    attr: &MountAttr,
) -> std::io::Result<()> {
    // SAFETY: `path` is NUL-terminated and `attr` a valid mount_attr of the size passed; both
    // outlive the call, which only reads them; `dir` is an open descriptor for its duration.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dir.as_raw_fd(),
            path.as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

fn mkdir(path: &Path) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(SysError::path("mkdir", path, e)),
    }
}

fn mount_fs(source: &str, at: &Path, fstype: &str, flags: MountFlags, options: &str) -> Result<()> {
    let options =
        std::ffi::CString::new(options).map_err(|_| SysError::Other("mount options contain a NUL byte".into()))?;
    rustix::mount::mount(source, at, fstype, flags, Some(options.as_c_str()))
        .map_err(|e| SysError::path("mount", at, e))
}

/// Runs `f` with `dir` as the working directory, then returns to the previous one.
fn with_cwd<T>(dir: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let back = fs::File::open(".").map_err(|e| SysError::path("open", ".", e))?;
    rustix::process::chdir(dir).map_err(|e| SysError::path("chdir", dir, e))?;
    let result = f();
    rustix::process::fchdir(&back).map_err(|e| SysError::call("chdir back", e))?;
    result
}
