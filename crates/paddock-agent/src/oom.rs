//! Whether the container's memory limit killed a command, read from its cgroup (v1 or v2) as
//! the runtime's shell wrapper does: the kernel counts an OOM kill in the cgroup whose limit
//! was hit, which may be the Pod's rather than the container's, so a new memory peak at the
//! limit, or the limit being hit while the command ran (`failcnt`, v2's `max` events), counts
//! too. And what makes a command, not the agent or the keeper, the kernel's choice when that
//! limit is hit.

use std::fs;
use std::sync::{Mutex, OnceLock};

use paddock_sys::oom_score::SpawnScore;

/// Slack below the limit that still counts as reaching it: the kernel reclaims before it kills.
const NEAR_LIMIT: u64 = 4 << 20;

/// The agent's own score, at least this: above the keeper's, so that when the kernel has no
/// command's process left to take, it takes the agent (which the runtime brings back) before
/// the keeper (whose death ends the Pod).
const AGENT_SCORE: i32 = 500;

static OWN_SCORE: OnceLock<Mutex<Option<SpawnScore>>> = OnceLock::new();

fn own_score() -> &'static Mutex<Option<SpawnScore>> {
    OWN_SCORE.get_or_init(|| Mutex::new(SpawnScore::own(AGENT_SCORE)))
}

/// Raises the agent's own score to [`AGENT_SCORE`] (if it is lower), at its start.
pub fn settle_own_score() {
    own_score();
}

/// Spawns `command` at the top OOM score (see [`SpawnScore`]), before the agent and the
/// keeper. Where `/proc` refuses, or the agent's score could not be put back once, commands
/// start with the agent's score.
pub fn spawn_first_to_kill(command: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    // Held across the spawn: another spawn meanwhile must not put the score back early.
    let mut score = own_score().lock().unwrap_or_else(|p| p.into_inner());
    let Some(own) = score.as_ref() else { return command.spawn() };
    let (child, kept) = own.spawn_at_top(|| command.spawn());
    if !kept {
        eprintln!("paddock-agent: could not put back its OOM score after a spawn; commands now start with the agent's");
        *score = None;
    }
    child
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    oom_kills: Option<u64>,
    limit_hits: Option<u64>,
    peak: Option<u64>,
    limit: Option<u64>,
}

fn number(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Counters {
    pub fn read() -> Self {
        let mut c = Counters::default();
        for f in ["/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"] {
            if let Ok(text) = fs::read_to_string(f) {
                c.oom_kills = keyed(&text, "oom_kill").or(c.oom_kills);
                c.limit_hits = keyed(&text, "max").or(c.limit_hits);
            }
        }
        c.limit_hits = number("/sys/fs/cgroup/memory/memory.failcnt").or(c.limit_hits);
        c.peak = number("/sys/fs/cgroup/memory/memory.max_usage_in_bytes").or(number("/sys/fs/cgroup/memory.peak"));
        c.limit = number("/sys/fs/cgroup/memory/memory.limit_in_bytes").or(number("/sys/fs/cgroup/memory.max"));
        c
    }

    /// Whether the counters read now say the limit was reached since `self` was read.
    pub fn oom_since(self) -> bool {
        self.reached(Counters::read())
    }

    fn reached(self, now: Counters) -> bool {
        let peak_at_limit = match (now.peak, now.limit) {
            (Some(p), Some(l)) => now.peak != self.peak && p.saturating_add(NEAR_LIMIT) >= l,
            _ => false,
        };
        now.oom_kills != self.oom_kills || now.limit_hits != self.limit_hits || peak_at_limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_moved_counter_or_a_new_peak_at_the_limit_is_an_oom() {
        let before = Counters { oom_kills: Some(0), limit_hits: Some(3), peak: Some(10 << 20), limit: Some(64 << 20) };
        assert!(!before.reached(before));
        assert!(before.reached(Counters { oom_kills: Some(1), ..before }));
        assert!(before.reached(Counters { limit_hits: Some(4), ..before }));
        assert!(before.reached(Counters { peak: Some(62 << 20), ..before }));
        assert!(!before.reached(Counters { peak: Some(20 << 20), ..before }));
        // Without a limit (`max` on v2 does not parse) a peak says nothing.
        let unlimited = Counters { limit: None, ..before };
        assert!(!unlimited.reached(Counters { peak: Some(1 << 40), ..unlimited }));
    }

    #[test]
    fn keyed_files_are_read_by_exact_key() {
        let text = "oom 2\noom_kill 5\nmax 7\n";
        assert_eq!(keyed(text, "oom_kill"), Some(5));
        assert_eq!(keyed(text, "oom"), Some(2));
        assert_eq!(keyed(text, "max"), Some(7));
        assert_eq!(keyed(text, "high"), None);
    }
}
