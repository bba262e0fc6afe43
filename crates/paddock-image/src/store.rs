//! The content-addressed image store.
//!
//! Layout under the store directory (mode 0700: image files keep their owners, so only root
//! may reach them):
//!
//! - `blobs/sha256/<hex>`: manifests and configs, each verified against its digest.
//! - `layers/<hex>/`: one unpacked layer per `diff_id` (digest of its uncompressed tar), with
//!   the tree in `root/` and its size in `meta.json`. Compressed layer blobs are not kept: the
//!   unpacked tree is what sandboxes use.
//! - `private.json`: content (a config blob by its digest, a layer by its `diff_id`) that only
//!   pulls with registry credentials have fetched → the digests of those credentials. Absent:
//!   public. A pull by anyone else fetches such content again from its own registry and checks
//!   it before the stored copy serves it (knowing a digest is not having the content).
//! - `refs.json`: name → manifest digest. `leases/<holder>`: the digest a holder (a sandbox id)
//!   uses, one small file each (stores before 2026-12 kept them all in `leases.json`, still read;
//!   binaries from before do not see lease files, so none may prune a store newer ones use).
//! - `locks/`: `gc.lock` (pulls and imports share it, prune takes it alone), `meta.lock`
//!   (edits of `refs.json`, `private.json` and of the leases) and one lock per layer being fetched.
//! - `tmp/`: work in progress. Everything is published by renaming out of `tmp/`, so what is
//!   in `blobs/` and `layers/` is complete; a killed pull leaves only `tmp/` entries, which the
//!   next holder of the same layer lock (or prune) removes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{ImageError, Result};
use crate::oci::{ConfigFile, Manifest};
use crate::reference::Ref;
use crate::unpack;

/// An image in the store, ready to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The normalized reference it was found by.
    pub name: String,
    /// Digest of its (platform-specific) manifest.
    pub digest: String,
    /// Unpacked layer directories, lowest first.
    pub layers: Vec<PathBuf>,
    pub config: ImageConfig,
}

/// What of the image's config a sandbox applies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub user: Option<String>,
}

/// One image as `paddock image ls` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ImageInfo {
    /// Names (tags or digest references) pointing at it; empty when only a lease keeps it.
    pub names: Vec<String>,
    pub digest: String,
    /// Unpacked layers plus manifest and config; a layer shared by two images counts in both.
    pub size: u64,
    /// The image's own creation time from its config (RFC 3339), when it says.
    pub created: Option<String>,
    /// When it was last pulled or imported here.
    pub stored_unix_ms: u64,
    pub layers: usize,
    /// Sandboxes using it.
    pub holders: Vec<String>,
}

/// What `prune` removed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    /// Manifest digests no longer stored.
    pub images: Vec<String>,
    pub layers: usize,
    pub blobs: usize,
    pub temp_entries: usize,
    /// Bytes of layers and blobs removed (temporary files not counted).
    pub freed_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RefEntry {
    pub digest: String,
    #[serde(default)]
    pub stored_unix_ms: u64,
    /// Pulled with registry credentials: digests of each set that pulled it
    /// (`credentials_digest`). Only a caller with one of them finds it in the store; anyone
    /// else goes to the registry, which decides. Empty for an image the registry served
    /// without credentials.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub private_to: Vec<String>,
}

/// A one-way digest of registry credentials (never the credentials themselves on disk).
pub(crate) fn credentials_digest(auth: &crate::Credentials) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"paddock image credentials\0");
    h.update(auth.username.as_bytes());
    h.update(b"\0");
    h.update(auth.password.as_bytes());
    format!("{:x}", h.finalize())
}

impl RefEntry {
    /// Whether a caller with `auth` may use the stored image without asking its registry.
    fn open_to(&self, auth: Option<&crate::Credentials>) -> bool {
        self.private_to.is_empty() || auth.is_some_and(|a| self.private_to.contains(&credentials_digest(a)))
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct LayerMeta {
    diff_id: String,
    size: u64,
}

/// Content only private pulls fetched (see the module's comment).
const PRIVATE: &str = "private.json";

/// The store; cheap to clone (a path), and safe to use from several processes at once.
#[derive(Debug, Clone)]
pub struct Store {
    pub(crate) root: PathBuf,
    /// What pulls and imports through this handle may unpack.
    pub(crate) limits: crate::Limits,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis().try_into().unwrap_or(u64::MAX)).unwrap_or(0)
}

/// A name unique to this process and call, for files in `tmp/` nobody else writes.
pub(crate) fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}-{}-{tag}", std::process::id(), now_ms(), N.fetch_add(1, Ordering::Relaxed))
}

pub(crate) fn hex_of(digest: &str) -> Result<&str> {
    crate::reference::parse_digest(digest).map_err(ImageError::Corrupt)?;
    Ok(&digest["sha256:".len()..])
}

pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Whether `holder` can name a lease file: a sandbox id (letters, digits, `-` and `_`), never
/// a path.
fn valid_holder(holder: &str) -> bool {
    !holder.is_empty()
        && holder.len() <= 128
        && holder.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !holder.starts_with('-')
}

/// Where stores before per-holder lease files kept every lease.
const LEGACY_LEASES: &str = "leases.json";

/// A held file lock; dropping it (or the process dying) releases it.
pub(crate) struct Lock(#[allow(dead_code)] File);

impl Store {
    /// Opens the store at `dir`, creating it (mode 0700) if needed. The caller passes
    /// `<data-dir>/images`.
    pub fn open(dir: &Path) -> Result<Store> {
        let io = |what: &str, e| ImageError::io(format!("{what} {}", dir.display()), e);
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| io("creating the image store", e))?;
        // An existing directory keeps its mode under mkdir; image files keep their owners from
        // the tarballs, so no one but root may traverse into them.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|e| io("restricting", e))?;
        for sub in ["blobs/sha256", "layers", "leases", "locks", "tmp"] {
            fs::create_dir_all(dir.join(sub)).map_err(|e| io("creating the image store", e))?;
        }
        Ok(Store { root: dir.to_path_buf(), limits: crate::Limits::default() })
    }

    /// The same store, with pulls and imports bounded by `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: crate::Limits) -> Store {
        self.limits = limits;
        self
    }

    /// What all stored layers unpacked to (holes included), read from their metadata.
    fn layers_bytes(&self) -> u64 {
        let Ok(rd) = fs::read_dir(self.root.join("layers")) else { return 0 };
        rd.filter_map(|e| e.ok())
            .filter_map(|e| fs::read(e.path().join("meta.json")).ok())
            .filter_map(|b| serde_json::from_slice::<LayerMeta>(&b).ok())
            .map(|m| m.size)
            .sum()
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    pub(crate) fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.root.join("blobs/sha256").join(hex_of(digest)?))
    }

    pub(crate) fn layer_dir(&self, diff_id: &str) -> Result<PathBuf> {
        Ok(self.root.join("layers").join(hex_of(diff_id)?))
    }

    pub(crate) fn tmp(&self, name: &str) -> PathBuf {
        self.root.join("tmp").join(name)
    }

    pub(crate) fn has_layer(&self, diff_id: &str) -> Result<bool> {
        Ok(self.layer_dir(diff_id)?.join("meta.json").exists())
    }

    /// Takes a named lock, waiting for it; blocking, so async callers run it off the runtime.
    pub(crate) fn lock(&self, name: &str, exclusive: bool) -> Result<Lock> {
        let path = self.root.join("locks").join(name);
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| ImageError::io(format!("opening lock {}", path.display()), e))?;
        let r = if exclusive { f.lock() } else { f.lock_shared() };
        r.map_err(|e| ImageError::io(format!("locking {}", path.display()), e))?;
        Ok(Lock(f))
    }

    /// Stores `bytes` as the blob `digest` after checking that they are.
    pub(crate) fn write_blob(&self, digest: &str, bytes: &[u8]) -> Result<()> {
        let actual = sha256_digest(bytes);
        if actual != digest {
            return Err(ImageError::Corrupt(format!(
                "content that should be {digest} has digest {actual}; the source's copy is damaged, pull or import again from an intact source"
            )));
        }
        let dest = self.blob_path(digest)?;
        if dest.exists() {
            return Ok(());
        }
        let tmp = self.tmp(&unique("blob"));
        self.write_atomic(&tmp, &dest, bytes)
    }

    fn write_atomic(&self, tmp: &Path, dest: &Path, bytes: &[u8]) -> Result<()> {
        let r = (|| -> io::Result<()> {
            let mut f = File::create(tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            fs::rename(tmp, dest)
        })();
        if let Err(e) = r {
            let _ = fs::remove_file(tmp);
            return Err(ImageError::io(format!("writing {}", dest.display()), e));
        }
        Ok(())
    }

    pub(crate) fn read_blob(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        let path = self.blob_path(digest)?;
        match fs::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ImageError::io(format!("reading {}", path.display()), e)),
        }
    }

    fn read_json<T: for<'de> Deserialize<'de> + Default>(&self, file: &str) -> Result<T> {
        let path = self.root.join(file);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                ImageError::Corrupt(format!("{} is not valid JSON ({e}); restore or delete it", path.display()))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(T::default()),
            Err(e) => Err(ImageError::io(format!("reading {}", path.display()), e)),
        }
    }

    fn write_json<T: Serialize>(&self, file: &str, value: &T) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(value).map_err(|e| ImageError::Io(e.to_string()))?;
        self.write_atomic(&self.tmp(&unique(file)), &self.root.join(file), &bytes)
    }

    pub(crate) fn refs(&self) -> Result<BTreeMap<String, RefEntry>> {
        self.read_json("refs.json")
    }

    /// Holder → digest, of the lease files and the old `leases.json`. A lease file with no
    /// digest in it (its writer died mid-write, before the create it belonged to went on) holds
    /// nothing.
    fn leases(&self) -> Result<BTreeMap<String, String>> {
        let mut leases: BTreeMap<String, String> = self.read_json(LEGACY_LEASES)?;
        let dir = self.root.join("leases");
        let io = |e| ImageError::io(format!("reading {}", dir.display()), e);
        for entry in fs::read_dir(&dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            // Only files this store wrote count: anything else put there holds nothing.
            let Some(holder) = entry.file_name().into_string().ok().filter(|h| valid_holder(h)) else { continue };
            if let Ok(digest) = fs::read_to_string(entry.path())
                && hex_of(digest.trim()).is_ok()
            {
                leases.insert(holder, digest.trim().to_owned());
            }
        }
        Ok(leases)
    }

    /// A holder's lease file. Holders are sandbox ids; anything that could leave the
    /// directory is refused.
    fn lease_path(&self, holder: &str) -> Result<PathBuf> {
        if !valid_holder(holder) {
            return Err(ImageError::InvalidReference(format!(
                "lease holder {holder:?} is not a sandbox id (letters, digits, '-' and '_')"
            )));
        }
        Ok(self.root.join("leases").join(holder))
    }

    /// Whether stored content `key` (a config digest or a layer's `diff_id`) may serve a pull
    /// by `principal` (`credentials_digest` of a private pull's credentials; `None`: public)
    /// without its registry: it is public, or these credentials fetched it before.
    pub(crate) fn open_to(&self, key: &str, principal: Option<&str>) -> Result<bool> {
        let _meta = self.lock("meta.lock", false)?;
        let private: BTreeMap<String, Vec<String>> = self.read_json(PRIVATE)?;
        Ok(private.get(key).is_none_or(|who| principal.is_some_and(|p| who.iter().any(|w| w == p))))
    }

    /// Before a private pull stores content `key` that is not there yet: it is never public,
    /// not even between being stored and the pull's end.
    pub(crate) fn claim(&self, key: &str, principal: &str) -> Result<()> {
        self.edit_private(key, |who| {
            let mut who = who.unwrap_or_default();
            if !who.iter().any(|w| w == principal) {
                who.push(principal.to_string());
            }
            Some(who)
        })
    }

    /// After a pull fetched `key` from its own registry and checked it: the stored copy serves
    /// `principal` from now on (everyone, for a public pull).
    pub(crate) fn grant(&self, key: &str, principal: Option<&str>) -> Result<()> {
        match principal {
            Some(p) => self.claim(key, p),
            None => self.edit_private(key, |_| None),
        }
    }

    fn edit_private(&self, key: &str, edit: impl FnOnce(Option<Vec<String>>) -> Option<Vec<String>>) -> Result<()> {
        let _meta = self.lock("meta.lock", true)?;
        let mut private: BTreeMap<String, Vec<String>> = self.read_json(PRIVATE)?;
        let before = private.get(key).cloned();
        match edit(private.remove(key)) {
            Some(who) => private.insert(key.to_string(), who),
            None => None,
        };
        if private.get(key) == before.as_ref() {
            return Ok(());
        }
        self.write_json(PRIVATE, &private)
    }

    /// Records that `name` is `digest`, pulled with `auth` (or imported or served without
    /// credentials: `None`, which makes it public).
    pub(crate) fn set_ref(&self, name: &str, digest: &str, auth: Option<&crate::Credentials>) -> Result<()> {
        let _meta = self.lock("meta.lock", true)?;
        let mut refs = self.refs()?;
        let mut private_to = match (auth, refs.get(name)) {
            (None, _) => Vec::new(),
            // Stored public once, it stays public: the registry served it without credentials.
            (Some(_), Some(old)) if old.digest == digest && old.private_to.is_empty() => {
                return self.write_ref(&mut refs, name, digest, Vec::new());
            }
            (Some(_), Some(old)) if old.digest == digest => old.private_to.clone(),
            (Some(_), _) => Vec::new(),
        };
        if let Some(a) = auth {
            let d = credentials_digest(a);
            if !private_to.contains(&d) {
                private_to.push(d);
            }
        }
        self.write_ref(&mut refs, name, digest, private_to)
    }

    fn write_ref(
        &self,
        refs: &mut BTreeMap<String, RefEntry>,
        name: &str,
        digest: &str,
        private_to: Vec<String>,
    ) -> Result<()> {
        refs.insert(name.to_string(), RefEntry { digest: digest.to_string(), stored_unix_ms: now_ms(), private_to });
        self.write_json("refs.json", &*refs)
    }

    pub(crate) fn parse_manifest(&self, digest: &str) -> Result<Manifest> {
        let bytes = self.read_blob(digest)?.ok_or_else(|| {
            ImageError::NotFound(format!("manifest {digest} is not in the store; pull the image again"))
        })?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ImageError::Corrupt(format!("stored manifest {digest} does not parse ({e}); pull the image again"))
        })
    }

    pub(crate) fn parse_config(&self, digest: &str) -> Result<ConfigFile> {
        let bytes = self.read_blob(digest)?.ok_or_else(|| {
            ImageError::NotFound(format!("image config {digest} is not in the store; pull the image again"))
        })?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ImageError::Corrupt(format!("image config {digest} does not parse ({e}); pull the image again"))
        })
    }

    /// The image a manifest digest describes, when all of it is stored.
    pub(crate) fn load(&self, name: &str, digest: &str) -> Result<Image> {
        let manifest = self.parse_manifest(digest)?;
        let config_digest = manifest
            .config
            .as_ref()
            .map(|c| c.digest.clone())
            .ok_or_else(|| ImageError::Corrupt(format!("manifest {digest} names no config")))?;
        let config = self.parse_config(&config_digest)?;
        let mut layers = Vec::new();
        for diff_id in &config.rootfs.diff_ids {
            if !self.has_layer(diff_id)? {
                return Err(ImageError::NotFound(format!(
                    "{name}: layer {diff_id} is not in the store (a pull did not finish); pull the image again"
                )));
            }
            layers.push(self.layer_dir(diff_id)?.join("root"));
        }
        let c = config.config.unwrap_or_default();
        Ok(Image {
            name: name.to_string(),
            digest: digest.to_string(),
            layers,
            config: ImageConfig {
                env: c.env.unwrap_or_default(),
                working_dir: c.working_dir.filter(|w| !w.is_empty()),
                entrypoint: c.entrypoint.unwrap_or_default(),
                cmd: c.cmd.unwrap_or_default(),
                user: c.user.filter(|u| !u.is_empty()),
            },
        })
    }

    /// The stored image `reference` names, without touching the network, whoever pulled it
    /// (the operator's view). A digest reference also finds an image pulled by tag from the
    /// same repository.
    pub fn lookup(&self, reference: &str) -> Result<Option<Image>> {
        self.find(reference, |_| true)
    }

    /// As [`Store::lookup`], for a caller holding `auth`: an image pulled with registry
    /// credentials is found only with the same credentials. Anyone else must pull, and so
    /// show the registry credentials it accepts (the layers are not fetched again).
    pub fn lookup_for(&self, reference: &str, auth: Option<&crate::Credentials>) -> Result<Option<Image>> {
        self.find(reference, |e| e.open_to(auth))
    }

    fn find(&self, reference: &str, open: impl Fn(&RefEntry) -> bool) -> Result<Option<Image>> {
        let r = Ref::parse(reference)?;
        let name = r.to_string();
        let refs = self.refs()?;
        let digest = match refs.get(&name) {
            Some(e) if open(e) => Some(e.digest.clone()),
            Some(_) => None,
            None => r.digest.clone().filter(|d| {
                refs.iter().any(|(n, e)| {
                    &e.digest == d && open(e) && Ref::parse(n).is_ok_and(|o| o.repo_name() == r.repo_name())
                })
            }),
        };
        match digest {
            None => Ok(None),
            Some(d) => match self.load(&name, &d) {
                Ok(img) => Ok(Some(img)),
                Err(ImageError::NotFound(_)) => Ok(None),
                Err(e) => Err(e),
            },
        }
    }

    /// Records that `holder` (a sandbox id) uses `image` until [`Store::release`]; `prune`
    /// and `remove` leave a held image alone. A holder holds one image; leasing again replaces.
    ///
    /// Every create and destroy leases and releases, so a lease is one small file of its own,
    /// written without an fsync: leases only matter while the host is up (a host that lost
    /// power runs no sandbox after), and rewriting one shared file by rename made ext4 flush
    /// it on every create (about a quarter of a millisecond).
    pub fn lease(&self, holder: &str, image: &Image) -> Result<()> {
        let path = self.lease_path(holder)?;
        let _meta = self.lock("meta.lock", true)?;
        // Prune holds meta.lock while it deletes, so an image still whole here stays whole.
        self.check_whole(image)?;
        let r = fs::write(&path, image.digest.as_bytes());
        if let Err(e) = r {
            let _ = fs::remove_file(&path);
            return Err(ImageError::io(format!("writing {}", path.display()), e));
        }
        Ok(())
    }

    /// Whether every part of `image` (as [`Store::lookup`] found it) is still stored.
    fn check_whole(&self, image: &Image) -> Result<()> {
        let missing = !self.blob_path(&image.digest)?.exists()
            || image.layers.iter().any(|l| !l.parent().is_some_and(|d| d.join("meta.json").exists()));
        if missing {
            return Err(ImageError::NotFound(format!(
                "{}: part of the image was pruned meanwhile; pull the image again",
                image.name
            )));
        }
        Ok(())
    }

    /// Ends `holder`'s lease; releasing what is not held is fine.
    pub fn release(&self, holder: &str) -> Result<()> {
        let _meta = self.lock("meta.lock", true)?;
        // A holder of the old `leases.json` may have any name; only a lease file needs a safe one.
        if valid_holder(holder) {
            let path = self.root.join("leases").join(holder);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(ImageError::io(format!("removing {}", path.display()), e)),
            }
        }
        if self.root.join(LEGACY_LEASES).exists() {
            let mut legacy: BTreeMap<String, String> = self.read_json(LEGACY_LEASES)?;
            if legacy.remove(holder).is_some() {
                self.write_json(LEGACY_LEASES, &legacy)?;
            }
        }
        Ok(())
    }

    pub(crate) fn layer_size(&self, diff_id: &str) -> u64 {
        let Ok(dir) = self.layer_dir(diff_id) else { return 0 };
        fs::read(dir.join("meta.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<LayerMeta>(&b).ok())
            .map_or(0, |m| m.size)
    }

    fn blob_size(&self, digest: &str) -> u64 {
        self.blob_path(digest).ok().and_then(|p| fs::metadata(p).ok()).map_or(0, |m| m.len())
    }

    /// Every stored image with a name or a lease, names sorted.
    pub fn list(&self) -> Result<Vec<ImageInfo>> {
        let refs = self.refs()?;
        let leases = self.leases()?;
        let mut by_digest: BTreeMap<String, ImageInfo> = BTreeMap::new();
        let blank = |digest: &str| ImageInfo {
            names: Vec::new(),
            digest: digest.to_string(),
            size: 0,
            created: None,
            stored_unix_ms: 0,
            layers: 0,
            holders: Vec::new(),
        };
        for (name, e) in &refs {
            let info = by_digest.entry(e.digest.clone()).or_insert_with(|| blank(&e.digest));
            info.names.push(name.clone());
            info.stored_unix_ms = info.stored_unix_ms.max(e.stored_unix_ms);
        }
        for (holder, digest) in &leases {
            by_digest.entry(digest.clone()).or_insert_with(|| blank(digest)).holders.push(holder.clone());
        }
        for info in by_digest.values_mut() {
            let Ok(manifest) = self.parse_manifest(&info.digest) else { continue };
            info.size = self.blob_size(&info.digest);
            if let Some(c) = &manifest.config {
                info.size += self.blob_size(&c.digest);
                if let Ok(config) = self.parse_config(&c.digest) {
                    info.created = config.created.clone();
                    info.layers = config.rootfs.diff_ids.len();
                    info.size += config.rootfs.diff_ids.iter().map(|d| self.layer_size(d)).sum::<u64>();
                }
            }
        }
        let mut out: Vec<ImageInfo> = by_digest.into_values().collect();
        out.sort_by(|a, b| a.names.first().cmp(&b.names.first()).then(a.digest.cmp(&b.digest)));
        Ok(out)
    }

    /// Removes the name `reference` (its content goes at the next prune); refused while a
    /// sandbox holds the image. See [`Store::remove_with`] to untag anyway.
    pub fn remove(&self, reference: &str) -> Result<()> {
        self.remove_with(reference, false)
    }

    /// [`Store::remove`]; with `force`, the name goes even while the image is held (the
    /// content stays until the last lease is released and prune runs).
    pub fn remove_with(&self, reference: &str, force: bool) -> Result<()> {
        let r = Ref::parse(reference)?;
        let name = r.to_string();
        let _meta = self.lock("meta.lock", true)?;
        let mut refs = self.refs()?;
        let names: Vec<String> = if refs.contains_key(&name) {
            vec![name.clone()]
        } else if let Some(d) = &r.digest {
            // `repo@digest` removes every name of that repository that points at the digest.
            refs.iter()
                .filter(|(n, e)| &e.digest == d && Ref::parse(n).is_ok_and(|o| o.repo_name() == r.repo_name()))
                .map(|(n, _)| n.clone())
                .collect()
        } else {
            Vec::new()
        };
        if names.is_empty() {
            return Err(ImageError::NotFound(format!("{name} is not in the store; `paddock image ls` lists what is")));
        }
        let digest = refs[&names[0]].digest.clone();
        let holders: Vec<String> = self.leases()?.into_iter().filter(|(_, d)| *d == digest).map(|(h, _)| h).collect();
        if !holders.is_empty() && !force {
            return Err(ImageError::InUse(format!(
                "{name} is used by sandbox(es) {}; remove them first, or pass --force to untag it anyway \
                 (its content stays until they are gone)",
                holders.join(", ")
            )));
        }
        for n in names {
            refs.remove(&n);
        }
        self.write_json("refs.json", &refs)
    }

    /// Removes every manifest, config and layer no name or lease references, everything in
    /// `tmp/` and lease files cut short. Waits for running pulls and imports to finish first.
    pub fn prune(&self) -> Result<PruneReport> {
        let _gc = self.lock("gc.lock", true)?;
        let _meta = self.lock("meta.lock", true)?;
        let refs = self.refs()?;
        let leases = self.leases()?;
        let mut live_blobs = BTreeSet::new();
        let mut live_layers = BTreeSet::new();
        for digest in refs.values().map(|e| &e.digest).chain(leases.values()) {
            live_blobs.insert(hex_of(digest)?.to_string());
            let Ok(manifest) = self.parse_manifest(digest) else { continue };
            if let Some(c) = &manifest.config {
                live_blobs.insert(hex_of(&c.digest)?.to_string());
                if let Ok(config) = self.parse_config(&c.digest) {
                    for d in &config.rootfs.diff_ids {
                        live_layers.insert(hex_of(d)?.to_string());
                    }
                }
            }
        }
        let mut report = PruneReport::default();
        let io = |p: &Path, e| ImageError::io(format!("pruning {}", p.display()), e);
        for (dir, live, is_layer) in [("blobs/sha256", &live_blobs, false), ("layers", &live_layers, true)] {
            let dir = self.root.join(dir);
            for ent in fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
                let ent = ent.map_err(|e| io(&dir, e))?;
                let name = ent.file_name().to_string_lossy().into_owned();
                if live.contains(&name) {
                    continue;
                }
                let digest = format!("sha256:{name}");
                if is_layer {
                    report.freed_bytes += self.layer_size(&digest);
                    fs::remove_dir_all(ent.path()).map_err(|e| io(&ent.path(), e))?;
                    report.layers += 1;
                } else {
                    report.freed_bytes += self.blob_size(&digest);
                    if self.parse_manifest(&digest).is_ok_and(|m| m.config.is_some()) {
                        report.images.push(digest);
                    }
                    fs::remove_file(ent.path()).map_err(|e| io(&ent.path(), e))?;
                    report.blobs += 1;
                }
            }
        }
        let mut private: BTreeMap<String, Vec<String>> = self.read_json(PRIVATE)?;
        let before = private.len();
        private.retain(|key, _| hex_of(key).is_ok_and(|hex| live_blobs.contains(hex) || live_layers.contains(hex)));
        if private.len() != before {
            self.write_json(PRIVATE, &private)?;
        }
        // Nothing is in progress (we hold gc.lock alone), so all of tmp/ is debris, and so are
        // the per-layer lock files nobody waits on.
        let tmp = self.root.join("tmp");
        for ent in fs::read_dir(&tmp).map_err(|e| io(&tmp, e))? {
            let p = ent.map_err(|e| io(&tmp, e))?.path();
            let r = if p.is_dir() && !p.is_symlink() { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
            r.map_err(|e| io(&p, e))?;
            report.temp_entries += 1;
        }
        // A lease file whose writer died before the digest was in it holds nothing, and no
        // lease is being written now (that takes meta.lock): it is debris too. Files of other
        // names are not this store's, so they stay.
        let leases_dir = self.root.join("leases");
        for ent in fs::read_dir(&leases_dir).map_err(|e| io(&leases_dir, e))?.flatten() {
            let holder = ent.file_name().into_string().ok().filter(|h| valid_holder(h));
            let is_file = ent.file_type().is_ok_and(|t| t.is_file());
            if let Some(holder) = holder
                && is_file
                && !leases.contains_key(&holder)
            {
                fs::remove_file(ent.path()).map_err(|e| io(&ent.path(), e))?;
                report.temp_entries += 1;
            }
        }
        let locks = self.root.join("locks");
        for ent in fs::read_dir(&locks).map_err(|e| io(&locks, e))?.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if name.starts_with("layer-") || name.starts_with("blob-") {
                let _ = fs::remove_file(ent.path());
            }
        }
        Ok(report)
    }

    /// Removes `tmp/` debris of pulls that died: files of processes that no longer exist, and
    /// a layer's work files when nobody holds that layer's lock.
    pub(crate) fn clean_stale_tmp(&self) {
        let Ok(rd) = fs::read_dir(self.root.join("tmp")) else { return };
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            let stale = if let Some(rest) = name.strip_prefix("layer-") {
                let hex = rest.strip_suffix(".blob").unwrap_or(rest);
                // Taken without waiting: a held lock means a pull is writing this right now.
                File::options()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(self.root.join("locks").join(format!("layer-{hex}.lock")))
                    .is_ok_and(|f| f.try_lock().is_ok())
            } else {
                name.split('-')
                    .next()
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
            };
            if stale {
                let _ = remove_any(&ent.path());
            }
        }
    }

    /// Unpacks a verified layer blob (read from `blob`) and publishes it as `diff_id`.
    /// The caller holds the layer's lock and has checked the layer is not there yet.
    /// `image_before` is what the image's earlier layers unpacked to.
    pub(crate) fn unpack_layer(&self, blob: impl Read, diff_id: &str, image_before: u64) -> Result<u64> {
        self.unpack_layer_then(blob, diff_id, image_before, |_| Ok(()))
    }

    /// Like [`Store::unpack_layer`], for a blob still arriving: once it is unpacked and before
    /// it is published, `verified` must say the blob was the one asked for (a pull checks its
    /// digest only at its end); on an error nothing is published.
    pub(crate) fn unpack_layer_then<R: Read>(
        &self,
        mut blob: R,
        diff_id: &str,
        image_before: u64,
        verified: impl FnOnce(&mut R) -> Result<()>,
    ) -> Result<u64> {
        let hex = hex_of(diff_id)?;
        let work = self.tmp(&format!("layer-{hex}"));
        remove_any(&work)?;
        let r = (|| -> Result<u64> {
            let root = work.join("root");
            fs::create_dir_all(&root).map_err(|e| ImageError::io(format!("creating {}", root.display()), e))?;
            fs::set_permissions(&root, fs::Permissions::from_mode(0o755))
                .map_err(|e| ImageError::io(format!("creating {}", root.display()), e))?;
            let store_before = if self.limits.store_bytes.is_some() { self.layers_bytes() } else { 0 };
            let bounds = unpack::Bounds { limits: &self.limits, store: &self.root, image_before, store_before };
            let unpacked = unpack::unpack(&mut blob, &root, &bounds)?;
            verified(&mut blob)?;
            if unpacked.diff_id != diff_id {
                return Err(ImageError::Corrupt(format!(
                    "layer should unpack to {diff_id} but its content is {}; the image's config and layers do not match, \
                     pull or import it again from an intact source",
                    unpacked.diff_id
                )));
            }
            let meta = serde_json::to_vec(&LayerMeta { diff_id: diff_id.to_string(), size: unpacked.size })
                .map_err(|e| ImageError::Io(e.to_string()))?;
            fs::write(work.join("meta.json"), meta).map_err(|e| ImageError::io("writing layer metadata", e))?;
            // No fsync or syncfs before the rename: the rename alone is what keeps a killed pull
            // from leaving a layer that looks complete. Syncing would only add protection
            // against power loss, at the price of flushing every dirty page of the filesystem
            // (seconds on a busy host) per layer; containers-storage makes the same trade.
            let dest = self.layer_dir(diff_id)?;
            fs::rename(&work, &dest).map_err(|e| ImageError::io(format!("publishing {}", dest.display()), e))?;
            Ok(unpacked.size)
        })();
        if r.is_err() {
            let _ = remove_any(&work);
        }
        r
    }
}

pub(crate) fn remove_any(p: &Path) -> Result<()> {
    let r = match fs::symlink_metadata(p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => fs::remove_dir_all(p),
        Ok(_) => fs::remove_file(p),
    };
    r.map_err(|e| ImageError::io(format!("removing {}", p.display()), e))
}
