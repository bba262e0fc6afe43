//! Shared helpers for the privileged tests: real sandboxes, in a data directory of their own.
#![allow(dead_code)]

pub mod server;

use std::path::{Path, PathBuf};

use paddock_core::naming::NamingMode;
use paddock_core::runtime::{ByteReader, ExecOutcome, ExecRequest, Process, Runtime, SandboxId, SandboxInfo};
use paddock_core::spec::SandboxSpec;
use paddock_runtime_local::LocalRuntime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const EXE: &str = env!("CARGO_BIN_EXE_paddock");

/// A runtime with its own data directory, removed (with every sandbox in it) on drop.
pub struct Env {
    pub rt: LocalRuntime,
    pub dir: tempfile::TempDir,
}

pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the privileged tests create namespaces and cgroups: run them as root (CI does)"
    );
}

impl Env {
    pub fn new() -> Self {
        Self::new_in(Path::new("/tmp"))
    }

    /// A runtime whose data directory is a new directory in `parent` (which others may search).
    pub fn new_in(parent: &Path) -> Self {
        require_root();
        let dir = tempfile::Builder::new().prefix("pdk").tempdir_in(parent).expect("temp dir");
        let rt = LocalRuntime::new(dir.path(), EXE, NamingMode::Hashed).expect("runtime");
        Self { rt, dir }
    }

    pub fn data(&self) -> &Path {
        self.dir.path()
    }

    /// Validates `spec` as the server or the CLI would, then creates its sandbox.
    pub async fn create(&self, spec: SandboxSpec) -> SandboxInfo {
        self.rt.create(spec.validated().expect("a valid spec")).await.expect("create sandbox")
    }

    /// Creates a default sandbox and proves it is confined before anything else runs in it:
    /// uid 1000, no capabilities in any set, no_new_privs, seccomp. Panics otherwise, so an
    /// escape test never runs in a sandbox that could harm the host.
    pub async fn confined(&self, spec: SandboxSpec) -> SandboxId {
        let info = self.create(spec).await;
        assert_confined(&self.rt, &info.id).await;
        info.id
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Best effort: destroy whatever a failed test left behind. A thread of its own, since
        // the test's async runtime may be the one dropping us.
        let rt = self.rt.clone();
        let _ = std::thread::spawn(move || {
            let Ok(tokio_rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            tokio_rt.block_on(async {
                if let Ok(list) = rt.list().await {
                    for info in list {
                        let _ = rt.destroy(&info.id).await;
                    }
                }
            });
        })
        .join();
    }
}

pub async fn assert_confined(rt: &LocalRuntime, id: &SandboxId) {
    let out =
        sh(rt, id, "id -u; id -g; id -G; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status")
            .await;
    let expected = "1000\n1000\n1000\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";
    assert_eq!(
        out.stdout, expected,
        "STOP: the sandbox is not confined; refusing to run escape attempts. stderr: {}",
        out.stderr
    );
}

#[derive(Debug)]
pub struct Output {
    pub outcome: ExecOutcome,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn code(&self) -> i32 {
        self.outcome.exit_code
    }
}

/// Reads a stream to its end as text.
pub async fn drain(mut r: ByteReader) -> String {
    let mut buf = Vec::new();
    let _ = r.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// Runs a request to completion, feeding it `stdin` when given, and collects its output.
pub async fn exec(rt: &LocalRuntime, id: &SandboxId, mut request: ExecRequest, stdin: Option<Vec<u8>>) -> Output {
    request.stdin = stdin.is_some();
    let Process { stdin: to_command, stdout, stderr, mut control } = rt.exec(id, request).await.expect("exec");
    let feed = async move {
        if let (Some(mut w), Some(data)) = (to_command, stdin) {
            let _ = w.write_all(&data).await;
        }
    };
    let (_, stdout, stderr, outcome) = tokio::join!(feed, drain(stdout), drain(stderr), control.wait());
    Output { outcome: outcome.expect("wait"), stdout, stderr }
}

pub async fn sh(rt: &LocalRuntime, id: &SandboxId, script: &str) -> Output {
    exec(rt, id, ExecRequest::shell(script), None).await
}

/// Waits (3 s at most) until `done` holds: for what a destroy's supervisor removes right after
/// answering.
pub fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Host-side check that nothing of a destroyed sandbox is left.
pub fn assert_nothing_left(data: &Path, id: &SandboxId) {
    assert!(!data.join("sandboxes").join(id.as_str()).exists(), "state directory of {id} left behind");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(id.as_str()), "a mount of {id} is left on the host");
    // A destroy answers once the sandbox is unreachable and killed; its supervisor removes its
    // processes, cgroups and directory right after, so give that a moment on a loaded machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        let mut left = Vec::new();
        if data.join("gone").join(id.as_str()).exists() {
            left.push(format!("its directory in {}", data.join("gone").display()));
        }
        for ctl in ["memory", "pids", "cpu", "freezer", "unified"] {
            let p = PathBuf::from("/sys/fs/cgroup").join(ctl).join("paddock").join(id.as_str());
            if p.exists() {
                left.push(format!("cgroup {}", p.display()));
            }
        }
        let procs = std::process::Command::new("pgrep").args(["-f", id.as_str()]).output().unwrap();
        if !procs.stdout.is_empty() {
            left.push(format!("processes {}", String::from_utf8_lossy(&procs.stdout).trim()));
        }
        if left.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{id} left behind: {left:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
