//! The sandbox's PID 1: the supervisor's clone, which builds the sandbox from the inside, drops
//! every privilege, and then starts commands and file workers on request and reaps every
//! process that ends in the sandbox.
//!
//! It runs as the sandbox user under the same seccomp filter and Landlock ruleset as the
//! commands it starts, so it is no way around either. Signals from inside the sandbox cannot
//! kill it: the kernel drops signals to a namespace's init that it has no handler for.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use paddock_core::runtime::{ExecOutcome, FileReply, RuntimeError};
use paddock_sys::fdpass;
use paddock_sys::fence::{LandlockPolicy, SeccompProgram};
use paddock_sys::mounts::RootPlan;
use paddock_sys::oom_score::SpawnScore;
use paddock_sys::process::{self as sp, Forked};
use rustix::event::{PollFd, PollFlags};
use rustix::net::RecvFlags;
use rustix::process::{Pid, Signal, WaitOptions};

use crate::protocol::{self, Control, InitRequest, Reply, WireError};

/// Everything the child needs, prepared by the supervisor before the clone.
pub struct ChildSetup {
    /// Becomes readable once the supervisor has written the id maps and the cgroup v2
    /// membership; the v1 cgroups follow on `control` (see [`send_cgroups`]).
    pub go: OwnedFd,
    /// Where the child reports `ok` or why setup failed.
    pub status: OwnedFd,
    /// The init's end of the control socket to the supervisor.
    pub control: OwnedFd,
    pub plan: RootPlan,
    pub seccomp: SeccompProgram,
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
}

/// Runs in the cloned child; never returns.
pub fn child_main(setup: ChildSetup) -> ! {
    let ChildSetup { go, status, control, plan, seccomp, uid, gid, hostname } = setup;
    let mut status = File::from(status);
    match build(go, &control, &plan, &seccomp, uid, gid, &hostname) {
        Ok((sigchld, readiness, oom_counter, oom_score)) => {
            let _ = status.write_all(b"ok\n");
            drop(status);
            let code = Init { control, sigchld, readiness, oom_counter, oom_score, running: HashMap::new() }.run();
            sp::exit_now(code)
        }
        Err(message) => {
            let _ = status.write_all(message.as_bytes());
            sp::exit_now(1)
        }
    }
}

/// Hands the sandbox's init the `tasks` files of its v1 cgroups (opened by the supervisor, for
/// [`join_v1`](paddock_sys::cgroup::join_v1)), a read-only handle on its OOM counter, to
/// tell an OOM kill from other kills, and a writable handle on its own `oom_score_adj` (see
/// [`SpawnScore`]; the init cannot open it itself once its credentials changed, which makes it
/// non-dumpable). Sent once, after `go`.
pub fn send_cgroups(
    control: &OwnedFd,
    v1_tasks: &[File],
    oom_counter: Option<&File>,
    oom_score: Option<&File>,
) -> std::io::Result<()> {
    let fds: Vec<_> = v1_tasks.iter().chain(oom_counter).chain(oom_score).map(|f| f.as_fd()).collect();
    let count = u8::try_from(v1_tasks.len()).expect("a handful of cgroup hierarchies");
    fdpass::send(control, &[count, u8::from(oom_counter.is_some()), u8::from(oom_score.is_some())], &fds)
}

/// What [`send_cgroups`] sends.
struct Cgroups {
    v1_tasks: Vec<File>,
    oom_counter: Option<File>,
    oom_score: Option<File>,
}

fn receive_cgroups(control: &OwnedFd) -> Result<Cgroups, String> {
    let (body, fds) = fdpass::recv(control, RecvFlags::empty())
        .map_err(|e| format!("receiving the sandbox cgroups from the supervisor: {e}"))?;
    let [count, has_counter, has_score] = body[..] else {
        return Err("the supervisor went away before passing the sandbox its cgroups".into());
    };
    let mut files: Vec<File> = fds.into_iter().map(File::from).collect();
    let expected = usize::from(count) + usize::from(has_counter) + usize::from(has_score);
    if files.len() != expected {
        return Err(format!("the supervisor passed {} of {expected} descriptors", files.len()));
    }
    let oom_score = if has_score == 1 { files.pop() } else { None };
    let oom_counter = if has_counter == 1 { files.pop() } else { None };
    Ok(Cgroups { v1_tasks: files, oom_counter, oom_score })
}

type Built = (OwnedFd, Option<OwnedFd>, Option<File>, Option<SpawnScore>);

fn build(
    go: OwnedFd,
    control: &OwnedFd,
    plan: &RootPlan,
    seccomp: &SeccompProgram,
    uid: u32,
    gid: u32,
    hostname: &str,
) -> Result<Built, String> {
    // If the supervisor dies, the sandbox must not outlive it unsupervised.
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| format!("set death signal: {e}"))?;
    sp::stdio_to_null().map_err(|e| e.to_string())?;
    // Commands start with every signal's default action, however the sandbox's starter was
    // started (a shell's background job ignores SIGINT and SIGQUIT).
    sp::default_ignored_signals().map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    if !matches!(File::from(go).read(&mut byte), Ok(1)) {
        return Err("the supervisor went away before the sandbox was set up".into());
    }
    // Cloned with the host's filesystem ids (to be created in its cgroup): take the sandbox's
    // own now that they are mapped, before touching any file.
    sp::set_fs_ids(uid, gid).map_err(|e| e.to_string())?;
    // Read from the skeleton before the pivot; the paths are the sandbox's own.
    let mut writable_root_dirs = plan.writable_dirs().map_err(|e| e.to_string())?;
    writable_root_dirs.extend(plan.writable_volumes());
    plan.enter().map_err(|e| format!("building the sandbox filesystem failed: {e}"))?;
    rustix::system::sethostname(hostname.as_bytes()).map_err(|e| format!("sethostname: {e}"))?;
    sp::bring_up_loopback().map_err(|e| e.to_string())?;
    // Made by the supervisor meanwhile; joined before anything of the sandbox's own runs,
    // and before the cgroup namespace is made, so that they are its root.
    let Cgroups { v1_tasks, oom_counter, oom_score } = receive_cgroups(control)?;
    paddock_sys::cgroup::join_v1(&v1_tasks).map_err(|e| format!("joining the sandbox cgroups: {e}"))?;
    // Written with root's credentials: never kept past this point.
    drop(v1_tasks);
    sp::unshare_cgroup_namespace().map_err(|e| e.to_string())?;
    let readiness = readiness_listener();
    // Blocked before anything is forked, so no child's exit is missed.
    let sigchld = sp::signal_fd(&[Signal::CHILD.as_raw()]).map_err(|e| e.to_string())?;
    paddock_sys::ids::drop_to(uid, gid).map_err(|e| format!("dropping privileges failed: {e}"))?;
    // A credential change clears the parent-death signal: set it again for the final identity.
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| format!("set death signal: {e}"))?;
    paddock_sys::fence::set_no_new_privs().map_err(|e| e.to_string())?;
    let oom_score = oom_score.and_then(|f| SpawnScore::from_file(f, i32::MIN));
    let mut landlock = LandlockPolicy::default();
    landlock.writable_dirs.extend(writable_root_dirs.iter().cloned());
    paddock_sys::fence::apply_landlock(&landlock).map_err(|e| e.to_string())?;
    paddock_sys::fence::apply_seccomp(seccomp).map_err(|e| e.to_string())?;
    rustix::process::chdir("/workspace").map_err(|e| format!("chdir /workspace: {e}"))?;
    Ok((sigchld, readiness, oom_counter, oom_score))
}

/// The port the code-interpreter SDK probes (`bash -c 'exec 3<>/dev/tcp/127.0.0.1/44771'`)
/// before it trusts `/code`, which the server answers for every sandbox.
pub const CODE_READINESS_PORT: u16 = 44771;

/// A listener on the sandbox's own `127.0.0.1:44771` that accepts and at once closes every
/// connection, so the SDK's readiness probe succeeds. Non-blocking (the init never waits on
/// it) and close-on-exec (commands do not inherit it). A sandbox without it still works: only
/// the probe fails, so a failure to bind is not fatal.
fn readiness_listener() -> Option<OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrV4, SocketFlags, SocketType};
    let socket = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .ok()?;
    rustix::net::bind(&socket, &SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, CODE_READINESS_PORT)).ok()?;
    rustix::net::listen(&socket, 64).ok()?;
    Some(socket)
}

struct Exec {
    connection: OwnedFd,
    /// False once the client hung up; the command keeps running.
    listening: bool,
    deadline: Option<Instant>,
    timed_out: bool,
    oom_before: u64,
}

struct Init {
    control: OwnedFd,
    sigchld: OwnedFd,
    /// See [`readiness_listener`].
    readiness: Option<OwnedFd>,
    oom_counter: Option<File>,
    /// Commands start at the top OOM score, so a sandbox out of memory loses the init (and
    /// with it the whole sandbox) only when no command's process is left to take.
    oom_score: Option<SpawnScore>,
    running: HashMap<u32, Exec>,
}

impl Init {
    fn run(mut self) -> i32 {
        loop {
            let now = Instant::now();
            let timeout = self
                .running
                .values()
                .filter(|e| !e.timed_out)
                .filter_map(|e| e.deadline)
                .min()
                .map(|d| d.saturating_duration_since(now));
            let listening: Vec<u32> = self.running.iter().filter(|(_, e)| e.listening).map(|(p, _)| *p).collect();
            let (control_ready, sigchld_ready, conns_ready, probe_ready) = {
                let mut fds =
                    vec![PollFd::new(&self.control, PollFlags::IN), PollFd::new(&self.sigchld, PollFlags::IN)];
                fds.extend(listening.iter().map(|p| PollFd::new(&self.running[p].connection, PollFlags::IN)));
                if let Some(l) = &self.readiness {
                    fds.push(PollFd::new(l, PollFlags::IN));
                }
                let ts = timeout
                    .map(|d| rustix::time::Timespec::try_from(d.max(Duration::from_millis(1))).unwrap_or_default());
                match rustix::event::poll(&mut fds, ts.as_ref()) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(_) => return 1,
                }
                let ready = |f: &PollFd<'_>| !f.revents().is_empty();
                let conns: Vec<u32> =
                    listening.iter().zip(&fds[2..]).filter(|(_, f)| ready(f)).map(|(p, _)| *p).collect();
                let probe = self.readiness.is_some() && fds.last().is_some_and(ready);
                (ready(&fds[0]), ready(&fds[1]), conns, probe)
            };
            if probe_ready {
                self.answer_probes();
            }
            if sigchld_ready {
                sp::drain_signalfd(&self.sigchld);
            }
            // Reap on every wake-up: orphans reparented to us end up here too.
            self.reap();
            for pid in conns_ready {
                self.on_client_message(pid);
            }
            self.enforce_deadlines();
            if control_ready && !self.on_control() {
                return 0;
            }
        }
    }

    /// Accepts and closes every pending readiness probe; never blocks.
    fn answer_probes(&mut self) {
        let Some(listener) = &self.readiness else { return };
        for _ in 0..64 {
            match rustix::net::accept_with(listener, rustix::net::SocketFlags::CLOEXEC) {
                Ok(conn) => drop(conn),
                // A prober that gave up before it was accepted.
                Err(rustix::io::Errno::CONNABORTED) => {}
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return,
                // Anything else (out of descriptors, memory) would leave the connection queued
                // and the listener readable: stop listening rather than spin.
                Err(_) => {
                    self.readiness = None;
                    return;
                }
            }
        }
    }

    fn oom_count(&self) -> u64 {
        let Some(file) = &self.oom_counter else { return 0 };
        let mut buf = [0u8; 512];
        let n = file.read_at(&mut buf, 0).unwrap_or(0);
        paddock_sys::cgroup::parse_oom_kills(&String::from_utf8_lossy(&buf[..n]))
    }

    /// Handles one request from the supervisor; false when the supervisor is gone.
    fn on_control(&mut self) -> bool {
        let (body, mut fds) = match fdpass::recv(&self.control, RecvFlags::DONTWAIT) {
            Ok((b, _)) if b.is_empty() => return false,
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        };
        if fds.is_empty() {
            return true;
        }
        let connection = fds.remove(0);
        let request: InitRequest = match protocol::decode(&body) {
            Ok(r) => r,
            Err(e) => {
                reply(&connection, &Reply::Error { error: WireError::from(&e) });
                return true;
            }
        };
        match request {
            InitRequest::Exec { argv, cwd, env, timeout_ms, has_stdin } => {
                self.spawn(connection, fds, has_stdin, argv, cwd, env, timeout_ms)
            }
            InitRequest::File { op, has_data } => {
                let data = if has_data { fds.pop() } else { None };
                self.worker_at_top(connection, move |conn| answer_file(conn, crate::fileops::run(&op, data)));
            }
            // A server in the sandbox can stall a connect for minutes; only a worker waits.
            InitRequest::Connect { port } => worker(connection, move |conn| match connect_loopback(port) {
                Ok(socket) => send(conn, &Reply::Connected, &[socket.as_fd()]),
                Err(e) => send(conn, &Reply::Error { error: WireError::from(&e) }, &[]),
            }),
        }
        true
    }

    /// Forks a worker at the OOM killer's top score, as commands start: a file write that
    /// outgrows the memory limit after all ends the worker, not the init (and the sandbox).
    fn worker_at_top(&mut self, connection: OwnedFd, job: impl FnOnce(&OwnedFd)) {
        match &self.oom_score {
            Some(score) => {
                let ((), kept) = score.spawn_at_top(|| worker(connection, job));
                if !kept {
                    self.oom_score = None;
                }
            }
            None => worker(connection, job),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        &mut self,
        connection: OwnedFd,
        mut fds: Vec<OwnedFd>,
        has_stdin: bool,
        argv: Vec<String>,
        cwd: String,
        env: std::collections::BTreeMap<String, String>,
        timeout_ms: Option<u64>,
    ) {
        let expected = if has_stdin { 3 } else { 2 };
        if fds.len() != expected || argv.is_empty() {
            let e = RuntimeError::InvalidArgument("an exec needs a command, stdout and stderr".into());
            reply(&connection, &Reply::Error { error: WireError::from(&e) });
            return;
        }
        let stderr = fds.pop().expect("length checked");
        let stdout = fds.pop().expect("length checked");
        let stdin = fds.pop();
        let mut stderr_copy = stderr.try_clone().ok().map(File::from);
        let oom_before = self.oom_count();
        let start = |program: &str, stdin: Option<OwnedFd>, stdout: OwnedFd, stderr: OwnedFd| {
            Command::new(program)
                .arg0(&argv[0])
                .args(&argv[1..])
                .env_clear()
                .envs(&env)
                .current_dir(&cwd)
                .process_group(0)
                .stdin(stdin.map(Stdio::from).unwrap_or_else(Stdio::null))
                .stdout(Stdio::from(stdout))
                .stderr(Stdio::from(stderr))
                .spawn()
        };
        // The command inherits this process's signal mask, in which SIGCHLD is blocked for
        // the signalfd: a command started with it blocked never hears of its own children's
        // exits (dash's `wait` sleeps forever). Unblocked for the spawn; an exit it drops
        // meanwhile is reaped below.
        let unblocked = sp::unblock_all_signals().is_ok();
        let spawn = || {
            // A first try at the path found (with copies of the stdio, kept for a second
            // try); where execvp would go on from its failure, the second try is execvp's
            // own search.
            let first = program_path(&argv[0], env.get("PATH")).and_then(|found| {
                match (stdin.as_ref().map(|f| f.try_clone()).transpose(), stdout.try_clone(), stderr.try_clone()) {
                    (Ok(i), Ok(o), Ok(e)) => Some(start(&found, i, o, e)),
                    _ => None,
                }
            });
            match first {
                Some(Err(e)) if execvp_goes_on(&e) => start(&argv[0], stdin, stdout, stderr),
                Some(started) => started,
                None => start(&argv[0], stdin, stdout, stderr),
            }
        };
        let spawned = match &self.oom_score {
            Some(score) => {
                let (spawned, kept) = score.spawn_at_top(spawn);
                if !kept {
                    self.oom_score = None;
                }
                spawned
            }
            None => spawn(),
        };
        if unblocked && sp::block_signals(&[Signal::CHILD.as_raw()]).is_err() {
            // Without SIGCHLD blocked the signalfd stays silent: nothing could be reaped.
            std::process::exit(1);
        }
        match spawned {
            Ok(child) => {
                let pid = child.id();
                // The child is reaped by our waitpid loop, not through `Child`.
                drop(child);
                reply(&connection, &Reply::Started { pid });
                let deadline = timeout_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
                self.running.insert(pid, Exec { connection, listening: true, deadline, timed_out: false, oom_before });
                // Its SIGCHLD may have come while unblocked, and gone.
                self.reap();
            }
            Err(e) => {
                // Like a shell: say why on the command's stderr, exit 127 or 126.
                let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
                let what = if e.kind() == std::io::ErrorKind::NotFound && !std::path::Path::new(&cwd).is_dir() {
                    format!("paddock: cannot run {:?}: working directory {cwd} does not exist\n", argv[0])
                } else {
                    format!("paddock: cannot run {:?}: {e}\n", argv[0])
                };
                if let Some(f) = stderr_copy.as_mut() {
                    let _ = f.write_all(what.as_bytes());
                }
                reply(&connection, &Reply::Started { pid: 0 });
                let outcome = ExecOutcome { exit_code: code, signal: None, timed_out: false, oom_killed: false };
                reply(&connection, &Reply::Exited { outcome });
            }
        }
    }

    fn on_client_message(&mut self, pid: u32) {
        let Some(exec) = self.running.get_mut(&pid) else { return };
        match fdpass::recv(&exec.connection, RecvFlags::DONTWAIT) {
            Ok((body, _)) if !body.is_empty() => {
                if let Ok(Control::Signal { signal }) = protocol::decode(&body)
                    && let (Some(pg), Some(sig)) = (Pid::from_raw(pid.cast_signed()), Signal::from_named_raw(signal))
                {
                    let _ = rustix::process::kill_process_group(pg, sig);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            // Hung up: the command goes on; nobody hears how it ends.
            _ => exec.listening = false,
        }
    }

    fn enforce_deadlines(&mut self) {
        let now = Instant::now();
        for (pid, exec) in self.running.iter_mut() {
            if !exec.timed_out && exec.deadline.is_some_and(|d| d <= now) {
                exec.timed_out = true;
                if let Some(pg) = Pid::from_raw((*pid).cast_signed()) {
                    let _ = rustix::process::kill_process_group(pg, Signal::KILL);
                }
            }
        }
    }

    fn reap(&mut self) {
        while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
            let pid = pid.as_raw_nonzero().get().cast_unsigned();
            let Some(exec) = self.running.remove(&pid) else { continue };
            if exec.timed_out {
                // Whatever the group left behind dies with the command.
                if let Some(pg) = Pid::from_raw(pid.cast_signed()) {
                    let _ = rustix::process::kill_process_group(pg, Signal::KILL);
                }
            }
            let signal = status.terminating_signal();
            let exit_code = if exec.timed_out {
                124
            } else if let Some(s) = signal {
                128 + s
            } else {
                status.exit_status().unwrap_or(1)
            };
            let oom_killed = signal == Some(Signal::KILL.as_raw()) && self.oom_count() > exec.oom_before;
            let outcome = ExecOutcome { exit_code, signal, timed_out: exec.timed_out, oom_killed };
            reply(&exec.connection, &Reply::Exited { outcome });
        }
    }
}

/// Where the command `program` is, looked up in the command's own `PATH` as `execvp` would
/// (the first entry with an executable file of that name); `None` when it names a path, a
/// `PATH` entry is relative, or nothing is found (`Command` then searches, or reports the error).
///
/// Looked up here because `Command` can only start a program it has to find in a `PATH` of
/// the command's own by forking this process, which copies its page tables; with the path
/// known it spawns with `vfork` semantics instead: a few hundred microseconds of every exec.
fn program_path(program: &str, path: Option<&String>) -> Option<String> {
    let path = path.filter(|_| !program.contains('/') && !program.is_empty())?;
    if path.split(':').any(|dir| !dir.starts_with('/')) {
        return None;
    }
    path.split(':').map(|dir| format!("{}/{program}", dir.trim_end_matches('/'))).find(|candidate| {
        rustix::fs::access(candidate.as_str(), rustix::fs::Access::EXEC_OK).is_ok()
            && std::fs::metadata(candidate).is_ok_and(|m| m.is_file())
    })
}

/// Whether execvp goes on from this failure to start a file it found: a script without `#!`
/// (which it hands to /bin/sh), a file it may not run or whose interpreter is missing (it
/// tries the next `PATH` entry).
fn execvp_goes_on(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    e.raw_os_error().is_some_and(|n| [Errno::NOEXEC, Errno::ACCESS, Errno::NOENT].iter().any(|r| r.raw_os_error() == n))
}

/// Connects to a port on the sandbox's own loopback, for the caller to talk to a server the
/// sandbox runs. Connecting to loopback completes (or is refused) at once.
fn connect_loopback(port: u16) -> Result<OwnedFd, RuntimeError> {
    use rustix::net::{AddressFamily, SocketAddrV4, SocketFlags, SocketType};
    let fail = |e: rustix::io::Errno| {
        RuntimeError::Unavailable(format!("nothing accepts connections on port {port} in the sandbox: {e}"))
    };
    let socket =
        rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, SocketFlags::CLOEXEC, None).map_err(fail)?;
    // A listener that never accepts would otherwise hold the connect for minutes.
    rustix::net::sockopt::set_socket_timeout(
        &socket,
        rustix::net::sockopt::Timeout::Send,
        Some(Duration::from_secs(5)),
    )
    .map_err(fail)?;
    rustix::net::connect(&socket, &SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port)).map_err(fail)?;
    Ok(socket)
}

/// Runs `job` in a forked worker, so nothing it waits for (disk, a FIFO, a stalled connect,
/// a slow client) can block the init's loop. The worker is reaped like any other child.
fn worker(connection: OwnedFd, job: impl FnOnce(&OwnedFd)) {
    match sp::fork() {
        Ok(Forked::Child) => {
            job(&connection);
            sp::exit_now(0)
        }
        Ok(Forked::Parent(_)) => {}
        Err(e) => {
            let e = RuntimeError::System(format!("could not start a worker in the sandbox: {e}"));
            reply(&connection, &Reply::Error { error: WireError::from(&e) });
        }
    }
}

/// Listings go out in parts, so no single message outgrows the socket's buffer.
fn answer_file(conn: &OwnedFd, result: Result<FileReply, RuntimeError>) {
    const PART: usize = 256;
    match result {
        Ok(FileReply::List { mut entries }) => {
            while entries.len() > PART {
                let rest = entries.split_off(PART);
                send(conn, &Reply::Entries { entries }, &[]);
                entries = rest;
            }
            send(conn, &Reply::File { reply: FileReply::List { entries } }, &[]);
        }
        Ok(reply) => send(conn, &Reply::File { reply }, &[]),
        Err(e) => send(conn, &Reply::Error { error: WireError::from(&e) }, &[]),
    }
}

/// A worker's answer: it may wait for a slow client, unlike the init.
fn send(conn: &OwnedFd, msg: &Reply, fds: &[std::os::fd::BorrowedFd<'_>]) {
    let _ = fdpass::send_waiting(conn, &protocol::encode(msg), fds, Duration::from_secs(30));
}

fn reply(connection: &OwnedFd, msg: &Reply) {
    // The init never waits on a client: one that is not reading does not hear the answer.
    let _ = fdpass::send(connection.as_fd(), &protocol::encode(msg), &[]);
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::program_path;

    #[test]
    fn a_command_is_found_in_its_own_path_as_execvp_would_or_left_to_command() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        for d in [&a, &b] {
            std::fs::create_dir(d).unwrap();
        }
        let file = |p: std::path::PathBuf, mode: u32| {
            std::fs::write(&p, b"#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        // In `a`: a file without execute permission and a directory, both passed over.
        file(a.join("tool"), 0o644);
        std::fs::create_dir(a.join("dir-tool")).unwrap();
        file(b.join("tool"), 0o755);
        file(b.join("dir-tool"), 0o755);
        let path = format!("/nonexistent:{}/:{}", a.display(), b.display());
        let found = |program: &str, path: &str| program_path(program, Some(&path.to_owned()));
        assert_eq!(found("tool", &path), Some(format!("{}/tool", b.display())));
        assert_eq!(found("dir-tool", &path), Some(format!("{}/dir-tool", b.display())));
        // Left to `Command`: not found, a path already, a relative PATH entry, no PATH.
        assert_eq!(found("missing", &path), None);
        assert_eq!(found("./tool", &path), None);
        assert_eq!(found("tool", &format!("{}:relative", b.display())), None);
        assert_eq!(found("tool", &format!(":{}", b.display())), None);
        assert_eq!(found("", &path), None);
        assert_eq!(program_path("tool", None), None);
    }
}
