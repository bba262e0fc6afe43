//! Sandboxes whose root is an OCI image from the store: writable for the sandbox, private to
//! it, never changing the shared layers, and as confined as a sandbox on the host's root. The
//! image is the Debian python one `e2e/images/build` makes from Debian packages (cached;
//! `PADDOCK_TEST_IMAGE_ARCHIVE` names a prebuilt archive instead).

mod common;

use std::path::{Path, PathBuf};

use common::{Env, assert_nothing_left, sh};
use paddock_core::runtime::Runtime;
use paddock_core::spec::SandboxSpec;

const NAME: &str = "paddock-test/python:3.11";

fn archive() -> PathBuf {
    if let Some(p) = std::env::var_os("PADDOCK_TEST_IMAGE_ARCHIVE") {
        return p.into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/images/build");
    let out = std::process::Command::new(&script).output().expect("running e2e/images/build");
    assert!(out.status.success(), "e2e/images/build failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A runtime whose store holds the test image under [`NAME`].
fn env_with_image() -> Env {
    let env = Env::new();
    let store = paddock_image::Store::open(&env.data().join("images")).expect("store");
    store.import(&archive(), Some(NAME)).expect("importing the test image");
    env
}

fn spec() -> SandboxSpec {
    SandboxSpec { image: Some(NAME.into()), ..Default::default() }
}

/// Every file below `dir` whose name is `name`.
fn find(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_name() == name {
                found.push(p.clone());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    found
}

#[tokio::test]
async fn an_image_root_is_writable_private_and_leaves_the_layers_alone() {
    let env = env_with_image();
    let a = env.confined(spec()).await;
    let b = env.confined(spec()).await;
    // The image's config applies.
    let out =
        sh(&env.rt, &a, "echo $PADDOCK_TEST_IMAGE; pwd; python3 -c 'import sys; print(sys.version_info[0])'").await;
    assert_eq!(out.stdout, "python-bookworm\n/srv\n3\n", "{}", out.stderr);
    // The image's root-owned files belong to the sandbox user; other image ids stay theirs
    // (Debian's /var/mail is group mail, /etc/shadow group shadow), though no process of the
    // sandbox is in those groups or can join them.
    let out = sh(&env.rt, &a, "stat -c '%u %g' /etc /usr/local/bin; stat -c %G /var/mail /etc/shadow; id -G").await;
    assert_eq!(out.stdout, "1000 1000\n1000 1000\nmail\nshadow\n1000\n", "{}", out.stderr);
    // Writes anywhere in the image's tree work, and stay in this sandbox.
    let out = sh(
        &env.rt,
        &a,
        "echo a > /usr/local/bin/paddock-mark && echo a >> /etc/os-release && rm /usr/bin/tac && mkdir /opt/new && echo ok",
    )
    .await;
    assert_eq!(out.stdout, "ok\n", "{}", out.stderr);
    let out = sh(&env.rt, &b, "ls /usr/local/bin/paddock-mark 2>&1 | grep -c 'No such'; tail -c 2 /etc/os-release | grep -c a; command -v tac").await;
    assert_eq!(out.stdout, "1\n0\n/usr/bin/tac\n", "sandbox b saw a's writes: {}", out.stderr);
    // The shared layers on the host did not change.
    let layers = env.data().join("images");
    assert!(find(&layers, "paddock-mark").is_empty(), "a sandbox write reached the store");
    assert!(!find(&layers, "tac").is_empty(), "a sandbox delete reached the store");
    // `/` itself stays read-only, as do the places Paddock mounts.
    let out = sh(
        &env.rt,
        &a,
        "touch /new-top 2>/dev/null && echo WROTE; touch /proc/x /sys/x 2>/dev/null && echo WROTE; echo end",
    )
    .await;
    assert_eq!(out.stdout, "end\n");
    // Root writes are capped (at the memory limit) and df says so.
    let out = sh(&env.rt, &a, "df -B1 --output=size /usr | tail -n1").await;
    let size: u64 = out.stdout.trim().parse().unwrap_or(0);
    let memory = SandboxSpec::default().resources.memory_bytes;
    assert!(size > 0 && size <= memory, "root writes are not capped: df says {size}, memory {memory}");

    for id in [&a, &b] {
        env.rt.destroy(id).await.unwrap();
        assert_nothing_left(env.data(), id);
    }
    // The store's leases were given back: the image may be pruned now.
    let store = paddock_image::Store::open(&env.data().join("images")).unwrap();
    let info = store.list().unwrap();
    assert!(info.iter().all(|i| i.holders.is_empty()), "leases left: {info:?}");
}

#[tokio::test]
async fn escape_attempts_fail_on_an_image_root_too() {
    let env = env_with_image();
    let bystander = env.confined(spec()).await;
    let id = env.confined(spec()).await;
    let script = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    r = getattr(libc, name)(*args)
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
os.makedirs("/tmp/m", exist_ok=True)
print("mount", call("mount", b"none", b"/tmp/m", b"tmpfs", 0, None))
print("remount-usr", call("mount", b"none", b"/usr", None, 0x20 | 0x1000, None))
print("unshare-user", call("unshare", 0x10000000))
print("setuid0", call("setuid", 0))
print("chroot", call("chroot", b"/tmp"))
print("mknod", call("mknod", b"/usr/local/dev-null", 0o20666, os.makedev(1, 3)))
"#;
    let out = sh(&env.rt, &id, &format!("python3 -c '{}'", script.replace('\'', "'\\''"))).await;
    assert_eq!(
        out.stdout, "mount EPERM\nremount-usr EPERM\nunshare-user EPERM\nsetuid0 EINVAL\nchroot EPERM\nmknod EPERM\n",
        "stderr: {}",
        out.stderr
    );
    // No set-id file survived the unpack (Debian's su, mount, passwd are set-uid root).
    let out = sh(&env.rt, &id, "find /usr /bin /sbin -perm /6000 -type f 2>/dev/null | head -3; echo end").await;
    assert_eq!(out.stdout, "end\n", "{}", out.stderr);
    // No route out, and the host's loopback is not the sandbox's.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let out = sh(
        &env.rt,
        &id,
        &format!(
            "ls /sys/class/net; python3 -c 'import socket\nfor a in [(\"127.0.0.1\", {port}), (\"192.0.2.1\", 53)]:\n  try:\n    socket.create_connection(a, timeout=2); print(\"REACHED\", a)\n  except OSError: pass'"
        ),
    )
    .await;
    assert_eq!(out.stdout, "lo\n", "{}", out.stderr);
    let out = sh(&env.rt, &bystander, "echo alive").await;
    assert_eq!(out.stdout, "alive\n");
}

/// `paddock run --image` without a command runs the image's Entrypoint and Cmd (this image's
/// is `python3`, which reads its program from stdin); `exec` without one is a usage error.
#[test]
fn the_cli_runs_the_images_command_when_given_none() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let exe = env!("CARGO_BIN_EXE_paddock");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let archive = archive();
    let out = Command::new(exe)
        .args(["--data-dir", data, "image", "import", archive.to_str().unwrap(), "--tag", NAME])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut child = Command::new(exe)
        .args(["--data-dir", data, "run", "--image", NAME])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"import os\nprint(6 * 7, os.getcwd())\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42 /srv\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    let out = Command::new(exe).args(["--data-dir", data, "exec", "sbx-0000000000000000"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("required arguments were not provided"));
    let out = Command::new(exe).args(["--data-dir", data, "ls", "--json"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]", "the run's sandbox is gone");
}

/// An image as `node:*` is made: `User` unset (root), an app user's home owned by uid 1000.
/// The mapping README describes: the sandbox user owns what the image's root owns (and can
/// change it), another image user's files read as someone else's and are not writable (Docker's
/// root could write them), and the root's top level is fixed while its directories are writable.
#[tokio::test]
async fn an_image_whose_files_belong_to_another_user_shows_them_as_not_the_sandbox_users() {
    use paddock_testkit::image::{Layer, docker_save};
    let env = Env::new();
    let mut layer = Layer::new();
    for f in ["/usr/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"] {
        layer = layer.file_with(f.trim_start_matches('/'), &std::fs::read(f).unwrap(), 0o755, 0, 0, 1_600_000_000);
    }
    let layer = layer
        .dir("etc", 0o755)
        .file("etc/app.conf", b"root's\n")
        .dir("opt", 0o755)
        .dir("work", 0o755)
        .dir("home", 0o755)
        .dir_owned("home/node", 0o755, 1000, 1000)
        .file_with("home/node/app.js", b"node's\n", 0o644, 1000, 1000, 1_600_000_000)
        .tar();
    let dir = tempfile::Builder::new().prefix("pdnode").tempdir_in("/tmp").unwrap();
    let archive = dir.path().join("node-like.tar");
    docker_save(&archive, &[layer], &["node-like:1"], None);
    let store = paddock_image::Store::open(&env.data().join("images")).expect("store");
    store.import(&archive, Some("node-like:1")).expect("importing the node-like image");
    let id = env.create(SandboxSpec { image: Some("node-like:1".into()), ..Default::default() }).await.id;
    let script = "for f in /etc/app.conf /home/node /home/node/app.js; do [ -O $f ] && echo \"$f mine\" || echo \"$f not mine\"; done; \
                  echo more >> /etc/app.conf && echo etc-writable; \
                  (echo more >> /home/node/app.js) 2>/dev/null || echo app-refused; \
                  (echo new > /home/node/new) 2>/dev/null || echo home-refused; \
                  echo x > /opt/x && echo opt-writable; \
                  (echo x > /top-level) 2>/dev/null || echo top-refused";
    let req = paddock_core::runtime::ExecRequest {
        argv: vec!["/usr/bin/dash".into(), "-c".into(), script.into()],
        ..Default::default()
    };
    let out = common::exec(&env.rt, &id, req, None).await;
    assert_eq!(
        out.stdout,
        "/etc/app.conf mine\n/home/node not mine\n/home/node/app.js not mine\netc-writable\napp-refused\nhome-refused\nopt-writable\ntop-refused\n",
        "{}",
        out.stderr
    );
    env.rt.destroy(&id).await.unwrap();
}
