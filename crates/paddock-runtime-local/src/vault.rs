//! A sandbox's credential vault and credential-proxy CA on disk, in its root-only directory:
//! the vault sealed (ChaCha20-Poly1305 under the data directory's vault key, the sandbox's id
//! as associated data, so a sealed vault cannot be moved to another sandbox), the CA's key
//! readable by root only. The enforcer gets both on its stdin when it starts; nothing of
//! either is ever inside the sandbox.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use paddock_core::runtime::{RuntimeError, SandboxId};
use paddock_core::vault::{Secret, Vault};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

use crate::layout::DataDir;

/// Where the credential proxy's files appear inside a sandbox (a read-only tmpfs).
pub const CA_DIR_INSIDE: &str = "/run/paddock";
pub const CA_INSIDE: &str = "/run/paddock/ca.pem";
pub const BUNDLE_INSIDE: &str = "/run/paddock/ca-bundle.pem";

/// The variables common clients take a trust store from, and which file each gets.
pub const CA_ENV: &[(&str, &str)] = &[
    ("SSL_CERT_FILE", BUNDLE_INSIDE),
    ("REQUESTS_CA_BUNDLE", BUNDLE_INSIDE),
    ("CURL_CA_BUNDLE", BUNDLE_INSIDE),
    ("GIT_SSL_CAINFO", BUNDLE_INSIDE),
    ("NODE_EXTRA_CA_CERTS", CA_INSIDE),
];

fn sealed_file(dd: &DataDir, id: &SandboxId) -> PathBuf {
    dd.sandbox(id).join("vault.sealed")
}

pub fn ca_cert_file(dd: &DataDir, id: &SandboxId) -> PathBuf {
    dd.sandbox(id).join("ca.pem")
}

fn ca_key_file(dd: &DataDir, id: &SandboxId) -> PathBuf {
    dd.sandbox(id).join("ca.key")
}

fn sys(what: String) -> impl FnOnce(std::io::Error) -> RuntimeError {
    move |e| RuntimeError::from_io(what, &e)
}

fn write_private(path: &Path, body: &[u8], mode: u32) -> Result<(), RuntimeError> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    };
    write().map_err(sys(format!("saving {}", path.display())))
}

/// The data directory's vault key, made on first use (root's, 0600).
fn key(dd: &DataDir) -> Result<LessSafeKey, RuntimeError> {
    let path = dd.root().join("vault.key");
    let bytes = match fs::read(&path) {
        Ok(b) if b.len() == 32 => b,
        Ok(_) => {
            return Err(RuntimeError::System(format!(
                "{} is not a 32-byte key: restore it from a backup (sealed vaults need it)",
                path.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut b = vec![0u8; 32];
            rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())
                .map_err(|e| RuntimeError::System(format!("getrandom: {e}")))?;
            // Made with O_EXCL: two creates at once keep one key.
            match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
                Ok(mut f) => f.write_all(&b).map_err(sys(format!("writing {}", path.display())))?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return key(dd),
                Err(e) => return Err(RuntimeError::from_io(format!("making {}", path.display()), &e)),
            }
            b
        }
        Err(e) => return Err(RuntimeError::from_io(format!("reading {}", path.display()), &e)),
    };
    let unbound = UnboundKey::new(&CHACHA20_POLY1305, &bytes).map_err(|_| RuntimeError::System("vault key".into()))?;
    Ok(LessSafeKey::new(unbound))
}

/// Seals and saves a sandbox's vault; `None` removes it.
pub fn store(dd: &DataDir, id: &SandboxId, vault: Option<&Vault>) -> Result<(), RuntimeError> {
    let path = sealed_file(dd, id);
    let Some(vault) = vault else {
        return match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(RuntimeError::from_io(format!("removing {}", path.display()), &e))
            }
            _ => Ok(()),
        };
    };
    let mut plain = serde_json::to_vec(vault).map_err(|e| RuntimeError::System(e.to_string()))?;
    let mut nonce = [0u8; NONCE_LEN];
    rustix::rand::getrandom(&mut nonce, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| RuntimeError::System(format!("getrandom: {e}")))?;
    key(dd)?
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(id.as_str().as_bytes()), &mut plain)
        .map_err(|_| RuntimeError::System("sealing the vault failed".into()))?;
    let mut body = nonce.to_vec();
    body.extend_from_slice(&plain);
    zeroize::Zeroize::zeroize(&mut plain);
    write_private(&path, &body, 0o600)
}

/// A sandbox's vault, unsealed; `None` when it has none.
pub fn load(dd: &DataDir, id: &SandboxId) -> Result<Option<Vault>, RuntimeError> {
    let path = sealed_file(dd, id);
    let mut body = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RuntimeError::from_io(format!("reading {}", path.display()), &e)),
    };
    if body.len() < NONCE_LEN {
        return Err(RuntimeError::System(format!("{} is damaged: delete the vault and set it again", path.display())));
    }
    let (nonce, sealed) = body.split_at_mut(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| RuntimeError::System("nonce".into()))?;
    let plain = key(dd)?.open_in_place(nonce, Aad::from(id.as_str().as_bytes()), sealed).map_err(|_| {
        RuntimeError::System(format!(
            "{} does not open with this data directory's vault.key (damaged, or the key was replaced): delete the vault and set it again",
            path.display()
        ))
    })?;
    let vault = serde_json::from_slice(plain).map_err(|e| RuntimeError::System(format!("{}: {e}", path.display())));
    zeroize::Zeroize::zeroize(&mut body);
    vault.map(Some)
}

/// Makes a sandbox's credential-proxy CA (at its create).
pub fn make_ca(dd: &DataDir, id: &SandboxId) -> Result<(), RuntimeError> {
    let (cert, key) = paddock_egress::intercept::generate_ca(id.as_str()).map_err(RuntimeError::System)?;
    write_private(&ca_key_file(dd, id), key.as_bytes(), 0o600)?;
    write_private(&ca_cert_file(dd, id), cert.as_bytes(), 0o644)
}

/// The CA's key, for the enforcer; `None` for a sandbox made without the credential proxy.
pub fn ca_key(dd: &DataDir, id: &SandboxId) -> Option<Secret> {
    fs::read_to_string(ca_key_file(dd, id)).ok().map(Secret::new)
}

/// Trust stores images keep, in the order they are looked for.
const SYSTEM_BUNDLES: &[&str] =
    &["etc/ssl/certs/ca-certificates.crt", "etc/pki/tls/certs/ca-bundle.crt", "etc/ssl/cert.pem"];
const MAX_BUNDLE: u64 = 8 << 20;

/// The root's own trust store followed by the sandbox's CA, for [`BUNDLE_INSIDE`]. The root
/// may be an image's: its files are opened with every symlink resolved inside it, so an image
/// cannot point this at a host file.
pub fn bundle(root: &Path, ca: &[u8]) -> Vec<u8> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let mut out = Vec::new();
    if let Ok(dir) = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) {
        for rel in SYSTEM_BUNDLES {
            let Ok(fd) = rustix::fs::openat2(
                &dir,
                *rel,
                OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
                Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
            ) else {
                continue;
            };
            let file = fs::File::from(fd);
            if !file.metadata().is_ok_and(|m| m.is_file()) {
                continue;
            }
            let _ = std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_BUNDLE), &mut out);
            if !out.is_empty() {
                break;
            }
        }
    }
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(ca);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_vault_opens_only_for_its_sandbox_and_holds_no_value_in_clear() {
        let tmp = tempfile::tempdir().unwrap();
        let dd = DataDir::new(tmp.path());
        let id = SandboxId::parse("abcdefabcdef").unwrap();
        fs::create_dir_all(dd.sandbox(&id)).unwrap();
        let mut v = Vault { revision: 3, ..Default::default() };
        v.credentials.push(paddock_core::vault::Stored {
            name: "t".into(),
            value: Secret::new("very-secret-value"),
            revision: 3,
        });
        store(&dd, &id, Some(&v)).unwrap();
        let raw = fs::read(sealed_file(&dd, &id)).unwrap();
        assert!(!raw.windows(17).any(|w| w == b"very-secret-value"));
        assert_eq!(load(&dd, &id).unwrap(), Some(v));
        // Moved to another sandbox's directory, it does not open.
        let other = SandboxId::parse("bbbbbbbbbbbb").unwrap();
        fs::create_dir_all(dd.sandbox(&other)).unwrap();
        fs::copy(sealed_file(&dd, &id), sealed_file(&dd, &other)).unwrap();
        assert!(load(&dd, &other).unwrap_err().to_string().contains("does not open"));
        store(&dd, &id, None).unwrap();
        assert_eq!(load(&dd, &id).unwrap(), None);
    }

    #[test]
    fn the_bundle_does_not_follow_an_images_symlink_out_of_its_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir_all(root.join("etc/ssl/certs")).unwrap();
        let outside = tmp.path().join("host-secret");
        fs::write(&outside, "HOST FILE\n").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
        let b = bundle(&root, b"CA\n");
        assert_eq!(b, b"CA\n".to_vec());
        fs::remove_file(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
        fs::write(root.join("etc/ssl/certs/ca-certificates.crt"), "SYSTEM").unwrap();
        assert_eq!(bundle(&root, b"CA\n"), b"SYSTEM\nCA\n".to_vec());
    }
}
