//! Building layers and images in tests, and a real registry to serve them: Debian's
//! `docker-registry` on loopback, `htpasswd` for its auth, `openssl` for a CA.

use std::io::Write;

use sha2::{Digest, Sha256};

// The OCI image spec's media types (paddock-image keeps its own; this crate must not depend on
// it, since its tests use this one).
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// This machine's OCI platform, for test images' configs (the architectures tests run on).
fn this_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    ("linux", arch)
}

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

    /// A directory owned by `uid`:`gid` (an image user's home, say).
    pub fn dir_owned(self, path: &str, mode: u32, uid: u64, gid: u64) -> Layer {
        let mut h = Self::header(path.as_bytes(), tar::EntryType::Directory, mode, 0);
        h.set_uid(uid);
        h.set_gid(gid);
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

/// A layer with one GNU sparse file `name` that declares `real` bytes and holds `data` at
/// offset `at` (the rest is holes): a few hundred bytes once compressed, whatever `real` is.
pub fn sparse_layer(name: &str, real: u64, at: u64, data: &[u8]) -> Vec<u8> {
    let octal = |field: &mut [u8; 12], v: u64| field.copy_from_slice(format!("{v:011o}\0").as_bytes());
    let mut h = tar::Header::new_gnu();
    h.set_path(name).unwrap();
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(data.len() as u64);
    let gnu = h.as_gnu_mut().unwrap();
    octal(&mut gnu.sparse[0].offset, at);
    octal(&mut gnu.sparse[0].numbytes, data.len() as u64);
    // The map ends with an empty chunk at the declared size: the trailing hole.
    octal(&mut gnu.sparse[1].offset, real);
    octal(&mut gnu.sparse[1].numbytes, 0);
    gnu.set_real_size(real);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, data).unwrap();
    b.into_inner().unwrap()
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
    let (os, arch) = this_platform();
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
            let mt = if b.starts_with(&[0x1f, 0x8b]) { OCI_LAYER_GZIP } else { OCI_LAYER_TAR };
            serde_json::json!({ "mediaType": mt, "digest": sha256(b), "size": b.len() })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": { "mediaType": OCI_CONFIG, "digest": sha256(config), "size": config.len() },
        "layers": layers,
    }))
    .expect("json")
}

/// A `docker save` archive in the classic layout: `<id>/layer.tar`, `<hex>.json`, manifest.json.
pub fn docker_save(out: &std::path::Path, tars: &[Vec<u8>], tags: &[&str], user: Option<&str>) {
    let cfg = config(tars, user, &["A=1"]);
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    let cfg_name = format!("{}.json", &sha256(&cfg)[7..]);
    add(&cfg_name, &cfg);
    let mut layers = Vec::new();
    for (i, t) in tars.iter().enumerate() {
        let name = format!("layer{i}/layer.tar");
        add(&name, t);
        layers.push(name);
    }
    let m = serde_json::json!([{ "Config": cfg_name, "RepoTags": tags, "Layers": layers }]);
    add("manifest.json", &serde_json::to_vec(&m).unwrap());
    std::fs::write(out, gzip(&b.into_inner().unwrap())).unwrap();
}

pub const REGISTRY_USER: &str = "tester";
pub const REGISTRY_PASSWORD: &str = "s3cret-pw";

fn find(bin: &str, package: &str) -> std::path::PathBuf {
    let look = || {
        ["/usr/bin", "/usr/sbin", "/usr/local/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(bin))
            .find(|p| p.exists())
    };
    if let Some(p) = look() {
        return p;
    }
    // `cargo test --workspace` on a fresh Debian machine (the README's test command) runs as
    // root: install the package once, as CI's setup would, rather than fail.
    if rustix::process::geteuid().is_root() {
        // One apt-get at a time: the tests of this binary run on parallel threads.
        static APT: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = APT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = look() {
            return p;
        }
        let _ = std::process::Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::process::Stdio::null())
            .status();
        if let Some(p) = look() {
            return p;
        }
    }
    panic!(
        "{bin} is not installed: these tests need a real registry; run `apt-get install -y {package}` (CI installs it)"
    );
}

/// A private certificate authority and a server certificate it signed for 127.0.0.1 (made
/// with the `openssl` command, in a directory the caller owns).
#[derive(Clone)]
pub struct TestCa {
    /// The CA's certificate (PEM): what a client is told to trust.
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl TestCa {
    pub fn make(dir: &std::path::Path, name: &str) -> TestCa {
        let openssl = find("openssl", "openssl");
        let run = |args: &[&str]| {
            let out = std::process::Command::new(&openssl).args(args).current_dir(dir).output().unwrap();
            assert!(out.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        };
        let f = |suffix: &str| format!("{name}-{suffix}");
        let (ca_key, ca, key, csr, cert, ext) =
            (f("ca.key"), f("ca.pem"), f("server.key"), f("server.csr"), f("server.pem"), f("server.ext"));
        run(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            &ca_key,
            "-out",
            &ca,
            "-subj",
            &format!("/CN={name} test CA"),
        ]);
        run(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(
            dir.join(&ext),
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ]);
        TestCa { ca: dir.join(ca), cert: dir.join(cert), key: dir.join(key) }
    }
}

/// A real registry (Debian's `docker-registry`) on 127.0.0.1 with its storage in a directory
/// the caller owns; the process is killed (by its pid) on drop.
pub struct Registry {
    child: std::process::Child,
    dir: std::path::PathBuf,
    pub host: String,
    auth: bool,
    tls: Option<TestCa>,
}

impl Registry {
    /// Starts one with its storage, config and log in `dir`; `auth` requires
    /// [`REGISTRY_USER`] / [`REGISTRY_PASSWORD`] (htpasswd, bcrypt).
    pub fn start(dir: &std::path::Path, auth: bool) -> Registry {
        Registry::start_with(dir, auth, None)
    }

    /// [`Registry::start`], speaking HTTPS with `tls`'s server certificate when given.
    pub fn start_with(dir: &std::path::Path, auth: bool, tls: Option<&TestCa>) -> Registry {
        use std::process::{Command, Stdio};
        let bin = find("docker-registry", "docker-registry");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut yml = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: test-secret\n",
            dir.join("data").display()
        );
        if let Some(t) = tls {
            yml.push_str(&format!("  tls:\n    certificate: {}\n    key: {}\n", t.cert.display(), t.key.display()));
        }
        if auth {
            let htpasswd = find("htpasswd", "apache2-utils");
            let out = Command::new(htpasswd).args(["-Bbn", REGISTRY_USER, REGISTRY_PASSWORD]).output().unwrap();
            assert!(out.status.success(), "htpasswd failed: {}", String::from_utf8_lossy(&out.stderr));
            std::fs::write(dir.join("htpasswd"), out.stdout).unwrap();
            yml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: paddock-test\n    path: {}\n",
                dir.join("htpasswd").display()
            ));
        }
        std::fs::write(dir.join("config.yml"), yml).unwrap();
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new(bin)
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let reg =
            Registry { child, dir: dir.to_path_buf(), host: format!("127.0.0.1:{port}"), auth, tls: tls.cloned() };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(&reg.host).is_err() {
            assert!(std::time::Instant::now() < deadline, "the registry did not start; its log:\n{}", reg.log());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        reg
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Successful GETs of a blob, from the registry's own request log.
    pub fn blob_gets(&self, digest: &str) -> usize {
        let needle = format!("/blobs/{digest}");
        self.log()
            .lines()
            .filter(|l| {
                l.contains("response completed")
                    && l.contains("http.request.method=GET")
                    && l.contains(&needle)
                    && l.contains("http.response.status=200")
            })
            .count()
    }

    /// Where the registry keeps a blob's bytes.
    pub fn blob_file(&self, digest: &str) -> std::path::PathBuf {
        let hex = &digest[7..];
        self.dir.join("data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    }

    pub fn registry_auth(&self) -> oci_client::secrets::RegistryAuth {
        if self.auth {
            oci_client::secrets::RegistryAuth::Basic(REGISTRY_USER.into(), REGISTRY_PASSWORD.into())
        } else {
            oci_client::secrets::RegistryAuth::Anonymous
        }
    }

    pub fn client(&self) -> oci_client::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (protocol, extra_root_certificates) = match &self.tls {
            None => (oci_client::client::ClientProtocol::Http, vec![]),
            Some(t) => (
                oci_client::client::ClientProtocol::Https,
                vec![oci_client::client::Certificate {
                    encoding: oci_client::client::CertificateEncoding::Pem,
                    data: std::fs::read(&t.ca).unwrap(),
                }],
            ),
        };
        oci_client::Client::try_from(oci_client::client::ClientConfig {
            protocol,
            extra_root_certificates,
            ..Default::default()
        })
        .unwrap()
    }

    /// Pushes an image of these layer tarballs (gzip-compressed); returns its manifest digest.
    pub async fn push(&self, repo_tag: &str, tars: &[Vec<u8>], user: Option<&str>) -> String {
        let client = self.client();
        let reference: oci_client::Reference = format!("{}/{repo_tag}", self.host).parse().unwrap();
        let layers: Vec<oci_client::client::ImageLayer> =
            tars.iter().map(|t| oci_client::client::ImageLayer::oci_v1_gzip(gzip(t), None)).collect();
        let cfg = oci_client::client::Config::oci_v1(config(tars, user, &["PATH=/usr/bin:/bin", "FROM_IMAGE=1"]), None);
        client.push(&reference, &layers, cfg, &self.registry_auth(), None).await.unwrap();
        client.fetch_manifest_digest(&reference, &self.registry_auth()).await.unwrap()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A 1 MiB tmpfs mounted at `dir` (created here) for tests of a full disk, unmounted on drop.
/// Needs root.
pub struct SmallTmpfs(std::path::PathBuf);

impl SmallTmpfs {
    pub fn mount(dir: &std::path::Path) -> SmallTmpfs {
        std::fs::create_dir(dir).unwrap();
        rustix::mount::mount("tmpfs", dir, "tmpfs", rustix::mount::MountFlags::empty(), c"size=1m")
            .expect("mounting a small tmpfs (the tests run as root)");
        SmallTmpfs(dir.to_owned())
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}
