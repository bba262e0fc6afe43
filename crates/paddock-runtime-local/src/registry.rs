//! Every Paddock data directory on this host, so that each sandbox's root hides all of them, not
//! only its own instance's.
//!
//! A sandbox's root is the host's `/` or any host directory, so it may contain the data
//! directory of another instance (another `--data-dir`, a test's, an old one): its database,
//! keys, and other tenants' workspaces. We mask rather than refuse: `host` contains every data
//! directory by definition, so refusing would make the host root unusable whenever two
//! instances exist, and a mask is one empty read-only tmpfs per data directory in the root.
//!
//! Data directories are found through a host-wide registry rather than by searching the root,
//! which would mean walking the whole host filesystem on every create. Each instance appends its
//! data directory when it starts (`LocalRuntime::new`) and writes a marker file into it; entries
//! whose marker is gone are dropped at the next registration, so directories of removed
//! instances (tests' temporary ones) do not pile up. The registry lives on persistent storage,
//! not `/run`: after a reboot, the data directory of an instance that has not started again
//! must still be hidden from the sandboxes of those that have.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The host-wide list of data directories, one absolute canonical path a line.
pub const REGISTRY: &str = "/var/lib/paddock-data-dirs";

/// The file that marks a directory as a Paddock data directory.
pub const MARKER: &str = ".paddock-data-dir";

const MARKER_TEXT: &str = "This directory holds Paddock's state. Every sandbox's root hides it \
(see the registry /var/lib/paddock-data-dirs); do not remove this file while the directory is in use.\n";

/// Marks `data_dir` (which exists) and adds it to the registry at `registry`. Fails if either
/// cannot be written: an unregistered data directory would be visible to other instances'
/// sandboxes.
pub fn register(registry: &Path, data_dir: &Path) -> Result<(), String> {
    let real =
        fs::canonicalize(data_dir).map_err(|e| format!("resolving the data directory {}: {e}", data_dir.display()))?;
    let marker = real.join(MARKER);
    if !marker.is_file() {
        // Private like every file of the data directory; only root (registration) reads it.
        let write = || -> std::io::Result<()> {
            let mut f = fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&marker)?;
            f.write_all(MARKER_TEXT.as_bytes())
        };
        write().map_err(|e| format!("marking the data directory ({}): {e}", marker.display()))?;
    }
    let fail = |what: &str, path: &Path, e: std::io::Error| {
        format!(
            "{what} {}: {e}; Paddock lists every data directory there so that no sandbox sees another instance's state: run as root, with {} writable",
            path.display(),
            registry.parent().unwrap_or(Path::new("/")).display()
        )
    };
    if let Some(parent) = registry.parent() {
        fs::create_dir_all(parent).map_err(|e| fail("creating", parent, e))?;
    }
    // A lock file of its own: the registry itself is replaced by rename, so that a supervisor
    // reading it without a lock never sees half a list.
    let lock_path = with_suffix(registry, ".lock");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| fail("opening", &lock_path, e))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| fail("locking", &lock_path, e.into()))?;
    let listed = read(registry);
    let mut dirs: Vec<PathBuf> = listed.iter().filter(|d| d.join(MARKER).is_file()).cloned().collect();
    if !dirs.contains(&real) {
        dirs.push(real);
    }
    // Every CLI call registers its data directory: rewrite (and fsync) only when the list changes.
    if dirs == listed {
        return Ok(());
    }
    let mut text = String::new();
    for d in &dirs {
        // Paths with a newline cannot be listed one per line; such a data directory is refused
        // rather than silently left out.
        let s = d.to_str().filter(|s| !s.contains('\n')).ok_or_else(|| {
            format!("the data directory {} has a name that cannot be registered: choose a plain path", d.display())
        })?;
        text.push_str(s);
        text.push('\n');
    }
    let tmp = with_suffix(registry, ".tmp");
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, registry)
    };
    write().map_err(|e| fail("writing", registry, e))
}

/// The registered data directories. A missing or unreadable registry lists none; the caller
/// still hides its own data directory.
pub fn read(registry: &Path) -> Vec<PathBuf> {
    fs::read_to_string(registry).unwrap_or_default().lines().filter(|l| l.starts_with('/')).map(PathBuf::from).collect()
}

/// The registered data directories that still are ones (their marker is there): a removed
/// instance's path may since hold anything, which must be neither hidden nor refused as a root.
pub fn live(registry: &Path) -> Vec<PathBuf> {
    read(registry).into_iter().filter(|d| d.join(MARKER).is_file()).collect()
}

/// Every Paddock data directory on the host: the live registered ones, and `own` (resolved)
/// even if the registry cannot be read.
pub fn all_data_dirs(own: &Path) -> Vec<PathBuf> {
    let mut dirs = live(Path::new(REGISTRY));
    dirs.extend(std::fs::canonicalize(own));
    dirs
}

/// Where each of `data_dirs` (canonical) appears inside a sandbox whose root is `source`
/// (canonical): the paths to mask, as seen from inside.
pub fn masks_within(source: &Path, data_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = data_dirs
        .iter()
        .filter_map(|d| d.strip_prefix(source).ok())
        .filter(|rel| !rel.as_os_str().is_empty())
        .map(|rel| Path::new("/").join(rel))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_marks_lists_once_and_drops_removed_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let registry = tmp.path().join("reg/data-dirs");
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        register(&registry, &a).unwrap();
        register(&registry, &b).unwrap();
        let inode = || std::os::unix::fs::MetadataExt::ino(&fs::metadata(&registry).unwrap());
        let before = inode();
        register(&registry, &a).unwrap();
        assert_eq!(inode(), before, "an unchanged list is not rewritten");
        let (ra, rb) = (fs::canonicalize(&a).unwrap(), fs::canonicalize(&b).unwrap());
        assert_eq!(read(&registry), vec![ra.clone(), rb.clone()]);
        assert!(a.join(MARKER).is_file());
        fs::remove_dir_all(&b).unwrap();
        assert_eq!(live(&registry), vec![ra.clone()], "a removed data directory is not live");
        register(&registry, &a).unwrap();
        assert_eq!(read(&registry), vec![ra]);
    }

    #[test]
    fn masks_are_relative_to_the_root_and_only_for_directories_inside_it() {
        let dirs = vec![
            PathBuf::from("/var/lib/paddock"),
            PathBuf::from("/srv/images/x/var/data"),
            PathBuf::from("/srv/images/xy/data"),
            PathBuf::from("/srv/images/x"),
        ];
        assert_eq!(
            masks_within(Path::new("/"), &dirs),
            ["/srv/images/x", "/srv/images/x/var/data", "/srv/images/xy/data", "/var/lib/paddock"].map(PathBuf::from)
        );
        assert_eq!(masks_within(Path::new("/srv/images/x"), &dirs), vec![PathBuf::from("/var/data")]);
        assert!(masks_within(Path::new("/opt"), &dirs).is_empty());
    }
}
