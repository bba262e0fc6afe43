//! What a sandbox's `/` is made of on this machine: the host's own root (read-only), a root
//! filesystem already unpacked in a directory (read-only), or an OCI image from the store in
//! `<data>/images` (pulled on first use), whose layers the supervisor overlays with a writable
//! layer of the sandbox's own.

use std::collections::BTreeMap;
use std::path::PathBuf;

use paddock_core::runtime::{RuntimeError, SandboxId};
use paddock_core::spec::{SandboxSpec, validate_env_name};
use paddock_image::{Credentials, Image, ImageError, PullOptions, RegistryConfig, Store};

use crate::layout::DataDir;
use crate::protocol::ImageRoot;

/// The image name that means the host's own root filesystem.
pub const HOST: &str = "host";

/// Image references the local runtime accepts, in words.
pub const ACCEPTED: &str = "an OCI image reference (\"python:3.11\", \"registry.example.com/team/img:tag\", \"name@sha256:…\"; pulled on first use), \"host\" (the host's root filesystem, read-only) or the absolute path of an unpacked root filesystem (read-only)";

/// A resolved image name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootSource {
    Host,
    Dir(PathBuf),
    /// A normalized OCI reference.
    Reference(String),
}

/// Resolves a spec's image name; `None` is the host. Whether a directory exists is checked by
/// the supervisor, which is the one that opens it.
pub fn resolve(image: Option<&str>) -> Result<RootSource, RuntimeError> {
    match image {
        None | Some(HOST) => Ok(RootSource::Host),
        Some(path) if path.starts_with('/') => Ok(RootSource::Dir(PathBuf::from(path))),
        Some(reference) => paddock_image::normalize(reference).map(RootSource::Reference).map_err(|e| {
            RuntimeError::InvalidArgument(format!(
                "image {reference:?} is not a valid image reference ({e}); use {ACCEPTED}"
            ))
        }),
    }
}

/// How the local runtime finds images: registries to pull from and names that stand for
/// others (`--image-alias python:3.11=/srv/py` or `=registry.local/python:3.11`).
#[derive(Debug, Clone, Default)]
pub struct ImageOptions {
    pub registries: RegistryConfig,
    /// Name as a client gives it (or normalized) → the reference or path to use instead.
    pub aliases: BTreeMap<String, String>,
    /// Never pull: only images already in the store run (air-gapped hosts).
    pub offline: bool,
    /// What a pull may unpack, and the space it must leave free.
    pub limits: paddock_image::Limits,
}

impl ImageOptions {
    /// The image a spec names once aliases are applied.
    pub fn apply_alias(&self, image: Option<&str>) -> Option<String> {
        let name = image?;
        if let Some(to) = self.aliases.get(name) {
            return Some(to.clone());
        }
        // A name that is no reference (`host`, a directory) can only be aliased verbatim, and
        // otherwise passes through unchanged.
        let Ok(normalized) = paddock_image::normalize(name) else { return Some(name.to_owned()) };
        self.aliases
            .iter()
            .find(|(from, _)| paddock_image::normalize(from).is_ok_and(|f| f == normalized))
            .map(|(_, to)| to.clone())
            .or_else(|| Some(name.to_owned()))
    }
}

/// Finds (or pulls) the image `spec` names when it is a reference, leases it to sandbox
/// `holder` (whose directory exists by now, see `forget_gone_holders`), applies its config to
/// the spec (environment under the spec's own, working directory) and returns what the
/// supervisor mounts. `None` for the host or a directory.
pub(crate) async fn prepare(
    dd: &DataDir,
    options: &ImageOptions,
    spec: &mut SandboxSpec,
    holder: &SandboxId,
) -> Result<Option<(ImageRoot, Image)>, RuntimeError> {
    let reference = match resolve(spec.image.as_deref())? {
        RootSource::Reference(r) => r,
        RootSource::Host | RootSource::Dir(_) => return Ok(None),
    };
    let dir = dd.images();
    let (wanted, holder) = (reference.clone(), holder.as_str().to_owned());
    let auth =
        spec.image_auth.as_ref().map(|a| Credentials { username: a.username.clone(), password: a.password.clone() });
    let asking = auth.clone();
    // A stored image (the usual case) is found, read and leased in one trip to the blocking
    // pool: each trip is a thread handoff on a create's critical path.
    let found = blocking(move || {
        let store = Store::open(&dir)?;
        match store.lookup_for(&wanted, asking.as_ref())? {
            Some(image) => lease(&store, &holder, image).map(Ok),
            None => Ok(Err((store, holder))),
        }
    })
    .await?;
    let (image, owner) = match found {
        Ok(leased) => leased,
        Err(_) if options.offline => {
            return Err(RuntimeError::InvalidArgument(format!(
                "image {reference} is not in this host's image store and pulling is off (--pull never): import it with `paddock image import` or pull it with `paddock image pull`"
            )));
        }
        Err((store, holder)) => {
            let pull = PullOptions { private: auth.is_some(), auth, registries: options.registries.clone() };
            let store = store.with_limits(options.limits.clone());
            let image = store.pull(&reference, &pull, &|_| {}).await.map_err(from_image_error)?;
            blocking(move || lease(&store, &holder, image)).await?
        }
    };
    apply_config(&image, spec);
    Ok(Some((ImageRoot { layers: image.layers.clone(), owner }, image)))
}

/// Leases `image` to `holder`, then reads the on-disk owner of its files (its `User`, from the
/// image's /etc/passwd and /etc/group, which the lease keeps from a prune: blocking IO).
fn lease(store: &Store, holder: &str, image: Image) -> Result<(Image, (u32, u32)), ImageError> {
    store.lease(holder, &image)?;
    match store.image_user(&image) {
        Ok(owner) => Ok((image, owner.unwrap_or((0, 0)))),
        Err(e) => {
            let _ = store.release(holder);
            Err(e)
        }
    }
}

/// The image's environment goes under the spec's own; its working directory applies unless the
/// spec has one.
fn apply_config(image: &Image, spec: &mut SandboxSpec) {
    let mut env: BTreeMap<String, String> = image
        .config
        .env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| validate_env_name(k).is_ok() && *k != "HOME")
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    env.append(&mut spec.env);
    spec.env = env;
    if spec.working_dir.is_none() {
        spec.working_dir = image.config.working_dir.clone().filter(|d| d.starts_with('/') && d != "/");
    }
    spec.image_command = image.config.entrypoint.iter().chain(&image.config.cmd).cloned().collect();
}

/// The sandbox no longer uses its image: the store may prune it once nothing else does.
pub(crate) fn release(dd: &DataDir, id: &SandboxId) {
    if let Ok(store) = Store::open(&dd.images()) {
        let _ = store.release(id.as_str());
    }
}

/// Store work on the blocking pool, its errors in the seam's terms. On a current-thread
/// runtime (a CLI command's, one request at a time) it runs in place instead: it is a few small
/// files read and written under the store's meta lock, which nothing holds across an await, and
/// a blocking-pool thread would add a clone to every create and a thread for the exit to end.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, RuntimeError> {
    if tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
        return f().map_err(from_image_error);
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RuntimeError::System(format!("an image store task failed: {e}")))?
        .map_err(from_image_error)
}

/// Store errors in the seam's terms: a client's mistake is a 400 that says what to fix.
pub fn from_image_error(e: ImageError) -> RuntimeError {
    match e {
        ImageError::NotFound(m) | ImageError::InvalidReference(m) | ImageError::Unauthorized(m) => {
            RuntimeError::InvalidArgument(m)
        }
        ImageError::Registry(m) | ImageError::Corrupt(m) => RuntimeError::Upstream(m),
        // An image past the host's bounds is the request's problem: a 400 naming the bound.
        e @ ImageError::TooLarge(_) => RuntimeError::InvalidArgument(e.to_string()),
        ImageError::NoSpace(m) => RuntimeError::Exhausted(m),
        ImageError::InUse(m) => RuntimeError::Conflict(m),
        other => RuntimeError::System(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_apply_to_references_and_leave_everything_else_as_given() {
        let o = ImageOptions {
            aliases: BTreeMap::from([
                ("python:3.11".to_owned(), "/srv/py".to_owned()),
                ("/srv/old".to_owned(), "/srv/new".to_owned()),
            ]),
            ..Default::default()
        };
        assert_eq!(o.apply_alias(Some("docker.io/library/python:3.11")).as_deref(), Some("/srv/py"));
        assert_eq!(o.apply_alias(Some("/srv/old")).as_deref(), Some("/srv/new"));
        for same in ["/srv/rootfs", "host", "relative/dir", "node:20"] {
            assert_eq!(o.apply_alias(Some(same)).as_deref(), Some(same), "{same}");
        }
        assert_eq!(o.apply_alias(None), None);
    }

    #[test]
    fn host_paths_and_references_resolve() {
        assert_eq!(resolve(None).unwrap(), RootSource::Host);
        assert_eq!(resolve(Some("host")).unwrap(), RootSource::Host);
        assert_eq!(resolve(Some("/srv/root")).unwrap(), RootSource::Dir("/srv/root".into()));
        assert!(matches!(resolve(Some("python:3.11")).unwrap(), RootSource::Reference(_)));
    }
}
