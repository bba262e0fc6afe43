//! The per-sandbox supervisor: a single-threaded process (our own binary, re-executed) that
//! creates the sandbox's cgroups and skeleton, clones the sandbox's init into new namespaces,
//! and then serves the sandbox's socket until the sandbox is destroyed or expires.
//!
//! It outlives the process that started it. If it dies, the kernel kills the sandbox's init
//! (parent-death signal) and with it every process of the sandbox; the record stays behind and
//! the sandbox is reported failed, with its workspace kept.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use paddock_core::naming::resource_name;
use paddock_core::runtime::{RuntimeError, SandboxId, SandboxInfo, SandboxMetrics, SandboxState, WorkspaceInfo};
use paddock_core::spec::{SandboxSpec, ValidatedSpec, command_env};

use crate::identity::{self, HostIds};
use crate::image::RootSource;
use paddock_sys::cgroup::{CgroupLayout, Limits, SandboxCgroup};
use paddock_sys::fdpass;
use paddock_sys::mounts::{RootPlan, Workspace};
use paddock_sys::overlay::{LayeredRoot, PendingUserns};
use paddock_sys::process::{self as sp, Forked};
use rustix::event::{PollFd, PollFlags};
use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketFlags, SocketType};
use rustix::process::{Pid, PidfdFlags, WaitOptions};

use crate::init::{ChildSetup, child_main};
use crate::layout::DataDir;
use crate::protocol::{self, ImageRoot, InitRequest, Ready, Record, Reply, Request, WireError};
use paddock_core::units::unix_ms as now_ms;

/// A sandbox's cgroups while it starts: the ones made before its init is cloned, and what
/// making the rest takes.
struct Cgroups<'a> {
    made: SandboxCgroup,
    layout: &'a CgroupLayout,
    limits: Limits,
}

/// The cgroup under which every sandbox's cgroup is created.
pub const CGROUP_PARENT: &str = "paddock";

/// Connections waiting to send their request, at most.
const MAX_PENDING: usize = 128;
/// How long a connection may wait before sending its request.
const PENDING_TIMEOUT: Duration = Duration::from_secs(10);

/// Entry point of `paddock __supervise`: reads the spec from stdin, reports readiness as one
/// JSON line on stdout, then serves until the sandbox ends. Returns the process exit code.
///
/// `first` (a launched supervisor's, [`crate::LocalRuntime::create_and_exec`]) is a client's
/// connection whose request waits in it already: served as soon as the sandbox is ready, as
/// if accepted then, so the request does not wait for the readiness to reach the client and
/// a connection to come back.
pub fn main(data_dir: &Path, id: &SandboxId, mut first: Option<OwnedFd>) -> i32 {
    // The starter passed stdio only (`inherit_only_stdio`); this also covers a supervisor
    // started by hand, so its commands never receive a descriptor of its starter.
    if let Err(e) = sp::cloexec_inherited_fds() {
        eprintln!("{e}");
        return 1;
    }
    // First of all, so that a listing never retires the directory this makes (see
    // `remains::retire_half_made`).
    let starting = DataDir::new(data_dir).sandbox(id).join(crate::remains::STARTING);
    let written = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&starting)
        .and_then(|mut f| f.write_all(std::process::id().to_string().as_bytes()));
    if let Err(e) = written {
        eprintln!("writing {}: {e}", starting.display());
    }
    let mut input = String::new();
    let started = std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| RuntimeError::System(format!("reading the sandbox spec: {e}")))
        .and_then(|_| {
            serde_json::from_str::<protocol::Start>(&input).map_err(|e| RuntimeError::InvalidArgument(e.to_string()))
        })
        // The spec is checked here, where it crosses into the supervisor: what the client
        // added to the caller's validated spec (the image's environment, say) included.
        .and_then(|start| Ok((start.spec.validated()?, start.image)))
        .and_then(|(spec, image)| Supervisor::start(DataDir::new(data_dir), id.clone(), spec, image, &mut first));
    let mut out = std::io::stdout();
    match started {
        Ok(mut sup) => {
            let line = protocol::encode(&Ready::Ready { record: Box::new(sup.record.clone()) });
            let _ = out.write_all(&line).and_then(|_| out.write_all(b"\n")).and_then(|_| out.flush());
            if let Ok(log) = fs::OpenOptions::new().create(true).append(true).mode(0o600).open(sup.dd.log(id)) {
                let null = File::open("/dev/null");
                if let Ok(null) = null {
                    let _ = sp::redirect_stdio(&null, &log);
                }
            }
            sup.serve(first)
        }
        Err(e) => {
            let line = protocol::encode(&Ready::Failed { error: WireError::from(&e) });
            let _ = out.write_all(&line).and_then(|_| out.write_all(b"\n"));
            1
        }
    }
}

struct Supervisor {
    dd: DataDir,
    id: SandboxId,
    record: Record,
    cgroup: SandboxCgroup,
    init_pid: u32,
    init_pidfd: OwnedFd,
    control: OwnedFd,
    listener: OwnedFd,
    signals: OwnedFd,
    expires: Option<Instant>,
    /// The root is an image from the store, whose lease ends with the sandbox.
    image_root: bool,
    /// The sandbox's mount namespace, held so that unmounting its view (the kernel does it
    /// when the last holder goes) follows a destroy's answer instead of preceding the init's
    /// exit. Only for a view no later sandbox could mount again (no workspace image, volume
    /// or image root): a filesystem image must be unmounted before its workspace is handed on.
    mount_ns: Option<OwnedFd>,
}

/// A failed system call as the caller should see it: out of processes, memory, descriptors
/// or disk is `Exhausted` (try again later), not an internal error.
fn sys(context: &str) -> impl Fn(paddock_sys::SysError) -> RuntimeError + '_ {
    move |e| RuntimeError::from_errno(e.errno(), format!("{context}: {e}"))
}

/// Open files per process in a sandbox (soft, hard): what build tools and language servers
/// expect, far below what could strain the host's file table.
pub const SANDBOX_NOFILE: (u64, u64) = (4096, 16384);

impl Supervisor {
    /// `first` is a client's connection, kept out of the sandbox's init.
    fn start(
        dd: DataDir,
        id: SandboxId,
        spec: ValidatedSpec,
        image: Option<ImageRoot>,
        first: &mut Option<OwnedFd>,
    ) -> Result<Self, RuntimeError> {
        let spec = spec.into_inner();
        // A session of its own first, also for the child below: a terminal's Ctrl-C or hang-up
        // is for the command that started the sandbox.
        let _ = rustix::process::setsid();
        // The namespace that maps the image's ids is made while the rest is set up.
        let image = image
            .map(|i| PendingUserns::start().map(|u| (i, u)))
            .transpose()
            .map_err(sys("a user namespace for the image root"))?;
        // The sandbox's own descriptor limit, whatever its starter had (a server raises its
        // own to the hard limit): every process of the sandbox inherits it from here.
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit { current: Some(SANDBOX_NOFILE.0), maximum: Some(SANDBOX_NOFILE.1) },
        )
        .map_err(|e| RuntimeError::System(format!("setting the sandbox's descriptor limit: {e}")))?;
        let layout = CgroupLayout::detect().map_err(sys("reading the cgroup layout"))?;
        let limits = Limits {
            memory_bytes: spec.resources.memory_bytes,
            pids: spec.resources.pids,
            millicpus: Some(spec.resources.millicpus),
        };
        let cgroup = layout
            .create_before_clone(CGROUP_PARENT, id.as_str(), &limits)
            .map_err(sys("creating the sandbox cgroup"))?;
        let name = id.as_str().to_owned();
        match Self::start_in_cgroup(dd, id, spec, image, Cgroups { made: cgroup, layout: &layout, limits }, first) {
            Ok(s) => Ok(s),
            Err(e) => {
                // Whatever of the sandbox's cgroups exists by now: the v1 ones are made after
                // the clone.
                let made = layout.existing(CGROUP_PARENT, &name);
                let _ = made.kill_all(Duration::from_secs(2));
                let _ = made.remove(Duration::from_secs(1));
                Err(e)
            }
        }
    }

    /// Picks the host identity (the workspace's, or a fresh one given back on failure), then
    /// starts the sandbox as it.
    fn start_in_cgroup(
        dd: DataDir,
        id: SandboxId,
        spec: SandboxSpec,
        image: Option<(ImageRoot, PendingUserns)>,
        cgroup: Cgroups<'_>,
        first: &mut Option<OwnedFd>,
    ) -> Result<Self, RuntimeError> {
        let ids = match &spec.workspace {
            Some(w) => identity::of_workspace(&dd, &resource_name(&w.thread, w.naming), &spec.user, false)?,
            None => identity::allocate(&dd, id.as_str())?,
        };
        let scratch = spec.workspace.is_none();
        let started = Self::start_as(dd.clone(), id, spec, image, cgroup, ids, first);
        if started.is_err() && scratch {
            identity::release(&dd, &ids);
        }
        started
    }

    fn start_as(
        dd: DataDir,
        id: SandboxId,
        spec: SandboxSpec,
        image: Option<(ImageRoot, PendingUserns)>,
        cgroups: Cgroups<'_>,
        ids: HostIds,
        first: &mut Option<OwnedFd>,
    ) -> Result<Self, RuntimeError> {
        let mut cgroup = cgroups.made;
        // Only root and the sandbox's own group may pass: other host users never reach its
        // files, even ones it made world-readable or set-id.
        let own_dir = dd.sandbox(&id);
        chown(&own_dir, None, Some(ids.gid)).map_err(|e| io(&own_dir, e))?;
        fs::set_permissions(&own_dir, fs::Permissions::from_mode(0o710)).map_err(|e| io(&own_dir, e))?;
        // Opened (named ones made and mounted) in the host's mount namespace, before anything
        // below leaves it.
        let opened_volumes = crate::volumes::open_all(&dd, &id, &spec)?;
        let mut private_mounts = false;
        let (workspace_mount, workspace) = match &spec.workspace {
            Some(w) => {
                let name = resource_name(&w.thread, w.naming);
                let image = dd.workspace_image(&name);
                let dir = if image.is_file() {
                    let at = dd.workspace_mount(&id);
                    crate::wsimage::mount_private(&image, &at)?;
                    private_mounts = true;
                    at
                } else {
                    dd.workspace_files(&name)
                };
                if !dir.is_dir() {
                    return Err(RuntimeError::NotFound(format!(
                        "workspace {name} has no files at {}: acquire the workspace instead of creating the sandbox directly",
                        dir.display()
                    )));
                }
                (Workspace::Bind(dir), Some(WorkspaceInfo { thread: w.thread.clone(), name }))
            }
            // A scratch workspace is a tmpfs, not an ext4 image like a persistent one: making and
            // loop-mounting an image costs more than the whole rest of a cold start, and a
            // scratch workspace needs no life beyond the sandbox. Its pages are charged to the
            // sandbox's memory cgroup, so its cap is at most the memory limit: past that, a
            // write would meet the OOM killer instead of a clean ENOSPC, and `df` would promise
            // space that is not there.
            None => match spec.resources.workspace_bytes {
                Some(bytes) => (
                    Workspace::Tmpfs {
                        bytes: bytes.min(spec.resources.memory_bytes),
                        inodes: spec.resources.workspace_inodes,
                        uid: spec.user.uid,
                        gid: spec.user.gid,
                    },
                    None,
                ),
                None => {
                    let dir = dd.scratch_workspace(&id);
                    fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
                    chown(&dir, Some(ids.uid), Some(ids.gid)).map_err(|e| io(&dir, e))?;
                    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(|e| io(&dir, e))?;
                    (Workspace::Bind(dir), None)
                }
            },
        };
        // Every Paddock data directory on the host, this instance's included even if the
        // registry cannot be read.
        let data_dirs = crate::registry::all_data_dirs(dd.root());
        let writable_root = image.is_some();
        let source = match (image, crate::image::resolve(spec.image.as_deref())?) {
            (Some((image, userns)), _) => {
                paddock_sys::process::unshare_mount_namespace()
                    .map_err(sys("a private mount namespace for the image root"))?;
                private_mounts = true;
                let root = LayeredRoot {
                    layers: image.layers,
                    owner: image.owner,
                    host: (ids.uid, ids.gid),
                    others: (identity::OTHERS, identity::OTHERS),
                    upper_bytes: spec.resources.memory_bytes,
                    // One inode per page of the cap at most: plenty for package installs.
                    upper_inodes: (spec.resources.memory_bytes / 4096).max(16384),
                };
                let at = dd.image_mounts(&id);
                paddock_sys::mounts::mount_scratch(&at).map_err(sys("mounting the image root"))?;
                root.mount(&at, userns).map_err(sys("mounting the image root"))?
            }
            (None, RootSource::Reference(r)) => {
                return Err(RuntimeError::InvalidArgument(format!(
                    "image {r} reached the supervisor without its layers: create sandboxes through the runtime"
                )));
            }
            (None, RootSource::Host) => PathBuf::from("/"),
            (None, RootSource::Dir(path)) => {
                let real = fs::canonicalize(&path).ok().filter(|p| p.is_dir()).ok_or_else(|| {
                    RuntimeError::InvalidArgument(format!(
                        "rootfs {} is not a directory: pass the path of an unpacked root filesystem",
                        path.display()
                    ))
                })?;
                // Sandboxes write into data directories (workspaces): a root filesystem there
                // could be rearranged by one sandbox under the next, and masking the data
                // directory would hide the whole root.
                if let Some(data) = data_dirs.iter().find(|d| real.starts_with(d)) {
                    return Err(RuntimeError::InvalidArgument(format!(
                        "rootfs {} is inside Paddock's data directory {}: unpack images elsewhere",
                        path.display(),
                        data.display()
                    )));
                }
                real
            }
        };
        let masks = crate::registry::masks_within(&source, &data_dirs);
        let (shadowed, extra) = crate::volumes::plan_targets(&spec.volumes, &source)?;
        let volumes = if opened_volumes.is_empty() {
            Vec::new()
        } else {
            if !private_mounts {
                paddock_sys::process::unshare_mount_namespace()
                    .map_err(sys("a private mount namespace for the volumes"))?;
                private_mounts = true;
            }
            crate::volumes::stage(&dd, &id, &spec.volumes, opened_volumes, (ids.uid, ids.gid))?
        };
        if private_mounts {
            crate::volumes::forget_host_mounts(&dd);
        }
        let skeleton = if extra.is_empty() {
            paddock_sys::mounts::shared_skeleton(&dd.skeletons(), &source)
        } else {
            paddock_sys::mounts::own_skeleton(&dd.sandbox(&id).join("skeleton"), &source, &extra)
        }
        .map_err(sys("preparing the sandbox root"))?;
        // The credential proxy's CA, and the root's trust store with it, in /run/paddock.
        let ca = spec.credential_proxy.then(|| fs::read(crate::vault::ca_cert_file(&dd, &id)));
        let run_files = match ca {
            Some(Ok(ca)) => vec![
                (PathBuf::from("paddock/ca.pem"), ca.clone()),
                (PathBuf::from("paddock/ca-bundle.pem"), crate::vault::bundle(&source, &ca)),
            ],
            // Its variables name these files: a sandbox without them would fail every TLS call.
            Some(Err(e)) => return Err(RuntimeError::from_io("reading the sandbox's credential-proxy CA", &e)),
            None => Vec::new(),
        };
        let plan = RootPlan {
            skeleton,
            source,
            workspace: workspace_mount,
            masks,
            tmp_bytes: spec.resources.tmp_bytes,
            shm_bytes: spec.resources.tmp_bytes.min(64 << 20),
            writable_root,
            volumes,
            shadowed,
            run_files,
        };
        let seccomp = paddock_sys::fence::compile_seccomp();
        let (control, init_control) =
            fdpass::seqpacket_pair().map_err(|e| RuntimeError::System(format!("socketpair: {e}")))?;
        let (go_r, go_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        let (uid, gid) = (spec.user.uid, spec.user.gid);

        let host = (ids.uid, ids.gid);
        // The init joins its cgroups without the host-wide migration lock: created straight
        // into the cgroup2 one, and moving itself into the v1 ones (see `join_v1`), which are
        // made while it builds its filesystem.
        let cgroup2 = cgroup.unified_dir().transpose().map_err(sys("opening the sandbox cgroup"))?;
        // The new user namespace is owned by the sandbox's host identity, not by root.
        let forked = match sp::clone_into_new_namespaces_owned_by(host.0, host.1, cgroup2.as_ref().map(|d| d.as_fd())) {
            Err(e) if cgroup2.is_some() && sp::clone_into_cgroup_unsupported(&e) => {
                sp::clone_into_new_namespaces_owned_by(host.0, host.1, None).map(|f| (f, false))
            }
            other => other.map(|f| (f, cgroup2.is_some())),
        };
        let (forked, in_cgroup2) = forked.map_err(sys("creating the sandbox namespaces"))?;
        let init_pid = match forked {
            Forked::Child => {
                // The client's connection reaches the init as every request does, forwarded.
                drop((control, go_w, status_r, cgroup2, first.take()));
                child_main(ChildSetup {
                    go: go_r,
                    status: status_w,
                    control: init_control,
                    plan,
                    seccomp,
                    uid,
                    gid,
                    hostname: id.to_string(),
                })
            }
            Forked::Parent(pid) => pid,
        };
        drop((init_control, go_r, status_w, cgroup2));
        rustix::io::ioctl_fionbio(&control, true).map_err(|e| RuntimeError::System(format!("control socket: {e}")))?;
        let init_pidfd = rustix::process::pidfd_open(
            Pid::from_raw(init_pid.cast_signed()).expect("clone returned a pid"),
            PidfdFlags::empty(),
        )
        .map_err(|e| RuntimeError::System(format!("pidfd_open: {e}")))?;
        let setup = (|| {
            paddock_sys::ids::write_id_maps_with_others(
                init_pid,
                (uid, gid),
                host,
                (identity::OTHERS, identity::OTHERS),
            )
            .map_err(sys("writing the user namespace id maps"))?;
            if !in_cgroup2 {
                cgroup.add_process_unified(init_pid).map_err(sys("moving the sandbox into its cgroup"))?;
            }
            File::from(go_w).write_all(b"g").map_err(|e| RuntimeError::System(format!("starting the sandbox: {e}")))?;
            cgroups
                .layout
                .add_v1(&mut cgroup, CGROUP_PARENT, id.as_str(), &cgroups.limits)
                .map_err(sys("creating the sandbox cgroup"))?;
            let v1_tasks = cgroup.v1_task_files().map_err(sys("opening the sandbox cgroup"))?;
            let oom_counter = cgroup.oom_counter_path().and_then(|p| File::open(p).ok());
            let oom_score =
                std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{init_pid}/oom_score_adj")).ok();
            let sent = crate::init::send_cgroups(&control, &v1_tasks, oom_counter.as_ref(), oom_score.as_ref());
            if sent.is_err() {
                // An init still waiting for this message would never report: end it, then read
                // what it reported before (its own failure is the usual cause of a failed send).
                let _ = rustix::process::pidfd_send_signal(&init_pidfd, rustix::process::Signal::KILL);
            }
            let mut report = String::new();
            let _ = File::from(status_r).read_to_string(&mut report);
            match (report.as_str(), sent) {
                ("ok\n", Ok(())) => Ok(()),
                ("" | "ok\n", Err(e)) => Err(RuntimeError::System(format!("passing the sandbox its cgroups: {e}"))),
                ("", Ok(())) => {
                    Err(RuntimeError::System("sandbox setup failed: the sandbox init exited during setup".into()))
                }
                (why, _) => Err(RuntimeError::System(format!("sandbox setup failed: {why}"))),
            }
        })();
        if let Err(e) = setup {
            // It may have failed before joining its cgroups.
            let _ = rustix::process::pidfd_send_signal(&init_pidfd, rustix::process::Signal::KILL);
            let _ = cgroup.kill_all(Duration::from_secs(2));
            let _ = rustix::process::waitpid(Pid::from_raw(init_pid.cast_signed()), WaitOptions::empty());
            return Err(e);
        }

        let mount_ns =
            if private_mounts { None } else { File::open(format!("/proc/{init_pid}/ns/mnt")).ok().map(OwnedFd::from) };
        let listener = listen(&dd.socket(&id))?;
        let signals = sp::signal_fd(&[rustix::process::Signal::TERM.as_raw(), rustix::process::Signal::INT.as_raw()])
            .map_err(sys("signalfd"))?;
        let created = now_ms();
        let expires = spec.timeout_secs.map(|t| Instant::now() + Duration::from_secs(t));
        let info = SandboxInfo {
            id: id.clone(),
            state: SandboxState::Running,
            expires_unix_ms: spec.timeout_secs.map(|t| created + t * 1000),
            created_unix_ms: created,
            spec,
            workspace,
            failure: None,
            addresses: Vec::new(),
        };
        let record = Record { info, supervisor_pid: std::process::id(), init_pid, host_ids: Some(ids) };
        write_record(&dd, &record)?;
        Ok(Self {
            dd,
            id,
            record,
            cgroup,
            init_pid,
            init_pidfd,
            control,
            listener,
            signals,
            expires,
            image_root: writable_root,
            mount_ns,
        })
    }

    fn serve(&mut self, first: Option<OwnedFd>) -> i32 {
        // Connections accepted but not yet asked anything; a client that never asks is dropped.
        let mut pending: Vec<(OwnedFd, Instant)> = first.map(|c| (c, Instant::now())).into_iter().collect();
        loop {
            let now = Instant::now();
            pending.retain(|(_, at)| now.duration_since(*at) < PENDING_TIMEOUT);
            let timeout = self.expires.map(|e| e.saturating_duration_since(now));
            let timeout = match pending.iter().map(|(_, at)| *at + PENDING_TIMEOUT - now).min() {
                Some(p) => Some(timeout.map_or(p, |t| t.min(p))),
                None => timeout,
            };
            if self.expires.is_some_and(|e| e <= now) {
                self.teardown();
                self.release_image();
                return 0;
            }
            let (init_gone, signalled, accept, ready) = {
                let mut fds = vec![
                    PollFd::new(&self.init_pidfd, PollFlags::IN),
                    PollFd::new(&self.signals, PollFlags::IN),
                    PollFd::new(&self.listener, PollFlags::IN),
                ];
                fds.extend(pending.iter().map(|(c, _)| PollFd::new(c, PollFlags::IN)));
                let ts = timeout.map(|d| rustix::time::Timespec::try_from(d).unwrap_or_default());
                if let Err(e) = rustix::event::poll(&mut fds, ts.as_ref())
                    && e != rustix::io::Errno::INTR
                {
                    eprintln!("poll failed: {e}");
                    return 1;
                }
                let ready: Vec<usize> =
                    fds[3..].iter().enumerate().filter(|(_, f)| !f.revents().is_empty()).map(|(i, _)| i).collect();
                let r = |i: usize| !fds[i].revents().is_empty();
                (r(0), r(1), r(2), ready)
            };
            if init_gone {
                self.init_died();
                return 1;
            }
            if signalled {
                self.teardown();
                self.release_image();
                return 0;
            }
            if accept {
                loop {
                    match rustix::net::accept_with(&self.listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK) {
                        Ok(conn) if pending.len() < MAX_PENDING => pending.push((conn, Instant::now())),
                        Ok(_) => {} // Over the limit: closed at once, the client sees a hang-up.
                        // Out of descriptors: the listener stays readable, so pause instead of spinning.
                        Err(rustix::io::Errno::MFILE | rustix::io::Errno::NFILE) => {
                            std::thread::sleep(Duration::from_millis(20));
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
            for i in ready.into_iter().rev() {
                let (conn, _) = pending.swap_remove(i);
                if self.handle(conn) {
                    return 0;
                }
            }
        }
    }

    /// Serves one connection's request; true when the sandbox is now destroyed.
    fn handle(&mut self, conn: OwnedFd) -> bool {
        let (body, fds) = match fdpass::recv(&conn, RecvFlags::DONTWAIT) {
            Ok((b, _)) if b.is_empty() => return false,
            Ok(m) => m,
            Err(_) => return false,
        };
        let request: Request = match protocol::decode(&body) {
            Ok(r) => r,
            Err(e) => {
                send(&conn, &Reply::Error { error: WireError::from(&e) });
                return false;
            }
        };
        let paused = || {
            RuntimeError::Unavailable(
                "the sandbox is paused: resume it before running commands or file operations".into(),
            )
        };
        let result = match request {
            Request::Exec { request, has_stdin } => {
                if self.cgroup.is_frozen() {
                    Err(paused())
                } else if let Err(e) = request.validate() {
                    Err(e)
                } else {
                    let env = command_env(&self.record.info.spec.env, &request.env);
                    let default_cwd = self.record.info.spec.working_dir.as_deref().unwrap_or("/workspace");
                    let cwd = request
                        .cwd
                        .as_deref()
                        .map(|c| Path::new("/workspace").join(c))
                        .unwrap_or_else(|| default_cwd.into());
                    let msg = InitRequest::Exec {
                        argv: request.argv,
                        cwd: cwd.to_string_lossy().into_owned(),
                        env,
                        timeout_ms: request.timeout_ms,
                        has_stdin,
                    };
                    return self.forward(conn, &msg, fds);
                }
            }
            Request::File {
                op: protocol::FileCall::Meta(paddock_core::runtime::FileOp::Chown { path, user, group }),
                ..
            } => {
                let h = self.record.host_ids.unwrap_or(HostIds::shared(&self.record.info.spec.user));
                let host = (h.uid, h.gid);
                let inside = (self.record.info.spec.user.uid, self.record.info.spec.user.gid);
                crate::ownership::chown(self.init_pid, crate::ownership::Ids { host, inside }, &path, user, group)
                    .map(|reply| Reply::File { reply })
            }
            Request::File { mut op, has_data } => {
                if self.cgroup.is_frozen() {
                    Err(paused())
                } else {
                    if let protocol::FileCall::Write { room, .. } = &mut op {
                        *room = self.memory_room();
                    }
                    return self.forward(conn, &InitRequest::File { op, has_data }, fds);
                }
            }
            Request::Connect { port } => {
                if self.cgroup.is_frozen() {
                    Err(paused())
                } else {
                    return self.forward(conn, &InitRequest::Connect { port }, fds);
                }
            }
            Request::Info => Ok(Reply::Info { info: Box::new(self.info()) }),
            Request::Network => match self.network_fds() {
                Ok((netns, pidfd)) => {
                    let _ = fdpass::send(&conn, &protocol::encode(&Reply::Network), &[netns.as_fd(), pidfd.as_fd()]);
                    return false;
                }
                Err(e) => Err(e),
            },
            Request::Stats => Ok(Reply::Stats {
                metrics: SandboxMetrics {
                    cpu_used_ns: self.cgroup.cpu_used_ns(),
                    memory_used_bytes: self.cgroup.memory_used(),
                    at_unix_ms: now_ms(),
                    egress: None,
                },
            }),
            Request::Pause => self.cgroup.freeze().map(|()| Reply::Ok).map_err(sys("pausing")),
            Request::Resume => self.cgroup.thaw().map(|()| Reply::Ok).map_err(sys("resuming")),
            Request::Renew { ttl_ms } => {
                self.expires = Instant::now().checked_add(Duration::from_millis(ttl_ms));
                self.record.info.expires_unix_ms = Some(now_ms().saturating_add(ttl_ms));
                write_record(&self.dd, &self.record).map(|()| Reply::Info { info: Box::new(self.info()) })
            }
            Request::Destroy => {
                // A sandbox that hands nothing on to a later one is gone for every caller once
                // retired, so the answer need not wait for the kernel to tear it down.
                let nothing_handed_on =
                    self.record.info.spec.workspace.is_none() && self.record.info.spec.volumes.is_empty();
                match nothing_handed_on.then(|| self.retire()).flatten() {
                    Some(retired) => {
                        send(&conn, &Reply::Ok);
                        self.await_init();
                        // Everything else before the directory goes, so that an empty `gone/`
                        // means no destroyed sandbox's work is still running.
                        drop(self.mount_ns.take());
                        self.release_image();
                        self.remove_remains(&retired.dir);
                    }
                    None => {
                        self.teardown();
                        send(&conn, &Reply::Ok);
                        drop(self.mount_ns.take());
                        // The caller need not wait for the image store's lease bookkeeping,
                        // only for the sandbox to be gone.
                        self.release_image();
                    }
                }
                return true;
            }
        };
        let reply = result.unwrap_or_else(|e| Reply::Error { error: WireError::from(&e) });
        send(&conn, &reply);
        false
    }

    /// What a file kept in memory may still take: the limit less what reclaim cannot free,
    /// less a reserve for the processes that run (an eighth of the limit, at least 16 MiB).
    fn memory_room(&self) -> Option<protocol::MemoryRoom> {
        let (limit, pinned) = self.cgroup.memory_pinned()?;
        let reserve = (limit / 8).max(16 << 20);
        Some(protocol::MemoryRoom { limit, free: limit.saturating_sub(pinned).saturating_sub(reserve) })
    }

    /// Hands a request and its connection to the init, which answers the client directly.
    fn forward(&mut self, conn: OwnedFd, msg: &InitRequest, fds: Vec<OwnedFd>) -> bool {
        let mut all = vec![conn.as_fd()];
        all.extend(fds.iter().map(|f| f.as_fd()));
        // The init answers at once unless it is swamped; never let it stall the supervisor.
        if let Err(e) = fdpass::send_waiting(&self.control, &protocol::encode(msg), &all, Duration::from_secs(5)) {
            let e = RuntimeError::Unavailable(format!("the sandbox init is not accepting requests: {e}"));
            send(&conn, &Reply::Error { error: WireError::from(&e) });
        }
        false
    }

    /// The init's network namespace and a pidfd of the init. The init is this process's
    /// unreaped child, so its pid names it and no other process while the namespace opens.
    fn network_fds(&self) -> Result<(OwnedFd, OwnedFd), RuntimeError> {
        let path = format!("/proc/{}/ns/net", self.init_pid);
        let ns = File::open(&path).map_err(|e| RuntimeError::from_io(format!("opening {path}"), &e))?;
        let pidfd =
            self.init_pidfd.try_clone().map_err(|e| RuntimeError::from_io("duplicating the init's pidfd", &e))?;
        Ok((ns.into(), pidfd))
    }

    fn info(&self) -> SandboxInfo {
        let mut info = self.record.info.clone();
        info.state = if self.cgroup.is_frozen() { SandboxState::Paused } else { SandboxState::Running };
        info
    }

    /// Kills everything, removes the cgroups and the sandbox directory.
    fn teardown(&mut self) {
        let _ = fs::remove_file(self.dd.socket(&self.id));
        if self.signal_init() {
            self.await_init();
        }
        self.remove_remains(&self.dd.sandbox(&self.id));
    }

    /// Ends the sandbox for every caller without waiting for it to die: no socket, its init
    /// killed, its directory moved out of `sandboxes/` (see `remains`). `None` when the
    /// directory cannot move; the sandbox is then torn down as usual.
    fn retire(&mut self) -> Option<crate::remains::Retired> {
        let _ = fs::remove_file(self.dd.socket(&self.id));
        self.signal_init();
        crate::remains::retire(&self.dd, &self.id)
    }

    /// Everything of the sandbox once its init is gone or dying: what is left in its cgroups,
    /// the cgroups, its mounts, its directory `dir` and then its scratch identity.
    fn remove_remains(&self, dir: &Path) {
        if let Err(e) = self.cgroup.kill_all(Duration::from_secs(10)) {
            eprintln!("killing the sandbox: {e}");
        }
        let _ = rustix::process::waitpid(Pid::from_raw(self.init_pid.cast_signed()), WaitOptions::empty());
        if let Err(e) = self.cgroup.remove(Duration::from_secs(5)) {
            eprintln!("removing the sandbox cgroup: {e}");
        }
        crate::wsimage::unmount(&self.dd.workspace_mount(&self.id));
        paddock_sys::mounts::unmount_scratch(&crate::layout::image_mounts_in(dir));
        crate::volumes::unstage(&self.dd, &self.id, &self.record.info.spec);
        if fs::remove_dir_all(dir).is_ok() {
            release_scratch_identity(&self.dd, &self.record);
        }
    }

    /// Ends the sandbox's lease on its image, once it no longer uses it.
    fn release_image(&self) {
        if self.image_root {
            crate::image::release(&self.dd, &self.id);
        }
    }

    /// Kills the init; false when it could not be signalled (it is gone already).
    fn signal_init(&self) -> bool {
        // A frozen process dies only once thawed.
        if self.cgroup.is_frozen() {
            let _ = self.cgroup.thaw();
        }
        rustix::process::pidfd_send_signal(&self.init_pidfd, rustix::process::Signal::KILL).is_ok()
    }

    /// Waits, without polling, until the killed init is gone (10 s at most). It is PID 1 of
    /// the sandbox's pid namespace, and the kernel reaps every other process of a namespace
    /// before its init's exit is reported, so the cgroup is empty by then and the cgroup's own
    /// kill loop (still run, for anything unexpected) finds nothing left instead of sleeping.
    fn await_init(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut fds = [PollFd::new(&self.init_pidfd, PollFlags::IN)];
            let ts = rustix::time::Timespec::try_from(left).unwrap_or_default();
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Err(rustix::io::Errno::INTR) => continue,
                _ => return,
            }
        }
    }

    /// The init ended on its own: record the sandbox as failed, keep its workspace.
    fn init_died(&mut self) {
        let status =
            rustix::process::waitpid(Pid::from_raw(self.init_pid.cast_signed()), WaitOptions::NOHANG).ok().flatten();
        let why = match status.map(|(_, s)| s) {
            Some(s) if s.terminating_signal().is_some() => {
                let sig = s.terminating_signal().unwrap_or(0);
                if sig == 9 && self.cgroup.oom_kills() > 0 {
                    "the sandbox init was killed by the out-of-memory killer; give the sandbox more memory".to_owned()
                } else {
                    format!("the sandbox init was killed by signal {sig}")
                }
            }
            Some(s) => format!("the sandbox init exited with status {}", s.exit_status().unwrap_or(-1)),
            None => "the sandbox init is gone".to_owned(),
        };
        let _ = fs::remove_file(self.dd.socket(&self.id));
        let _ = self.cgroup.kill_all(Duration::from_secs(10));
        let _ = self.cgroup.remove(Duration::from_secs(5));
        crate::wsimage::unmount(&self.dd.workspace_mount(&self.id));
        paddock_sys::mounts::unmount_scratch(&self.dd.image_mounts(&self.id));
        crate::volumes::unstage(&self.dd, &self.id, &self.record.info.spec);
        self.record.info.state = SandboxState::Failed;
        self.record.info.failure = Some(why);
        let _ = write_record(&self.dd, &self.record);
    }
}

fn io(path: &Path, e: std::io::Error) -> RuntimeError {
    RuntimeError::from_io(path.display(), &e)
}

fn pipe() -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| RuntimeError::from_io("pipe", &e.into()))
}

fn listen(path: &Path) -> Result<OwnedFd, RuntimeError> {
    let fail = |e: rustix::io::Errno| RuntimeError::System(format!("listening on {}: {e}", path.display()));
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(fail)?;
    let addr = SocketAddrUnix::new(path).map_err(fail)?;
    let _ = fs::remove_file(path);
    rustix::net::bind(&sock, &addr).map_err(fail)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(|e| io(path, e))?;
    rustix::net::listen(&sock, 128).map_err(fail)?;
    Ok(sock)
}

fn send(conn: &OwnedFd, reply: &Reply) {
    let _ = fdpass::send(conn, &protocol::encode(reply), &[]);
}

/// Writes the record atomically, so a reader never sees half of it.
/// Gives back the identity of a sandbox without a persistent workspace; call only once its
/// processes and files are gone.
pub fn release_scratch_identity(dd: &DataDir, record: &Record) {
    if let (None, Some(ids)) = (&record.info.spec.workspace, &record.host_ids) {
        identity::release(dd, ids);
    }
}

pub fn write_record(dd: &DataDir, record: &Record) -> Result<(), RuntimeError> {
    let path = dd.record(&record.info.id);
    let tmp = path.with_extension("json.tmp");
    // 0600: the spec may carry secrets in its environment.
    let mut file = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io(&tmp, e))?;
    file.write_all(&serde_json::to_vec_pretty(record).expect("records serialize")).map_err(|e| io(&tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| io(&path, e))
}
