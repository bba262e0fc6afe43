//! Pulling from a registry with `oci-client`.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

use crate::error::{ImageError, Result};
use crate::oci::{self, Descriptor, Manifest};
use crate::reference::Ref;
use crate::store::credentials_digest;
use crate::store::{Image, Store, hex_of, sha256_digest};
use crate::unpack;

/// Registry credentials (basic auth, or exchanged for a bearer token when the registry asks).
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).finish_non_exhaustive()
    }
}

/// Where registries are reached.
#[derive(Debug, Default, Clone)]
pub struct RegistryConfig {
    /// (registry host, mirror host[:port]): pulls from the registry try its mirrors first.
    pub mirrors: Vec<(String, String)>,
    /// Hosts (host or host:port) spoken to over plain HTTP. Loopback registries always are,
    /// unless they have a CA here.
    pub insecure: Vec<String>,
    /// Certificate authorities trusted for one registry each, beside the system's roots.
    pub cas: Vec<RegistryCa>,
}

/// A certificate authority trusted for one registry (Docker's `certs.d/HOST/ca.crt`): a CA that
/// signed a private registry's certificate can vouch for that registry and no other.
#[derive(Clone)]
pub struct RegistryCa {
    /// `host` or `host:port`, matched as `--insecure-registry` is.
    pub host: String,
    /// The CA certificates (DER), checked to be usable as trust anchors.
    certs: Vec<Vec<u8>>,
}

impl std::fmt::Debug for RegistryCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCa").field("host", &self.host).field("certs", &self.certs.len()).finish()
    }
}

impl RegistryCa {
    /// The CA for `host` from PEM text (one or more `CERTIFICATE` blocks; `what` names their
    /// source in errors).
    pub fn from_pem(host: &str, pem: &[u8], what: &str) -> Result<RegistryCa> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let host = host.trim();
        if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) {
            return Err(ImageError::InvalidReference(format!(
                "{host:?} is not a registry host: give host or host:port, as in registry.lan:5000=ca.pem"
            )));
        }
        let mut certs = Vec::new();
        let mut anchors = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| {
                ImageError::Config(format!("{what} is not PEM certificates ({e}); give the CA's certificate in PEM"))
            })?;
            anchors.add(cert.clone()).map_err(|e| {
                ImageError::Config(format!("{what} holds a certificate that cannot be a trust anchor: {e}"))
            })?;
            certs.push(cert.to_vec());
        }
        if certs.is_empty() {
            return Err(ImageError::Config(format!(
                "{what} holds no PEM certificate (no -----BEGIN CERTIFICATE----- block); give the CA's certificate"
            )));
        }
        Ok(RegistryCa { host: host.to_string(), certs })
    }

    /// Reads [`RegistryCa::from_pem`] from a file.
    pub fn load(host: &str, path: &std::path::Path) -> Result<RegistryCa> {
        let pem = std::fs::read(path)
            .map_err(|e| ImageError::io(format!("reading the CA certificate {}", path.display()), e))?;
        RegistryCa::from_pem(host, &pem, &path.display().to_string())
    }

    fn matches(&self, host: &str) -> bool {
        self.host == host || self.host == host_part(host)
    }
}

#[derive(Debug, Default, Clone)]
pub struct PullOptions {
    pub auth: Option<Credentials>,
    pub registries: RegistryConfig,
    /// An image pulled with `auth` is kept private to it (see `Store::lookup_for`): for a
    /// tenant's own pull. The operator's pulls (`paddock image pull`) are for the whole host.
    pub private: bool,
}

/// Pull progress, reported as it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Asking `registry` for the manifest of `reference`.
    Resolving { reference: String, registry: String },
    /// The manifest names `layers` layers.
    Resolved { digest: String, layers: usize },
    /// Downloading a layer blob: `done` of `total` bytes (`total` 0 when unknown).
    Layer { digest: String, done: u64, total: u64 },
    /// A layer already in the store (or fetched by a concurrent pull).
    Cached { digest: String },
    /// A downloaded layer being unpacked.
    Unpacking { digest: String },
    /// All layers are in the store.
    Done { digest: String, downloaded_bytes: u64 },
}

/// Layer blobs downloaded by this process (tests use it to show a concurrent pull downloads once).
static DOWNLOADS: AtomicU64 = AtomicU64::new(0);

/// How many layer blobs this process has downloaded from registries.
pub fn layer_downloads() -> u64 {
    DOWNLOADS.load(Ordering::Relaxed)
}

fn host_part(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// Docker's rule: a loopback registry speaks plain HTTP without being listed, unless the
/// operator gave a CA for it (which says that it speaks TLS).
fn plain_http(host: &str, registries: &RegistryConfig) -> bool {
    let h = host_part(host);
    let loopback = h == "localhost" || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    registries.insecure.iter().any(|i| i == host || i == h)
        || (loopback && !registries.cas.iter().any(|ca| ca.matches(host)))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn map_oci(host: &str, what: &str, e: OciDistributionError) -> ImageError {
    let unauthorized = || {
        ImageError::Unauthorized(format!(
            "{host} refused {what}: it needs credentials or yours are wrong; give them with \
             --username and --password-stdin (or `image.auth` in the API)"
        ))
    };
    match e {
        OciDistributionError::AuthenticationFailure(m) => {
            ImageError::Unauthorized(format!("{host} rejected the credentials for {what}: {m}"))
        }
        OciDistributionError::UnauthorizedError { .. } => unauthorized(),
        OciDistributionError::RegistryError { envelope, url } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes.iter().any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied)) {
                unauthorized()
            } else if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                ImageError::NotFound(format!("{what} is not in registry {host} ({url}); check the name and tag"))
            } else if codes.iter().any(|c| matches!(c, OciErrorCode::Toomanyrequests)) {
                ImageError::Registry(format!(
                    "{host} rate-limits pulls ({envelope}); wait, log in, or configure a mirror with --registry-mirror"
                ))
            } else {
                ImageError::Registry(format!("{host} answered {envelope} for {what}"))
            }
        }
        OciDistributionError::ServerError { code, url, message } => match code {
            401 | 403 => unauthorized(),
            404 => ImageError::NotFound(format!("{what} is not in registry {host} ({url}); check the name and tag")),
            400 if message.contains("HTTPS server") => ImageError::Registry(format!(
                "{host} speaks HTTPS, but was spoken to in plain HTTP for {what} (a registry on a loopback address \
                 is, unless it has a CA): give its CA with --registry-ca {host}=CA.pem"
            )),
            _ => ImageError::Registry(format!("{host} answered HTTP {code} for {what}: {}", message.trim())),
        },
        OciDistributionError::DigestError(d) => ImageError::Corrupt(format!(
            "{what} from {host} does not match its digest ({d}); the registry's copy is damaged"
        )),
        OciDistributionError::RequestError(r) => {
            let why = chain(&r);
            if why.contains("certificate") {
                ImageError::Registry(format!(
                    "registry {host} presented a certificate this host does not trust, for {what}: {why}; \
                     if it is a private registry, trust its CA with --registry-ca {host}=CA.pem"
                ))
            } else {
                ImageError::Registry(format!(
                    "cannot reach registry {host} for {what}: {why}; check the network, or point at a reachable \
                     mirror with --registry-mirror (--insecure-registry for a plain-HTTP one)"
                ))
            }
        }
        OciDistributionError::IoError(io) => ImageError::io(format!("fetching {what} from {host}"), io),
        other => ImageError::Registry(format!("{host}, {what}: {}", chain(&other))),
    }
}

impl Store {
    /// Pulls `reference` into the store and returns it. A digest reference already stored is
    /// returned without the network; a tag is always resolved at the registry (its layers are
    /// only fetched when missing) — check [`Store::lookup`] first to avoid even that.
    pub async fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
        progress: &(dyn Fn(&Progress) + Send + Sync),
    ) -> Result<Image> {
        let r = Ref::parse(reference)?;
        if r.digest.is_some()
            && let Some(img) = self.lookup_for(reference, opts.auth.as_ref())?
        {
            return Ok(img);
        }
        let store = self.clone();
        let gc = tokio::task::spawn_blocking(move || {
            store.clean_stale_tmp();
            store.lock("gc.lock", false)
        })
        .await
        .map_err(|e| ImageError::Io(format!("lock task failed: {e}")))??;
        let mut hosts: Vec<String> = opts
            .registries
            .mirrors
            .iter()
            .filter(|(reg, _)| {
                *reg == r.registry || (r.registry == crate::reference::DOCKER_HUB && reg == "index.docker.io")
            })
            .map(|(_, m)| m.clone())
            .collect();
        hosts.push(r.registry.clone());
        let mut result = Err(ImageError::Registry("no registry to pull from".into()));
        for (i, host) in hosts.iter().enumerate() {
            result = self.pull_from(&r, host, opts, progress).await;
            // A mirror that fails in any way (down, missing the image, private, damaged) leaves
            // the registry itself to try; a local problem (disk, store) would fail there too.
            match &result {
                Err(ImageError::NoSpace(_) | ImageError::Io(_)) => break,
                Err(_) if i + 1 < hosts.len() => continue,
                _ => break,
            }
        }
        drop(gc);
        result
    }

    async fn pull_from(
        &self,
        r: &Ref,
        host: &str,
        opts: &PullOptions,
        progress: &(dyn Fn(&Progress) + Send + Sync),
    ) -> Result<Image> {
        let name = r.to_string();
        progress(&Progress::Resolving { reference: name.clone(), registry: host.to_string() });
        // Crypto for HTTPS without aws-lc's C build: ring, once per process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let protocol = if plain_http(host, &opts.registries) {
            oci_client::client::ClientProtocol::Http
        } else {
            oci_client::client::ClientProtocol::Https
        };
        let extra_root_certificates = (opts.registries.cas.iter())
            .filter(|ca| ca.matches(host))
            .flat_map(|ca| &ca.certs)
            .map(|der| oci_client::client::Certificate {
                encoding: oci_client::client::CertificateEncoding::Der,
                data: der.clone(),
            })
            .collect();
        // `Client::new` would fall back to a default client (plain trust, HTTPS) on an error.
        let client = Client::try_from(oci_client::client::ClientConfig {
            protocol,
            extra_root_certificates,
            // Indexes are resolved here, to choose the variant and check digests ourselves.
            platform_resolver: None,
            connect_timeout: Some(std::time::Duration::from_secs(30)),
            read_timeout: Some(std::time::Duration::from_secs(120)),
            ..Default::default()
        })
        .map_err(|e| ImageError::Registry(format!("cannot set up a client for registry {host}: {}", chain(&e))))?;
        // Credentials are the image registry's: a mirror (someone else's server) never sees them.
        let auth = match &opts.auth {
            Some(c) if host == r.registry => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
            _ => RegistryAuth::Anonymous,
        };
        // A Reference spelled docker.io is sent to index.docker.io by oci-client; a mirror is
        // addressed as itself.
        let oref = match &r.digest {
            Some(d) => Reference::with_digest(host.to_string(), r.repository.clone(), d.clone()),
            None => Reference::with_tag(host.to_string(), r.repository.clone(), r.tag.clone().unwrap_or_default()),
        };
        let (bytes, _) = client
            .pull_manifest_raw(&oref, &auth, oci::ACCEPTED_MANIFESTS)
            .await
            .map_err(|e| map_oci(host, &format!("the manifest of {name}"), e))?;
        let mut digest = sha256_digest(&bytes);
        if let Some(want) = &r.digest
            && *want != digest
        {
            return Err(ImageError::Corrupt(format!(
                "{host} sent a manifest with digest {digest} for {name}; the registry's copy is damaged"
            )));
        }
        let mut bytes = bytes.to_vec();
        let mut manifest = parse_manifest(&bytes, &name)?;
        if manifest.is_index() {
            let entries = manifest.manifests.clone().unwrap_or_default();
            let (os, arch) = oci::this_platform();
            let entry = oci::select_platform(&entries).ok_or_else(|| {
                let have: Vec<String> = entries
                    .iter()
                    .filter_map(|e| e.platform.as_ref().map(|p| format!("{}/{}", p.os, p.architecture)))
                    .collect();
                ImageError::NotFound(format!("{name} has no variant for {os}/{arch} (it has {})", have.join(", ")))
            })?;
            let child = oref.clone_with_digest(entry.digest.clone());
            let (b, _) = client
                .pull_manifest_raw(&child, &auth, oci::ACCEPTED_MANIFESTS)
                .await
                .map_err(|e| map_oci(host, &format!("the {os}/{arch} manifest of {name}"), e))?;
            digest = sha256_digest(&b);
            if digest != entry.digest {
                return Err(ImageError::Corrupt(format!(
                    "{host} sent manifest {digest} where the index of {name} names {}; the registry's copy is damaged",
                    entry.digest
                )));
            }
            bytes = b.to_vec();
            manifest = parse_manifest(&bytes, &name)?;
            if manifest.is_index() {
                return Err(ImageError::Unsupported(format!("{name}: an index inside an index")));
            }
        }
        let (config_desc, layers) = manifest_parts(&manifest, &name)?;
        progress(&Progress::Resolved { digest: digest.clone(), layers: layers.len() });
        // A private pull's content serves others only once their registry handed it to them
        // too: else a manifest from any registry naming a private config or layer by its
        // digest would get it out of this store.
        let principal = opts.auth.as_ref().filter(|_| opts.private).map(credentials_digest);
        let principal = principal.as_deref();
        let config_ready = |s: &Store| -> Result<bool> {
            Ok(s.blob_path(&config_desc.digest)?.exists() && s.open_to(&config_desc.digest, principal)?)
        };
        if !config_ready(self)? {
            let (store, lock_name) = (self.clone(), format!("blob-{}.lock", hex_of(&config_desc.digest)?));
            let _lock = tokio::task::spawn_blocking(move || store.lock(&lock_name, true))
                .await
                .map_err(|e| ImageError::Io(format!("lock task failed: {e}")))??;
            if !config_ready(self)? {
                let mut config = Vec::new();
                client
                    .pull_blob(&oref, config_desc.digest.as_str(), &mut config)
                    .await
                    .map_err(|e| map_oci(host, &format!("the config of {name}"), e))?;
                if let Some(p) = principal {
                    self.claim(&config_desc.digest, p)?;
                }
                // Checks the digest whether or not the blob was stored already.
                self.write_blob(&config_desc.digest, &config)?;
                self.grant(&config_desc.digest, principal)?;
            }
        }
        let config = self.parse_config(&config_desc.digest)?;
        let diff_ids = &config.rootfs.diff_ids;
        if diff_ids.len() != layers.len() {
            return Err(ImageError::Corrupt(format!(
                "{name}: the manifest has {} layers but the config {}",
                layers.len(),
                diff_ids.len()
            )));
        }
        let (mut downloaded, mut unpacked) = (0, 0);
        for (desc, diff_id) in layers.iter().zip(diff_ids) {
            let remote = Remote { client: &client, oref: &oref, host, principal };
            downloaded += self.fetch_layer(&remote, desc, diff_id, unpacked, progress).await?;
            unpacked += self.layer_size(diff_id);
        }
        self.write_blob(&digest, &bytes)?;
        self.set_ref(&name, &digest, opts.auth.as_ref().filter(|_| opts.private))?;
        progress(&Progress::Done { digest: digest.clone(), downloaded_bytes: downloaded });
        self.load(&name, &digest)
    }

    /// Makes layer `diff_id` present, downloading `desc` unless it (or a concurrent pull)
    /// already did; returns the bytes downloaded.
    async fn fetch_layer(
        &self,
        remote: &Remote<'_>,
        desc: &Descriptor,
        diff_id: &str,
        image_before: u64,
        progress: &(dyn Fn(&Progress) + Send + Sync),
    ) -> Result<u64> {
        let cached = || progress(&Progress::Cached { digest: desc.digest.clone() });
        let principal = remote.principal;
        let ready = |s: &Store| -> Result<bool> { Ok(s.has_layer(diff_id)? && s.open_to(diff_id, principal)?) };
        if ready(self)? {
            cached();
            return Ok(0);
        }
        let store = self.clone();
        let lock_name = format!("layer-{}.lock", hex_of(diff_id)?);
        // Whoever holds this lock fetches the layer; the others wait, then find it there.
        let lock = tokio::task::spawn_blocking(move || store.lock(&lock_name, true))
            .await
            .map_err(|e| ImageError::Io(format!("lock task failed: {e}")))??;
        if ready(self)? {
            cached();
            return Ok(0);
        }
        if self.has_layer(diff_id)? {
            // Stored by pulls with other credentials: this pull's registry must hand over the
            // same layer (its digest and its diff_id checked) before the stored copy serves it.
            let n = self.prove_layer(remote, desc, diff_id, progress).await?;
            self.grant(diff_id, principal)?;
            drop(lock);
            return Ok(n);
        }
        if let Some(p) = principal {
            self.claim(diff_id, p)?;
        }
        // The layer is unpacked while it downloads (a thread reads what the download hands
        // it), and published only once the download has checked the blob's digest.
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_CHUNKS);
        let (store, diff) = (self.clone(), diff_id.to_string());
        // The lock moves into the unpacking thread: were this future dropped (the pull
        // cancelled), the thread would still be writing the layer's work directory.
        let unpacking = tokio::task::spawn_blocking(move || {
            let _lock = lock;
            let layer = Streamed { rx, buf: bytes::Bytes::new(), verified: false };
            store.unpack_layer_then(layer, &diff, image_before, Streamed::verified)
        });
        let mut sink = Some(tx);
        let downloaded = self.download(remote.client, remote.oref, remote.host, desc, &mut sink, progress).await;
        if let Some(tx) = sink {
            let end = downloaded.as_ref().map(|_| ()).map_err(|e| e.to_string());
            let _ = tx.send(Piece::End(end)).await;
        }
        if downloaded.is_ok() {
            progress(&Progress::Unpacking { digest: desc.digest.clone() });
        }
        let unpacked = unpacking.await.map_err(|e| ImageError::Io(format!("unpack task failed: {e}"))).and_then(|r| r);
        // A layer past a bound stops its own download, and the bound is what went wrong.
        if let Err(e @ (ImageError::TooLarge(_) | ImageError::NoSpace(_))) = unpacked {
            return Err(e);
        }
        // A damaged blob usually breaks the unpacking too; the digest says what went wrong.
        let n = downloaded?;
        unpacked?;
        if principal.is_none() {
            // Fetched publicly: a claim left by a private pull that failed no longer holds.
            self.grant(diff_id, None)?;
        }
        Ok(n)
    }

    /// Downloads layer `desc` and checks that it is the blob named and unpacks to `diff_id`,
    /// without unpacking it (it is stored already); returns the bytes downloaded.
    async fn prove_layer(
        &self,
        remote: &Remote<'_>,
        desc: &Descriptor,
        diff_id: &str,
        progress: &(dyn Fn(&Progress) + Send + Sync),
    ) -> Result<u64> {
        use std::io::Read;
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_CHUNKS);
        let want = diff_id.to_string();
        // The tar of a layer the unpacking accepted is no longer than this; a bomb stops here.
        let bound = self.limits.layer_bytes.saturating_add(self.limits.layer_entries.saturating_mul(1536));
        let hashing = tokio::task::spawn_blocking(move || -> Result<()> {
            let mut layer = Streamed { rx, buf: bytes::Bytes::new(), verified: false };
            let corrupt = |e: std::io::Error| ImageError::Corrupt(format!("the layer does not decompress: {e}"));
            let tar = unpack::decompress(&mut layer).map_err(corrupt)?;
            let (actual, len) = unpack::digest_of(tar.take(bound + 1)).map_err(corrupt)?;
            layer.verified()?;
            if len > bound {
                return Err(ImageError::TooLarge(format!("the layer decompresses to more than {bound} bytes")));
            }
            if actual != want {
                return Err(ImageError::Corrupt(format!(
                    "layer should unpack to {want} but its content is {actual}; the image's config and layers do not match"
                )));
            }
            Ok(())
        });
        let mut sink = Some(tx);
        let downloaded = self.download(remote.client, remote.oref, remote.host, desc, &mut sink, progress).await;
        if let Some(tx) = sink {
            let end = downloaded.as_ref().map(|_| ()).map_err(|e| e.to_string());
            let _ = tx.send(Piece::End(end)).await;
        }
        let hashed = hashing.await.map_err(|e| ImageError::Io(format!("hashing task failed: {e}"))).and_then(|r| r);
        let n = downloaded?;
        hashed.map(|()| n)
    }

    /// Downloads `desc`, checking its size and digest, and hands each piece to `sink` while
    /// it takes them (it is `None`d once its reader has stopped; the digest is still checked).
    /// Returns the bytes downloaded.
    async fn download(
        &self,
        client: &Client,
        oref: &Reference,
        host: &str,
        desc: &Descriptor,
        sink: &mut Option<tokio::sync::mpsc::Sender<Piece>>,
        progress: &(dyn Fn(&Progress) + Send + Sync),
    ) -> Result<u64> {
        let what = format!("layer {}", desc.digest);
        DOWNLOADS.fetch_add(1, Ordering::Relaxed);
        let mut stream =
            client.pull_blob_stream(oref, desc.digest.as_str()).await.map_err(|e| map_oci(host, &what, e))?;
        let total = u64::try_from(desc.size).ok().filter(|s| *s > 0).or(stream.content_length).unwrap_or(0);
        let mut hasher = Sha256::new();
        let mut done = 0u64;
        let mut reported = 0u64;
        progress(&Progress::Layer { digest: desc.digest.clone(), done: 0, total });
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                // oci-client checks the digest as the stream ends and reports it as an I/O error.
                if e.get_ref().is_some_and(|i| i.is::<oci_client::errors::DigestError>()) {
                    ImageError::Corrupt(format!(
                        "{what} from {host} does not match its digest ({e}); the registry's copy is damaged (nothing was stored)"
                    ))
                } else {
                    ImageError::Registry(format!("downloading {what} from {host}: {}", chain(&e)))
                }
            })?;
            hasher.update(&chunk);
            done += chunk.len() as u64;
            if total > 0 && done > total {
                return Err(ImageError::Corrupt(format!(
                    "{what} from {host} is longer than the {total} bytes its manifest says"
                )));
            }
            // The unpacking reads to the download's end unless it failed: then (a bound, a
            // corrupt archive) the rest of the blob is of no use.
            if let Some(tx) = sink
                && tx.send(Piece::Data(chunk)).await.is_err()
            {
                *sink = None;
                return Err(ImageError::Corrupt(format!("{what} from {host} could not be unpacked")));
            }
            if done - reported >= 1 << 20 {
                reported = done;
                progress(&Progress::Layer { digest: desc.digest.clone(), done, total });
            }
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != desc.digest {
            return Err(ImageError::Corrupt(format!(
                "{what} from {host} has digest {actual}; the registry's copy is damaged (nothing was stored)"
            )));
        }
        progress(&Progress::Layer { digest: desc.digest.clone(), done, total: total.max(done) });
        Ok(done)
    }
}

/// Where an image's blobs come from.
struct Remote<'a> {
    client: &'a Client,
    oref: &'a Reference,
    host: &'a str,
    /// Whose pull this is: `credentials_digest` of a private pull's credentials.
    principal: Option<&'a str>,
}

/// Pieces of a layer in flight from the download to the unpacking thread, at most: a few MiB,
/// and a slow disk slows the download rather than filling memory.
const STREAM_CHUNKS: usize = 64;

/// What a download hands the unpacking thread.
#[derive(Debug)]
enum Piece {
    Data(bytes::Bytes),
    /// The download ended: the blob is the one asked for, or why not.
    End(std::result::Result<(), String>),
}

/// A layer as its download hands it over. Its end of file comes only once the download has
/// checked the blob's digest; a failed or cancelled download is a read error.
struct Streamed {
    rx: tokio::sync::mpsc::Receiver<Piece>,
    buf: bytes::Bytes,
    verified: bool,
}

impl Streamed {
    /// Reads what is left (a tar archive ends before its compressed stream does) and says
    /// whether the download vouched for all of it.
    fn verified(&mut self) -> Result<()> {
        std::io::copy(self, &mut std::io::sink()).map_err(|e| ImageError::Registry(e.to_string()))?;
        if self.verified { Ok(()) } else { Err(ImageError::Registry("the layer's download did not finish".into())) }
    }
}

impl std::io::Read for Streamed {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.buf.is_empty() {
            if self.verified {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Piece::Data(b)) => self.buf = b,
                Some(Piece::End(Ok(()))) => self.verified = true,
                Some(Piece::End(Err(e))) => return Err(std::io::Error::other(e)),
                None => return Err(std::io::Error::other("the layer's download stopped")),
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf.split_to(n));
        Ok(n)
    }
}

pub(crate) fn parse_manifest(bytes: &[u8], name: &str) -> Result<Manifest> {
    let m: Manifest = serde_json::from_slice(bytes)
        .map_err(|e| ImageError::Corrupt(format!("the manifest of {name} does not parse: {e}")))?;
    if m.schema_version == 1 {
        return Err(ImageError::Unsupported(format!(
            "{name} uses Docker's schema 1 manifest, retired in 2019; push it again with a current tool"
        )));
    }
    Ok(m)
}

/// The config descriptor and layers of an image manifest, digests checked for shape.
pub(crate) fn manifest_parts<'a>(m: &'a Manifest, name: &str) -> Result<(&'a Descriptor, &'a [Descriptor])> {
    let config =
        m.config.as_ref().ok_or_else(|| ImageError::Corrupt(format!("the manifest of {name} names no config")))?;
    let layers = m.layers.as_deref().unwrap_or_default();
    for d in std::iter::once(config).chain(layers) {
        hex_of(&d.digest)?;
    }
    for l in layers {
        if !l.media_type.is_empty() && !l.media_type.contains("tar") && !l.media_type.contains("rootfs.diff") {
            return Err(ImageError::Unsupported(format!(
                "{name}: layer {} has media type {}, not a filesystem tarball (is it an artifact rather than a container image?)",
                l.digest, l.media_type
            )));
        }
    }
    Ok((config, layers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_insecure_hosts_use_http() {
        let insecure = |hosts: &[&str]| RegistryConfig {
            insecure: hosts.iter().map(|h| h.to_string()).collect(),
            ..Default::default()
        };
        assert!(plain_http("127.0.0.1:5000", &insecure(&[])));
        assert!(plain_http("127.8.0.1", &insecure(&[])));
        assert!(plain_http("localhost:5000", &insecure(&[])));
        assert!(plain_http("[::1]:5000", &insecure(&[])));
        assert!(!plain_http("registry.example.com", &insecure(&[])));
        assert!(plain_http("registry.lan:5000", &insecure(&["registry.lan"])));
        assert!(plain_http("registry.lan:5000", &insecure(&["registry.lan:5000"])));
        assert!(!plain_http("registry.lan:5001", &insecure(&["registry.lan:5000"])));
    }

    #[test]
    fn a_ca_for_a_loopback_registry_makes_it_speak_tls() {
        let ca = |host: &str| RegistryCa { host: host.into(), certs: vec![] };
        let with = |cas: Vec<RegistryCa>| RegistryConfig { cas, ..Default::default() };
        assert!(!plain_http("127.0.0.1:5000", &with(vec![ca("127.0.0.1:5000")])));
        assert!(!plain_http("127.0.0.1:5000", &with(vec![ca("127.0.0.1")])));
        assert!(plain_http("127.0.0.1:5001", &with(vec![ca("127.0.0.1:5000")])));
        assert!(plain_http("localhost:5000", &with(vec![ca("127.0.0.1")])));
    }

    #[test]
    fn a_ca_file_must_hold_certificates() {
        let empty = RegistryCa::from_pem("r.lan", b"", "ca.pem").unwrap_err().to_string();
        assert!(empty.contains("no PEM certificate"), "{empty}");
        let key_only = b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n";
        let key = RegistryCa::from_pem("r.lan", key_only, "ca.pem").unwrap_err().to_string();
        assert!(key.contains("no PEM certificate"), "{key}");
        let garbage = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let bad = RegistryCa::from_pem("r.lan", garbage, "ca.pem").unwrap_err().to_string();
        assert!(bad.contains("trust anchor"), "{bad}");
        let host = RegistryCa::from_pem("https://r.lan/", b"", "ca.pem").unwrap_err().to_string();
        assert!(host.contains("not a registry host"), "{host}");
    }

    #[test]
    fn pull_future_is_send() {
        fn is_send<T: Send>(_: &T) {}
        let store = Store { root: "/nonexistent".into(), limits: crate::Limits::default() };
        let opts = PullOptions::default();
        let fut = store.pull("x", &opts, &|_| {});
        is_send(&fut);
    }
}
