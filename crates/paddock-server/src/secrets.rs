//! Secrets at rest: sandbox endpoint tokens are derived, never stored, and every file the server
//! keeps in the data directory is readable by root only.
//!
//! A sandbox's token is HMAC-SHA256(server secret, sandbox id). The secret lives in
//! `<data>/token-key` (0600); the database holds no token at all, so a copy of it (or of its
//! WAL) opens nothing. Deleting `token-key` revokes every token given out so far.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The server secret tokens are derived from.
pub struct TokenKey([u8; 32]);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {cause}: check that the data directory is writable by the server and not on a read-only mount")]
pub struct SecretError {
    what: &'static str,
    path: PathBuf,
    cause: std::io::Error,
}

fn err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SecretError {
    let path = path.to_path_buf();
    move |cause| SecretError { what, path, cause }
}

impl TokenKey {
    /// Reads `<data>/token-key`, or creates it (0600, 32 random bytes) on first start.
    #[expect(clippy::disallowed_methods, reason = "runs once at startup, before the server serves anything")]
    pub fn load_or_create(data_dir: &Path) -> Result<Self, SecretError> {
        let path = data_dir.join("token-key");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key = <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| SecretError {
                    what: "reading the token key",
                    path: path.clone(),
                    cause: std::io::Error::other(format!(
                        "it holds {} bytes instead of 32; delete it to make a new one (this revokes every sandbox token given out)",
                        bytes.len()
                    )),
                })?;
                make_private(&path)?;
                return Ok(Self(key));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("reading the token key", &path)(e)),
        }
        let mut key = [0u8; 32];
        rustix::rand::getrandom(&mut key, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| err("creating the token key", &path)(e.into()))?;
        // create_new: two servers starting on one data directory must not each write a key and
        // hand out tokens the other rejects; the loser reads the winner's.
        let created = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path);
        match created {
            Ok(mut f) => {
                f.write_all(&key).and_then(|()| f.sync_all()).map_err(err("writing the token key", &path))?;
                Ok(Self(key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Self::load_or_create(data_dir),
            Err(e) => Err(err("creating the token key", &path)(e)),
        }
    }

    /// For tests: a key from known bytes.
    pub fn from_bytes(key: [u8; 32]) -> Self {
        Self(key)
    }

    fn mac(&self, sandbox_id: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(sandbox_id.as_bytes());
        mac
    }

    /// The token of one sandbox, as given out with its endpoints.
    pub fn token(&self, sandbox_id: &str) -> String {
        hex::encode(self.mac(sandbox_id).finalize().into_bytes())
    }

    /// The signature of a route to `port` of a sandbox valid until `expires`: 12 bytes of an
    /// HMAC over a message no sandbox token is made from (ids hold no NUL), in hex, so the
    /// whole route fits one DNS label.
    /// `epoch` is the sandbox's route epoch: revoking its routes moves it on.
    pub fn route_signature(&self, sandbox_id: &str, port: u16, expires: u64, epoch: i64) -> String {
        hex::encode(&self.route_mac(sandbox_id, port, expires, epoch).finalize().into_bytes()[..12])
    }

    fn route_mac(&self, sandbox_id: &str, port: u16, expires: u64, epoch: i64) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        // Epoch 0 signs what servers signed before routes could be revoked.
        let message = match epoch {
            0 => format!("route\0{sandbox_id}\0{port}\0{expires}"),
            n => format!("route\0{sandbox_id}\0{port}\0{expires}\0{n}"),
        };
        mac.update(message.as_bytes());
        mac
    }

    /// Whether `signature` signs that route at that epoch, compared in constant time.
    pub fn verify_route(&self, sandbox_id: &str, port: u16, expires: u64, epoch: i64, signature: &str) -> bool {
        let Ok(raw) = hex::decode(signature) else { return false };
        self.route_mac(sandbox_id, port, expires, epoch).verify_truncated_left(&raw).is_ok() && raw.len() == 12
    }

    /// The gateway token of one attempt of a run: names the run, its epoch and its sandbox, and
    /// is signed over a message no other token is made from.
    pub fn run_token(&self, run: &str, epoch: i64, sandbox_id: &str) -> String {
        let sig = hex::encode(self.run_mac(run, epoch, sandbox_id).finalize().into_bytes());
        format!("{run}.{epoch}.{sandbox_id}.{sig}")
    }

    fn run_mac(&self, run: &str, epoch: i64, sandbox_id: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(format!("run\0{run}\0{epoch}\0{sandbox_id}").as_bytes());
        mac
    }

    /// The run, epoch and sandbox a gateway token was made for, if its signature holds.
    pub fn verify_run_token(&self, token: &str) -> Option<(String, i64, String)> {
        let mut parts = token.split('.');
        let (run, epoch, sandbox, sig) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let epoch: i64 = epoch.parse().ok()?;
        let raw = hex::decode(sig).ok()?;
        self.run_mac(run, epoch, sandbox).verify_slice(&raw).ok()?;
        Some((run.to_owned(), epoch, sandbox.to_owned()))
    }

    /// The token of a sandbox's egress API (port 18080), given only with that port's endpoint:
    /// it may change what the sandbox reaches, so it is made from a message no sandbox token is.
    pub fn egress_token(&self, sandbox_id: &str) -> String {
        hex::encode(self.egress_mac(sandbox_id).finalize().into_bytes())
    }

    fn egress_mac(&self, sandbox_id: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(format!("egress\0{sandbox_id}").as_bytes());
        mac
    }

    /// Whether `token` is the egress token of `sandbox_id`, compared in constant time.
    pub fn verify_egress(&self, sandbox_id: &str, token: &[u8]) -> bool {
        let Ok(raw) = hex::decode(token) else { return false };
        self.egress_mac(sandbox_id).verify_slice(&raw).is_ok()
    }

    /// What gateway forwarders prove themselves with (the same for every sandbox, and across
    /// restarts, since sandboxes outlive a server): made from a message no token is.
    pub fn gateway_secret(&self) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(b"gateway-forwarder\0");
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `token` is the one of `sandbox_id`, compared in constant time.
    pub fn verify(&self, sandbox_id: &str, token: &[u8]) -> bool {
        let Ok(raw) = hex::decode(token) else { return false };
        self.mac(sandbox_id).verify_slice(&raw).is_ok()
    }
}

/// Makes a file in the data directory readable and writable by its owner only (root), for
/// files created before this was enforced or by a library that does not take a mode.
#[expect(clippy::disallowed_methods, reason = "at startup, and by `paddock tenant` (no server)")]
pub fn make_private(path: &Path) -> Result<(), SecretError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(err("restricting the permissions of", path))
}

/// Makes the data directory (0700, parents as needed) when it is missing, as the local runtime
/// does for its own: a server on the Kubernetes runtime has no other reason to make it.
/// An existing directory keeps its mode.
pub fn ensure_data_dir(path: &Path) -> Result<(), SecretError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(err("creating the data directory", path))
}

/// Creates the database file 0600 before SQLite opens it, and tightens the files an older
/// version left readable. SQLite gives its -wal and -shm files the database file's own mode,
/// so they come out 0600 too.
#[expect(clippy::disallowed_methods, reason = "at startup, and by `paddock tenant` (no server)")]
pub fn prepare_database_file(path: &Path) -> Result<(), SecretError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(err("creating the state database", path))?;
    make_private(path)?;
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        let side = PathBuf::from(side);
        if side.exists() {
            make_private(&side)?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[expect(clippy::disallowed_methods, reason = "a test's fixtures may block: each test has a runtime of its own")]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_per_sandbox_and_per_key() {
        let key = TokenKey::from_bytes([7; 32]);
        let a = key.token("sbx-a");
        assert_eq!(a.len(), 64);
        assert!(key.verify("sbx-a", a.as_bytes()));
        assert!(!key.verify("sbx-b", a.as_bytes()), "a token opens only its own sandbox");
        assert!(!key.verify("sbx-a", &a.as_bytes()[..62]));
        assert!(!key.verify("sbx-a", b"not hex"));
        assert!(!TokenKey::from_bytes([8; 32]).verify("sbx-a", a.as_bytes()), "another key, another token");
        let egress = key.egress_token("sbx-a");
        assert!(key.verify_egress("sbx-a", egress.as_bytes()) && !key.verify_egress("sbx-b", egress.as_bytes()));
        assert!(!key.verify_egress("sbx-a", a.as_bytes()), "a sandbox token is no egress token");
        assert!(!key.verify("sbx-a", egress.as_bytes()), "nor the other way round");
    }

    #[test]
    fn a_missing_data_directory_is_made_private() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("a/b/data");
        ensure_data_dir(&data).unwrap();
        assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o700);
        ensure_data_dir(&data).unwrap();
        prepare_database_file(&data.join("server.db")).unwrap();
    }

    #[test]
    fn the_key_file_is_created_once_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let first = TokenKey::load_or_create(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join("token-key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = TokenKey::load_or_create(dir.path()).unwrap();
        assert_eq!(first.token("sbx-x"), again.token("sbx-x"), "the key survives a restart");
        std::fs::write(dir.path().join("token-key"), b"short").unwrap();
        let e = TokenKey::load_or_create(dir.path()).unwrap_err().to_string();
        assert!(e.contains("5 bytes instead of 32") && e.contains("delete it"), "{e}");
    }
}
