//! [`LocalRuntime`]: the `Runtime` of this machine. It starts one supervisor per sandbox and talks
//! to supervisors over their sockets, so any process (a CLI run, a restarted server) can find
//! and drive the sandboxes that are running.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use paddock_core::naming::{NamingMode, ThreadId, resource_name};
use paddock_core::runtime::{
    ByteReader, ByteWriter, Capabilities, Duplex, ExecOutcome, ExecRequest, Execution, FileOp, FileReply,
    NetworkFeature, Process, Runtime, RuntimeError, SandboxId, SandboxInfo, SandboxMetrics, SandboxState, VolumeKind,
};
use paddock_core::spec::{NetworkPolicy, SandboxSpec, ValidatedSpec, WorkspaceRef};
use paddock_sys::fdpass;
use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketFlags, SocketType};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::layout::DataDir;
use crate::protocol::{self, Control, FileCall, Ready, Record, Reply, Request};
use paddock_core::egress::{EgressPolicy, EgressStatus, Enforcement, ValidatedPolicy};
use paddock_egress::control::Request as ControlRequest;

/// The embedded local runtime.
#[derive(Debug, Clone)]
pub struct LocalRuntime {
    dd: DataDir,
    /// The `paddock` binary, re-executed as each sandbox's supervisor when there is no
    /// launcher.
    exe: PathBuf,
    /// Forks supervisors without an exec (see [`crate::launcher`]).
    launcher: Option<std::sync::Arc<crate::launcher::Launcher>>,
    naming: NamingMode,
    images: crate::image::ImageOptions,
    egress: crate::egress::EgressOptions,
    volumes: crate::volumes::VolumeOptions,
}

fn sys_err(context: impl std::fmt::Display) -> impl Fn(std::io::Error) -> RuntimeError {
    move |e| RuntimeError::from_io(&context, &e)
}

/// Runs blocking filesystem work (cgroup removal loops, mkfs, recursive removal, flock) on the
/// blocking pool, never on an async worker.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| RuntimeError::System(format!("a blocking task failed: {e}")))?
}

/// A pipe whose ends are closed on exec: (read end, write end).
fn pipe_fds() -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| RuntimeError::from_io("creating a pipe", &e.into()))
}

fn pipe_reader(fd: OwnedFd) -> Result<pipe::Receiver, RuntimeError> {
    pipe::Receiver::from_owned_fd(fd).map_err(sys_err("registering a pipe"))
}

fn pipe_writer(fd: OwnedFd) -> Result<pipe::Sender, RuntimeError> {
    pipe::Sender::from_owned_fd(fd).map_err(sys_err("registering a pipe"))
}

/// A sandbox directory (and maybe an image lease) of a create that has not finished: dropped
/// armed, it removes the directory and then gives the lease back. In that order: a lease whose
/// sandbox has no directory is given back by the next `image` command (`forget_gone_holders`),
/// also one that a lookup still running on the blocking pool takes after this.
struct Unstarted<'a> {
    dd: &'a DataDir,
    id: &'a SandboxId,
    armed: bool,
}

impl Unstarted<'_> {
    fn clean(&self) {
        let _ = fs::remove_dir_all(self.dd.sandbox(self.id));
        crate::image::release(self.dd, self.id);
    }
}

impl Drop for Unstarted<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.clean();
        }
    }
}

impl LocalRuntime {
    /// A runtime keeping its state in `data_dir`, starting supervisors with `exe __supervise`.
    pub fn new(
        data_dir: impl Into<PathBuf>,
        exe: impl Into<PathBuf>,
        naming: NamingMode,
    ) -> Result<Self, RuntimeError> {
        let dd = DataDir::new(data_dir);
        dd.check_socket_path_fits().map_err(RuntimeError::InvalidArgument)?;
        for dir in [dd.root().to_path_buf(), dd.sandboxes(), dd.workspaces()] {
            fs::create_dir_all(&dir).map_err(sys_err(format!("creating {}", dir.display())))?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o711))
                .map_err(sys_err(format!("chmod {}", dir.display())))?;
        }
        dd.check_searchable_by_sandboxes().map_err(RuntimeError::InvalidArgument)?;
        crate::registry::register(Path::new(crate::registry::REGISTRY), dd.root()).map_err(RuntimeError::System)?;
        crate::identity::register_host_wide(&dd);
        Ok(Self {
            dd,
            exe: exe.into(),
            launcher: None,
            naming,
            images: Default::default(),
            egress: Default::default(),
            volumes: Default::default(),
        })
    }

    /// Starts a launcher and forks supervisors from it rather than exec'ing `exe` for each
    /// (see [`crate::launcher`]); exec stays the way whenever it cannot (a launcher that does
    /// not start is logged). For a process that creates many sandboxes (a server): one create
    /// alone is quicker exec'd than launched.
    pub fn with_launcher(mut self) -> Self {
        match crate::launcher::Launcher::spawn(&self.exe) {
            Ok(l) => self.launcher = Some(std::sync::Arc::new(l)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the supervisor launcher; sandbox supervisors are exec'd")
            }
        }
        self
    }

    /// Forks supervisors from `launcher`, one [`crate::launcher::Launcher::fork_now`] made.
    pub fn with_forked_launcher(mut self, launcher: crate::launcher::Launcher) -> Self {
        self.launcher = Some(std::sync::Arc::new(launcher));
        self
    }

    /// Registries to pull from and image aliases (`paddock serve --registry-mirror`,
    /// `--insecure-registry`, `--image-alias`).
    pub fn with_images(mut self, images: crate::image::ImageOptions) -> Self {
        self.images = images;
        self
    }

    /// The operator's egress settings (`paddock serve --egress-block`, `--egress-allow-private`,
    /// `--egress-dns`).
    pub fn with_egress(mut self, egress: crate::egress::EgressOptions) -> Self {
        self.egress = egress;
        self
    }

    /// The operator's volume settings (`paddock serve --volume-root`).
    pub fn with_volumes(mut self, volumes: crate::volumes::VolumeOptions) -> Self {
        self.volumes = volumes;
        self
    }

    /// The host identity a sandbox runs as (its egress enforcer drops to it).
    fn host_ids(&self, id: &SandboxId) -> Result<(u32, u32), RuntimeError> {
        let record = self.read_record(id)?;
        let ids = record.host_ids.unwrap_or(crate::identity::HostIds::shared(&record.info.spec.user));
        Ok((ids.uid, ids.gid))
    }

    /// Starts or updates a sandbox's egress enforcer with `policy`.
    async fn apply_egress(&self, id: &SandboxId, policy: &EgressPolicy) -> Result<EgressStatus, RuntimeError> {
        let ids = self.host_ids(id)?;
        let spec = self.read_record(id)?.info.spec;
        let gateway = spec.gateway.map(|a| (a, spec.gateway_secret));
        crate::egress::apply(&self.dd, &self.exe, &self.egress, id, ids, policy, gateway).await
    }

    pub fn naming(&self) -> NamingMode {
        self.naming
    }

    pub fn data_dir(&self) -> &DataDir {
        &self.dd
    }

    fn new_id() -> Result<SandboxId, RuntimeError> {
        let mut bits = [0u8; 6];
        rustix::rand::getrandom(&mut bits, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| RuntimeError::System(format!("getrandom: {e}")))?;
        Ok(SandboxId::from_random(bits))
    }

    /// `create_and_exec` the trait's way, one after the other.
    async fn create_then_exec(
        &self,
        spec: ValidatedSpec,
        request: ExecRequest,
    ) -> Result<(SandboxInfo, Result<Process, RuntimeError>), RuntimeError> {
        let info = self.create(spec).await?;
        let process = self.exec(&info.id, request).await;
        Ok((info, process))
    }

    /// Starts a supervisor and waits until the sandbox is ready (or failed to start).
    async fn spawn_supervisor(&self, spec: &SandboxSpec) -> Result<SandboxInfo, RuntimeError> {
        Ok(self.spawn_supervisor_with(spec, None).await?.0)
    }

    /// [`Self::spawn_supervisor`], handing it `first`, a connection to serve once the sandbox
    /// is ready (see [`crate::supervisor::main`]); also whether it took it (only a launched
    /// supervisor can).
    async fn spawn_supervisor_with(
        &self,
        spec: &SandboxSpec,
        first: Option<OwnedFd>,
    ) -> Result<(SandboxInfo, bool), RuntimeError> {
        let mut spec = spec.clone();
        let id = Self::new_id()?;
        let dir = self.dd.sandbox(&id);
        fs::create_dir(&dir).map_err(sys_err(format!("creating {}", dir.display())))?;
        // Until the supervisor is started, a failure or a caller that gives up (a server's
        // deadline or a client gone, during a pull say) takes the directory and the lease away.
        let mut unstarted = Unstarted { dd: &self.dd, id: &id, armed: true };
        // Held until the supervisor answers: a listing never takes a create under way for one
        // whose creator died (`remains::retire_half_made`).
        let creating = fs::File::open(&dir).map_err(sys_err(format!("opening {}", dir.display())))?;
        rustix::fs::flock(&creating, rustix::fs::FlockOperation::LockShared)
            .map_err(|e| RuntimeError::System(format!("locking {}: {e}", dir.display())))?;
        // Traversable (not readable) by the sandbox's host identity, which mounts the skeleton
        // inside it; what it holds is private by its own modes (socket, record, log: 0600).
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o711)).map_err(sys_err("chmod"))?;
        if spec.credential_proxy {
            // The CA is the sandbox's own: its key stays in this directory and the enforcer.
            crate::vault::make_ca(&self.dd, &id)?;
            for (name, path) in crate::vault::CA_ENV {
                spec.env.entry((*name).to_string()).or_insert_with(|| (*path).to_string());
            }
        }
        // Leased before the supervisor starts, so a prune never removes layers it is mounting;
        // the supervisor gives the lease back when the sandbox ends.
        // What the image adds (its environment, working directory and command) is checked
        // where the supervisor reads the spec, as a `ValidatedSpec`.
        let image = crate::image::prepare(&self.dd, &self.images, &mut spec, &id).await?;
        crate::volumes::resolve(&self.dd, &self.volumes, &mut spec)?;
        // Once it may be running, only a failure it reported cleans up: a supervisor that
        // started keeps its directory until it ends.
        unstarted.armed = false;
        let result = self.run_supervisor(&id, &spec, image.map(|(root, _)| root), first).await;
        if result.is_err() {
            unstarted.clean();
        }
        drop(creating);
        let (info, took_first) = result?;
        if let NetworkPolicy::Egress(policy) = &spec.network
            && let Err(e) = self.apply_egress(&id, policy).await
        {
            // Never hand out a sandbox whose policy is not in force.
            let _ = self.destroy(&id).await;
            return Err(e);
        }
        Ok((info, took_first))
    }

    async fn run_supervisor(
        &self,
        id: &SandboxId,
        spec: &SandboxSpec,
        image: Option<crate::protocol::ImageRoot>,
        first: Option<OwnedFd>,
    ) -> Result<(SandboxInfo, bool), RuntimeError> {
        let start = protocol::encode(&protocol::Start { spec: spec.clone(), image });
        if let Some(launcher) = &self.launcher {
            let (spec_in, spec_out) = pipe_fds()?;
            let (ready_in, ready_out) = pipe_fds()?;
            // The spec waits in the pipe (as much as fits without blocking), so the forked
            // supervisor reads it at once instead of after the launcher's answer reaches us.
            // Only our end is non-blocking: the supervisor reads its stdin blocking.
            let early = match rustix::io::ioctl_fionbio(&spec_out, true) {
                Ok(()) => rustix::io::write(&spec_out, &start).unwrap_or(0),
                Err(_) => 0,
            };
            match launcher
                .launch(id, self.dd.root(), spec_in.as_fd(), ready_out.as_fd(), first.as_ref().map(|f| f.as_fd()))
                .await
            {
                Some(Ok(())) => {
                    // Only the supervisor holds these ends now, so its exit is an end of file.
                    drop((spec_in, ready_out, first));
                    let (spec_out, ready_in) = (pipe_writer(spec_out)?, pipe_reader(ready_in)?);
                    let info = self.handshake(id, &start[early..], spec_out, ready_in, None).await?;
                    return Ok((info, true));
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "the supervisor launcher failed; sandbox supervisors are exec'd from now on")
                }
                None => {}
            }
        }
        let mut command = tokio::process::Command::new(&self.exe);
        paddock_sys::process::inherit_only_stdio(command.as_std_mut());
        let mut child = command
            .arg("__supervise")
            .arg("--data-dir")
            .arg(self.dd.root())
            .arg("--id")
            .arg(id.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env_clear()
            .spawn()
            .map_err(sys_err(format!("starting the sandbox supervisor {}", self.exe.display())))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        Ok((self.handshake(id, &start, stdin, stdout, Some(child)).await?, false))
    }

    /// Sends a supervisor its spec and waits for its readiness line. `child` is the exec'd
    /// supervisor (a launched one is nobody's child here).
    async fn handshake(
        &self,
        id: &SandboxId,
        start: &[u8],
        mut stdin: impl tokio::io::AsyncWrite + Unpin,
        stdout: impl AsyncRead + Unpin,
        mut child: Option<tokio::process::Child>,
    ) -> Result<SandboxInfo, RuntimeError> {
        stdin.write_all(start).await.map_err(sys_err("sending the spec to the supervisor"))?;
        drop(stdin);
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).await.map_err(sys_err("reading the supervisor's readiness"))?;
        if line.is_empty() {
            let status = match &mut child {
                Some(c) => c.wait().await.ok().map(|s| format!(" ({s})")).unwrap_or_default(),
                None => String::new(),
            };
            return Err(RuntimeError::System(format!(
                "the sandbox supervisor exited before it was ready{status}; see {}",
                self.dd.log(id).display()
            )));
        }
        match protocol::decode::<Ready>(line.as_bytes())? {
            Ready::Ready { record } => Ok(record.info),
            Ready::Failed { error } => {
                if let Some(c) = &mut child {
                    let _ = c.wait().await;
                }
                Err(error.into())
            }
        }
    }

    fn read_record(&self, id: &SandboxId) -> Result<Record, RuntimeError> {
        let path = self.dd.record(id);
        match fs::read(&path) {
            Ok(bytes) => protocol::decode(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(RuntimeError::NotFound(format!("no sandbox {id}: see `paddock ls` for the sandboxes that exist")))
            }
            Err(e) => Err(RuntimeError::from_io(path.display(), &e)),
        }
    }

    /// Sends a request on a fresh connection to the sandbox's supervisor.
    async fn request(
        &self,
        id: &SandboxId,
        request: &Request,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<Conn, RuntimeError> {
        let conn = Conn::connect(&self.dd.socket(id)).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                if self.dd.sandbox(id).exists() {
                    RuntimeError::Unavailable(format!(
                        "sandbox {id} is not running (its supervisor is gone): remove it with `paddock rm {id}`"
                    ))
                } else {
                    RuntimeError::NotFound(format!("no sandbox {id}: see `paddock ls` for the sandboxes that exist"))
                }
            }
            _ => RuntimeError::System(format!("connecting to sandbox {id}: {e}")),
        })?;
        conn.send(&protocol::encode(request), fds).await?;
        Ok(conn)
    }

    async fn call(&self, id: &SandboxId, request: &Request) -> Result<Reply, RuntimeError> {
        let conn = self.request(id, request, &[]).await?;
        match conn.recv().await? {
            Some(Reply::Error { error }) => Err(error.into()),
            Some(r) => Ok(r),
            None => Err(RuntimeError::Unavailable(format!("sandbox {id} closed the connection without answering"))),
        }
    }

    /// Removes what a sandbox whose supervisor died left behind.
    async fn clean_dead(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let record = self.read_record(id).ok();
        let (id, dir, dd) = (id.clone(), self.dd.sandbox(id), self.dd.clone());
        blocking(move || crate::remains::remove(&dd, &id, &dir, record.as_ref()).map_err(RuntimeError::System)).await
    }

    /// Runs a file call on a fresh connection; `data` is the pipe a read or write moves
    /// contents through.
    async fn file_call(&self, id: &SandboxId, op: FileCall, data: Option<OwnedFd>) -> Result<FileReply, RuntimeError> {
        let fds: Vec<_> = data.iter().map(|d| d.as_fd()).collect();
        let conn = self.request(id, &Request::File { op, has_data: data.is_some() }, &fds).await?;
        drop(fds);
        drop(data);
        let mut listed = Vec::new();
        let too_many = || {
            RuntimeError::InvalidArgument(format!(
                "the directory holds more than {} entries: list a subdirectory, or search with a narrower path",
                paddock_core::runtime::MAX_LISTED_ENTRIES
            ))
        };
        loop {
            match conn.recv().await? {
                Some(Reply::Entries { entries }) => {
                    listed.extend(entries);
                    // Dropping the connection stops the worker; nothing more is held.
                    if listed.len() > paddock_core::runtime::MAX_LISTED_ENTRIES {
                        return Err(too_many());
                    }
                }
                Some(Reply::File { reply: FileReply::List { entries } }) => {
                    listed.extend(entries);
                    if listed.len() > paddock_core::runtime::MAX_LISTED_ENTRIES {
                        return Err(too_many());
                    }
                    return Ok(FileReply::List { entries: listed });
                }
                Some(Reply::File { reply }) => return Ok(reply),
                Some(Reply::Error { error }) => return Err(error.into()),
                Some(other) => {
                    return Err(RuntimeError::System(format!("unexpected answer to a file operation: {other:?}")));
                }
                None => {
                    return Err(RuntimeError::Unavailable(format!(
                        "sandbox {id} closed the file operation without answering (it may have been destroyed, or run out of processes or memory)"
                    )));
                }
            }
        }
    }

    fn workspace_name(&self, thread: &ThreadId) -> String {
        resource_name(thread, self.naming)
    }

    /// Runs `f` holding the workspace's lock, so acquire/release/destroy of one thread never
    /// interleave, in this process or across processes.
    async fn with_workspace_lock<T>(
        &self,
        thread: &ThreadId,
        f: impl AsyncFnOnce(String) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let name = self.workspace_name(thread);
        let path = self.dd.workspace_lock(&name);
        let lock = tokio::task::spawn_blocking(move || -> std::io::Result<fs::File> {
            let file = fs::OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&path)?;
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
            Ok(file)
        })
        .await
        .map_err(|e| RuntimeError::System(format!("workspace lock task: {e}")))?
        .map_err(sys_err("locking the workspace"))?;
        let result = f(name).await;
        drop(lock);
        result
    }

    fn live_sandbox_of(&self, name: &str) -> Option<SandboxId> {
        let text = fs::read_to_string(self.dd.workspace(name).join("sandbox")).ok()?;
        SandboxId::parse(text.trim()).ok()
    }

    fn prepare_workspace(&self, name: &str, thread: &ThreadId, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        let files = self.dd.workspace_files(name);
        let image = self.dd.workspace_image(name);
        let wanted = spec.resources.workspace_bytes;
        // A workspace keeps the size and inode cap it was created with; later acquires get it
        // as it is. Refusing a different size would make every existing workspace unusable the
        // day an operator changes the default (`--workspace-size`), and workspaces made before
        // caps existed (a plain `files/` directory) would all conflict with the default.
        if image.is_file() || files.is_dir() {
            return Ok(());
        }
        let dir = self.dd.workspace(name);
        fs::create_dir_all(&dir).map_err(sys_err(format!("creating {}", dir.display())))?;
        crate::layout::write_private(&dir.join("thread.json"), protocol::encode(thread))
            .map_err(sys_err("writing thread.json"))?;
        let ids = crate::identity::of_workspace(&self.dd, name, &spec.user, true)?;
        // Only root and the workspace's own group may pass: other host users never reach its
        // files, even ones a sandbox made world-readable or set-id.
        chown(&dir, None, Some(ids.gid)).map_err(sys_err(format!("chown {}", dir.display())))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o710)).map_err(sys_err("chmod workspace"))?;
        if let Some(bytes) = wanted {
            return crate::wsimage::create(&image, bytes, spec.resources.workspace_inodes, ids.uid, ids.gid);
        }
        fs::create_dir(&files).map_err(sys_err(format!("creating {}", files.display())))?;
        chown(&files, Some(ids.uid), Some(ids.gid)).map_err(sys_err("chown workspace"))?;
        fs::set_permissions(&files, fs::Permissions::from_mode(0o755)).map_err(sys_err("chmod workspace"))
    }

    async fn acquire_locked(
        &self,
        name: &str,
        thread: &ThreadId,
        mut spec: SandboxSpec,
        reuse: bool,
    ) -> Result<SandboxInfo, RuntimeError> {
        if let Some(id) = self.live_sandbox_of(name) {
            match self.get(&id).await {
                Ok(info) if info.state != SandboxState::Failed => {
                    if reuse {
                        return Ok(info);
                    }
                    return Err(RuntimeError::Conflict(format!(
                        "the workspace of thread {thread} is in use by sandbox {id}: acquire it to reattach, or release it first"
                    )));
                }
                Ok(_) => {
                    let _ = self.clean_dead(&id).await;
                }
                Err(_) => {}
            }
        }
        spec.workspace = Some(WorkspaceRef { thread: thread.clone(), naming: self.naming });
        crate::image::resolve(spec.image.as_deref())?;
        let (rt, name_owned, thread_owned, spec_owned) = (self.clone(), name.to_owned(), thread.clone(), spec.clone());
        blocking(move || rt.prepare_workspace(&name_owned, &thread_owned, &spec_owned)).await?;
        let info = self.spawn_supervisor(&spec).await?;
        let pointer = self.dd.workspace(name).join("sandbox");
        crate::layout::write_private(&pointer, info.id.as_str())
            .map_err(sys_err(format!("writing {}", pointer.display())))?;
        Ok(info)
    }

    async fn release_locked(&self, name: &str) -> Result<(), RuntimeError> {
        if let Some(id) = self.live_sandbox_of(name) {
            match self.destroy(&id).await {
                Ok(()) | Err(RuntimeError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let _ = fs::remove_file(self.dd.workspace(name).join("sandbox"));
        Ok(())
    }
}

#[async_trait::async_trait]
impl Runtime for LocalRuntime {
    /// Starts a sandbox and proves it is confined: uid 1000, no capabilities, no_new_privs
    /// and a seccomp filter.
    async fn check(&self, _probe: bool) -> Result<paddock_core::preflight::Report, RuntimeError> {
        use paddock_core::preflight::{CheckStatus, Report};
        let mut report = Report {
            namespace: "-".into(),
            network_policy: "loopback only (by construction)".into(),
            ..Default::default()
        };
        let result: Result<String, RuntimeError> = async {
            let info = self.create(ValidatedSpec::default()).await?;
            let request = ExecRequest::shell("id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status");
            let out = match self.exec(&info.id, request).await {
                Ok(p) => {
                    let mut stdout = p.stdout;
                    let mut text = String::new();
                    tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut text)
                        .await
                        .map_err(|e| RuntimeError::from_io("reading the check's output", &e))?;
                    text
                }
                Err(e) => e.to_string(),
            };
            self.destroy(&info.id).await?;
            Ok(out)
        }
        .await;
        let confined = "1000\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";
        match result {
            Ok(out) if out == confined => report.push(
                "sandbox",
                CheckStatus::Pass,
                "a sandbox starts as uid 1000 with no capabilities, no_new_privs and seccomp",
            ),
            Ok(out) => {
                report.push("sandbox", CheckStatus::Fail, format!("a sandbox is not confined as expected: {out:?}"))
            }
            Err(e) => report.push("sandbox", CheckStatus::Fail, format!("cannot start a sandbox: {e}")),
        }
        Ok(report)
    }

    async fn isolation_targets(&self) -> Result<paddock_core::runtime::IsolationTargets, RuntimeError> {
        // A sandbox's network namespace has only its own loopback: every address of the host
        // is out of reach. Port 0: the gate's own listener on this host.
        let mut out = paddock_core::runtime::IsolationTargets::default();
        match std::fs::read_to_string("/proc/net/fib_trie") {
            Ok(trie) => {
                let mut seen = std::collections::BTreeSet::new();
                let mut last = None;
                for line in trie.lines() {
                    let line = line.trim();
                    if let Some(addr) = line.strip_prefix("|-- ") {
                        last = Some(addr.to_owned());
                    } else if line.contains("/32 host LOCAL")
                        && let Some(addr) = last.take()
                        // The sandbox's own loopback answers there, not the host's.
                        && !addr.starts_with("127.")
                        && seen.insert(addr.clone())
                    {
                        out.targets.push(paddock_core::runtime::IsolationTarget {
                            name: format!("this host at {addr}"),
                            host: addr,
                            port: 0,
                            kind: paddock_core::runtime::TargetKind::Tcp,
                        });
                    }
                }
            }
            Err(e) => out.skipped.push(paddock_core::runtime::NotChecked::new(
                "the host's addresses",
                format!("reading /proc/net/fib_trie: {e}"),
            )),
        }
        Ok(out)
    }

    async fn health(&self) -> Result<(), RuntimeError> {
        // Creates need room in the data directory (records, sockets, workspaces, images).
        let root = self.dd.root().to_path_buf();
        let vfs = blocking(move || rustix::fs::statvfs(&root).map_err(|e| RuntimeError::from_io("statvfs", &e.into())))
            .await?;
        let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
        if free < 64 << 20 || (vfs.f_files > 0 && vfs.f_favail < 1024) {
            return Err(RuntimeError::Exhausted(format!(
                "the disk of the data directory {} is full ({} MiB, {} inodes free): creates and writes will fail; free space there",
                self.dd.root().display(),
                free >> 20,
                vfs.f_favail
            )));
        }
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            runtime: "local".into(),
            pause: true,
            persistent_workspaces: true,
            run_as_other_user: false,
            images: crate::image::ACCEPTED.into(),
            network: vec![
                NetworkFeature::Deny,
                NetworkFeature::AllowAll,
                NetworkFeature::IpRules,
                NetworkFeature::DomainRules,
                NetworkFeature::PortRules,
                NetworkFeature::Change,
            ],
            metrics: true,
            volumes: if self.volumes.host_roots.is_empty() {
                vec![VolumeKind::Named]
            } else {
                vec![VolumeKind::Host, VolumeKind::Named]
            },
            gateway: true,
            gateway_names_sandbox: true,
            no_gateway_because: None,
            default_workspace_bytes: Some(paddock_core::spec::DEFAULT_WORKSPACE),
            credential_vault: true,
            // seccomp refuses new user namespaces and mounts inside a sandbox: no containers there.
            isolation: "namespaces".into(),
            devices: Vec::new(),
            nested_containers: false,
        }
    }

    async fn volumes(&self) -> Result<Vec<paddock_core::volume::NamedVolume>, RuntimeError> {
        let dd = self.dd.clone();
        blocking(move || crate::volumes::list(&dd)).await
    }

    async fn delete_volume(&self, name: &str) -> Result<(), RuntimeError> {
        let (dd, name) = (self.dd.clone(), name.to_owned());
        blocking(move || crate::volumes::remove(&dd, &name)).await
    }

    async fn create(&self, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        let mut spec = spec.into_inner();
        spec.image = self.images.apply_alias(spec.image.as_deref());
        crate::egress::give_gateway(&mut spec);
        crate::image::resolve(spec.image.as_deref())?;
        match spec.workspace.clone() {
            Some(w) => {
                self.with_workspace_lock(&w.thread, async |name| {
                    self.acquire_locked(&name, &w.thread, spec, false).await
                })
                .await
            }
            None => self.spawn_supervisor(&spec).await,
        }
    }

    async fn get(&self, id: &SandboxId) -> Result<SandboxInfo, RuntimeError> {
        let record = self.read_record(id)?;
        if record.info.state == SandboxState::Failed {
            return Ok(record.info);
        }
        match self.call(id, &Request::Info).await {
            Ok(Reply::Info { info }) => Ok(*info),
            Ok(other) => Err(RuntimeError::System(format!("unexpected answer from sandbox {id}: {other:?}"))),
            Err(RuntimeError::Unavailable(_)) => {
                let mut info = record.info;
                info.state = SandboxState::Failed;
                info.failure = Some("its supervisor is not running".into());
                Ok(info)
            }
            Err(e) => Err(e),
        }
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>, RuntimeError> {
        // A listing is where remains of a destroy whose supervisor died half-way are noticed;
        // only a listing that finds some goes to the blocking pool.
        if self.dd.anything_gone() {
            let dd = self.dd.clone();
            blocking(move || {
                crate::remains::sweep(&dd);
                Ok(())
            })
            .await?;
        }
        let dir = self.dd.sandboxes();
        let mut entries = tokio::fs::read_dir(&dir).await.map_err(sys_err(format!("listing {}", dir.display())))?;
        // Every supervisor is asked at once: one slow sandbox must not make the list slow.
        let mut asks = tokio::task::JoinSet::new();
        while let Some(entry) = entries.next_entry().await.map_err(sys_err(format!("listing {}", dir.display())))? {
            let Some(id) = entry.file_name().to_str().and_then(|n| SandboxId::parse(n).ok()) else { continue };
            let rt = self.clone();
            asks.spawn(async move {
                let info = rt.get(&id).await;
                (id, info)
            });
        }
        let mut out = Vec::new();
        let mut unready = Vec::new();
        while let Some(answer) = asks.join_next().await {
            // A directory without a record is a sandbox still starting (or one that never will:
            // its creator died, retired below).
            match answer {
                Ok((_, Ok(info))) => out.push(info),
                Ok((id, Err(RuntimeError::NotFound(_)))) => unready.push(id),
                _ => {}
            }
        }
        if !unready.is_empty() {
            let dd = self.dd.clone();
            blocking(move || {
                if crate::remains::retire_half_made(&dd, &unready) {
                    crate::remains::sweep(&dd);
                }
                Ok(())
            })
            .await?;
        }
        out.sort_by(|a, b| a.created_unix_ms.cmp(&b.created_unix_ms).then_with(|| a.id.cmp(&b.id)));
        Ok(out)
    }

    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process, RuntimeError> {
        request.validate()?;
        let pipes = ExecPipes::new(request.stdin)?;
        let has_stdin = request.stdin;
        let conn = self.request(id, &Request::Exec { request, has_stdin }, &pipes.theirs()).await?;
        pipes.started(conn, id).await
    }

    async fn create_and_exec(
        &self,
        spec: ValidatedSpec,
        request: ExecRequest,
    ) -> Result<(SandboxInfo, Result<Process, RuntimeError>), RuntimeError> {
        // Asked at once only where the supervisor's readiness is the sandbox's: a workspace's
        // sandbox is created under its lock, and an egress policy is put in force after the
        // start, before any command may run.
        let at_once = self.launcher.is_some()
            && spec.workspace.is_none()
            && !matches!(spec.network, NetworkPolicy::Egress(_))
            && request.validate().is_ok();
        if !at_once {
            return self.create_then_exec(spec, request).await;
        }
        let mut spec = spec.into_inner();
        crate::egress::give_gateway(&mut spec);
        spec.image = self.images.apply_alias(spec.image.as_deref());
        crate::image::resolve(spec.image.as_deref())?;
        // The request waits in a connection of our own, whose other end the supervisor serves
        // as soon as the sandbox is ready.
        let pipes = ExecPipes::new(request.stdin)?;
        let (ours, theirs) = fdpass::seqpacket_pair().map_err(sys_err("creating a connection for the command"))?;
        let exec = Request::Exec { request: request.clone(), has_stdin: request.stdin };
        // Non-blocking: nobody reads the other end yet, so a send that would wait is an error.
        rustix::io::ioctl_fionbio(&ours, true)
            .map_err(|e| RuntimeError::from_io("the command's connection", &e.into()))?;
        fdpass::send(&ours, &protocol::encode(&exec), &pipes.theirs())
            .map_err(sys_err("queueing the command for the sandbox"))?;
        let (info, took) = self.spawn_supervisor_with(&spec, Some(theirs)).await?;
        if !took {
            // An exec'd supervisor: the queued request went with its connection.
            drop((ours, pipes));
            let process = self.exec(&info.id, request).await;
            return Ok((info, process));
        }
        let process = async {
            let conn = Conn { fd: paddock_sys::asyncfd::register(ours).map_err(sys_err("registering a connection"))? };
            pipes.started(conn, &info.id).await
        }
        .await;
        Ok((info, process))
    }

    async fn file(&self, id: &SandboxId, op: FileOp) -> Result<FileReply, RuntimeError> {
        self.file_call(id, FileCall::Meta(op), None).await
    }

    async fn read_file(&self, id: &SandboxId, path: &str) -> Result<ByteReader, RuntimeError> {
        let (r, w) = pipe_fds()?;
        let mut pipe = pipe_reader(r)?;
        let (done_tx, done) = oneshot::channel();
        let (rt, id, call) = (self.clone(), id.clone(), FileCall::Read { path: path.to_owned() });
        tokio::spawn(async move {
            let _ = done_tx.send(rt.file_call(&id, call, Some(w)).await);
        });
        // The first bytes, or the end: a file that cannot be opened ends the pipe at once, and
        // its error must be returned here rather than read as an empty file.
        let mut first = vec![0u8; 64 << 10];
        let n = pipe.read(&mut first).await.map_err(sys_err(format!("reading {path}")))?;
        if n == 0 {
            done.await.map_err(|_| RuntimeError::System("the file read task ended without an answer".into()))??;
            return Ok(Box::new(tokio::io::empty()));
        }
        first.truncate(n);
        Ok(Box::new(std::io::Cursor::new(first).chain(ReadToEnd { pipe, done: Some(done) })))
    }

    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        mode: Option<u32>,
        mut data: ByteReader,
    ) -> Result<(), RuntimeError> {
        let (r, w) = pipe_fds()?;
        let mut sink = pipe_writer(w)?;
        let op = self.file_call(id, FileCall::Write { path: path.to_owned(), mode, room: None }, Some(r));
        let feed = async move {
            let copied = tokio::io::copy(&mut data, &mut sink).await;
            // Closing the pipe is the end of the file for the writer in the sandbox.
            drop(sink);
            copied
        };
        let (op, fed) = tokio::join!(op, feed);
        op?;
        fed.map(drop).map_err(|e| {
            RuntimeError::InvalidArgument(format!(
                "the data for {path} ended early ({e}): the file holds only part of it; send it again"
            ))
        })
    }

    async fn connect(&self, id: &SandboxId, port: u16) -> Result<Box<dyn Duplex>, RuntimeError> {
        let conn = self.request(id, &Request::Connect { port }, &[]).await?;
        let fd = match conn.recv_with_fds().await? {
            Some((Reply::Connected, mut fds)) if fds.len() == 1 => fds.remove(0),
            Some((Reply::Error { error }, _)) => return Err(error.into()),
            other => {
                return Err(RuntimeError::System(format!("unexpected answer to a connect: {:?}", other.map(|o| o.0))));
            }
        };
        let stream = std::net::TcpStream::from(fd);
        stream.set_nonblocking(true).map_err(sys_err("the connection into the sandbox"))?;
        let stream = tokio::net::TcpStream::from_std(stream).map_err(sys_err("the connection into the sandbox"))?;
        Ok(Box::new(stream))
    }

    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics, RuntimeError> {
        match self.call(id, &Request::Stats).await? {
            Reply::Stats { mut metrics } => {
                // A sandbox without an enforcer has nothing to count; one whose enforcer does
                // not answer just lacks the counters this time.
                metrics.egress =
                    crate::egress::ask(&self.dd, id, &ControlRequest::Status).await.ok().flatten().map(|s| s.counters);
                Ok(metrics)
            }
            other => Err(RuntimeError::System(format!("unexpected answer to stats: {other:?}"))),
        }
    }

    async fn egress(&self, id: &SandboxId) -> Result<EgressStatus, RuntimeError> {
        let info = self.get(id).await?;
        if let Some(status) = crate::egress::ask(&self.dd, id, &ControlRequest::Status).await? {
            return Ok(status);
        }
        let policy = crate::egress::stored_policy(&self.dd, id).unwrap_or_else(|| info.spec.network.policy());
        // A gateway's forwarder is the enforcer's too, so one that denies everything is still
        // brought back.
        if info.state == SandboxState::Failed || (policy.denies_everything() && info.spec.gateway.is_none()) {
            return Ok(EgressStatus::uncounted(policy, Enforcement::NetworkNamespace));
        }
        // Its enforcer is gone (killed, or the host ran out of memory): start it again rather
        // than leave the sandbox cut off from what its policy allows.
        self.apply_egress(id, &policy).await
    }

    async fn vault(&self, id: &SandboxId) -> Result<Option<paddock_core::vault::Vault>, RuntimeError> {
        self.read_record(id)?;
        crate::vault::load(&self.dd, id)
    }

    async fn set_vault(&self, id: &SandboxId, vault: Option<paddock_core::vault::Vault>) -> Result<(), RuntimeError> {
        let info = self.get(id).await?;
        if info.state == SandboxState::Failed {
            return Err(RuntimeError::Conflict(format!("sandbox {id} has failed: its vault cannot change")));
        }
        if !crate::egress::set_vault(&self.dd, id, vault.as_ref()).await? && vault.is_some() {
            // No enforcer answers: bring it back (it reads the vault just saved).
            let status = self.egress(id).await?;
            if status.enforcement == Enforcement::NetworkNamespace {
                return Err(RuntimeError::InvalidArgument(format!(
                    "sandbox {id} has no egress (its policy denies everything): a vault needs hosts its policy allows"
                )));
            }
        }
        Ok(())
    }

    async fn set_egress(&self, id: &SandboxId, policy: ValidatedPolicy) -> Result<EgressStatus, RuntimeError> {
        let info = self.get(id).await?;
        if info.state == SandboxState::Failed {
            return Err(RuntimeError::Conflict(format!("sandbox {id} has failed: its egress cannot change")));
        }
        self.apply_egress(id, &policy).await
    }

    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.call(id, &Request::Pause).await.map(drop)
    }

    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.call(id, &Request::Resume).await.map(drop)
    }

    async fn renew(&self, id: &SandboxId, ttl: Duration) -> Result<SandboxInfo, RuntimeError> {
        match self.call(id, &Request::Renew { ttl_ms: paddock_core::units::millis(ttl) }).await? {
            Reply::Info { info } => Ok(*info),
            other => Err(RuntimeError::System(format!("unexpected answer to renew: {other:?}"))),
        }
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        if !self.dd.sandbox(id).exists() {
            return Err(RuntimeError::NotFound(format!(
                "no sandbox {id}: see `paddock ls` for the sandboxes that exist"
            )));
        }
        match self.call(id, &Request::Destroy).await {
            Ok(_) => Ok(()),
            Err(RuntimeError::Unavailable(_)) => self.clean_dead(id).await,
            Err(e) => Err(e),
        }
    }

    async fn acquire(&self, thread: &ThreadId, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        let mut spec = spec.into_inner();
        spec.image = self.images.apply_alias(spec.image.as_deref());
        crate::egress::give_gateway(&mut spec);
        self.with_workspace_lock(thread, async |name| self.acquire_locked(&name, thread, spec, true).await).await
    }

    async fn release(&self, thread: &ThreadId) -> Result<(), RuntimeError> {
        self.with_workspace_lock(thread, async |name| self.release_locked(&name).await).await
    }

    async fn destroy_workspace(&self, thread: &ThreadId) -> Result<(), RuntimeError> {
        self.with_workspace_lock(thread, async |name| {
            let dir = self.dd.workspace(&name);
            if !dir.exists() {
                return Err(RuntimeError::NotFound(format!("thread {thread} has no workspace")));
            }
            self.release_locked(&name).await?;
            let dd = self.dd.clone();
            blocking(move || {
                let ids = fs::read(dd.workspace_identity(&name))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<crate::identity::HostIds>(&b).ok());
                fs::remove_dir_all(&dir).map_err(sys_err(format!("removing {}", dir.display())))?;
                // Its files are gone with it: the identity can serve another sandbox.
                if let Some(ids) = ids {
                    crate::identity::release(&dd, &ids);
                }
                Ok(())
            })
            .await
        })
        .await
    }
}

/// The rest of a file being read: the pipe's bytes, then the read's own answer, so an error
/// half-way (the sandbox destroyed, an I/O error) is an error of the stream, not a short file.
struct ReadToEnd {
    pipe: pipe::Receiver,
    done: Option<oneshot::Receiver<Result<FileReply, RuntimeError>>>,
}

impl AsyncRead for ReadToEnd {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.pipe).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            return Poll::Ready(Ok(()));
        }
        let Some(done) = self.done.as_mut() else { return Poll::Ready(Ok(())) };
        let answer = ready!(Pin::new(done).poll(cx));
        self.done = None;
        match answer {
            Ok(Ok(_)) => Poll::Ready(Ok(())),
            Ok(Err(e)) => Poll::Ready(Err(std::io::Error::other(e.to_string()))),
            Err(_) => Poll::Ready(Err(std::io::Error::other("the file read ended without an answer"))),
        }
    }
}

/// The pipes of a command being started: the sandbox's ends go with the request.
struct ExecPipes {
    stdin: Option<(OwnedFd, OwnedFd)>,
    stdout: (OwnedFd, OwnedFd),
    stderr: (OwnedFd, OwnedFd),
}

impl ExecPipes {
    fn new(stdin: bool) -> Result<Self, RuntimeError> {
        Ok(Self { stdin: if stdin { Some(pipe_fds()?) } else { None }, stdout: pipe_fds()?, stderr: pipe_fds()? })
    }

    /// The descriptors an exec request carries: [stdin]? stdout stderr.
    fn theirs(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        let mut fds: Vec<_> = self.stdin.iter().map(|(r, _)| r.as_fd()).collect();
        fds.extend([self.stdout.1.as_fd(), self.stderr.1.as_fd()]);
        fds
    }

    /// Once the request is sent on `conn`: the command, when the sandbox says it started.
    async fn started(self, conn: Conn, id: &SandboxId) -> Result<Process, RuntimeError> {
        // The sandbox holds its own copies now; ours would keep the output open forever.
        let (out_r, err_r) = (self.stdout.0, self.stderr.0);
        drop((self.stdout.1, self.stderr.1));
        let stdin = match self.stdin {
            Some((r, w)) => {
                drop(r);
                Some(Box::new(pipe_writer(w)?) as ByteWriter)
            }
            None => None,
        };
        match conn.recv().await? {
            Some(Reply::Started { pid }) => Ok(Process {
                stdin,
                stdout: Box::new(pipe_reader(out_r)?),
                stderr: Box::new(pipe_reader(err_r)?),
                control: Box::new(LocalExecution { conn, pid }),
            }),
            Some(Reply::Error { error }) => Err(error.into()),
            None => Err(RuntimeError::Unavailable(format!("sandbox {id} closed the exec without answering"))),
            other => Err(RuntimeError::System(format!("unexpected answer to an exec: {other:?}"))),
        }
    }
}

/// A command running in a local sandbox; its connection carries signals and the exit.
struct LocalExecution {
    conn: Conn,
    pid: u32,
}

#[async_trait::async_trait]
impl Execution for LocalExecution {
    fn pid(&self) -> Option<u32> {
        Some(self.pid)
    }

    async fn signal(&mut self, signal: i32) -> Result<(), RuntimeError> {
        self.conn.send(&protocol::encode(&Control::Signal { signal }), &[]).await
    }

    async fn wait(&mut self) -> Result<ExecOutcome, RuntimeError> {
        match self.conn.recv().await? {
            Some(Reply::Exited { outcome }) => Ok(outcome),
            Some(other) => {
                Err(RuntimeError::System(format!("unexpected message while waiting for a command: {other:?}")))
            }
            None => Err(RuntimeError::Unavailable("the sandbox stopped while the command was running".into())),
        }
    }
}

/// One connection to a supervisor (and, for exec and file operations, to the sandbox init).
struct Conn {
    fd: AsyncFd<OwnedFd>,
}

impl Conn {
    async fn connect(path: &std::path::Path) -> std::io::Result<Self> {
        let sock = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        let addr = SocketAddrUnix::new(path)?;
        let mut tries = 0;
        loop {
            match rustix::net::connect(&sock, &addr) {
                Ok(()) => break,
                // A full backlog: the supervisor is busy accepting; try again shortly.
                Err(rustix::io::Errno::AGAIN) if tries < 200 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Self { fd: paddock_sys::asyncfd::register(sock)? })
    }

    async fn send(&self, body: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> Result<(), RuntimeError> {
        loop {
            let mut guard = self.fd.writable().await.map_err(sys_err("waiting to send"))?;
            match guard.try_io(|fd| fdpass::send(fd.get_ref(), body, fds)) {
                Ok(r) => {
                    return r.map_err(|e| RuntimeError::Unavailable(format!("the sandbox connection failed: {e}")));
                }
                Err(_would_block) => continue,
            }
        }
    }

    /// The next reply; `None` when the other side closed the connection.
    async fn recv(&self) -> Result<Option<Reply>, RuntimeError> {
        Ok(self.recv_with_fds().await?.map(|(reply, _)| reply))
    }

    /// The next reply and the descriptors attached to it.
    async fn recv_with_fds(&self) -> Result<Option<(Reply, Vec<OwnedFd>)>, RuntimeError> {
        loop {
            let mut guard = self.fd.readable().await.map_err(sys_err("waiting for an answer"))?;
            match guard.try_io(|fd| fdpass::recv(fd.get_ref(), RecvFlags::DONTWAIT)) {
                Ok(Ok((body, _))) if body.is_empty() => return Ok(None),
                Ok(Ok((body, fds))) => return protocol::decode(&body).map(|r| Some((r, fds))),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
                Ok(Err(e)) => return Err(RuntimeError::Unavailable(format!("the sandbox connection failed: {e}"))),
                Err(_would_block) => continue,
            }
        }
    }
}
