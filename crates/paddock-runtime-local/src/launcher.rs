//! Starting supervisors by fork instead of exec.
//!
//! Each sandbox has a supervisor process. Started as `paddock __supervise`, every one paid an
//! exec of this large binary: the dynamic loader, about 50 000 relocations, the runtime's
//! start; around 0.9 ms of a 4 ms create here. A launcher (`paddock __launcher`), exec'd once
//! per runtime, forks each supervisor instead, from a process that paid all that once. The
//! supervisor runs the same [`crate::supervisor::main`] over the same stdin/stdout handshake.
//! Without a launcher, or once it is gone, the runtime execs supervisors as before.
//!
//! The launcher is exec'd, not forked from the server, so supervisors (and the sandbox inits
//! cloned from them) never hold a copy of the server's memory, environment or descriptors: it
//! starts with an empty environment, stdio only, and knows nothing but its data directory.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use paddock_core::runtime::SandboxId;
use paddock_sys::fdpass;
use paddock_sys::process::{self as sp, Forked};
use rustix::net::RecvFlags;
use tokio::io::unix::AsyncFd;

/// How long a launch may take before the launcher is taken for stuck and given up.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The runtime's end of a launcher.
pub struct Launcher {
    child: std::sync::Mutex<std::process::Child>,
    state: tokio::sync::Mutex<State>,
}

enum State {
    /// Not yet registered with the async runtime (it may be started before one exists).
    Unregistered(OwnedFd),
    Ready(AsyncFd<OwnedFd>),
    Gone,
}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pid = self.child.lock().map(|c| c.id()).unwrap_or_default();
        f.debug_struct("Launcher").field("pid", &pid).finish_non_exhaustive()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // The socket is closed by now or right after; the launcher exits on that. Collect it if
        // it already has, without waiting.
        if let Ok(child) = self.child.get_mut() {
            let _ = child.try_wait();
        }
    }
}

impl Launcher {
    /// Starts `exe __launcher --data-dir DATA_DIR` (for [`crate::LocalRuntime::with_launcher`]).
    pub(crate) fn spawn(exe: &Path, data_dir: &Path) -> std::io::Result<Launcher> {
        let (ours, theirs) = fdpass::seqpacket_pair()?;
        let mut command = std::process::Command::new(exe);
        sp::inherit_only_stdio(&mut command);
        let child = command
            .arg("__launcher")
            .arg("--data-dir")
            .arg(data_dir)
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_clear()
            .spawn()?;
        Ok(Launcher { child: std::sync::Mutex::new(child), state: tokio::sync::Mutex::new(State::Unregistered(ours)) })
    }

    /// Starts the supervisor of `id`, its stdin and stdout being `stdin` and `stdout`. `None`
    /// when the launcher was given up before; an error says it could not now (and is given up).
    /// Either way the caller execs a supervisor instead.
    pub(crate) async fn launch(
        &self,
        id: &SandboxId,
        stdin: BorrowedFd<'_>,
        stdout: BorrowedFd<'_>,
    ) -> Option<Result<(), String>> {
        let mut state = self.state.lock().await;
        if let State::Gone = &*state {
            return None;
        }
        let result = match tokio::time::timeout(LAUNCH_TIMEOUT, exchange(&mut state, id, stdin, stdout)).await {
            Ok(r) => r,
            Err(_) => Err(format!("the launcher did not answer within {LAUNCH_TIMEOUT:?}")),
        };
        if result.is_err() {
            // Requests and answers may be out of step now: stop using it (dropping the
            // socket ends the launcher).
            *state = State::Gone;
        }
        Some(result)
    }
}

/// One request and its answer.
async fn exchange(
    state: &mut State,
    id: &SandboxId,
    stdin: BorrowedFd<'_>,
    stdout: BorrowedFd<'_>,
) -> Result<(), String> {
    if let State::Unregistered(_) = state {
        let State::Unregistered(fd) = std::mem::replace(state, State::Gone) else { unreachable!() };
        rustix::io::ioctl_fionbio(&fd, true).map_err(|e| format!("making the launcher's socket non-blocking: {e}"))?;
        *state = State::Ready(
            paddock_sys::asyncfd::register(fd).map_err(|e| format!("registering the launcher's socket: {e}"))?,
        );
    }
    let State::Ready(fd) = &*state else { return Err("the launcher is gone".into()) };
    loop {
        let mut guard = fd.writable().await.map_err(|e| e.to_string())?;
        match guard.try_io(|fd| fdpass::send(fd.get_ref(), id.as_str().as_bytes(), &[stdin, stdout])) {
            Ok(r) => break r.map_err(|e| format!("sending to the launcher: {e}"))?,
            Err(_would_block) => continue,
        }
    }
    loop {
        let mut guard = fd.readable().await.map_err(|e| e.to_string())?;
        match guard.try_io(|fd| fdpass::recv(fd.get_ref(), RecvFlags::DONTWAIT)) {
            Ok(Ok((reply, _))) if reply == b"ok" => return Ok(()),
            Ok(Ok((reply, _))) if reply.is_empty() => return Err("the launcher exited".into()),
            Ok(Ok((reply, _))) => return Err(String::from_utf8_lossy(&reply).into_owned()),
            Ok(Err(e)) => return Err(format!("reading the launcher's answer: {e}")),
            Err(_would_block) => continue,
        }
    }
}

/// Entry point of `paddock __launcher`: forks a supervisor for each request on stdin (a
/// `SOCK_SEQPACKET` socket) until the runtime's end closes, and collects them as they end (a
/// server's supervisors are its launcher's children, as exec'd ones are the server's).
/// Returns the exit code.
pub fn main(data_dir: &Path) -> i32 {
    if sp::cloexec_inherited_fds().is_err() {
        return 1;
    }
    let Ok(sigchld) = sp::signal_fd(&[libc_sigchld()]) else { return 1 };
    let sock = std::io::stdin();
    loop {
        let mut fds = [
            rustix::event::PollFd::new(&sock, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(&sigchld, rustix::event::PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return 1,
        }
        let (request, ended) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if ended {
            sp::drain_signalfd(&sigchld);
            while let Ok(Some(_)) = rustix::process::waitpid(None, rustix::process::WaitOptions::NOHANG) {}
        }
        if !request {
            continue;
        }
        let (body, fds) = match fdpass::recv(sock.as_fd(), RecvFlags::DONTWAIT) {
            Ok(m) => m,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock) => continue,
            Err(_) => return 1,
        };
        if body.is_empty() {
            // The runtime's end is closed: nothing more will come. Supervisors running now
            // live on (they are collected by whoever inherits them).
            return 0;
        }
        let id = match std::str::from_utf8(&body).ok().and_then(|s| SandboxId::parse(s).ok()) {
            Some(id) if fds.len() == 2 => id,
            _ => {
                if answer(sock.as_fd(), b"a launch request is a sandbox id with two descriptors").is_err() {
                    return 1;
                }
                continue;
            }
        };
        let answered = match sp::fork() {
            Ok(Forked::Child) => {
                drop(sigchld);
                run_supervisor(data_dir, &id, fds)
            }
            Ok(Forked::Parent(_)) => b"ok".to_vec(),
            Err(e) => format!("the launcher could not fork: {e}").into_bytes(),
        };
        drop(fds);
        if answer(sock.as_fd(), &answered).is_err() {
            return 1;
        }
    }
}

fn libc_sigchld() -> i32 {
    rustix::process::Signal::CHILD.as_raw()
}

fn answer(sock: BorrowedFd<'_>, body: &[u8]) -> std::io::Result<()> {
    fdpass::send(sock, body, &[])
}

/// The forked supervisor: stdio as `paddock __supervise` gets it (the spec on stdin, in place
/// of the launcher's socket; the readiness on stdout; no stderr), then the supervisor itself.
fn run_supervisor(data_dir: &Path, id: &SandboxId, fds: Vec<OwnedFd>) -> ! {
    let Ok(null) = std::fs::File::open("/dev/null") else { sp::exit_now(1) };
    let redirected = rustix::stdio::dup2_stdin(&fds[0])
        .and_then(|()| rustix::stdio::dup2_stdout(&fds[1]))
        .and_then(|()| rustix::stdio::dup2_stderr(null.as_fd()));
    if redirected.is_err() {
        sp::exit_now(1);
    }
    drop(fds);
    drop(null);
    // The launcher blocks SIGCHLD for its signalfd; a supervisor starts from none blocked, as
    // an exec'd one does.
    if sp::unblock_all_signals().is_err() {
        sp::exit_now(1);
    }
    // `ps -o comm` and `top` tell supervisors apart by their sandbox (the command line is the
    // launcher's: changing it needs CAP_SYS_RESOURCE).
    if let Ok(name) = std::ffi::CString::new(id.as_str()) {
        let _ = rustix::thread::set_name(&name);
    }
    let code = crate::supervisor::main(data_dir, id);
    std::process::exit(code)
}
