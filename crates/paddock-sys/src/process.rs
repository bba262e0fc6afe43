//! Process creation and signals: cloning into new namespaces, forking workers, SIGCHLD as a file
//! descriptor, and bringing up loopback in a fresh network namespace.

use std::os::fd::{FromRawFd, OwnedFd};

use crate::{Result, SysError};

/// Which side of a fork the caller is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The parent, with the child's pid as the parent sees it.
    Parent(u32),
    Child,
}

/// The namespaces every sandbox gets at creation. The cgroup namespace is entered later, once
/// the child sits in its own cgroup, so that its cgroup root is the sandbox's cgroup.
const SANDBOX_NAMESPACES: libc::c_ulong = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as libc::c_ulong;

/// `N` consecutive numeric fields of `/proc/self/stat` from field `first` (numbered as in
/// proc(5), from 1; `first` is 3 or more).
fn self_stat<const N: usize>(first: usize, what: &str) -> Result<[u64; N]> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|e| SysError::path("read", "/proc/self/stat", e))?;
    // The command name (field 2) may hold spaces and parentheses: count from the last `)`,
    // after which field 3 comes.
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().skip(first - 3).take(N).filter_map(|f| f.parse().ok()).collect())
        .unwrap_or_default();
    fields.try_into().map_err(|_| SysError::Other(format!("cannot read {what} from /proc/self/stat: {stat:?}")))
}

/// The number of threads of this process, from `/proc/self/stat`.
pub(crate) fn thread_count() -> Result<u64> {
    self_stat::<1>(20, "the thread count").map(|[n]| n)
}

/// Fails unless the calling process has exactly one thread. Forking a multi-threaded process
/// copies locks other threads may hold (the allocator's, for one) into a child that can never
/// release them; checking first is what makes the forks below sound to call from safe code.
/// No thread can appear between the check and the fork: only this one could start it.
fn ensure_single_threaded(what: &str) -> Result<()> {
    match thread_count()? {
        1 => Ok(()),
        n => Err(SysError::Other(format!(
            "{what} needs a single-threaded process, and this one has {n} threads: call it before any thread or async runtime starts"
        ))),
    }
}

/// Forks the calling process into new user, mount, pid, network, ipc and uts namespaces.
///
/// Fails unless the caller is single-threaded: the child continues on a copy of this thread
/// only.
pub fn clone_into_new_namespaces() -> Result<Forked> {
    ensure_single_threaded("cloning into new namespaces")?;
    let flags = SANDBOX_NAMESPACES | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: a raw clone with a null stack behaves like fork(2): the child gets a copy-on-write
    // image of this process and resumes here. The process was just checked to be
    // single-threaded, so no lock can be held by another thread in the copy.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    match ret {
        -1 => Err(SysError::call("clone into new namespaces", std::io::Error::last_os_error())),
        0 => Ok(Forked::Child),
        // A pid is positive and below 2^22.
        pid => Ok(Forked::Parent(u32::try_from(pid).unwrap_or(u32::MAX))),
    }
}

/// `CLONE_INTO_CGROUP` (Linux 5.7): the child starts in the cgroup2 directory given by fd.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` of clone3(2), up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Like [`clone_into_new_namespaces`], but the child starts in the cgroup2 directory `cgroup`
/// (`CLONE_INTO_CGROUP`): it never has to be migrated there, and a migration costs an RCU grace
/// period (several milliseconds) whenever none ran just before. On an error for which
/// [`clone_into_cgroup_unsupported`] holds, the caller may clone without it and migrate.
pub fn clone_into_new_namespaces_in_cgroup(cgroup: std::os::fd::BorrowedFd<'_>) -> Result<Forked> {
    use std::os::fd::AsRawFd;
    ensure_single_threaded("cloning into new namespaces")?;
    // `c_ulong` is `u64` here but not on every target.
    #[allow(clippy::unnecessary_cast)]
    let args = CloneArgs {
        flags: SANDBOX_NAMESPACES as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: u64::from(cgroup.as_raw_fd().cast_unsigned()),
        ..Default::default()
    };
    // SAFETY: clone3 without CLONE_VM and with no stack (0, size 0) behaves like fork(2): the
    // child gets a copy-on-write image of this process and resumes here on the same stack
    // address. `args` is a valid clone_args of the size passed, read by the kernel only during
    // the call. The process was just checked to be single-threaded, so no lock can be held by
    // another thread in the copy.
    let ret = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    match ret {
        -1 => Err(SysError::call("clone3 into new namespaces and a cgroup", std::io::Error::last_os_error())),
        0 => Ok(Forked::Child),
        // A pid is positive and below 2^22.
        pid => Ok(Forked::Parent(u32::try_from(pid).unwrap_or(u32::MAX))),
    }
}

/// Whether `e`, from [`clone_into_new_namespaces_in_cgroup`], means this kernel cannot create
/// a child in a cgroup (no clone3, or no `CLONE_INTO_CGROUP`).
pub fn clone_into_cgroup_unsupported(e: &SysError) -> bool {
    matches!(e.errno(), Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL))
}

/// Like [`clone_into_new_namespaces`] (or, given a cgroup2 directory, like
/// [`clone_into_new_namespaces_in_cgroup`]), but the new user namespace is owned by host
/// `uid:gid` instead of root: the clone happens with those effective ids (saved ids stay
/// root, and the parent switches back right after). Per-user kernel limits of everything in
/// the sandbox (inotify instances, for one) are then charged to that unprivileged identity,
/// not to root.
///
/// With a cgroup, the filesystem ids stay root during the clone, since the kernel checks with
/// them that the caller may write the cgroup's `cgroup.procs`; the child then holds host
/// filesystem id 0 until it calls [`set_fs_ids`] (which it must do first thing once its id
/// maps are written). Its capabilities are those of its new user namespace only.
///
/// Fails unless the caller is single-threaded and root.
pub fn clone_into_new_namespaces_owned_by(
    uid: u32,
    gid: u32,
    cgroup: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<Forked> {
    use rustix::process::{Gid, Uid};
    use rustix::thread as t;
    let restore = || -> Result<()> {
        t::set_thread_res_uid(None, Uid::ROOT, None).map_err(|e| SysError::call("seteuid back to root", e))?;
        t::set_thread_res_gid(None, Gid::ROOT, None).map_err(|e| SysError::call("setegid back to root", e))
    };
    t::set_thread_res_gid(None, Gid::from_raw(gid), None).map_err(|e| SysError::call("setegid", e))?;
    if let Err(e) = t::set_thread_res_uid(None, Uid::from_raw(uid), None) {
        restore()?;
        return Err(SysError::call("seteuid", e));
    }
    let forked = match cgroup {
        Some(dir) => set_fs_ids(0, 0).and_then(|()| clone_into_new_namespaces_in_cgroup(dir)),
        None => clone_into_new_namespaces(),
    };
    // The child keeps its ids: root does not exist in its namespace to switch back to.
    if !matches!(forked, Ok(Forked::Child)) {
        restore()?;
    }
    forked
}

/// Sets this thread's filesystem uid and gid (as seen in its user namespace), the ids the
/// kernel checks file access with; fails if they did not take.
pub fn set_fs_ids(uid: u32, gid: u32) -> Result<()> {
    // SAFETY: setfsgid/setfsuid only change this thread's credentials and touch no memory of
    // ours; an id that is not allowed leaves them unchanged, which is checked below by asking
    // for the current value with an id that is never valid (-1).
    let (now_gid, now_uid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        let g = libc::syscall(libc::SYS_setfsgid, u32::MAX);
        libc::syscall(libc::SYS_setfsuid, uid);
        (g, libc::syscall(libc::SYS_setfsuid, u32::MAX))
    };
    if now_gid != i64::from(gid) || now_uid != i64::from(uid) {
        return Err(SysError::Other(format!(
            "setting the filesystem ids to {uid}:{gid} failed (they are {now_uid}:{now_gid})"
        )));
    }
    Ok(())
}

/// Plain fork, for the in-sandbox init's short-lived file workers.
///
/// Fails unless the caller is single-threaded.
pub fn fork() -> Result<Forked> {
    ensure_single_threaded("fork")?;
    // SAFETY: fork in a process just checked to be single-threaded is sound; the child only
    // runs code of this process that the parent could also run.
    let ret = unsafe { libc::fork() };
    match ret {
        -1 => Err(SysError::call("fork", std::io::Error::last_os_error())),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid.cast_unsigned())),
    }
}

/// Ends the calling process at once, without unwinding or running destructors: what a forked
/// child must do so it never runs its parent's cleanup twice.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions; it never returns.
    unsafe { libc::_exit(code) }
}

/// Blocks `signals` for this thread and returns a signalfd that becomes readable when one
/// arrives, so a poll loop can handle them (SIGCHLD included) without signal handlers.
pub fn signal_fd(signals: &[i32]) -> Result<OwnedFd> {
    let set = block_signals(signals)?;
    // SAFETY: -1 asks for a new signalfd; `set` is initialised.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(SysError::call("signalfd", std::io::Error::last_os_error()));
    }
    // SAFETY: signalfd returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Blocks `signals` for this thread (again, after [`unblock_all_signals`]: the signals a
/// [`signal_fd`] reads must stay blocked to reach it); returns them as a set.
pub fn block_signals(signals: &[i32]) -> Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data; all-zero is a valid (empty) value before sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t; sigaddset only writes into it
    // (and refuses a number that is no signal).
    unsafe {
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
    }
    // SAFETY: `set` is initialised; the old mask is not requested (null).
    if unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        return Err(SysError::call("block signals", std::io::Error::last_os_error()));
    }
    Ok(set)
}

/// Gives every standard signal this process ignores (but SIGPIPE) its default action back: a
/// process started from a shell's background job ignores SIGINT and SIGQUIT, one started by
/// `nohup` SIGHUP, and ignored signals stay ignored through fork and exec, down to every
/// command. SIGPIPE stays as Rust's runtime set it (`std::process::Command` gives it back
/// its default in the child).
pub fn default_ignored_signals() -> Result<()> {
    for signal in 1..32 {
        if [libc::SIGKILL, libc::SIGSTOP, libc::SIGPIPE].contains(&signal) {
            continue;
        }
        // SAFETY: sigaction is plain data; all-zero is a valid value to be filled in.
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: only reads the disposition (no new action) into `current`.
        if unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) } != 0 {
            continue;
        }
        if current.sa_sigaction != libc::SIG_IGN {
            continue;
        }
        // SAFETY: as above; SIG_DFL with no flags and an empty mask installs no handler.
        let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
        default.sa_sigaction = libc::SIG_DFL;
        // SAFETY: `default` is initialised; the old action is not requested (null).
        if unsafe { libc::sigaction(signal, &default, std::ptr::null_mut()) } != 0 {
            return Err(SysError::call("restore a signal's default action", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Unblocks every signal for this thread: what a child forked from a process that blocked
/// some (for a [`signal_fd`]) starts from, as an exec'd one would.
pub fn unblock_all_signals() -> Result<()> {
    // SAFETY: sigset_t is plain data; all-zero is a valid (empty) value before sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t; sigemptyset only writes into it.
    unsafe { libc::sigemptyset(&mut set) };
    // SAFETY: `set` is initialised; the old mask is not requested (null).
    if unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) } != 0 {
        return Err(SysError::call("unblock signals", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Drains pending notifications from a [`signal_fd`] so it stops polling readable.
pub fn drain_signalfd(fd: &OwnedFd) {
    let mut buf = [0u8; 128 * 8];
    while matches!(rustix::io::read(fd, &mut buf), Ok(n) if n > 0) {}
}

/// The flags that bring an interface up; libc types them as int, the request as short.
#[expect(clippy::cast_possible_truncation, reason = "IFF_UP | IFF_RUNNING is 0x41")]
const UP_AND_RUNNING: libc::c_short = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;

/// Sets the `lo` interface of the current network namespace up. A new network namespace starts
/// with `lo` down; this needs CAP_NET_ADMIN over the namespace.
pub fn bring_up_loopback() -> Result<()> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socket_with};
    let sock = socket_with(AddressFamily::INET, SocketType::DGRAM, SocketFlags::CLOEXEC, None)
        .map_err(|e| SysError::call("socket for loopback setup", e))?;
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = (*src).cast_signed();
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into `req`, which is a
    // valid, exclusively borrowed ifreq; the socket is open.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } != 0 {
        return Err(SysError::call("read flags of lo", std::io::Error::last_os_error()));
    }
    // SAFETY: the union member written by SIOCGIFFLAGS is ifru_flags.
    unsafe { req.ifr_ifru.ifru_flags |= UP_AND_RUNNING };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } != 0 {
        return Err(SysError::call("set lo up", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Moves the calling process into a new cgroup namespace rooted at its current cgroup.
pub fn unshare_cgroup_namespace() -> Result<()> {
    // SAFETY: CLONE_NEWCGROUP changes only which cgroup paths this process sees; it does not
    // unshare the file table or memory, which is what makes unshare unsafe in general.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWCGROUP) }
        .map_err(|e| SysError::call("unshare cgroup namespace", e))
}

/// Points stdin, stdout and stderr at `/dev/null`, so a process does not keep its parent's
/// pipes open.
pub fn stdio_to_null() -> Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| SysError::path("open", "/dev/null", e))?;
    redirect_stdio(&null, &null)
}

/// Points stdin at `input` and both stdout and stderr at `output`.
pub fn redirect_stdio(input: impl std::os::fd::AsFd, output: impl std::os::fd::AsFd) -> Result<()> {
    rustix::stdio::dup2_stdin(&input).map_err(|e| SysError::call("dup2 stdin", e))?;
    rustix::stdio::dup2_stdout(&output).map_err(|e| SysError::call("dup2 stdout", e))?;
    rustix::stdio::dup2_stderr(&output).map_err(|e| SysError::call("dup2 stderr", e))
}

/// Makes a child started from `command` inherit stdin, stdout and stderr only: between fork
/// and exec, the child marks every other descriptor close-on-exec. Rust opens everything
/// close-on-exec already; this catches what the starting process itself inherited (from a
/// shell, a service manager) or what a C library opened without the flag.
pub fn inherit_only_stdio(command: &mut std::process::Command) {
    // SAFETY: the hook runs in the forked child between fork and exec. It makes one
    // async-signal-safe system call and allocates nothing, not even on error, and takes no
    // lock. Marking descriptors close-on-exec closes none, so `std`'s exec-error pipe and every
    // descriptor the child still uses before exec keep working.
    unsafe { std::os::unix::process::CommandExt::pre_exec(command, cloexec_above_stderr) };
}

/// Marks every descriptor above stderr close-on-exec, so no descriptor this process inherited
/// reaches a program it later executes. Unlike closing them, this cannot pull a descriptor
/// from under an object that owns it, so it is sound to call at any time.
pub fn cloexec_inherited_fds() -> Result<()> {
    cloexec_above_stderr().map_err(|e| SysError::call("close_range", e))
}

fn cloexec_above_stderr() -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets descriptor flags; it reads and
    // writes no memory of ours and invalidates no descriptor.
    let ret =
        unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as libc::c_uint) };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Gives the calling process a private copy of its mount namespace (all mounts private), so
/// what it mounts next is seen by it and its children only, never by the host.
///
/// Fails unless the caller is single-threaded: another thread would share the filesystem
/// context this changes.
pub fn unshare_mount_namespace() -> Result<()> {
    ensure_single_threaded("unsharing the mount namespace")?;
    // SAFETY: CLONE_NEWNS (which implies CLONE_FS) only changes this process's view of mounts
    // and its filesystem context; the caller was just checked to be single-threaded, so no
    // other thread shares that context (and only this thread could start one).
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
        .map_err(|e| SysError::call("unshare mount namespace", e))?;
    rustix::mount::mount_change(
        "/",
        rustix::mount::MountPropagationFlags::REC | rustix::mount::MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| SysError::call("make mounts private", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forking_a_multi_threaded_process_is_refused_not_attempted() {
        // The test harness runs tests on threads of its own: this process has several.
        let _other = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        assert!(thread_count().unwrap() >= 2);
        let e = fork().unwrap_err();
        assert!(e.to_string().contains("single-threaded"), "{e}");
        let e = clone_into_new_namespaces().unwrap_err();
        assert!(e.to_string().contains("threads"), "{e}");
    }
}

/// Where this process's original argument and environment strings lie in its memory
/// (`arg_start`, `arg_end`, `env_end` of `/proc/self/stat`).
fn arg_and_env_area() -> Result<(usize, usize, usize)> {
    let what = "the argument and environment area";
    // An address that does not fit a usize reads as 0, which the check below refuses.
    match self_stat::<4>(48, what)?.map(|f| usize::try_from(f).unwrap_or(0)) {
        [arg_start, arg_end, env_start, env_end]
            if arg_start < arg_end && arg_end <= env_start && env_start <= env_end =>
        {
            Ok((arg_start, arg_end, env_end))
        }
        fields => Err(SysError::Other(format!("{what} in /proc/self/stat makes no sense: {fields:?}"))),
    }
}

/// Empties the environment, and overwrites the process's original argument and environment
/// strings with `title` and zeros: the originals stay in no process forked later (copies the
/// process made itself are its own to [`wipe`]), `/proc/<pid>/environ` reads only NULs and
/// `/proc/<pid>/cmdline` reads `title` (cut to the length of the original arguments).
/// `std::env::args` reads the title and empty strings afterwards.
///
/// Fails, changing nothing, unless the process is single-threaded: another thread could be
/// reading the environment.
pub fn forget_args_and_env(title: &[u8]) -> Result<()> {
    ensure_single_threaded("erasing the arguments and environment")?;
    let (arg_start, arg_end, env_end) = arg_and_env_area()?;
    // SAFETY: no other thread exists (checked above, and only this one could start one), so
    // nothing reads or writes the environment meanwhile.
    if unsafe { libc::clearenv() } != 0 {
        return Err(SysError::Other("clearenv failed".into()));
    }
    let title = &title[..title.len().min(arg_end - arg_start - 1)];
    // SAFETY: [arg_start, env_end) is the kernel-reported area of this process's own argument
    // and environment strings, on its initial stack: mapped, writable, and owned by no Rust
    // object. The environment no longer points into it (cleared above). Pointers to the
    // argument strings (libc's, `std::env::args`'s) stay valid: every byte of the area stays
    // mapped and its last byte, past the title, is a NUL, so each still reads as a
    // NUL-terminated string, the title or an empty one.
    unsafe {
        std::ptr::write_bytes(arg_start as *mut u8, 0, env_end - arg_start);
        std::ptr::copy_nonoverlapping(title.as_ptr(), arg_start as *mut u8, title.len());
    }
    Ok(())
}

/// The two sides of [`fork_with_stdio_only`].
#[derive(Debug)]
pub enum ForkedWithSocket {
    /// The parent, with the child's pid and its end of the socket pair.
    Parent { pid: u32, socket: OwnedFd },
    /// The child: its stdin is the other end, its stdout and stderr `/dev/null`, and it holds
    /// no other descriptor.
    Child,
}

/// Forks a child that holds nothing but its stdio: stdin is one end of a new `SOCK_SEQPACKET`
/// pair (the parent gets the other), stdout and stderr are `/dev/null`.
///
/// Fails, forking nothing, unless the process is single-threaded and has no descriptor open
/// above stderr: only then is every descriptor the child closes one of this function's own, and
/// the child a copy of a process that holds nothing another could have given it. So it is for
/// the start of `main`, and falls back (an error) when the starter passed more than stdio.
pub fn fork_with_stdio_only() -> Result<ForkedWithSocket> {
    use rustix::fs::{Mode, OFlags};
    ensure_single_threaded("forking a child with stdio only")?;
    {
        let dir =
            rustix::fs::open("/proc/self/fd", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| SysError::call("open /proc/self/fd", e))?;
        let listing = std::os::fd::AsRawFd::as_raw_fd(&dir);
        // `Dir::new` reads through this very descriptor (`read_from` would read a copy).
        let entries = rustix::fs::Dir::new(dir).map_err(|e| SysError::call("read /proc/self/fd", e))?;
        for entry in entries {
            let entry = entry.map_err(|e| SysError::call("read /proc/self/fd", e))?;
            let fd: Option<i32> = entry.file_name().to_str().ok().and_then(|n| n.parse().ok());
            if let Some(fd) = fd.filter(|fd| *fd > 2 && *fd != listing) {
                return Err(SysError::Other(format!("descriptor {fd} is open: the child would inherit it")));
            }
        }
    }
    let (parent_end, child_end) = crate::fdpass::seqpacket_pair().map_err(|e| SysError::call("socketpair", e))?;
    let null = std::fs::File::open("/dev/null").map_err(|e| SysError::path("open", "/dev/null", e))?;
    match fork()? {
        Forked::Child => {
            let stdio = rustix::stdio::dup2_stdin(&child_end)
                .and_then(|()| rustix::stdio::dup2_stdout(&null))
                .and_then(|()| rustix::stdio::dup2_stderr(&null));
            // These three were the only descriptors above stderr (checked before the fork).
            drop((parent_end, child_end, null));
            // An error here must not reach the caller, who would go on as the parent.
            if stdio.is_err() {
                exit_now(1);
            }
            Ok(ForkedWithSocket::Child)
        }
        Forked::Parent(pid) => Ok(ForkedWithSocket::Parent { pid, socket: parent_end }),
    }
}

/// Overwrites each string with zeros before freeing it, so no later fork (which copies the
/// freed heap too) holds it.
pub fn wipe(strings: Vec<std::ffi::OsString>) {
    for s in strings {
        let mut bytes = s.into_encoded_bytes();
        for b in bytes.iter_mut() {
            // SAFETY: `b` is a valid, aligned and exclusive reference to a byte of this vector;
            // a volatile write is not removed as a dead store before the free that follows.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}
