//! Where the local runtime keeps things on disk.
//!
//! ```text
//! <data>/sandboxes/<id>/record.json   what was created, by whom, when (written once ready)
//! <data>/sandboxes/<id>/sock          the supervisor's socket
//! <data>/sandboxes/<id>/image/        an image root: layers, upper tmpfs, overlay (mounted in
//!                                     the supervisor's own mount namespace only)
//! <data>/images/                      the image store (paddock-image), 0700
//! <data>/sandboxes/<id>/workspace/    `/workspace` of a sandbox without a persistent one or a cap
//! <data>/sandboxes/<id>/supervisor.log
//! <data>/gone/<id>/                   a destroyed sandbox's directory while its supervisor
//!                                     removes the rest after answering (see `remains`)
//! <data>/workspaces/<name>/files/     a thread's persistent `/workspace` (or files.img, size-capped)
//! <data>/workspaces/<name>/thread.json, sandbox   its thread id; the id of its live sandbox
//! <data>/workspaces/<name>.lock       serialises acquire/release/destroy of one workspace
//! <data>/workspaces/<name>/identity   the host uid/gid the workspace's files belong to
//! <data>/volumes/<name>/files.img     a named volume (ext4, size-capped), and its identity
//! <data>/volumes/.locks/<name>        serialises making, mounting and removing one volume
//! <data>/volumes/<name>/users/<id>    a sandbox that mounts it (made before its record exists)
//! <data>/volume-mounts/<name>/        where a named volume is mounted on the host (0700;
//!                                     supervisors drop these from their own mount namespaces)
//! <data>/sandboxes/<id>/volumes/<i>   a sandbox's staged volume mounts (supervisor's namespace)
//! <data>/skeletons/<hash>/           mount points that become a sandbox's `/`, one per
//!                                     top-level listing of a root, shared (see `shared_skeleton`)
//! <data>/ids/<slot>                   a host identity in use, and by whom (see `identity`)
//! <data>/.paddock-data-dir            marks a data directory, which every sandbox's root hides (see `registry`)
//! ```

use std::path::{Path, PathBuf};

use paddock_core::runtime::SandboxId;

/// The root of all local-runtime state.
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

/// The data directory used when none is given: `$PADDOCK_DATA_DIR`, else `/var/lib/paddock`.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("PADDOCK_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/lib/paddock"))
}

/// Where a sandbox's image root is mounted, for its directory wherever it is.
pub fn image_mounts_in(sandbox_dir: &Path) -> PathBuf {
    sandbox_dir.join("image")
}

/// Longest path a Unix socket address can hold.
const SUN_PATH_MAX: usize = 107;

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn sandboxes(&self) -> PathBuf {
        self.root.join("sandboxes")
    }
    pub fn sandbox(&self, id: &SandboxId) -> PathBuf {
        self.sandboxes().join(id.as_str())
    }
    pub fn record(&self, id: &SandboxId) -> PathBuf {
        self.sandbox(id).join("record.json")
    }
    pub fn socket(&self, id: &SandboxId) -> PathBuf {
        self.sandbox(id).join("sock")
    }
    /// The image store.
    pub fn images(&self) -> PathBuf {
        self.root.join("images")
    }

    /// Where an image root's layers, upper layer and overlay are mounted (in the supervisor's
    /// own mount namespace only).
    pub fn image_mounts(&self, id: &SandboxId) -> PathBuf {
        image_mounts_in(&self.sandbox(id))
    }
    /// Destroyed sandboxes whose remains are still being removed (same filesystem as
    /// `sandboxes/`, so that a sandbox's directory moves here in one rename).
    pub fn gone_dir(&self) -> PathBuf {
        self.root.join("gone")
    }
    pub fn gone(&self, id: &SandboxId) -> PathBuf {
        self.gone_dir().join(id.as_str())
    }
    /// Whether a destroyed sandbox's supervisor is still removing it (or died doing so).
    pub fn anything_gone(&self) -> bool {
        std::fs::read_dir(self.gone_dir()).is_ok_and(|mut d| d.next().is_some())
    }
    /// Shared root skeletons (`paddock_sys::mounts::shared_skeleton`).
    pub fn skeletons(&self) -> PathBuf {
        self.root.join("skeletons")
    }
    pub fn scratch_workspace(&self, id: &SandboxId) -> PathBuf {
        self.sandbox(id).join("workspace")
    }
    /// Where the supervisor mounts an image-backed workspace, in its private mount namespace.
    pub fn workspace_mount(&self, id: &SandboxId) -> PathBuf {
        self.sandbox(id).join("wsmnt")
    }
    pub fn log(&self, id: &SandboxId) -> PathBuf {
        self.sandbox(id).join("supervisor.log")
    }
    pub fn workspaces(&self) -> PathBuf {
        self.root.join("workspaces")
    }
    pub fn workspace(&self, name: &str) -> PathBuf {
        self.workspaces().join(name)
    }
    pub fn workspace_files(&self, name: &str) -> PathBuf {
        self.workspace(name).join("files")
    }
    /// The ext4 image of a size-capped persistent workspace (instead of `files/`).
    pub fn workspace_image(&self, name: &str) -> PathBuf {
        self.workspace(name).join("files.img")
    }
    pub fn workspace_identity(&self, name: &str) -> PathBuf {
        self.workspace(name).join("identity")
    }
    /// Host identities in use, one file per slot.
    pub fn ids(&self) -> PathBuf {
        self.root.join("ids")
    }
    pub fn volumes(&self) -> PathBuf {
        self.root.join("volumes")
    }
    pub fn volume(&self, name: &str) -> PathBuf {
        self.volumes().join(name)
    }
    pub fn volume_image(&self, name: &str) -> PathBuf {
        self.volume(name).join("files.img")
    }
    pub fn volume_identity(&self, name: &str) -> PathBuf {
        self.volume(name).join("identity")
    }
    /// In a directory of its own: a volume's name may end in `.lock`, never start with `.`.
    pub fn volume_lock(&self, name: &str) -> PathBuf {
        self.volumes().join(".locks").join(name)
    }
    pub fn volume_mounts(&self) -> PathBuf {
        self.root.join("volume-mounts")
    }
    pub fn volume_mount(&self, name: &str) -> PathBuf {
        self.volume_mounts().join(name)
    }
    /// Where the supervisor stages a sandbox's volume mounts (in its own mount namespace).
    pub fn volume_staging(&self, id: &SandboxId) -> PathBuf {
        self.sandbox(id).join("volumes")
    }
    pub fn workspace_lock(&self, name: &str) -> PathBuf {
        self.workspaces().join(format!("{name}.lock"))
    }

    /// Checks that the sandbox's own host identity (an unprivileged uid, see `HOST_ID_OFFSET`)
    /// can reach its workspace and root skeleton under this directory: every ancestor must be
    /// searchable by others.
    pub fn check_searchable_by_sandboxes(&self) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let real = std::fs::canonicalize(&self.root).map_err(|e| format!("{}: {e}", self.root.display()))?;
        for dir in real.ancestors().skip(1) {
            let mode = std::fs::metadata(dir).map(|m| m.permissions().mode()).unwrap_or(0);
            if mode & 0o001 == 0 {
                return Err(format!(
                    "{} (mode {:o}) is not searchable by others, so sandboxes cannot reach their files under the data directory {}: chmod o+x it, or choose a data directory like /var/lib/paddock",
                    dir.display(),
                    mode & 0o7777,
                    self.root.display()
                ));
            }
        }
        Ok(())
    }

    /// Checks that sockets under this directory fit in a socket address.
    pub fn check_socket_path_fits(&self) -> Result<(), String> {
        let probe = self.socket(&SandboxId::from_random([0; 6]));
        let len = probe.as_os_str().len();
        if len > SUN_PATH_MAX {
            return Err(format!(
                "the data directory {} is too deep: socket paths under it would be {len} bytes, over the {SUN_PATH_MAX}-byte limit; choose a shorter --data-dir",
                self.root.display()
            ));
        }
        Ok(())
    }
}

/// Writes `bytes` to `path` (replacing it) readable by root only: every file Paddock keeps in
/// a data directory is 0600, whatever the umask, so no host user reads a record, an identity or
/// a workspace's thread id even where a directory above lets them pass.
pub fn write_private(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    // An existing file keeps its mode on open: make it private too.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes.as_ref())
}
