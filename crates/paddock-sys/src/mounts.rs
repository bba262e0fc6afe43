//! The sandbox's filesystem view.
//!
//! The supervisor (host root) prepares a skeleton directory on disk: one empty directory or file
//! for every top-level entry of the source root, plus the mount points Paddock adds. The child,
//! inside its new user and mount namespaces, then only mounts onto that skeleton and pivots into
//! it. Nothing is created inside the user namespace, so no file needs an owner that is mapped
//! there, and nothing is mounted in the host's mount namespace.

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use crate::{Result, SysError};

/// Top-level entries of the source root that are never shown: kernel and device trees are
/// mounted fresh, `/tmp` and `/run` are private, and people's homes stay private.
const NEVER_BOUND: &[&str] = &["proc", "sys", "dev", "tmp", "run", "root", "home", "workspace", "lost+found"];

/// Pseudo-terminals one sandbox may hold at once. Every sandbox has its own devpts instance, so
/// without a `max` one sandbox could take the whole pool that non-initial instances share
/// (`kernel.pty.max` minus `kernel.pty.reserve`, which stays for the host's own instance) and
/// leave every other sandbox without a terminal. 256 is far more than shells, tmux panes and
/// pty-testing suites use, and keeps a dozen hostile sandboxes from draining the shared pool.
pub const MAX_PTYS: u32 = 256;

/// Device nodes bound from the host's `/dev`.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// What to mount where for one sandbox.
#[derive(Debug, Clone)]
pub struct RootPlan {
    /// The skeleton directory, which becomes `/` inside.
    pub skeleton: PathBuf,
    /// The tree shown read-only as `/`: the host's `/`, or an image rootfs directory.
    pub source: PathBuf,
    /// What `/workspace` is.
    pub workspace: Workspace,
    /// Paths inside the sandbox hidden behind an empty read-only tmpfs (the data directory).
    pub masks: Vec<PathBuf>,
    /// Size cap of `/tmp`, bytes.
    pub tmp_bytes: u64,
    /// Size cap of `/dev/shm`, bytes.
    pub shm_bytes: u64,
    /// The source's top-level entries stay writable (an image root whose writes go to the
    /// sandbox's own overlay layer); otherwise everything from the source is read-only.
    pub writable_root: bool,
    /// Volumes bound into the view, each from a mount the supervisor staged.
    pub volumes: Vec<VolumeBind>,
    /// Top-level names shown as a small read-only tmpfs holding only the volumes' mount
    /// points, instead of the source's entry of that name (an empty or missing one).
    pub shadowed: Vec<std::ffi::OsString>,
    /// Files written into the sandbox's `/run` (relative paths there) before it becomes
    /// read-only: the credential proxy's CA and trust bundle.
    pub run_files: Vec<(PathBuf, Vec<u8>)>,
}

/// A volume in the sandbox's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeBind {
    /// The staged mount (already nosuid, nodev, idmapped and read-only as it should be), as
    /// a path in the supervisor's mount namespace.
    pub staged: PathBuf,
    /// Where it appears inside the sandbox (absolute).
    pub target: PathBuf,
    pub read_only: bool,
}

/// What is mounted read-write at `/workspace`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workspace {
    /// A host directory (or the mount point of a workspace image), bound.
    Bind(PathBuf),
    /// A fresh tmpfs with a size and an inode cap, owned by the sandbox user (ids as seen
    /// inside). Its pages are charged to the memory cgroup of whoever writes them, the sandbox.
    Tmpfs { bytes: u64, inodes: u64, uid: u32, gid: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

/// One top-level entry of a source root as the skeleton mirrors it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Entry {
    Dir(std::ffi::OsString),
    File(std::ffi::OsString),
    Symlink(std::ffi::OsString, PathBuf),
}

impl Entry {
    fn name(&self) -> &std::ffi::OsStr {
        match self {
            Entry::Dir(n) | Entry::File(n) | Entry::Symlink(n, _) => n,
        }
    }
}

/// The top-level entries of `source` the skeleton mirrors, sorted.
fn source_entries(source: &Path) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(source).map_err(|e| SysError::path("list", source, e))? {
        let entry = entry.map_err(|e| SysError::path("list", source, e))?;
        let name = entry.file_name();
        let Some(name_str) = name.to_str() else { continue };
        if NEVER_BOUND.contains(&name_str) {
            continue;
        }
        let ft = entry.file_type().map_err(|e| SysError::path("stat", entry.path(), e))?;
        if ft.is_symlink() {
            let link = fs::read_link(entry.path()).map_err(|e| SysError::path("readlink", entry.path(), e))?;
            out.push(Entry::Symlink(name, link));
        } else if ft.is_dir() {
            out.push(Entry::Dir(name));
        } else if ft.is_file() {
            out.push(Entry::File(name));
        }
    }
    out.sort();
    Ok(out)
}

/// Bumped whenever what a skeleton holds changes, so skeletons of an older layout are not used.
const SKELETON_LAYOUT: u32 = 1;

/// The skeleton for a root whose top-level entries are those of `source`, under `store`: made
/// once and shared by every sandbox whose root has the same top-level entries.
///
/// A skeleton holds only empty directories and files and the symlinks of the source's top
/// level, made by root and never written again, and each sandbox mounts onto it in its own
/// mount namespace, so sandboxes can share one. Making and removing one per sandbox was the
/// largest part of a create and destroy (about 40 directory operations on the data directory's
/// filesystem, journalled). A source whose top level changes gets a skeleton of its own, under
/// another name; skeletons are never removed, since running sandboxes have mounts on them.
pub fn shared_skeleton(store: &Path, source: &Path) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let entries = source_entries(source)?;
    // Two differently seeded 64-bit hashes: a collision would only give a sandbox the wrong
    // mount points (a create that fails, or a top-level entry left out), never more access.
    let digest = |seed: u64| {
        let mut h = std::hash::DefaultHasher::new();
        (seed, SKELETON_LAYOUT, &entries).hash(&mut h);
        h.finish()
    };
    let at = store.join(format!("{:016x}{:016x}", digest(1), digest(2)));
    if at.is_dir() {
        return Ok(at);
    }
    mkdir(store, 0o711)?;
    // Built aside and renamed into place, so a skeleton that exists is complete.
    let mut nonce = [0u8; 8];
    rustix::rand::getrandom(&mut nonce, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| SysError::call("getrandom", e))?;
    let tmp = store.join(format!(".new-{:016x}", u64::from_le_bytes(nonce)));
    let built = build_skeleton(&tmp, &entries).and_then(|()| {
        fs::rename(&tmp, &at).map_err(|e| SysError::path("rename", format!("{} -> {}", tmp.display(), at.display()), e))
    });
    if let Err(e) = built {
        let _ = fs::remove_dir_all(&tmp);
        // Another supervisor published the same skeleton first.
        if at.is_dir() {
            return Ok(at);
        }
        return Err(e);
    }
    Ok(at)
}

/// A skeleton for one sandbox only, at `at` (inside its own directory, gone with it): the
/// source's top level plus `extra`, top-level directories the source lacks that the sandbox
/// needs as mount points (volumes at a new top-level path). Never shared, so the names a
/// caller picks cannot pile up skeletons in the data directory.
pub fn own_skeleton(at: &Path, source: &Path, extra: &[std::ffi::OsString]) -> Result<PathBuf> {
    let mut entries = source_entries(source)?;
    for name in extra {
        if !entries.iter().any(|e| e.name() == name) {
            entries.push(Entry::Dir(name.clone()));
        }
    }
    build_skeleton(at, &entries)?;
    Ok(at.to_path_buf())
}

fn build_skeleton(sk: &Path, entries: &[Entry]) -> Result<()> {
    mkdir(sk, 0o755)?;
    for entry in entries {
        match entry {
            Entry::Symlink(name, link) => {
                let target = sk.join(name);
                symlink(link, &target).map_err(|e| SysError::path("symlink", &target, e))?;
            }
            Entry::Dir(name) => mkdir(&sk.join(name), 0o755)?,
            Entry::File(name) => touch(&sk.join(name))?,
        }
    }
    for dir in ["proc", "sys", "dev", "tmp", "run", "root", "home", "workspace"] {
        mkdir(&sk.join(dir), 0o755)?;
    }
    let dev = sk.join("dev");
    for node in DEV_NODES {
        touch(&dev.join(node))?;
    }
    for dir in ["pts", "shm"] {
        mkdir(&dev.join(dir), 0o755)?;
    }
    for (name, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let path = dev.join(name);
        symlink(target, &path).map_err(|e| SysError::path("symlink", &path, e))?;
    }
    Ok(())
}

impl RootPlan {
    /// Builds the skeleton at `self.skeleton` on the host (for a skeleton of this sandbox's
    /// own; see [`shared_skeleton`]). Runs as host root before the clone.
    pub fn prepare_skeleton(&self) -> Result<()> {
        build_skeleton(&self.skeleton, &source_entries(&self.source)?)
    }
    /// The top-level entries of the skeleton that come from the source root.
    fn bound_entries(&self) -> Result<Vec<(PathBuf, Kind)>> {
        let mut out = Vec::new();
        let entries = fs::read_dir(&self.skeleton).map_err(|e| SysError::path("list", &self.skeleton, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| SysError::path("list", &self.skeleton, e))?;
            let name = entry.file_name();
            if NEVER_BOUND.iter().any(|n| name == *n) || self.shadowed.contains(&name) {
                continue;
            }
            let ft = entry.file_type().map_err(|e| SysError::path("stat", entry.path(), e))?;
            if ft.is_dir() {
                out.push((PathBuf::from(name), Kind::Dir));
            } else if ft.is_file() {
                out.push((PathBuf::from(name), Kind::File));
            }
        }
        Ok(out)
    }

    /// Binds the source's top-level entries into the skeleton and hides the masked paths.
    fn bind_source(&self) -> Result<()> {
        let sk = &self.skeleton;
        for (name, kind) in self.bound_entries()? {
            bind_nofollow(&self.source.join(&name), &sk.join(&name), kind == Kind::Dir)?;
        }
        for mask in &self.masks {
            let at = sk.join(mask.strip_prefix("/").unwrap_or(mask));
            match fs::symlink_metadata(&at) {
                // Not inside any bound tree: nothing to hide.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Ok(m) if m.is_dir() => mount_tmpfs(&at, "size=4k,mode=0755,nr_inodes=16", MountFlags::RDONLY)?,
                // Fail closed: a mask that cannot be applied means the path stays visible.
                _ => return Err(SysError::Other(format!("cannot hide {} inside the sandbox", mask.display()))),
            }
        }
        Ok(())
    }

    /// The top-level directories of the source, as paths inside the sandbox: where Landlock
    /// must allow writes when the root is writable.
    pub fn writable_dirs(&self) -> Result<Vec<PathBuf>> {
        if !self.writable_root {
            return Ok(Vec::new());
        }
        let dirs = self.bound_entries()?.into_iter().filter(|(_, k)| *k == Kind::Dir);
        Ok(dirs.map(|(n, _)| Path::new("/").join(n)).collect())
    }

    /// Mounts the sandbox's filesystem and makes it the root. Runs in the child, in its new
    /// mount and user namespaces, with the capabilities it holds there.
    pub fn enter(&self) -> Result<()> {
        let sk = &self.skeleton;
        rustix::mount::mount_change("/", MountPropagationFlags::REC | MountPropagationFlags::PRIVATE)
            .map_err(|e| SysError::call("make mounts private", e))?;
        bind(sk, sk, false)?;
        if !self.writable_root {
            self.bind_source()?;
        }
        let run_bytes = (64 << 10) + self.run_files.iter().map(|(_, b)| b.len() + 4096).sum::<usize>();
        mount_tmpfs(&sk.join("run"), &format!("size={run_bytes},mode=0755,nr_inodes=64"), MountFlags::empty())?;
        self.write_run_files()?;
        // Everything so far is the read-only part of the view.
        set_tree_read_only(sk)?;
        if self.writable_root {
            // Bound after the read-only pass: the overlay below is writable, and nosuid and
            // nodev come with it.
            self.bind_source()?;
        }

        let dev = sk.join("dev");
        for node in DEV_NODES {
            let at = dev.join(node);
            bind(&Path::new("/dev").join(node), &at, false)?;
            remount_bind(&at, MountFlags::NOSUID | MountFlags::NOEXEC)?;
        }
        mount_fs(
            "devpts",
            &dev.join("pts"),
            "devpts",
            MountFlags::NOSUID | MountFlags::NOEXEC,
            &format!("newinstance,ptmxmode=0666,mode=0620,max={MAX_PTYS}"),
        )?;
        let nosuid_nodev = MountFlags::NOSUID | MountFlags::NODEV;
        mount_tmpfs(
            &dev.join("shm"),
            &format!("size={},mode=1777", self.shm_bytes),
            nosuid_nodev | MountFlags::NOEXEC,
        )?;
        mount_tmpfs(&sk.join("tmp"), &format!("size={},mode=1777", self.tmp_bytes), nosuid_nodev)?;
        let ws = sk.join("workspace");
        match &self.workspace {
            Workspace::Bind(dir) => {
                bind(dir, &ws, false)?;
                remount_bind(&ws, nosuid_nodev)?;
            }
            Workspace::Tmpfs { bytes, inodes, uid, gid } => mount_tmpfs(
                &ws,
                &format!("size={bytes},nr_inodes={inodes},mode=0755,uid={uid},gid={gid}"),
                nosuid_nodev,
            )?,
        }
        self.mount_volumes()?;
        mount_fs("proc", &sk.join("proc"), "proc", nosuid_nodev | MountFlags::NOEXEC, "")?;
        // sysfs can only be mounted when the kernel sees the host's one fully; without it the
        // sandbox simply has an empty /sys.
        let _ = mount_fs("sysfs", &sk.join("sys"), "sysfs", nosuid_nodev | MountFlags::NOEXEC | MountFlags::RDONLY, "");

        rustix::process::chdir(sk).map_err(|e| SysError::path("chdir", sk, e))?;
        // pivot_root(".", ".") stacks the old root under the new one; detaching "." then drops
        // the old root without needing a directory for it in the read-only new root.
        rustix::process::pivot_root(".", ".").map_err(|e| SysError::path("pivot_root", sk, e))?;
        rustix::mount::unmount(".", UnmountFlags::DETACH).map_err(|e| SysError::call("detach old root", e))?;
        rustix::process::chdir("/").map_err(|e| SysError::call("chdir /", e))?;
        Ok(())
    }
}

impl RootPlan {
    /// Writes [`RootPlan::run_files`] into the fresh `/run` (nothing of the sandbox has run yet,
    /// so nothing there can be a symlink): world-readable, and read-only once the tree is.
    fn write_run_files(&self) -> Result<()> {
        let run = self.skeleton.join("run");
        for (rel, body) in &self.run_files {
            let path = run.join(rel);
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir).map_err(|e| SysError::path("mkdir", dir, e))?;
                fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
                    .map_err(|e| SysError::path("chmod", dir, e))?;
            }
            fs::write(&path, body).map_err(|e| SysError::path("write", &path, e))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644))
                .map_err(|e| SysError::path("chmod", &path, e))?;
        }
        Ok(())
    }

    /// The volumes' mount points that take writes, as paths inside the sandbox: where Landlock
    /// must allow them.
    pub fn writable_volumes(&self) -> Vec<PathBuf> {
        self.volumes.iter().filter(|v| !v.read_only).map(|v| v.target.clone()).collect()
    }

    /// Makes the shadowed top-level directories and binds the staged volumes, after the
    /// read-only pass (a read-write volume stays writable; each staged mount carries its own
    /// flags, which a bind keeps and this user namespace cannot clear).
    fn mount_volumes(&self) -> Result<()> {
        let sk = &self.skeleton;
        for name in &self.shadowed {
            let at = sk.join(name);
            mount_tmpfs(&at, "size=64k,nr_inodes=256,mode=0755", MountFlags::NOSUID | MountFlags::NODEV)?;
            for v in &self.volumes {
                let Ok(rel) = v.target.strip_prefix("/") else { continue };
                if rel.starts_with(name) {
                    fs::create_dir_all(sk.join(rel)).map_err(|e| SysError::path("mkdir", &v.target, e))?;
                }
            }
            remount_bind(&at, MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV)?;
        }
        for v in &self.volumes {
            let rel = v.target.strip_prefix("/").unwrap_or(&v.target);
            // Below the fresh /tmp (mounted a moment ago; nothing of the sandbox has run, so
            // nothing in it can be a symlink) the mount point is made first.
            if rel.starts_with("tmp") && rel != Path::new("tmp") {
                fs::create_dir_all(sk.join(rel)).map_err(|e| SysError::path("mkdir", &v.target, e))?;
            }
            bind(&v.staged, &sk.join(rel), false)?;
        }
        Ok(())
    }
}

/// Mounts a small tmpfs at `at` (made if missing) for a sandbox's own mount points, such as an
/// image root's layers, upper layer and overlay. Directories on it cost no journal writes to
/// make, and nothing to remove: [`unmount_scratch`] drops them all. The caller must be in a
/// private mount namespace.
pub fn mount_scratch(at: &Path) -> Result<()> {
    mkdir(at, 0o755)?;
    mount_tmpfs(at, "size=64k,nr_inodes=1024,mode=0755", MountFlags::NOEXEC)
}

/// Detaches what [`mount_scratch`] mounted and, in the same call, everything mounted below it
/// (an image root's layers, upper layer and overlay): each unmount call waits for the kernel's
/// RCU grace period, so one call for the whole tree is the quick way.
pub fn unmount_scratch(at: &Path) {
    let _ = rustix::mount::unmount(at, UnmountFlags::DETACH);
}

fn mkdir(path: &Path, mode: u32) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => {
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|e| SysError::path("chmod", path, e))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(SysError::path("mkdir", path, e)),
    }
}

fn touch(path: &Path) -> Result<()> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|e| SysError::path("create", path, e))
}

fn bind(src: &Path, dst: &Path, recursive: bool) -> Result<()> {
    let r = if recursive { rustix::mount::mount_bind_recursive(src, dst) } else { rustix::mount::mount_bind(src, dst) };
    r.map_err(|e| SysError::path("bind mount", format!("{} -> {}", src.display(), dst.display()), e))
}

/// Binds `src` onto `dst` without following a symlink at `src`: the source tree may have been
/// changed since the skeleton was made, and a top-level entry swapped for a symlink must not
/// bring some other host path into the sandbox.
fn bind_nofollow(src: &Path, dst: &Path, recursive: bool) -> Result<()> {
    use rustix::mount::{MoveMountFlags, OpenTreeFlags};
    let what = || format!("{} -> {}", src.display(), dst.display());
    let mut flags =
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_SYMLINK_NOFOLLOW;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    let tree =
        rustix::mount::open_tree(rustix::fs::CWD, src, flags).map_err(|e| SysError::path("bind mount", what(), e))?;
    let meta = rustix::fs::fstat(&tree).map_err(|e| SysError::path("bind mount", what(), e))?;
    if rustix::fs::FileType::from_raw_mode(meta.st_mode) == rustix::fs::FileType::Symlink {
        return Err(SysError::Other(format!("{} became a symlink: refusing to bind it", src.display())));
    }
    rustix::mount::move_mount(&tree, "", rustix::fs::CWD, dst, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(|e| SysError::path("bind mount", what(), e))
}

fn remount_bind(at: &Path, flags: MountFlags) -> Result<()> {
    rustix::mount::mount_remount(at, flags | MountFlags::BIND, "").map_err(|e| SysError::path("remount", at, e))
}

fn mount_tmpfs(at: &Path, options: &str, flags: MountFlags) -> Result<()> {
    mount_fs("tmpfs", at, "tmpfs", flags | MountFlags::NOSUID | MountFlags::NODEV, options)
}

fn mount_fs(source: &str, at: &Path, fstype: &str, flags: MountFlags, options: &str) -> Result<()> {
    let options = CString::new(options).map_err(|_| SysError::Other("mount options contain a NUL byte".into()))?;
    rustix::mount::mount(source, at, fstype, flags, Some(options.as_c_str()))
        .map_err(|e| SysError::path("mount", at, e))
}

/// Makes `root` and every mount below it read-only, nosuid and nodev in one call.
fn set_tree_read_only(root: &Path) -> Result<()> {
    use crate::overlay::{MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, MountAttr, mount_setattr};
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let path = CString::new(root.as_os_str().as_encoded_bytes())
        .map_err(|_| SysError::Other(format!("path {} contains a NUL byte", root.display())))?;
    mount_setattr(rustix::fs::CWD, &path, libc::AT_RECURSIVE as libc::c_uint, &attr)
        .map_err(|e| SysError::path("make read-only (mount_setattr, Linux >= 5.12)", root, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skeleton_mirrors_top_level_and_adds_mount_points() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("usr/bin")).unwrap();
        fs::create_dir_all(src.join("etc")).unwrap();
        fs::create_dir_all(src.join("home/alice")).unwrap();
        fs::create_dir_all(src.join("root")).unwrap();
        fs::write(src.join("vmlinuz.old"), b"x").unwrap();
        symlink("usr/bin", src.join("bin")).unwrap();
        let plan = RootPlan {
            skeleton: tmp.path().join("sk"),
            source: src,
            workspace: Workspace::Bind(tmp.path().join("ws")),
            masks: vec![],
            tmp_bytes: 1 << 20,
            shm_bytes: 1 << 20,
            writable_root: false,
            volumes: Vec::new(),
            shadowed: Vec::new(),
            run_files: Vec::new(),
        };
        plan.prepare_skeleton().unwrap();
        let sk = &plan.skeleton;
        assert!(sk.join("usr").is_dir() && fs::read_dir(sk.join("usr")).unwrap().next().is_none());
        assert_eq!(fs::read_link(sk.join("bin")).unwrap(), Path::new("usr/bin"));
        assert!(sk.join("vmlinuz.old").is_file());
        assert!(fs::read_dir(sk.join("home")).unwrap().next().is_none(), "homes are never mirrored");
        for d in ["proc", "dev/pts", "dev/shm", "tmp", "workspace", "run"] {
            assert!(sk.join(d).is_dir(), "{d}");
        }
        assert_eq!(fs::read_link(sk.join("dev/ptmx")).unwrap(), Path::new("pts/ptmx"));
        let mut bound: Vec<_> = plan.bound_entries().unwrap().into_iter().map(|(p, _)| p).collect();
        bound.sort();
        assert_eq!(bound, vec![PathBuf::from("etc"), PathBuf::from("usr"), PathBuf::from("vmlinuz.old")]);
    }

    #[test]
    fn a_shared_skeleton_is_made_once_per_top_level_listing() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, store) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("skeletons"));
        for root in [&a, &b] {
            fs::create_dir_all(root.join("usr/lib")).unwrap();
            symlink("usr/lib", root.join("lib")).unwrap();
        }
        let first = shared_skeleton(&store, &a).unwrap();
        assert!(first.join("usr").is_dir() && first.join("dev/pts").is_dir());
        assert_eq!(fs::read_link(first.join("lib")).unwrap(), Path::new("usr/lib"));
        assert_eq!(shared_skeleton(&store, &b).unwrap(), first, "same top level, same skeleton");
        fs::create_dir(b.join("opt")).unwrap();
        let second = shared_skeleton(&store, &b).unwrap();
        assert_ne!(second, first, "a changed top level gets a skeleton of its own");
        assert!(second.join("opt").is_dir() && !first.join("opt").exists());
        fs::remove_file(b.join("lib")).unwrap();
        symlink("usr", b.join("lib")).unwrap();
        assert_ne!(shared_skeleton(&store, &b).unwrap(), second, "a symlink's target is part of the listing");
        assert_eq!(fs::read_dir(&store).unwrap().count(), 3, "nothing half-built is left behind");
    }
}
