//! Tiers and capacity: how many runs of each tier may hold a sandbox at once, in what order
//! waiting work is admitted, and the bound on all tiers together that preemption acts against.

use paddock_core::units::{format_bytes, parse_bytes};

/// One tier: its name, how many of its runs may run at once, and optionally how much memory
/// (sandbox requests plus the runtime's overhead) they may hold together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub name: String,
    pub concurrency: u32,
    pub memory: Option<u64>,
}

/// A bound on runs of every tier together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub runs: u32,
    pub memory: Option<u64>,
}

/// The tiers, highest priority first, and the capacity over them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiers {
    pub tiers: Vec<Tier>,
    pub capacity: Capacity,
}

/// What the runtime adds to each sandbox's memory request (its supervisor, init and the
/// egress enforcer that forwards the gateway), counted against memory budgets as Hephaestus
/// sizes `reviewMemory`.
pub const SANDBOX_OVERHEAD: u64 = 32 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TierError(pub String);

/// `NAME=CONCURRENCY[:MEMORY]`, as `paddock serve --tier` takes it.
pub fn parse_tier(s: &str) -> Result<Tier, TierError> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| TierError(format!("tier {s:?}: write it as NAME=CONCURRENCY[:MEMORY], e.g. batch=4:8Gi")))?;
    let name = name.trim();
    let ok_name = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.as_bytes()[0].is_ascii_lowercase();
    if !ok_name {
        return Err(TierError(format!(
            "tier name {name:?}: use 1 to 63 lowercase letters, digits and -, starting with a letter"
        )));
    }
    let (runs, memory) = parse_bound(rest).map_err(|e| TierError(format!("tier {name}: {e}")))?;
    Ok(Tier { name: name.to_owned(), concurrency: runs, memory })
}

/// `N[:MEMORY]`, as `paddock serve --capacity` takes it.
pub fn parse_capacity(s: &str) -> Result<Capacity, TierError> {
    let (runs, memory) = parse_bound(s).map_err(|e| TierError(format!("capacity: {e}")))?;
    Ok(Capacity { runs, memory })
}

fn parse_bound(s: &str) -> Result<(u32, Option<u64>), String> {
    let (n, mem) = match s.split_once(':') {
        Some((n, m)) => (n, Some(m)),
        None => (s, None),
    };
    let runs: u32 = n.trim().parse().map_err(|_| format!("{n:?} is not a whole number of runs"))?;
    if runs == 0 {
        return Err("a bound of 0 runs admits nothing: give at least 1".into());
    }
    let memory = match mem {
        Some(m) => Some(parse_bytes(m.trim()).map_err(|e| format!("memory {m:?}: {e}"))?),
        None => None,
    };
    Ok((runs, memory))
}

impl Tiers {
    /// `interactive=8`, `batch=4`, under `capacity`.
    pub fn default_for(capacity: Capacity) -> Self {
        Self {
            tiers: vec![
                Tier { name: "interactive".into(), concurrency: 8, memory: None },
                Tier { name: "batch".into(), concurrency: 4, memory: None },
            ],
            capacity,
        }
    }

    pub fn validate(&self) -> Result<(), TierError> {
        if self.tiers.is_empty() {
            return Err(TierError("at least one tier is needed".into()));
        }
        for (i, t) in self.tiers.iter().enumerate() {
            if self.tiers[..i].iter().any(|o| o.name == t.name) {
                return Err(TierError(format!("tier {} is given twice", t.name)));
            }
        }
        Ok(())
    }

    /// The tier's rank (0 is the highest priority).
    pub fn rank(&self, name: &str) -> Option<usize> {
        self.tiers.iter().position(|t| t.name == name)
    }

    pub fn names(&self) -> String {
        self.tiers.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// How many sandboxes of `memory_request` bytes this machine holds: the lesser of the CPU
/// bound (four per CPU, since a sandbox's CPU is a limit, not a reservation) and the memory
/// bound after 1 GiB for the host and the server, each sandbox counted with the runtime's
/// overhead. At least 1.
pub fn machine_capacity(cpus: u32, memory_total: u64, memory_request: u64) -> u32 {
    let b = bounds(cpus, memory_total, memory_request);
    u32::try_from(b.by_memory.min(b.by_cpu)).unwrap_or(u32::MAX).max(1)
}

/// What the host keeps for itself and the server before sandboxes are counted.
pub const HOST_RESERVE: u64 = 1 << 30;

/// The two bounds [`machine_capacity`] takes the lesser of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bounds {
    pub by_cpu: u64,
    pub by_memory: u64,
}

pub fn bounds(cpus: u32, memory_total: u64, memory_request: u64) -> Bounds {
    let per = memory_request.saturating_add(SANDBOX_OVERHEAD).max(1);
    Bounds { by_cpu: u64::from(cpus) * 4, by_memory: memory_total.saturating_sub(HOST_RESERVE) / per }
}

/// This machine's CPUs and memory, from the kernel.
#[expect(clippy::disallowed_methods, reason = "/proc/meminfo is kernel memory, read once at startup")]
pub fn this_machine() -> (u32, u64) {
    let cpus = std::thread::available_parallelism().map(|n| u32::try_from(n.get()).unwrap_or(1)).unwrap_or(1);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024);
    (cpus, memory)
}

/// A tier's line for logs and `paddock serve`'s banner.
pub fn describe(t: &Tier) -> String {
    match t.memory {
        Some(m) => format!("{}={} runs, {}", t.name, t.concurrency, format_bytes(m)),
        None => format!("{}={} runs", t.name, t.concurrency),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_parse_and_refuse_with_the_form() {
        assert_eq!(parse_tier("batch=4").unwrap(), Tier { name: "batch".into(), concurrency: 4, memory: None });
        assert_eq!(parse_tier("review=2:8GiB").unwrap().memory, Some(8 << 30));
        for bad in ["batch", "=4", "Batch=4", "batch=0", "batch=x", "batch=4:lots", "9x=1"] {
            let e = parse_tier(bad).unwrap_err().to_string();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(parse_tier("batch").unwrap_err().to_string().contains("NAME=CONCURRENCY"));
        assert_eq!(parse_capacity("6:12GiB").unwrap(), Capacity { runs: 6, memory: Some(12 << 30) });
        let twice = Tiers {
            tiers: vec![parse_tier("a=1").unwrap(), parse_tier("a=2").unwrap()],
            capacity: Capacity { runs: 1, memory: None },
        };
        assert!(twice.validate().is_err());
    }

    #[test]
    fn capacity_is_the_lesser_bound_worked_by_hand() {
        // 2 CPUs, 24 GiB, 512 MiB sandboxes: memory allows (24 - 1) GiB / 544 MiB = 43, CPU 8.
        assert_eq!(machine_capacity(2, 24 << 30, 512 << 20), 8);
        // 64 CPUs, 8 GiB, 1 GiB sandboxes: 7 GiB / 1056 MiB = 6 (CPU would allow 256).
        assert_eq!(machine_capacity(64, 8 << 30, 1 << 30), 6);
        // Too small for one still admits one, so work is never stuck forever.
        assert_eq!(machine_capacity(1, 512 << 20, 512 << 20), 1);
    }
}
