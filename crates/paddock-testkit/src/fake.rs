//! `FakeRuntime`: a runtime WITHOUT isolation, for testing the server's HTTP behaviour without
//! root or a cluster. A "sandbox" is a temporary directory and its commands are plain host
//! processes of the test's own user; `/workspace` and `/tmp` map into that directory. It
//! reports no pause support, like the Kubernetes runtime, so the server's handling of what a
//! runtime cannot do is tested too. Never use it for anything but tests.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use paddock_core::naming::ThreadId;
use paddock_core::runtime::{
    ByteReader, Capabilities, Duplex, ExecOutcome, ExecRequest, Execution, FileErrorKind, FileKind, FileOp, FileReply,
    FileStat, Process, Runtime, RuntimeError, SandboxId, SandboxInfo, SandboxMetrics, SandboxState, WorkspaceInfo,
};
use paddock_core::spec::{NetworkPolicy, SandboxSpec, ValidatedSpec, command_env};
use paddock_core::units::unix_ms as now_ms;

pub struct FakeRuntime {
    root: tempfile::TempDir,
    sandboxes: Mutex<HashMap<SandboxId, SandboxInfo>>,
    threads: Mutex<HashMap<String, SandboxId>>,
    /// Sandboxes whose file operations never answer, as a sandbox with SIGSTOPped file
    /// workers would.
    hung: Mutex<Vec<SandboxId>>,
    /// What `health` answers: `None` is healthy.
    sick: Mutex<Option<RuntimeError>>,
    /// What every sandbox reports as its addresses (`SandboxInfo::addresses`).
    addresses: Vec<std::net::IpAddr>,
}

fn file_err(e: std::io::Error, path: &str) -> RuntimeError {
    let kind = match e.kind() {
        std::io::ErrorKind::NotFound => FileErrorKind::NotFound,
        std::io::ErrorKind::PermissionDenied => FileErrorKind::PermissionDenied,
        std::io::ErrorKind::AlreadyExists => FileErrorKind::AlreadyExists,
        std::io::ErrorKind::IsADirectory => FileErrorKind::IsADirectory,
        std::io::ErrorKind::NotADirectory => FileErrorKind::NotADirectory,
        std::io::ErrorKind::DirectoryNotEmpty => FileErrorKind::DirectoryNotEmpty,
        _ => FileErrorKind::Other,
    };
    RuntimeError::File { kind, message: format!("{path}: {e}") }
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeRuntime {
    pub fn new() -> Self {
        // Commands here are children of this process, and ignored signals stay ignored
        // through fork and exec: a test run started as a shell's background job ignores
        // SIGINT, and then no interrupt would reach a command (the real runtimes reset them in
        // the sandbox). Default actions back for this whole process, as its commands need.
        paddock_sys::process::default_ignored_signals().expect("restoring ignored signals' default actions");
        Self {
            root: tempfile::tempdir().unwrap(),
            sandboxes: Mutex::new(HashMap::new()),
            threads: Mutex::new(HashMap::new()),
            hung: Mutex::new(Vec::new()),
            sick: Mutex::new(None),
            addresses: Vec::new(),
        }
    }

    /// Sandboxes that report `addresses` as their own, as a Kubernetes Pod reports its IPs,
    /// and no forwarder that names them: the gateway then checks that a run's token comes
    /// from its sandbox's address (the fake's commands run on the host, so give it loopback to
    /// pass and another address to be refused).
    pub fn with_addresses(mut self, addresses: Vec<std::net::IpAddr>) -> Self {
        self.addresses = addresses;
        self
    }

    /// From now on `health` reports `why` (or health again, with `None`).
    pub fn set_health(&self, why: Option<RuntimeError>) {
        *self.sick.lock().unwrap() = why;
    }

    /// From now on, file operations in `id` never answer.
    pub fn hang_files(&self, id: &str) {
        self.hung.lock().unwrap().push(SandboxId::parse(id).unwrap());
    }

    async fn maybe_hang(&self, id: &SandboxId) {
        let hung = self.hung.lock().unwrap().contains(id);
        if hung {
            std::future::pending::<()>().await;
        }
    }

    fn dir(&self, id: &SandboxId) -> PathBuf {
        self.root.path().join(id.as_str())
    }

    fn known(&self, id: &SandboxId) -> Result<SandboxInfo, RuntimeError> {
        self.sandboxes
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| RuntimeError::NotFound(format!("no sandbox {id}")))
    }

    /// A sandbox path on the host: `/workspace/…` and `/tmp/…` (relative paths are under
    /// `/workspace`); anything else is refused, as a read-only root would.
    fn host_path(&self, id: &SandboxId, path: &str) -> Result<PathBuf, RuntimeError> {
        self.known(id)?;
        if path.is_empty() || path.split('/').any(|c| c == "..") {
            return Err(RuntimeError::File { kind: FileErrorKind::InvalidPath, message: format!("{path:?}") });
        }
        let abs = if path.starts_with('/') { path.to_owned() } else { format!("/workspace/{path}") };
        for top in ["/workspace", "/tmp"] {
            if abs == top || abs.starts_with(&format!("{top}/")) {
                return Ok(self.dir(id).join(abs.trim_start_matches('/')));
            }
        }
        Err(RuntimeError::File { kind: FileErrorKind::PermissionDenied, message: format!("{abs}: read-only") })
    }

    fn stat_of(&self, id: &SandboxId, host: &Path) -> Result<FileStat, std::io::Error> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(host)?;
        let inside = format!("/{}", host.strip_prefix(self.dir(id)).unwrap().display());
        Ok(FileStat {
            path: inside,
            kind: if m.is_dir() {
                FileKind::Dir
            } else if m.is_symlink() {
                FileKind::Symlink
            } else if m.is_file() {
                FileKind::File
            } else {
                FileKind::Other
            },
            size: m.len(),
            mode: m.mode() & 0o7777,
            uid: 1000,
            gid: 1000,
            modified_unix_ms: m.mtime() * 1000,
        })
    }

    fn new_sandbox(
        &self,
        mut spec: SandboxSpec,
        workspace: Option<(ThreadId, PathBuf)>,
    ) -> Result<SandboxInfo, RuntimeError> {
        spec.validate()?;
        // Commands run on the host: the gateway's own address is their way home (with no
        // forwarder line, so the gateway cannot tell sandboxes apart by connection here).
        if let Some(g) = spec.gateway {
            paddock_core::spec::expand_gateway(&mut spec.env, &format!("http://{g}"));
        }
        if spec.image.as_deref().is_some_and(|i| i != "fake") {
            return Err(RuntimeError::Unsupported(format!(
                "image {:?} cannot be run by the fake runtime: use \"fake\"",
                spec.image.as_deref().unwrap_or_default()
            )));
        }
        let mut bits = [0u8; 6];
        rustix::rand::getrandom(&mut bits, rustix::rand::GetRandomFlags::empty()).unwrap();
        let id = SandboxId::from_random(bits);
        let dir = self.dir(&id);
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        match &workspace {
            Some((_, ws)) => {
                std::fs::create_dir_all(ws).unwrap();
                std::os::unix::fs::symlink(ws, dir.join("workspace")).unwrap();
            }
            None => std::fs::create_dir_all(dir.join("workspace")).unwrap(),
        }
        let now = now_ms();
        let info = SandboxInfo {
            id: id.clone(),
            state: SandboxState::Running,
            expires_unix_ms: spec.timeout_secs.map(|t| now + t * 1000),
            created_unix_ms: now,
            workspace: workspace.map(|(thread, _)| WorkspaceInfo { name: thread.as_str().to_owned(), thread }),
            spec,
            failure: None,
            addresses: self.addresses.clone(),
        };
        self.sandboxes.lock().unwrap().insert(id, info.clone());
        Ok(info)
    }
}

/// A command that never started, with the exit code a shell gives it.
struct Exited(i32);

#[async_trait::async_trait]
impl Execution for Exited {
    fn pid(&self) -> Option<u32> {
        None
    }
    async fn signal(&mut self, _signal: i32) -> Result<(), RuntimeError> {
        Ok(())
    }
    async fn wait(&mut self) -> Result<ExecOutcome, RuntimeError> {
        Ok(ExecOutcome { exit_code: self.0, signal: None, timed_out: false, oom_killed: false })
    }
}

type Outcome = Result<ExecOutcome, RuntimeError>;

struct FakeExecution {
    pid: u32,
    /// The command's end, from the task that owns it; `done` once it came (a caller may drop
    /// a wait half way and wait again).
    outcome: tokio::sync::oneshot::Receiver<Outcome>,
    done: Option<Outcome>,
    /// Dropped with this execution: the command is killed, as a dropped process would be.
    _cancel: tokio::sync::oneshot::Sender<()>,
}

impl FakeExecution {
    /// Hands `child` to a task that waits for it and kills its whole group at `timeout` (from
    /// now, as in the real runtimes, whether or not anyone waits yet) or once this execution
    /// is dropped. The task alone reaps the child, so its group id cannot be reused by the
    /// time it is killed.
    fn watch(mut child: tokio::process::Child, pid: u32, timeout: Option<Duration>) -> Self {
        use std::os::unix::process::ExitStatusExt;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
        let kill_group = move || {
            if let Some(group) = rustix::process::Pid::from_raw(pid.cast_signed()) {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
        };
        tokio::spawn(async move {
            let deadline = async {
                match timeout {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            let (status, timed_out) = tokio::select! {
                status = child.wait() => (status, false),
                () = deadline => {
                    kill_group();
                    (child.wait().await, true)
                }
                _ = cancelled => {
                    kill_group();
                    (child.wait().await, false)
                }
            };
            let outcome = match (status, timed_out) {
                (_, true) => Ok(ExecOutcome { exit_code: 124, signal: None, timed_out: true, oom_killed: false }),
                (Err(e), _) => Err(RuntimeError::System(e.to_string())),
                (Ok(status), false) => {
                    let signal = status.signal();
                    let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
                    Ok(ExecOutcome { exit_code, signal, timed_out: false, oom_killed: false })
                }
            };
            let _ = tx.send(outcome);
        });
        Self { pid, outcome: rx, done: None, _cancel: cancel }
    }
}

#[async_trait::async_trait]
impl Execution for FakeExecution {
    fn pid(&self) -> Option<u32> {
        Some(self.pid)
    }
    async fn signal(&mut self, signal: i32) -> Result<(), RuntimeError> {
        let pid = rustix::process::Pid::from_raw(self.pid.cast_signed()).unwrap();
        let sig = rustix::process::Signal::from_named_raw(signal).unwrap();
        // To the process group, as the real runtimes do.
        rustix::process::kill_process_group(pid, sig).map_err(|e| RuntimeError::System(e.to_string()))
    }
    async fn wait(&mut self) -> Result<ExecOutcome, RuntimeError> {
        if let Some(done) = &self.done {
            return done.clone();
        }
        let outcome = (&mut self.outcome)
            .await
            .unwrap_or_else(|_| Err(RuntimeError::System("the fake's command watcher stopped".into())));
        self.done = Some(outcome.clone());
        outcome
    }
}

#[async_trait::async_trait]
impl Runtime for FakeRuntime {
    async fn health(&self) -> Result<(), RuntimeError> {
        match self.sick.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            runtime: "fake".into(),
            pause: false,
            persistent_workspaces: true,
            run_as_other_user: false,
            images: "\"fake\"".into(),
            network: vec![paddock_core::runtime::NetworkFeature::Deny],
            metrics: true,
            volumes: Vec::new(),
            // Its commands run on the host, so the gateway's own address is the way home.
            gateway: true,
            // A stand-in: the server's model-route tests on the fake treat it as the local
            // runtime, whose forwarder names the sandbox; given addresses, as a Kubernetes
            // runtime whose Pods dial the gateway directly.
            gateway_names_sandbox: self.addresses.is_empty(),
            no_gateway_because: None,
            // Not the server's own default, so a test can tell whose applied.
            default_workspace_bytes: Some(96 << 20),
            // No egress enforcer: the vault's routes answer that they are not supported.
            credential_vault: false,
            // Host processes: no boundary at all, so every requirement of one is refused.
            isolation: "none".into(),
            devices: Vec::new(),
            nested_containers: false,
        }
    }
    async fn create(&self, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        self.new_sandbox(spec.into_inner(), None)
    }
    async fn get(&self, id: &SandboxId) -> Result<SandboxInfo, RuntimeError> {
        self.known(id)
    }
    async fn list(&self) -> Result<Vec<SandboxInfo>, RuntimeError> {
        Ok(self.sandboxes.lock().unwrap().values().cloned().collect())
    }
    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process, RuntimeError> {
        request.validate()?;
        let info = self.known(id)?;
        let cwd = self.host_path(id, request.cwd.as_deref().unwrap_or("/workspace"))?;
        // A program in the sandbox's own files is found where the fake keeps them.
        let program = match request.argv[0].starts_with('/') {
            true => self.host_path(id, &request.argv[0]).unwrap_or_else(|_| request.argv[0].clone().into()),
            false => PathBuf::from(&request.argv[0]),
        };
        let spawned = tokio::process::Command::new(&program)
            .args(&request.argv[1..])
            .current_dir(cwd)
            .env_clear()
            // A path in the sandbox's /tmp named in the environment (EXECD_ENVS) must lead
            // where the fake's file calls look for it: the sandbox's directory on the host.
            .envs(command_env(&info.spec.env, &request.env).into_iter().map(|(k, v)| match v.strip_prefix("/tmp/") {
                Some(rest) => (k, self.dir(id).join("tmp").join(rest).display().to_string()),
                None => (k, v),
            }))
            .stdin(if request.stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            // As a shell (and the real runtimes) would: a word on stderr, exit 127 or 126.
            Err(e) => {
                let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
                let why = format!("{}: {e}\n", request.argv[0]).into_bytes();
                return Ok(Process {
                    stdin: request.stdin.then(|| Box::new(tokio::io::sink()) as _),
                    stdout: Box::new(tokio::io::empty()),
                    stderr: Box::new(std::io::Cursor::new(why)),
                    control: Box::new(Exited(code)),
                });
            }
        };
        let pid = child.id().unwrap();
        Ok(Process {
            stdin: child.stdin.take().map(|s| Box::new(s) as _),
            stdout: Box::new(child.stdout.take().unwrap()),
            stderr: Box::new(child.stderr.take().unwrap()),
            control: Box::new(FakeExecution::watch(child, pid, request.timeout_ms.map(Duration::from_millis))),
        })
    }
    async fn file(&self, id: &SandboxId, op: FileOp) -> Result<FileReply, RuntimeError> {
        self.maybe_hang(id).await;
        match op {
            FileOp::Stat { path } => {
                let host = self.host_path(id, &path)?;
                Ok(FileReply::Stat(self.stat_of(id, &host).map_err(|e| file_err(e, &path))?))
            }
            FileOp::List { path } => {
                let host = self.host_path(id, &path)?;
                let mut entries = Vec::new();
                for e in std::fs::read_dir(&host).map_err(|e| file_err(e, &path))? {
                    entries.push(self.stat_of(id, &e.unwrap().path()).map_err(|e| file_err(e, &path))?);
                }
                Ok(FileReply::List { entries })
            }
            FileOp::Mkdir { path, .. } => {
                std::fs::create_dir_all(self.host_path(id, &path)?).map_err(|e| file_err(e, &path))?;
                Ok(FileReply::Done)
            }
            FileOp::Remove { path, recursive } => {
                let host = self.host_path(id, &path)?;
                let r = if recursive && host.is_dir() {
                    std::fs::remove_dir_all(&host)
                } else {
                    std::fs::remove_file(&host)
                };
                r.map_err(|e| file_err(e, &path))?;
                Ok(FileReply::Done)
            }
            FileOp::Move { from, to } => {
                let (a, b) = (self.host_path(id, &from)?, self.host_path(id, &to)?);
                std::fs::create_dir_all(b.parent().unwrap()).map_err(|e| file_err(e, &to))?;
                std::fs::rename(a, b).map_err(|e| file_err(e, &from))?;
                Ok(FileReply::Done)
            }
            FileOp::Chmod { path, mode } => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(self.host_path(id, &path)?, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| file_err(e, &path))?;
                Ok(FileReply::Done)
            }
            // The fake has one owner: a change is checking that the file exists.
            FileOp::Chown { path, .. } => {
                std::fs::symlink_metadata(self.host_path(id, &path)?).map_err(|e| file_err(e, &path))?;
                Ok(FileReply::Done)
            }
        }
    }
    async fn read_file(&self, id: &SandboxId, path: &str) -> Result<ByteReader, RuntimeError> {
        self.maybe_hang(id).await;
        let host = self.host_path(id, path)?;
        if host.is_dir() {
            return Err(RuntimeError::File { kind: FileErrorKind::IsADirectory, message: path.into() });
        }
        Ok(Box::new(tokio::fs::File::open(&host).await.map_err(|e| file_err(e, path))?))
    }
    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        mode: Option<u32>,
        mut data: ByteReader,
    ) -> Result<(), RuntimeError> {
        use std::os::unix::fs::PermissionsExt;
        let host = self.host_path(id, path)?;
        std::fs::create_dir_all(host.parent().unwrap()).map_err(|e| file_err(e, path))?;
        let mut f = tokio::fs::File::create(&host).await.map_err(|e| file_err(e, path))?;
        tokio::io::copy(&mut data, &mut f).await.map_err(|e| file_err(e, path))?;
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(mode.unwrap_or(0o644)))
            .map_err(|e| file_err(e, path))?;
        Ok(())
    }
    async fn connect(&self, id: &SandboxId, port: u16) -> Result<Box<dyn Duplex>, RuntimeError> {
        self.known(id)?;
        Err(RuntimeError::Unavailable(format!("nothing accepts connections on port {port} in the fake sandbox")))
    }
    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics, RuntimeError> {
        self.known(id)?;
        // A sandbox that used a quarter of a CPU since the epoch: CPU use reads as 25 %.
        let at = now_ms();
        Ok(SandboxMetrics {
            cpu_used_ns: Some(at * 250_000),
            memory_used_bytes: Some(64 << 20),
            at_unix_ms: at,
            egress: Some(paddock_core::egress::EgressCounters { connections_denied: 3, ..Default::default() }),
        })
    }
    /// The policy is kept in the sandbox's spec; nothing is enforced (there is no network).
    async fn egress(&self, id: &SandboxId) -> Result<paddock_core::egress::EgressStatus, RuntimeError> {
        let info = self.known(id)?;
        Ok(paddock_core::egress::EgressStatus::uncounted(
            info.spec.network.policy(),
            paddock_core::egress::Enforcement::NotEnforced,
        ))
    }
    async fn set_egress(
        &self,
        id: &SandboxId,
        policy: paddock_core::egress::ValidatedPolicy,
    ) -> Result<paddock_core::egress::EgressStatus, RuntimeError> {
        self.known(id)?;
        if let Some(info) = self.sandboxes.lock().unwrap().get_mut(id) {
            info.spec.network = NetworkPolicy::Egress(policy.into_inner());
        }
        self.egress(id).await
    }
    async fn pause(&self, _id: &SandboxId) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported("the fake runtime cannot pause a sandbox: delete it instead".into()))
    }
    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.pause(id).await
    }
    async fn renew(&self, id: &SandboxId, ttl: Duration) -> Result<SandboxInfo, RuntimeError> {
        let mut all = self.sandboxes.lock().unwrap();
        let info = all.get_mut(id).ok_or_else(|| RuntimeError::NotFound(format!("no sandbox {id}")))?;
        info.expires_unix_ms = Some(now_ms().saturating_add(paddock_core::units::millis(ttl)));
        Ok(info.clone())
    }
    async fn destroy(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.sandboxes.lock().unwrap().remove(id).ok_or_else(|| RuntimeError::NotFound(format!("no sandbox {id}")))?;
        let _ = std::fs::remove_dir_all(self.dir(id));
        self.threads.lock().unwrap().retain(|_, v| v != id);
        Ok(())
    }
    async fn acquire(&self, thread: &ThreadId, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        let live = self.threads.lock().unwrap().get(thread.as_str()).cloned();
        if let Some(id) = live {
            return self.known(&id);
        }
        let ws = self.root.path().join("workspaces").join(hex_of(thread.as_str()));
        let info = self.new_sandbox(spec.into_inner(), Some((thread.clone(), ws)))?;
        self.threads.lock().unwrap().insert(thread.as_str().to_owned(), info.id.clone());
        Ok(info)
    }
    async fn release(&self, thread: &ThreadId) -> Result<(), RuntimeError> {
        let live = self.threads.lock().unwrap().remove(thread.as_str());
        if let Some(id) = live {
            self.destroy(&id).await?;
        }
        Ok(())
    }
    async fn destroy_workspace(&self, thread: &ThreadId) -> Result<(), RuntimeError> {
        self.release(thread).await?;
        let ws = self.root.path().join("workspaces").join(hex_of(thread.as_str()));
        std::fs::remove_dir_all(ws).map_err(|_| RuntimeError::NotFound(format!("thread {thread} has no workspace")))
    }
}

fn hex_of(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}
