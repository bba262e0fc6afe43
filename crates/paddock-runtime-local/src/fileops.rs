//! File operations, executed inside the sandbox by a worker forked from its init.
//!
//! The worker runs as the sandbox user with the sandbox's mounts, seccomp filter and Landlock
//! ruleset, so every path — symlinks included — resolves in the sandbox's own view and can only
//! touch what the sandbox itself could. There is no host-side path checking to get wrong.

use std::fs::{self, File, Metadata};
use std::io::{self, ErrorKind};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use paddock_core::runtime::{FileErrorKind, FileKind, FileOp, FileReply, FileStat, RuntimeError};

use crate::protocol::FileCall;

/// Resolves a request path: absolute as given, relative from `/workspace`.
pub fn resolve(path: &str) -> Result<PathBuf, RuntimeError> {
    if path.is_empty() {
        return Err(file_err(FileErrorKind::InvalidPath, "empty path: give a path such as /workspace/file.txt".into()));
    }
    if path.contains('\0') {
        return Err(file_err(FileErrorKind::InvalidPath, format!("{path:?} contains a NUL byte")));
    }
    Ok(Path::new("/workspace").join(path))
}

fn file_err(kind: FileErrorKind, message: String) -> RuntimeError {
    RuntimeError::File { kind, message }
}

fn io_err(op: &str, path: &Path, e: io::Error) -> RuntimeError {
    let kind = match e.kind() {
        ErrorKind::NotFound => FileErrorKind::NotFound,
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => FileErrorKind::PermissionDenied,
        ErrorKind::AlreadyExists => FileErrorKind::AlreadyExists,
        ErrorKind::NotADirectory => FileErrorKind::NotADirectory,
        ErrorKind::IsADirectory => FileErrorKind::IsADirectory,
        ErrorKind::DirectoryNotEmpty => FileErrorKind::DirectoryNotEmpty,
        ErrorKind::InvalidInput | ErrorKind::InvalidFilename => FileErrorKind::InvalidPath,
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::FileTooLarge => FileErrorKind::NoSpace,
        _ => FileErrorKind::Other,
    };
    file_err(kind, format!("{op} {}: {e}", path.display()))
}

/// Whether the file's filesystem keeps its pages in the sandbox's memory: a tmpfs, or the
/// root's overlay, whose upper layer is a tmpfs in this runtime.
fn kept_in_memory(file: &File) -> bool {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const OVERLAYFS_SUPER_MAGIC: u64 = 0x794c_7630;
    rustix::fs::fstatfs(file).is_ok_and(|st| matches!(st.f_type.cast_unsigned(), TMPFS_MAGIC | OVERLAYFS_SUPER_MAGIC))
}

fn too_big_for_memory(p: &Path, room: crate::protocol::MemoryRoom) -> String {
    use paddock_core::units::format_bytes;
    format!(
        "write {}: the file needs more memory than the sandbox has left ({} free of its {} limit), so it was not written. Files in the root's writable layer, /tmp and a scratch workspace are kept in memory: give the sandbox more memory, or write to a thread's workspace or a volume, which are on disk",
        p.display(),
        format_bytes(room.free),
        format_bytes(room.limit)
    )
}

/// Set-uid and set-gid bits are never set through the file API: a set-id file in a sandbox
/// is one more way for its host identity to be borrowed, and no sandbox task needs one made
/// from outside.
fn without_set_id(mode: u32) -> u32 {
    mode & 0o1777
}

/// Runs one operation; `data` is the pipe file contents flow through for read and write.
pub fn run(call: &FileCall, data: Option<OwnedFd>) -> Result<FileReply, RuntimeError> {
    let op = match call {
        FileCall::Read { path } => {
            let p = resolve(path)?;
            // Non-blocking open, so a FIFO cannot hang the worker before we look at what it is.
            let mut file = fs::OpenOptions::new()
                .read(true)
                .custom_flags(o_nonblock())
                .open(&p)
                .map_err(|e| io_err("read", &p, e))?;
            let meta = file.metadata().map_err(|e| io_err("read", &p, e))?;
            if meta.is_dir() {
                return Err(file_err(
                    FileErrorKind::IsADirectory,
                    format!("read {}: is a directory: list it instead", p.display()),
                ));
            }
            // Devices and FIFOs never end (/dev/zero) or block: only regular files are read.
            require_regular("read", &p, &meta)?;
            let mut sink = File::from(data.ok_or_else(|| missing_data("read"))?);
            io::copy(&mut file, &mut sink).map_err(|e| io_err("read", &p, e))?;
            return Ok(FileReply::Stat(stat_of(&p, &meta)));
        }
        FileCall::Write { path, mode, room } => {
            let p = resolve(path)?;
            if let Some(parent) = p.parent() {
                fs::create_dir_all(parent).map_err(|e| io_err("create parent of", &p, e))?;
            }
            // What the file it replaces held is given back by the truncation below.
            let replaced = fs::symlink_metadata(&p).ok().filter(Metadata::is_file).map_or(0, |m| m.blocks() * 512);
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(without_set_id(mode.unwrap_or(0o644)))
                .custom_flags(o_nonblock())
                .open(&p)
                .map_err(|e| io_err("write", &p, e))?;
            require_regular("write", &p, &file.metadata().map_err(|e| io_err("write", &p, e))?)?;
            let mut source = File::from(data.ok_or_else(|| missing_data("write"))?);
            // A write that fails (its filesystem full, its data cut) leaves no partial file.
            let failed = |file: File, e: RuntimeError| {
                drop(file);
                let _ = fs::remove_file(&p);
                Err(e)
            };
            match room.filter(|_| kept_in_memory(&file)) {
                None => {
                    if let Err(e) = io::copy(&mut source, &mut file) {
                        return failed(file, io_err("write", &p, e));
                    }
                }
                Some(mut room) => {
                    room.free += replaced;
                    // Past what is free the memory cgroup's OOM killer would end a process
                    // (perhaps the sandbox's init) instead of the write failing.
                    let copied = match io::copy(&mut io::Read::take(&mut source, room.free + 1), &mut file) {
                        Ok(n) => n,
                        Err(e) => return failed(file, io_err("write", &p, e)),
                    };
                    if copied > room.free {
                        drop(file);
                        let _ = fs::remove_file(&p);
                        return Err(file_err(FileErrorKind::NoSpace, too_big_for_memory(&p, room)));
                    }
                }
            }
            if let Some(mode) = mode {
                fs::set_permissions(&p, fs::Permissions::from_mode(without_set_id(*mode)))
                    .map_err(|e| io_err("chmod", &p, e))?;
            }
            return stat(&p);
        }
        FileCall::Meta(op) => op,
    };
    match op {
        FileOp::List { path } => {
            let p = resolve(path)?;
            let mut entries = Vec::new();
            for entry in fs::read_dir(&p).map_err(|e| io_err("list", &p, e))? {
                let entry = entry.map_err(|e| io_err("list", &p, e))?;
                let child = entry.path();
                if let Ok(meta) = fs::symlink_metadata(&child) {
                    entries.push(stat_of(&child, &meta));
                }
            }
            entries.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(FileReply::List { entries })
        }
        FileOp::Stat { path } => stat(&resolve(path)?),
        FileOp::Mkdir { path, mode } => {
            let p = resolve(path)?;
            fs::create_dir_all(&p).map_err(|e| io_err("mkdir", &p, e))?;
            if let Some(mode) = mode {
                fs::set_permissions(&p, fs::Permissions::from_mode(without_set_id(*mode)))
                    .map_err(|e| io_err("chmod", &p, e))?;
            }
            stat(&p)
        }
        FileOp::Remove { path, recursive } => {
            let p = resolve(path)?;
            let meta = fs::symlink_metadata(&p).map_err(|e| io_err("remove", &p, e))?;
            let r = if !meta.is_dir() {
                fs::remove_file(&p)
            } else if *recursive {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_dir(&p)
            };
            r.map_err(|e| io_err("remove", &p, e))?;
            Ok(FileReply::Done)
        }
        FileOp::Move { from, to } => {
            let (f, t) = (resolve(from)?, resolve(to)?);
            if let Some(parent) = t.parent() {
                fs::create_dir_all(parent).map_err(|e| io_err("create parent of", &t, e))?;
            }
            fs::rename(&f, &t).map_err(|e| io_err("move", &f, e))?;
            stat(&t)
        }
        FileOp::Chmod { path, mode } => {
            let p = resolve(path)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(without_set_id(*mode)))
                .map_err(|e| io_err("chmod", &p, e))?;
            stat(&p)
        }
        // Nothing inside may change owners: the supervisor does it (`ownership`).
        FileOp::Chown { .. } => Err(RuntimeError::System("owners are changed by the supervisor, not inside".into())),
    }
}

fn o_nonblock() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits().cast_signed()
}

fn require_regular(op: &str, p: &Path, meta: &Metadata) -> Result<(), RuntimeError> {
    if meta.is_file() {
        return Ok(());
    }
    Err(file_err(
        FileErrorKind::InvalidPath,
        format!(
            "{op} {}: not a regular file (a device, FIFO or socket): only regular files can be transferred",
            p.display()
        ),
    ))
}

fn missing_data(op: &str) -> RuntimeError {
    RuntimeError::InvalidArgument(format!("a {op} needs a data stream, and none was attached"))
}

fn stat(p: &Path) -> Result<FileReply, RuntimeError> {
    let meta = fs::symlink_metadata(p).map_err(|e| io_err("stat", p, e))?;
    Ok(FileReply::Stat(stat_of(p, &meta)))
}

fn stat_of(p: &Path, meta: &Metadata) -> FileStat {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    FileStat {
        path: p.to_string_lossy().into_owned(),
        kind,
        size: meta.size(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        modified_unix_ms: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_start_at_the_workspace() {
        assert_eq!(resolve("a/b").unwrap(), Path::new("/workspace/a/b"));
        assert_eq!(resolve("/etc/x").unwrap(), Path::new("/etc/x"));
        assert!(matches!(resolve(""), Err(RuntimeError::File { kind: FileErrorKind::InvalidPath, .. })));
        assert!(matches!(resolve("a\0b"), Err(RuntimeError::File { kind: FileErrorKind::InvalidPath, .. })));
    }
}
