//! Per-sandbox cgroups on v1, v2 and hybrid hosts.
//!
//! Written by hand rather than with a cgroup crate: we need exactly create / limit / join /
//! freeze / kill / remove on the three layouts (v1 limits plus the v2 core for kill and freeze on
//! hybrid hosts), and the available crates either pin old `nix` versions or treat hybrid as
//! plain v1 and so lose `cgroup.kill`.
//!
//! All paths come from a [`CgroupLayout`], so the same code runs against a fake cgroupfs in a
//! temporary directory in unit tests.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Result, SysError};

/// Where the cgroup hierarchies of this host are mounted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupLayout {
    /// v1 hierarchies by controller name (`memory`, `pids`, `cpu`, `freezer`).
    pub v1: Vec<(String, PathBuf)>,
    /// The cgroup2 mount, if any.
    pub unified: Option<PathBuf>,
    /// Controllers the cgroup2 root offers (`cgroup.controllers`).
    pub unified_controllers: Vec<String>,
}

const V1_CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "freezer"];

impl CgroupLayout {
    /// Reads this host's layout from `/proc/self/mountinfo`.
    pub fn detect() -> Result<Self> {
        let text = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| SysError::path("read", "/proc/self/mountinfo", e))?;
        let mut layout = Self::from_mountinfo(&text);
        if let Some(root) = &layout.unified {
            let controllers = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            layout.unified_controllers = controllers.split_whitespace().map(str::to_owned).collect();
        }
        Ok(layout)
    }

    /// Parses mount points out of mountinfo text; pure, for tests.
    pub fn from_mountinfo(text: &str) -> Self {
        let mut layout = CgroupLayout::default();
        for line in text.lines() {
            let Some((left, right)) = line.split_once(" - ") else { continue };
            let fields: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let (Some(mount_point), Some(fstype)) = (fields.get(4), right.first()) else { continue };
            let mount_point = PathBuf::from(unescape_mountinfo(mount_point));
            match *fstype {
                "cgroup2" if layout.unified.is_none() => layout.unified = Some(mount_point),
                "cgroup" => {
                    let options = right.get(2).copied().unwrap_or_default();
                    for opt in options.split(',') {
                        if V1_CONTROLLERS.contains(&opt) && !layout.v1.iter().any(|(c, _)| c == opt) {
                            layout.v1.push((opt.to_owned(), mount_point.clone()));
                        }
                    }
                }
                _ => {}
            }
        }
        layout
    }

    fn v1_root(&self, controller: &str) -> Option<&Path> {
        self.v1.iter().find(|(c, _)| c == controller).map(|(_, p)| p.as_path())
    }

    /// True when limits are set through cgroup2 (a pure v2 host, or v2 with the controllers).
    pub fn limits_on_v2(&self) -> bool {
        self.unified.is_some() && ["memory", "pids"].iter().all(|c| self.unified_controllers.iter().any(|u| u == c))
    }

    /// Creates the cgroups of one sandbox (`<parent>/<name>` in every hierarchy we use) and sets
    /// its limits. Anything created is removed again if a later step fails.
    pub fn create(&self, parent: &str, name: &str, limits: &Limits) -> Result<SandboxCgroup> {
        let mut cg = self.create_before_clone(parent, name, limits)?;
        self.add_v1(&mut cg, parent, name, limits)?;
        Ok(cg)
    }

    /// The part of [`create`](Self::create) a sandbox's init must be cloned into: everything on
    /// a host whose limits are on cgroup v2, the v2 core alone (for `cgroup.kill` and
    /// `cgroup.freeze`) on a hybrid host, nothing on a v1-only host. The v1 hierarchies, which
    /// the init joins itself, can then be made by [`add_v1`](Self::add_v1) while the init
    /// builds its filesystem. Fails before creating anything when a needed v1 controller is not
    /// mounted.
    pub fn create_before_clone(&self, parent: &str, name: &str, limits: &Limits) -> Result<SandboxCgroup> {
        let mut cg = SandboxCgroup { v1: Vec::new(), unified: None, limits_on_v2: self.limits_on_v2() };
        if !cg.limits_on_v2 {
            for controller in V1_CONTROLLERS {
                if self.v1_root(controller).is_none() && !self.v1_optional(controller) {
                    return Err(v1_missing(controller));
                }
            }
        }
        let Some(root) = &self.unified else { return Ok(cg) };
        let result = (|| {
            let dir = root.join(parent).join(name);
            if cg.limits_on_v2 {
                enable_v2_controllers(root, parent, &self.unified_controllers)?;
            }
            make_dir(&dir)?;
            cg.unified = Some(dir.clone());
            if cg.limits_on_v2 {
                write(&dir, "memory.max", &limits.memory_bytes.to_string())?;
                write_if_present(&dir, "memory.swap.max", "0")?;
                write(&dir, "pids.max", &limits.pids.to_string())?;
                if let Some(m) = limits.millicpus
                    && self.unified_controllers.iter().any(|c| c == "cpu")
                {
                    write(&dir, "cpu.max", &format!("{} {CPU_PERIOD_US}", quota_us(m)))?;
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(cg),
            Err(e) => {
                let _ = cg.remove(Duration::from_millis(200));
                Err(e)
            }
        }
    }

    /// Adds the v1 hierarchies (with the limits) to a sandbox's cgroups made by
    /// [`create_before_clone`](Self::create_before_clone); nothing when its limits are on v2.
    /// On failure the v1 cgroups made here are removed again and `cg` is as it was.
    pub fn add_v1(&self, cg: &mut SandboxCgroup, parent: &str, name: &str, limits: &Limits) -> Result<()> {
        if cg.limits_on_v2 {
            return Ok(());
        }
        let mut made = SandboxCgroup { v1: Vec::new(), unified: None, limits_on_v2: false };
        let result = (|| {
            for controller in V1_CONTROLLERS {
                let Some(root) = self.v1_root(controller) else {
                    if self.v1_optional(controller) {
                        continue;
                    }
                    return Err(v1_missing(controller));
                };
                let dir = root.join(parent).join(name);
                make_dir(&dir)?;
                made.v1.push((controller, dir.clone()));
                match controller {
                    "memory" => {
                        write(&dir, "memory.limit_in_bytes", &limits.memory_bytes.to_string())?;
                        // Without swap accounting the file is absent; with it, no swap either.
                        write_if_present(&dir, "memory.memsw.limit_in_bytes", &limits.memory_bytes.to_string())?;
                    }
                    "pids" => write(&dir, "pids.max", &limits.pids.to_string())?,
                    "cpu" => {
                        if let Some(m) = limits.millicpus {
                            write(&dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
                            write(&dir, "cpu.cfs_quota_us", &quota_us(m).to_string())?;
                        }
                    }
                    _ => {}
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                cg.v1 = made.v1;
                Ok(())
            }
            Err(e) => {
                let _ = made.remove(Duration::from_millis(200));
                Err(e)
            }
        }
    }

    /// The freezer is optional where the v2 core gives `cgroup.freeze`.
    fn v1_optional(&self, controller: &str) -> bool {
        controller == "freezer" && self.unified.is_some()
    }

    /// The cgroups a sandbox named `name` would have; used to clean up after a supervisor that
    /// died without removing them.
    pub fn existing(&self, parent: &str, name: &str) -> SandboxCgroup {
        let limits_on_v2 = self.limits_on_v2();
        let v1 = if limits_on_v2 {
            Vec::new()
        } else {
            V1_CONTROLLERS
                .iter()
                .filter_map(|c| self.v1_root(c).map(|r| (*c, r.join(parent).join(name))))
                .filter(|(_, p)| p.exists())
                .collect()
        };
        let unified = self.unified.as_ref().map(|r| r.join(parent).join(name)).filter(|p| p.exists());
        SandboxCgroup { v1, unified, limits_on_v2 }
    }
}

fn v1_missing(controller: &str) -> SysError {
    SysError::Other(format!(
        "the cgroup v1 controller `{controller}` is not mounted: mount it (or use a cgroup v2 host) so Paddock can enforce limits"
    ))
}

/// Resource limits applied to one sandbox's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u32,
    /// CPU quota in thousandths of a CPU; `None` leaves CPU time unlimited.
    pub millicpus: Option<u32>,
}

const CPU_PERIOD_US: u64 = 100_000;

fn quota_us(millicpus: u32) -> u64 {
    // The kernel refuses quotas under 1 ms.
    (u64::from(millicpus) * CPU_PERIOD_US / 1000).max(1000)
}

fn enable_v2_controllers(root: &Path, parent: &str, offered: &[String]) -> Result<()> {
    let wanted: Vec<&str> = ["memory", "pids", "cpu"].into_iter().filter(|c| offered.iter().any(|o| o == c)).collect();
    let line = wanted.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
    let mut dir = root.to_path_buf();
    write(&dir, "cgroup.subtree_control", &line)?;
    for part in Path::new(parent).components() {
        dir.push(part);
        make_dir(&dir)?;
        write(&dir, "cgroup.subtree_control", &line)?;
    }
    Ok(())
}

/// The cgroups of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxCgroup {
    v1: Vec<(&'static str, PathBuf)>,
    unified: Option<PathBuf>,
    limits_on_v2: bool,
}

impl SandboxCgroup {
    /// Moves a process into every cgroup of this sandbox.
    pub fn add_process(&self, pid: u32) -> Result<()> {
        for dir in self.dirs() {
            write(dir, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    /// The sandbox's cgroup2 directory, opened for `CLONE_INTO_CGROUP`: the one cgroup a child
    /// can be created in directly.
    pub fn unified_dir(&self) -> Option<Result<std::os::fd::OwnedFd>> {
        use rustix::fs::{Mode, OFlags};
        let dir = self.unified.as_ref()?;
        Some(
            rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| SysError::path("open", dir, e)),
        )
    }

    /// Moves a process into the sandbox's cgroup2 directory only.
    pub fn add_process_unified(&self, pid: u32) -> Result<()> {
        match &self.unified {
            Some(dir) => write(dir, "cgroup.procs", &pid.to_string()),
            None => Ok(()),
        }
    }

    /// The `tasks` files of the sandbox's v1 hierarchies, opened for writing by the caller
    /// (root), for [`join_v1`] by the process that is to move.
    pub fn v1_task_files(&self) -> Result<Vec<fs::File>> {
        self.v1
            .iter()
            .map(|(_, dir)| {
                let path = dir.join("tasks");
                fs::OpenOptions::new().write(true).open(&path).map_err(|e| SysError::path("open", path, e))
            })
            .collect()
    }

    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.v1.iter().map(|(_, p)| p).chain(self.unified.iter())
    }

    fn v1_dir(&self, controller: &str) -> Option<&Path> {
        self.v1.iter().find(|(c, _)| *c == controller).map(|(_, p)| p.as_path())
    }

    /// The cgroup that holds every process of the sandbox, for listing and killing.
    fn tracking_dir(&self) -> Option<&Path> {
        self.unified.as_deref().or_else(|| self.v1_dir("pids")).or_else(|| self.v1.first().map(|(_, p)| p.as_path()))
    }

    /// Host pids of every process in the sandbox.
    pub fn processes(&self) -> Vec<u32> {
        let Some(dir) = self.tracking_dir() else { return Vec::new() };
        fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Stops every process of the sandbox in place (memory kept) and waits until it is frozen.
    pub fn freeze(&self) -> Result<()> {
        self.set_frozen(true)
    }

    /// Lets a frozen sandbox run again.
    pub fn thaw(&self) -> Result<()> {
        self.set_frozen(false)
    }

    fn set_frozen(&self, frozen: bool) -> Result<()> {
        if let Some(dir) = &self.unified {
            write(dir, "cgroup.freeze", if frozen { "1" } else { "0" })?;
            let want = if frozen { "frozen 1" } else { "frozen 0" };
            return wait_for(Duration::from_secs(5), || {
                fs::read_to_string(dir.join("cgroup.events")).map(|t| t.lines().any(|l| l == want)).unwrap_or(true)
            })
            .map_err(|()| SysError::Other(format!("{} did not report `{want}` within 5 s", dir.display())));
        }
        let Some(dir) = self.v1_dir("freezer") else {
            return Err(SysError::Other(
                "no freezer cgroup is available on this host: pause needs cgroup v2 or the v1 freezer".into(),
            ));
        };
        let state = if frozen { "FROZEN" } else { "THAWED" };
        write(dir, "freezer.state", state)?;
        wait_for(Duration::from_secs(5), || {
            fs::read_to_string(dir.join("freezer.state")).map(|t| t.trim() == state).unwrap_or(true)
        })
        .map_err(|()| SysError::Other(format!("{} did not reach {state} within 5 s", dir.display())))
    }

    /// Whether the sandbox is frozen right now.
    pub fn is_frozen(&self) -> bool {
        if let Some(dir) = &self.unified {
            return fs::read_to_string(dir.join("cgroup.freeze")).map(|t| t.trim() == "1").unwrap_or(false);
        }
        self.v1_dir("freezer")
            .and_then(|d| fs::read_to_string(d.join("freezer.state")).ok())
            .is_some_and(|t| t.trim() == "FROZEN")
    }

    /// SIGKILLs every process of the sandbox and waits until the cgroup is empty.
    pub fn kill_all(&self, timeout: Duration) -> Result<()> {
        if let Some(dir) = &self.unified
            && dir.join("cgroup.kill").exists()
        {
            write(dir, "cgroup.kill", "1")?;
        }
        // Without cgroup.kill (old v2, or v1 only): kill what is listed until nothing is left.
        // A frozen task only dies once thawed, so thaw first.
        let _ = self.set_frozen_quiet(false);
        wait_for(timeout, || {
            let pids = self.processes();
            for pid in &pids {
                if let Some(pid) = rustix::process::Pid::from_raw((*pid).cast_signed()) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            pids.is_empty()
        })
        .map_err(|()| SysError::Other(format!("processes were still alive in the sandbox cgroup after {timeout:?}")))
    }

    fn set_frozen_quiet(&self, frozen: bool) -> Result<()> {
        if self.is_frozen() != frozen { self.set_frozen(frozen) } else { Ok(()) }
    }

    /// The file whose `oom_kill N` line counts OOM kills in the sandbox.
    pub fn oom_counter_path(&self) -> Option<PathBuf> {
        if self.limits_on_v2 {
            self.unified.as_deref().map(|d| d.join("memory.events"))
        } else {
            self.v1_dir("memory").map(|d| d.join("memory.oom_control"))
        }
    }

    /// Number of OOM kills inside the sandbox so far.
    pub fn oom_kills(&self) -> u64 {
        self.oom_counter_path().and_then(|p| fs::read_to_string(p).ok()).map(|t| parse_oom_kills(&t)).unwrap_or(0)
    }

    /// Memory charged to the sandbox now, bytes (`memory.current` on v2, `memory.usage_in_bytes`
    /// on v1).
    pub fn memory_used(&self) -> Option<u64> {
        let path = if self.limits_on_v2 {
            self.unified.as_deref()?.join("memory.current")
        } else {
            self.v1_dir("memory")?.join("memory.usage_in_bytes")
        };
        fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// The memory limit and what of it no reclaim can free (anonymous memory and tmpfs pages;
    /// page cache is left out, since the kernel drops it before it kills), bytes. `None`
    /// without a memory controller or a limit.
    pub fn memory_pinned(&self) -> Option<(u64, u64)> {
        let (dir, limit_file, fields): (&Path, _, &[&str]) = if self.limits_on_v2 {
            (self.unified.as_deref()?, "memory.max", &["anon", "shmem"])
        } else {
            (self.v1_dir("memory")?, "memory.limit_in_bytes", &["total_rss", "total_shmem"])
        };
        let limit: u64 = fs::read_to_string(dir.join(limit_file)).ok()?.trim().parse().ok()?;
        let stat = fs::read_to_string(dir.join("memory.stat")).ok()?;
        Some((limit, sum_of_fields(&stat, fields)))
    }

    /// CPU time used by every process of the sandbox so far, nanoseconds: v1's
    /// `cpuacct.usage` where cpuacct shares the cpu hierarchy, else cgroup2's `cpu.stat`, which
    /// the v2 core keeps even without the cpu controller.
    pub fn cpu_used_ns(&self) -> Option<u64> {
        if !self.limits_on_v2
            && let Some(n) = self
                .v1_dir("cpu")
                .and_then(|d| fs::read_to_string(d.join("cpuacct.usage")).ok())
                .and_then(|t| t.trim().parse().ok())
        {
            return Some(n);
        }
        let stat = fs::read_to_string(self.unified.as_deref()?.join("cpu.stat")).ok()?;
        parse_usage_usec(&stat).map(|us| us.saturating_mul(1000))
    }

    /// Removes every cgroup directory of the sandbox; they must be empty of processes.
    pub fn remove(&self, timeout: Duration) -> Result<()> {
        for dir in self.dirs() {
            let mut last = None;
            let gone = wait_for(timeout, || match fs::remove_dir(dir) {
                Ok(()) => true,
                Err(e) if e.kind() == ErrorKind::NotFound => true,
                // A cgroup whose last task just died can stay busy for a moment.
                Err(e) => {
                    last = Some(e);
                    false
                }
            });
            if gone.is_err() {
                return Err(SysError::path("rmdir", dir, last.unwrap_or_else(|| ErrorKind::TimedOut.into())));
            }
        }
        Ok(())
    }
}

/// Moves the calling process into the v1 cgroups whose `tasks` files are given (see
/// [`SandboxCgroup::v1_task_files`]; the kernel checks the credentials they were opened with).
///
/// A process that moves itself, one thread through `tasks`, is the one migration for which
/// the kernel does not take the host-wide threadgroup lock, whose first writer after a quiet
/// spell waits for an RCU grace period (about 5 ms here, against 0.1 ms for this). The caller
/// must be single-threaded, so that moving its thread moves the whole process.
pub fn join_v1(tasks: &[fs::File]) -> Result<()> {
    use std::io::Write;
    if crate::process::thread_count()? != 1 {
        return Err(SysError::Other("joining cgroups thread by thread needs a single-threaded process".into()));
    }
    for mut file in tasks {
        file.write_all(b"0").map_err(|e| SysError::call("join the sandbox cgroup", e))?;
    }
    Ok(())
}

/// The `usage_usec N` of a v2 `cpu.stat` text.
pub fn parse_usage_usec(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("usage_usec ")).and_then(|n| n.trim().parse().ok())
}

/// The `oom_kill N` count of a v1 `memory.oom_control` or v2 `memory.events` text.
pub fn parse_oom_kills(text: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse().ok())).unwrap_or(0)
}

fn wait_for(timeout: Duration, mut done: impl FnMut() -> bool) -> std::result::Result<(), ()> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        if done() {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(());
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

fn make_dir(dir: &Path) -> Result<()> {
    match fs::create_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) => Err(SysError::path("mkdir", dir, e)),
    }
}

fn write(dir: &Path, file: &str, value: &str) -> Result<()> {
    let path = dir.join(file);
    fs::write(&path, value).map_err(|e| SysError::path("write", path, e))
}

fn write_if_present(dir: &Path, file: &str, value: &str) -> Result<()> {
    if dir.join(file).exists() { write(dir, file, value) } else { Ok(()) }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The sum of the named lines of a `memory.stat` ("name value" per line).
fn sum_of_fields(stat: &str, fields: &[&str]) -> u64 {
    stat.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| fields.contains(k))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn pinned_memory_sums_anonymous_and_tmpfs_pages_only() {
        let v1 = "cache 100\nrss 7\nshmem 5\ntotal_cache 4096\ntotal_rss 1000\ntotal_shmem 24\ntotal_mapped_file 9\n";
        assert_eq!(super::sum_of_fields(v1, &["total_rss", "total_shmem"]), 1024);
        let v2 = "anon 300\nfile 9000\nkernel 5\nshmem 12\n";
        assert_eq!(super::sum_of_fields(v2, &["anon", "shmem"]), 312);
    }

    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn detects_hybrid_layout() {
        let l = CgroupLayout::from_mountinfo(HYBRID);
        assert_eq!(l.v1_root("memory"), Some(Path::new("/sys/fs/cgroup/memory")));
        assert_eq!(l.v1_root("pids"), Some(Path::new("/sys/fs/cgroup/pids")));
        assert_eq!(l.v1_root("cpu"), Some(Path::new("/sys/fs/cgroup/cpu")));
        assert_eq!(l.unified.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert!(!l.limits_on_v2(), "hybrid with only hugetlb on v2 must set limits on v1");
    }

    #[test]
    fn detects_pure_v2_and_escaped_paths() {
        let l = CgroupLayout::from_mountinfo("30 1 0:26 / /sys/fs/my\\040cg rw - cgroup2 cgroup2 rw\n");
        assert_eq!(l.unified.as_deref(), Some(Path::new("/sys/fs/my cg")));
        assert!(l.v1.is_empty());
    }

    fn fake_v1(tmp: &Path) -> CgroupLayout {
        let mut l = CgroupLayout::default();
        for c in V1_CONTROLLERS {
            fs::create_dir_all(tmp.join(c)).unwrap();
            l.v1.push((c.to_owned(), tmp.join(c)));
        }
        fs::create_dir_all(tmp.join("unified")).unwrap();
        l.unified = Some(tmp.join("unified"));
        l.unified_controllers = vec!["hugetlb".into()];
        l
    }

    #[test]
    fn fake_cgroupfs_v1_limits_are_written_to_each_controller() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = fake_v1(tmp.path());
        let limits = Limits { memory_bytes: 64 << 20, pids: 100, millicpus: Some(500) };
        let cg = layout.create("paddock", "sbx1", &limits).unwrap();
        let read = |p: &str| fs::read_to_string(tmp.path().join(p)).unwrap();
        assert_eq!(read("memory/paddock/sbx1/memory.limit_in_bytes"), "67108864");
        assert_eq!(read("pids/paddock/sbx1/pids.max"), "100");
        assert_eq!(read("cpu/paddock/sbx1/cpu.cfs_quota_us"), "50000");
        assert_eq!(read("cpu/paddock/sbx1/cpu.cfs_period_us"), "100000");
        assert!(tmp.path().join("unified/paddock/sbx1").is_dir(), "hybrid keeps a v2 dir for kill/freeze");
        cg.add_process(42).unwrap();
        assert_eq!(read("pids/paddock/sbx1/cgroup.procs"), "42");
        assert_eq!(read("unified/paddock/sbx1/cgroup.procs"), "42");
        assert_eq!(cg.processes(), vec![42]);
    }

    #[test]
    fn fake_cgroupfs_v2_limits_enable_controllers_and_write_v2_files() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = CgroupLayout {
            v1: Vec::new(),
            unified: Some(tmp.path().to_path_buf()),
            unified_controllers: vec!["cpu".into(), "memory".into(), "pids".into()],
        };
        assert!(layout.limits_on_v2());
        let limits = Limits { memory_bytes: 1 << 30, pids: 512, millicpus: Some(1500) };
        layout.create("paddock", "s", &limits).unwrap();
        let read = |p: &str| fs::read_to_string(tmp.path().join(p)).unwrap();
        assert_eq!(read("cgroup.subtree_control"), "+memory +pids +cpu");
        assert_eq!(read("paddock/cgroup.subtree_control"), "+memory +pids +cpu");
        assert_eq!(read("paddock/s/memory.max"), "1073741824");
        assert_eq!(read("paddock/s/pids.max"), "512");
        assert_eq!(read("paddock/s/cpu.max"), "150000 100000");
    }

    #[test]
    fn fake_cgroupfs_missing_v1_controller_is_a_clear_error_and_nothing_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let mut layout = fake_v1(tmp.path());
        layout.v1.retain(|(c, _)| c != "pids");
        let err =
            layout.create("paddock", "x", &Limits { memory_bytes: 1 << 20, pids: 1, millicpus: None }).unwrap_err();
        assert!(err.to_string().contains("`pids` is not mounted"), "{err}");
        assert!(!tmp.path().join("memory/paddock/x").exists(), "partial cgroups must be removed");
    }

    #[test]
    fn fake_cgroupfs_oom_kills_are_read_from_v1_oom_control() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = fake_v1(tmp.path());
        let cg = layout.create("p", "o", &Limits { memory_bytes: 1 << 20, pids: 1, millicpus: None }).unwrap();
        fs::write(tmp.path().join("memory/p/o/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
            .unwrap();
        assert_eq!(cg.oom_kills(), 3);
    }

    #[test]
    fn fake_cgroupfs_usage_is_read_from_v1_files_and_the_v2_core() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = fake_v1(tmp.path());
        let cg = layout.create("p", "u", &Limits { memory_bytes: 1 << 20, pids: 1, millicpus: None }).unwrap();
        assert_eq!((cg.memory_used(), cg.cpu_used_ns()), (None, None));
        fs::write(tmp.path().join("memory/p/u/memory.usage_in_bytes"), "4096\n").unwrap();
        fs::write(tmp.path().join("unified/p/u/cpu.stat"), "usage_usec 7\nuser_usec 5\n").unwrap();
        assert_eq!(cg.memory_used(), Some(4096));
        assert_eq!(cg.cpu_used_ns(), Some(7000), "without cpuacct, the v2 core's cpu.stat counts");
        fs::write(tmp.path().join("cpu/p/u/cpuacct.usage"), "123456\n").unwrap();
        assert_eq!(cg.cpu_used_ns(), Some(123456));
    }
}
