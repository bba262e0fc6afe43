//! A process's `oom_score_adj`, raised to the top while it spawns, so that what it starts is
//! the OOM killer's first choice and the process itself (a sandbox's init, a Pod's agent) is
//! taken after it: the kernel sometimes kills once more when a charge was under way as its
//! first victim died, and then takes the biggest process left at the highest score.
//!
//! The score is raised in the parent for the spawn (the child inherits it) and put back after,
//! rather than set in the child between fork and exec: a `pre_exec` hook makes `Command` fork,
//! copying the parent's page tables (about 0.15 ms of every exec measured on the agent),
//! instead of using `vfork`. Raising needs no privilege; putting back fails only below the
//! floor a privileged writer set, and then the process is left at the top.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// What children start at.
const TOP: &[u8] = b"1000";

/// A handle on one process's `oom_score_adj` and the score it keeps between spawns.
pub struct SpawnScore {
    file: File,
    own: Vec<u8>,
}

impl SpawnScore {
    /// The calling process's own, kept at `floor` or above (raising needs no privilege).
    /// `None` where `/proc` is missing or refuses.
    pub fn own(floor: i32) -> Option<Self> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open("/proc/self/oom_score_adj").ok()?;
        Self::from_file(file, floor)
    }

    /// From a read-write handle on the process's `oom_score_adj`, opened for it by one that
    /// could (a process that changed its credentials is non-dumpable and may not open it).
    pub fn from_file(file: File, floor: i32) -> Option<Self> {
        let mut now = [0u8; 16];
        let n = file.read_at(&mut now, 0).ok()?;
        let now: i32 = std::str::from_utf8(&now[..n]).ok()?.trim().parse().ok()?;
        let own = now.max(floor).to_string().into_bytes();
        if now < floor {
            file.write_at(&own, 0).ok()?;
        }
        Some(Self { file, own })
    }

    /// Runs `spawn` with the process's score at the top, so what it starts inherits that, and
    /// puts the score back. The flag is false when it could not be put back (the process is
    /// left at the top): stop using this then. Not for a process that spawns from several
    /// threads at once without a lock around it.
    pub fn spawn_at_top<T>(&self, spawn: impl FnOnce() -> T) -> (T, bool) {
        let raised = self.file.write_at(TOP, 0).is_ok();
        let spawned = spawn();
        (spawned, !raised || self.file.write_at(&self.own, 0).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_spawned_at_the_top_has_1000_and_the_parent_keeps_its_own() {
        let own = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap();
        let score = SpawnScore::own(i32::MIN).unwrap();
        let (out, kept) = score.spawn_at_top(|| {
            std::process::Command::new("sh")
                .args(["-c", "cat /proc/self/oom_score_adj; cat /proc/$$/oom_score_adj"])
                .output()
                .unwrap()
        });
        assert!(kept);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "1000\n1000\n");
        assert_eq!(std::fs::read_to_string("/proc/self/oom_score_adj").unwrap(), own);
    }
}
