//! Starting supervisors by fork instead of exec.
//!
//! Each sandbox has a supervisor process. Started as `paddock __supervise`, every one paid an
//! exec of this large binary: the dynamic loader (whose CPU feature probing alone traps to the
//! hypervisor dozens of times on a VM), about 50 000 relocations, the runtime's start; around
//! 1 ms of a create. A launcher forks each supervisor instead, from a process that paid all
//! that once. The supervisor runs the same [`crate::supervisor::main`] over the same
//! stdin/stdout handshake. Without a launcher, or once it is gone, the runtime execs
//! supervisors as before.
//!
//! A launcher never holds anything of the process that uses it, so neither do the supervisors
//! (and the sandbox inits cloned from them): a server execs one (`paddock __launcher`, an
//! empty environment, stdio only); the CLI forks one first thing in `main`
//! ([`Launcher::fork_now`]), while it is single-threaded and holds nothing but stdio, its
//! arguments and its environment, which the launcher then erases from its memory. Each
//! request names the data directory, so the CLI can fork one before it has parsed its
//! arguments. A CLI command creates one sandbox, so its launcher serves one request and
//! becomes that sandbox's supervisor itself, a fork less on the way to the sandbox; a second
//! create in the same process would exec its supervisor.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
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
    process: std::sync::Mutex<Process>,
    state: tokio::sync::Mutex<State>,
    /// It serves one launch by becoming the supervisor (a CLI command's, [`Launcher::fork_now`]).
    once: bool,
}

/// The launcher process, to collect once it has ended.
enum Process {
    Execd(std::process::Child),
    Forked(rustix::process::Pid),
}

enum State {
    /// Not yet registered with the async runtime (it may be started before one exists).
    Unregistered(OwnedFd),
    Ready(AsyncFd<OwnedFd>),
    /// A launcher that served its one launch: the process is that sandbox's supervisor now.
    Supervising,
    Gone,
}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pid = self.process.lock().map(|p| match &*p {
            Process::Execd(c) => c.id(),
            Process::Forked(pid) => pid.as_raw_nonzero().get().cast_unsigned(),
        });
        f.debug_struct("Launcher").field("pid", &pid.unwrap_or_default()).finish_non_exhaustive()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // Collect it if it has ended already, without waiting.
        self.end(false);
    }
}

impl Launcher {
    /// Starts `exe __launcher` (for [`crate::LocalRuntime::with_launcher`]).
    pub(crate) fn spawn(exe: &Path) -> std::io::Result<Launcher> {
        let (ours, theirs) = fdpass::seqpacket_pair()?;
        let mut command = std::process::Command::new(exe);
        sp::inherit_only_stdio(&mut command);
        let child = command
            .arg("__launcher")
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_clear()
            .spawn()?;
        Ok(Launcher::new(Process::Execd(child), ours))
    }

    /// Forks a launcher from this process now (for `paddock run` and `create`, before the CLI
    /// parses its arguments): cheaper than exec'ing one, or a supervisor. The launcher keeps
    /// stdio only (its socket as stdin, `/dev/null` as stdout and stderr), erases the
    /// arguments and environment it was forked with from its memory, and serves one launch by
    /// becoming that supervisor (a later launch gets `None`, and the runtime execs), or ends
    /// when the returned end is dropped unused. Give it to
    /// [`crate::LocalRuntime::with_forked_launcher`].
    ///
    /// It fails, forking nothing, once the process runs a second thread or holds a descriptor
    /// above stderr (one its starter passed, say): call it first thing in `main`. Supervisors
    /// are then exec'd, as without a launcher.
    pub fn fork_now() -> std::io::Result<Launcher> {
        match sp::fork_with_stdio_only().map_err(std::io::Error::other)? {
            sp::ForkedWithSocket::Child => {
                let clean =
                    sp::forget_args_and_env(b"paddock __launcher").is_ok() && std::env::set_current_dir("/").is_ok();
                sp::exit_now(if clean { serve(true) } else { 1 })
            }
            sp::ForkedWithSocket::Parent { pid, socket } => {
                let pid = rustix::process::Pid::from_raw(pid.cast_signed()).expect("fork returned a pid");
                Ok(Launcher::new(Process::Forked(pid), socket))
            }
        }
    }

    /// Ends the launcher and waits until it is gone (for one that will not be used).
    pub fn close(mut self) {
        self.end(true);
    }

    /// Closes the socket, which ends the launcher, and collects it: `wait`ing for it, or only
    /// if it has ended already. One that became a supervisor is never waited for here: it
    /// lives as long as its sandbox.
    fn end(&mut self, wait: bool) {
        let supervising = matches!(std::mem::replace(self.state.get_mut(), State::Gone), State::Supervising);
        let wait = wait && !supervising;
        let Ok(process) = self.process.get_mut() else { return };
        match process {
            Process::Execd(child) if wait => {
                let _ = child.wait();
            }
            Process::Execd(child) => {
                let _ = child.try_wait();
            }
            Process::Forked(pid) => {
                let flags =
                    if wait { rustix::process::WaitOptions::empty() } else { rustix::process::WaitOptions::NOHANG };
                let _ = rustix::process::waitpid(Some(*pid), flags);
            }
        }
    }

    fn new(process: Process, socket: OwnedFd) -> Self {
        Launcher {
            // A forked launcher is a CLI command's (`fork_now`), which serves one launch.
            once: matches!(process, Process::Forked(_)),
            process: std::sync::Mutex::new(process),
            state: tokio::sync::Mutex::new(State::Unregistered(socket)),
        }
    }

    /// Starts the supervisor of `id` (of the data directory `data_dir`), its stdin and stdout
    /// being `stdin` and `stdout`; `first` is a connection it serves as if accepted once the
    /// sandbox is ready (see [`crate::supervisor::main`]). `None`
    /// when the launcher was given up before; an error says it could not now (and is given up).
    /// Either way the caller execs a supervisor instead.
    pub(crate) async fn launch(
        &self,
        id: &SandboxId,
        data_dir: &Path,
        stdin: BorrowedFd<'_>,
        stdout: BorrowedFd<'_>,
        first: Option<BorrowedFd<'_>>,
    ) -> Option<Result<(), String>> {
        let mut state = self.state.lock().await;
        if let State::Gone | State::Supervising = &*state {
            return None;
        }
        let result = match tokio::time::timeout(
            LAUNCH_TIMEOUT,
            exchange(&mut state, &request(id, data_dir), stdin, stdout, first),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(format!("the launcher did not answer within {LAUNCH_TIMEOUT:?}")),
        };
        if result.is_err() {
            // Requests and answers may be out of step now: stop using it (dropping the
            // socket ends the launcher).
            *state = State::Gone;
        } else if self.once {
            *state = State::Supervising;
        }
        Some(result)
    }
}

/// A launch request's body: the sandbox id, a NUL, the data directory.
fn request(id: &SandboxId, data_dir: &Path) -> Vec<u8> {
    [id.as_str().as_bytes(), b"\0", data_dir.as_os_str().as_bytes()].concat()
}

/// The sandbox id and data directory of a launch request, when it is one.
fn parse_request(body: &[u8]) -> Option<(SandboxId, &Path)> {
    let nul = body.iter().position(|b| *b == 0)?;
    let id = SandboxId::parse(std::str::from_utf8(&body[..nul]).ok()?).ok()?;
    let data_dir = Path::new(OsStr::from_bytes(&body[nul + 1..]));
    data_dir.is_absolute().then_some((id, data_dir))
}

/// One request and its answer.
async fn exchange(
    state: &mut State,
    request: &[u8],
    stdin: BorrowedFd<'_>,
    stdout: BorrowedFd<'_>,
    first: Option<BorrowedFd<'_>>,
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
        match guard.try_io(|fd| {
            fdpass::send(fd.get_ref(), request, &[stdin, stdout].into_iter().chain(first).collect::<Vec<_>>())
        }) {
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
/// server's supervisors are its launcher's children, as exec'd ones are the server's). Returns
/// the exit code.
pub fn main() -> i32 {
    serve(false)
}

/// The launcher's loop; `once` (a CLI command's launcher) becomes the supervisor of the first
/// sandbox asked for instead of forking it.
fn serve(once: bool) -> i32 {
    if sp::cloexec_inherited_fds().is_err() {
        return 1;
    }
    // A session of its own: the terminal's Ctrl-C, Ctrl-Z or hang-up is for the command that
    // uses the launcher, which ends it by closing the socket.
    let _ = rustix::process::setsid();
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
            // Every child, whatever its process group: `waitpid(None, ..)` is waitpid(0), which
            // collects only this process group's, and each supervisor has a session of its own,
            // so it left one zombie per sandbox until the launcher ended.
            while let Ok(Some(_)) = rustix::process::wait(rustix::process::WaitOptions::NOHANG) {}
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
        let (id, data_dir) = match parse_request(&body) {
            Some(r) if matches!(fds.len(), 2 | 3) => r,
            _ => {
                if answer(
                    sock.as_fd(),
                    b"a launch request is a sandbox id and a data directory with two descriptors (and maybe a first connection)",
                )
                    .is_err()
                {
                    return 1;
                }
                continue;
            }
        };
        if once {
            // Answered first: once the socket is replaced by the supervisor's stdin, the
            // runtime's end reads an end of file, which it would take for a failure.
            if answer(sock.as_fd(), b"ok").is_err() {
                return 1;
            }
            drop(sigchld);
            run_supervisor(data_dir, &id, fds)
        }
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

/// The supervisor, forked (or, `once`, the launcher itself): stdio as `paddock __supervise`
/// gets it (the spec on stdin, in place of the launcher's socket; the readiness on stdout; no
/// stderr), then the supervisor itself, with the first connection if one came along.
fn run_supervisor(data_dir: &Path, id: &SandboxId, mut fds: Vec<OwnedFd>) -> ! {
    let first = if fds.len() > 2 { fds.pop() } else { None };
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
    let code = crate::supervisor::main(data_dir, id, first);
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_carries_the_sandbox_and_its_data_directory_and_nothing_else_passes() {
        let id = SandboxId::parse("sbx-0123456789ab").unwrap();
        let body = request(&id, Path::new("/var/lib/paddock data"));
        assert_eq!(parse_request(&body), Some((id.clone(), Path::new("/var/lib/paddock data"))));
        for bad in [&b"sbx-0123456789ab"[..], b"sbx-0123456789ab\0relative", b"../x\0/d", b"\0/d", b""] {
            assert_eq!(parse_request(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
