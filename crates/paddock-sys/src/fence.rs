//! The two fences applied to the sandbox's init before it runs anything: a seccomp filter and a
//! Landlock ruleset. Both are inherited by every process the init starts and cannot be lifted.

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
    path_beneath_rules,
};
use seccompiler::BpfProgram;

use crate::{Result, SysError};

mod tree;

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
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
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
    // Obsolete interfaces nothing current needs (only x86_64 still has most of them).
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ustat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_sysfs,
    #[cfg(target_arch = "x86_64")]
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
/// switches; nothing a sandboxed program needs depends on them. The kernel takes the argument
/// as an unsigned int, so the low 32 bits are what counts.
const ALLOWED_PERSONALITIES: &[u32] = &[0, 8, 0xffff_ffff];

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

/// The set-uid and set-gid mode bits [`MODE_SETTING`] refuses.
const SET_ID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;

/// fchmodat2 (Linux 6.6) has the same number on every architecture Paddock builds for.
const SYS_FCHMODAT2: i64 = 452;

/// Syscalls whose arguments live in memory seccomp cannot read: they fail with ENOSYS, which
/// makes libc fall back to the older call whose arguments the filter checks (clone3 to clone,
/// openat2 to openat).
const OPAQUE_ARGUMENTS: &[i64] = &[libc::SYS_clone3, libc::SYS_openat2];

/// Socket families a sandbox never needs that carry a large, bug-prone kernel surface.
const DENIED_SOCKET_FAMILIES: &[u32] =
    &[libc::AF_ALG as u32, libc::AF_KEY as u32, libc::AF_PACKET as u32, libc::AF_VSOCK as u32];

/// `clone` flags that would create namespaces (all in the low 32 bits of the flags).
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP
    | 0x80) as u32; // CLONE_NEWTIME

/// Terminal ioctls that push input into (or hijack) a terminal the sandbox was handed: a
/// sandboxed process given the caller's tty as stdout must not type commands into its shell.
/// The kernel compares the request as an unsigned int.
#[expect(clippy::cast_possible_truncation, reason = "ioctl numbers are 32 bits; libc types them wider")]
const DENIED_IOCTLS: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// The seccomp filter of a sandbox, compiled ahead of the clone so the child only installs it.
/// It refuses with EPERM the denied syscalls, namespace-creating clones, set-id modes, terminal
/// injection, bug-prone socket families and personality flags; with ENOSYS clone3 and openat2
/// (see [`OPAQUE_ARGUMENTS`]) and the syscall numbers of other ABIs (x32), which reach the
/// same kernel functions under numbers the rules do not name.
pub struct SeccompProgram {
    filter: BpfProgram,
}

/// Every syscall with a rule, and the rule.
fn rules() -> Vec<(u32, tree::Rule)> {
    use tree::Rule;
    let nr = |n: i64| u32::try_from(n).expect("syscall numbers are small");
    let mut rules: Vec<(u32, Rule)> = DENIED_SYSCALLS.iter().map(|n| (nr(*n), Rule::Deny)).collect();
    rules.extend(OPAQUE_ARGUMENTS.iter().map(|n| (nr(*n), Rule::NoSys)));
    rules.extend(MODE_SETTING.iter().map(|(n, arg)| (nr(*n), Rule::AnyBit { arg: *arg, mask: SET_ID_BITS })));
    rules.extend([
        (nr(libc::SYS_clone), Rule::AnyBit { arg: 0, mask: NAMESPACE_FLAGS }),
        (nr(libc::SYS_ioctl), Rule::OneOf { arg: 1, values: DENIED_IOCTLS }),
        (nr(libc::SYS_socket), Rule::OneOf { arg: 0, values: DENIED_SOCKET_FAMILIES }),
        (nr(libc::SYS_personality), Rule::NoneOf { arg: 0, values: ALLOWED_PERSONALITIES }),
    ]);
    rules
}

/// Compiles the sandbox's seccomp filter.
pub fn compile_seccomp() -> SeccompProgram {
    SeccompProgram { filter: tree::compile(&rules()) }
}

/// Confines a helper process of Paddock's own that sandboxes talk to (the egress enforcer)
/// once it has set itself up: the sandbox's filter plus no program execution (a helper never
/// starts one after setup, so code that took it over cannot either), no_new_privs, and not
/// dumpable, so no process of the same uid can read its memory or attach to it.
pub fn confine_helper() -> Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| SysError::call("make the process non-dumpable", e))?;
    set_no_new_privs()?;
    let nr = |n: i64| u32::try_from(n).expect("syscall numbers are small");
    let mut rules = rules();
    rules.extend([libc::SYS_execve, libc::SYS_execveat].map(|n| (nr(n), tree::Rule::Deny)));
    apply_seccomp(&SeccompProgram { filter: tree::compile(&rules) })
}

/// Installs the filter on the calling thread (no_new_privs must already be set).
pub fn apply_seccomp(program: &SeccompProgram) -> Result<()> {
    seccompiler::apply_filter(&program.filter)
        .map_err(|e| SysError::Other(format!("installing the seccomp filter failed: {e}")))
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
    use std::collections::BTreeMap;

    use seccompiler::{SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule};

    use super::*;

    /// The filters Paddock installed before the tree, built with seccompiler from the same
    /// tables, newest (evaluated first) first: the rules, clone3/openat2, other ABIs.
    fn linear_filters() -> Vec<BpfProgram> {
        let arch = if cfg!(target_arch = "x86_64") {
            seccompiler::TargetArch::x86_64
        } else if cfg!(target_arch = "aarch64") {
            seccompiler::TargetArch::aarch64
        } else {
            seccompiler::TargetArch::riscv64
        };
        let rule = |arg: u8, len, op, v: u32| {
            SeccompRule::new(vec![SeccompCondition::new(arg, len, op, u64::from(v)).unwrap()]).unwrap()
        };
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED_SYSCALLS.iter().map(|s| (*s, vec![])).collect();
        let bits = |mask: u32| (0..32).map(move |b| 1u32 << b).filter(move |b| mask & b != 0);
        let masked = |arg, len, b| rule(arg, len, SeccompCmpOp::MaskedEq(u64::from(b)), b);
        rules.insert(libc::SYS_clone, bits(NAMESPACE_FLAGS).map(|b| masked(0, SeccompCmpArgLen::Qword, b)).collect());
        for (nr, arg) in MODE_SETTING {
            rules.insert(*nr, bits(SET_ID_BITS).map(|b| masked(*arg, SeccompCmpArgLen::Dword, b)).collect());
        }
        let any_of = |arg, values: &[u32]| {
            values.iter().map(|v| rule(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *v)).collect::<Vec<_>>()
        };
        rules.insert(libc::SYS_ioctl, any_of(1, DENIED_IOCTLS));
        rules.insert(libc::SYS_socket, any_of(0, DENIED_SOCKET_FAMILIES));
        let none_of = ALLOWED_PERSONALITIES
            .iter()
            .map(|v| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, u64::from(*v)).unwrap())
            .collect();
        rules.insert(libc::SYS_personality, vec![SeccompRule::new(none_of).unwrap()]);
        let errno = |e: i32| SeccompAction::Errno(e.cast_unsigned());
        let deny = SeccompFilter::new(rules, SeccompAction::Allow, errno(libc::EPERM), arch).unwrap();
        let opaque = OPAQUE_ARGUMENTS.iter().map(|nr| (*nr, vec![])).collect();
        let clone3 = SeccompFilter::new(opaque, SeccompAction::Allow, errno(libc::ENOSYS), arch).unwrap();
        let x32 = if cfg!(target_arch = "x86_64") {
            vec![
                seccompiler::sock_filter { code: 0x20, jt: 0, jf: 0, k: 0 },
                seccompiler::sock_filter { code: 0x35, jt: 0, jf: 1, k: 0x4000_0000 },
                seccompiler::sock_filter { code: 0x06, jt: 0, jf: 0, k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32 },
                seccompiler::sock_filter { code: 0x06, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW },
            ]
        } else {
            vec![seccompiler::sock_filter { code: 0x06, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW }]
        };
        vec![deny.try_into().unwrap(), clone3.try_into().unwrap(), x32]
    }

    /// What the kernel returns for stacked filters: the most restrictive action (compared as
    /// signed, so KILL_PROCESS wins), the first one evaluated among equals.
    fn stacked(filters: &[BpfProgram], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut verdict = libc::SECCOMP_RET_ALLOW;
        for f in filters {
            let r = tree::run(f, nr, arch, args);
            if (r & libc::SECCOMP_RET_ACTION_FULL).cast_signed()
                < (verdict & libc::SECCOMP_RET_ACTION_FULL).cast_signed()
            {
                verdict = r;
            }
        }
        verdict
    }

    #[test]
    fn the_tree_decides_every_syscall_and_argument_as_the_linear_filters_did() {
        let tree = compile_seccomp().filter;
        let linear = linear_filters();
        let arch = tree::run(&tree, 0, 0, [0; 6]); // a wrong arch kills
        assert_eq!(arch, libc::SECCOMP_RET_KILL_PROCESS);
        // Every value the rules name, alone, combined and with high bits set, plus edges.
        let named = [DENIED_IOCTLS, DENIED_SOCKET_FAMILIES, ALLOWED_PERSONALITIES]
            .concat()
            .into_iter()
            .chain((0..32).map(|b| 1u32 << b))
            .chain([NAMESPACE_FLAGS, SET_ID_BITS, 0o755, 0o4755, 0o2755, 8 | 0x0040000, 0x0400000, 7, 0x5401])
            .collect::<Vec<u32>>();
        let mut values: Vec<u64> = vec![0, 1, u64::MAX, 1 << 32];
        for v in named {
            values.extend([u64::from(v), u64::from(v) | (1 << 32), u64::from(v) | 0xffff_ffff_0000_0000]);
        }
        let numbers = (0..600u32).chain((0..600).map(|n| n | 0x4000_0000)).chain([u32::MAX, 0x8000_0000]);
        let mut checked = 0;
        let mut denied = 0;
        // Arguments matter only to the syscalls with argument rules; every other number is
        // checked with a few argument values.
        let with_arguments: Vec<u32> = rules()
            .into_iter()
            .filter(|(_, r)| !matches!(r, tree::Rule::Deny | tree::Rule::NoSys))
            .map(|(nr, _)| nr)
            .collect();
        for nr in numbers {
            let values = if with_arguments.contains(&nr) { &values[..] } else { &values[..4] };
            for value in values {
                for arg in 0..4 {
                    let mut args = [0u64; 6];
                    args[arg] = *value;
                    let want = stacked(&linear, nr, tree::AUDIT_ARCH, args);
                    let got = tree::run(&tree, nr, tree::AUDIT_ARCH, args);
                    assert_eq!(got, want, "syscall {nr} argument {arg} = {value:#x}");
                    checked += 1;
                    denied += usize::from(got != libc::SECCOMP_RET_ALLOW);
                }
            }
        }
        // The comparison means something only if both verdicts occur often.
        assert!(denied > checked / 4 && denied < checked, "{denied} of {checked} denied");
    }

    #[test]
    fn any_syscall_is_decided_in_a_few_steps() {
        let tree = compile_seccomp().filter;
        let linear = linear_filters();
        let most = |filters: &[&BpfProgram]| {
            (0..600)
                .map(|nr| filters.iter().map(|f| tree::run_counting(f, nr, tree::AUDIT_ARCH, [0; 6]).1).sum::<usize>())
                .max()
                .unwrap()
        };
        let (tree_steps, linear_steps) = (most(&[&tree]), most(&linear.iter().collect::<Vec<_>>()));
        // Arch, number, x32 check, at most eight comparisons, the rule's block.
        assert!(tree_steps <= 20, "tree takes up to {tree_steps} steps (linear: {linear_steps})");
        assert!(linear_steps > 4 * tree_steps, "tree {tree_steps} steps, linear {linear_steps}");
    }
}
