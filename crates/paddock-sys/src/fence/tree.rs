//! The sandbox's seccomp policy compiled to one classic-BPF program that finds a syscall's rule
//! by binary search over syscall numbers.
//!
//! Written by hand because the cost of a filter is paid on every sandbox start and every
//! syscall: when a filter is attached, the kernel runs it once for each syscall number to learn
//! which ones it may allow without running it again, and the syscalls whose arguments matter
//! (openat, ioctl, clone, socket…) run it every time. seccompiler, the filter builder Paddock
//! otherwise uses, emits one linear chain of comparisons (about 90 here, so up to 90 steps per
//! syscall and tens of thousands when the filter is attached); libseccomp builds trees but is a
//! C library and a build dependency for ~150 lines of code. A tree needs at most eight
//! comparisons to reach any rule. `fence::tests` checks this program decides every syscall
//! number and argument the same as seccompiler's linear filters do.

use seccompiler::sock_filter;

/// What the filter does with one syscall number that has a rule. Argument checks look at the
/// low 32 bits of the argument: every value checked is a C `int` or `unsigned int` in the
/// kernel, so the high half carries nothing the kernel reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// Always EPERM.
    Deny,
    /// Always ENOSYS, so libc falls back to an older call the filter can check.
    NoSys,
    /// EPERM when the argument has any bit of the mask set.
    AnyBit { arg: u8, mask: u32 },
    /// EPERM when the argument is one of the values.
    OneOf { arg: u8, values: &'static [u32] },
    /// EPERM when the argument is none of the values.
    NoneOf { arg: u8, values: &'static [u32] },
}

const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JA: u16 = 0x05; // BPF_JMP | BPF_JA
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// Offsets into `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// The low half of argument `i` (every architecture Paddock builds for is little-endian).
fn arg_low(i: u8) -> u32 {
    16 + 8 * u32::from(i)
}

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
/// On x86_64, x32 syscall numbers have this bit set and reach the same kernel functions
/// under other numbers than the ones the rules name.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `AUDIT_ARCH_*` of the architecture this binary runs on (linux/audit.h; not in libc).
pub(super) const AUDIT_ARCH: u32 = if cfg!(target_arch = "x86_64") {
    0xC000_003E
} else if cfg!(target_arch = "aarch64") {
    0xC000_00B7
} else {
    0xC000_00F3 // riscv64
};

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: usize, jf: usize) -> sock_filter {
    // Callers only pass offsets within one rule's block or one subtree that fits (checked).
    let jt = u8::try_from(jt).expect("BPF jump offset over 255");
    let jf = u8::try_from(jf).expect("BPF jump offset over 255");
    sock_filter { code, jt, jf, k }
}

/// Compiles `rules` (syscall number → rule; numbers unique) into one program. A syscall of
/// another architecture kills the process (its numbers mean other calls), an x32 number is
/// ENOSYS, a number without a rule is allowed.
pub(super) fn compile(rules: &[(u32, Rule)]) -> Vec<sock_filter> {
    let mut sorted = rules.to_vec();
    sorted.sort_by_key(|(nr, _)| *nr);
    assert!(sorted.windows(2).all(|w| w[0].0 != w[1].0), "a syscall has two seccomp rules");
    let mut program = vec![
        stmt(LD_W_ABS, ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(LD_W_ABS, NR),
    ];
    if cfg!(target_arch = "x86_64") {
        program.extend([jump(JGE_K, X32_SYSCALL_BIT, 0, 1), stmt(RET_K, ENOSYS)]);
    }
    if sorted.is_empty() {
        program.push(stmt(RET_K, ALLOW));
    } else {
        program.extend(search(&sorted));
    }
    // BPF_MAXINSNS: the kernel refuses longer classic programs.
    assert!(program.len() <= 4096, "seccomp program too long");
    program
}

/// The subtree deciding `rules` (sorted, non-empty), with the syscall number in the
/// accumulator. Every path through it ends in a return.
fn search(rules: &[(u32, Rule)]) -> Vec<sock_filter> {
    if rules.len() <= PLAIN_LEAF && rules.iter().all(|(_, r)| matches!(r, Rule::Deny | Rule::NoSys)) {
        return plain_leaf(rules);
    }
    if let [(nr, rule)] = rules {
        let action = action(*rule);
        let mut leaf = vec![jump(JEQ_K, *nr, 0, action.len())];
        leaf.extend(action);
        leaf.push(stmt(RET_K, ALLOW));
        return leaf;
    }
    let (low, high) = rules.split_at(rules.len() / 2);
    let pivot = high[0].0;
    let low = search(low);
    let mut node = if low.len() <= usize::from(u8::MAX) {
        vec![jump(JGE_K, pivot, low.len(), 0)]
    } else {
        // Too far for a conditional jump's 8-bit offset: hop over `low` with an
        // unconditional jump, whose offset is 32 bits.
        vec![jump(JGE_K, pivot, 0, 1), stmt(JA, u32::try_from(low.len()).unwrap_or(u32::MAX))]
    };
    node.extend(low);
    node.extend(search(high));
    node
}

/// How many numbers without argument rules one leaf compares one after the other: fewer
/// branches to reach them and shared returns make the program shorter, and its length is what
/// attaching it costs most (the kernel compiles it to native code).
const PLAIN_LEAF: usize = 4;

/// A leaf comparing a few numbers whose rule ignores arguments: a comparison per number, then
/// the allow and the one return for each rule that occurs.
fn plain_leaf(rules: &[(u32, Rule)]) -> Vec<sock_filter> {
    let returns: Vec<u32> =
        [EPERM, ENOSYS].into_iter().filter(|ret| rules.iter().any(|(_, r)| verdict(*r) == *ret)).collect();
    let mut leaf: Vec<sock_filter> = rules
        .iter()
        .enumerate()
        .map(|(i, (nr, rule))| {
            let at = returns.iter().position(|ret| *ret == verdict(*rule)).expect("listed above");
            // Over the comparisons after this one and the allow, to this rule's return.
            jump(JEQ_K, *nr, rules.len() - 1 - i + 1 + at, 0)
        })
        .collect();
    leaf.push(stmt(RET_K, ALLOW));
    leaf.extend(returns.into_iter().map(|ret| stmt(RET_K, ret)));
    leaf
}

/// The return of a rule that ignores arguments.
fn verdict(rule: Rule) -> u32 {
    match rule {
        Rule::NoSys => ENOSYS,
        _ => EPERM,
    }
}

/// The block deciding one syscall known by number; it ends in returns on every path.
fn action(rule: Rule) -> Vec<sock_filter> {
    match rule {
        Rule::Deny => vec![stmt(RET_K, EPERM)],
        Rule::NoSys => vec![stmt(RET_K, ENOSYS)],
        Rule::AnyBit { arg, mask } => {
            vec![stmt(LD_W_ABS, arg_low(arg)), jump(JSET_K, mask, 0, 1), stmt(RET_K, EPERM), stmt(RET_K, ALLOW)]
        }
        Rule::OneOf { arg, values } => listed(arg, values, EPERM, ALLOW),
        Rule::NoneOf { arg, values } => listed(arg, values, ALLOW, EPERM),
    }
}

/// Loads the argument, returns `on_match` when it equals one of `values`, else `otherwise`.
fn listed(arg: u8, values: &[u32], on_match: u32, otherwise: u32) -> Vec<sock_filter> {
    let mut block = vec![stmt(LD_W_ABS, arg_low(arg))];
    // Each comparison jumps over the ones after it and the `otherwise` return.
    block.extend(values.iter().enumerate().map(|(i, v)| jump(JEQ_K, *v, values.len() - i, 0)));
    block.extend([stmt(RET_K, otherwise), stmt(RET_K, on_match)]);
    block
}

/// A classic-BPF interpreter for what seccomp filters use, so tests can run a program on any
/// syscall and argument without installing it. Refuses (panics on) anything else.
#[cfg(test)]
pub(super) fn run(program: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
    run_counting(program, nr, arch, args).0
}

/// [`run`], also giving how many instructions ran.
#[cfg(test)]
pub(super) fn run_counting(program: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> (u32, usize) {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    let (mut acc, mut pc, mut steps) = (0u32, 0usize, 0usize);
    loop {
        let insn = &program[pc];
        pc += 1;
        steps += 1;
        let branch = |taken: bool| usize::from(if taken { insn.jt } else { insn.jf });
        match insn.code {
            LD_W_ABS => {
                let at = insn.k as usize;
                acc = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
            }
            0x54 => acc &= insn.k, // BPF_ALU | BPF_AND | BPF_K
            JA => pc += insn.k as usize,
            JEQ_K => pc += branch(acc == insn.k),
            JGE_K => pc += branch(acc >= insn.k),
            0x25 => pc += branch(acc > insn.k), // BPF_JMP | BPF_JGT | BPF_K
            JSET_K => pc += branch(acc & insn.k != 0),
            RET_K => return (insn.k, steps),
            code => panic!("BPF opcode {code:#x} not interpreted"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARGS: [u64; 6] = [0; 6];

    #[test]
    fn every_rule_is_reached_through_a_tree_too_wide_for_short_jumps() {
        // 300 rules make subtrees longer than a conditional jump reaches.
        let rules: Vec<(u32, Rule)> =
            (0..300).map(|n| (n * 3, if n % 2 == 0 { Rule::Deny } else { Rule::NoSys })).collect();
        let program = compile(&rules);
        assert!(program.iter().any(|i| i.code == JA), "the test needs a long jump");
        for nr in 0..1000 {
            let want = match rules.iter().find(|(n, _)| *n == nr) {
                Some((_, Rule::Deny)) => EPERM,
                Some(_) => ENOSYS,
                None => ALLOW,
            };
            assert_eq!(run(&program, nr, AUDIT_ARCH, ARGS), want, "syscall {nr}");
        }
        assert_eq!(run(&program, 1, AUDIT_ARCH ^ 1, ARGS), libc::SECCOMP_RET_KILL_PROCESS);
    }

    #[test]
    fn argument_rules_look_at_the_low_half_of_their_argument() {
        let rules = [
            (10, Rule::AnyBit { arg: 1, mask: 0o6000 }),
            (11, Rule::OneOf { arg: 0, values: &[5, 7] }),
            (12, Rule::NoneOf { arg: 2, values: &[0, 8] }),
        ];
        let program = compile(&rules);
        let with = |i: usize, v: u64| {
            let mut a = ARGS;
            a[i] = v;
            a
        };
        let cases = [
            (10, with(1, 0o4755), EPERM),
            (10, with(1, 0o2755), EPERM),
            (10, with(1, 0o755), ALLOW),
            (10, with(0, 0o4755), ALLOW),
            (11, with(0, 5), EPERM),
            (11, with(0, 7), EPERM),
            (11, with(0, (1 << 32) | 7), EPERM),
            (11, with(0, 6), ALLOW),
            (12, with(2, 0), ALLOW),
            (12, with(2, 8), ALLOW),
            (12, with(2, 9), EPERM),
            (12, with(2, (1 << 32) | 9), EPERM),
        ];
        for (nr, args, want) in cases {
            assert_eq!(run(&program, nr, AUDIT_ARCH, args), want, "syscall {nr} {args:?}");
        }
    }
}
