//! Command-line interface: argument definitions and what each command does.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use paddock_core::naming::{NamingMode, ThreadId};
use paddock_core::runtime::{ByteReader, ByteWriter, ExecOutcome, ExecRequest, FileOp, Process, Runtime, SandboxId};
use paddock_core::spec::{NetworkPolicy, SandboxSpec, User, ValidatedSpec, validate_env_name};
use paddock_core::units::{format_duration, parse_bytes, parse_cpus, parse_duration};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

use crate::output;
use paddock_core::units::unix_ms as now_ms;

/// Exit code when Paddock itself fails (as opposed to the command it ran).
pub const ERROR_EXIT: u8 = 125;

#[derive(Debug, Parser)]
#[command(name = "paddock", version, about = "Isolated sandboxes for AI agents, on this machine.")]
pub struct Cli {
    /// Where sandboxes and workspaces are kept.
    #[arg(long, global = true, env = "PADDOCK_DATA_DIR", default_value = "/var/lib/paddock")]
    pub data_dir: PathBuf,
    /// Print machine-readable JSON instead of human output.
    #[arg(long, global = true)]
    pub json: bool,
    /// How thread ids become workspace names: `hashed` (collision-resistant) or `dawn-compat`
    /// (Dawn's exact names, to reattach volumes it created).
    #[arg(long, global = true, env = "PADDOCK_NAMING", default_value = "hashed")]
    pub naming: NamingMode,
    #[command(flatten)]
    pub runtime: crate::runtimes::RuntimeOpts,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses the process's command line, exiting with clap's message on a usage error.
    pub fn parse_command_line() -> Cli {
        Self::parse_args(std::env::args_os().collect()).unwrap_or_else(|e| e.exit())
    }

    fn parse_args(args: Vec<OsString>) -> std::result::Result<Cli, clap::Error> {
        let mut cmd = globals_only_where_used(Self::command(), &args);
        let matches = cmd.try_get_matches_from_mut(args)?;
        Self::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
    }
}

/// Makes the global options global in the given subcommand only. clap copies every global
/// option into every subcommand before it parses (about 30 options into 22 subcommands, 0.7 ms
/// of every command, most of what clap costs); the options stay accepted both before and after
/// the subcommand's name. A command line whose subcommand this cannot tell for sure (help,
/// an unknown option before it) is parsed with the full copy.
fn globals_only_where_used(cmd: clap::Command, args: &[OsString]) -> clap::Command {
    let Some(name) = subcommand_of(&cmd, args) else { return cmd };
    let globals: Vec<clap::Arg> = cmd.get_arguments().filter(|a| a.is_global_set()).cloned().collect();
    // `args` counts the copies in the subcommand's display order, which clap's own copy does
    // not: reset it, so the subcommand's help lists its options in the same order.
    cmd.mut_args(|a| a.global(false)).mut_subcommand(name, |sc| sc.args(globals).next_display_order(0))
}

/// The name of the subcommand `args` (with the program name first) gives, passing over the
/// top level's long options and their values.
fn subcommand_of(cmd: &clap::Command, args: &[OsString]) -> Option<String> {
    let mut rest = args.iter().skip(1).map(|a| a.to_str());
    while let Some(arg) = rest.next() {
        let arg = arg?;
        if arg == "--" {
            return None;
        }
        if let Some(long) = arg.strip_prefix("--") {
            if !long.contains('=')
                && cmd.get_arguments().find(|a| a.get_long() == Some(long))?.get_action().takes_values()
            {
                rest.next()?;
            }
            continue;
        }
        if arg.starts_with('-') {
            return None;
        }
        return cmd.find_subcommand(arg).map(|sc| sc.get_name().to_owned());
    }
    None
}

#[derive(Debug, Subcommand)]
// Only the subcommand given is built: a `run` skips building every other command's arguments.
#[command(defer = true)]
pub enum Command {
    /// Run one command in a new sandbox, stream its output, exit with its exit code, and
    /// remove the sandbox (a --workspace is kept).
    Run {
        #[command(flatten)]
        sandbox: SandboxOpts,
        /// Kill the command's process group after this long (e.g. 30s, 5m); it then exits 124.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
        #[command(flatten)]
        exec: ExecOpts,
    },
    /// Create a long-lived sandbox and print its id.
    Create {
        #[command(flatten)]
        sandbox: SandboxOpts,
        /// Destroy the sandbox automatically after this long (e.g. 1h).
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// List sandboxes.
    #[command(alias = "ps")]
    Ls,
    /// Show one sandbox.
    Inspect { id: String },
    /// Run a command in a running sandbox.
    Exec {
        id: String,
        /// Kill the command's process group after this long; it then exits 124.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
        #[command(flatten)]
        exec: ExecOpts,
    },
    /// Copy a file into or out of a sandbox: `paddock cp ./a ID:/workspace/a` or
    /// `paddock cp ID:/workspace/a ./a`.
    Cp { src: String, dst: String },
    /// Remove sandboxes: kill their processes and delete everything but their workspaces.
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Freeze every process of a sandbox, keeping its memory.
    Pause { id: String },
    /// Let a paused sandbox run again.
    Resume { id: String },
    /// Show what `paddock serve` recorded of a sandbox's entrypoint: its state, why it failed,
    /// and its newest output (up to 64 KiB; a running entrypoint's is at most a few seconds old).
    Logs { id: String },
    /// Serve the HTTP API (OpenSandbox-compatible lifecycle and execd, plus workspaces).
    Serve(Box<crate::serve::ServeArgs>),
    /// Submit, list, follow and cancel runs on a `paddock serve` (its run API).
    Runs(crate::runs_cmd::RunsArgs),
    /// Tenants of `paddock serve`: API keys that each see only their own sandboxes, runs,
    /// workspaces and volumes, with quotas (add, ls, rotate, rm, set, digest).
    #[command(subcommand)]
    Tenant(crate::tenant_cmd::TenantCommand),
    /// How many sandboxes of a size fit on this machine (or one described by flags): the
    /// lesser of four per CPU and its memory less 1 GiB, each sandbox with 32 MiB of runtime
    /// overhead. `paddock serve` admits runs up to this by default (`--capacity`).
    Capacity {
        /// CPUs of the machine (default: this one's).
        #[arg(long)]
        cpus: Option<u32>,
        /// Memory of the machine, e.g. 64GiB (default: this one's).
        #[arg(long, value_parser = parse_bytes)]
        memory: Option<u64>,
        /// Memory of one sandbox.
        #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
        sandbox_memory: u64,
    },
    /// Check that the chosen runtime can run sandboxes here: on Kubernetes, the API, the
    /// namespace, every permission the runtime needs (by SelfSubjectAccessReview), the
    /// RuntimeClass, and a probe that proves NetworkPolicy is enforced. Exit status 0 only
    /// when everything needed passes.
    Check {
        /// Skip the NetworkPolicy enforcement probe (it starts two short-lived Pods).
        #[arg(long)]
        no_probe: bool,
    },
    /// Prove the sandbox boundary from inside a sandbox: a positive control, then everything
    /// that must not answer (API server, cluster DNS, kubelets, host addresses, metadata, the
    /// outside world, another sandbox) and no token, capabilities or root. One line per check;
    /// exit 0 only when all pass, 1 when one fails, 2 when inconclusive.
    Gate {
        /// Probe from this existing sandbox instead of a new one.
        #[arg(long)]
        sandbox: Option<String>,
        #[command(flatten)]
        targets: crate::gate::TargetOptions,
    },
    /// Show a sandbox's egress policy, what it counted and its newest denials; with options,
    /// change the policy of the running sandbox (new connections follow it at once).
    Egress {
        id: String,
        /// Allow TARGET (a domain, *.domain, IP or CIDR; an IP or CIDR may add `ports 22,443`,
        /// and `ports 22` alone means every address on those TCP ports); goes before the
        /// existing rules.
        #[arg(long, value_name = "TARGET")]
        allow: Vec<String>,
        /// Deny TARGET (as --allow takes it); goes before the existing rules.
        #[arg(long, value_name = "TARGET")]
        deny: Vec<String>,
        /// Remove the rules for TARGET.
        #[arg(long, value_name = "TARGET")]
        remove: Vec<String>,
        /// What no rule matches gets: allow or deny.
        #[arg(long = "default", value_name = "ACTION", value_parser = parse_action)]
        default_action: Option<paddock_core::egress::Action>,
    },
    /// A sandbox's credential vault: show it (names, never values), set it whole from a JSON
    /// file (OpenSandbox's `{"credentials": [...], "bindings": [...]}`; `-` reads stdin, so no
    /// value is on a command line), or delete it.
    Vault {
        id: String,
        /// Replace the vault with this file's credentials and bindings.
        #[arg(long, value_name = "FILE", conflicts_with = "delete")]
        set: Option<PathBuf>,
        /// Remove the vault.
        #[arg(long)]
        delete: bool,
    },
    /// Persistent workspaces keyed by an agent's thread id.
    #[command(subcommand)]
    Workspace(WorkspaceCommand),
    /// Named volumes that sandboxes mount with `--volume NAME:/path`: ls, rm.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// OCI images for sandbox roots: pull, ls, rm, prune, import.
    Image(crate::image_cmd::ImageArgs),
    /// Kubernetes: mark workspace PVCs no Pod uses, clear the mark of used ones, and delete
    /// those unused for longer than --ttl (run it from a CronJob).
    ReapPvcs {
        /// How long a PVC may stay unused before it is deleted (e.g. 168h).
        #[arg(long, default_value = "168h", value_parser = parse_duration)]
        ttl: std::time::Duration,
    },
    // `--data-dir` is the global one: subcommands are built on demand, after the globals are
    // given to them, so an argument of their own with a global's name would be a second one.
    #[command(name = "__supervise", hide = true)]
    Supervise {
        #[arg(long)]
        id: String,
    },
    #[command(name = "__egress", hide = true)]
    EgressEnforcer {
        #[arg(long)]
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum WorkspaceCommand {
    /// Return the thread's running sandbox, or create one on its workspace.
    Acquire {
        thread: String,
        #[command(flatten)]
        sandbox: Box<SandboxOpts>,
    },
    /// Stop the thread's sandbox and keep its workspace.
    Release { thread: String },
    /// Stop the thread's sandbox and delete its workspace.
    Rm { thread: String },
    /// Show the on-disk name of a thread's workspace.
    Name { thread: String },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// List the named volumes, their size and the sandboxes that mount them.
    Ls,
    /// Delete a named volume and its files (refused while a sandbox mounts it).
    Rm { name: String },
}

#[derive(Debug, Args)]
pub struct SandboxOpts {
    /// Memory limit, /tmp included (e.g. 256M, 1G).
    #[arg(long, value_parser = parse_bytes)]
    memory: Option<u64>,
    /// CPU quota in CPUs (e.g. 0.5, 2).
    #[arg(long, value_parser = parse_cpus)]
    cpus: Option<u32>,
    /// Most processes and threads at once.
    #[arg(long)]
    pids: Option<u32>,
    /// Size cap of /tmp (e.g. 64M).
    #[arg(long, value_parser = parse_bytes)]
    tmp_size: Option<u64>,
    /// Size cap of /workspace [default: 2G]. Without --workspace it is memory (a tmpfs), so at
    /// most --memory; a persistent workspace is a disk image that keeps the size it was created
    /// with.
    #[arg(long, value_parser = parse_bytes)]
    workspace_size: Option<u64>,
    /// Most files and directories /workspace may hold [default: 262144]; a persistent workspace
    /// keeps the cap it was created with.
    #[arg(long)]
    workspace_inodes: Option<u64>,
    /// Environment variable for every command, NAME=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Mount this thread's persistent workspace at /workspace.
    #[arg(long)]
    workspace: Option<String>,
    /// Use this unpacked root filesystem instead of the host's `/` (read-only either way).
    #[arg(long, conflicts_with = "image")]
    rootfs: Option<PathBuf>,
    /// The image the runtime runs: `host` or a root directory on the local runtime, an image
    /// reference on Kubernetes. The runtime's default when not given.
    #[arg(long)]
    image: Option<String>,
    /// uid:gid to run as inside the sandbox.
    #[arg(long, value_parser = parse_user)]
    user: Option<User>,
    /// Let the sandbox reach TARGET: a domain (`pypi.org`), `*.domain`, an IP, a CIDR, or `*`
    /// for everything (the operator's blocked addresses excepted); an IP or CIDR may add
    /// `ports 22,443` (TCP), and `ports 443` alone means every address on those ports.
    /// Repeatable; without it the sandbox has no network but its own loopback.
    #[arg(long = "allow-net", value_name = "TARGET")]
    allow_net: Vec<String>,
    /// Keep the sandbox from TARGET even where --allow-net would let it (checked first for
    /// names; repeatable).
    #[arg(long = "deny-net", value_name = "TARGET")]
    deny_net: Vec<String>,
    /// Mount a volume: `/host/dir:/path` (a host directory below a --volume-root) or
    /// `NAME[/subdir]:/path` (a named volume, made on first use and kept until `paddock volume
    /// rm`); add `:ro` for read-only. Repeatable.
    #[arg(long = "volume", short = 'v', value_name = "SRC:DEST[:ro]", value_parser = parse_volume)]
    volumes: Vec<VolumeArg>,
    /// Give the sandbox a CA of its own in its trust store, so `paddock vault` may bind https
    /// hosts (their TLS is decrypted by the egress enforcer to add the credentials).
    #[arg(long)]
    credential_proxy: bool,
}

#[derive(Debug, Clone)]
pub struct VolumeArg {
    source: String,
    target: String,
    read_only: bool,
}

fn parse_volume(s: &str) -> Result<VolumeArg, String> {
    let mut parts = s.split(':');
    let (Some(source), Some(target)) = (parts.next(), parts.next()) else {
        return Err(format!("{s:?} is not SRC:DEST[:ro]"));
    };
    let read_only = match parts.next() {
        None | Some("rw") => false,
        Some("ro") => true,
        Some(o) => return Err(format!("{o:?} is not a volume option: say ro or rw")),
    };
    if parts.next().is_some() || source.is_empty() || target.is_empty() {
        return Err(format!("{s:?} is not SRC:DEST[:ro]"));
    }
    Ok(VolumeArg { source: source.into(), target: target.into(), read_only })
}

impl VolumeArg {
    fn mount(&self, i: usize) -> paddock_core::volume::VolumeMount {
        use paddock_core::volume::{VolumeMount, VolumeSource};
        let (source, sub_path) = if self.source.starts_with('/') {
            (VolumeSource::Host { path: self.source.clone() }, None)
        } else {
            let (name, sub) = match self.source.split_once('/') {
                Some((n, s)) => (n, Some(s.to_owned())),
                None => (self.source.as_str(), None),
            };
            (VolumeSource::Named { name: name.into(), create: true, delete_with_sandbox: false, size_bytes: None }, sub)
        };
        VolumeMount {
            name: format!("v{i}"),
            mount_path: self.target.clone(),
            read_only: self.read_only,
            sub_path,
            source,
        }
    }
}

#[derive(Debug, Args)]
pub struct ExecOpts {
    /// Working directory, relative to /workspace unless absolute.
    #[arg(long, short = 'w')]
    cwd: Option<String>,
    /// Pass what is typed at this terminal to the command (piped stdin is always passed).
    #[arg(long, short = 'i')]
    interactive: bool,
    /// Environment variable for this command only, NAME=VALUE (repeatable).
    #[arg(long = "cmd-env", value_parser = parse_env)]
    cmd_env: Vec<(String, String)>,
    /// The command and its arguments, after `--`. `run` without one runs the image's
    /// Entrypoint and Cmd.
    #[arg(last = true, value_name = "CMD")]
    argv: Vec<String>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("{s:?} is not NAME=VALUE"))?;
    validate_env_name(k).map_err(|e| e.message)?;
    Ok((k.to_owned(), v.to_owned()))
}

fn parse_action(s: &str) -> Result<paddock_core::egress::Action, String> {
    match s {
        "allow" => Ok(paddock_core::egress::Action::Allow),
        "deny" => Ok(paddock_core::egress::Action::Deny),
        _ => Err(format!("{s:?} is not an action: say allow or deny")),
    }
}

fn parse_user(s: &str) -> Result<User, String> {
    let (u, g) = s.split_once(':').unwrap_or((s, s));
    let num = |x: &str| x.parse::<u32>().map_err(|_| format!("{s:?} is not uid:gid, e.g. 1000:1000"));
    Ok(User { uid: num(u)?, gid: num(g)? })
}

impl SandboxOpts {
    fn spec(&self, timeout: Option<Duration>) -> Result<(ValidatedSpec, Option<ThreadId>)> {
        let mut spec = SandboxSpec::default();
        let r = &mut spec.resources;
        if let Some(m) = self.memory {
            r.memory_bytes = m;
        }
        if let Some(c) = self.cpus {
            r.millicpus = c;
        }
        if let Some(p) = self.pids {
            r.pids = p;
        }
        if let Some(t) = self.tmp_size {
            r.tmp_bytes = t;
        }
        if let Some(w) = self.workspace_size {
            r.workspace_bytes = Some(w);
        }
        if let Some(i) = self.workspace_inodes {
            r.workspace_inodes = i;
        }
        spec.env = self.env.iter().cloned().collect();
        if let Some(u) = self.user {
            spec.user = u;
        }
        if let Some(root) = &self.rootfs {
            let path = std::path::absolute(root).with_context(|| format!("resolving --rootfs {}", root.display()))?;
            spec.image = Some(path.to_string_lossy().into_owned());
        }
        if let Some(image) = &self.image {
            spec.image = Some(image.clone());
        }
        spec.timeout_secs = timeout.map(|t| t.as_secs().max(1));
        spec.network = self.network()?;
        spec.volumes = self.volumes.iter().enumerate().map(|(i, v)| v.mount(i)).collect();
        spec.credential_proxy = self.credential_proxy;
        // The one check of the spec: the runtime takes it as it is.
        let spec = spec.validated().map_err(|e| anyhow!("--{e}"))?;
        let thread =
            self.workspace.as_deref().map(|t| ThreadId::new(t).map_err(|e| anyhow!("--workspace: {e}"))).transpose()?;
        Ok((spec, thread))
    }
}

impl SandboxOpts {
    /// `--allow-net` / `--deny-net` as a policy: deny rules first, then allow rules, and
    /// `--allow-net '*'` as the default action.
    fn network(&self) -> Result<NetworkPolicy> {
        use paddock_core::egress::{Action, EgressPolicy, EgressRule};
        if self.allow_net.is_empty() {
            return Ok(NetworkPolicy::LoopbackOnly);
        }
        let everything = self.allow_net.iter().any(|t| t == "*");
        let rule =
            |action, flag, words: &String| EgressRule::from_words(action, words).map_err(|e| anyhow!("--{flag}: {e}"));
        let egress = (self.deny_net.iter().map(|t| rule(Action::Deny, "deny-net", t)))
            .chain(self.allow_net.iter().filter(|t| *t != "*").map(|t| rule(Action::Allow, "allow-net", t)))
            .collect::<Result<_>>()?;
        Ok(NetworkPolicy::Egress(EgressPolicy {
            default_action: if everything { Action::Allow } else { Action::Deny },
            egress,
        }))
    }
}

impl ExecOpts {
    fn request(&self, timeout: Option<Duration>) -> ExecRequest {
        ExecRequest {
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            env: self.cmd_env.iter().cloned().collect::<BTreeMap<_, _>>(),
            timeout_ms: timeout.map(paddock_core::units::millis),
            stdin: self.wants_stdin(),
        }
    }

    /// Standard input is passed when it is not a terminal, or with `-i`; never when it is
    /// `/dev/null`, which the command is given anyway when it gets no input (and passing it
    /// would cost a pipe and a thread to read nothing).
    fn wants_stdin(&self) -> bool {
        let stdin = std::io::stdin();
        (self.interactive || !stdin.is_terminal()) && !is_dev_null(&stdin)
    }
}

/// Copies `from` to one of our standard streams as it comes. The write is a plain blocking one
/// on the runtime's thread, not tokio's `stdout()`: that starts a blocking-pool thread at the
/// first write (a clone, and one more thread for our exit to end, on every `run`). A reader
/// that does not keep up holds up this command's relays, as it would any process writing to
/// it, and nothing else.
async fn relay<W: Write>(mut from: ByteReader, sink: fn() -> W) {
    let mut buf = vec![0u8; 64 << 10];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        let mut sink = sink();
        if sink.write_all(&buf[..n]).and_then(|()| sink.flush()).is_err() {
            break;
        }
    }
}

/// Whether `stdin` is `/dev/null` (the character device 1:3).
fn is_dev_null(stdin: &std::io::Stdin) -> bool {
    rustix::fs::fstat(stdin).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::CharacterDevice
            && rustix::fs::major(st.st_rdev) == 1
            && rustix::fs::minor(st.st_rdev) == 3
    })
}

/// Copies a command's output to this process's stdout and stderr, and this process's stdin to
/// the command. The sandbox never receives a descriptor of ours, only pipes: a terminal could
/// be read by a process left behind long after, and a file opened for append (`>> log`) could
/// be truncated or written after this command has exited.
struct Relays(Vec<tokio::task::JoinHandle<()>>);

impl Relays {
    fn start(stdin: Option<ByteWriter>, stdout: ByteReader, stderr: ByteReader) -> Self {
        if let Some(mut to_command) = stdin {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
            // A plain thread, never joined: reading a terminal blocks until the next line, and
            // must not hold up our exit (tokio's stdin would, on the runtime's blocking pool).
            std::thread::spawn(move || {
                let mut stdin = std::io::stdin().lock();
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n @ 1..) = stdin.read(&mut buf) {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                while let Some(chunk) = rx.recv().await {
                    if to_command.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
                let _ = to_command.shutdown().await;
            });
        }
        let out = tokio::spawn(relay(stdout, std::io::stdout));
        let err = tokio::spawn(relay(stderr, std::io::stderr));
        Self(vec![out, err])
    }

    /// Lets the relays finish copying, for at most a moment: a process the command left
    /// running may hold the pipe open for ever.
    async fn finish(self) {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        for relay in self.0 {
            let _ = tokio::time::timeout_at(deadline, relay).await;
        }
    }
}

fn sandbox_id(s: &str) -> Result<SandboxId> {
    Ok(SandboxId::parse(s)?)
}

pub async fn run(cli: Cli) -> Result<u8> {
    if let Command::ReapPvcs { ttl } = cli.command {
        return crate::runtimes::reap_pvcs(&cli.runtime, cli.naming, ttl, cli.json).await;
    }
    if let Command::Check { no_probe } = cli.command {
        return crate::runtimes::check(&cli.runtime, &cli.data_dir, cli.naming, !no_probe, cli.json).await;
    }
    if let Command::Runs(args) = cli.command {
        return crate::runs_cmd::run(args, &cli.data_dir, cli.json);
    }
    if let Command::Tenant(command) = cli.command {
        return crate::tenant_cmd::run(command, &cli.data_dir, cli.json).await;
    }
    if let Command::Capacity { cpus, memory, sandbox_memory } = cli.command {
        use paddock_server::runs::tiers;
        let (here_cpus, here_memory) = tiers::this_machine();
        let (cpus, memory) = (cpus.unwrap_or(here_cpus), memory.unwrap_or(here_memory));
        let b = tiers::bounds(cpus, memory, sandbox_memory);
        let fits = tiers::machine_capacity(cpus, memory, sandbox_memory);
        if cli.json {
            let v = serde_json::json!({"cpus": cpus, "memory": memory, "sandboxMemory": sandbox_memory,
                "overhead": tiers::SANDBOX_OVERHEAD, "hostReserve": tiers::HOST_RESERVE, "bounds": b, "fits": fits});
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            println!(
                "{fits} sandboxes of {} fit: {} by CPU (4 per CPU, {cpus} CPUs), {} by memory ({} less {} for the host, {} each with overhead)",
                paddock_core::units::format_bytes(sandbox_memory),
                b.by_cpu,
                b.by_memory,
                paddock_core::units::format_bytes(memory),
                paddock_core::units::format_bytes(tiers::HOST_RESERVE),
                paddock_core::units::format_bytes(sandbox_memory + tiers::SANDBOX_OVERHEAD),
            );
        }
        return Ok(0);
    }
    if let Command::Image(args) = cli.command {
        let images = cli.runtime.images.options();
        return crate::image_cmd::run(&cli.data_dir, args, images.registries, images.limits, cli.json).await;
    }
    let serving = matches!(cli.command, Command::Serve(_));
    let rt: Arc<dyn Runtime> = crate::runtimes::open(&cli.runtime, &cli.data_dir, cli.naming, serving).await?;
    if let Command::Serve(mut args) = cli.command {
        if let Some(at) = cli.runtime.gateway_address()? {
            args.default_gateway_listen(at);
        }
        args.check_tiers_named(&cli.runtime.priority_tiers()?)?;
        return crate::serve::run(rt, &cli.data_dir, *args).await;
    }
    let json = cli.json;
    let rt = rt.as_ref();
    let naming = cli.naming;
    let prepull = async |spec: &paddock_core::spec::SandboxSpec| {
        crate::runtimes::prepull(&cli.runtime, &cli.data_dir, spec.image.as_deref()).await
    };
    match cli.command {
        Command::Run { sandbox, timeout, exec } => {
            let mut request = exec.request(timeout);
            // Without a command only an image can say what to run.
            if request.argv.is_empty() && sandbox.image.is_none() {
                missing_command("run");
            }
            let (spec, thread) = sandbox.spec(None)?;
            prepull(&spec).await?;
            if !request.argv.is_empty() {
                request.validate()?;
            }
            let before = now_ms();
            let signals = Signals::catch()?;
            let (info, result) = match &thread {
                // A command to start with the sandbox: asked for in one go.
                None if !request.argv.is_empty() => {
                    let (info, process) = rt.create_and_exec(spec, request).await?;
                    let result = match process {
                        Ok(p) => run_to_exit(p, signals).await,
                        Err(e) => Err(e.into()),
                    };
                    (info, result)
                }
                _ => {
                    let info = match &thread {
                        Some(t) => rt.acquire(t, spec).await?,
                        None => rt.create(spec).await?,
                    };
                    if request.argv.is_empty() {
                        request.argv = info.spec.image_command.clone();
                    }
                    let result = if request.argv.is_empty() {
                        Err(anyhow::anyhow!(
                            "no command: the image names none (no Entrypoint or Cmd); give one after --, e.g. `paddock run --image IMAGE -- sh -c 'echo hi'`"
                        ))
                    } else {
                        exec_to_exit(rt, &info.id, request, signals).await
                    };
                    (info, result)
                }
            };
            // A live sandbox of the thread that acquire handed back belongs to whoever made it.
            let ours = info.created_unix_ms >= before;
            // A sandbox we made goes either way; a workspace stays.
            let removed = if ours { rt.destroy(&info.id).await } else { Ok(()) };
            let outcome = result?;
            removed.with_context(|| format!("removing sandbox {}", info.id))?;
            Ok(report_outcome(&outcome, timeout))
        }
        Command::Create { sandbox, timeout } => {
            let (spec, thread) = sandbox.spec(timeout)?;
            prepull(&spec).await?;
            let info = match &thread {
                Some(t) => rt.acquire(t, spec).await?,
                None => rt.create(spec).await?,
            };
            output::created(&info, json);
            Ok(0)
        }
        Command::Gate { sandbox, targets } => {
            crate::gate::run_bounded(rt, sandbox, &targets, json, cli.runtime.gateway_address()?).await
        }
        Command::Ls => {
            output::list(&rt.list().await?, json);
            Ok(0)
        }
        Command::Inspect { id } => {
            output::info(&rt.get(&sandbox_id(&id)?).await?);
            Ok(0)
        }
        Command::Exec { id, timeout, exec } => {
            let request = exec.request(timeout);
            if request.argv.is_empty() {
                missing_command("exec");
            }
            let outcome = exec_to_exit(rt, &sandbox_id(&id)?, request, Signals::catch()?).await?;
            Ok(report_outcome(&outcome, timeout))
        }
        Command::Cp { src, dst } => copy(rt, &src, &dst, json).await,
        Command::Rm { ids } => {
            let mut failed = false;
            for id in ids {
                match async { rt.destroy(&sandbox_id(&id)?).await.map_err(anyhow::Error::from) }.await {
                    Ok(()) => output::line(json, "removed", &id),
                    Err(e) => {
                        eprintln!("paddock: error: {e:#}");
                        failed = true;
                    }
                }
            }
            Ok(if failed { ERROR_EXIT } else { 0 })
        }
        Command::Pause { id } => {
            rt.pause(&sandbox_id(&id)?).await?;
            output::line(json, "paused", &id);
            Ok(0)
        }
        Command::Resume { id } => {
            rt.resume(&sandbox_id(&id)?).await?;
            output::line(json, "resumed", &id);
            Ok(0)
        }
        Command::Logs { id } => logs(rt, &cli.data_dir, &id, json).await,
        Command::Egress { id, allow, deny, remove, default_action } => {
            use paddock_core::egress::{Action, EgressRule};
            let id = sandbox_id(&id)?;
            let mut status = rt.egress(&id).await?;
            if !(allow.is_empty() && deny.is_empty() && remove.is_empty() && default_action.is_none()) {
                let rule = |action, flag, words: &String| {
                    EgressRule::from_words(action, words).map_err(|e| anyhow!("--{flag}: {e}"))
                };
                let rules: Vec<EgressRule> = deny
                    .iter()
                    .map(|t| rule(Action::Deny, "deny", t))
                    .chain(allow.iter().map(|t| rule(Action::Allow, "allow", t)))
                    .collect::<Result<_>>()?;
                let (mut policy, _) = status.policy.patched(&rules).without(&remove);
                if let Some(a) = default_action {
                    policy.default_action = a;
                }
                let policy = policy.validated().map_err(|e| anyhow!("the egress policy: {e}"))?;
                status = rt.set_egress(&id, policy).await?;
            }
            output::egress(&status, json);
            Ok(0)
        }
        Command::Vault { id, set, delete } => {
            let id = sandbox_id(&id)?;
            let mut vault = rt.vault(&id).await?;
            if delete {
                if vault.is_none() {
                    bail!("sandbox {id} has no credential vault");
                }
                rt.set_vault(&id, None).await?;
                vault = None;
            } else if let Some(path) = set {
                let text = if path.as_os_str() == "-" {
                    std::io::read_to_string(std::io::stdin()).context("reading the vault from stdin")?
                } else {
                    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?
                };
                let req: paddock_core::vault::CreateRequest = serde_json::from_str(&text).with_context(|| {
                    format!("{}: not a vault ({{\"credentials\": [...], \"bindings\": [...]}})", path.display())
                })?;
                let policy = rt.egress(&id).await?.policy;
                let next = paddock_core::vault::Vault::replacing(vault.as_ref(), req, &policy)?;
                if next.needs_credential_proxy() && !rt.get(&id).await?.spec.credential_proxy {
                    bail!(
                        "sandbox {id} was made without --credential-proxy, so its https requests cannot be decrypted: bind the hosts over http, or make the sandbox with --credential-proxy"
                    );
                }
                rt.set_vault(&id, Some(next.clone())).await?;
                vault = Some(next);
            }
            output::vault(&id, vault.as_ref(), json);
            Ok(0)
        }
        Command::Workspace(cmd) => workspace(rt, naming, cmd, json).await,
        Command::Volume(VolumeCommand::Ls) => {
            output::volumes(&rt.volumes().await?, json);
            Ok(0)
        }
        Command::Volume(VolumeCommand::Rm { name }) => {
            rt.delete_volume(&name).await?;
            output::line(json, "deleted", &name);
            Ok(0)
        }
        Command::Supervise { .. } | Command::EgressEnforcer { .. } => {
            unreachable!("dispatched in main before the async runtime starts")
        }
        Command::Serve(_)
        | Command::Runs(_)
        | Command::Tenant(_)
        | Command::Capacity { .. }
        | Command::Check { .. }
        | Command::ReapPvcs { .. }
        | Command::Image(_) => {
            unreachable!("handled above")
        }
    }
}

/// `paddock logs ID`: the entrypoint's record from the server's state database on this data
/// directory; only sandboxes created through the API run an entrypoint.
async fn logs(rt: &dyn Runtime, data_dir: &std::path::Path, id: &str, json: bool) -> Result<u8> {
    use paddock_server::time_fmt::rfc3339;
    let sid = sandbox_id(id)?;
    let db = data_dir.join("server.db");
    let no_record = || {
        anyhow!(
            "sandbox {id} has no entrypoint log: only sandboxes created through `paddock serve` (the API) run an entrypoint, and none was recorded for it in {}",
            db.display()
        )
    };
    if !db.exists() {
        rt.get(&sid).await?;
        return Err(no_record());
    }
    let store = paddock_server::store::Store::open(&db)
        .await
        .with_context(|| format!("opening the server's state database {}", db.display()))?;
    let Some(row) = store.get(id).await? else {
        rt.get(&sid).await?;
        return Err(no_record());
    };
    let log = store.entrypoint_log(id).await?;
    let output = log.as_ref().map(|l| String::from_utf8_lossy(&l.tail).into_owned()).unwrap_or_default();
    if json {
        let entrypoint = log.as_ref().map(|l| {
            serde_json::json!({
                "command": l.command, "startedAt": rfc3339(l.started_at_ms),
                "finishedAt": l.finished_at_ms.map(rfc3339), "exitCode": l.exit_code, "error": l.error,
            })
        });
        let value = serde_json::json!({
            "id": row.id, "state": row.state, "reason": row.reason, "message": row.message,
            "entrypoint": entrypoint, "output": output, "truncated": log.as_ref().is_some_and(|l| l.truncated),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(0);
    }
    let mut head = format!("sandbox {}: {}", row.id, row.state);
    if let Some(r) = &row.reason {
        head.push_str(&format!(" ({r})"));
    }
    eprintln!("{head}");
    if let Some(m) = &row.message {
        eprintln!("  {m}");
    }
    match &log {
        Some(l) => {
            let end = match (l.finished_at_ms, &l.error, l.exit_code) {
                (None, _, _) => "still running".to_owned(),
                (Some(at), Some(e), _) => format!("ended {}: {e}", rfc3339(at)),
                (Some(at), None, code) => format!("ended {}: exit status {}", rfc3339(at), code.unwrap_or(0)),
            };
            eprintln!("  entrypoint `{}`, started {}, {end}", l.command, rfc3339(l.started_at_ms));
            if l.truncated {
                eprintln!("  (older output was dropped; the newest is below)");
            }
        }
        None => eprintln!("  no entrypoint output recorded"),
    }
    // The output itself goes to stdout, so it can be piped.
    print!("{output}");
    std::io::stdout().flush()?;
    Ok(0)
}

async fn workspace(rt: &dyn Runtime, naming: NamingMode, cmd: WorkspaceCommand, json: bool) -> Result<u8> {
    let thread = |t: &str| ThreadId::new(t).map_err(|e| anyhow!("{e}"));
    match cmd {
        WorkspaceCommand::Acquire { thread: t, sandbox } => {
            if sandbox.workspace.is_some() {
                bail!("pass the thread id as the argument, not with --workspace");
            }
            let (spec, _) = sandbox.spec(None)?;
            let info = rt.acquire(&thread(&t)?, spec).await?;
            output::created(&info, json);
        }
        WorkspaceCommand::Release { thread: t } => {
            rt.release(&thread(&t)?).await?;
            output::line(json, "released", &t);
        }
        WorkspaceCommand::Rm { thread: t } => {
            rt.destroy_workspace(&thread(&t)?).await?;
            output::line(json, "removed", &t);
        }
        WorkspaceCommand::Name { thread: t } => {
            let name = paddock_core::naming::resource_name(&thread(&t)?, naming);
            output::line(json, "name", &name);
        }
    }
    Ok(0)
}

/// A usage error as clap reports a missing argument (exit 2): `run` without a command needs
/// an `--image` whose Entrypoint or Cmd says what to run, `exec` always needs one.
fn missing_command(subcommand: &str) -> ! {
    let mut cli = Cli::command();
    // Names the subcommands `paddock run`, `paddock exec` in the usage line.
    cli.build();
    let message = "the following required arguments were not provided:\n  -- <CMD>...";
    let err = match cli.find_subcommand_mut(subcommand) {
        Some(sub) => sub.error(clap::error::ErrorKind::MissingRequiredArgument, message),
        None => cli.error(clap::error::ErrorKind::MissingRequiredArgument, message),
    };
    err.exit()
}

/// The terminal's signals, caught from before a command starts so that none that arrives
/// meanwhile ends this process instead of reaching the command.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn catch() -> Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

async fn exec_to_exit(rt: &dyn Runtime, id: &SandboxId, request: ExecRequest, signals: Signals) -> Result<ExecOutcome> {
    run_to_exit(rt.exec(id, request).await?, signals).await
}

/// Runs a started command to its end, relaying its standard streams and forwarding SIGINT,
/// SIGTERM and SIGHUP to it.
async fn run_to_exit(process: Process, mut signals: Signals) -> Result<ExecOutcome> {
    let Process { stdin, stdout, stderr, control: mut exec } = process;
    let relays = Relays::start(stdin, stdout, stderr);
    let outcome = loop {
        let forward = tokio::select! {
            outcome = exec.wait() => break outcome,
            _ = signals.int.recv() => SignalKind::interrupt(),
            _ = signals.term.recv() => SignalKind::terminate(),
            _ = signals.hup.recv() => SignalKind::hangup(),
        };
        exec.signal(forward.as_raw_value()).await?;
    };
    relays.finish().await;
    Ok(outcome?)
}

fn report_outcome(outcome: &ExecOutcome, timeout: Option<Duration>) -> u8 {
    if outcome.timed_out {
        let after = timeout.map(format_duration).unwrap_or_default();
        eprintln!(
            "paddock: command timed out after {after}; its process group was killed (exit 124). Raise --timeout if it needs longer."
        );
    } else if outcome.oom_killed {
        eprintln!(
            "paddock: command was killed for exceeding the sandbox's memory limit; raise --memory if it needs more."
        );
    }
    u8::try_from(outcome.exit_code.clamp(0, 255)).unwrap_or(u8::MAX)
}

/// `ID:/path` names a path in a sandbox; anything else is a local path.
fn split_remote(s: &str) -> Option<(&str, &str)> {
    let (id, path) = s.split_once(':')?;
    SandboxId::parse(id).ok().map(|_| (id, path))
}

async fn copy(rt: &dyn Runtime, src: &str, dst: &str, json: bool) -> Result<u8> {
    match (split_remote(src), split_remote(dst)) {
        (None, Some((id, path))) => {
            let id = sandbox_id(id)?;
            let file = tokio::fs::File::open(src).await.with_context(|| format!("opening {src}"))?;
            let meta = file.metadata().await.with_context(|| format!("reading {src}"))?;
            if !meta.is_file() {
                bail!("{src} is not a regular file: only regular files can be copied");
            }
            let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
            rt.write_file(&id, path, Some(mode), Box::new(file)).await?;
            let reply = rt.file(&id, FileOp::Stat { path: path.to_owned() }).await?;
            output::file_reply(&reply, json);
        }
        (Some((id, path)), None) => {
            // Download next to the target and rename on success, so a failed copy never
            // clobbers an existing file.
            let target = std::path::absolute(dst).with_context(|| format!("resolving {dst}"))?;
            let dir = target.parent().unwrap_or(std::path::Path::new("/"));
            let mut partial =
                tempfile::NamedTempFile::new_in(dir).with_context(|| format!("writing into {}", dir.display()))?;
            let id = sandbox_id(id)?;
            let mut reader = rt.read_file(&id, path).await?;
            let mut out = tokio::fs::File::from_std(partial.as_file().try_clone()?);
            tokio::io::copy(&mut reader, &mut out).await.with_context(|| format!("copying {src} to {dst}"))?;
            out.flush().await?;
            partial.as_file_mut().flush()?;
            partial.persist(&target).with_context(|| format!("writing {dst}"))?;
            let reply = rt.file(&id, FileOp::Stat { path: path.to_owned() }).await?;
            output::file_reply(&reply, json);
        }
        (Some(_), Some(_)) => bail!("copying between two sandboxes is not supported: copy to a local file first"),
        (None, None) => bail!("neither {src:?} nor {dst:?} names a sandbox path: write one as SANDBOX_ID:/path"),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    fn argv(line: &str) -> Vec<std::ffi::OsString> {
        std::iter::once("paddock").chain(line.split_whitespace()).map(Into::into).collect()
    }

    #[test]
    fn the_subcommand_is_found_past_the_top_level_options() {
        let cmd = super::Cli::command();
        let found = |line: &str| super::subcommand_of(&cmd, &argv(line));
        assert_eq!(found("run -- echo x").as_deref(), Some("run"));
        assert_eq!(found("--json --data-dir /d ps").as_deref(), Some("ls"));
        // An option's value is not a subcommand, even when it is named like one.
        assert_eq!(found("--namespace run create").as_deref(), Some("create"));
        assert_eq!(found("--data-dir=/d exec sbx-1 -- run").as_deref(), Some("exec"));
        for unsure in ["", "--help", "-h", "--no-such-option run", "--namespace", "help run", "-- run", "nope"] {
            assert_eq!(found(unsure), None, "{unsure:?}");
        }
    }

    /// Global options made global only in the given subcommand parse as when clap copies
    /// them into every subcommand: before or after the subcommand's name, in nested
    /// subcommands, and with the same errors.
    #[test]
    fn global_options_parse_the_same_given_before_or_after_the_subcommand() {
        let lines = [
            "run -- echo x",
            "--runtime kubernetes --namespace a run --image python:3.11 -- python3 -V",
            "run --runtime kubernetes --namespace a --json -- echo --namespace b",
            "--namespace a run --namespace b -- true",
            "--data-dir /d ps --json",
            "workspace acquire thread-1 --namespace a --data-dir /d",
            "--json image ls --data-dir /d",
            "exec sbx-1 --timeout 5s --namespace a -- ls",
            "serve --runtime kubernetes --listen 127.0.0.1:0",
            "rm",
            "run --namespace",
            "run --no-such-option -- x",
            "--runtime nope run -- x",
            "run --help",
            "--json create --help",
            "workspace acquire --help",
            "image pull --help",
        ];
        for line in lines {
            let full = super::Cli::try_parse_from(argv(line));
            let narrowed = super::Cli::parse_args(argv(line));
            match (full, narrowed) {
                (Ok(full), Ok(narrowed)) => assert_eq!(format!("{full:?}"), format!("{narrowed:?}"), "{line}"),
                (Err(full), Err(narrowed)) => {
                    assert_eq!(full.kind(), narrowed.kind(), "{line}");
                    assert_eq!(full.to_string(), narrowed.to_string(), "{line}");
                }
                (full, narrowed) => panic!("{line}: {full:?} but {narrowed:?}"),
            }
        }
        let given = super::Cli::parse_args(argv("run --runtime kubernetes --namespace a -- true")).unwrap();
        assert_eq!(given.runtime.kube.namespace, "a");
    }

    #[test]
    fn user_namespaces_are_refused_under_gvisor_and_kept_under_other_classes() {
        let kube = |flags: &str| {
            let line = format!("serve --runtime kubernetes --runtime-class c {flags}");
            super::Cli::try_parse_from(argv(&line)).unwrap().runtime.kube
        };
        let err =
            kube("--isolation gvisor --user-namespaces").config(paddock_core::naming::NamingMode::Hashed).unwrap_err();
        assert!(err.to_string().contains("gVisor Pods keep host users"), "{err}");
        assert!(!kube("--isolation gvisor").config(paddock_core::naming::NamingMode::Hashed).unwrap().host_users_false);
        assert!(
            kube("--isolation kata --user-namespaces")
                .config(paddock_core::naming::NamingMode::Hashed)
                .unwrap()
                .host_users_false
        );
    }

    #[test]
    fn a_subcommands_help_lists_the_global_options() {
        let err = super::Cli::parse_args(argv("run --help")).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
        assert!(err.to_string().contains("--namespace"), "{err}");
    }

    /// Subcommands are built only when given (`defer`): the help of each must still be the
    /// one its variant's doc comment gives, not a doc comment of the struct behind it.
    #[test]
    fn every_subcommand_keeps_its_own_summary_when_built_on_demand() {
        let mut cli = super::Cli::command();
        cli.build();
        let about = |name: &str| {
            let sub = cli.find_subcommand(name).unwrap_or_else(|| panic!("no subcommand {name}"));
            sub.get_about().map(|a| a.to_string()).unwrap_or_default()
        };
        assert_eq!(about("image"), "OCI images for sandbox roots: pull, ls, rm, prune, import");
        assert!(cli.find_subcommand("bench").is_none(), "the benchmark is its own binary, paddock-bench");
        assert_eq!(about("serve"), "Serve the HTTP API (OpenSandbox-compatible lifecycle and execd, plus workspaces)");
        for sub in cli.get_subcommands() {
            let text = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            assert!(sub.is_hide_set() || !text.is_empty() && !text.starts_with('`'), "{}: {text:?}", sub.get_name());
            // Every subcommand still takes the runtime options the top level declares global.
            if sub.get_name() != "help" {
                assert!(sub.get_arguments().any(|a| a.get_id() == "namespace"), "{}", sub.get_name());
            }
        }
    }
}
