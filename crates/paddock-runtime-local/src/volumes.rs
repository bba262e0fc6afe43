//! Volumes: host directories the operator allows, and named volumes this data directory keeps
//! until they are deleted.
//!
//! - **Host directories** are allowed only below a root the operator named
//!   (`paddock serve --volume-root`), checked on the path with every symlink resolved, and
//!   opened again without following any symlink when mounted, so a directory swapped for a
//!   link in between is refused rather than followed out of the root.
//! - **Named volumes** are an ext4 image each (size- and inode-capped, like a persistent
//!   workspace), owned on disk by a host identity of their own and mounted once on the host
//!   below a 0700 directory, where every sandbox that uses the volume binds it from.
//!
//! Each mount reaches the sandbox through an idmapped mount made by the supervisor: the
//! volume's on-disk owner is shown as the sandbox user and files the sandbox creates get that
//! owner on disk, so sandboxes that share a named volume (each with its own host identity)
//! share its files. A host directory's owner is mapped only when it is an ordinary user (uid
//! and gid 1000 or above): host root, system users and groups are never mapped, so a sandbox
//! never creates a file owned by them; below such an owner the sandbox acts as its own
//! identity. Mounts are always nosuid and nodev, read-only ones are read-only in the kernel
//! (the flag is locked in the sandbox's user namespace), and the seccomp filter refuses set-id
//! mode bits, so no file a sandbox leaves in a volume can raise anyone's privileges.

use std::ffi::OsString;
use std::fs;
use std::io::ErrorKind;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use paddock_core::runtime::{RuntimeError, SandboxId};
use paddock_core::spec::SandboxSpec;
use paddock_core::volume::{NamedVolume, VolumeMount, VolumeSource};
use paddock_sys::mounts::VolumeBind;
use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::identity::{self, HostIds};
use crate::layout::DataDir;
use paddock_core::units::unix_ms as now_ms;

/// The operator's volume settings.
#[derive(Debug, Clone, Default)]
pub struct VolumeOptions {
    /// Host directories below which sandboxes may mount host paths (canonical). None: host
    /// paths are refused.
    pub host_roots: Vec<PathBuf>,
}

impl VolumeOptions {
    /// Takes the roots as the operator named them; each must exist.
    pub fn new(roots: &[PathBuf]) -> Result<Self, RuntimeError> {
        let mut host_roots = Vec::new();
        for r in roots {
            let real = fs::canonicalize(r).map_err(|e| {
                RuntimeError::InvalidArgument(format!("volume root {}: {e}: name an existing directory", r.display()))
            })?;
            if real == Path::new("/") {
                return Err(RuntimeError::InvalidArgument(
                    "volume root / would let sandboxes mount any host directory: name the directories that hold shared data".into(),
                ));
            }
            host_roots.push(real);
        }
        Ok(Self { host_roots })
    }
}

fn sys(context: impl std::fmt::Display) -> impl Fn(std::io::Error) -> RuntimeError {
    move |e| RuntimeError::from_io(&context, &e)
}

/// Checks what a sandbox's volumes ask for before its supervisor starts, and replaces each
/// host path with its real path (what the supervisor opens, symlinks refused).
pub fn resolve(dd: &DataDir, opts: &VolumeOptions, spec: &mut SandboxSpec) -> Result<(), RuntimeError> {
    let mut data_dirs = None;
    for v in &mut spec.volumes {
        match &mut v.source {
            VolumeSource::Host { path } => {
                if opts.host_roots.is_empty() {
                    return Err(RuntimeError::InvalidArgument(format!(
                        "volume {}: host paths are off on this server: the operator allows them with `paddock serve --volume-root DIR`",
                        v.name
                    )));
                }
                let real = fs::canonicalize(&*path).map_err(|e| match e.kind() {
                    ErrorKind::NotFound => RuntimeError::InvalidArgument(format!(
                        "volume {}: host path {path} does not exist: create the directory on the host first",
                        v.name
                    )),
                    _ => RuntimeError::InvalidArgument(format!("volume {}: host path {path}: {e}", v.name)),
                })?;
                if !real.is_dir() {
                    return Err(RuntimeError::InvalidArgument(format!(
                        "volume {}: host path {path} is not a directory: mount a directory",
                        v.name
                    )));
                }
                if !opts.host_roots.iter().any(|r| real.starts_with(r)) {
                    return Err(RuntimeError::InvalidArgument(format!(
                        "volume {}: host path {path} is outside the directories this server allows ({}): use a path below one of them",
                        v.name,
                        opts.host_roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
                    )));
                }
                let data_dirs = data_dirs.get_or_insert_with(|| crate::registry::all_data_dirs(dd.root()));
                if let Some(d) = data_dirs.iter().find(|d| real.starts_with(d) || d.starts_with(&real)) {
                    return Err(RuntimeError::InvalidArgument(format!(
                        "volume {}: host path {path} holds or is inside Paddock's data directory {}: mount another directory",
                        v.name,
                        d.display()
                    )));
                }
                *path = real.to_string_lossy().into_owned();
            }
            VolumeSource::Named { name, create, delete_with_sandbox, .. } => {
                if *delete_with_sandbox {
                    return Err(RuntimeError::Unsupported(format!(
                        "volume {}: deleteOnSandboxTermination is not supported: named volumes are kept until `paddock volume rm {name}` or DELETE /v1/volumes/{name}",
                        v.name
                    )));
                }
                if !*create && !dd.volume_image(name).is_file() {
                    return Err(RuntimeError::NotFound(format!(
                        "volume {}: named volume {name} does not exist: create it (createIfNotExists) or see `paddock volume ls`",
                        v.name
                    )));
                }
            }
        }
    }
    Ok(())
}

fn lock(dd: &DataDir, name: &str) -> Result<fs::File, RuntimeError> {
    let dir = dd.volumes();
    fs::create_dir_all(&dir).map_err(sys(format!("creating {}", dir.display())))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(sys(format!("chmod {}", dir.display())))?;
    let path = dd.volume_lock(name);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(sys(format!("creating {}", parent.display())))?;
    }
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(sys(format!("opening {}", path.display())))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| RuntimeError::from_io(format!("locking {}", path.display()), &e.into()))?;
    Ok(file)
}

fn is_mount_point(dir: &Path) -> bool {
    match (fs::symlink_metadata(dir), dir.parent().map(fs::symlink_metadata)) {
        (Ok(d), Some(Ok(p))) => d.is_dir() && d.dev() != p.dev(),
        _ => false,
    }
}

/// Makes named volume `name` if it is missing (when allowed), mounts it on the host if it is
/// not mounted yet, and returns where it is mounted and the identity its files belong to.
/// Runs in the supervisor, in the host's mount namespace, as host root.
pub fn mount_named(
    dd: &DataDir,
    user: &SandboxId,
    name: &str,
    create: bool,
    bytes: u64,
    inodes: u64,
) -> Result<(PathBuf, HostIds), RuntimeError> {
    let _lock = lock(dd, name)?;
    let image = dd.volume_image(name);
    let identity_path = dd.volume_identity(name);
    if !image.is_file() {
        if !create {
            return Err(RuntimeError::NotFound(format!(
                "named volume {name} does not exist: create it (createIfNotExists) or see `paddock volume ls`"
            )));
        }
        let dir = dd.volume(name);
        fs::create_dir_all(&dir).map_err(sys(format!("creating {}", dir.display())))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
            .map_err(sys(format!("chmod {}", dir.display())))?;
        let ids = match fs::read(&identity_path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                RuntimeError::System(format!("{} is damaged ({e}): remove the volume", identity_path.display()))
            })?,
            Err(_) => {
                let ids = identity::allocate(dd, &format!("volume {name}"))?;
                if let Err(e) =
                    crate::layout::write_private(&identity_path, serde_json::to_vec(&ids).expect("ids serialize"))
                {
                    identity::release(dd, &ids);
                    return Err(sys(format!("writing {}", identity_path.display()))(e));
                }
                ids
            }
        };
        // Made aside and renamed, so an image that exists is a whole one.
        let tmp = dir.join("files.img.new");
        crate::wsimage::create(&tmp, bytes, inodes, ids.uid, ids.gid)?;
        crate::layout::write_private(&dir.join("created"), now_ms().to_string())
            .map_err(sys("recording the volume's creation"))?;
        fs::rename(&tmp, &image).map_err(sys(format!("publishing {}", image.display())))?;
    }
    let ids: HostIds =
        serde_json::from_slice(&fs::read(&identity_path).map_err(sys(format!("reading {}", identity_path.display())))?)
            .map_err(|e| {
                RuntimeError::System(format!("{} is damaged ({e}): remove the volume", identity_path.display()))
            })?;
    let mounts = dd.volume_mounts();
    fs::create_dir_all(&mounts).map_err(sys(format!("creating {}", mounts.display())))?;
    fs::set_permissions(&mounts, fs::Permissions::from_mode(0o700))
        .map_err(sys(format!("chmod {}", mounts.display())))?;
    let at = dd.volume_mount(name);
    if !is_mount_point(&at) {
        crate::wsimage::mount(&image, &at)?;
    }
    // Marked in use under the lock, before the sandbox's record exists, so a delete never
    // slips in between (see `users`).
    let users = dd.volume(name).join("users");
    fs::create_dir_all(&users).map_err(sys(format!("creating {}", users.display())))?;
    crate::layout::write_private(&users.join(user.as_str()), b"").map_err(sys("marking the volume in use"))?;
    // A symlink in the data directory's own path is the operator's: resolve it once here, so
    // the no-symlink open below only guards what lies inside the volume.
    let at = fs::canonicalize(&at).map_err(sys(format!("resolving {}", at.display())))?;
    Ok((at, ids))
}

/// A volume ready to be staged: a detached copy of the directory's mount (the directory
/// opened without following symlinks), and the on-disk ids to show as the sandbox user.
pub struct Opened {
    tree: OwnedFd,
    /// `None`: shown with the sandbox's own ids, and read-only whatever was asked.
    owner: Option<(u32, u32)>,
}

fn open_dir(at: impl rustix::path::Arg, base: Option<&OwnedFd>, what: &str) -> Result<OwnedFd, RuntimeError> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let r = match base {
        Some(b) => rustix::fs::openat2(
            b,
            at,
            flags,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ),
        None => rustix::fs::openat2(
            rustix::fs::CWD,
            at,
            flags,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ),
    };
    r.map_err(|e| match e {
        rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR => {
            RuntimeError::InvalidArgument(format!("{what} does not exist or is not a directory"))
        }
        rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => RuntimeError::InvalidArgument(format!(
            "{what} goes through a symbolic link, which volumes never follow: name the real directory"
        )),
        e => RuntimeError::from_io(format!("opening {what}"), &e.into()),
    })
}

/// The on-disk owner to show as the sandbox user: the directory's own uid and gid when both
/// are an ordinary user's and group's (1000 or above, below every id Paddock gives
/// sandboxes). `None` otherwise: the directory is then mounted read-only, since files the
/// sandbox made there would belong to its own identity, which a later sandbox may be given.
fn mapped_owner(uid: u32, gid: u32) -> Option<(u32, u32)> {
    let ordinary = |id: u32| (1000..crate::identity::HOST_ID_OFFSET).contains(&id);
    (ordinary(uid) && ordinary(gid)).then_some((uid, gid))
}

/// Makes the missing directories of `sub` below `base`, owned by `owner`, one component at a
/// time and never through a symlink.
fn make_sub_dirs(base: &OwnedFd, sub: &str, owner: (u32, u32)) -> Result<(), RuntimeError> {
    let mut dir = rustix::io::dup(base).map_err(|e| RuntimeError::from_io("dup", &e.into()))?;
    for part in sub.split('/').filter(|p| !p.is_empty()) {
        match rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(0o755)) {
            Ok(()) => {
                rustix::fs::chownat(
                    &dir,
                    part,
                    Some(rustix::fs::Uid::from_raw(owner.0)),
                    Some(rustix::fs::Gid::from_raw(owner.1)),
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|e| RuntimeError::from_io("chown of a subPath directory", &e.into()))?;
            }
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(RuntimeError::from_io(format!("making subPath directory {part}"), &e.into())),
        }
        dir = open_dir(part, Some(&dir), &format!("subPath {sub}"))?;
    }
    Ok(())
}

/// Opens every volume of `spec` for staging; named ones are made and mounted on the host
/// first. Runs in the supervisor, as host root, before it leaves the host's mount namespace.
pub fn open_all(dd: &DataDir, id: &SandboxId, spec: &SandboxSpec) -> Result<Vec<Opened>, RuntimeError> {
    let mut out = Vec::new();
    for v in &spec.volumes {
        let (base, owner) = match &v.source {
            VolumeSource::Host { path } => {
                let fd = open_dir(path.as_str(), None, &format!("volume {}: host path {path}", v.name))?;
                let st = rustix::fs::fstat(&fd).map_err(|e| RuntimeError::from_io("fstat", &e.into()))?;
                (fd, mapped_owner(st.st_uid, st.st_gid))
            }
            VolumeSource::Named { name, create, size_bytes, .. } => {
                let bytes =
                    size_bytes.or(spec.resources.workspace_bytes).unwrap_or(paddock_core::spec::DEFAULT_WORKSPACE);
                let (at, ids) = mount_named(dd, id, name, *create, bytes, spec.resources.workspace_inodes)?;
                let fd = open_dir(&at, None, &format!("volume {}: named volume {name}", v.name))?;
                (fd, Some((ids.uid, ids.gid)))
            }
        };
        let dir = match v.sub_path.as_deref().map(|s| s.trim_end_matches('/')) {
            None => base,
            Some(sub) => {
                if let (VolumeSource::Named { .. }, false, Some(owner)) = (&v.source, v.read_only, owner) {
                    make_sub_dirs(&base, sub, owner)?;
                }
                open_dir(sub, Some(&base), &format!("volume {}: subPath {sub}", v.name))?
            }
        };
        // Cloned here, in the host's mount namespace: a mount can only be copied from the
        // namespace it is in, and the supervisor leaves this one before it stages.
        let tree = paddock_sys::overlay::clone_dir(dir.as_fd())
            .map_err(|e| RuntimeError::System(format!("volume {}: {e}", v.name)))?;
        out.push(Opened { tree, owner });
    }
    Ok(out)
}

/// Top-level directories that may be replaced by a tmpfs of mount points even when the root
/// has files in them: homes the sandbox never sees from the host, and the places for mounting
/// things by hand, whose host contents are no business of a sandbox.
const SHADOWABLE: &[&str] = &["home", "root", "mnt", "media", "srv"];

/// Where each volume goes in the sandbox's view, and which top-level names must be made for
/// it: a mount path that exists in the root as a directory is mounted over; otherwise its
/// top-level directory must be new, empty in the root, or one of [`SHADOWABLE`], and becomes a
/// small read-only tmpfs holding only the mount points.
pub fn plan_targets(volumes: &[VolumeMount], source: &Path) -> Result<(Vec<OsString>, Vec<OsString>), RuntimeError> {
    let mut shadowed: Vec<OsString> = Vec::new();
    let mut extra: Vec<OsString> = Vec::new();
    for v in volumes {
        // Below a directory the sandbox gets fresh (/tmp), the mount point is made there.
        if paddock_core::volume::FRESH_DIRS.iter().any(|d| v.mount_path.starts_with(&format!("{d}/"))) {
            continue;
        }
        let parts = v.target_components();
        let exists = (1..=parts.len()).all(|n| {
            let p = source.join(parts[..n].join("/"));
            fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
        });
        let top = OsString::from(parts[0]);
        if exists && !shadowed.contains(&top) && !["home", "root"].contains(&parts[0]) {
            continue;
        }
        if shadowed.contains(&top) {
            continue;
        }
        let top_path = source.join(parts[0]);
        match fs::symlink_metadata(&top_path) {
            Err(e) if e.kind() == ErrorKind::NotFound => extra.push(top.clone()),
            Ok(m) if m.is_dir() => {
                let empty = fs::read_dir(&top_path).map(|mut d| d.next().is_none()).unwrap_or(false);
                if !empty && !SHADOWABLE.contains(&parts[0]) {
                    return Err(RuntimeError::InvalidArgument(format!(
                        "volume {}: {} is not a directory in the sandbox's root, and /{} holds files that a mount point there would hide: mount at an existing directory or under a new top-level directory such as /data",
                        v.name, v.mount_path, parts[0]
                    )));
                }
            }
            _ => {
                return Err(RuntimeError::InvalidArgument(format!(
                    "volume {}: /{} is not a directory in the sandbox's root: mount elsewhere, such as under /mnt or /data",
                    v.name, parts[0]
                )));
            }
        }
        shadowed.push(top);
    }
    Ok((shadowed, extra))
}

/// Stages the opened volumes below the sandbox's staging directory (on a scratch tmpfs of the
/// supervisor's private mount namespace): each an idmapped, nosuid, nodev mount, read-only
/// when asked.
pub fn stage(
    dd: &DataDir,
    id: &SandboxId,
    volumes: &[VolumeMount],
    opened: Vec<Opened>,
    host: (u32, u32),
) -> Result<Vec<VolumeBind>, RuntimeError> {
    let staging = dd.volume_staging(id);
    paddock_sys::mounts::mount_scratch(&staging)
        .map_err(|e| RuntimeError::System(format!("staging the volumes: {e}")))?;
    let mut out = Vec::new();
    for (i, (v, o)) in volumes.iter().zip(opened).enumerate() {
        let at = staging.join(i.to_string());
        fs::create_dir(&at).map_err(sys(format!("creating {}", at.display())))?;
        let userns = match o.owner {
            Some(owner) if owner != host => Some(
                paddock_sys::overlay::idmap_userns(owner, host)
                    .map_err(|e| RuntimeError::System(format!("volume {}: {e}", v.name)))?,
            ),
            _ => None,
        };
        let read_only = v.read_only || o.owner.is_none();
        paddock_sys::overlay::attach_tree(o.tree, &at, userns.as_ref(), read_only).map_err(|e| {
            RuntimeError::System(format!(
                "volume {}: mounting it failed ({e}); its filesystem may not support idmapped mounts",
                v.name
            ))
        })?;
        out.push(VolumeBind { staged: at, target: PathBuf::from(&v.mount_path), read_only });
    }
    Ok(out)
}

/// Drops the host's named-volume mounts from the calling supervisor's private mount namespace
/// (its staged copies stay), so a volume deleted later is not kept busy by sandboxes that
/// never used it.
pub fn forget_host_mounts(dd: &DataDir) {
    if let Ok(entries) = fs::read_dir(dd.volume_mounts()) {
        for e in entries.flatten() {
            let _ = rustix::mount::unmount(e.path(), rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// Detaches a sandbox's staged volume mounts and takes away its marks on the named volumes
/// its spec mounts.
pub fn unstage(dd: &DataDir, id: &SandboxId, spec: &SandboxSpec) {
    for v in &spec.volumes {
        if let VolumeSource::Named { name, .. } = &v.source {
            let _ = fs::remove_file(dd.volume(name).join("users").join(id.as_str()));
        }
    }
    let staging = dd.volume_staging(id);
    if let Ok(entries) = fs::read_dir(&staging) {
        for e in entries.flatten() {
            let _ = rustix::mount::unmount(e.path(), rustix::mount::UnmountFlags::DETACH);
        }
    }
    paddock_sys::mounts::unmount_scratch(&staging);
}

/// The sandboxes that mount named volume `name`: the marks their supervisors leave under the
/// volume's lock before their records exist and take away when they end. A mark whose sandbox
/// is gone (its start failed, or it was cleaned up after a crash) is dropped here.
fn users_of(dd: &DataDir, name: &str) -> Vec<SandboxId> {
    let Ok(marks) = fs::read_dir(dd.volume(name).join("users")) else { return Vec::new() };
    let mut out = Vec::new();
    for m in marks.flatten() {
        let Some(id) = m.file_name().to_str().and_then(|n| SandboxId::parse(n).ok()) else { continue };
        if dd.sandbox(&id).exists() {
            out.push(id);
        } else {
            let _ = fs::remove_file(m.path());
        }
    }
    out.sort();
    out
}

/// The named volumes of this data directory.
pub fn list(dd: &DataDir) -> Result<Vec<NamedVolume>, RuntimeError> {
    let entries = match fs::read_dir(dd.volumes()) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(sys("listing the volumes")(e)),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
        let image = dd.volume_image(&name);
        let Ok(meta) = fs::metadata(&image) else { continue };
        let at = dd.volume_mount(&name);
        let used_bytes = is_mount_point(&at)
            .then(|| rustix::fs::statvfs(&at).ok())
            .flatten()
            .map(|v| (v.f_blocks - v.f_bfree) * v.f_frsize);
        let created_unix_ms =
            fs::read_to_string(dd.volume(&name).join("created")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        let used_by = users_of(dd, &name);
        out.push(NamedVolume { name, size_bytes: meta.len(), used_bytes, created_unix_ms, used_by });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Removes named volume `name` and its files, unless a sandbox mounts it.
pub fn remove(dd: &DataDir, name: &str) -> Result<(), RuntimeError> {
    paddock_core::volume::validate_volume_name(name).map_err(|e| RuntimeError::InvalidArgument(e.message))?;
    let _lock = lock(dd, name)?;
    let dir = dd.volume(name);
    if !dir.exists() {
        return Err(RuntimeError::NotFound(format!("no named volume {name}: see `paddock volume ls`")));
    }
    let using: Vec<String> = users_of(dd, name).iter().map(SandboxId::to_string).collect();
    if !using.is_empty() {
        return Err(RuntimeError::Conflict(format!(
            "named volume {name} is mounted by sandbox {}: destroy {} first",
            using.join(", "),
            if using.len() == 1 { "it" } else { "them" }
        )));
    }
    let at = dd.volume_mount(name);
    if is_mount_point(&at) {
        rustix::mount::unmount(&at, rustix::mount::UnmountFlags::empty())
            .map_err(|e| RuntimeError::from_io(format!("unmounting {}", at.display()), &e.into()))?;
    }
    let _ = fs::remove_dir(&at);
    let ids = fs::read(dd.volume_identity(name)).ok().and_then(|b| serde_json::from_slice::<HostIds>(&b).ok());
    fs::remove_dir_all(&dir).map_err(sys(format!("removing {}", dir.display())))?;
    if let Some(ids) = ids {
        identity::release(dd, &ids);
    }
    let _ = fs::remove_file(dd.volume_lock(name));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ordinary_owners_are_mapped() {
        assert_eq!(mapped_owner(0, 0), None, "host root is never mapped");
        assert_eq!(mapped_owner(1, 4), None, "nor system users");
        assert_eq!(mapped_owner(1000, 1000), Some((1000, 1000)));
        assert_eq!(mapped_owner(1001, 0), None, "nor a system group");
        assert_eq!(mapped_owner(identity::BASE + 3, 1000), None, "nor a sandbox's identity");
        let legacy = crate::identity::HOST_ID_OFFSET + 1000;
        assert_eq!(mapped_owner(legacy, legacy), None, "nor the identity sandboxes once shared");
    }

    fn vol(at: &str) -> VolumeMount {
        VolumeMount {
            name: "v".into(),
            mount_path: at.into(),
            read_only: false,
            sub_path: None,
            source: VolumeSource::Host { path: "/x".into() },
        }
    }

    #[test]
    fn mount_points_are_existing_dirs_or_new_empty_top_levels() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir_all(root.join("mnt/host-stuff")).unwrap();
        fs::create_dir_all(root.join("usr/share/x")).unwrap();
        fs::create_dir_all(root.join("home/alice")).unwrap();
        let names = |v: Vec<OsString>| v.into_iter().map(|s| s.into_string().unwrap()).collect::<Vec<_>>();
        let (shadowed, extra) = plan_targets(&[vol("/mnt/data"), vol("/data/a"), vol("/usr/share/x")], root).unwrap();
        assert_eq!(names(shadowed), ["mnt", "data"]);
        assert_eq!(names(extra), ["data"]);
        let e = plan_targets(&[vol("/usr/share/new")], root).unwrap_err();
        assert!(e.to_string().contains("hide"), "{e}");
        let (shadowed, _) = plan_targets(&[vol("/home/user/data")], root).unwrap();
        assert_eq!(names(shadowed), ["home"], "homes are never the host's");
    }
}
