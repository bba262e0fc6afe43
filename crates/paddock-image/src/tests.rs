//! Unit tests of unpacking, the store, import and user resolution (they run as root: unpacking
//! sets owners and overlay's trusted xattrs).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::{Image, ImageError, Store};
use paddock_testkit::image::{Layer, config, docker_save, gzip, manifest, sha256, sparse_layer};

fn unpack_into(tar: &[u8], dir: &Path) -> crate::error::Result<crate::unpack::Unpacked> {
    fs::create_dir_all(dir).unwrap();
    let limits = crate::Limits::default();
    crate::unpack::unpack(
        tar,
        dir,
        &crate::unpack::Bounds { limits: &limits, store: dir, image_before: 0, store_before: 0 },
    )
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = [0u8; 16];
    rustix::fs::lgetxattr(path, name, &mut buf).ok().map(|n| buf[..n].to_vec())
}

#[test]
fn whiteouts_become_char_devices_and_opaque_dirs_get_both_xattrs() {
    let t = tempfile::tempdir().unwrap();
    let tar = Layer::new().dir("a", 0o755).file("a/x", b"x").whiteout("gone").whiteout("a/old").opaque("a").tar();
    let out = unpack_into(&tar, t.path()).unwrap();
    assert_eq!(out.diff_id, sha256(&tar));
    for p in ["gone", "a/old"] {
        let m = fs::symlink_metadata(t.path().join(p)).unwrap();
        assert!(m.file_type().is_char_device(), "{p} is a whiteout device");
        assert_eq!(m.rdev(), 0);
    }
    assert!(!t.path().join(".wh.gone").exists());
    assert!(!t.path().join("a/.wh..wh..opq").exists());
    assert_eq!(xattr(&t.path().join("a"), "trusted.overlay.opaque").as_deref(), Some(&b"y"[..]));
    assert_eq!(xattr(&t.path().join("a"), "user.overlay.opaque").as_deref(), Some(&b"y"[..]));
    assert_eq!(fs::read(t.path().join("a/x")).unwrap(), b"x");
}

#[test]
fn an_entry_through_an_earlier_symlink_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let layer = t.path().join("layer");
    let target = outside.path().to_str().unwrap();
    for tar in [
        Layer::new().symlink("evil", target).file("evil/pwned", b"owned").tar(),
        Layer::new().symlink("up", "..").file("up/pwned", b"owned").tar(),
        Layer::new().dir("d", 0o755).symlink("d/l", target).file("d/l/pwned", b"owned").tar(),
        // A directory entry through the symlink must not be created either.
        Layer::new().symlink("evil", target).dir("evil/sub", 0o755).tar(),
    ] {
        let _ = fs::remove_dir_all(&layer);
        let err = unpack_into(&tar, &layer).unwrap_err();
        assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
        assert!(err.to_string().contains("symlink"), "{err}");
        assert!(!outside.path().join("pwned").exists());
        assert!(!outside.path().join("sub").exists());
        assert!(!t.path().join("pwned").exists());
    }
}

#[test]
fn dotdot_and_absolute_names_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let layer = t.path().join("layer");
    for tar in [
        Layer::new().raw(b"../escape", tar::EntryType::Regular, b"x").tar(),
        Layer::new().raw(b"a/../../escape", tar::EntryType::Regular, b"x").tar(),
        Layer::new().raw(b"/escape", tar::EntryType::Regular, b"x").tar(),
        Layer::new().file("f", b"x").hardlink("h", "../escape").tar(),
        Layer::new().link_kind(b"../escape", b"x", tar::EntryType::Symlink).tar(),
    ] {
        let _ = fs::remove_dir_all(&layer);
        let err = unpack_into(&tar, &layer).unwrap_err();
        assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
        assert!(!t.path().join("escape").exists());
    }
}

#[test]
fn setid_bits_are_stripped_owners_and_mtimes_kept() {
    let t = tempfile::tempdir().unwrap();
    let tar = Layer::new()
        .dir("bin", 0o2775)
        .file_with("bin/su", b"#!", 0o4755, 1234, 5678, 1_000_000)
        .file_with("bin/sg", b"#!", 0o2711, 0, 42, 1_000_000)
        .dir("tmp", 0o1777)
        .tar();
    let out = unpack_into(&tar, t.path()).unwrap();
    assert_eq!(out.size, 4);
    let su = fs::metadata(t.path().join("bin/su")).unwrap();
    assert_eq!(su.permissions().mode() & 0o7777, 0o755);
    assert_eq!((su.uid(), su.gid(), su.mtime()), (1234, 5678, 1_000_000));
    assert_eq!(fs::metadata(t.path().join("bin/sg")).unwrap().permissions().mode() & 0o7777, 0o711);
    assert_eq!(fs::metadata(t.path().join("bin")).unwrap().permissions().mode() & 0o7777, 0o775);
    assert_eq!(fs::metadata(t.path().join("tmp")).unwrap().permissions().mode() & 0o7777, 0o1777);
    assert_eq!(fs::metadata(t.path().join("bin")).unwrap().mtime(), 1_600_000_000);
}

#[test]
fn hard_links_symlinks_and_devices() {
    let t = tempfile::tempdir().unwrap();
    let tar = Layer::new()
        .file("a", b"data")
        .hardlink("b", "a")
        .symlink("s", "/etc/passwd")
        .hardlink("s2", "s")
        .raw(b"dev/sda", tar::EntryType::Block, b"")
        .raw(b"dev/null", tar::EntryType::Char, b"")
        .file("deep/er/file", b"implicit parents")
        .raw(b"run/fifo", tar::EntryType::Fifo, b"")
        .tar();
    // Parents the layer does not list are 0755 whatever the umask.
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let r = unpack_into(&tar, t.path());
    rustix::process::umask(old);
    r.unwrap();
    assert_eq!(fs::metadata(t.path().join("deep/er")).unwrap().permissions().mode() & 0o7777, 0o755);
    let fifo = fs::symlink_metadata(t.path().join("run/fifo")).unwrap();
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.permissions().mode() & 0o7777, 0o644);
    let (a, b) = (fs::metadata(t.path().join("a")).unwrap(), fs::metadata(t.path().join("b")).unwrap());
    assert_eq!(a.ino(), b.ino());
    // The symlink is stored, not followed, even by a hard link to it.
    assert_eq!(fs::read_link(t.path().join("s")).unwrap(), Path::new("/etc/passwd"));
    assert!(fs::symlink_metadata(t.path().join("s2")).unwrap().file_type().is_symlink());
    assert!(!t.path().join("dev/sda").exists() && !t.path().join("dev/null").exists());
    assert_eq!(fs::read(t.path().join("deep/er/file")).unwrap(), b"implicit parents");
    // A hard link to something not in the layer is refused.
    let err = unpack_into(&Layer::new().hardlink("x", "missing").tar(), &t.path().join("2")).unwrap_err();
    assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
}

#[test]
fn compressed_layers_and_diff_id_mismatch() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    assert_eq!(fs::metadata(store.dir()).unwrap().permissions().mode() & 0o777, 0o700);
    let tar = Layer::new().file("f", b"hello").tar();
    let zst = zstd::encode_all(&tar[..], 1).unwrap();
    store.unpack_layer(&gzip(&tar)[..], &sha256(&tar), 0).unwrap();
    assert_eq!(fs::read(store.layer_dir(&sha256(&tar)).unwrap().join("root/f")).unwrap(), b"hello");
    let other = Layer::new().file("g", b"zstd").tar();
    let zst2 = zstd::encode_all(&other[..], 1).unwrap();
    store.unpack_layer(&zst2[..], &sha256(&other), 0).unwrap();
    // Content that is not what the config promised: refused, and nothing published.
    let wrong = sha256(b"something else");
    let err = store.unpack_layer(&zst[..], &wrong, 0).unwrap_err();
    assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
    assert!(!store.has_layer(&wrong).unwrap());
    assert_eq!(fs::read_dir(store.dir().join("tmp")).unwrap().count(), 0);
    // A damaged gzip stream is corrupt content, not an I/O failure.
    let mut gz = gzip(&Layer::new().file("f", &[9u8; 50_000]).tar());
    let n = gz.len();
    gz[n / 2] ^= 0xff;
    gz[n / 2 + 1] ^= 0xff;
    let err = store.unpack_layer(&gz[..], &wrong, 0).unwrap_err();
    assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
    // Garbage is not a tarball.
    let err = store.unpack_layer(&b"not a tar at all, not at all, not at all"[..], &wrong, 0).unwrap_err();
    assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
}

/// Writes an OCI layout with one image of these layers; returns its manifest digest.
fn write_layout(dir: &Path, name: &str, tars: &[Vec<u8>], user: Option<&str>) -> String {
    let blobs: Vec<Vec<u8>> = tars.iter().map(|t| gzip(t)).collect();
    let cfg = config(tars, user, &["PATH=/usr/bin", "LANG=C.UTF-8"]);
    let man = manifest(&cfg, &blobs);
    fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    for b in blobs.iter().chain([&cfg, &man]) {
        fs::write(dir.join("blobs/sha256").join(&sha256(b)[7..]), b).unwrap();
    }
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": crate::oci::OCI_MANIFEST, "digest": sha256(&man), "size": man.len(),
            "annotations": { "io.containerd.image.name": name, "org.opencontainers.image.ref.name": "1.0" },
        }],
    });
    fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    sha256(&man)
}

fn tar_dir(dir: &Path, out: &Path) {
    let mut b = tar::Builder::new(fs::File::create(out).unwrap());
    b.append_dir_all(".", dir).unwrap();
    b.finish().unwrap();
}

fn passwd_layers() -> Vec<Vec<u8>> {
    vec![
        Layer::new()
            .dir("etc", 0o755)
            .file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n")
            .file("etc/group", b"root:x:0:\napp:x:1001:\nstaff:x:50:\n")
            .tar(),
        Layer::new()
            .dir("etc", 0o755)
            .file(
                "etc/passwd",
                b"root:x:0:0:root:/root:/bin/sh\napp:x:2000:2001::/home/app:/bin/sh\nweb:x:33:33::/:/x\n",
            )
            .tar(),
    ]
}

#[test]
fn import_an_oci_layout_directory_and_tar() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let layout = t.path().join("layout");
    let tars = vec![Layer::new().dir("etc", 0o755).file("etc/a", b"lower").file("etc/b", b"b").tar(), {
        Layer::new().dir("etc", 0o755).file("etc/a", b"upper").whiteout("etc/b").tar()
    }];
    let digest = write_layout(&layout, "example.com/team/app:1.0", &tars, None);
    let img = store.import(&layout, None).unwrap();
    assert_eq!(img.name, "example.com/team/app:1.0");
    assert_eq!(img.digest, digest);
    assert_eq!(img.layers.len(), 2);
    assert_eq!(fs::read(img.layers[0].join("etc/a")).unwrap(), b"lower");
    assert_eq!(fs::read(img.layers[1].join("etc/a")).unwrap(), b"upper");
    assert!(fs::symlink_metadata(img.layers[1].join("etc/b")).unwrap().file_type().is_char_device());
    assert_eq!(img.config.env, ["PATH=/usr/bin", "LANG=C.UTF-8"]);
    assert_eq!(img.config.working_dir.as_deref(), Some("/work"));
    assert_eq!(img.config.cmd, ["sh"]);
    assert_eq!(store.lookup("example.com/team/app:1.0").unwrap(), Some(img.clone()));
    assert_eq!(store.lookup(&format!("example.com/team/app@{digest}")).unwrap().unwrap().digest, digest);
    assert_eq!(store.lookup("example.com/team/app:2.0").unwrap(), None);
    // The same layout as a tar, under another name: layers are shared, not unpacked again.
    let tarball = t.path().join("layout.tar");
    tar_dir(&layout, &tarball);
    let again = store.import(&tarball, Some("mine")).unwrap();
    assert_eq!(again.name, "docker.io/library/mine:latest");
    assert_eq!(again.layers, img.layers);
    assert_eq!(fs::read_dir(store.dir().join("layers")).unwrap().count(), 2);
    let ls = store.list().unwrap();
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].names, ["docker.io/library/mine:latest", "example.com/team/app:1.0"]);
    assert!(ls[0].size >= 7);
    assert_eq!(ls[0].created.as_deref(), Some("2024-01-02T03:04:05Z"));
}

#[test]
fn import_a_damaged_layout_stores_nothing() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let layout = t.path().join("layout");
    let tars = vec![Layer::new().file("f", b"content").tar()];
    write_layout(&layout, "example.com/x:1", &tars, None);
    let blob = layout.join("blobs/sha256").join(&sha256(&gzip(&tars[0]))[7..]);
    let mut bytes = fs::read(&blob).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0xff;
    fs::write(&blob, bytes).unwrap();
    let err = store.import(&layout, None).unwrap_err();
    assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
    assert_eq!(fs::read_dir(store.dir().join("layers")).unwrap().count(), 0);
    assert_eq!(store.lookup("example.com/x:1").unwrap(), None);
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn import_a_docker_save_tarball() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let file = t.path().join("saved.tar.gz");
    let tars = vec![Layer::new().dir("usr", 0o755).file("usr/x", b"x").tar(), Layer::new().opaque("usr").tar()];
    docker_save(&file, &tars, &["python:3.11"], Some("1000"));
    let img = store.import(&file, None).unwrap();
    assert_eq!(img.name, "docker.io/library/python:3.11");
    assert_eq!(fs::read(img.layers[0].join("usr/x")).unwrap(), b"x");
    assert_eq!(xattr(&img.layers[1].join("usr"), "user.overlay.opaque").as_deref(), Some(&b"y"[..]));
    assert_eq!(store.lookup("python:3.11").unwrap().unwrap(), img);
    assert_eq!(store.image_user(&img).unwrap(), Some((1000, 0)));
    // Imported again (same content): the same digest, nothing unpacked twice.
    let again = store.import(&file, Some("other:tag")).unwrap();
    assert_eq!(again.digest, img.digest);
    assert!(store.dir().join("tmp").read_dir().unwrap().next().is_none());
}

#[test]
fn user_resolution_uses_the_top_most_account_files() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let layout = t.path().join("layout");
    write_layout(&layout, "example.com/u:1", &passwd_layers(), Some("app"));
    let mut img = store.import(&layout, None).unwrap();
    let mut user = |u: Option<&str>| {
        img.config.user = u.map(String::from);
        store.image_user(&img)
    };
    // The upper layer's /etc/passwd wins; /etc/group comes from the lower one.
    assert_eq!(user(Some("app")).unwrap(), Some((2000, 2001)));
    assert_eq!(user(Some("app:staff")).unwrap(), Some((2000, 50)));
    assert_eq!(user(Some("app:7")).unwrap(), Some((2000, 7)));
    assert_eq!(user(Some("1000")).unwrap(), Some((1000, 0)));
    assert_eq!(user(Some("33")).unwrap(), Some((33, 33)));
    assert_eq!(user(Some("1000:1000")).unwrap(), Some((1000, 1000)));
    assert_eq!(user(Some("root")).unwrap(), Some((0, 0)));
    assert_eq!(user(Some("")).unwrap(), None);
    assert_eq!(user(None).unwrap(), None);
    assert!(matches!(user(Some("nobody")), Err(ImageError::Config(_))));
    assert!(matches!(user(Some("app:nogroup")), Err(ImageError::Config(_))));

    // A top layer that deletes /etc/passwd hides the lower ones.
    let layout2 = t.path().join("layout2");
    let mut layers = passwd_layers();
    layers.push(Layer::new().dir("etc", 0o755).whiteout("etc/passwd").tar());
    write_layout(&layout2, "example.com/u:2", &layers, Some("app"));
    let img2 = store.import(&layout2, None).unwrap();
    assert!(matches!(store.image_user(&img2), Err(ImageError::Config(_))));
    // And without any passwd, root still means 0.
    let layout3 = t.path().join("layout3");
    write_layout(&layout3, "example.com/u:3", &[Layer::new().file("f", b"").tar()], Some("root"));
    let img3 = store.import(&layout3, None).unwrap();
    assert_eq!(store.image_user(&img3).unwrap(), Some((0, 0)));
}

/// A fresh store holding one imported single-layer image named `name` (file `f`).
fn store_with_one_image(name: &str) -> (tempfile::TempDir, Store, Image) {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let layout = t.path().join("layout");
    write_layout(&layout, name, &[Layer::new().file("f", b"content").tar()], None);
    let img = store.import(&layout, None).unwrap();
    (t, store, img)
}

#[test]
fn leases_keep_images_through_remove_and_prune() {
    let (_t, store, img) = store_with_one_image("example.com/l:1");
    store.lease("sbx-1", &img).unwrap();
    let err = store.remove("example.com/l:1").unwrap_err();
    assert!(matches!(err, ImageError::InUse(_)), "{err}");
    assert!(err.to_string().contains("sbx-1"));
    store.remove_with("example.com/l:1", true).unwrap();
    assert_eq!(store.lookup("example.com/l:1").unwrap(), None);
    // Untagged but held: listed with its holder, and prune keeps it.
    let ls = store.list().unwrap();
    assert_eq!((ls.len(), ls[0].names.len(), &ls[0].holders[..]), (1, 0, &["sbx-1".to_string()][..]));
    let report = store.prune().unwrap();
    assert_eq!(report.layers, 0);
    assert!(img.layers[0].join("f").exists());
    store.release("sbx-1").unwrap();
    store.release("sbx-1").unwrap();
    let report = store.prune().unwrap();
    assert_eq!((report.layers, report.images.len()), (1, 1));
    assert_eq!(report.images[0], img.digest);
    assert!(!img.layers[0].exists());
    assert!(store.list().unwrap().is_empty());
    assert!(matches!(store.remove("example.com/l:1"), Err(ImageError::NotFound(_))));
}

/// Leases written by a store before per-holder lease files (all in `leases.json`) still hold
/// their images until released; a lease file cut short holds nothing (and prune removes it); a
/// holder that is not a sandbox id cannot name a path.
#[test]
fn leases_of_the_old_single_file_still_hold_and_holders_name_no_path() {
    let (_t, store, img) = store_with_one_image("example.com/old:1");
    let legacy = format!("{{\"sbx-old\": \"{0}\", \"odd name\": \"{0}\"}}", img.digest);
    fs::write(store.dir().join("leases.json"), legacy).unwrap();
    // Cut short, not a name this store writes, a directory: none of them holds anything.
    fs::write(store.dir().join("leases/sbx-cut"), b"sha256:12").unwrap();
    fs::write(store.dir().join("leases/sbx.bak"), img.digest.as_bytes()).unwrap();
    fs::create_dir(store.dir().join("leases/sbx-dir")).unwrap();
    store.lease("sbx-new", &img).unwrap();
    let mut holders = store.list().unwrap()[0].holders.clone();
    holders.sort();
    assert_eq!(holders, ["odd name", "sbx-new", "sbx-old"]);
    assert!(matches!(store.remove("example.com/old:1"), Err(ImageError::InUse(_))));
    store.release("sbx-new").unwrap();
    assert!(!store.dir().join("leases/sbx-new").exists());
    assert_eq!(store.list().unwrap()[0].holders, ["odd name", "sbx-old"]);
    store.release("sbx-old").unwrap();
    store.release("odd name").unwrap();
    assert!(store.list().unwrap()[0].holders.is_empty());
    store.remove("example.com/old:1").unwrap();
    let report = store.prune().unwrap();
    assert_eq!(report.layers, 1);
    // Prune sweeps the lease file cut short, and leaves what this store did not write.
    assert!(!store.dir().join("leases/sbx-cut").exists());
    assert!(store.dir().join("leases/sbx.bak").exists() && store.dir().join("leases/sbx-dir").is_dir());
    for bad in ["", "../refs.json", "a/b", "-x", ".."] {
        assert!(matches!(store.lease(bad, &img), Err(ImageError::InvalidReference(_))), "{bad:?}");
        store.release(bad).unwrap();
    }
    assert!(store.dir().join("refs.json").exists());
}

#[test]
fn stale_temp_entries_are_cleaned() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    // A dead process's leftovers (pid 0 never names a live process under /proc here).
    let dead = store.dir().join("tmp/999999999-1-2-blob");
    fs::write(&dead, b"partial").unwrap();
    store.clean_stale_tmp();
    assert!(!dead.exists());
    // A layer's work directory goes when nobody holds its lock, and stays while someone does.
    let hex = "ab".repeat(32);
    let work = store.dir().join(format!("tmp/layer-{hex}"));
    fs::create_dir_all(work.join("root")).unwrap();
    fs::write(store.dir().join(format!("tmp/layer-{hex}.blob")), b"partial").unwrap();
    let held = store.lock(&format!("layer-{hex}.lock"), true).unwrap();
    store.clean_stale_tmp();
    assert!(work.exists());
    drop(held);
    store.clean_stale_tmp();
    assert!(!work.exists());
    assert!(!store.dir().join(format!("tmp/layer-{hex}.blob")).exists());
    let other = store.dir().join("tmp/layer-x");
    fs::create_dir_all(other.join("root")).unwrap();
    fs::write(store.dir().join("tmp/junk"), b"").unwrap();
    assert_eq!(store.prune().unwrap().temp_entries, 2);
    assert!(!other.exists());
}

#[test]
fn a_lease_of_an_image_pruned_meanwhile_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let layout = t.path().join("layout");
    write_layout(&layout, "example.com/gone:1", &[Layer::new().file("f", b"x").tar()], None);
    let img = store.import(&layout, None).unwrap();
    store.remove("example.com/gone:1").unwrap();
    store.prune().unwrap();
    assert!(matches!(store.lease("sbx", &img), Err(ImageError::NotFound(_))));
    assert!(store.list().unwrap().is_empty());
}

/// A full disk during an import (a 1 MiB tmpfs): a NoSpace error that says what to do, and a
/// store that still works and holds nothing half-written.
#[test]
fn a_full_disk_gives_no_space_and_no_corrupt_store() {
    let t = tempfile::tempdir().unwrap();
    let mnt = t.path().join("small");
    let _small = paddock_testkit::image::SmallTmpfs::mount(&mnt);
    // No free-space floor: this is about the disk running out all the same.
    let store =
        Store::open(&mnt.join("images")).unwrap().with_limits(crate::Limits { min_free: 0, ..Default::default() });
    let layout = t.path().join("layout");
    let small = Layer::new().file("small", b"fits").tar();
    write_layout(&layout, "example.com/small:1", std::slice::from_ref(&small), None);
    store.import(&layout, None).unwrap();
    let big_layout = t.path().join("big");
    let noise: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 7).to_le_bytes()[0]).collect();
    write_layout(&big_layout, "example.com/big:1", &[Layer::new().file("big", &noise).tar()], None);
    let err = store.import(&big_layout, None).unwrap_err();
    assert!(matches!(err, ImageError::NoSpace(_)), "{err}");
    assert!(err.to_string().contains("paddock image prune"), "{err}");
    assert_eq!(store.lookup("example.com/big:1").unwrap(), None);
    assert!(store.lookup("example.com/small:1").unwrap().is_some());
    assert_eq!(fs::read_dir(store.dir().join("tmp")).unwrap().count(), 0);
    assert_eq!(fs::read_dir(store.dir().join("layers")).unwrap().count(), 1);
}

fn store_with(t: &Path, limits: crate::Limits) -> Store {
    Store::open(&t.join("store")).unwrap().with_limits(limits)
}

/// Nothing of a refused layer stays: no layer, no work directory.
fn nothing_left(store: &Store, diff_id: &str) {
    assert!(!store.has_layer(diff_id).unwrap());
    assert_eq!(fs::read_dir(store.dir().join("tmp")).unwrap().count(), 0, "work left in tmp/");
}

#[test]
fn a_sparse_bomb_is_refused_by_its_ratio_before_it_fills_the_disk() {
    let t = tempfile::tempdir().unwrap();
    let store = store_with(t.path(), crate::Limits::default());
    // The attack of the hardening issue: 3 GiB declared in a layer of about 200 bytes.
    let tar = sparse_layer("big", 3 << 30, 0, b"x");
    let gz = gzip(&tar);
    assert!(gz.len() < 400, "{} bytes", gz.len());
    let err = store.unpack_layer(&gz[..], &sha256(&tar), 0).unwrap_err();
    assert!(matches!(err, ImageError::TooLarge(_)), "{err}");
    assert!(err.to_string().contains("--image-max-ratio") && err.to_string().contains("bomb"), "{err}");
    nothing_left(&store, &sha256(&tar));
    // Zeros compress a thousandfold as well: a plain 80 MiB file of them is refused the same way.
    let zeros = Layer::new().file("z", &vec![0u8; 80 << 20]).tar();
    let err = store.unpack_layer(&zstd::encode_all(&zeros[..], 1).unwrap()[..], &sha256(&zeros), 0).unwrap_err();
    assert!(err.to_string().contains("--image-max-ratio"), "{err}");
    nothing_left(&store, &sha256(&zeros));
}

#[test]
fn sparse_files_and_zero_blocks_unpack_as_holes() {
    let t = tempfile::tempdir().unwrap();
    let store = store_with(t.path(), crate::Limits { ratio: u64::MAX, ..Default::default() });
    let real = 96u64 << 20;
    let tar = sparse_layer("sparse", real, 40 << 20, b"data in the middle");
    store.unpack_layer(&gzip(&tar)[..], &sha256(&tar), 0).unwrap();
    let path = store.layer_dir(&sha256(&tar)).unwrap().join("root/sparse");
    let m = fs::metadata(&path).unwrap();
    assert_eq!(m.len(), real, "the declared size");
    assert!(m.blocks() * 512 < 1 << 20, "{} bytes on disk for a 96 MiB sparse file", m.blocks() * 512);
    let content = fs::read(&path).unwrap();
    assert_eq!(&content[40 << 20..(40 << 20) + 18], b"data in the middle");
    assert!(content[(40 << 20) - 4096..40 << 20] == [0u8; 4096][..] && content.last() == Some(&0));
    // A plain file's zero blocks become holes too; its data and a trailing hole read back.
    let mut plain = vec![7u8; 10_000];
    plain.extend(vec![0u8; 1 << 20]);
    plain.extend(vec![9u8; 5000]);
    plain.extend(vec![0u8; 64 << 10]);
    let tar = Layer::new().file("plain", &plain).tar();
    let size = store.unpack_layer(&gzip(&tar)[..], &sha256(&tar), 0).unwrap();
    assert_eq!(size, plain.len() as u64, "holes count as what they read back as");
    let path = store.layer_dir(&sha256(&tar)).unwrap().join("root/plain");
    assert_eq!(fs::read(&path).unwrap(), plain);
    assert!(fs::metadata(&path).unwrap().blocks() * 512 < 200 << 10);
}

#[test]
fn each_bound_names_its_limit_and_leaves_nothing() {
    let t = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13).to_le_bytes()[0]).collect();
    let big = Layer::new().file("f", &data).tar();
    let cases: [(crate::Limits, u64, &str); 3] = [
        (crate::Limits { layer_bytes: 1 << 20, ..Default::default() }, 0, "--image-max-layer"),
        (crate::Limits { image_bytes: 4 << 20, ..Default::default() }, 2 << 20, "--image-max"),
        (crate::Limits { min_free: u64::MAX, ..Default::default() }, 0, "--min-free"),
    ];
    for (limits, before, flag) in cases {
        let store = store_with(t.path(), limits);
        let err = store.unpack_layer(&gzip(&big)[..], &sha256(&big), before).unwrap_err();
        assert!(err.to_string().contains(flag), "{flag}: {err}");
        nothing_left(&store, &sha256(&big));
    }
    let mut many = Layer::new();
    for i in 0..20 {
        many = many.file(&format!("f{i}"), b"x");
    }
    let many = many.tar();
    let store = store_with(t.path(), crate::Limits { layer_entries: 10, ..Default::default() });
    let err = store.unpack_layer(&many[..], &sha256(&many), 0).unwrap_err();
    assert!(matches!(err, ImageError::TooLarge(_)) && err.to_string().contains("--image-max-entries"), "{err}");
    nothing_left(&store, &sha256(&many));
    // The store's own bound counts what it already holds.
    let store = store_with(t.path(), crate::Limits { store_bytes: Some(5 << 20), ..Default::default() });
    store.unpack_layer(&gzip(&big)[..], &sha256(&big), 0).unwrap();
    let other = Layer::new().file("g", &data).tar();
    let err = store.unpack_layer(&gzip(&other)[..], &sha256(&other), 0).unwrap_err();
    assert!(err.to_string().contains("--image-store-max"), "{err}");
    nothing_left(&store, &sha256(&other));
}
