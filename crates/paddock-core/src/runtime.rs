//! The interface every runtime (local, Kubernetes) implements, and the values it exchanges.
//!
//! Bytes cross the seam as async streams: a command's stdin, stdout and stderr, a file's
//! contents and a connection to a port inside the sandbox are `AsyncRead`/`AsyncWrite` values,
//! so a runtime may carry them over a pipe, a Unix socket or a WebSocket alike. A runtime never
//! buffers a whole output or file.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use serde::{Deserialize, Serialize};

use crate::egress::{EgressCounters, EgressStatus, ValidatedPolicy};
use crate::naming::ThreadId;
use crate::spec::{SandboxSpec, SpecError, ValidatedSpec};

/// A sandbox's id: `sbx-` and 12 lowercase hex digits for sandboxes Paddock made.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

impl SandboxId {
    pub fn parse(s: &str) -> Result<Self, RuntimeError> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-');
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(RuntimeError::InvalidArgument(format!(
                "{s:?} is not a sandbox id: ids look like sbx-0123456789ab (see `paddock ls`)"
            )))
        }
    }
    /// A fresh random id from 48 random bits.
    pub fn from_random(bits: [u8; 6]) -> Self {
        Self(format!("sbx-{}", hex::encode(bits)))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SandboxId {
    type Error = RuntimeError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}
impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.0
    }
}
impl std::fmt::Display for SandboxId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
    /// The sandbox's supervisor is gone; its processes are dead, its workspace is kept.
    Failed,
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Failed => "failed",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceInfo {
    pub thread: ThreadId,
    /// The collision-resistant name the workspace is stored under.
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub id: SandboxId,
    pub state: SandboxState,
    pub spec: SandboxSpec,
    pub created_unix_ms: u64,
    pub expires_unix_ms: Option<u64>,
    pub workspace: Option<WorkspaceInfo>,
    /// Why the sandbox failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The addresses the sandbox's connections come from, as the server sees them, when the
    /// runtime gives it one of its own on a network the server is on (a Pod's IPs). The gateway
    /// checks that a run's token comes from there. Empty: the runtime names the sandbox itself
    /// (`Capabilities::gateway_names_sandbox`), or has no such address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<std::net::IpAddr>,
}

/// A command to run in a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments; the program is looked up in `PATH`.
    pub argv: Vec<String>,
    /// Working directory inside the sandbox; relative paths start at `/workspace`.
    pub cwd: Option<String>,
    /// Variables added to the sandbox's environment for this command.
    pub env: BTreeMap<String, String>,
    /// After this long the command's whole process group is killed and it exits 124.
    pub timeout_ms: Option<u64>,
    /// Whether the caller will write the command's standard input (else it reads EOF).
    pub stdin: bool,
}

impl ExecRequest {
    /// A shell command line, run by `/bin/sh -c`.
    pub fn shell(command: &str) -> Self {
        Self { argv: vec!["/bin/sh".into(), "-c".into(), command.into()], ..Self::default() }
    }
    pub fn validate(&self) -> Result<(), RuntimeError> {
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(RuntimeError::InvalidArgument(
                "no command given: pass the program to run and its arguments".into(),
            ));
        }
        if self.argv.iter().any(|a| a.contains('\0')) {
            return Err(RuntimeError::InvalidArgument(
                "a command argument contains a NUL byte, which no program can receive".into(),
            ));
        }
        // What the kernel takes (MAX_ARG_STRLEN per string; argv and environment share a few
        // MiB): refused here with a reason instead of an E2BIG from deep inside the sandbox.
        if let Some(long) = self.argv.iter().find(|a| a.len() > crate::spec::MAX_ENV_ENTRY) {
            return Err(RuntimeError::InvalidArgument(format!(
                "a command argument is {} bytes; the kernel passes at most {} bytes per argument: write large scripts to a file and run that",
                long.len(),
                crate::spec::MAX_ENV_ENTRY
            )));
        }
        let total: usize = self.argv.iter().map(|a| a.len() + 1).sum();
        if total > MAX_ARGV_TOTAL || self.argv.len() > MAX_ARGS {
            return Err(RuntimeError::InvalidArgument(format!(
                "the command line is {total} bytes in {} arguments; at most {MAX_ARGV_TOTAL} bytes and {MAX_ARGS} arguments are accepted: pass long lists through a file or stdin",
                self.argv.len()
            )));
        }
        if self.timeout_ms == Some(0) {
            return Err(RuntimeError::InvalidArgument(
                "a command timeout must be positive; leave it unset for none".into(),
            ));
        }
        crate::spec::validate_env(&self.env).map_err(RuntimeError::from)
    }
}

/// The most bytes a command line may take (its arguments and their terminators).
pub const MAX_ARGV_TOTAL: usize = 1 << 20;
/// The most arguments in one command line.
pub const MAX_ARGS: usize = 32 << 10;

/// Bytes coming out of a sandbox (a command's output, a file's contents).
pub type ByteReader = Box<dyn AsyncRead + Send + Unpin>;
/// Bytes going into a sandbox (a command's input).
pub type ByteWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// A two-way byte stream, such as a connection to a port inside a sandbox.
pub trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Duplex for T {}

/// A command started in a sandbox: its standard streams and its control.
///
/// Output must be read (or the streams dropped) for the command to make progress: a runtime
/// applies back-pressure instead of buffering. Dropping `stdin` closes the command's input.
pub struct Process {
    /// The command's standard input; `None` when the request asked for none (it reads EOF).
    pub stdin: Option<ByteWriter>,
    pub stdout: ByteReader,
    pub stderr: ByteReader,
    pub control: Box<dyn Execution>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process").field("pid", &self.control.pid()).finish_non_exhaustive()
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// The exit code; `128 + n` when killed by signal `n`; 124 after a timeout; 127 when the
    /// program was not found; 126 when it could not be executed.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// The sandbox ran out of memory while the command ran.
    pub oom_killed: bool,
}

/// The control of a command started in a sandbox.
#[async_trait::async_trait]
pub trait Execution: Send {
    /// The command's process id inside the sandbox, when the runtime knows it.
    fn pid(&self) -> Option<u32>;
    /// Sends a signal to the command's process group.
    async fn signal(&mut self, signal: i32) -> Result<(), RuntimeError>;
    /// Waits for the command to end.
    async fn wait(&mut self) -> Result<ExecOutcome, RuntimeError>;
}

/// A file operation without contents, with every path resolved inside the sandbox's own view.
/// Contents move with `Runtime::read_file` and `Runtime::write_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileOp {
    List {
        path: String,
    },
    Stat {
        path: String,
    },
    Mkdir {
        path: String,
        mode: Option<u32>,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    Move {
        from: String,
        to: String,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    /// Gives a file of the sandbox user to another owner (`nobody`, any id but root's), or
    /// back; `None` leaves that id as it is.
    Chown {
        path: String,
        user: Option<FileOwner>,
        group: Option<FileOwner>,
    },
}

/// The most entries one directory listing returns: a runtime stops reading a larger directory
/// and fails the listing (`InvalidArgument`) instead of holding all of it in memory.
pub const MAX_LISTED_ENTRIES: usize = 100_000;

/// Who a file may belong to through the file API. Root does not exist inside a sandbox (it is
/// never mapped), and giving a file to another owner gives no process any power: no process of
/// a sandbox runs as anyone but the sandbox user, nor can become anyone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileOwner {
    /// The sandbox's own user (or group).
    SandboxUser,
    /// `nobody` (`nogroup`), uid and gid 65534 inside.
    Nobody,
    /// Another id inside the sandbox, 1..=[`FileOwner::MAX_ID`] (`www-data` is 33); the
    /// sandbox's own id and 65534 mean the two owners above.
    Id(u32),
}

impl FileOwner {
    /// The biggest id a file can be given inside a sandbox: `nobody`'s.
    pub const MAX_ID: u32 = 65534;

    /// Why `id` cannot own a file in a sandbox, if it cannot.
    pub fn refusal(id: u32) -> Option<String> {
        match id {
            0 => Some("root (id 0) does not exist inside a sandbox and cannot own its files".into()),
            id if id > Self::MAX_ID => {
                Some(format!("id {id} does not exist inside a sandbox: only ids 1 to {} do", Self::MAX_ID))
            }
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub modified_unix_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum FileReply {
    Done,
    Stat(FileStat),
    List { entries: Vec<FileStat> },
}

/// One address a sandbox must not reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationTarget {
    /// What it is, for the report ("Kubernetes API (Service IP)").
    pub name: String,
    pub host: String,
    /// 0: a port the gate itself listens on, on the machine it runs on (for the local
    /// runtime's host addresses).
    pub port: u16,
    /// `tcp`: no connection may be made (targets are things that listen);
    /// `dns`: a DNS query over UDP must get no answer.
    pub kind: TargetKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    Tcp,
    Dns,
}

/// The targets a runtime found, and what it could not look up (and why).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationTargets {
    pub targets: Vec<IsolationTarget>,
    pub skipped: Vec<NotChecked>,
}

/// Something the gate should have probed but whose address could not be found. The gate
/// fails on it unless the user skips it by `name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotChecked {
    /// Stable, for `paddock gate --skip NAME`: "cluster DNS", "Kubernetes API Service".
    pub name: String,
    /// What went wrong looking it up.
    pub reason: String,
}

impl NotChecked {
    pub fn new(name: &str, reason: impl Into<String>) -> Self {
        Self { name: name.into(), reason: reason.into() }
    }
}

/// A setting of one sandbox that the runtime reads from outside it and the sandbox cannot see
/// from inside (on Kubernetes its Pod's spec: no Secret as a variable or a volume, no
/// privilege escalation), judged for `paddock gate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingCheck {
    /// Stable, for `paddock gate --skip NAME`.
    pub name: String,
    pub passed: bool,
    /// What was found, in words; on a failure, what to change.
    pub detail: String,
}

impl SettingCheck {
    pub fn new(name: &str, passed: bool, detail: impl Into<String>) -> Self {
        Self { name: name.into(), passed, detail: detail.into() }
    }
}

/// Why a runtime call failed. `code()` is stable and becomes the API error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("invalid sandbox spec: {0}")]
    InvalidSpec(#[from] SpecError),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A file operation failed inside the sandbox (missing file, read-only path, ...).
    #[error("{message}")]
    File { kind: FileErrorKind, message: String },
    /// The sandbox cannot serve requests (its supervisor is gone, or it is paused).
    #[error("{0}")]
    Unavailable(String),
    /// This runtime cannot do what was asked (pause on Kubernetes, an image kind it cannot
    /// run); the message says what it supports instead. See `Runtime::capabilities`.
    #[error("{0}")]
    Unsupported(String),
    /// A limit of the host or the cluster was reached (disk, descriptors, processes, quota);
    /// trying later or freeing resources may help.
    #[error("{0}")]
    Exhausted(String),
    /// The runtime did not finish in time; the message says what was waited for.
    #[error("{0}")]
    Timeout(String),
    /// A service the runtime depends on failed it (an image registry that cannot be reached
    /// or sent a corrupt blob); trying later or another mirror may help.
    #[error("{0}")]
    Upstream(String),
    /// The host or the cluster could not do what was asked; the message says what failed.
    #[error("{0}")]
    System(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileErrorKind {
    NotFound,
    PermissionDenied,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    InvalidPath,
    /// The file did not fit: its filesystem is full, or it would take more of the sandbox's
    /// memory than is left (a filesystem kept in memory).
    NoSpace,
    Other,
}

impl RuntimeError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidArgument(_) | Self::InvalidSpec(_) => "INVALID_ARGUMENT",
            Self::NotFound(_) => "NOT_FOUND",
            Self::Conflict(_) => "CONFLICT",
            Self::File { kind: FileErrorKind::NotFound, .. } => "FILE_NOT_FOUND",
            Self::File { kind: FileErrorKind::PermissionDenied, .. } => "PERMISSION_DENIED",
            Self::File { kind: FileErrorKind::NoSpace, .. } => "NO_SPACE",
            Self::File { .. } => "FILE_ERROR",
            Self::Unavailable(_) => "UNAVAILABLE",
            Self::Upstream(_) => "UPSTREAM_ERROR",
            Self::Unsupported(_) => "NOT_SUPPORTED",
            Self::Exhausted(_) => "RESOURCE_EXHAUSTED",
            Self::Timeout(_) => "TIMEOUT",
            Self::System(_) => "INTERNAL",
        }
    }

    /// Classifies a host I/O error: running out of disk, memory, descriptors or processes is
    /// `Exhausted`, a timeout is `Timeout`, anything else `System`. `context` says what failed.
    pub fn from_io(context: impl std::fmt::Display, e: &std::io::Error) -> Self {
        let message = format!("{context}: {e}");
        match e.kind() {
            std::io::ErrorKind::TimedOut if e.raw_os_error().is_none() => Self::Timeout(message),
            std::io::ErrorKind::StorageFull if e.raw_os_error().is_none() => Self::Exhausted(message),
            _ => Self::from_errno(e.raw_os_error(), message),
        }
    }

    /// Classifies a failed system call by its errno, as [`RuntimeError::from_io`] does;
    /// `message` says what failed. No errno: `System`.
    pub fn from_errno(errno: Option<i32>, message: String) -> Self {
        // ENOSPC, EDQUOT, EMFILE, ENFILE, ENOMEM, EAGAIN (fork, clone: the pid limit), on Linux.
        const EXHAUSTED: [i32; 6] = [28, 122, 24, 23, 12, 11];
        const ETIMEDOUT: i32 = 110;
        match errno {
            Some(n) if EXHAUSTED.contains(&n) => Self::Exhausted(message),
            Some(ETIMEDOUT) => Self::Timeout(message),
            _ => Self::System(message),
        }
    }
}

/// Why a runtime without an egress enforcer has no credential vault.
pub const VAULT_UNSUPPORTED: &str = "this runtime has no egress enforcer of Paddock's to add credentials to a sandbox's requests (a NetworkPolicy only allows or drops connections): use the local runtime for the credential vault";

/// What a sandbox's network policy may say on a runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkFeature {
    /// Loopback only.
    Deny,
    /// Everything but the addresses no sandbox may reach.
    AllowAll,
    /// Rules naming IP addresses and CIDR ranges.
    IpRules,
    /// Rules naming hosts and `*.`-wildcards.
    DomainRules,
    /// Rules scoped to TCP destination ports (`ports`); a runtime that can only allow (a
    /// NetworkPolicy) refuses a deny rule with ports at create.
    PortRules,
    /// A running sandbox's policy can be changed.
    Change,
}

/// A kind of volume a sandbox may mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeKind {
    /// A host directory under the operator's allowed roots.
    Host,
    /// A volume the runtime keeps until it is deleted.
    Named,
}

/// What a runtime can do, so callers (the server, tests, clients through the API) ask instead
/// of assuming.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The runtime's name: `local`, `kubernetes`.
    pub runtime: String,
    /// Pause and resume keep a sandbox's processes and memory.
    pub pause: bool,
    /// Workspaces outlive their sandboxes (acquire, release, destroy by thread id).
    pub persistent_workspaces: bool,
    /// Commands may run as a uid/gid other than the sandbox user's.
    pub run_as_other_user: bool,
    /// Image references this runtime accepts, in words (shown in errors and `/v1/capabilities`).
    pub images: String,
    /// What a sandbox's network policy may say.
    pub network: Vec<NetworkFeature>,
    /// CPU and memory use can be read (`Runtime::metrics`).
    pub metrics: bool,
    /// Volume kinds a sandbox may mount. Empty: none.
    #[serde(default)]
    pub volumes: Vec<VolumeKind>,
    /// A sandbox can be given a way home to the server's gateway (`SandboxSpec::gateway`),
    /// which runs need.
    #[serde(default)]
    pub gateway: bool,
    /// The gateway can tell which sandbox a connection comes from (the local runtime's
    /// forwarder names it). Without it only a run's token names the caller, so sandboxes
    /// that are not a run's get no model route.
    #[serde(default)]
    pub gateway_names_sandbox: bool,
    /// Without `gateway`: why, and what would give one (the runtime's own words, for the
    /// refusal of a run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_gateway_because: Option<String>,
    /// The size a sandbox's workspace gets when neither its request nor the server names one
    /// (the Kubernetes runtime's `--workspace-pvc-size`).
    #[serde(default)]
    pub default_workspace_bytes: Option<u64>,
    /// A sandbox's egress may carry a credential vault (`Runtime::set_vault`), and a sandbox
    /// may be made with the credential proxy (`SandboxSpec::credential_proxy`).
    #[serde(default)]
    pub credential_vault: bool,
    /// The boundary around each sandbox, in one word (`crate::requires::ISOLATIONS`):
    /// `namespaces` (Linux namespaces and seccomp, or a container runtime's), `gvisor`, `kata`,
    /// `firecracker`.
    #[serde(default)]
    pub isolation: String,
    /// Host devices a sandbox may be given (e.g. `/dev/kvm`). Empty: none.
    #[serde(default)]
    pub devices: Vec<String>,
    /// A sandbox may run containers of its own (new namespaces and mounts inside it).
    #[serde(default)]
    pub nested_containers: bool,
}

/// A sandbox's resource use at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxMetrics {
    /// CPU time used since the sandbox started, nanoseconds (all its processes).
    pub cpu_used_ns: Option<u64>,
    /// Memory charged to the sandbox now, bytes.
    pub memory_used_bytes: Option<u64>,
    /// What its egress enforcer counted, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressCounters>,
    /// When this was measured, Unix milliseconds.
    pub at_unix_ms: u64,
}

/// A place to run sandboxes. The local runtime implements it with namespaces on this machine;
/// the Kubernetes runtime with Pods.
///
/// Every method validates what it is given and answers in the runtime's own words: the caller
/// never needs to know which runtime it talks to.
#[async_trait::async_trait]
pub trait Runtime: Send + Sync {
    /// What this runtime supports.
    fn capabilities(&self) -> Capabilities;
    /// What a sandbox of this runtime must never reach (the API server, the node, metadata,
    /// the outside world…), for `paddock gate` to try from inside one. A target it cannot
    /// discover is left out and named in `skipped`.
    async fn isolation_targets(&self) -> Result<IsolationTargets, RuntimeError> {
        Ok(IsolationTargets::default())
    }
    /// The settings of sandbox `id` that only the runtime can see (its Pod's spec on
    /// Kubernetes), each judged, for `paddock gate`; none where the gate's probes from
    /// inside the sandbox see everything there is.
    async fn sandbox_settings(&self, id: &SandboxId) -> Result<Vec<SettingCheck>, RuntimeError> {
        let _ = id;
        Ok(Vec::new())
    }
    /// `paddock check`: whether sandboxes can run here, item by item (permissions, the
    /// runtime's prerequisites, a sandbox started and proven confined). `probe` allows the
    /// slower proofs that start throwaway workloads (NetworkPolicy enforcement on Kubernetes).
    async fn check(&self, probe: bool) -> Result<crate::preflight::Report, RuntimeError> {
        let _ = probe;
        let mut report = crate::preflight::Report { namespace: "-".into(), ..Default::default() };
        report.push("preflight", crate::preflight::CheckStatus::Warn, "this runtime has no checks of its own");
        Ok(report)
    }
    /// A cheap check that the runtime can create and reach sandboxes now (its disk has room,
    /// its API server answers), for `/health`. The caller bounds how long it may take.
    async fn health(&self) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// Creates a sandbox; the runtime resolves `spec.image` (and refuses what it cannot run).
    /// The spec was validated by the caller (`SandboxSpec::validated`) and is not again.
    async fn create(&self, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError>;
    async fn get(&self, id: &SandboxId) -> Result<SandboxInfo, RuntimeError>;
    async fn list(&self) -> Result<Vec<SandboxInfo>, RuntimeError>;
    /// Starts a command; its output streams back through the returned `Process`.
    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process, RuntimeError>;
    /// Creates a sandbox and starts a command in it, as `create` then `exec` do; a runtime may
    /// start the command sooner by asking for both at once. The outer error is the create's;
    /// once the sandbox exists it is returned with the exec's result, so the caller can
    /// remove it whatever became of the command.
    async fn create_and_exec(
        &self,
        spec: ValidatedSpec,
        request: ExecRequest,
    ) -> Result<(SandboxInfo, Result<Process, RuntimeError>), RuntimeError> {
        let info = self.create(spec).await?;
        let process = self.exec(&info.id, request).await;
        Ok((info, process))
    }
    /// Runs a file operation that moves no contents.
    async fn file(&self, id: &SandboxId, op: FileOp) -> Result<FileReply, RuntimeError>;
    /// Opens a regular file for reading; errors opening it (missing, a directory, no
    /// permission) are returned here, not from the stream.
    async fn read_file(&self, id: &SandboxId, path: &str) -> Result<ByteReader, RuntimeError>;
    /// Replaces a regular file with `data`, creating its parents; returns once every byte is
    /// stored. `mode` applies when given (else 0644 for a new file).
    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        mode: Option<u32>,
        data: ByteReader,
    ) -> Result<(), RuntimeError>;
    /// A connection to `port` on the sandbox's own loopback, for routing traffic to a server
    /// running in the sandbox.
    async fn connect(&self, id: &SandboxId, port: u16) -> Result<Box<dyn Duplex>, RuntimeError>;
    /// The sandbox's CPU and memory use now.
    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics, RuntimeError>;
    /// The sandbox's egress policy as enforced now, with its counters and newest denials.
    async fn egress(&self, id: &SandboxId) -> Result<EgressStatus, RuntimeError> {
        self.get(id).await?;
        Err(RuntimeError::Unsupported("this runtime cannot report a sandbox's egress".into()))
    }
    /// Replaces a running sandbox's egress policy; new connections and DNS queries follow it
    /// at once. A policy the runtime cannot enforce is refused (`Unsupported`), never applied
    /// in part.
    async fn set_egress(&self, id: &SandboxId, policy: ValidatedPolicy) -> Result<EgressStatus, RuntimeError> {
        let _ = policy;
        self.get(id).await?;
        Err(RuntimeError::Unsupported("this runtime cannot change a running sandbox's egress policy".into()))
    }
    /// The sandbox's credential vault, values included (callers show only
    /// `Vault::state`); `None` when it has none.
    async fn vault(&self, id: &SandboxId) -> Result<Option<crate::vault::Vault>, RuntimeError> {
        self.get(id).await?;
        Err(RuntimeError::Unsupported(VAULT_UNSUPPORTED.into()))
    }
    /// Puts a vault in force (`None` removes it); answers once the sandbox's egress follows
    /// it. The caller has checked it against the sandbox's policy.
    async fn set_vault(&self, id: &SandboxId, vault: Option<crate::vault::Vault>) -> Result<(), RuntimeError> {
        let _ = vault;
        self.get(id).await?;
        Err(RuntimeError::Unsupported(VAULT_UNSUPPORTED.into()))
    }
    /// The named volumes this runtime keeps.
    async fn volumes(&self) -> Result<Vec<crate::volume::NamedVolume>, RuntimeError> {
        Err(RuntimeError::Unsupported("this runtime keeps no named volumes".into()))
    }
    /// Deletes a named volume and its files; refused while a sandbox mounts it.
    async fn delete_volume(&self, name: &str) -> Result<(), RuntimeError> {
        let _ = name;
        Err(RuntimeError::Unsupported("this runtime keeps no named volumes".into()))
    }
    /// Freezes every process of the sandbox in place, keeping its memory.
    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError>;
    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError>;
    /// Moves the sandbox's expiry to `ttl` from now.
    async fn renew(&self, id: &SandboxId, ttl: Duration) -> Result<SandboxInfo, RuntimeError>;
    /// Kills every process and removes the sandbox; its persistent workspace, if any, is kept.
    async fn destroy(&self, id: &SandboxId) -> Result<(), RuntimeError>;

    /// Returns the live sandbox of this thread's workspace, or creates one (the workspace too,
    /// on first use). Concurrent acquires of one thread yield one sandbox.
    async fn acquire(&self, thread: &ThreadId, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError>;
    /// Stops the thread's sandbox and keeps its workspace.
    async fn release(&self, thread: &ThreadId) -> Result<(), RuntimeError>;
    /// Stops the thread's sandbox and deletes its workspace.
    async fn destroy_workspace(&self, thread: &ThreadId) -> Result<(), RuntimeError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_are_checked() {
        assert_eq!(SandboxId::from_random([0, 1, 2, 3, 4, 0xff]).as_str(), "sbx-0001020304ff");
        for bad in ["", "../x", "SBX", "a b", "-x", &"a".repeat(65)] {
            assert!(SandboxId::parse(bad).is_err(), "{bad:?}");
        }
        SandboxId::parse("sbx-0001020304ff").unwrap();
    }

    #[test]
    fn exec_requests_are_checked() {
        assert!(ExecRequest::default().validate().is_err());
        assert!(ExecRequest { argv: vec!["a\0".into()], ..Default::default() }.validate().is_err());
        ExecRequest::shell("echo hi").validate().unwrap();
    }

    #[test]
    fn command_lines_the_kernel_would_refuse_are_refused_first() {
        let big =
            ExecRequest { argv: vec!["echo".into(), "x".repeat(crate::spec::MAX_ENV_ENTRY + 1)], ..Default::default() };
        assert!(matches!(big.validate(), Err(RuntimeError::InvalidArgument(m)) if m.contains("per argument")));
        let many = ExecRequest { argv: vec!["x".repeat(100_000); 11], ..Default::default() };
        assert!(matches!(many.validate(), Err(RuntimeError::InvalidArgument(m)) if m.contains("command line")));
        let fine =
            ExecRequest { argv: vec!["echo".into(), "x".repeat(crate::spec::MAX_ENV_ENTRY)], ..Default::default() };
        assert!(fine.validate().is_ok());
    }

    #[test]
    fn io_errors_are_classified() {
        let full = std::io::Error::from_raw_os_error(28);
        assert!(
            matches!(RuntimeError::from_io("writing", &full), RuntimeError::Exhausted(m) if m.starts_with("writing: "))
        );
        let fds = std::io::Error::from_raw_os_error(24);
        assert_eq!(RuntimeError::from_io("x", &fds).code(), "RESOURCE_EXHAUSTED");
        let perm = std::io::Error::from_raw_os_error(1);
        assert_eq!(RuntimeError::from_io("x", &perm).code(), "INTERNAL");
        assert_eq!(RuntimeError::Unsupported("x".into()).code(), "NOT_SUPPORTED");
        // A clone that hits the pid limit, a mount with no memory: the host is full, not broken.
        assert_eq!(RuntimeError::from_errno(Some(11), "clone: EAGAIN".into()).code(), "RESOURCE_EXHAUSTED");
        assert_eq!(RuntimeError::from_errno(Some(12), "mount: ENOMEM".into()).code(), "RESOURCE_EXHAUSTED");
        assert_eq!(RuntimeError::from_errno(Some(110), "x".into()).code(), "TIMEOUT");
        assert_eq!(RuntimeError::from_errno(None, "x".into()).code(), "INTERNAL");
        let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "slow");
        assert_eq!(RuntimeError::from_io("x", &timed_out).code(), "TIMEOUT");
    }

    #[test]
    fn error_codes_are_stable() {
        let e = RuntimeError::File { kind: FileErrorKind::NotFound, message: "x".into() };
        assert_eq!(e.code(), "FILE_NOT_FOUND");
        assert_eq!(RuntimeError::NotFound("x".into()).code(), "NOT_FOUND");
    }
}
