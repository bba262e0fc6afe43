//! `paddock-bench`: Paddock measured side by side with bubblewrap in the same run.
//!
//! Four measurements, each against a baseline taken in the same run so that a noisy machine
//! shows up in both columns and the ratio stays meaningful:
//!
//! 1. cold start: create → first output byte → destroy, against `bwrap <flags> -- echo x`
//!    (iterations interleaved, Paddock then bubblewrap);
//! 2. exec round trip into a running sandbox, against a plain fork+exec of `/bin/true` on the
//!    host and a cold `bwrap <flags> -- /bin/true` (bubblewrap cannot exec into a sandbox);
//! 3. host memory per idle sandbox: summed PSS of every process of every sandbox, and the drop
//!    of `MemAvailable`, against idle `bwrap <flags> -- sleep` processes;
//! 4. density: time to bring N sandboxes up (bounded concurrency) and to remove them again,
//!    against N bubblewrap sandboxes.
//!
//! 5. the CLI as a user runs it: whole `paddock run -- echo x` processes against the same
//!    bubblewrap command, and `paddock run --image NAME -- echo x` when `--image` names one;
//!
//! 6. the HTTP API: `paddock serve` started as a child process and driven over HTTP, against the
//!    library path measured in the same run (see `local/http.rs`; skipped with `--no-http`).
//!
//! Every sandbox the bench creates carries a label naming this run; whatever is left when the
//! bench fails or is interrupted is found by that label and removed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use paddock_core::runtime::{ExecRequest, Runtime, SandboxId};
use paddock_core::spec::{SandboxSpec, ValidatedSpec};
use paddock_runtime_local::LocalRuntime;
use paddock_runtime_local::layout::DataDir;
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tokio::task::JoinSet;

mod http;

/// The bubblewrap invocation the issue names as the nearest equivalent of a Paddock sandbox.
const BWRAP_FLAGS: [&str; 10] =
    ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--unshare-all"];
const BWRAP_DIE: &str = "--die-with-parent";
/// The label every bench sandbox carries; its value names the run.
const LABEL: &str = "paddock.bench";
/// Longest any single operation may take before the bench gives up on it.
const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause before reading `MemAvailable`, so freed namespaces and page tables are settled.
const SETTLE: Duration = Duration::from_millis(1000);
/// Pause before each command of the CLI section, Paddock's and bubblewrap's alike: the kernel
/// frees an exited sandbox's network namespace after its last process is reaped, in a
/// workqueue, so without it each command pays for the one before (the same as `dev/bench/cli-ab
/// --settle 20`).
const CLI_PAUSE: Duration = Duration::from_millis(20);
/// [`quiet_host`]: a reading's length, the busy share (of all CPUs) below which it counts as
/// quiet, and the longest wait.
const QUIET_WINDOW: Duration = Duration::from_millis(250);
const QUIET_BUSY: f64 = 0.10;
const QUIET_MAX: Duration = Duration::from_secs(30);

/// The aims from the issue.
const AIM_COLD_RATIO: f64 = 2.0;
const AIM_IDLE_BYTES: f64 = 2_000_000.0;
const AIM_DENSITY_COUNT: usize = 500;
const AIM_DENSITY_SECS: f64 = 2.0;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Iterations of each latency measurement [default: 200, or 20 with --quick].
    #[arg(long)]
    pub iterations: Option<usize>,
    /// How many sandboxes to bring up at once for the density measurement [default: 500, or
    /// 50 with --quick].
    #[arg(long)]
    pub density: Option<usize>,
    /// How many idle sandboxes the memory measurement holds [default: 50, or 10 with --quick].
    #[arg(long)]
    pub idle: Option<usize>,
    /// Creations (and removals) in flight at once during the density measurement.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Unmeasured iterations before each latency measurement [default: 5, or 2 with --quick].
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Rounds of the memory measurement; each figure is the median [default: 3, or 2 with
    /// --quick].
    #[arg(long)]
    pub memory_rounds: Option<usize>,
    /// A small run for CI: 20 iterations, density 50, 10 idle sandboxes.
    #[arg(long)]
    pub quick: bool,
    /// The bubblewrap binary to compare against.
    #[arg(long, default_value = "bwrap")]
    pub bwrap: PathBuf,
    /// Measure Paddock alone, without the bubblewrap baseline.
    #[arg(long)]
    pub no_bwrap: bool,
    /// Skip the HTTP API measurement (`paddock serve` as a child process).
    #[arg(long)]
    pub no_http: bool,
    /// Also time `paddock run --image NAME -- echo x` (an image in this data directory's store,
    /// e.g. one made with `paddock image import FILE --tag NAME`) against bubblewrap.
    #[arg(long, value_name = "NAME")]
    pub image: Option<String>,
}

struct Config {
    iterations: usize,
    density: usize,
    idle: usize,
    concurrency: usize,
    warmup: usize,
    memory_rounds: usize,
    quick: bool,
    run_label: String,
    /// Whether the HTTP section runs; it is the fifth section when it does.
    http: bool,
    sections: usize,
    /// The image of the CLI section's image row.
    image: Option<String>,
}

impl Config {
    fn new(args: &BenchArgs) -> Result<Self> {
        let pick = |v: Option<usize>, full: usize, quick: usize| v.unwrap_or(if args.quick { quick } else { full });
        let cfg = Self {
            iterations: pick(args.iterations, 200, 20),
            density: pick(args.density, AIM_DENSITY_COUNT, 50),
            idle: pick(args.idle, 50, 10),
            concurrency: args.concurrency,
            warmup: pick(args.warmup, 5, 2),
            memory_rounds: pick(args.memory_rounds, 3, 2),
            quick: args.quick,
            run_label: format!("{}-{}", std::process::id(), paddock_core::units::unix_ms()),
            http: !args.no_http,
            sections: if args.no_http { 4 } else { 5 },
            image: args.image.clone(),
        };
        for (name, v) in [
            ("--iterations", cfg.iterations),
            ("--density", cfg.density),
            ("--idle", cfg.idle),
            ("--concurrency", cfg.concurrency),
            ("--memory-rounds", cfg.memory_rounds),
        ] {
            if v == 0 {
                bail!("{name} must be at least 1");
            }
        }
        // Each bubblewrap sandbox is three processes, each Paddock sandbox two.
        let pid_max: usize =
            read_trimmed("/proc/sys/kernel/pid_max").ok().and_then(|s| s.parse().ok()).unwrap_or(32768);
        let needed = cfg.density.max(cfg.idle) * 3 + 1000;
        if needed > pid_max {
            bail!(
                "--density {} needs about {needed} process ids but this host allows {pid_max} (kernel.pid_max): lower --density or raise kernel.pid_max",
                cfg.density
            );
        }
        Ok(cfg)
    }

    fn spec(&self) -> ValidatedSpec {
        SandboxSpec { labels: BTreeMap::from([(LABEL.to_owned(), self.run_label.clone())]), ..SandboxSpec::default() }
            .validated()
            .expect("the bench's spec is valid")
    }
}

pub async fn run(rt: &LocalRuntime, args: BenchArgs, json: bool) -> Result<u8> {
    let cfg = Config::new(&args)?;
    raise_open_file_limit();
    let bwrap =
        if args.no_bwrap { Err("skipped with --no-bwrap".to_owned()) } else { Bwrap::detect(&args.bwrap).await };
    if let Err(why) = &bwrap {
        eprintln!(
            "paddock-bench: WARNING: no bubblewrap baseline: {why}. Measuring Paddock alone; every ratio will read n/a. \
             Install bubblewrap (e.g. `apt-get install bubblewrap`) or pass --bwrap PATH for the comparison."
        );
    }
    if let Some(image) = &cfg.image {
        // Fail before the long sections, not after them, when the image cannot run here.
        let exe = crate::paddock_binary();
        let args = cli_args(rt, Some(image));
        cli_once(exe, &args).await.with_context(|| format!("--image {image} cannot run here"))?;
    }
    let live = Live::default();
    let result = tokio::select! {
        r = bench(rt, &cfg, bwrap.as_ref().ok(), &live) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted; the sandboxes the bench created are being removed")),
    };
    let cleaned = cleanup(rt, &cfg, &live, result.is_err()).await;
    let mut report = result?;
    cleaned?;
    if cfg.http {
        let out = http::run(rt, &cfg, &report.cold, &report.exec).await?;
        report.aims.extend(out.aims());
        report.http = Some(out);
    }
    report.bwrap.unavailable_reason = bwrap.as_ref().err().cloned();
    if json {
        println!("{}", serde_json::to_string_pretty(&report).context("serializing the report")?);
    } else {
        print_human(&report);
    }
    Ok(0)
}

async fn bench(rt: &LocalRuntime, cfg: &Config, bwrap: Option<&Bwrap>, live: &Live) -> Result<Report> {
    let machine = Machine::detect();
    eprintln!(
        "paddock-bench: {} iterations, {} idle sandboxes, density {} ({} in flight), {}, kernel {}, {} CPUs",
        cfg.iterations,
        cfg.idle,
        cfg.density,
        cfg.concurrency,
        if cfg.http { "HTTP API included" } else { "no HTTP API (--no-http)" },
        machine.kernel,
        machine.cpus
    );
    let cold = cold_start(rt, cfg, bwrap, live).await?;
    let exec = exec_round_trip(rt, cfg, bwrap, live).await?;
    let memory = idle_memory(rt, cfg, bwrap, live).await?;
    let density = density(rt, cfg, bwrap, live).await?;
    quiet_host("the density section's namespaces and cgroups").await?;
    let cli = cli_run(rt, cfg, bwrap).await?;
    let mut aims = aims(&cold, &memory, &density);
    aims.extend(cli.aims());
    Ok(Report {
        machine,
        config: ConfigOut {
            iterations: cfg.iterations,
            warmup: cfg.warmup,
            idle_sandboxes: cfg.idle,
            memory_rounds: cfg.memory_rounds,
            density: cfg.density,
            concurrency: cfg.concurrency,
            quick: cfg.quick,
        },
        bwrap: BwrapOut {
            available: bwrap.is_some(),
            version: bwrap.map(|b| b.version.clone()),
            unavailable_reason: None,
            command: bwrap.map(|b| {
                let mut c = vec![b.path.display().to_string()];
                c.extend(BWRAP_FLAGS.iter().map(|s| (*s).to_owned()));
                c.push(BWRAP_DIE.to_owned());
                c.join(" ")
            }),
        },
        cold,
        exec,
        memory,
        density,
        cli,
        aims,
        http: None,
    })
}

// ---------------------------------------------------------------------------------------------
// 1. Cold start

async fn cold_start(rt: &LocalRuntime, cfg: &Config, bwrap: Option<&Bwrap>, live: &Live) -> Result<ColdOut> {
    let mut s = ColdSamples::default();
    let mut b_first = Vec::new();
    let mut b_total = Vec::new();
    let total = cfg.warmup + cfg.iterations;
    let mut progress =
        Progress::new(&format!("[1/{}] cold start (create → first output → destroy)", cfg.sections), total);
    for i in 0..total {
        let p = paddock_cold_once(rt, cfg, live).await?;
        settle(rt.data_dir()).await?;
        let b = match bwrap {
            Some(b) => Some(b.run_once(&["echo", "x"], true).await?),
            None => None,
        };
        if i >= cfg.warmup {
            s.push(p);
            if let Some((first, all)) = b {
                b_first.push(first);
                b_total.push(all);
            }
        }
        progress.tick(i + 1);
    }
    let paddock_total = Stats::of(&s.total);
    let bwrap_total = (!b_total.is_empty()).then(|| Stats::of(&b_total));
    let paddock_first_output = Stats::of(&s.first);
    let bwrap_first_output = (!b_first.is_empty()).then(|| Stats::of(&b_first));
    Ok(ColdOut {
        ratio_p50: ratio(&paddock_total, bwrap_total.as_ref()),
        ratio_first_output_p50: ratio(&paddock_first_output, bwrap_first_output.as_ref()),
        paddock_total,
        bwrap_total,
        paddock_first_output,
        bwrap_first_output,
        paddock_create: Stats::of(&s.create),
        paddock_exec_to_first_output: Stats::of(&s.exec_to_first),
        paddock_first_output_to_exit: Stats::of(&s.first_to_exit),
        paddock_destroy: Stats::of(&s.destroy),
    })
}

#[derive(Default)]
struct ColdSamples {
    total: Vec<Duration>,
    first: Vec<Duration>,
    create: Vec<Duration>,
    exec_to_first: Vec<Duration>,
    first_to_exit: Vec<Duration>,
    destroy: Vec<Duration>,
}

struct ColdOnce {
    create: Duration,
    first: Duration,
    exited: Duration,
    total: Duration,
}

impl ColdSamples {
    fn push(&mut self, c: ColdOnce) {
        self.total.push(c.total);
        self.first.push(c.first);
        self.create.push(c.create);
        self.exec_to_first.push(c.first - c.create);
        self.first_to_exit.push(c.exited - c.first);
        self.destroy.push(c.total - c.exited);
    }
}

async fn paddock_cold_once(rt: &LocalRuntime, cfg: &Config, live: &Live) -> Result<ColdOnce> {
    let t0 = Instant::now();
    let id = create(rt, cfg, live).await?;
    let create = t0.elapsed();
    let ran = async {
        let request = ExecRequest { argv: vec!["echo".into(), "x".into()], ..ExecRequest::default() };
        let process = within("starting `echo x` in a new sandbox", rt.exec(&id, request)).await?;
        let (mut rx, mut exec) = (process.stdout, process.control);
        let mut byte = [0u8; 1];
        let n = within("waiting for the first output of `echo x`", rx.read(&mut byte)).await?;
        if n == 0 {
            bail!("`echo x` in sandbox {id} printed nothing; try `paddock run -- echo x` to see what is wrong");
        }
        let first = t0.elapsed();
        let outcome = within("waiting for `echo x` to exit", exec.wait()).await?;
        if outcome.exit_code != 0 {
            bail!("`echo x` in sandbox {id} exited {}; try `paddock run -- echo x`", outcome.exit_code);
        }
        Ok((first, t0.elapsed()))
    }
    .await;
    let destroyed = destroy(rt, live, &id).await;
    let (first, exited) = ran?;
    destroyed?;
    Ok(ColdOnce { create, first, exited, total: t0.elapsed() })
}

// ---------------------------------------------------------------------------------------------
// 2. Exec round trip

async fn exec_round_trip(rt: &LocalRuntime, cfg: &Config, bwrap: Option<&Bwrap>, live: &Live) -> Result<ExecOut> {
    let id = create(rt, cfg, live).await?;
    let measured = async {
        let (mut round, mut start, mut host, mut b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let total = cfg.warmup + cfg.iterations;
        let mut progress =
            Progress::new(&format!("[2/{}] exec round trip (/bin/true in a running sandbox)", cfg.sections), total);
        for i in 0..total {
            let (started, done) = paddock_true_once(rt, &id).await?;
            let h = host_true()?;
            let bw = match bwrap {
                Some(bw) => Some(bw.run_once(&["/bin/true"], false).await?.1),
                None => None,
            };
            if i >= cfg.warmup {
                round.push(done);
                start.push(started);
                host.push(h);
                b.extend(bw);
            }
            progress.tick(i + 1);
        }
        Ok::<_, anyhow::Error>((round, start, host, b))
    }
    .await;
    let destroyed = destroy(rt, live, &id).await;
    settle(rt.data_dir()).await?;
    let (round, start, host, b) = measured?;
    destroyed?;
    let paddock_round_trip = Stats::of(&round);
    let host_fork_exec = Stats::of(&host);
    let bwrap_cold_true = (!b.is_empty()).then(|| Stats::of(&b));
    Ok(ExecOut {
        ratio_vs_host_p50: ratio(&paddock_round_trip, Some(&host_fork_exec)),
        ratio_vs_bwrap_cold_p50: ratio(&paddock_round_trip, bwrap_cold_true.as_ref()),
        paddock_round_trip,
        paddock_exec_started: Stats::of(&start),
        host_fork_exec,
        bwrap_cold_true,
    })
}

/// `exec /bin/true` into a running sandbox: (until started, until its exit is reported).
async fn paddock_true_once(rt: &LocalRuntime, id: &SandboxId) -> Result<(Duration, Duration)> {
    let t0 = Instant::now();
    let request = ExecRequest { argv: vec!["/bin/true".into()], ..ExecRequest::default() };
    let mut exec = within("starting /bin/true in the sandbox", rt.exec(id, request)).await?.control;
    let started = t0.elapsed();
    let outcome = within("waiting for /bin/true to exit", exec.wait()).await?;
    let done = t0.elapsed();
    if outcome.exit_code != 0 {
        bail!("/bin/true in sandbox {id} exited {}; try `paddock exec {id} -- /bin/true`", outcome.exit_code);
    }
    Ok((started, done))
}

fn host_true() -> Result<Duration> {
    let t0 = Instant::now();
    let status = std::process::Command::new("/bin/true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running /bin/true on the host")?;
    let d = t0.elapsed();
    if !status.success() {
        bail!("/bin/true on the host failed: {status}");
    }
    Ok(d)
}

// ---------------------------------------------------------------------------------------------
// 3. Host memory per idle sandbox

async fn idle_memory(rt: &LocalRuntime, cfg: &Config, bwrap: Option<&Bwrap>, live: &Live) -> Result<MemoryOut> {
    let k = cfg.idle;
    let (mut paddock, mut baseline) = (Vec::new(), Vec::new());
    for round in 1..=cfg.memory_rounds {
        let label =
            format!("[3/{}] host memory, round {round}/{}: {k} idle sandboxes", cfg.sections, cfg.memory_rounds);
        paddock.push(paddock_idle_round(rt, cfg, live, &format!("{label} (Paddock)")).await?);
        if let Some(b) = bwrap {
            baseline.push(bwrap_idle_round(b, k, &format!("{label} (bubblewrap)")).await?);
        }
    }
    let paddock = MemSide::median(&paddock);
    let bwrap = (!baseline.is_empty()).then(|| MemSide::median(&baseline));
    Ok(MemoryOut {
        sandboxes: k,
        rounds: cfg.memory_rounds,
        ratio_pss: bwrap.as_ref().map(|b| paddock.pss_bytes_per_sandbox as f64 / b.pss_bytes_per_sandbox.max(1) as f64),
        ratio_mem_available: bwrap
            .as_ref()
            .filter(|b| b.mem_available_drop_bytes_per_sandbox > 0 && paddock.mem_available_drop_bytes_per_sandbox > 0)
            .map(|b| {
                paddock.mem_available_drop_bytes_per_sandbox as f64 / b.mem_available_drop_bytes_per_sandbox as f64
            }),
        ratio_cgroup_charge: bwrap
            .as_ref()
            .and_then(|b| b.cgroup_charge_bytes_per_sandbox.filter(|c| *c > 0))
            .zip(paddock.cgroup_charge_bytes_per_sandbox)
            .map(|(b, p)| p as f64 / b as f64),
        paddock,
        bwrap,
    })
}

async fn paddock_idle_round(rt: &LocalRuntime, cfg: &Config, live: &Live, label: &str) -> Result<MemSide> {
    let k = cfg.idle;
    let mut progress = Progress::new(label, k);
    let cgroup = MemCgroup::enter();
    let before = settled_mem_available().await?;
    let cg_before = cgroup.as_ref().map(MemCgroup::usage);
    let mut ids = Vec::with_capacity(k);
    let measured = async {
        for i in 0..k {
            ids.push(create(rt, cfg, live).await?);
            progress.tick(i + 1);
        }
        let after = settled_mem_available().await?;
        let charged = match (&cgroup, cg_before) {
            (Some(cg), Some(b)) => {
                let sandboxes: u64 = ids.iter().map(|id| cg.sandbox_usage(id)).sum();
                Some(cg.usage().cast_signed() - b.cast_signed() + sandboxes.cast_signed())
            }
            _ => None,
        };
        let tree = ProcTree::scan();
        let mut roots = Vec::with_capacity(k);
        for id in &ids {
            roots.push(supervisor_of(id)?);
        }
        side(&tree.with_descendants(&roots), k, before, after, charged)
    }
    .await;
    let mut destroyed = Ok(());
    for id in &ids {
        if let Err(e) = destroy(rt, live, id).await {
            destroyed = Err(e);
        }
    }
    settle(rt.data_dir()).await?;
    if let Some(cg) = cgroup {
        cg.leave();
    }
    let side = measured?;
    destroyed?;
    Ok(side)
}

async fn bwrap_idle_round(b: &Bwrap, k: usize, label: &str) -> Result<MemSide> {
    let mut progress = Progress::new(label, k);
    let cgroup = MemCgroup::enter();
    let before = settled_mem_available().await?;
    let cg_before = cgroup.as_ref().map(MemCgroup::usage);
    let mut children = Vec::with_capacity(k);
    let measured = async {
        for i in 0..k {
            children.push(b.start_idle().await?);
            progress.tick(i + 1);
        }
        let after = settled_mem_available().await?;
        let charged = cgroup.as_ref().zip(cg_before).map(|(cg, b)| cg.usage().cast_signed() - b.cast_signed());
        let roots: Vec<u32> = children.iter().filter_map(|c| c.id()).collect();
        side(&ProcTree::scan().with_descendants(&roots), k, before, after, charged)
    }
    .await;
    let killed = kill_all(children).await;
    if let Some(cg) = cgroup {
        cg.leave();
    }
    killed?;
    measured
}

/// `MemAvailable` once it has stopped moving: freed namespaces and page tables are released
/// lazily, and other work on the host moves it too. The median of a few readings.
async fn settled_mem_available() -> Result<u64> {
    tokio::time::sleep(SETTLE).await;
    let mut readings = Vec::new();
    for _ in 0..5 {
        readings.push(mem_available()?);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    readings.sort_unstable();
    Ok(readings[readings.len() / 2])
}

fn side(pids: &[u32], k: usize, before: u64, after: u64, charged: Option<i64>) -> Result<MemSide> {
    let (mut pss, mut private) = (0u64, 0u64);
    for &pid in pids {
        let m = smaps_rollup(pid)?;
        pss += m.pss;
        private += m.private;
    }
    Ok(MemSide {
        processes: pids.len(),
        pss_bytes_per_sandbox: pss / k as u64,
        private_bytes_per_sandbox: private / k as u64,
        mem_available_drop_bytes_per_sandbox: (before.cast_signed() - after.cast_signed())
            / i64::try_from(k).unwrap_or(i64::MAX),
        cgroup_charge_bytes_per_sandbox: charged.map(|c| c / i64::try_from(k).unwrap_or(i64::MAX)),
    })
}

impl MemSide {
    /// The median of each measure over the rounds.
    fn median(rounds: &[MemSide]) -> MemSide {
        fn mid<T: Copy + Ord>(mut v: Vec<T>) -> T {
            v.sort_unstable();
            v[v.len() / 2]
        }
        MemSide {
            processes: mid(rounds.iter().map(|r| r.processes).collect()),
            pss_bytes_per_sandbox: mid(rounds.iter().map(|r| r.pss_bytes_per_sandbox).collect()),
            private_bytes_per_sandbox: mid(rounds.iter().map(|r| r.private_bytes_per_sandbox).collect()),
            mem_available_drop_bytes_per_sandbox: mid(rounds
                .iter()
                .map(|r| r.mem_available_drop_bytes_per_sandbox)
                .collect()),
            cgroup_charge_bytes_per_sandbox: rounds
                .iter()
                .map(|r| r.cgroup_charge_bytes_per_sandbox)
                .collect::<Option<Vec<_>>>()
                .filter(|v| !v.is_empty())
                .map(mid),
        }
    }
}

/// A memory cgroup nested in the bench's own, which the bench moves into for one memory round
/// so that everything it starts is charged there. Nested, so no limit of the caller is escaped.
struct MemCgroup {
    dir: PathBuf,
    usage_file: &'static str,
    /// Where the sandboxes' own cgroups live (`<root>/paddock/<id>`).
    root: PathBuf,
    original: PathBuf,
}

impl MemCgroup {
    /// Enters a fresh cgroup; `None` (the measure then reads n/a) when the host does not allow it.
    fn enter() -> Option<Self> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let (root, usage_file, rel) = if Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists() {
            let rel = own.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
                ctrls.split(',').any(|c| c == "memory").then(|| path.to_owned())
            })?;
            (PathBuf::from("/sys/fs/cgroup/memory"), "memory.usage_in_bytes", rel)
        } else {
            let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?.to_owned();
            (PathBuf::from("/sys/fs/cgroup"), "memory.current", rel)
        };
        let original = root.join(rel.trim_start_matches('/'));
        let dir = original.join(format!("paddock-bench-{}-{}", std::process::id(), paddock_core::units::unix_ms()));
        std::fs::create_dir(&dir).ok()?;
        let cg = Self { dir, usage_file, root, original };
        if !cg.dir.join(usage_file).exists()
            || std::fs::write(cg.dir.join("cgroup.procs"), std::process::id().to_string()).is_err()
        {
            let _ = std::fs::remove_dir(&cg.dir);
            return None;
        }
        Some(cg)
    }

    fn read(path: &Path) -> u64 {
        read_trimmed(&path.to_string_lossy()).ok().and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    fn usage(&self) -> u64 {
        Self::read(&self.dir.join(self.usage_file))
    }

    fn sandbox_usage(&self, id: &SandboxId) -> u64 {
        Self::read(&self.root.join("paddock").join(id.as_str()).join(self.usage_file))
    }

    /// Moves the bench back where it was and removes the cgroup.
    fn leave(self) {
        let _ = std::fs::write(self.original.join("cgroup.procs"), std::process::id().to_string());
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("paddock-bench: could not remove the cgroup {}; remove it with rmdir", self.dir.display());
    }
}

/// The supervisor of a sandbox: the parent of the processes in the sandbox's cgroup.
fn supervisor_of(id: &SandboxId) -> Result<u32> {
    let candidates = ["/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"];
    for root in candidates {
        let procs = Path::new(root).join("paddock").join(id.as_str()).join("cgroup.procs");
        let Ok(text) = std::fs::read_to_string(&procs) else { continue };
        let mut parents = BTreeSet::new();
        for pid in text.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
            if let Some(ppid) = ProcTree::ppid(pid) {
                parents.insert(ppid);
            }
        }
        // Commands started in the sandbox have the init as parent, which is in the cgroup too.
        let in_cgroup: BTreeSet<u32> = text.split_whitespace().filter_map(|p| p.parse().ok()).collect();
        if let Some(sup) = parents.difference(&in_cgroup).next() {
            return Ok(*sup);
        }
    }
    bail!(
        "cannot find the processes of sandbox {id}: none of {} lists them; is the sandbox running (`paddock ls`)?",
        candidates.map(|c| format!("{c}/paddock/{id}/cgroup.procs")).join(", ")
    )
}

struct Smaps {
    pss: u64,
    private: u64,
}

fn smaps_rollup(pid: u32) -> Result<Smaps> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {path} (the bench must run as root to read other processes' memory)"))?;
    let kb = |key: &str| -> u64 {
        text.lines()
            .filter_map(|l| l.strip_prefix(key))
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .sum::<u64>()
            * 1024
    };
    Ok(Smaps { pss: kb("Pss:"), private: kb("Private_Clean:") + kb("Private_Dirty:") })
}

fn mem_available() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| anyhow!("/proc/meminfo has no MemAvailable line; a kernel of 3.14 or later is needed"))
}

/// Waits until the host's CPUs have been mostly idle for two readings in a row, or
/// [`QUIET_MAX`] has passed (then it says so and goes on). After hundreds of sandboxes went
/// down the kernel goes on freeing their network namespaces and cgroups in its workqueues for
/// seconds; a measurement taken meanwhile reads that work as its own (`paddock run` read 1.76×
/// bubblewrap's time straight after the density section, 1.44× on a quiet host).
async fn quiet_host(what: &str) -> Result<()> {
    let t0 = Instant::now();
    let mut last = cpu_times()?;
    let mut quiet_in_a_row = 0;
    let mut busy = 1.0;
    eprintln!("paddock-bench: waiting for the kernel to finish freeing {what}...");
    while quiet_in_a_row < 2 {
        if t0.elapsed() > QUIET_MAX {
            eprintln!(
                "paddock-bench: the host is still {:.0}% busy after {} s; measuring anyway (other work on this machine?)",
                busy * 100.0,
                QUIET_MAX.as_secs()
            );
            return Ok(());
        }
        tokio::time::sleep(QUIET_WINDOW).await;
        let now = cpu_times()?;
        let (total, idle) = (now.0.saturating_sub(last.0), now.1.saturating_sub(last.1));
        busy = if total == 0 { 0.0 } else { 1.0 - idle as f64 / total as f64 };
        quiet_in_a_row = if busy < QUIET_BUSY { quiet_in_a_row + 1 } else { 0 };
        last = now;
    }
    eprintln!("paddock-bench: quiet after {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// All CPUs' time and idle time (idle and iowait) in clock ticks, from `/proc/stat`.
fn cpu_times() -> Result<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let fields: Vec<u64> = text
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .ok_or_else(|| anyhow!("/proc/stat has no aggregate `cpu` line"))?
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is counted in user already).
    let total = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Ok((total, idle))
}

/// Parent links of every process on the host.
struct ProcTree {
    children: HashMap<u32, Vec<u32>>,
}

impl ProcTree {
    fn scan() -> Self {
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
                if let Some(ppid) = Self::ppid(pid) {
                    children.entry(ppid).or_default().push(pid);
                }
            }
        }
        Self { children }
    }

    fn ppid(pid: u32) -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`; comm may contain anything, so split after the last `)`.
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    }

    fn with_descendants(&self, roots: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut stack: Vec<u32> = roots.to_vec();
        let mut seen = BTreeSet::new();
        while let Some(pid) = stack.pop() {
            if seen.insert(pid) {
                out.push(pid);
                stack.extend(self.children.get(&pid).into_iter().flatten());
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Density

async fn density(rt: &LocalRuntime, cfg: &Config, bwrap: Option<&Bwrap>, live: &Live) -> Result<DensityOut> {
    let n = cfg.density;
    let s = cfg.sections;
    let mut progress = Progress::new(&format!("[4/{s}] density: {n} sandboxes up (Paddock)"), n);
    let t0 = Instant::now();
    let mut ids = Vec::with_capacity(n);
    let mut set = JoinSet::new();
    let mut started = 0;
    let mut failure = None;
    while ids.len() < n {
        while failure.is_none() && started < n && set.len() < cfg.concurrency {
            let (rt, spec, live) = (rt.clone(), cfg.spec(), live.clone());
            set.spawn(async move {
                let info = within("creating a sandbox", rt.create(spec)).await?;
                live.insert(&info.id);
                Ok::<_, anyhow::Error>(info.id)
            });
            started += 1;
        }
        let Some(joined) = set.join_next().await else { break };
        match joined.map_err(|e| anyhow!("a create task failed: {e}")).and_then(|r| r) {
            Ok(id) => {
                ids.push(id);
                progress.tick(ids.len());
            }
            Err(e) => {
                failure.get_or_insert(e.context(format!("bringing {n} sandboxes up (after {} were up)", ids.len())));
            }
        }
    }
    let up = t0.elapsed();
    let mut progress = Progress::new(&format!("[4/{s}] density: {n} sandboxes down (Paddock)"), ids.len());
    let t1 = Instant::now();
    let mut removed = 0;
    let mut pending = ids.into_iter();
    let mut set = JoinSet::new();
    loop {
        while set.len() < cfg.concurrency {
            let Some(id) = pending.next() else { break };
            let (rt, live) = (rt.clone(), live.clone());
            set.spawn(async move {
                within("removing a sandbox", rt.destroy(&id)).await?;
                live.remove(&id);
                Ok::<_, anyhow::Error>(())
            });
        }
        let Some(joined) = set.join_next().await else { break };
        if let Err(e) = joined.map_err(|e| anyhow!("a remove task failed: {e}")).and_then(|r| r) {
            failure.get_or_insert(e);
        }
        removed += 1;
        progress.tick(removed);
    }
    // Down means gone: the supervisors finish removing their sandboxes after answering.
    if failure.is_none()
        && let Err(e) = settle(rt.data_dir()).await
    {
        failure = Some(e);
    }
    let down = t1.elapsed();
    if let Some(e) = failure {
        return Err(e);
    }

    let (bwrap_up_s, bwrap_down_s) = match bwrap {
        None => (None, None),
        Some(b) => {
            let mut progress = Progress::new(&format!("[4/{s}] density: {n} sandboxes up (bubblewrap)"), n);
            let t0 = Instant::now();
            let mut children = Vec::with_capacity(n);
            let mut set = JoinSet::new();
            let mut started = 0;
            while children.len() < n {
                while started < n && set.len() < cfg.concurrency {
                    let b = b.clone();
                    set.spawn(async move { b.start_idle().await });
                    started += 1;
                }
                let Some(joined) = set.join_next().await else { break };
                children.push(joined.map_err(|e| anyhow!("a bubblewrap start task failed: {e}"))??);
                progress.tick(children.len());
            }
            let up = t0.elapsed();
            let t1 = Instant::now();
            kill_all(children).await?;
            (Some(up.as_secs_f64()), Some(t1.elapsed().as_secs_f64()))
        }
    };
    Ok(DensityOut {
        count: n,
        concurrency: cfg.concurrency,
        paddock_up_s: up.as_secs_f64(),
        paddock_down_s: down.as_secs_f64(),
        ratio_up: bwrap_up_s.map(|b| up.as_secs_f64() / b),
        ratio_down: bwrap_down_s.map(|b| down.as_secs_f64() / b),
        bwrap_up_s,
        bwrap_down_s,
    })
}

// ---------------------------------------------------------------------------------------------
// Sandboxes the bench owns

/// Ids of the sandboxes the bench has created and not yet removed.
#[derive(Clone, Default)]
struct Live(Arc<Mutex<BTreeSet<SandboxId>>>);

impl Live {
    fn insert(&self, id: &SandboxId) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone());
    }
    fn remove(&self, id: &SandboxId) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
    fn take(&self) -> Vec<SandboxId> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner())).into_iter().collect()
    }
}

async fn create(rt: &LocalRuntime, cfg: &Config, live: &Live) -> Result<SandboxId> {
    let info = within("creating a sandbox", rt.create(cfg.spec())).await?;
    live.insert(&info.id);
    Ok(info.id)
}

/// Waits until the supervisors of destroyed sandboxes have finished what they do after
/// answering (see `remains` in the local runtime): their directories in `<data>/gone/` are
/// the last thing they remove. Measurements call it outside their timing, so that this work
/// never runs inside the next measurement, bubblewrap's included. `data` is the bench's own
/// (`rt.data_dir()`) or its server's.
async fn settle(data: &DataDir) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while data.anything_gone() {
        if Instant::now() > deadline {
            bail!(
                "destroyed sandboxes were still being removed after 60 s: see {} (`paddock ls` removes what a dead supervisor left)",
                data.gone_dir().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

async fn destroy(rt: &LocalRuntime, live: &Live, id: &SandboxId) -> Result<()> {
    within(&format!("removing sandbox {id}"), rt.destroy(id)).await?;
    live.remove(id);
    Ok(())
}

/// Removes every sandbox this run created. After a failure or an interruption, creations may
/// have been cut off half way, so the sandboxes are also looked up by the run's label.
async fn cleanup(rt: &LocalRuntime, cfg: &Config, live: &Live, aborted: bool) -> Result<()> {
    let mut left = live.take();
    if aborted {
        eprintln!("paddock-bench: removing the sandboxes this run created...");
        // Let supervisors that were starting when the bench stopped finish, so they are listed.
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Ok(all) = rt.list().await {
            for info in all {
                if info.spec.labels.get(LABEL) == Some(&cfg.run_label) && !left.contains(&info.id) {
                    left.push(info.id);
                }
            }
        }
    }
    let mut failed = Vec::new();
    for id in left {
        match within(&format!("removing sandbox {id}"), rt.destroy(&id)).await {
            Ok(()) => {}
            Err(e) if e.to_string().contains("no sandbox") => {}
            Err(e) => failed.push(format!("{id} ({e:#})")),
        }
    }
    if !failed.is_empty() {
        bail!(
            "could not remove these bench sandboxes: {}; remove them with `paddock rm ID` (see `paddock ls`)",
            failed.join(", ")
        );
    }
    Ok(())
}

async fn within<T, E>(what: &str, fut: impl Future<Output = std::result::Result<T, E>>) -> Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    match tokio::time::timeout(OP_TIMEOUT, fut).await {
        Ok(r) => r.with_context(|| what.to_owned()),
        Err(_) => Err(anyhow!(
            "{what} took longer than {} s; the machine may be overloaded. Check `paddock ls` and `paddock rm` any leftovers",
            OP_TIMEOUT.as_secs()
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// CLI: whole processes, as a user runs them

/// The aims of the CLI section (issue 9).
const AIM_CLI_RATIO: f64 = 1.5;
const AIM_CLI_IMAGE_RATIO: f64 = 2.0;

#[derive(Serialize)]
struct CliOut {
    /// The Paddock command timed, spawn to exit.
    command: String,
    paddock: Stats,
    /// The bubblewrap command, spawn to exit, interleaved with it.
    bwrap: Option<Stats>,
    ratio_p50: Option<f64>,
    /// `paddock run --image NAME`; `null` without `--image`.
    image: Option<CliImageOut>,
    /// Why there is no image row.
    image_skipped: Option<String>,
}

#[derive(Serialize)]
struct CliImageOut {
    image: String,
    paddock: Stats,
    bwrap: Option<Stats>,
    ratio_p50: Option<f64>,
}

impl CliOut {
    fn aims(&self) -> Vec<Aim> {
        let aim = |what: String, p: &Stats, b: Option<&Stats>, r: Option<f64>, limit: f64| Aim {
            aim: what,
            measured: match r {
                Some(r) => format!("{} ({} vs {})", times(Some(r)), ms(p.p50_ms), ms(b.map_or(0.0, |b| b.p50_ms))),
                None => "n/a (no bubblewrap)".into(),
            },
            hit: r.map(|r| r <= limit),
        };
        let mut out = vec![aim(
            format!("`paddock run -- echo x` p50 within {AIM_CLI_RATIO}× bubblewrap's"),
            &self.paddock,
            self.bwrap.as_ref(),
            self.ratio_p50,
            AIM_CLI_RATIO,
        )];
        if let Some(i) = &self.image {
            out.push(aim(
                format!("`paddock run --image …` p50 within {AIM_CLI_IMAGE_RATIO}× bubblewrap's"),
                &i.paddock,
                i.bwrap.as_ref(),
                i.ratio_p50,
                AIM_CLI_IMAGE_RATIO,
            ));
        }
        out
    }

    fn print(&self, row: &dyn Fn(&str, Option<&Stats>)) {
        println!("CLI: paddock run -- echo x vs bwrap (spawn → exit) {:>10} {:>10} {:>10}", "p50", "p90", "p99");
        row("paddock run -- echo x", Some(&self.paddock));
        row("bwrap … -- echo x, interleaved", self.bwrap.as_ref());
        println!("  {:<44} {:>10}", "ratio paddock / bwrap (p50)", times(self.ratio_p50));
        match (&self.image, &self.image_skipped) {
            (Some(i), _) => {
                println!("  image root: --image {}", i.image);
                row("paddock run --image … -- echo x", Some(&i.paddock));
                row("bwrap … -- echo x, interleaved", i.bwrap.as_ref());
                println!("  {:<44} {:>10}", "ratio paddock --image / bwrap (p50)", times(i.ratio_p50));
            }
            (None, Some(why)) => println!("  image root: skipped ({why})"),
            (None, None) => {}
        }
    }
}

/// `paddock run` as a user runs it: a new process per sandbox, spawn to exit, its output
/// checked, each iteration followed by the bubblewrap command (A B A B).
async fn cli_run(rt: &LocalRuntime, cfg: &Config, bwrap: Option<&Bwrap>) -> Result<CliOut> {
    let exe = crate::paddock_binary();
    // Both commands start as a shell starts them, with stdio only: descriptors this process
    // inherited from its own starter would otherwise reach them (and `paddock run` would exec
    // its supervisor, as it does for a caller that passes more than stdio).
    paddock_sys::process::cloexec_inherited_fds().context("marking inherited descriptors close-on-exec")?;
    let run_args = |image: Option<&str>| cli_args(rt, image);
    let measure = async |args: Vec<String>, label: String| -> Result<(Stats, Option<Stats>)> {
        let total = cfg.warmup + cfg.iterations;
        let mut progress = Progress::new(&label, total);
        let (mut p, mut b) = (Vec::new(), Vec::new());
        for i in 0..total {
            tokio::time::sleep(CLI_PAUSE).await;
            let t = cli_once(exe, &args).await?;
            settle(rt.data_dir()).await?;
            tokio::time::sleep(CLI_PAUSE).await;
            let bt = match bwrap {
                Some(bw) => Some(spawn_to_exit(bw.command(&["echo", "x"]), "bwrap … -- echo x").await?),
                None => None,
            };
            if i >= cfg.warmup {
                p.push(t);
                b.extend(bt);
            }
            progress.tick(i + 1);
        }
        Ok((Stats::of(&p), (!b.is_empty()).then(|| Stats::of(&b))))
    };
    let label = "[CLI] paddock run -- echo x vs bwrap (whole processes)".to_owned();
    let (paddock, bwrap_stats) = measure(run_args(None), label).await?;
    let command = format!("{} {}", exe.display(), run_args(None).join(" "));
    let (image, image_skipped) = match &cfg.image {
        Some(name) => {
            let label = format!("[CLI] paddock run --image {name} -- echo x vs bwrap");
            let (p, b) = measure(run_args(Some(name)), label).await?;
            (Some(CliImageOut { image: name.clone(), ratio_p50: ratio(&p, b.as_ref()), paddock: p, bwrap: b }), None)
        }
        None => {
            (None, Some("no --image NAME given; import one with `paddock image import FILE --tag NAME`".to_owned()))
        }
    };
    Ok(CliOut {
        command,
        ratio_p50: ratio(&paddock, bwrap_stats.as_ref()),
        paddock,
        bwrap: bwrap_stats,
        image,
        image_skipped,
    })
}

/// `--data-dir D run [--image NAME] -- echo x`, on the bench's data directory.
fn cli_args(rt: &LocalRuntime, image: Option<&str>) -> Vec<String> {
    let mut a = vec!["--data-dir".to_owned(), rt.data_dir().root().display().to_string(), "run".to_owned()];
    if let Some(i) = image {
        a.extend(["--image".to_owned(), i.to_owned()]);
    }
    a.extend(["--".to_owned(), "echo".to_owned(), "x".to_owned()]);
    a
}

/// One `paddock ARGS` process, spawn to exit; it must print `x`.
async fn cli_once(exe: &Path, args: &[String]) -> Result<Duration> {
    let mut command = tokio::process::Command::new(exe);
    command.args(args).stdin(Stdio::null()).kill_on_drop(true);
    spawn_to_exit(command, &format!("paddock {}", args.join(" "))).await
}

/// One whole process that must print `x`: from spawn to its exit and the end of its stdout
/// and stderr. Both sides of the CLI comparison are timed here, the same way (as a shell's
/// `$(…)` or Python's `subprocess.run` would wait for them).
async fn spawn_to_exit(mut command: tokio::process::Command, what: &str) -> Result<Duration> {
    let doing = format!("running `{what}`");
    let t0 = Instant::now();
    let out = within(&doing, command.output()).await?;
    let took = t0.elapsed();
    if !out.status.success() || out.stdout != b"x\n" {
        bail!("`{what}` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(took)
}

// ---------------------------------------------------------------------------------------------
// bubblewrap

#[derive(Clone)]
struct Bwrap {
    path: PathBuf,
    version: String,
}

impl Bwrap {
    /// Finds bubblewrap and checks that it can start a sandbox here.
    async fn detect(path: &Path) -> std::result::Result<Self, String> {
        let version = tokio::process::Command::new(path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("cannot run {} ({e})", path.display()))?;
        let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
        let b = Self { path: path.to_owned(), version };
        b.run_once(&["/bin/true"], false)
            .await
            .map_err(|e| format!("{} cannot start a sandbox: {e:#}", path.display()))?;
        Ok(b)
    }

    fn command(&self, argv: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.path);
        c.args(BWRAP_FLAGS).arg(BWRAP_DIE).arg("--").args(argv).stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    /// Runs one command to its end: time to its first output byte (if `output`) and to its exit.
    async fn run_once(&self, argv: &[&str], output: bool) -> Result<(Duration, Duration)> {
        let t0 = Instant::now();
        let mut child = self
            .command(argv)
            .stdout(if output { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", self.path.display()))?;
        let mut first = Duration::ZERO;
        let mut got = !output;
        if let Some(mut out) = child.stdout.take() {
            let mut byte = [0u8; 1];
            got = within("waiting for bubblewrap's first output", out.read(&mut byte)).await? == 1;
            first = t0.elapsed();
        }
        let status = within("waiting for bubblewrap to exit", child.wait()).await?;
        let total = t0.elapsed();
        if !got || !status.success() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err).await;
            }
            bail!("`bwrap ... -- {}` failed ({status}): {}", argv.join(" "), err.trim());
        }
        Ok((first, total))
    }

    /// Starts an idle sandbox and returns once it is running (it has printed a byte).
    async fn start_idle(&self) -> Result<tokio::process::Child> {
        let mut child = self
            .command(&["/bin/sh", "-c", "echo; exec sleep 3600"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", self.path.display()))?;
        let mut out = child.stdout.take().expect("piped");
        let mut byte = [0u8; 1];
        if within("waiting for an idle bubblewrap sandbox to start", out.read(&mut byte)).await? != 1 {
            let _ = child.kill().await;
            bail!("an idle bubblewrap sandbox exited before it started; run `bwrap ... -- sleep 1` to see why");
        }
        Ok(child)
    }
}

/// Kills the bubblewrap sandboxes the bench started (their init dies with them: --die-with-parent).
async fn kill_all(children: Vec<tokio::process::Child>) -> Result<()> {
    let mut children = children;
    for c in &mut children {
        let _ = c.start_kill();
    }
    for c in &mut children {
        within("waiting for a killed bubblewrap sandbox to exit", c.wait()).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Statistics and the report

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Stats {
    pub(crate) n: usize,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) min_ms: f64,
    pub(crate) max_ms: f64,
}

impl Stats {
    pub(crate) fn of(samples: &[Duration]) -> Self {
        let mut v: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        v.sort_by(f64::total_cmp);
        // Nearest-rank percentile.
        let pct = |p: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            // Between 0 and len: a float that fits.
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "0 <= rank <= len")]
            let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
            v[rank.clamp(1, v.len()) - 1]
        };
        Self {
            n: v.len(),
            p50_ms: pct(50.0),
            p90_ms: pct(90.0),
            p99_ms: pct(99.0),
            min_ms: v.first().copied().unwrap_or(0.0),
            max_ms: v.last().copied().unwrap_or(0.0),
        }
    }
}

fn ratio(a: &Stats, b: Option<&Stats>) -> Option<f64> {
    b.filter(|b| b.p50_ms > 0.0).map(|b| a.p50_ms / b.p50_ms)
}

#[derive(Serialize)]
struct Report {
    machine: Machine,
    config: ConfigOut,
    bwrap: BwrapOut,
    cold: ColdOut,
    exec: ExecOut,
    memory: MemoryOut,
    density: DensityOut,
    cli: CliOut,
    aims: Vec<Aim>,
    /// The HTTP API section; `null` with `--no-http`.
    http: Option<http::HttpOut>,
}

#[derive(Serialize)]
struct Machine {
    kernel: String,
    cpus: usize,
    cgroups: String,
    mem_total_bytes: u64,
}

impl Machine {
    fn detect() -> Self {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let has = |fs: &str| mounts.lines().any(|l| l.split_whitespace().nth(2) == Some(fs));
        let cgroups = match (has("cgroup"), has("cgroup2")) {
            (true, true) => "v1 + v2 (hybrid)",
            (true, false) => "v1",
            (false, true) => "v2",
            (false, false) => "none mounted",
        };
        let mem_total_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
            })
            .unwrap_or(0)
            * 1024;
        Self {
            kernel: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_else(|_| "unknown".into()),
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            cgroups: cgroups.into(),
            mem_total_bytes,
        }
    }
}

#[derive(Serialize)]
struct ConfigOut {
    iterations: usize,
    warmup: usize,
    idle_sandboxes: usize,
    memory_rounds: usize,
    density: usize,
    concurrency: usize,
    quick: bool,
}

#[derive(Serialize)]
struct BwrapOut {
    available: bool,
    version: Option<String>,
    unavailable_reason: Option<String>,
    command: Option<String>,
}

#[derive(Serialize)]
struct ColdOut {
    /// Create → first output → destroy.
    paddock_total: Stats,
    /// Spawn → first output → exit.
    bwrap_total: Option<Stats>,
    ratio_p50: Option<f64>,
    paddock_first_output: Stats,
    bwrap_first_output: Option<Stats>,
    ratio_first_output_p50: Option<f64>,
    paddock_create: Stats,
    paddock_exec_to_first_output: Stats,
    paddock_first_output_to_exit: Stats,
    paddock_destroy: Stats,
}

#[derive(Serialize)]
struct ExecOut {
    /// exec() of /bin/true until its exit is reported.
    paddock_round_trip: Stats,
    /// exec() until the command is started (the pid is known).
    paddock_exec_started: Stats,
    host_fork_exec: Stats,
    bwrap_cold_true: Option<Stats>,
    ratio_vs_host_p50: Option<f64>,
    ratio_vs_bwrap_cold_p50: Option<f64>,
}

#[derive(Serialize)]
struct MemSide {
    processes: usize,
    pss_bytes_per_sandbox: u64,
    private_bytes_per_sandbox: u64,
    mem_available_drop_bytes_per_sandbox: i64,
    /// Memory charged to cgroups (user and kernel memory, page cache) by creating the sandboxes:
    /// the growth of a cgroup holding the bench and so every supervisor (or bwrap) it starts,
    /// plus the sandboxes' own cgroups. Unlike `MemAvailable` it ignores the rest of the host.
    cgroup_charge_bytes_per_sandbox: Option<i64>,
}

#[derive(Serialize)]
struct MemoryOut {
    sandboxes: usize,
    /// Rounds of (Paddock, bubblewrap); each figure is the median over the rounds.
    rounds: usize,
    paddock: MemSide,
    bwrap: Option<MemSide>,
    ratio_pss: Option<f64>,
    ratio_mem_available: Option<f64>,
    ratio_cgroup_charge: Option<f64>,
}

#[derive(Serialize)]
struct DensityOut {
    count: usize,
    concurrency: usize,
    paddock_up_s: f64,
    paddock_down_s: f64,
    bwrap_up_s: Option<f64>,
    bwrap_down_s: Option<f64>,
    ratio_up: Option<f64>,
    ratio_down: Option<f64>,
}

#[derive(Serialize)]
struct Aim {
    aim: String,
    measured: String,
    /// `None` when this run cannot judge it (no bubblewrap, or a density other than 500).
    hit: Option<bool>,
}

fn aims(cold: &ColdOut, memory: &MemoryOut, density: &DensityOut) -> Vec<Aim> {
    let mut out = vec![Aim {
        aim: format!("cold start p50 within {AIM_COLD_RATIO}× bubblewrap's"),
        measured: match cold.ratio_p50 {
            Some(r) => format!(
                "{} ({} vs {})",
                times(Some(r)),
                ms(cold.paddock_total.p50_ms),
                ms(cold.bwrap_total.as_ref().map_or(0.0, |b| b.p50_ms))
            ),
            None => "n/a (no bubblewrap)".into(),
        },
        hit: cold.ratio_p50.map(|r| r <= AIM_COLD_RATIO),
    }];
    let pss = memory.paddock.pss_bytes_per_sandbox as f64;
    out.push(Aim {
        aim: "≤ 2 MB per idle sandbox (PSS of its processes)".into(),
        measured: mb(pss),
        hit: Some(pss <= AIM_IDLE_BYTES),
    });
    let drop = memory.paddock.mem_available_drop_bytes_per_sandbox as f64;
    out.push(Aim {
        aim: "≤ 2 MB per idle sandbox (MemAvailable drop, kernel memory included)".into(),
        measured: if drop > 0.0 {
            mb(drop)
        } else {
            format!("{} (not judged: other activity on the host outweighed it)", mb(drop))
        },
        hit: (drop > 0.0).then_some(drop <= AIM_IDLE_BYTES),
    });
    if let Some(c) = memory.paddock.cgroup_charge_bytes_per_sandbox {
        out.push(Aim {
            aim: "≤ 2 MB per idle sandbox (cgroup charge, kernel memory included)".into(),
            measured: mb(c as f64),
            hit: Some(c as f64 <= AIM_IDLE_BYTES),
        });
    }
    let judged = density.count == AIM_DENSITY_COUNT;
    out.push(Aim {
        aim: format!("{AIM_DENSITY_COUNT} sandboxes up in ≤ {AIM_DENSITY_SECS} s"),
        measured: if judged {
            secs(density.paddock_up_s)
        } else {
            format!(
                "{} for {} (not judged: the aim is for {AIM_DENSITY_COUNT})",
                secs(density.paddock_up_s),
                density.count
            )
        },
        hit: judged.then_some(density.paddock_up_s <= AIM_DENSITY_SECS),
    });
    out
}

fn ms(v: f64) -> String {
    if v >= 1000.0 { format!("{:.2} s", v / 1000.0) } else { format!("{v:.2} ms") }
}

fn secs(v: f64) -> String {
    format!("{v:.2} s")
}

fn mb(bytes: f64) -> String {
    format!("{:.2} MB", bytes / 1e6)
}

fn times(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".into(), |r| format!("{r:.2}×"))
}

fn print_human(r: &Report) {
    let na = || "n/a".to_owned();
    let row = |name: &str, s: Option<&Stats>| match s {
        Some(s) => println!("  {name:<44} {:>10} {:>10} {:>10}", ms(s.p50_ms), ms(s.p90_ms), ms(s.p99_ms)),
        None => println!("  {name:<44} {:>10} {:>10} {:>10}", na(), na(), na()),
    };
    println!(
        "paddock-bench: kernel {}, {} CPUs, cgroups {}; {}",
        r.machine.kernel,
        r.machine.cpus,
        r.machine.cgroups,
        r.bwrap.version.as_deref().unwrap_or("no bubblewrap baseline")
    );
    println!(
        "{} iterations after {} warm-up, {} idle sandboxes, density {} ({} in flight). One run: read medians and ratios.",
        r.config.iterations, r.config.warmup, r.config.idle_sandboxes, r.config.density, r.config.concurrency
    );
    if let Some(why) = &r.bwrap.unavailable_reason {
        println!("WARNING: no bubblewrap baseline ({why}); ratios read n/a.");
    }
    println!();
    println!("Cold start: create → first output → destroy          {:>10} {:>10} {:>10}", "p50", "p90", "p99");
    let c = &r.cold;
    row("paddock", Some(&c.paddock_total));
    row("bwrap (spawn → first output → exit)", c.bwrap_total.as_ref());
    println!("  {:<44} {:>10}", "ratio paddock / bwrap (p50)", times(c.ratio_p50));
    row("paddock, to first output", Some(&c.paddock_first_output));
    row("bwrap, to first output", c.bwrap_first_output.as_ref());
    println!("  {:<44} {:>10}", "ratio paddock / bwrap, first output (p50)", times(c.ratio_first_output_p50));
    row("paddock: create", Some(&c.paddock_create));
    row("paddock: exec → first output", Some(&c.paddock_exec_to_first_output));
    row("paddock: first output → exit reported", Some(&c.paddock_first_output_to_exit));
    row("paddock: destroy", Some(&c.paddock_destroy));
    println!();
    println!("Exec round trip (/bin/true)                          {:>10} {:>10} {:>10}", "p50", "p90", "p99");
    let e = &r.exec;
    row("paddock exec into a running sandbox", Some(&e.paddock_round_trip));
    row("paddock exec, until started", Some(&e.paddock_exec_started));
    row("host fork+exec (no sandbox)", Some(&e.host_fork_exec));
    row("bwrap cold start (no exec-into exists)", e.bwrap_cold_true.as_ref());
    println!("  {:<44} {:>10}", "ratio paddock / host fork+exec (p50)", times(e.ratio_vs_host_p50));
    println!("  {:<44} {:>10}", "ratio paddock / bwrap cold (p50)", times(e.ratio_vs_bwrap_cold_p50));
    println!();
    let m = &r.memory;
    println!(
        "Host memory per idle sandbox ({} held, median of {} rounds) {:>10} {:>10} {:>10} {:>10}",
        m.sandboxes, m.rounds, "PSS", "private", "MemAvail↓", "cgroup"
    );
    let mem_row = |name: &str, s: Option<&MemSide>| match s {
        Some(s) => println!(
            "  {:<44} {:>10} {:>10} {:>10} {:>10}",
            format!("{name} ({:.1} processes each)", s.processes as f64 / m.sandboxes as f64),
            mb(s.pss_bytes_per_sandbox as f64),
            mb(s.private_bytes_per_sandbox as f64),
            mb(s.mem_available_drop_bytes_per_sandbox as f64),
            s.cgroup_charge_bytes_per_sandbox.map_or_else(na, |c| mb(c as f64))
        ),
        None => println!("  {name:<44} {:>10} {:>10} {:>10} {:>10}", na(), na(), na(), na()),
    };
    mem_row("paddock", Some(&m.paddock));
    mem_row("bwrap", m.bwrap.as_ref());
    println!(
        "  {:<44} {:>10} {:>10} {:>10} {:>10}",
        "ratio paddock / bwrap",
        times(m.ratio_pss),
        "",
        times(m.ratio_mem_available),
        times(m.ratio_cgroup_charge)
    );
    println!();
    let d = &r.density;
    println!(
        "Density: {} sandboxes, {} in flight                  {:>10} {:>10}",
        d.count, d.concurrency, "up", "down"
    );
    println!("  {:<44} {:>10} {:>10}", "paddock", secs(d.paddock_up_s), secs(d.paddock_down_s));
    println!(
        "  {:<44} {:>10} {:>10}",
        "bwrap",
        d.bwrap_up_s.map_or_else(na, secs),
        d.bwrap_down_s.map_or_else(na, secs)
    );
    println!("  {:<44} {:>10} {:>10}", "ratio paddock / bwrap", times(d.ratio_up), times(d.ratio_down));
    println!();
    r.cli.print(&row);
    println!();
    if let Some(h) = &r.http {
        h.print(&r.cold, &r.exec);
        println!();
    }
    println!("Aims");
    for a in &r.aims {
        let verdict = match a.hit {
            Some(true) => "HIT",
            Some(false) => "MISS",
            None => "not judged",
        };
        println!("  {:<66} {:<10} {}", a.aim, verdict, a.measured);
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers

fn read_trimmed(path: &str) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_owned())
}

/// Hundreds of bubblewrap children hold pipes; lift the soft open-file limit to the hard one.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        let _ = setrlimit(Resource::Nofile, rustix::process::Rlimit { current: lim.maximum, maximum: lim.maximum });
    }
}

/// Progress on stderr: one updating line on a terminal, a few lines otherwise.
pub(crate) struct Progress {
    label: String,
    total: usize,
    tty: bool,
    next_line: usize,
}

impl Progress {
    pub(crate) fn new(label: &str, total: usize) -> Self {
        let tty = std::io::stderr().is_terminal();
        let p = Self { label: label.to_owned(), total, tty, next_line: total.div_ceil(4).max(1) };
        if tty {
            eprint!("\r{}: 0/{}", p.label, p.total);
        } else {
            eprintln!("{}: 0/{}", p.label, p.total);
        }
        p
    }

    pub(crate) fn tick(&mut self, done: usize) {
        if self.tty {
            eprint!("\r{}: {done}/{}", self.label, self.total);
            if done == self.total {
                eprintln!();
            }
        } else if done == self.total || done >= self.next_line {
            eprintln!("{}: {done}/{}", self.label, self.total);
            self.next_line = done + self.total.div_ceil(4).max(1);
        }
    }
}
