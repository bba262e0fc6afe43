//! File operations through `LocalRuntime`: round trips, metadata, errors, and symlink escapes.
//!
//! Every test first proves its sandbox is confined (uid 1000, no capabilities) with
//! `Env::confined`. Escape attempts aim only at marker files and paths of the test's own.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{Env, sh};
use paddock_core::runtime::{FileErrorKind, FileKind, FileOp, FileReply, FileStat, Runtime, RuntimeError, SandboxId};
use paddock_core::spec::SandboxSpec;
use tokio::io::AsyncReadExt;

fn random_bytes(n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        filled +=
            rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()).expect("getrandom");
    }
    buf
}

fn random_name(prefix: &str) -> String {
    let hex: String = random_bytes(6).iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}-{hex}")
}

/// Writes `bytes` to `path` in the sandbox, feeding them through a pipe from a thread.
async fn write(
    env: &Env,
    id: &SandboxId,
    path: &str,
    mode: Option<u32>,
    bytes: &[u8],
) -> Result<FileReply, RuntimeError> {
    let data = Box::new(std::io::Cursor::new(bytes.to_vec()));
    env.rt.write_file(id, path, mode, data).await?;
    env.rt.file(id, FileOp::Stat { path: path.to_owned() }).await
}

/// Reads `path` from the sandbox; the reply is the file's stat after the read.
async fn read(env: &Env, id: &SandboxId, path: &str) -> (Result<FileReply, RuntimeError>, Vec<u8>) {
    let mut reader = match env.rt.read_file(id, path).await {
        Ok(r) => r,
        Err(e) => return (Err(e), Vec::new()),
    };
    let mut buf = Vec::new();
    reader.read_to_end(&mut buf).await.expect("reading the file's stream");
    (env.rt.file(id, FileOp::Stat { path: path.to_owned() }).await, buf)
}

async fn op(env: &Env, id: &SandboxId, op: FileOp) -> Result<FileReply, RuntimeError> {
    env.rt.file(id, op).await
}

async fn stat(env: &Env, id: &SandboxId, path: &str) -> Result<FileStat, RuntimeError> {
    match op(env, id, FileOp::Stat { path: path.to_owned() }).await? {
        FileReply::Stat(s) => Ok(s),
        other => panic!("stat of {path} answered {other:?}"),
    }
}

fn expect_stat(reply: Result<FileReply, RuntimeError>) -> FileStat {
    match reply {
        Ok(FileReply::Stat(s)) => s,
        other => panic!("expected a stat, got {other:?}"),
    }
}

#[track_caller]
fn assert_file_err<T: std::fmt::Debug>(result: Result<T, RuntimeError>, want: FileErrorKind) -> RuntimeError {
    match result {
        Err(e @ RuntimeError::File { kind, .. }) if kind == want => e,
        other => panic!("expected a {want:?} file error, got {other:?}"),
    }
}

/// Runs a shell script in the sandbox and returns its stdout, asserting it succeeded.
async fn sh_ok(env: &Env, id: &SandboxId, script: &str) -> String {
    let out = sh(&env.rt, id, script).await;
    assert_eq!(out.code(), 0, "{script:?} failed: {}", out.stderr);
    out.stdout
}

/// A file on the host, removed on drop.
struct HostMarker(PathBuf);

impl HostMarker {
    fn new(path: PathBuf, content: &[u8]) -> Self {
        assert!(!path.exists(), "{} already exists", path.display());
        std::fs::write(&path, content).expect("writing the host marker");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod marker");
        Self(path)
    }
    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
    fn assert_intact(&self, content: &[u8]) {
        let meta = std::fs::symlink_metadata(&self.0).expect("the host marker must still exist");
        assert!(meta.is_file(), "the host marker is no longer a regular file");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644, "the host marker's mode changed");
        assert_eq!(std::fs::read(&self.0).unwrap(), content, "the host marker's content changed");
    }
}

impl Drop for HostMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn assert_absent_on_host(path: &Path) {
    assert!(std::fs::symlink_metadata(path).is_err(), "{} appeared on the host", path.display());
}

#[tokio::test]
async fn big_binary_file_round_trips_byte_exact() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let data = random_bytes(3 << 20);
    let path = "/workspace/deep/er/big.bin";
    let s = expect_stat(write(&env, &id, path, None, &data).await);
    assert_eq!((s.path.as_str(), s.kind, s.size, s.uid, s.gid), (path, FileKind::File, 3 << 20, 1000, 1000));
    // The sandbox itself sees the file, parents included.
    assert_eq!(
        sh_ok(&env, &id, "test -d /workspace/deep/er && stat -c %s /workspace/deep/er/big.bin").await,
        "3145728\n"
    );
    let (reply, back) = read(&env, &id, path).await;
    let s = expect_stat(reply);
    assert_eq!(s.size, 3 << 20);
    assert_eq!(back.len(), data.len(), "read back a different length");
    assert!(back == data, "read back different bytes");
}

#[tokio::test]
async fn empty_file_round_trips() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let s = expect_stat(write(&env, &id, "/workspace/empty", None, b"").await);
    assert_eq!((s.kind, s.size), (FileKind::File, 0));
    assert_eq!(sh_ok(&env, &id, "test -f /workspace/empty && stat -c %s /workspace/empty").await, "0\n");
    let (reply, back) = read(&env, &id, "/workspace/empty").await;
    assert_eq!(expect_stat(reply).size, 0);
    assert!(back.is_empty());
    // Overwriting truncates: a second, shorter write leaves exactly its bytes.
    write(&env, &id, "/workspace/empty", None, b"longer content").await.unwrap();
    write(&env, &id, "/workspace/empty", None, b"").await.unwrap();
    let (reply, back) = read(&env, &id, "/workspace/empty").await;
    assert_eq!((expect_stat(reply).size, back.len()), (0, 0));
}

#[tokio::test]
async fn list_is_sorted_with_kinds_and_sizes() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    sh_ok(
        &env,
        &id,
        "mkdir -p /workspace/d/sub && printf 12345 > /workspace/d/b.txt && printf abc > /workspace/d/a.txt \
         && ln -s a.txt /workspace/d/link && printf x > /workspace/d/sub/inner",
    )
    .await;
    let entries = match op(&env, &id, FileOp::List { path: "/workspace/d".into() }).await.unwrap() {
        FileReply::List { entries } => entries,
        other => panic!("list answered {other:?}"),
    };
    let got: Vec<(&str, FileKind)> = entries.iter().map(|e| (e.path.as_str(), e.kind)).collect();
    assert_eq!(
        got,
        [
            ("/workspace/d/a.txt", FileKind::File),
            ("/workspace/d/b.txt", FileKind::File),
            ("/workspace/d/link", FileKind::Symlink),
            ("/workspace/d/sub", FileKind::Dir),
        ],
        "entries are not listed sorted and complete (and not recursively)"
    );
    assert_eq!(entries[0].size, 3);
    assert_eq!(entries[1].size, 5);
    // A symlink is described, not followed: its size is the length of its target.
    assert_eq!(entries[2].size, "a.txt".len() as u64);
    assert!(entries.iter().all(|e| e.uid == 1000 && e.gid == 1000), "{entries:?}");
    // Listing a relative path lists the same directory under /workspace.
    let rel = op(&env, &id, FileOp::List { path: "d".into() }).await.unwrap();
    assert_eq!(rel, FileReply::List { entries });
    // A file is not a directory to list; a missing directory is not found.
    assert_file_err(
        op(&env, &id, FileOp::List { path: "/workspace/d/a.txt".into() }).await,
        FileErrorKind::NotADirectory,
    );
    assert_file_err(op(&env, &id, FileOp::List { path: "/workspace/nope".into() }).await, FileErrorKind::NotFound);
}

#[tokio::test]
async fn stat_reports_mode_owner_and_size() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let s = expect_stat(write(&env, &id, "/workspace/s.txt", Some(0o640), b"seven!!").await);
    assert_eq!((s.kind, s.size, s.mode, s.uid, s.gid), (FileKind::File, 7, 0o640, 1000, 1000));
    let again = stat(&env, &id, "/workspace/s.txt").await.unwrap();
    assert_eq!(again, s);
    assert!(again.modified_unix_ms > 1_600_000_000_000, "implausible mtime {}", again.modified_unix_ms);
    assert_eq!(sh_ok(&env, &id, "stat -c '%a %u %g %s' /workspace/s.txt").await, "640 1000 1000 7\n");
    // Without a mode a new file is 0644; the directory itself is the user's too.
    let d = expect_stat(write(&env, &id, "/workspace/plain", None, b"p").await);
    assert_eq!(d.mode, 0o644);
    let ws = stat(&env, &id, "/workspace").await.unwrap();
    assert_eq!((ws.kind, ws.uid), (FileKind::Dir, 1000));
    assert_file_err(stat(&env, &id, "/workspace/missing").await, FileErrorKind::NotFound);
}

#[tokio::test]
async fn mkdir_creates_nested_directories() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let s = expect_stat(op(&env, &id, FileOp::Mkdir { path: "/workspace/x/y/z".into(), mode: Some(0o700) }).await);
    assert_eq!((s.path.as_str(), s.kind, s.mode, s.uid), ("/workspace/x/y/z", FileKind::Dir, 0o700, 1000));
    assert_eq!(sh_ok(&env, &id, "test -d /workspace/x/y && stat -c %a /workspace/x/y/z").await, "700\n");
    // Creating it again is fine (like mkdir -p).
    expect_stat(op(&env, &id, FileOp::Mkdir { path: "/workspace/x/y/z".into(), mode: None }).await);
    // A file in the way is an error.
    write(&env, &id, "/workspace/file", None, b"f").await.unwrap();
    let r = op(&env, &id, FileOp::Mkdir { path: "/workspace/file/sub".into(), mode: None }).await;
    assert!(matches!(r, Err(RuntimeError::File { .. })), "{r:?}");
}

#[tokio::test]
async fn move_renames_and_creates_target_parents() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    write(&env, &id, "/workspace/m.txt", None, b"moving").await.unwrap();
    let s = expect_stat(
        op(&env, &id, FileOp::Move { from: "/workspace/m.txt".into(), to: "/workspace/m2.txt".into() }).await,
    );
    assert_eq!((s.path.as_str(), s.size), ("/workspace/m2.txt", 6));
    assert_file_err(stat(&env, &id, "/workspace/m.txt").await, FileErrorKind::NotFound);
    let s = expect_stat(
        op(&env, &id, FileOp::Move { from: "m2.txt".into(), to: "/workspace/new/sub/m3.txt".into() }).await,
    );
    assert_eq!(s.path, "/workspace/new/sub/m3.txt");
    assert_file_err(stat(&env, &id, "/workspace/m2.txt").await, FileErrorKind::NotFound);
    let (reply, back) = read(&env, &id, "/workspace/new/sub/m3.txt").await;
    reply.unwrap();
    assert_eq!(back, b"moving");
    assert_eq!(sh_ok(&env, &id, "cat /workspace/new/sub/m3.txt").await, "moving");
    // Moving something missing fails.
    let r = op(&env, &id, FileOp::Move { from: "/workspace/gone".into(), to: "/workspace/x".into() }).await;
    assert_file_err(r, FileErrorKind::NotFound);
}

#[tokio::test]
async fn chmod_changes_the_mode() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    write(&env, &id, "/workspace/c.sh", None, b"#!/bin/sh\necho ran\n").await.unwrap();
    assert_ne!(sh(&env.rt, &id, "/workspace/c.sh").await.code(), 0, "a 0644 file must not be executable");
    let s = expect_stat(op(&env, &id, FileOp::Chmod { path: "/workspace/c.sh".into(), mode: 0o750 }).await);
    assert_eq!(s.mode, 0o750);
    assert_eq!(sh_ok(&env, &id, "stat -c %a /workspace/c.sh && /workspace/c.sh").await, "750\nran\n");
    let s = expect_stat(op(&env, &id, FileOp::Chmod { path: "c.sh".into(), mode: 0o600 }).await);
    assert_eq!(s.mode, 0o600);
    assert_eq!(sh_ok(&env, &id, "stat -c %a /workspace/c.sh").await, "600\n");
    assert_file_err(
        op(&env, &id, FileOp::Chmod { path: "/workspace/none".into(), mode: 0o600 }).await,
        FileErrorKind::NotFound,
    );
}

#[tokio::test]
async fn remove_files_and_directories() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    write(&env, &id, "/workspace/r.txt", None, b"r").await.unwrap();
    write(&env, &id, "/workspace/dir/a/b.txt", None, b"b").await.unwrap();
    assert_eq!(
        op(&env, &id, FileOp::Remove { path: "/workspace/r.txt".into(), recursive: false }).await,
        Ok(FileReply::Done)
    );
    assert_file_err(stat(&env, &id, "/workspace/r.txt").await, FileErrorKind::NotFound);
    let r = op(&env, &id, FileOp::Remove { path: "/workspace/dir".into(), recursive: false }).await;
    assert_file_err(r, FileErrorKind::DirectoryNotEmpty);
    assert_eq!(sh_ok(&env, &id, "cat /workspace/dir/a/b.txt").await, "b", "a refused remove must delete nothing");
    assert_eq!(
        op(&env, &id, FileOp::Remove { path: "/workspace/dir".into(), recursive: true }).await,
        Ok(FileReply::Done)
    );
    assert_eq!(sh_ok(&env, &id, "test ! -e /workspace/dir && echo gone").await, "gone\n");
    // An empty directory goes without `recursive`.
    op(&env, &id, FileOp::Mkdir { path: "/workspace/e".into(), mode: None }).await.unwrap();
    assert_eq!(op(&env, &id, FileOp::Remove { path: "e".into(), recursive: false }).await, Ok(FileReply::Done));
    assert_file_err(stat(&env, &id, "/workspace/e").await, FileErrorKind::NotFound);
    let r = op(&env, &id, FileOp::Remove { path: "/workspace/never".into(), recursive: true }).await;
    assert_file_err(r, FileErrorKind::NotFound);
}

#[tokio::test]
async fn reading_missing_files_and_directories_fails_clearly() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let (reply, back) = read(&env, &id, "/workspace/missing.txt").await;
    let e = assert_file_err(reply, FileErrorKind::NotFound);
    assert_eq!(e.code(), "FILE_NOT_FOUND");
    assert!(e.to_string().contains("/workspace/missing.txt"), "{e}");
    assert!(back.is_empty());
    op(&env, &id, FileOp::Mkdir { path: "/workspace/adir".into(), mode: None }).await.unwrap();
    let (reply, back) = read(&env, &id, "/workspace/adir").await;
    let e = assert_file_err(reply, FileErrorKind::IsADirectory);
    assert_eq!(e.code(), "FILE_ERROR");
    assert!(back.is_empty());
    // An empty path is invalid, not the workspace itself.
    let (reply, _) = read(&env, &id, "").await;
    assert_file_err(reply, FileErrorKind::InvalidPath);
    // The positive case: a host file the sandbox may read is readable.
    let (reply, back) = read(&env, &id, "/etc/passwd").await;
    reply.unwrap();
    assert_eq!(back, std::fs::read("/etc/passwd").unwrap());
}

#[tokio::test]
async fn writes_outside_the_writable_places_are_denied() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let etc = PathBuf::from("/etc").join(random_name("paddock-test"));
    let r = write(&env, &id, etc.to_str().unwrap(), None, b"should not exist").await;
    let e = assert_file_err(r, FileErrorKind::PermissionDenied);
    assert_eq!(e.code(), "PERMISSION_DENIED");
    assert_absent_on_host(&etc);
    let usr_dir = PathBuf::from("/usr").join(random_name("paddock-test"));
    let r = write(&env, &id, usr_dir.join("f").to_str().unwrap(), None, b"no").await;
    assert_file_err(r, FileErrorKind::PermissionDenied);
    assert_absent_on_host(&usr_dir);
    let usr_file = PathBuf::from("/usr/bin").join(random_name("paddock-test"));
    let r = write(&env, &id, usr_file.to_str().unwrap(), None, b"no").await;
    assert_file_err(r, FileErrorKind::PermissionDenied);
    assert_absent_on_host(&usr_file);
    let r = op(&env, &id, FileOp::Mkdir { path: usr_dir.to_str().unwrap().into(), mode: None }).await;
    assert_file_err(r, FileErrorKind::PermissionDenied);
    assert_absent_on_host(&usr_dir);
    // /tmp is writable (and private to the sandbox).
    let tmp = format!("/tmp/{}", random_name("paddock-test"));
    write(&env, &id, &tmp, None, b"tmp ok").await.unwrap();
    assert_eq!(sh_ok(&env, &id, &format!("cat {tmp}")).await, "tmp ok");
    assert_absent_on_host(Path::new(&tmp));
}

#[tokio::test]
async fn relative_paths_resolve_under_the_workspace() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let s = expect_stat(write(&env, &id, "a/b.txt", None, b"relative").await);
    assert_eq!(s.path, "/workspace/a/b.txt");
    assert_eq!(sh_ok(&env, &id, "cat /workspace/a/b.txt").await, "relative");
    let (reply, back) = read(&env, &id, "a/b.txt").await;
    reply.unwrap();
    assert_eq!(back, b"relative");
}

#[tokio::test]
async fn file_ops_on_a_missing_sandbox_are_not_found() {
    let env = Env::new();
    let _id = env.confined(SandboxSpec::default()).await;
    let missing = SandboxId::parse("sbx-000000000000").unwrap();
    let r = op(&env, &missing, FileOp::Stat { path: "/workspace".into() }).await;
    assert!(matches!(r, Err(RuntimeError::NotFound(_))), "{r:?}");
    assert_eq!(r.unwrap_err().code(), "NOT_FOUND");
    let r = write(&env, &missing, "/workspace/x", None, b"x").await;
    assert!(matches!(r, Err(RuntimeError::NotFound(_))), "{r:?}");
}

// --- Symlink escapes -------------------------------------------------------------------------

#[tokio::test]
async fn symlinks_to_hidden_host_files_do_not_reach_them() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let content = b"host secret\n";
    // One marker in a host directory the sandbox sees empty, one in the test's data directory.
    let in_root = HostMarker::new(PathBuf::from("/root").join(random_name("paddock-marker")), content);
    let in_data = HostMarker::new(env.data().join(random_name("paddock-marker")), content);
    for (link, marker) in [("/workspace/l", &in_root), ("/workspace/d", &in_data)] {
        sh_ok(&env, &id, &format!("ln -s {} {link}", marker.path())).await;
        // The link exists and points where it says ...
        assert_eq!(sh_ok(&env, &id, &format!("readlink {link}")).await, format!("{}\n", marker.path()));
        let s = stat(&env, &id, link).await.unwrap();
        assert_eq!(s.kind, FileKind::Symlink);
        // ... but its target is resolved in the sandbox's view, where it does not exist.
        let (reply, back) = read(&env, &id, link).await;
        let e = assert_file_err(reply, FileErrorKind::NotFound);
        assert_eq!(e.code(), "FILE_NOT_FOUND");
        assert!(back.is_empty(), "host bytes leaked: {back:?}");
        let r = write(&env, &id, link, None, b"overwritten").await;
        assert!(matches!(r, Err(RuntimeError::File { .. })), "a write through {link} succeeded: {r:?}");
        let r = op(&env, &id, FileOp::Chmod { path: link.into(), mode: 0o777 }).await;
        assert!(matches!(r, Err(RuntimeError::File { .. })), "a chmod through {link} succeeded: {r:?}");
        let r = op(&env, &id, FileOp::Move { from: marker.path().into(), to: "/workspace/stolen".into() }).await;
        assert!(matches!(r, Err(RuntimeError::File { .. })), "moving the host marker succeeded: {r:?}");
        let r = op(&env, &id, FileOp::Remove { path: marker.path().into(), recursive: true }).await;
        assert!(matches!(r, Err(RuntimeError::File { .. })), "removing the host marker succeeded: {r:?}");
        marker.assert_intact(content);
        // Removing the link removes only the link.
        assert_eq!(op(&env, &id, FileOp::Remove { path: link.into(), recursive: false }).await, Ok(FileReply::Done));
        marker.assert_intact(content);
    }
}

#[tokio::test]
async fn symlinks_to_visible_read_only_host_files_allow_reading_only() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    // /var/tmp is visible, read-only, in the sandbox: the link really resolves to the host file.
    let content = b"visible but read-only\n";
    let marker = HostMarker::new(PathBuf::from("/var/tmp").join(random_name("paddock-marker")), content);
    sh_ok(&env, &id, &format!("ln -s {} /workspace/v", marker.path())).await;
    let (reply, back) = read(&env, &id, "/workspace/v").await;
    reply.unwrap();
    assert_eq!(back, content, "the positive case: reading through the link works");
    let r = write(&env, &id, "/workspace/v", None, b"overwritten").await;
    assert_file_err(r, FileErrorKind::PermissionDenied);
    let r = write(&env, &id, "/workspace/v", None, b"").await;
    assert_file_err(r, FileErrorKind::PermissionDenied);
    let r = op(&env, &id, FileOp::Chmod { path: "/workspace/v".into(), mode: 0o666 }).await;
    assert_file_err(r, FileErrorKind::PermissionDenied);
    let r = op(&env, &id, FileOp::Move { from: marker.path().into(), to: "/workspace/stolen".into() }).await;
    assert!(matches!(r, Err(RuntimeError::File { .. })), "moving the host marker succeeded: {r:?}");
    let r = op(&env, &id, FileOp::Remove { path: marker.path().into(), recursive: false }).await;
    assert!(matches!(r, Err(RuntimeError::File { .. })), "removing the host marker succeeded: {r:?}");
    // A file moved onto the marker's path through the link's directory does not replace it.
    sh_ok(&env, &id, "ln -s /var/tmp /workspace/vt && echo mine > /workspace/mine").await;
    let target = format!("/workspace/vt/{}", marker.0.file_name().unwrap().to_str().unwrap());
    let r = op(&env, &id, FileOp::Move { from: "/workspace/mine".into(), to: target }).await;
    assert!(matches!(r, Err(RuntimeError::File { .. })), "replacing the host marker succeeded: {r:?}");
    marker.assert_intact(content);
    assert_eq!(
        op(&env, &id, FileOp::Remove { path: "/workspace/v".into(), recursive: true }).await,
        Ok(FileReply::Done)
    );
    assert_eq!(
        op(&env, &id, FileOp::Remove { path: "/workspace/vt".into(), recursive: true }).await,
        Ok(FileReply::Done)
    );
    marker.assert_intact(content);
}

#[tokio::test]
async fn a_symlink_to_etc_does_not_open_etc_for_writing() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    sh_ok(&env, &id, "ln -s /etc /workspace/etc && ln -s /etc /workspace/etc2 && echo f > /workspace/f").await;
    // The positive case: the link resolves to the (read-only) /etc.
    let (reply, back) = read(&env, &id, "/workspace/etc/passwd").await;
    reply.unwrap();
    assert_eq!(back, std::fs::read("/etc/passwd").unwrap());
    let name = random_name("paddock-x");
    let host = PathBuf::from("/etc").join(&name);
    let r = write(&env, &id, &format!("/workspace/etc/{name}"), None, b"escaped").await;
    assert_file_err(r, FileErrorKind::PermissionDenied);
    assert_absent_on_host(&host);
    let r = op(&env, &id, FileOp::Mkdir { path: format!("/workspace/etc/{name}"), mode: None }).await;
    assert_file_err(r, FileErrorKind::PermissionDenied);
    assert_absent_on_host(&host);
    for to in [format!("/etc/{name}"), format!("/workspace/etc/{name}")] {
        let r = op(&env, &id, FileOp::Move { from: "/workspace/f".into(), to: to.clone() }).await;
        assert!(matches!(r, Err(RuntimeError::File { .. })), "moving to {to} succeeded: {r:?}");
        assert_absent_on_host(&host);
    }
    assert_eq!(sh_ok(&env, &id, "cat /workspace/f").await, "f\n", "a refused move must keep the source");
    let passwd_before = std::fs::read("/etc/passwd").unwrap();
    let etc_before = std::fs::read_dir("/etc").unwrap().count();
    // Removing the links removes only the links, with or without `recursive`.
    assert_eq!(
        op(&env, &id, FileOp::Remove { path: "/workspace/etc".into(), recursive: false }).await,
        Ok(FileReply::Done)
    );
    assert_eq!(
        op(&env, &id, FileOp::Remove { path: "/workspace/etc2".into(), recursive: true }).await,
        Ok(FileReply::Done)
    );
    assert_eq!(
        sh_ok(&env, &id, "test ! -e /workspace/etc && test ! -L /workspace/etc2 && test -f /etc/passwd && echo ok")
            .await,
        "ok\n"
    );
    assert!(Path::new("/etc").is_dir());
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd_before);
    // Other processes may add files to /etc; none may disappear because of us.
    assert!(std::fs::read_dir("/etc").unwrap().count() >= etc_before, "entries of the host's /etc were removed");
}

/// BUG: a read opens whatever the path names, so a FIFO in the workspace blocks the operation
/// (and the caller, e.g. `paddock cp`) forever. A read should refuse non-regular files.
#[tokio::test]

async fn reading_a_fifo_fails_instead_of_hanging() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    sh_ok(&env, &id, "mkfifo /workspace/p").await;
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), read(&env, &id, "/workspace/p")).await;
    let (reply, back) = r.expect("reading a FIFO hung");
    assert!(matches!(reply, Err(RuntimeError::File { .. })), "{reply:?}");
    assert!(back.is_empty());
}

/// BUG: a symlink to /dev/zero in the workspace makes a read stream forever: `paddock cp
/// ID:/workspace/result.txt out` then fills the host's disk. A read should refuse devices.
#[tokio::test]

async fn reading_a_device_through_a_symlink_is_refused() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    sh_ok(&env, &id, "ln -s /dev/zero /workspace/result.txt").await;
    // Take at most 16 MiB, then hang up so an endless stream ends.
    let reply = env.rt.read_file(&id, "/workspace/result.txt").await;
    let streamed = match reply {
        Ok(r) => {
            let mut buf = Vec::new();
            let _ = r.take(16 << 20).read_to_end(&mut buf).await;
            buf.len()
        }
        Err(e) => {
            assert!(matches!(e, RuntimeError::File { .. }), "{e:?}");
            0
        }
    };
    assert_eq!(streamed, 0, "the read streamed device bytes instead of failing");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_too_large_to_list_is_refused_without_being_held() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let n = paddock_core::runtime::MAX_LISTED_ENTRIES + 1;
    let out = sh(
        &env.rt,
        &id,
        &format!("mkdir /tmp/many && cd /tmp/many && python3 -c 'import os\nfor i in range({n}): os.close(os.open(str(i), os.O_CREAT))' && ls | wc -l"),
    )
    .await;
    assert_eq!(out.stdout.trim(), n.to_string(), "{}", out.stderr);
    let e = env.rt.file(&id, FileOp::List { path: "/tmp/many".into() }).await.unwrap_err();
    assert!(matches!(e, RuntimeError::InvalidArgument(ref m) if m.contains("more than 100000 entries")), "{e:?}");
    // One fewer is listed whole, and the sandbox is fine.
    assert_eq!(sh(&env.rt, &id, "rm /tmp/many/0 && echo ok").await.stdout, "ok\n");
    match env.rt.file(&id, FileOp::List { path: "/tmp/many".into() }).await.unwrap() {
        FileReply::List { entries } => assert_eq!(entries.len(), n - 1),
        other => panic!("{other:?}"),
    }
}

/// A file kept in memory (the root's writable layer, `/tmp`) that would outgrow the sandbox's
/// memory is refused with the limit named, and leaves nothing: the sandbox lives on, where
/// the memory cgroup's OOM killer used to end its init.
#[tokio::test]
async fn a_write_bigger_than_the_memory_left_is_refused_and_the_sandbox_lives() {
    let env = Env::new();
    let mut spec = SandboxSpec::default();
    spec.resources.memory_bytes = 64 << 20;
    let id = env.confined(spec).await;
    let data = random_bytes(96 << 20);
    for path in ["/tmp/too-big.bin", "/tmp/deeper/too-big.bin"] {
        let before = sh_ok(&env, &id, "echo $$").await;
        let e = assert_file_err(write(&env, &id, path, None, &data).await, FileErrorKind::NoSpace);
        let msg = e.to_string();
        assert!(msg.contains("of its 64MiB limit") && msg.contains(path), "{msg}");
        assert_eq!(e.code(), "NO_SPACE");
        assert_file_err(stat(&env, &id, path).await, FileErrorKind::NotFound);
        // Alive and running commands, its memory given back.
        assert_eq!(env.rt.get(&id).await.unwrap().state, paddock_core::runtime::SandboxState::Running);
        assert_ne!(sh_ok(&env, &id, "echo $$").await, "", "{before}");
        let small = random_bytes(1 << 20);
        let s = expect_stat(write(&env, &id, path, None, &small).await);
        assert_eq!(s.size, 1 << 20);
        op(&env, &id, FileOp::Remove { path: path.into(), recursive: false }).await.unwrap();
    }
}
