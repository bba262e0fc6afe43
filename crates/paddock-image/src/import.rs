//! Importing images from files, for hosts without a registry: an OCI image layout (a directory
//! or a tar of one) or a `docker save` tarball (whose newer versions are also OCI layouts).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{ImageError, Result};
use crate::oci::{self, Descriptor, Manifest};
use crate::pull::{manifest_parts, parse_manifest};
use crate::reference::Ref;
use crate::store::{Image, Store, hex_of, remove_any, sha256_digest, unique};
use crate::unpack;

enum Member {
    File { offset: u64, size: u64 },
    Symlink(String),
}

/// Random access to the files of a layout, from a directory or an (uncompressed) tar.
enum Source {
    Dir(PathBuf),
    Tar { path: PathBuf, members: HashMap<String, Member> },
}

fn clean(path: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    Some(out.join("/"))
}

impl Source {
    fn open(file: &Path, store: &Store) -> Result<(Source, Option<PathBuf>)> {
        let meta = fs::metadata(file).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ImageError::NotFound(format!(
                "{} does not exist; give an OCI layout (directory or tar) or a `docker save` file",
                file.display()
            )),
            _ => ImageError::io(format!("reading {}", file.display()), e),
        })?;
        if meta.is_dir() {
            return Ok((Source::Dir(file.to_path_buf()), None));
        }
        let mut f = File::open(file).map_err(|e| ImageError::io(format!("opening {}", file.display()), e))?;
        let mut magic = [0u8; 4];
        let n = f.read(&mut magic).map_err(|e| ImageError::io(format!("reading {}", file.display()), e))?;
        // A compressed archive (`docker save | gzip`) is expanded once so members can be read
        // at their offsets.
        let (path, scratch) = if n >= 2 && (magic[..2] == [0x1f, 0x8b] || magic == [0x28, 0xb5, 0x2f, 0xfd]) {
            let tmp = store.tmp(&unique("import.tar"));
            let r = (|| -> io::Result<()> {
                f.seek(SeekFrom::Start(0))?;
                let mut out = File::create(&tmp)?;
                io::copy(&mut unpack::decompress(BufReader::new(f))?, &mut out)?;
                Ok(())
            })();
            if let Err(e) = r {
                let _ = fs::remove_file(&tmp);
                return Err(ImageError::io(format!("decompressing {}", file.display()), e));
            }
            (tmp.clone(), Some(tmp))
        } else {
            (file.to_path_buf(), None)
        };
        let index = (|| -> io::Result<HashMap<String, Member>> {
            let mut members = HashMap::new();
            let mut archive = tar::Archive::new(File::open(&path)?);
            for entry in archive.entries()? {
                let entry = entry?;
                let Some(name) = clean(&String::from_utf8_lossy(&entry.path_bytes())) else { continue };
                let kind = entry.header().entry_type();
                if kind.is_symlink() || kind.is_hard_link() {
                    if let Some(target) = entry.link_name_bytes() {
                        let target = String::from_utf8_lossy(&target).into_owned();
                        // Hard link names are archive paths; symlinks are relative to their dir.
                        let full = if kind.is_hard_link() || target.starts_with('/') {
                            target
                        } else {
                            let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
                            format!("{dir}/{target}")
                        };
                        members.insert(name, Member::Symlink(full));
                    }
                } else if kind.is_file() {
                    members.insert(name, Member::File { offset: entry.raw_file_position(), size: entry.size() });
                }
            }
            Ok(members)
        })();
        match index {
            Ok(members) => Ok((Source::Tar { path, members }, scratch)),
            Err(e) => {
                if let Some(s) = &scratch {
                    let _ = fs::remove_file(s);
                }
                Err(ImageError::Corrupt(format!(
                    "{} is neither a directory nor a readable tar archive ({e}); give an OCI layout or a `docker save` file",
                    file.display()
                )))
            }
        }
    }

    fn open_member(&self, name: &str) -> Result<Option<Box<dyn Read>>> {
        let missing = || ImageError::Corrupt(format!("{name} in the archive points outside it"));
        match self {
            Source::Dir(dir) => {
                let rel = clean(name).ok_or_else(missing)?;
                let p = dir.join(rel);
                // Resolve symlinks but stay inside the layout.
                let real = match p.canonicalize() {
                    Ok(r) => r,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(ImageError::io(format!("reading {}", p.display()), e)),
                };
                let base = dir.canonicalize().map_err(|e| ImageError::io(format!("reading {}", dir.display()), e))?;
                if !real.starts_with(&base) {
                    return Err(missing());
                }
                let f = File::open(&real).map_err(|e| ImageError::io(format!("reading {}", real.display()), e))?;
                Ok(Some(Box::new(BufReader::new(f))))
            }
            Source::Tar { path, members } => {
                let mut cur = clean(name).ok_or_else(missing)?;
                for _ in 0..16 {
                    match members.get(&cur) {
                        None => return Ok(None),
                        Some(Member::Symlink(t)) => cur = clean(t).ok_or_else(missing)?,
                        Some(Member::File { offset, size }) => {
                            let mut f = File::open(path)
                                .map_err(|e| ImageError::io(format!("reading {}", path.display()), e))?;
                            f.seek(SeekFrom::Start(*offset))
                                .map_err(|e| ImageError::io(format!("reading {}", path.display()), e))?;
                            return Ok(Some(Box::new(BufReader::new(f.take(*size)))));
                        }
                    }
                }
                Err(ImageError::Corrupt(format!("{name} in the archive is a symlink loop")))
            }
        }
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        let mut r = self
            .open_member(name)?
            .ok_or_else(|| ImageError::Corrupt(format!("the archive has no {name}; it is incomplete")))?;
        let mut out = Vec::new();
        r.read_to_end(&mut out).map_err(|e| ImageError::io(format!("reading {name} from the archive"), e))?;
        Ok(out)
    }

    fn has(&self, name: &str) -> bool {
        matches!(self.open_member(name), Ok(Some(_)))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerSaveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn blob_name(digest: &str) -> Result<String> {
    Ok(format!("blobs/sha256/{}", hex_of(digest)?))
}

impl Store {
    /// Imports the image in `file`: an OCI image layout (directory or tar) or a `docker save`
    /// tarball (optionally gzip-compressed). It is stored under `tag` when given, else under
    /// the name the archive records.
    pub fn import(&self, file: &Path, tag: Option<&str>) -> Result<Image> {
        let tag = tag.map(Ref::parse).transpose()?;
        let _gc = self.lock("gc.lock", false)?;
        self.clean_stale_tmp();
        let (source, scratch) = Source::open(file, self)?;
        let r = self.import_from(&source, file, tag);
        if let Some(s) = scratch {
            let _ = remove_any(&s);
        }
        r
    }

    fn import_from(&self, src: &Source, file: &Path, tag: Option<Ref>) -> Result<Image> {
        let mut paths = HashMap::new();
        let (name, digest, manifest_bytes) = if src.has("index.json") {
            self.oci_layout(src, file, tag)?
        } else if src.has("manifest.json") {
            self.docker_save(src, file, tag, &mut paths)?
        } else {
            return Err(ImageError::Unsupported(format!(
                "{} has neither index.json (OCI layout) nor manifest.json (`docker save`)",
                file.display()
            )));
        };
        let manifest = parse_manifest(&manifest_bytes, &name)?;
        let (config_desc, layers) = manifest_parts(&manifest, &name)?;
        // Blobs are at blobs/sha256/<hex> in a layout; a docker save archive has its own paths.
        let member = |digest: &str| -> Result<String> {
            match paths.get(digest) {
                Some(p) => Ok(p.clone()),
                None => blob_name(digest),
            }
        };
        let config_bytes = src.read(&member(&config_desc.digest)?)?;
        self.write_blob(&config_desc.digest, &config_bytes)?;
        // The archive holds the config: whoever imports it has it, and so may everyone.
        self.grant(&config_desc.digest, None)?;
        let config = self.parse_config(&config_desc.digest)?;
        if config.rootfs.diff_ids.len() != layers.len() {
            return Err(ImageError::Corrupt(format!(
                "{name}: the manifest has {} layers but the config {}",
                layers.len(),
                config.rootfs.diff_ids.len()
            )));
        }
        let mut unpacked = 0;
        for (desc, diff_id) in layers.iter().zip(&config.rootfs.diff_ids) {
            self.import_layer(src, &member(&desc.digest)?, &desc.digest, diff_id, unpacked)?;
            unpacked += self.layer_size(diff_id);
        }
        self.write_blob(&digest, &manifest_bytes)?;
        self.set_ref(&name, &digest, None)?;
        self.load(&name, &digest)
    }

    fn import_layer(
        &self,
        src: &Source,
        member: &str,
        blob_digest: &str,
        diff_id: &str,
        image_before: u64,
    ) -> Result<()> {
        let ready = || -> Result<bool> { Ok(self.has_layer(diff_id)? && self.open_to(diff_id, None)?) };
        if ready()? {
            return Ok(());
        }
        let _lock = self.lock(&format!("layer-{}.lock", hex_of(diff_id)?), true)?;
        if ready()? {
            return Ok(());
        }
        let open =
            || src.open_member(member)?.ok_or_else(|| ImageError::Corrupt(format!("the archive has no {member}")));
        if self.has_layer(diff_id)? {
            // Stored by a private pull: the archive holds the same layer, so it is public now.
            let tar = unpack::decompress(open()?).map_err(|e| ImageError::io(format!("reading {member}"), e))?;
            let (actual, _) = unpack::digest_of(tar).map_err(|e| ImageError::io(format!("reading {member}"), e))?;
            if actual != diff_id {
                return Err(ImageError::Corrupt(format!(
                    "{member} in the archive unpacks to {actual}, not {diff_id}; the archive is damaged"
                )));
            }
            return self.grant(diff_id, None);
        }
        // The blob's own digest first: a damaged archive must not be half unpacked.
        let (actual, _) = unpack::digest_of(open()?).map_err(|e| ImageError::io(format!("reading {member}"), e))?;
        if actual != blob_digest {
            return Err(ImageError::Corrupt(format!(
                "{member} in the archive has digest {actual}, not {blob_digest}; the archive is damaged"
            )));
        }
        self.unpack_layer(open()?, diff_id, image_before)?;
        // A claim left by a private pull that failed no longer holds.
        self.grant(diff_id, None)
    }

    fn oci_layout(&self, src: &Source, file: &Path, tag: Option<Ref>) -> Result<(String, String, Vec<u8>)> {
        let index = parse_manifest(&src.read("index.json")?, "index.json")?;
        let entries = index.manifests.clone().unwrap_or_default();
        let names = |d: &Descriptor| -> Vec<String> {
            ["io.containerd.image.name", "org.opencontainers.image.ref.name"]
                .iter()
                .filter_map(|k| d.annotations.get(*k).cloned())
                .collect()
        };
        let entry = match (&entries[..], &tag) {
            ([], _) => return Err(ImageError::Corrupt(format!("{}: index.json lists no image", file.display()))),
            ([one], _) => one.clone(),
            (many, Some(t)) => many
                .iter()
                .find(|d| {
                    names(d)
                        .iter()
                        .any(|n| *n == t.tag.clone().unwrap_or_default() || Ref::parse(n).is_ok_and(|r| r == *t))
                })
                .cloned()
                .ok_or_else(|| {
                    ImageError::NotFound(format!(
                        "{} holds {} images and none is named {t}",
                        file.display(),
                        many.len()
                    ))
                })?,
            (many, None) => {
                return Err(ImageError::InvalidReference(format!(
                    "{} holds {} images; choose one with --tag NAME (their names: {})",
                    file.display(),
                    many.len(),
                    many.iter().flat_map(names).collect::<Vec<_>>().join(", ")
                )));
            }
        };
        let name = match tag {
            Some(t) => t.to_string(),
            None => names(&entry)
                .iter()
                .find(|n| n.contains('/') || n.contains(':'))
                .and_then(|n| Ref::parse(n).ok())
                .map(|r| r.to_string())
                .ok_or_else(|| {
                    ImageError::InvalidReference(format!(
                        "{} does not name its image; give one with --tag NAME",
                        file.display()
                    ))
                })?,
        };
        let mut digest = entry.digest.clone();
        let mut bytes = src.read(&blob_name(&digest)?)?;
        let mut manifest: Manifest = parse_manifest(&bytes, &name)?;
        if manifest.is_index() {
            let (os, arch) = oci::this_platform();
            let child = oci::select_platform(manifest.manifests.as_deref().unwrap_or_default()).ok_or_else(|| {
                ImageError::NotFound(format!("{name} in {} has no {os}/{arch} variant", file.display()))
            })?;
            digest = child.digest.clone();
            bytes = src.read(&blob_name(&digest)?)?;
            manifest = parse_manifest(&bytes, &name)?;
        }
        drop(manifest);
        if sha256_digest(&bytes) != digest {
            return Err(ImageError::Corrupt(format!(
                "manifest {digest} in {} does not match its digest",
                file.display()
            )));
        }
        Ok((name, digest, bytes))
    }

    /// A `docker save` image has no registry manifest; one is written for it (OCI, the same
    /// config and layers), and its digest names the image here.
    fn docker_save(
        &self,
        src: &Source,
        file: &Path,
        tag: Option<Ref>,
        paths: &mut HashMap<String, String>,
    ) -> Result<(String, String, Vec<u8>)> {
        let entries: Vec<DockerSaveEntry> = serde_json::from_slice(&src.read("manifest.json")?)
            .map_err(|e| ImageError::Corrupt(format!("{}: manifest.json does not parse: {e}", file.display())))?;
        let tags_of = |e: &DockerSaveEntry| -> Vec<Ref> {
            e.repo_tags.iter().flatten().filter_map(|t| Ref::parse(t).ok()).collect()
        };
        let entry = match (&entries[..], &tag) {
            ([], _) => return Err(ImageError::Corrupt(format!("{}: manifest.json lists no image", file.display()))),
            ([one], _) => one,
            (many, Some(t)) => many.iter().find(|e| tags_of(e).contains(t)).ok_or_else(|| {
                ImageError::NotFound(format!("{} holds {} images and none is tagged {t}", file.display(), many.len()))
            })?,
            (many, None) => {
                return Err(ImageError::InvalidReference(format!(
                    "{} holds {} images; choose one with --tag NAME",
                    file.display(),
                    many.len()
                )));
            }
        };
        let name = match tag {
            Some(t) => t.to_string(),
            None => tags_of(entry).first().map(|r| r.to_string()).ok_or_else(|| {
                ImageError::InvalidReference(format!(
                    "{} does not name its image; give one with --tag NAME",
                    file.display()
                ))
            })?,
        };
        let config = src.read(&entry.config)?;
        let config_digest = sha256_digest(&config);
        paths.insert(config_digest.clone(), entry.config.clone());
        let mut layers = Vec::new();
        for l in &entry.layers {
            let mut r = src.open_member(l)?.ok_or_else(|| ImageError::Corrupt(format!("the archive has no {l}")))?;
            let mut magic = [0u8; 4];
            let n = r.read(&mut magic).map_err(|e| ImageError::io(format!("reading {l}"), e))?;
            let media_type = match &magic[..n] {
                [0x1f, 0x8b, ..] => oci::OCI_LAYER_GZIP,
                [0x28, 0xb5, 0x2f, 0xfd] => oci::OCI_LAYER_ZSTD,
                _ => oci::OCI_LAYER_TAR,
            };
            drop(r);
            let r = src.open_member(l)?.ok_or_else(|| ImageError::Corrupt(format!("the archive has no {l}")))?;
            let (digest, size) = unpack::digest_of(r).map_err(|e| ImageError::io(format!("reading {l}"), e))?;
            paths.insert(digest.clone(), l.clone());
            layers.push(Descriptor {
                media_type: media_type.into(),
                digest,
                size: size.cast_signed(),
                ..Default::default()
            });
        }
        let manifest = Manifest {
            schema_version: 2,
            media_type: Some(oci::OCI_MANIFEST.into()),
            config: Some(Descriptor {
                media_type: oci::OCI_CONFIG.into(),
                digest: config_digest,
                size: i64::try_from(config.len()).unwrap_or(i64::MAX),
                ..Default::default()
            }),
            layers: Some(layers),
            manifests: None,
        };
        let bytes = serde_json::to_vec(&manifest).map_err(|e| ImageError::Io(e.to_string()))?;
        let digest = sha256_digest(&bytes);
        Ok((name, digest, bytes))
    }
}
