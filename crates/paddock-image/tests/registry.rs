//! paddock-image against a real registry on loopback: Debian's `docker-registry` (the CNCF
//! distribution registry), started per test in a temporary directory, holding images these
//! tests build and push themselves. Needs root (unpacking sets owners and trusted xattrs) and
//! `apt-get install docker-registry apache2-utils`; without them the tests fail saying so.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use oci_client::Reference;
use oci_client::secrets::RegistryAuth;
use paddock_image::{Credentials, ImageError, Progress, PullOptions, RegistryCa, RegistryConfig, Store};
use paddock_testkit::image::{
    self as testutil, Layer, REGISTRY_PASSWORD as PASSWORD, REGISTRY_USER as USER, config, gzip, sha256, sparse_layer,
};

/// A registry in a temporary directory: the process is killed before its directory goes.
struct Registry {
    reg: testutil::Registry,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start(auth: bool) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        Registry { reg: testutil::Registry::start(dir.path(), auth), _dir: dir }
    }
}

impl std::ops::Deref for Registry {
    type Target = testutil::Registry;
    fn deref(&self) -> &testutil::Registry {
        &self.reg
    }
}

fn opts() -> PullOptions {
    PullOptions::default()
}

fn no_progress(_: &Progress) {}

/// A three-layer image: a base, one that deletes a file and replaces a directory, one with
/// a set-uid file.
fn three_layers() -> Vec<Vec<u8>> {
    vec![
        Layer::new()
            .dir("etc", 0o755)
            .file("etc/passwd", b"root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
            .file("etc/motd", b"hello")
            .dir("opt", 0o755)
            .dir("opt/old", 0o755)
            .file("opt/old/a", b"a")
            .tar(),
        Layer::new()
            .dir("etc", 0o755)
            .whiteout("etc/motd")
            .dir("opt", 0o755)
            .dir("opt/old", 0o755)
            .opaque("opt/old")
            .file("opt/old/b", b"b")
            .tar(),
        Layer::new().dir("usr", 0o755).file_with("usr/su", b"#!/bin/sh\n", 0o4755, 0, 0, 1_700_000_000).tar(),
    ]
}

fn store() -> (tempfile::TempDir, Store) {
    let t = tempfile::tempdir().unwrap();
    let s = Store::open(&t.path().join("images")).unwrap();
    (t, s)
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = [0u8; 16];
    rustix::fs::lgetxattr(path, name, &mut buf).ok().map(|n| buf[..n].to_vec())
}

/// Bytes a directory takes on disk.
fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(dir).unwrap().flatten() {
        let m = fs::symlink_metadata(e.path()).unwrap();
        total += m.blocks() * 512;
        if m.is_dir() {
            total += disk_usage(&e.path());
        }
    }
    total
}

/// The hardening issue's attack: an image whose 200-byte layer declares a 3 GiB sparse file
/// wrote 3.1 GiB. Now the pull stops at the compression-ratio bound, says so, and keeps nothing;
/// an image past --image-max across its layers is refused at the layer that crosses it.
#[tokio::test]
async fn a_pull_is_bounded_by_the_image_limits_and_keeps_nothing_of_a_refused_layer() {
    let reg = Registry::start(false);
    let bomb = sparse_layer("var/log/lastlog", 3 << 30, 0, b"x");
    reg.push("evil/bomb:1", std::slice::from_ref(&bomb), None).await;
    let (_t, store) = store();
    let err = store.pull(&format!("{}/evil/bomb:1", reg.host), &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::TooLarge(_)), "{err}");
    assert!(err.to_string().contains("--image-max-ratio"), "{err}");
    assert_eq!(fs::read_dir(store.dir().join("layers")).unwrap().count(), 0);
    assert_eq!(fs::read_dir(store.dir().join("tmp")).unwrap().count(), 0);
    assert!(disk_usage(store.dir()) < 1 << 20, "{} bytes in the store", disk_usage(store.dir()));
    assert!(store.list().unwrap().is_empty());

    let two = vec![Layer::new().file("a", &noise(1, 2 << 20)).tar(), Layer::new().file("b", &noise(2, 2 << 20)).tar()];
    reg.push("big/two:1", &two, None).await;
    let (_t2, bounded) = self::store();
    let store = bounded.with_limits(paddock_image::Limits { image_bytes: 3 << 20, ..Default::default() });
    let err = store.pull(&format!("{}/big/two:1", reg.host), &opts(), &no_progress).await.unwrap_err();
    assert!(err.to_string().contains("--image-max") && err.to_string().contains("one image"), "{err}");
    assert_eq!(
        fs::read_dir(store.dir().join("layers")).unwrap().count(),
        1,
        "the layer that crossed the bound is not kept"
    );
    assert_eq!(fs::read_dir(store.dir().join("tmp")).unwrap().count(), 0);
    assert!(store.list().unwrap().is_empty(), "nor is the image");
}

#[tokio::test]
async fn pull_by_tag_and_by_digest_with_whiteouts_and_opaque_dirs() {
    let reg = Registry::start(false);
    let tars = three_layers();
    let digest = reg.push("team/app:1.0", &tars, Some("app")).await;
    let (_t, store) = store();
    let events = Mutex::new(Vec::new());
    let record = |p: &Progress| events.lock().unwrap().push(p.clone());
    let name = format!("{}/team/app:1.0", reg.host);
    let img = store.pull(&name, &opts(), &record).await.unwrap();
    assert_eq!(img.name, name);
    assert_eq!(img.digest, digest);
    assert_eq!(img.layers.len(), 3);
    // Layer order is lowest first; each layer holds only its own changes.
    assert_eq!(fs::read(img.layers[0].join("etc/motd")).unwrap(), b"hello");
    let wh = fs::symlink_metadata(img.layers[1].join("etc/motd")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    assert_eq!(xattr(&img.layers[1].join("opt/old"), "trusted.overlay.opaque").as_deref(), Some(&b"y"[..]));
    assert_eq!(xattr(&img.layers[1].join("opt/old"), "user.overlay.opaque").as_deref(), Some(&b"y"[..]));
    assert!(!img.layers[1].join("opt/old/a").exists() && img.layers[1].join("opt/old/b").exists());
    assert_eq!(fs::metadata(img.layers[2].join("usr/su")).unwrap().mode() & 0o7777, 0o755);
    assert_eq!(img.config.env, ["PATH=/usr/bin:/bin", "FROM_IMAGE=1"]);
    assert_eq!(store.image_user(&img).unwrap(), Some((1000, 1000)));
    let events = events.into_inner().unwrap();
    for t in &tars {
        let blob = sha256(&gzip(t));
        let total = gzip(t).len() as u64;
        assert!(
            events.iter().any(|e| *e == Progress::Layer { digest: blob.clone(), done: total, total }),
            "no completed progress for {blob}: {events:?}"
        );
    }
    assert!(matches!(events.last(), Some(Progress::Done { .. })));

    // By digest: the same image, nothing downloaded again (even the manifest is local).
    let by_digest = format!("{}/team/app@{digest}", reg.host);
    assert_eq!(store.lookup(&by_digest).unwrap().unwrap().layers, img.layers);
    let (_t2, other) = store_pair_dir();
    let img2 = other.pull(&by_digest, &opts(), &no_progress).await.unwrap();
    assert_eq!(img2.digest, digest);
    assert_eq!(img2.name, by_digest);
    let again = store.pull(&by_digest, &opts(), &no_progress).await.unwrap();
    assert_eq!(again.layers, img.layers);
    for t in &tars {
        assert_eq!(reg.blob_gets(&sha256(&gzip(t))), 2, "one GET per store");
    }
    // A tag pull again resolves the manifest but fetches no layer.
    store.pull(&name, &opts(), &no_progress).await.unwrap();
    for t in &tars {
        assert_eq!(reg.blob_gets(&sha256(&gzip(t))), 2);
    }
    // Missing tags and repositories are NotFound.
    let err = store.pull(&format!("{}/team/app:nope", reg.host), &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::NotFound(_)), "{err}");
    let err = store.pull(&format!("{}/team/none:1", reg.host), &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::NotFound(_)), "{err}");
}

fn store_pair_dir() -> (tempfile::TempDir, Store) {
    store()
}

#[tokio::test]
async fn a_corrupted_blob_in_the_registry_is_rejected_and_nothing_stored() {
    let reg = Registry::start(false);
    let tars = vec![
        Layer::new().file("good", b"fine").tar(),
        Layer::new().file("big", &vec![7u8; 300_000]).file("x", b"y").tar(),
    ];
    reg.push("c/app:1", &tars, None).await;
    let bad = sha256(&gzip(&tars[1]));
    let path = reg.blob_file(&bad);
    let mut bytes = fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    fs::write(&path, bytes).unwrap();
    let (_t, store) = store();
    let name = format!("{}/c/app:1", reg.host);
    let err = store.pull(&name, &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains(&bad), "{err}");
    assert_eq!(store.lookup(&name).unwrap(), None);
    assert!(store.list().unwrap().is_empty());
    let tmp: Vec<_> = fs::read_dir(store.dir().join("tmp")).unwrap().collect();
    assert!(tmp.is_empty(), "left behind: {tmp:?}");
    let layers: Vec<_> = fs::read_dir(store.dir().join("layers")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!layers.contains(&sha256(&tars[1])[7..].into()), "the corrupt layer was published");
}

/// Layers unpack while they download, so a blob that unpacks to exactly the right layer but is
/// not the blob the manifest names (the same tar compressed otherwise) is only caught by its
/// digest at the end: it must still be refused, and nothing published.
#[tokio::test]
async fn a_blob_that_unpacks_right_but_is_not_the_named_one_is_refused_after_its_download() {
    use std::io::Write;
    let reg = Registry::start(false);
    let tars = vec![Layer::new().file("a", &vec![b'a'; 400_000]).file("b", b"bee").tar()];
    reg.push("s/app:1", &tars, None).await;
    let named = sha256(&gzip(&tars[0]));
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&tars[0]).unwrap();
    let other = e.finish().unwrap();
    assert_ne!(sha256(&other), named, "the same compression: nothing to test");
    fs::write(reg.blob_file(&named), &other).unwrap();
    let (_t, store) = store();
    let name = format!("{}/s/app:1", reg.host);
    let err = store.pull(&name, &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains(&named), "{err}");
    assert_eq!(store.lookup(&name).unwrap(), None);
    let layers: Vec<_> = fs::read_dir(store.dir().join("layers")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(layers.is_empty(), "a layer was published: {layers:?}");
    let tmp: Vec<_> = fs::read_dir(store.dir().join("tmp")).unwrap().collect();
    assert!(tmp.is_empty(), "left behind: {tmp:?}");
    // Put right, the same store pulls it.
    fs::write(reg.blob_file(&named), gzip(&tars[0])).unwrap();
    store.pull(&name, &opts(), &no_progress).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_pulls_download_each_blob_once() {
    let reg = Registry::start(false);
    // Incompressible layers, so the downloads take long enough to overlap.
    let tars =
        vec![Layer::new().file("a", &noise(1, 3_000_000)).tar(), Layer::new().file("b", &noise(2, 3_000_000)).tar()];
    reg.push("con/app:1", &tars, None).await;
    let (t, s1) = store();
    let s2 = Store::open(&t.path().join("images")).unwrap();
    let name = format!("{}/con/app:1", reg.host);
    let o = opts();
    let (a, b) = tokio::join!(s1.pull(&name, &o, &no_progress), s2.pull(&name, &o, &no_progress));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    for t in &tars {
        assert_eq!(reg.blob_gets(&sha256(&gzip(t))), 1, "log:\n{}", reg.log());
    }
    let config_digest = sha256(&config(&tars, None, &["PATH=/usr/bin:/bin", "FROM_IMAGE=1"]));
    assert_eq!(reg.blob_gets(&config_digest), 1);
    assert_eq!(fs::read(a.layers[1].join("b")).unwrap().len(), 3_000_000);
}

#[tokio::test]
async fn auth_required_refused_without_credentials_works_with_them() {
    let reg = Registry::start(true);
    let tars = vec![Layer::new().file("secret", b"data").tar()];
    reg.push("private/app:1", &tars, None).await;
    let (_t, store) = store();
    let name = format!("{}/private/app:1", reg.host);
    let err = store.pull(&name, &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized(_)), "{err}");
    assert!(err.to_string().contains("--username"), "{err}");
    let wrong = PullOptions {
        private: true,
        auth: Some(Credentials { username: USER.into(), password: "wrong".into() }),
        registries: RegistryConfig::default(),
    };
    let err = store.pull(&name, &wrong, &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized(_)), "{err}");
    let right = PullOptions {
        private: true,
        auth: Some(Credentials { username: USER.into(), password: PASSWORD.into() }),
        registries: RegistryConfig::default(),
    };
    let img = store.pull(&name, &right, &no_progress).await.unwrap();
    assert_eq!(fs::read(img.layers[0].join("secret")).unwrap(), b"data");

    // Stored now, but private to the credentials that pulled it: a caller without them (another
    // tenant naming the same image) does not find it in the store, by tag or by digest, and
    // the registry refuses it.
    let by_digest = format!("{}/private/app@{}", reg.host, img.digest);
    for reference in [&name, &by_digest] {
        assert!(store.lookup_for(reference, None).unwrap().is_none(), "{reference}");
        assert!(store.lookup_for(reference, wrong.auth.as_ref()).unwrap().is_none(), "{reference}");
        assert_eq!(store.lookup_for(reference, right.auth.as_ref()).unwrap().unwrap().digest, img.digest);
        assert!(store.lookup(reference).unwrap().is_some(), "the operator sees every stored image");
        for other in [&opts(), &wrong] {
            let err = store.pull(reference, other, &no_progress).await.unwrap_err();
            assert!(matches!(err, ImageError::Unauthorized(_)), "{reference}: {err}");
        }
    }
    // The credentials that pulled it still find it, without the network.
    assert_eq!(store.pull(&by_digest, &right, &no_progress).await.unwrap().digest, img.digest);

    // The operator's pull (`paddock image pull --username`) is for the whole host: public.
    let (_t2, host_store) = crate::store();
    let operator = PullOptions { private: false, ..right };
    host_store.pull(&name, &operator, &no_progress).await.unwrap();
    assert!(host_store.lookup_for(&name, None).unwrap().is_some());
}

/// Incompressible bytes, so layers keep their size on the wire.
fn noise(seed: u8, len: usize) -> Vec<u8> {
    let mut x = u32::from(seed) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x.to_le_bytes()[0]
        })
        .collect()
}

const CHILD_ENV: &str = "PADDOCK_IMAGE_TEST_CHILD_PULL";

/// Not a test on its own: the pull that `a_pull_killed_half_way_...` runs in a child process
/// (this test binary again) and kills with SIGKILL. Slowed down so the kill lands mid-layer.
#[tokio::test]
async fn child_pull_for_the_kill_test() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let mut parts = spec.splitn(3, '|');
    let (dir, name, marker) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap().to_string());
    let store = Store::open(Path::new(dir)).unwrap();
    let progress = move |p: &Progress| {
        if let Progress::Layer { done, .. } = p
            && *done > 0
        {
            let _ = fs::write(&marker, b"");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    store.pull(name, &opts(), &progress).await.unwrap();
    panic!("the pull finished before it was killed");
}

#[tokio::test]
async fn a_pull_killed_half_way_leaves_nothing_complete_and_the_next_pull_succeeds() {
    let reg = Registry::start(false);
    let big = noise(3, 16_000_000);
    let tars = vec![Layer::new().file("small", b"s").tar(), Layer::new().file("big", &big).tar()];
    reg.push("kill/app:1", &tars, None).await;
    let (t, store) = store();
    let name = format!("{}/kill/app:1", reg.host);
    let marker = t.path().join("downloading");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_pull_for_the_kill_test", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{}|{name}|{}", store.dir().display(), marker.display()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(child.try_wait().unwrap().is_none(), "the child pull ended before it was killed");
        assert!(Instant::now() < deadline, "the child pull never started downloading");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();

    assert_eq!(store.lookup(&name).unwrap(), None, "a killed pull must not look complete");
    assert!(!store.dir().join("layers").join(&sha256(&tars[1])[7..]).exists());
    let leftovers: Vec<_> = fs::read_dir(store.dir().join("tmp")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!leftovers.is_empty(), "the killed pull left no partial download (did it finish?)");

    // Worse debris, as a crash during unpacking would leave it.
    let hex = &sha256(&tars[1])[7..];
    fs::create_dir_all(store.dir().join(format!("tmp/layer-{hex}/root/usr"))).unwrap();
    fs::write(store.dir().join(format!("tmp/layer-{hex}/root/usr/half")), b"half").unwrap();
    fs::write(store.dir().join("tmp/999999999-1-1-blob"), b"partial").unwrap();

    let img = store.pull(&name, &opts(), &no_progress).await.unwrap();
    assert_eq!(fs::read(img.layers[1].join("big")).unwrap(), big);
    assert!(!img.layers[1].join("usr").exists(), "debris of the earlier attempt leaked into the layer");
    let left: Vec<_> = fs::read_dir(store.dir().join("tmp")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "stale temp entries remain: {left:?}");
}

/// A disk that fills during a pull (the store on a 1 MiB tmpfs, a 3 MB incompressible layer):
/// a NoSpace error that says what to do; nothing of the image published or left in `tmp`; the
/// store still pulls what fits.
#[tokio::test]
async fn a_disk_that_fills_during_a_pull_gives_no_space_and_no_corrupt_store() {
    let reg = Registry::start(false);
    reg.push("full/small:1", &[Layer::new().file("small", b"fits").tar()], None).await;
    let big = vec![Layer::new().file("small", b"fits").tar(), Layer::new().file("big", &noise(5, 3_000_000)).tar()];
    reg.push("full/big:1", &big, None).await;
    let t = tempfile::tempdir().unwrap();
    let mnt = t.path().join("small");
    let _small = testutil::SmallTmpfs::mount(&mnt);
    let floored = Store::open(&mnt.join("images")).unwrap();
    let (small, big_name) = (format!("{}/full/small:1", reg.host), format!("{}/full/big:1", reg.host));
    // With the default floor of free space (1 GiB), this disk is full already: refused up front.
    let err = floored.pull(&small, &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::NoSpace(_)) && err.to_string().contains("--min-free"), "{err}");
    // Without it, the disk itself runs out.
    let store = floored.with_limits(paddock_image::Limits { min_free: 0, ..Default::default() });

    let err = store.pull(&big_name, &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::NoSpace(_)), "{err}");
    assert!(err.to_string().contains("paddock image prune"), "{err}");
    assert_eq!(store.lookup(&big_name).unwrap(), None, "a pull that ran out of disk must not look complete");
    let left: Vec<_> = fs::read_dir(store.dir().join("tmp")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "a pull that ran out of disk left {left:?}");
    assert!(
        !store.dir().join("layers").join(&sha256(&big[1])[7..]).exists(),
        "the layer that did not fit was published"
    );

    let img = store.pull(&small, &opts(), &no_progress).await.unwrap();
    assert_eq!(fs::read(img.layers[0].join("small")).unwrap(), b"fits");
    assert_eq!(store.list().unwrap().len(), 1);
}

#[tokio::test]
async fn prune_keeps_a_leased_image_and_removes_it_after_release() {
    let reg = Registry::start(false);
    let tars = vec![Layer::new().file("keep", b"me").tar(), Layer::new().file("and", b"me").tar()];
    reg.push("lease/app:1", &tars, None).await;
    let (_t, store) = store();
    let name = format!("{}/lease/app:1", reg.host);
    let img = store.pull(&name, &opts(), &no_progress).await.unwrap();
    store.lease("sbx-a", &img).unwrap();
    assert_eq!(store.list().unwrap()[0].holders, ["sbx-a"]);
    assert!(matches!(store.remove(&name), Err(ImageError::InUse(_))));
    store.remove_with(&name, true).unwrap();
    let report = store.prune().unwrap();
    assert_eq!(report.layers, 0);
    assert!(img.layers.iter().all(|l| l.exists()));
    store.release("sbx-a").unwrap();
    let report = store.prune().unwrap();
    assert_eq!(report.layers, 2);
    assert_eq!(report.images, std::slice::from_ref(&img.digest));
    assert!(img.layers.iter().all(|l| !l.exists()));
    assert!(store.list().unwrap().is_empty());
}

#[tokio::test]
async fn mirrors_and_multi_arch_indexes() {
    let reg = Registry::start(false);
    // Two platform images and an index naming both: the pull takes this machine's.
    let ours = vec![Layer::new().file("arch", b"ours").tar()];
    let theirs = vec![Layer::new().file("arch", b"theirs").tar()];
    let ours_digest = reg.push("multi/app:ours", &ours, None).await;
    let theirs_digest = reg.push("multi/app:theirs", &theirs, None).await;
    let client = reg.client();
    let size = |tag: &str| {
        let r: Reference = format!("{}/multi/app:{tag}", reg.host).parse().unwrap();
        let c = client.clone();
        async move {
            let (b, _) = c
                .pull_manifest_raw(&r, &RegistryAuth::Anonymous, &["application/vnd.oci.image.manifest.v1+json"])
                .await
                .unwrap();
            b.len()
        }
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let other_arch = if arch == "s390x" { "ppc64le" } else { "s390x" };
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            { "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": theirs_digest, "size": size("theirs").await,
              "platform": { "architecture": other_arch, "os": "linux" } },
            { "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": ours_digest, "size": size("ours").await,
              "platform": { "architecture": arch, "os": "linux" } },
        ],
    });
    let index: oci_client::manifest::OciImageIndex = serde_json::from_value(index).unwrap();
    let r: Reference = format!("{}/multi/app:all", reg.host).parse().unwrap();
    client.push_manifest_list(&r, &RegistryAuth::Anonymous, index).await.unwrap();

    // Pulled through a mirror of a registry that does not exist.
    let (_t, store) = store();
    let o = PullOptions {
        private: false,
        auth: None,
        registries: RegistryConfig {
            // The first mirror is down: the next one serves.
            mirrors: vec![
                ("registry.example.invalid".into(), "127.0.0.1:1".into()),
                ("registry.example.invalid".into(), reg.host.clone()),
            ],
            ..Default::default()
        },
    };
    let img = store.pull("registry.example.invalid/multi/app:all", &o, &no_progress).await.unwrap();
    assert_eq!(img.name, "registry.example.invalid/multi/app:all");
    assert_eq!(img.digest, ours_digest);
    assert_eq!(fs::read(img.layers[0].join("arch")).unwrap(), b"ours");
    assert_eq!(store.lookup("registry.example.invalid/multi/app:all").unwrap().unwrap().digest, ours_digest);
    // Without the mirror, the nonexistent registry is a clear registry error.
    let err = store.pull("registry.example.invalid/multi/app:all", &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::Registry(_)), "{err}");
    assert!(err.to_string().contains("cannot reach"), "{err}");
}

#[tokio::test]
async fn a_private_registry_is_trusted_through_its_own_ca_and_for_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let ca = testutil::TestCa::make(dir.path(), "private");
    let other = testutil::TestCa::make(dir.path(), "other");
    let reg_dir = dir.path().join("registry");
    fs::create_dir(&reg_dir).unwrap();
    let reg = testutil::Registry::start_with(&reg_dir, false, Some(&ca));
    let digest = reg.push("team/app:1.0", &three_layers(), None).await;
    let name = format!("{}/team/app:1.0", reg.host);
    let trusting = |host: &str, ca: &Path| PullOptions {
        private: false,
        auth: None,
        registries: RegistryConfig { cas: vec![RegistryCa::load(host, ca).unwrap()], ..Default::default() },
    };

    // Its own CA, given for it: pulled over HTTPS.
    let (_t, trusted) = store();
    let img = trusted.pull(&name, &trusting(&reg.host, &ca.ca), &no_progress).await.unwrap();
    assert_eq!(img.digest, digest);
    assert_eq!(fs::read(img.layers[0].join("etc/motd")).unwrap(), b"hello");

    // Another CA for it: its certificate is not trusted, and the error names the flag.
    let (_t2, other_store) = store();
    let err = other_store.pull(&name, &trusting(&reg.host, &other.ca), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::Registry(_)), "{err}");
    assert!(err.to_string().contains(&format!("--registry-ca {}=CA.pem", reg.host)), "{err}");

    // Its CA given for another registry vouches for nothing here (a loopback registry without
    // a CA of its own is spoken to in plain HTTP, which this one refuses).
    let err = other_store.pull(&name, &trusting("127.0.0.1:1", &ca.ca), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::Registry(_)), "{err}");
    assert!(err.to_string().contains("speaks HTTPS"), "{err}");
    assert!(other_store.lookup(&name).unwrap().is_none(), "a refused pull stored the image");
}

/// A private pull's config and layers are in the store, found by digest. Another tenant's
/// registry (public, its own) serves manifests naming them: one names the private layers'
/// diff_ids over a layer of its own, one names the private config and layer but has neither
/// (it learnt the digests, not the content). Neither may get private content out of the store;
/// a registry that really has the same content gets it, after handing it over once.
#[tokio::test]
async fn a_manifest_naming_private_content_by_digest_does_not_get_it_from_the_store() {
    let private = Registry::start(true);
    let evil = Registry::start(false);
    let secret = vec![Layer::new().file("secret", b"the private layer").tar()];
    private.push("private/app:1", &secret, None).await;
    let (_t, store) = store();
    let right = PullOptions {
        private: true,
        auth: Some(Credentials { username: USER.into(), password: PASSWORD.into() }),
        registries: RegistryConfig::default(),
    };
    let img = store.pull(&format!("{}/private/app:1", private.host), &right, &no_progress).await.unwrap();
    assert_eq!(fs::read(img.layers[0].join("secret")).unwrap(), b"the private layer");

    // 1. A config naming the private diff_id, over a layer of the attacker's own.
    let client = evil.client();
    let own = Layer::new().file("decoy", b"mine").tar();
    let crafted = config(&secret, None, &["PATH=/usr/bin:/bin"]);
    let reference: Reference = format!("{}/evil/diffid:1", evil.host).parse().unwrap();
    client
        .push(
            &reference,
            &[oci_client::client::ImageLayer::oci_v1_gzip(gzip(&own), None)],
            oci_client::client::Config::oci_v1(crafted, None),
            &RegistryAuth::Anonymous,
            None,
        )
        .await
        .unwrap();
    let name = format!("{}/evil/diffid:1", evil.host);
    let err = store.pull(&name, &opts(), &no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
    assert!(store.lookup_for(&name, None).unwrap().is_none());

    // 2. The private config, then the private layer, named by digest with its blob gone from
    //    the registry (pushed only because a registry refuses a manifest naming absent blobs).
    let config_digest = sha256(&config(&secret, None, &["PATH=/usr/bin:/bin", "FROM_IMAGE=1"]));
    let layer_digest = sha256(&gzip(&secret[0]));
    assert!(store.dir().join("blobs/sha256").join(&config_digest[7..]).exists(), "the test names the private config");
    for gone in [&config_digest, &layer_digest] {
        let other = Registry::start(false);
        other.push("evil/copy:1", &secret, None).await;
        fs::remove_file(other.blob_file(gone)).unwrap();
        let name = format!("{}/evil/copy:1", other.host);
        let err = store.pull(&name, &opts(), &no_progress).await.unwrap_err();
        assert!(matches!(err, ImageError::NotFound(_) | ImageError::Registry(_)), "{gone}: {err}");
        assert!(store.lookup_for(&name, None).unwrap().is_none());
    }

    // 3. A registry that has the content hands it over once, and then it is public.
    evil.push("evil/honest:1", &secret, None).await;
    let name = format!("{}/evil/honest:1", evil.host);
    let honest = store.pull(&name, &opts(), &no_progress).await.unwrap();
    assert_eq!(evil.blob_gets(&layer_digest), 1, "log:\n{}", evil.log());
    assert_eq!(fs::read(honest.layers[0].join("secret")).unwrap(), b"the private layer");
    assert_eq!(honest.layers, img.layers, "the stored layer serves both");
    evil.push("evil/again:1", &secret, None).await;
    store.pull(&format!("{}/evil/again:1", evil.host), &opts(), &no_progress).await.unwrap();
    assert_eq!(evil.blob_gets(&layer_digest), 1, "public now: not downloaded again");
}
