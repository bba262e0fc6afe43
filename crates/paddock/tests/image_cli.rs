//! `paddock image ...` as a user runs it: against a real registry on loopback (Debian's
//! `docker-registry`), and with archives built here. Runs as root (CI does): unpacking sets
//! file owners.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use paddock_testkit::image::{self as testutil, Layer, docker_save};

const EXE: &str = env!("CARGO_BIN_EXE_paddock");

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn paddock(data: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    let mut child = Command::new(EXE)
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running paddock");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ok(out: Out) -> Out {
    assert_eq!(out.code, 0, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    out
}

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "paddock image unpacks layers with their owners: run as root (CI does)"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn pull_ls_rm_prune_against_a_registry() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let reg = testutil::Registry::start(&dir.path().join("registry").tap_mkdir(), false);
    let tars = vec![Layer::new().file("a", b"one").tar(), Layer::new().file("b", b"two").tar()];
    let digest = runtime().block_on(reg.push("cli/app:1", &tars, None));
    let data = dir.path().join("data");
    let name = format!("{}/cli/app:1", reg.host);

    let out = ok(paddock(&data, &["image", "pull", &name], None));
    assert_eq!(out.stdout.trim(), format!("{name} {digest}"));
    // Not a terminal: a line per layer, no redrawn progress.
    assert_eq!(out.stderr.matches("downloaded, unpacking").count(), 2, "{}", out.stderr);
    assert!(!out.stderr.contains('\r'), "{}", out.stderr);
    let again = ok(paddock(&data, &["image", "pull", &name], None));
    assert_eq!(again.stderr.matches("already stored").count(), 2, "{}", again.stderr);

    let ls: serde_json::Value =
        serde_json::from_str(&ok(paddock(&data, &["--json", "image", "ls"], None)).stdout).unwrap();
    assert_eq!(ls[0]["names"][0], name.as_str());
    assert_eq!(ls[0]["digest"], digest.as_str());
    assert_eq!(ls[0]["layers"], 2);
    let human = ok(paddock(&data, &["image", "ls"], None)).stdout;
    assert!(human.lines().nth(1).unwrap().starts_with(&name), "{human}");

    let rm = ok(paddock(&data, &["image", "rm", &name], None));
    assert!(rm.stdout.contains(&format!("untagged {name}")), "{}", rm.stdout);
    assert!(rm.stdout.contains("freed"), "{}", rm.stdout);
    let ls: serde_json::Value =
        serde_json::from_str(&ok(paddock(&data, &["--json", "image", "ls"], None)).stdout).unwrap();
    assert_eq!(ls, serde_json::json!([]));
    assert_eq!(std::fs::read_dir(data.join("images/layers")).unwrap().count(), 0);
    let prune: serde_json::Value =
        serde_json::from_str(&ok(paddock(&data, &["--json", "image", "prune"], None)).stdout).unwrap();
    assert_eq!(prune["layers"], 0);

    let missing = paddock(&data, &["image", "rm", &name], None);
    assert_eq!(missing.code, 125);
    assert!(missing.stderr.contains("not in the store"), "{}", missing.stderr);
}

#[test]
fn two_pull_processes_download_each_layer_once() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let reg = testutil::Registry::start(&dir.path().join("registry").tap_mkdir(), false);
    let noise = |seed: u32| -> Vec<u8> {
        let mut x = seed | 1;
        (0..4_000_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x.to_le_bytes()[0]
            })
            .collect()
    };
    let tars = vec![Layer::new().file("a", &noise(1)).tar(), Layer::new().file("b", &noise(2)).tar()];
    runtime().block_on(reg.push("two/app:1", &tars, None));
    let data = dir.path().join("data");
    let name = format!("{}/two/app:1", reg.host);
    let spawn = || {
        Command::new(EXE)
            .arg("--data-dir")
            .arg(&data)
            .args(["image", "pull", &name])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    for t in &tars {
        assert_eq!(reg.blob_gets(&testutil::sha256(&testutil::gzip(t))), 1, "{}", reg.log());
    }
}

/// As with Docker's `registry-mirrors`: a bare mirror serves Docker Hub's names, so `python:3.11`
/// (docker.io/library/python) comes from it. Given here as a URL, the form Docker's daemon.json
/// takes.
#[test]
fn a_docker_hub_short_name_is_pulled_from_a_bare_mirror() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let reg = testutil::Registry::start(&dir.path().join("registry").tap_mkdir(), false);
    let tars = vec![Layer::new().file("m", b"from the mirror").tar()];
    let digest = runtime().block_on(reg.push("library/mirrored:3.11", &tars, None));
    let data = dir.path().join("data");
    let mirror = format!("http://{}/", reg.host);
    let out = ok(paddock(&data, &["--registry-mirror", &mirror, "image", "pull", "mirrored:3.11"], None));
    assert_eq!(out.stdout.trim(), format!("docker.io/library/mirrored:3.11 {digest}"), "{}", out.stderr);
    assert_eq!(reg.blob_gets(&testutil::sha256(&testutil::gzip(&tars[0]))), 1, "{}", reg.log());
}

#[test]
fn pull_with_password_stdin() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let reg = testutil::Registry::start(&dir.path().join("registry").tap_mkdir(), true);
    runtime().block_on(reg.push("private/app:1", &[Layer::new().file("s", b"secret").tar()], None));
    let data = dir.path().join("data");
    let name = format!("{}/private/app:1", reg.host);
    let refused = paddock(&data, &["image", "pull", &name], None);
    assert_eq!(refused.code, 125);
    assert!(refused.stderr.contains("--password-stdin"), "{}", refused.stderr);
    let args = ["image", "pull", &name, "--username", testutil::REGISTRY_USER, "--password-stdin"];
    ok(paddock(&data, &args, Some(&format!("{}\n", testutil::REGISTRY_PASSWORD))));
}

#[test]
fn import_a_docker_save_archive_and_bad_input() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("saved.tar.gz");
    docker_save(&file, &[Layer::new().file("etc/os-release", b"ID=test\n").tar()], &["saved:1"], None);
    let out =
        ok(paddock(&data, &["--json", "image", "import", file.to_str().unwrap(), "--tag", "local/py:3.11"], None));
    let img: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(img["name"], "docker.io/local/py:3.11");
    assert_eq!(img["config"]["env"][0], "A=1");
    let ls = ok(paddock(&data, &["image", "ls"], None)).stdout;
    assert!(ls.contains("docker.io/local/py:3.11"), "{ls}");

    // 125: the command failed; 2: the command line itself is wrong (clap's usage error).
    for (args, code, says) in [
        (vec!["image", "pull", "Not A Name"], 125, "invalid image reference"),
        (vec!["image", "pull", "127.0.0.1:1/x/y:1"], 125, "cannot reach registry 127.0.0.1:1"),
        (vec!["image", "--registry-mirror", "docker.io=", "pull", "x"], 2, "is not [REGISTRY=]MIRROR"),
        (vec!["image", "--registry-mirror", "http://mirror/v2/library", "pull", "x"], 2, "is not [REGISTRY=]MIRROR"),
        (vec!["image", "import", "/nonexistent/file.tar"], 125, "/nonexistent/file.tar"),
    ] {
        let out = paddock(&data, &args, None);
        assert_eq!(out.code, code, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}

impl TapMkdir for std::path::PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

#[test]
fn with_pulling_off_a_missing_image_is_refused_with_what_to_do_and_nothing_is_fetched() {
    require_root();
    let data = tempfile::tempdir().unwrap();
    // A registry address nothing listens on: were a pull attempted, the error would name it.
    let out =
        paddock(data.path(), &["--pull", "never", "run", "--image", "127.0.0.1:1/team/tool:1", "--", "true"], None);
    assert_eq!(out.code, 125, "{}", out.stderr);
    for says in ["not in this host's image store", "--pull never", "paddock image import"] {
        assert!(out.stderr.contains(says), "{says:?} missing: {}", out.stderr);
    }
    assert!(!out.stderr.contains("cannot reach registry"), "a pull was attempted: {}", out.stderr);
}

#[test]
fn a_private_registry_is_pulled_from_with_its_ca() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let ca = testutil::TestCa::make(dir.path(), "private");
    let reg = testutil::Registry::start_with(&dir.path().join("registry").tap_mkdir(), false, Some(&ca));
    let tars = vec![Layer::new().file("a", b"one").tar()];
    let digest = runtime().block_on(reg.push("cli/tls:1", &tars, None));
    let data = dir.path().join("data");
    let name = format!("{}/cli/tls:1", reg.host);

    let without = paddock(&data, &["image", "pull", &name], None);
    assert_ne!(without.code, 0);
    assert!(without.stderr.contains(&format!("--registry-ca {}=CA.pem", reg.host)), "{}", without.stderr);

    let flag = format!("{}={}", reg.host, ca.ca.display());
    let out = ok(paddock(&data, &["image", "pull", "--registry-ca", &flag, &name], None));
    assert_eq!(out.stdout.trim(), format!("{name} {digest}"));

    // A file that is not a certificate is a usage error before anything runs.
    let bad = format!("{}={}", reg.host, ca.key.display());
    let refused = paddock(&data, &["image", "pull", "--registry-ca", &bad, &name], None);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("no PEM certificate"), "{}", refused.stderr);
    let missing = paddock(&data, &["image", "pull", "--registry-ca", "127.0.0.1:1=/nonexistent/ca.pem", &name], None);
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(missing.stderr.contains("/nonexistent/ca.pem"), "{}", missing.stderr);
}
