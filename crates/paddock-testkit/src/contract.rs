//! The contract of [`Runtime`]: what the server relies on, checked against a real runtime.
//!
//! Every runtime must pass [`run_all`]: the fake in the default lane
//! (`paddock-testkit/tests/contract_fake.rs`), the local runtime in the privileged lane
//! (`paddock/tests/contract.rs`) and the Kubernetes runtime in the cluster lane
//! (`paddock-runtime-k8s/tests/cluster.rs`). A runtime added to Paddock passes it before the
//! server may use it. What a runtime says it cannot do (`Capabilities`) must be refused as
//! `Unsupported`, never half done; what it says it can do is checked.
//!
//! The commands use only a POSIX `sh` with `cat`, `head`, `sleep` and `printf` (busybox has
//! them), so the Kubernetes lane's small image passes too.

use std::sync::Arc;
use std::time::Duration;

use paddock_core::naming::ThreadId;
use paddock_core::runtime::{
    ByteReader, ExecOutcome, ExecRequest, FileErrorKind, FileKind, FileOp, FileReply, Runtime, RuntimeError, SandboxId,
    SandboxInfo, SandboxState,
};
use paddock_core::spec::{SandboxSpec, ValidatedSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a lane gives the contract.
#[derive(Debug, Clone)]
pub struct Contract {
    /// The spec every sandbox of the contract starts from (image, resources the lane can
    /// afford).
    pub spec: ValidatedSpec,
    /// Makes the contract's thread ids unique to this run (several lanes may share a runtime's
    /// store).
    pub run_id: String,
}

impl Contract {
    /// The lane's spec, which must be valid (the contract is about runtimes, not specs).
    pub fn new(spec: SandboxSpec) -> Self {
        let spec = spec.validated().unwrap_or_else(|e| panic!("the contract's spec is invalid: {e}"));
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Self { spec, run_id: format!("{:x}{:x}", nanos & 0xffff_ffff, std::process::id()) }
    }
}

/// Runs every check of the contract against `rt`, in order; panics naming the first that
/// fails. Leaves no sandbox or workspace of its own behind when it passes.
pub async fn run_all(rt: Arc<dyn Runtime>, contract: &Contract) {
    let rt = rt.as_ref();
    lifecycle(rt, contract).await;
    commands(rt, contract).await;
    files(rt, contract).await;
    unsupported_is_refused(rt, contract).await;
    if rt.capabilities().persistent_workspaces {
        workspaces(rt, contract).await;
    }
}

/// What a command did.
#[derive(Debug)]
pub struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub outcome: ExecOutcome,
}

impl Output {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Runs `request` to its end, writing `input` to its stdin when given.
pub async fn run(rt: &dyn Runtime, id: &SandboxId, request: ExecRequest, input: Option<&[u8]>) -> Output {
    let mut p = rt.exec(id, ExecRequest { stdin: input.is_some(), ..request }).await.expect("starting a command");
    let writer = async {
        if let (Some(mut w), Some(data)) = (p.stdin.take(), input) {
            w.write_all(data).await.expect("writing the command's stdin");
            w.shutdown().await.expect("closing the command's stdin");
        }
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (_, a, b) = tokio::join!(writer, p.stdout.read_to_end(&mut out), p.stderr.read_to_end(&mut err));
    a.expect("reading stdout");
    b.expect("reading stderr");
    let outcome = p.control.wait().await.expect("waiting for the command");
    Output { stdout: out, stderr: err, outcome }
}

pub async fn sh(rt: &dyn Runtime, id: &SandboxId, command: &str) -> Output {
    run(rt, id, ExecRequest::shell(command), None).await
}

async fn create(rt: &dyn Runtime, c: &Contract) -> SandboxInfo {
    let info = rt.create(c.spec.clone()).await.expect("creating a sandbox");
    assert_eq!(info.state, SandboxState::Running, "a new sandbox runs: {info:?}");
    info
}

async fn read_all(rt: &dyn Runtime, id: &SandboxId, path: &str) -> Result<Vec<u8>, RuntimeError> {
    let mut r = rt.read_file(id, path).await?;
    let mut buf = Vec::new();
    r.read_to_end(&mut buf).await.map_err(|e| RuntimeError::from_io(path, &e))?;
    Ok(buf)
}

fn bytes(data: &[u8]) -> ByteReader {
    Box::new(std::io::Cursor::new(data.to_vec()))
}

fn file_kind(r: Result<impl std::fmt::Debug, RuntimeError>) -> Option<FileErrorKind> {
    match r {
        Err(RuntimeError::File { kind, .. }) => Some(kind),
        other => panic!("expected a file error, got {other:?}"),
    }
}

/// Create, get, list, renew, destroy; an unknown or destroyed sandbox is `NotFound`.
pub async fn lifecycle(rt: &dyn Runtime, c: &Contract) {
    let caps = rt.capabilities();
    assert!(!caps.runtime.is_empty(), "a runtime names itself");
    let info = create(rt, c).await;
    let got = rt.get(&info.id).await.expect("get of a new sandbox");
    assert_eq!(got.id, info.id);
    assert!(rt.list().await.expect("list").iter().any(|s| s.id == info.id), "list shows the new sandbox");

    let before = paddock_core::units::unix_ms();
    let renewed = rt.renew(&info.id, Duration::from_secs(600)).await.expect("renew");
    let expires = renewed.expires_unix_ms.expect("a renewed sandbox expires");
    assert!(
        (before + 540_000..=before + 660_000).contains(&expires),
        "renew moves the expiry to 600 s from now: {expires} vs now {before}"
    );

    rt.destroy(&info.id).await.expect("destroy");
    assert!(matches!(rt.get(&info.id).await, Err(RuntimeError::NotFound(_))), "a destroyed sandbox is gone");
    assert!(!rt.list().await.expect("list").iter().any(|s| s.id == info.id), "list drops a destroyed sandbox");
    assert!(matches!(rt.destroy(&info.id).await, Err(RuntimeError::NotFound(_))), "destroying twice: NotFound");
    let unknown = SandboxId::parse("sbx-contract-unknown").unwrap();
    assert!(matches!(rt.get(&unknown).await, Err(RuntimeError::NotFound(_))), "an unknown id is NotFound");
    assert!(
        matches!(rt.exec(&unknown, ExecRequest::shell("true")).await, Err(RuntimeError::NotFound(_))),
        "a command in an unknown sandbox is NotFound"
    );
}

/// Output and exit codes as a shell gives them: 0 and others passed through, 124 after the
/// timeout, 126 for a file that cannot be run, 127 for a missing program (with a word on
/// stderr); stdin reaches the command; large output streams whole; the request's environment
/// reaches it.
pub async fn commands(rt: &dyn Runtime, c: &Contract) {
    let id = create(rt, c).await.id;
    let out = sh(rt, &id, "printf out; printf err >&2; exit 3").await;
    assert_eq!((out.stdout(), out.stderr(), out.outcome.exit_code), ("out".into(), "err".into(), 3), "{out:?}");
    assert!(!out.outcome.timed_out);

    let input = b"line one\nline two\n";
    let out = run(rt, &id, ExecRequest { argv: vec!["cat".into()], ..Default::default() }, Some(input)).await;
    assert_eq!((out.stdout.as_slice(), out.outcome.exit_code), (&input[..], 0), "stdin reaches the command");

    let out = sh(rt, &id, "head -c 4194304 /dev/zero").await;
    assert_eq!((out.stdout.len(), out.outcome.exit_code), (4 << 20, 0), "4 MiB of output arrive whole");

    let mut request = ExecRequest::shell("printf %s \"$CONTRACT_VAR\"");
    request.env.insert("CONTRACT_VAR".into(), "given".into());
    assert_eq!(run(rt, &id, request, None).await.stdout(), "given", "the request's environment");

    let missing = ExecRequest { argv: vec!["paddock-contract-no-such-program".into()], ..Default::default() };
    let out = run(rt, &id, missing, None).await;
    assert_eq!(out.outcome.exit_code, 127, "a missing program exits 127: {out:?}");
    assert!(!out.stderr.is_empty(), "and says why on stderr: {out:?}");

    rt.write_file(&id, "/workspace/contract-not-executable", Some(0o644), bytes(b"#!/bin/sh\necho ran\n"))
        .await
        .expect("writing a script");
    let plain = ExecRequest { argv: vec!["/workspace/contract-not-executable".into()], ..Default::default() };
    let out = run(rt, &id, plain, None).await;
    assert_eq!(out.outcome.exit_code, 126, "a file without x cannot run: {out:?}");

    let t0 = std::time::Instant::now();
    let slow = ExecRequest { timeout_ms: Some(500), ..ExecRequest::shell("sleep 30") };
    let out = run(rt, &id, slow, None).await;
    assert_eq!((out.outcome.exit_code, out.outcome.timed_out), (124, true), "{out:?}");
    assert!(t0.elapsed() < Duration::from_secs(20), "the timeout ends the command: {:?}", t0.elapsed());

    assert!(
        matches!(rt.exec(&id, ExecRequest::default()).await, Err(RuntimeError::InvalidArgument(_))),
        "an empty command is refused"
    );
    rt.destroy(&id).await.expect("destroy");
}

/// Files written through the API are the command's files and back; each failure has its kind.
pub async fn files(rt: &dyn Runtime, c: &Contract) {
    let id = create(rt, c).await.id;
    let dir = "/workspace/contract";
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    rt.write_file(&id, &format!("{dir}/deep/a.bin"), None, bytes(&data)).await.expect("write creates parents");
    assert_eq!(read_all(rt, &id, &format!("{dir}/deep/a.bin")).await.expect("read back"), data);
    // Commands name files relative to /workspace, their working directory: the fake runs
    // them on the host, where only their working directory is the sandbox's.
    let out = sh(rt, &id, "wc -c < contract/deep/a.bin").await;
    assert_eq!(out.stdout().trim(), "300000", "a command sees the written file: {out:?}");

    sh(rt, &id, "printf made > contract/by-command").await;
    assert_eq!(read_all(rt, &id, &format!("{dir}/by-command")).await.expect("read"), b"made");

    match rt.file(&id, FileOp::Stat { path: format!("{dir}/deep/a.bin") }).await.expect("stat") {
        FileReply::Stat(s) => assert_eq!((s.kind, s.size), (FileKind::File, 300_000), "{s:?}"),
        other => panic!("stat answered {other:?}"),
    }
    match rt.file(&id, FileOp::List { path: dir.into() }).await.expect("list") {
        FileReply::List { entries } => {
            let mut names: Vec<_> =
                entries.iter().map(|e| e.path.rsplit('/').next().unwrap_or_default().to_owned()).collect();
            names.sort();
            assert_eq!(names, ["by-command", "deep"], "{entries:?}");
        }
        other => panic!("list answered {other:?}"),
    }
    rt.file(&id, FileOp::Mkdir { path: format!("{dir}/new/sub"), mode: None }).await.expect("mkdir -p");
    let moved = FileOp::Move { from: format!("{dir}/by-command"), to: format!("{dir}/new/sub/moved") };
    rt.file(&id, moved).await.expect("move");
    assert_eq!(read_all(rt, &id, &format!("{dir}/new/sub/moved")).await.expect("read moved"), b"made");

    let missing = format!("{dir}/missing");
    assert_eq!(file_kind(read_all(rt, &id, &missing).await), Some(FileErrorKind::NotFound));
    assert_eq!(file_kind(rt.file(&id, FileOp::Stat { path: missing.clone() }).await), Some(FileErrorKind::NotFound));
    assert_eq!(file_kind(rt.read_file(&id, dir).await.map(|_| ())), Some(FileErrorKind::IsADirectory));

    rt.file(&id, FileOp::Remove { path: dir.into(), recursive: true }).await.expect("remove -r");
    assert_eq!(file_kind(rt.file(&id, FileOp::Stat { path: dir.into() }).await), Some(FileErrorKind::NotFound));
    rt.destroy(&id).await.expect("destroy");
}

/// What the runtime says it cannot do is refused as `Unsupported`; what it says it can do
/// works.
pub async fn unsupported_is_refused(rt: &dyn Runtime, c: &Contract) {
    let caps = rt.capabilities();
    let id = create(rt, c).await.id;
    if caps.pause {
        rt.pause(&id).await.expect("pause");
        assert_eq!(rt.get(&id).await.expect("get").state, SandboxState::Paused);
        rt.resume(&id).await.expect("resume");
        assert_eq!(sh(rt, &id, "printf back").await.stdout(), "back", "a resumed sandbox runs commands");
    } else {
        assert!(matches!(rt.pause(&id).await, Err(RuntimeError::Unsupported(_))), "pause without support");
        assert_eq!(sh(rt, &id, "printf still").await.stdout(), "still", "a refused pause changes nothing");
    }
    if !caps.credential_vault {
        assert!(matches!(rt.set_vault(&id, None).await, Err(RuntimeError::Unsupported(_))), "a vault without support");
    }
    if caps.volumes.is_empty() {
        assert!(matches!(rt.volumes().await, Err(RuntimeError::Unsupported(_))), "volumes without support");
    }
    rt.destroy(&id).await.expect("destroy");
}

/// A thread's workspace outlives its sandbox: acquire, write, release, acquire again and find
/// it; two acquires at once make one sandbox; destroying the workspace deletes its files.
pub async fn workspaces(rt: &dyn Runtime, c: &Contract) {
    let thread = ThreadId::new(format!("contract-{}", c.run_id)).expect("a thread id");
    let (a, b) = tokio::join!(rt.acquire(&thread, c.spec.clone()), rt.acquire(&thread, c.spec.clone()));
    let (a, b) = (a.expect("acquire"), b.expect("acquire at once"));
    assert_eq!(a.id, b.id, "two acquires of one thread make one sandbox");
    sh(rt, &a.id, "printf kept > turn-1").await;
    rt.release(&thread).await.expect("release");
    assert!(matches!(rt.get(&a.id).await, Err(RuntimeError::NotFound(_))), "a released thread's sandbox is gone");

    let again = rt.acquire(&thread, c.spec.clone()).await.expect("acquire again");
    assert_eq!(read_all(rt, &again.id, "/workspace/turn-1").await.expect("the workspace is kept"), b"kept");
    rt.destroy_workspace(&thread).await.expect("destroy the workspace");
    let fresh = rt.acquire(&thread, c.spec.clone()).await.expect("acquire after destroy");
    assert_eq!(
        file_kind(read_all(rt, &fresh.id, "/workspace/turn-1").await),
        Some(FileErrorKind::NotFound),
        "a destroyed workspace starts empty"
    );
    rt.destroy_workspace(&thread).await.expect("destroy the workspace");
}
