//! The two fences applied to the sandbox's init before it runs anything: a seccomp filter and a
//! Landlock ruleset. Both are inherited by every process the init starts and cannot be lifted.

use std::collections::BTreeMap;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
    path_beneath_rules,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

use crate::{Result, SysError};

/// Syscalls a sandboxed process never needs and that widen the kernel surface or break the
/// boundary: they fail with EPERM.
const DENIED_SYSCALLS: &[i64] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_acct,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_lookup_dcookie,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_vhangup,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_fanotify_init,
    // Reaching into other processes' memory or files (ptrace-like), or comparing their kernel
    // objects, which Docker's default profile also denies without CAP_SYS_PTRACE.
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_process_madvise,
    // NUMA placement: Docker gates these behind CAP_SYS_NICE.
    libc::SYS_mbind,
    libc::SYS_set_mempolicy,
    libc::SYS_move_pages,
    libc::SYS_migrate_pages,
    // Obsolete interfaces nothing current needs.
    libc::SYS_uselib,
    libc::SYS_ustat,
    libc::SYS_sysfs,
    libc::SYS__sysctl,
    libc::SYS_nfsservctl,
    // Memory the kernel removes from its own direct map: a sandbox has nothing to hide from
    // the host, and each such area is unmovable, unreclaimable memory outside the usual
    // accounting, an easy way to pressure the host.
    libc::SYS_memfd_secret,
    // Per-process LDT segments: only 16-bit and Wine-style code needs them, and the LDT code
    // has a history of privilege escalations (e.g. CVE-2015-5157, CVE-2017-17053).
    #[cfg(target_arch = "x86_64")]
    libc::SYS_modify_ldt,
];

/// The `personality` values a sandbox may set; every other value is EPERM. Allowed: the query
/// (0xffffffff changes nothing and returns the current persona, which libc and `uname -m`
/// wrappers use), PER_LINUX (0) and PER_LINUX32 (8, what `linux32`/`setarch i686` sets to
/// report a 32-bit machine). Denied are the flags that weaken the process's own hardening for
/// whatever it execs next: ADDR_NO_RANDOMIZE turns ASLR off, READ_IMPLIES_EXEC makes every
/// readable mapping executable (so injected data runs), and the rest are legacy emulation
/// switches; nothing a sandboxed program needs depends on them.
const ALLOWED_PERSONALITIES: &[u64] = &[0, 8, 0xffff_ffff];

/// Syscalls that set a file's mode, and which argument holds it. A set-uid or set-gid bit is
/// refused (EPERM) on all of them: a file a sandbox makes in a volume or workspace lives on
/// the host, and a set-id file there is a way for whoever can run it to act as its owner.
/// Volumes are mounted nosuid and map no privileged owner, so this is the second wall, and
/// the one that also covers files the sandbox hands out (tarballs of its workspace). Nothing
/// an unprivileged program does needs these bits; `chmod g+s` on a directory is refused too.
const MODE_SETTING: &[(i64, u8)] = &[
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_chmod, 1),
    (libc::SYS_fchmod, 1),
    (libc::SYS_fchmodat, 2),
    (SYS_FCHMODAT2, 2),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_open, 2),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_creat, 1),
    (libc::SYS_openat, 3),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_mknod, 1),
    (libc::SYS_mknodat, 2),
];

/// fchmodat2 (Linux 6.6) has the same number on every architecture Paddock builds for.
const SYS_FCHMODAT2: i64 = 452;

/// Syscalls whose arguments live in memory seccomp cannot read: they fail with ENOSYS, which
/// makes libc fall back to the older call whose arguments the filter checks (clone3 to clone,
/// openat2 to openat).
const OPAQUE_ARGUMENTS: &[i64] = &[libc::SYS_clone3, libc::SYS_openat2];

/// Socket families a sandbox never needs that carry a large, bug-prone kernel surface.
const DENIED_SOCKET_FAMILIES: &[u64] =
    &[libc::AF_ALG as u64, libc::AF_KEY as u64, libc::AF_PACKET as u64, libc::AF_VSOCK as u64];

/// `clone` flags that would create namespaces.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

/// Terminal ioctls that push input into (or hijack) a terminal the sandbox was handed: a
/// sandboxed process given the caller's tty as stdout must not type commands into its shell.
const DENIED_IOCTLS: &[u64] = &[libc::TIOCSTI, libc::TIOCLINUX];

/// The seccomp filters of a sandbox, compiled ahead of the clone so the child only installs them.
pub struct SeccompProgram {
    /// EPERM for the denied syscalls, namespace-creating clones, terminal injection and
    /// personality flags.
    deny: BpfProgram,
    /// ENOSYS for clone3 and openat2 (see [`OPAQUE_ARGUMENTS`]).
    clone3: BpfProgram,
    /// ENOSYS for syscall numbers of other ABIs (x32).
    abi: BpfProgram,
}

fn arch() -> TargetArch {
    #[cfg(target_arch = "x86_64")]
    return TargetArch::x86_64;
    #[cfg(target_arch = "aarch64")]
    return TargetArch::aarch64;
    #[cfg(target_arch = "riscv64")]
    return TargetArch::riscv64;
}

fn seccomp_err(e: impl std::fmt::Display) -> SysError {
    SysError::Other(format!("building the seccomp filter failed: {e}"))
}

/// Compiles the sandbox's seccomp filters.
pub fn compile_seccomp() -> Result<SeccompProgram> {
    let masked = |arg: u8, flag: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag)
            .and_then(|c| SeccompRule::new(vec![c]))
            .map_err(seccomp_err)
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED_SYSCALLS.iter().map(|s| (*s, Vec::new())).collect();
    rules.insert(libc::SYS_clone, NAMESPACE_FLAGS.iter().map(|f| masked(0, *f)).collect::<Result<_>>()?);
    // One rule per value: the syscall matches when its argument equals any of them.
    let any_of = |arg: u8, values: &[u64]| -> Result<Vec<SeccompRule>> {
        values
            .iter()
            .map(|v| {
                SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *v)
                    .and_then(|c| SeccompRule::new(vec![c]))
                    .map_err(seccomp_err)
            })
            .collect()
    };
    rules.insert(libc::SYS_ioctl, any_of(1, DENIED_IOCTLS)?);
    for (nr, arg) in MODE_SETTING {
        let bit = |b: u64| {
            SeccompCondition::new(*arg, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(b), b)
                .and_then(|c| SeccompRule::new(vec![c]))
                .map_err(seccomp_err)
        };
        rules.insert(*nr, vec![bit(libc::S_ISUID as u64)?, bit(libc::S_ISGID as u64)?]);
    }
    rules.insert(libc::SYS_socket, any_of(0, DENIED_SOCKET_FAMILIES)?);
    // One rule whose conditions all hold (the value is none of the allowed ones). The kernel
    // takes the argument as an unsigned int, so the low 32 bits are what counts.
    let not_allowed = ALLOWED_PERSONALITIES
        .iter()
        .map(|v| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *v).map_err(seccomp_err))
        .collect::<Result<Vec<_>>>()?;
    rules.insert(libc::SYS_personality, vec![SeccompRule::new(not_allowed).map_err(seccomp_err)?]);
    let deny = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch())
        .map_err(seccomp_err)?;
    let clone3 = SeccompFilter::new(
        OPAQUE_ARGUMENTS.iter().map(|nr| (*nr, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch(),
    )
    .map_err(seccomp_err)?;
    Ok(SeccompProgram {
        deny: deny.try_into().map_err(seccomp_err)?,
        clone3: clone3.try_into().map_err(seccomp_err)?,
        abi: other_abis(),
    })
}

/// A filter for the syscall numbers the denylist does not cover: on x86_64, x32 numbers (bit
/// 30 set) reach the same kernel functions under other numbers, so every one of them is
/// ENOSYS. seccompiler filters by exact number only, so this one is written out by hand.
fn other_abis() -> BpfProgram {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let stmt = |code, k| sock_filter { code, jt: 0, jf: 0, k };
    if cfg!(target_arch = "x86_64") {
        vec![
            stmt(BPF_LD_W_ABS, 0), // seccomp_data.nr
            sock_filter { code: BPF_JGE_K, jt: 0, jf: 1, k: X32_SYSCALL_BIT },
            stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
            stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
        ]
    } else {
        vec![stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW)]
    }
}

/// Installs the filters on the calling thread (no_new_privs must already be set).
pub fn apply_seccomp(program: &SeccompProgram) -> Result<()> {
    seccompiler::apply_filter(&program.abi).map_err(seccomp_err)?;
    seccompiler::apply_filter(&program.clone3).map_err(seccomp_err)?;
    seccompiler::apply_filter(&program.deny).map_err(seccomp_err)
}

/// Paths of the sandbox's own view that stay writable; everything else is read-only.
#[derive(Debug, Clone)]
pub struct LandlockPolicy {
    pub writable_dirs: Vec<std::path::PathBuf>,
    pub writable_files: Vec<&'static str>,
}

impl Default for LandlockPolicy {
    fn default() -> Self {
        Self {
            writable_dirs: ["/workspace", "/tmp", "/dev/shm", "/dev/pts"].map(Into::into).to_vec(),
            writable_files: vec!["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"],
        }
    }
}

/// Restricts the calling thread (and everything it later starts) with Landlock: read and
/// execute everywhere, write only where the policy says; signals and abstract unix sockets
/// scoped to the sandbox. Fails closed when the kernel enforces no Landlock at all.
pub fn apply_landlock(policy: &LandlockPolicy) -> Result<RulesetStatus> {
    let abi = ABI::V6;
    let ll = |e: landlock::RulesetError| SysError::Other(format!("Landlock: {e}"));
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(ll)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(ll)?
        .create()
        .map_err(ll)?
        .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))
        .map_err(ll)?
        .add_rules(path_beneath_rules(&policy.writable_dirs, AccessFs::from_all(abi)))
        .map_err(ll)?
        .add_rules(path_beneath_rules(&policy.writable_files, AccessFs::from_read(abi) | AccessFs::WriteFile))
        .map_err(ll)?
        .restrict_self()
        .map_err(ll)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(SysError::Other(
            "this kernel enforces no Landlock ruleset: enable Landlock (CONFIG_SECURITY_LANDLOCK and lsm=landlock) to run sandboxes".into(),
        ));
    }
    Ok(status.ruleset)
}

/// Sets no_new_privs: from here on, exec never grants privileges (setuid, file capabilities).
pub fn set_no_new_privs() -> Result<()> {
    rustix::thread::set_no_new_privs(true).map_err(|e| SysError::call("set no_new_privs", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seccomp_filters_compile() {
        let p = compile_seccomp().unwrap();
        assert!(!p.deny.is_empty() && !p.clone3.is_empty() && !p.abi.is_empty());
    }
}
