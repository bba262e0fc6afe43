//! Building layers and images in tests (this crate's and the runtime's): not part of the API.

use std::io::Write;

use sha2::{Digest, Sha256};

/// A layer tarball built entry by entry. Names are written raw, so tests can build the
/// malicious layers a real tar tool refuses to.
pub struct Layer {
    builder: tar::Builder<Vec<u8>>,
}

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer {
    pub fn new() -> Layer {
        Layer { builder: tar::Builder::new(Vec::new()) }
    }

    fn header(name: &[u8], kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(1_600_000_000);
        h.set_uid(0);
        h.set_gid(0);
        let n = &mut h.as_old_mut().name;
        assert!(name.len() < n.len(), "test entry names are short");
        n[..name.len()].copy_from_slice(name);
        h
    }

    fn push(mut self, mut h: tar::Header, data: &[u8]) -> Layer {
        h.set_cksum();
        self.builder.append(&h, data).expect("appending to a Vec");
        self
    }

    pub fn dir(self, path: &str, mode: u32) -> Layer {
        let h = Self::header(path.as_bytes(), tar::EntryType::Directory, mode, 0);
        self.push(h, &[])
    }

    pub fn file(self, path: &str, data: &[u8]) -> Layer {
        self.file_with(path, data, 0o644, 0, 0, 1_600_000_000)
    }

    pub fn file_with(self, path: &str, data: &[u8], mode: u32, uid: u64, gid: u64, mtime: u64) -> Layer {
        let mut h = Self::header(path.as_bytes(), tar::EntryType::Regular, mode, data.len() as u64);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mtime(mtime);
        self.push(h, data)
    }

    pub fn symlink(self, path: &str, target: &str) -> Layer {
        self.link_kind(path.as_bytes(), target.as_bytes(), tar::EntryType::Symlink)
    }

    pub fn hardlink(self, path: &str, target: &str) -> Layer {
        self.link_kind(path.as_bytes(), target.as_bytes(), tar::EntryType::Link)
    }

    pub fn link_kind(self, path: &[u8], target: &[u8], kind: tar::EntryType) -> Layer {
        let mut h = Self::header(path, kind, 0o777, 0);
        let l = &mut h.as_old_mut().linkname;
        l[..target.len()].copy_from_slice(target);
        self.push(h, &[])
    }

    /// An entry of any kind with a raw name (`../x`, `/etc/x`, devices).
    pub fn raw(self, name: &[u8], kind: tar::EntryType, data: &[u8]) -> Layer {
        let h = Self::header(name, kind, 0o644, data.len() as u64);
        self.push(h, data)
    }

    pub fn whiteout(self, path: &str) -> Layer {
        let (dir, name) = path.rsplit_once('/').map_or(("", path), |(d, n)| (d, n));
        let wh = if dir.is_empty() { format!(".wh.{name}") } else { format!("{dir}/.wh.{name}") };
        self.file(&wh, b"")
    }

    pub fn opaque(self, dir: &str) -> Layer {
        self.file(&format!("{dir}/.wh..wh..opq"), b"")
    }

    /// The uncompressed tarball.
    pub fn tar(self) -> Vec<u8> {
        self.builder.into_inner().expect("finishing a Vec")
    }
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("compressing into a Vec");
    e.finish().expect("compressing into a Vec")
}

/// An image config with these layers (uncompressed tarballs, lowest first) and `User`.
pub fn config(tars: &[Vec<u8>], user: Option<&str>, env: &[&str]) -> Vec<u8> {
    let diff_ids: Vec<String> = tars.iter().map(|t| sha256(t)).collect();
    let (os, arch) = crate::oci::this_platform();
    serde_json::to_vec(&serde_json::json!({
        "created": "2024-01-02T03:04:05Z",
        "architecture": arch,
        "os": os,
        "config": { "Env": env, "User": user.unwrap_or(""), "WorkingDir": "/work", "Cmd": ["sh"] },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))
    .expect("json")
}

/// An OCI image manifest for a config and (compressed or not) layer blobs.
pub fn manifest(config: &[u8], blobs: &[Vec<u8>]) -> Vec<u8> {
    let layers: Vec<_> = blobs
        .iter()
        .map(|b| {
            let mt = if b.starts_with(&[0x1f, 0x8b]) { crate::oci::OCI_LAYER_GZIP } else { crate::oci::OCI_LAYER_TAR };
            serde_json::json!({ "mediaType": mt, "digest": sha256(b), "size": b.len() })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": crate::oci::OCI_MANIFEST,
        "config": { "mediaType": crate::oci::OCI_CONFIG, "digest": sha256(config), "size": config.len() },
        "layers": layers,
    }))
    .expect("json")
}
