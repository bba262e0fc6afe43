//! Size-capped persistent workspaces: an ext4 image per workspace, loop-mounted by the supervisor
//! inside a private mount namespace of its own, so the mount is never visible on the host and
//! goes away with the supervisor. (Scratch workspaces are a tmpfs: see the supervisor.)
//!
//! The host filesystem has no project quotas to lean on, and a tmpfs would count the files
//! against the sandbox's memory and lose them at release; an image persists and caps at once,
//! bytes and inodes alike, and `df` inside shows the workspace's own size.
//! mkfs.ext4 and mount(8) (e2fsprogs, util-linux: both in every Debian install) do the work,
//! since loop-device setup and ext4 formatting are theirs to get right.

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;

use paddock_core::runtime::RuntimeError;

/// Supervisors start with an empty environment, so tools are looked up in the system's
/// standard directories rather than through `PATH`.
fn tool(name: &str) -> Command {
    let found =
        ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.is_file());
    Command::new(found.unwrap_or_else(|| name.into()))
}

fn run(cmd: &mut Command, what: &str) -> Result<(), RuntimeError> {
    let out =
        cmd.output().map_err(|e| RuntimeError::System(format!("{what}: cannot run {:?}: {e}", cmd.get_program())))?;
    if out.status.success() {
        return Ok(());
    }
    Err(RuntimeError::System(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim())))
}

/// Creates a sparse image of `bytes` with an empty ext4 filesystem of (at least) `inodes`
/// inodes whose root is owned by `uid:gid`. Only the metadata takes disk space until files are
/// written.
pub fn create(image: &Path, bytes: u64, inodes: u64, uid: u32, gid: u32) -> Result<(), RuntimeError> {
    // Inode tables take 256 bytes an inode: mkfs refuses more than the blocks can hold, so a
    // small image gets one inode per 8 KiB at most (the cap is an upper bound anyway).
    let inodes = inodes.min((bytes / 8192).max(1024));
    let file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(image)
        .map_err(|e| RuntimeError::from_io(image.display(), &e))?;
    file.set_len(bytes).map_err(|e| RuntimeError::from_io(format!("sizing {}", image.display()), &e))?;
    drop(file);
    let result = run(
        tool("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-L", "paddock-ws", "-N"])
            .arg(inodes.to_string())
            .arg("-E")
            .arg(format!("root_owner={uid}:{gid},lazy_itable_init=1,lazy_journal_init=1"))
            .arg(image),
        "formatting the workspace image",
    );
    if result.is_err() {
        let _ = fs::remove_file(image);
    }
    result
}

/// Mounts `image` at `at` in the calling supervisor's own mount namespace.
pub fn mount_private(image: &Path, at: &Path) -> Result<(), RuntimeError> {
    paddock_sys::process::unshare_mount_namespace().map_err(|e| {
        RuntimeError::from_errno(e.errno(), format!("a private mount namespace for the workspace: {e}"))
    })?;
    mount(image, at)
}

/// Mounts `image` at `at` (made if missing) in the caller's mount namespace.
pub fn mount(image: &Path, at: &Path) -> Result<(), RuntimeError> {
    fs::create_dir_all(at).map_err(|e| RuntimeError::from_io(at.display(), &e))?;
    // noinit_itable: the image was made sparse with lazy_itable_init, so its inode tables read
    // as zeros already; the kernel's background zeroing would only turn tens of MiB of holes per
    // workspace into written disk.
    run(
        tool("mount").args(["-o", "loop,nosuid,nodev,noatime,noinit_itable"]).arg(image).arg(at),
        "mounting the workspace image",
    )?;
    // mkfs's lost+found would be the first thing an agent sees in its "empty" workspace. Only
    // the empty root-owned one mkfs made goes (e2fsck makes it again if it ever needs it); one
    // the sandbox made belongs to the sandbox's identity and stays.
    let lost = at.join("lost+found");
    if fs::symlink_metadata(&lost).is_ok_and(|m| m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        let _ = fs::remove_dir(&lost);
    }
    Ok(())
}

/// Unmounts what [`mount_private`] mounted, so removing the sandbox directory cannot reach into
/// a persistent workspace.
pub fn unmount(at: &Path) {
    let _ = rustix::mount::unmount(at, rustix::mount::UnmountFlags::DETACH);
}
