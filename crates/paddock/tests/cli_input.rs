//! The real `paddock` binary: bad input fails with a non-zero exit and a clear error that says
//! what to do, and leaves no sandbox behind; the main commands work end to end.

mod common;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{EXE, require_root};
use paddock_core::runtime::{SandboxId, SandboxInfo, SandboxState};
use tokio::io::AsyncWriteExt;

/// Our own errors exit with this; clap's usage errors with 2.
const ERROR_EXIT: i32 = 125;
const USAGE_EXIT: i32 = 2;
const PIDS_CGROUP: &str = "/sys/fs/cgroup/pids/paddock";

#[derive(Debug)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// The CLI with a data directory of its own; whatever a failed test left is removed on drop.
struct Cli {
    dir: tempfile::TempDir,
}

impl Cli {
    fn new() -> Self {
        require_root();
        let dir = tempfile::Builder::new().prefix("pdc").tempdir_in("/tmp").expect("temp dir");
        Self { dir }
    }

    fn data(&self) -> &Path {
        self.dir.path()
    }

    fn command<S: AsRef<OsStr>>(&self, args: &[S]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(EXE);
        c.args(args)
            .env_clear()
            .env("PADDOCK_DATA_DIR", self.data())
            // Relative paths in arguments resolve here, where nothing but our state exists.
            .current_dir(self.data())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    }

    async fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> Out {
        let child = self.command(args).spawn().expect("starting paddock");
        finish(child, args).await
    }

    async fn run_with_stdin<S: AsRef<OsStr>>(&self, args: &[S], input: Vec<u8>) -> Out {
        let mut child = self.command(args).stdin(Stdio::piped()).spawn().expect("starting paddock");
        let mut stdin = child.stdin.take().expect("piped stdin");
        let feeder = tokio::spawn(async move {
            stdin.write_all(&input).await.expect("feeding stdin");
            // Dropping stdin closes it: the command reads end-of-file.
        });
        let out = finish(child, args).await;
        feeder.await.expect("stdin feeder");
        out
    }

    fn entries(&self, sub: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.data().join(sub))
            .map(|rd| rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// No sandbox state in our data directory, and no cgroup of ours added since `before`.
    fn assert_nothing_left(&self, before: &BTreeSet<String>, what: &str) {
        assert_eq!(self.entries("sandboxes"), Vec::<String>::new(), "{what}: a sandbox was left behind");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Other tests create sandboxes concurrently: a new cgroup is ours unless its
            // sandbox belongs to another data directory. Ours must be gone by now; allow
            // others' short-lived ones to finish.
            let suspects: Vec<String> = paddock_cgroups()
                .difference(before)
                .filter(|id| supervisor_data_dir(id).is_none_or(|d| Some(d) == self.data().canonicalize().ok()))
                .cloned()
                .collect();
            if suspects.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: cgroups left behind: {suspects:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs bad input that Paddock itself rejects: exit 125, exactly one line on stderr that
    /// contains every word, nothing on stdout, nothing created.
    async fn rejects<S: AsRef<OsStr> + std::fmt::Debug>(&self, args: &[S], words: &[&str]) -> Out {
        let before = paddock_cgroups();
        let workspaces = self.entries("workspaces");
        let out = self.run(args).await;
        let what = format!("paddock {args:?}");
        assert_eq!(out.code, ERROR_EXIT, "{what}: {out:?}");
        assert_eq!(out.stdout, "", "{what}");
        assert!(out.stderr.starts_with("paddock: error: "), "{what}: {:?}", out.stderr);
        assert!(out.stderr.ends_with('\n'), "{what}: {:?}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "{what}: the error is not one line: {:?}", out.stderr);
        for w in words {
            assert!(out.stderr.contains(w), "{what}: the error lacks {w:?}: {:?}", out.stderr);
        }
        self.assert_nothing_left(&before, &what);
        assert_eq!(self.entries("workspaces"), workspaces, "{what}: a workspace was created");
        out
    }

    /// Runs arguments clap rejects: exit 2, every word on stderr, nothing created.
    async fn usage_error<S: AsRef<OsStr> + std::fmt::Debug>(&self, args: &[S], words: &[&str]) -> Out {
        let before = paddock_cgroups();
        let workspaces = self.entries("workspaces");
        let out = self.run(args).await;
        let what = format!("paddock {args:?}");
        assert_eq!(out.code, USAGE_EXIT, "{what}: {out:?}");
        assert_eq!(out.stdout, "", "{what}");
        for w in words {
            assert!(out.stderr.contains(w), "{what}: the error lacks {w:?}: {:?}", out.stderr);
        }
        self.assert_nothing_left(&before, &what);
        assert_eq!(self.entries("workspaces"), workspaces, "{what}: a workspace was created");
        out
    }

    /// Runs a command that must succeed, returning its stdout.
    async fn ok<S: AsRef<OsStr> + std::fmt::Debug>(&self, args: &[S]) -> String {
        let out = self.run(args).await;
        assert_eq!(out.code, 0, "paddock {args:?}: {out:?}");
        out.stdout
    }
}

impl Cli {
    /// Runs `paddock ARGS` the way a shell or an agent framework starts it: through python3's
    /// `subprocess`, which passes stdio only, with `var` added to the environment; with
    /// `extra_fd`, one more descriptor is passed too: the file `extra_fd` opened read-only.
    async fn via_python(&self, args: &[&str], var: (&str, &str), extra_fd: Option<&Path>) -> Out {
        let script = "import os, subprocess, sys\n\
                      fds = [os.open(sys.argv[1], os.O_RDONLY)] if sys.argv[1] != '-' else []\n\
                      sys.exit(subprocess.run(sys.argv[2:], pass_fds=fds).returncode)";
        let extra = extra_fd.map_or("-".to_owned(), |p| p.display().to_string());
        let mut argv: Vec<&str> = vec!["-c", script, &extra, EXE];
        argv.extend_from_slice(args);
        let mut c = tokio::process::Command::new("python3");
        c.args(&argv)
            .env_clear()
            .env("PADDOCK_DATA_DIR", self.data())
            .env("PATH", "/usr/bin:/bin")
            .env(var.0, var.1)
            .current_dir(self.data())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        finish(c.spawn().expect("starting python3"), args).await
    }
}

/// The host pid of sandbox `id`'s supervisor, from its record.
fn supervisor_pid(data: &Path, id: &str) -> u32 {
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("sandboxes").join(id).join("record.json")).unwrap()).unwrap();
    u32::try_from(record["supervisor_pid"].as_u64().unwrap()).unwrap()
}

/// Whether `needle` is anywhere in the readable memory of process `pid`.
fn memory_holds(pid: u32, needle: &[u8]) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    maps.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(range), Some(perms)) = (fields.first(), fields.get(1)) else { return false };
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            return false;
        }
        let (start, end) = range.split_once('-').unwrap();
        let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
        let mut buf = vec![0u8; usize::try_from(end - start).unwrap()];
        mem.seek(SeekFrom::Start(start)).is_ok()
            && mem.read_exact(&mut buf).is_ok()
            && buf.windows(needle.len()).any(|w| w == needle)
    })
}

impl Drop for Cli {
    fn drop(&mut self) {
        for id in self.entries("sandboxes") {
            let _ = std::process::Command::new(EXE)
                .args(["rm", &id])
                .env_clear()
                .env("PADDOCK_DATA_DIR", self.data())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

async fn finish<S: AsRef<OsStr>>(child: tokio::process::Child, args: &[S]) -> Out {
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .unwrap_or_else(|_| {
            panic!("paddock {:?} did not finish in 2 minutes", args.iter().map(|a| a.as_ref()).collect::<Vec<_>>())
        })
        .expect("waiting for paddock");
    Out {
        code: out.status.code().expect("paddock was killed by a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn paddock_cgroups() -> BTreeSet<String> {
    std::fs::read_dir(PIDS_CGROUP)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sbx-"))
                .collect()
        })
        .unwrap_or_default()
}

/// The data directory holding sandbox `id`, if one does: any registered with this host.
/// (Supervisors forked by a launcher do not carry `--id` on their command line, so the
/// registry, not the process list, tells whose a sandbox is.)
fn supervisor_data_dir(id: &str) -> Option<PathBuf> {
    let registry = std::path::Path::new(paddock_runtime_local::registry::REGISTRY);
    paddock_runtime_local::registry::read(registry).into_iter().find(|d| d.join("sandboxes").join(id).is_dir())
}

fn long_thread(len: usize) -> String {
    "t".repeat(len)
}

#[tokio::test]
async fn a_spec_larger_than_a_pipe_holds_reaches_a_launched_supervisor_whole() {
    let cli = Cli::new();
    // The spec is put in the supervisor's pipe before the launcher forks it, as much as fits
    // (64 KiB at most); the rest must follow once it runs. Two 100 000-byte variables make a
    // spec of about 200 KiB.
    let (a, b) = (format!("A={}", "a".repeat(100_000)), format!("B={}", "b".repeat(100_000)));
    let out = cli.via_python(&["create", "--env", &a, "--env", &b], ("PADDOCK_TEST_UNUSED", "x"), None).await;
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.stdout.trim().to_owned();
    // Launched, not exec'd: the path that writes the spec early.
    let supervisor = supervisor_pid(cli.data(), &id);
    let cmdline = std::fs::read(format!("/proc/{supervisor}/cmdline")).unwrap();
    assert_eq!(String::from_utf8_lossy(&cmdline).trim_end_matches('\0'), "paddock __launcher");
    let out = cli.run(&["exec", &id, "--", "sh", "-c", "echo ${#A} ${#B} ${A%%a*}${B%%b*}end"]).await;
    assert_eq!(out.stdout.trim(), "100000 100000 end", "{out:?}");
    cli.ok(&["rm", &id]).await;
}

#[tokio::test]
async fn a_cli_create_forks_its_supervisor_from_a_launcher_that_kept_nothing_of_the_caller() {
    let cli = Cli::new();
    let secret = ("PADDOCK_TEST_CALLER_SECRET", "caller-secret-7f3a9e01");
    // An argument the local runtime passes to no one (`--namespace` is the Kubernetes one's).
    // Long enough that the allocator's bookkeeping in a freed copy's first bytes leaves most
    // of it, which is what is looked for.
    let argument = "caller-argument-2718281828459045235360287471352662497757247093699959574966";
    let out = cli.via_python(&["create", "--namespace", argument], secret, None).await;
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.stdout.trim().to_owned();
    let supervisor = supervisor_pid(cli.data(), &id);
    // Forked from the launcher `main` forked: the launcher's title for a command line, none of
    // the caller's arguments, no environment, and the caller's secret nowhere in its memory.
    assert!(!memory_holds(supervisor, secret.1.as_bytes()), "the caller's environment is in the supervisor's memory");
    assert!(
        !memory_holds(supervisor, &argument.as_bytes()[24..]),
        "the caller's arguments are in the supervisor's memory"
    );
    let cmdline = std::fs::read(format!("/proc/{supervisor}/cmdline")).unwrap();
    assert_eq!(String::from_utf8_lossy(&cmdline).trim_end_matches('\0'), "paddock __launcher");
    let environ = std::fs::read(format!("/proc/{supervisor}/environ")).unwrap();
    assert!(environ.iter().all(|b| *b == 0), "{:?}", String::from_utf8_lossy(&environ));
    // The sandbox runs as before, and its pid 1 shows no host path.
    let out = cli
        .run(&[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "id -u; echo \"[$PADDOCK_TEST_CALLER_SECRET]\"; tr '\\0' ' ' < /proc/1/cmdline",
        ])
        .await;
    let lines: Vec<&str> = out.stdout.lines().map(str::trim_end).collect();
    assert_eq!(lines, ["1000", "[]", "paddock __launcher"], "{out:?}");
    cli.ok(&["rm", &id]).await;

    // A caller that passes a descriptor beyond stdio gets an exec'd supervisor, as before (a
    // launcher forked then would hold that descriptor), which the descriptor does not reach.
    let marker = cli.data().join("passed-descriptor");
    std::fs::write(&marker, "x").unwrap();
    let out = cli.via_python(&["create"], secret, Some(&marker)).await;
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.stdout.trim().to_owned();
    let supervisor = supervisor_pid(cli.data(), &id);
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{supervisor}/cmdline")).unwrap()).into_owned();
    assert!(cmdline.contains("__supervise"), "{cmdline:?}");
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{supervisor}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    assert!(!fds.iter().any(|f| f == &marker.display().to_string()), "{fds:?}");
    assert!(!memory_holds(supervisor, secret.1.as_bytes()), "the caller's environment is in the supervisor's memory");
    assert_eq!(cli.run(&["exec", &id, "--", "id", "-u"]).await.stdout, "1000\n");
    cli.ok(&["rm", &id]).await;
}

// --- Bad input ------------------------------------------------------------------------------

#[tokio::test]
async fn unknown_options_are_usage_errors() {
    let cli = Cli::new();
    cli.usage_error(&["--bogus", "ls"], &["unexpected argument", "--bogus", "--help"]).await;
    cli.usage_error(&["run", "--bogus", "--", "true"], &["unexpected argument", "--bogus"]).await;
    cli.usage_error(&["frobnicate"], &["unrecognized subcommand", "frobnicate"]).await;
    // The positive case: the same data directory works.
    assert_eq!(cli.ok(&["--json", "ls"]).await.trim(), "[]");
}

#[tokio::test]
async fn run_without_a_command_is_refused() {
    let cli = Cli::new();
    cli.usage_error(&["run"], &["required", "<CMD>"]).await;
    cli.usage_error(&["run", "--"], &["required", "<CMD>"]).await;
    cli.usage_error(&["run", "true"], &["unexpected argument", "--"]).await;
    cli.rejects(&["run", "--", ""], &["no command given", "pass the program"]).await;
    cli.usage_error(&["exec", "sbx-000000000000"], &["required", "<CMD>"]).await;
}

#[tokio::test]
async fn invalid_thread_ids_are_refused() {
    let cli = Cli::new();
    let too_long = long_thread(513);
    let cases: [(&str, &[&str]); 5] = [
        ("", &["thread id is empty", "pass a non-empty id"]),
        (&too_long, &["513 bytes", "512-byte limit", "pass a shorter id"]),
        ("a\nb", &["control character at byte 1", "remove newlines"]),
        ("a\u{1}b", &["control character at byte 1", "remove"]),
        ("tab\there", &["control character at byte 3"]),
    ];
    for (thread, words) in cases {
        let out = cli.rejects(&["run", "--workspace", thread, "--", "true"], words).await;
        assert!(out.stderr.contains("--workspace"), "{out:?}");
        cli.rejects(&["create", "--workspace", thread], words).await;
        for sub in ["acquire", "release", "rm", "name"] {
            let out = cli.rejects(&["workspace", sub, thread], words).await;
            assert!(out.stderr.contains("thread id"), "{out:?}");
        }
    }
    // The positive case at the limit: 512 bytes, and any printable text, are fine.
    for thread in [long_thread(512), "thread/ü 1".to_owned()] {
        let name = cli.ok(&["workspace", "name", &thread]).await;
        assert_eq!(name.lines().count(), 1, "{name:?}");
        assert!(name.len() <= 64 && name.is_ascii(), "{name:?}");
    }
    assert_eq!(cli.entries("sandboxes"), Vec::<String>::new());
}

#[tokio::test]
async fn a_thread_id_may_not_also_be_given_with_workspace() {
    let cli = Cli::new();
    cli.rejects(&["workspace", "acquire", "t1", "--workspace", "t2"], &["not with --workspace"]).await;
}

#[tokio::test]
async fn invalid_memory_is_refused() {
    let cli = Cli::new();
    cli.usage_error(&["run", "--memory", "0", "--", "true"], &["--memory", "zero", "512M"]).await;
    // clap takes `-1` for an option; either way it is refused and named.
    cli.usage_error(&["run", "--memory", "-1", "--", "true"], &["-1"]).await;
    cli.usage_error(&["run", "--memory=-1", "--", "true"], &["--memory", "negative", "512M"]).await;
    cli.rejects(&["run", "--memory", "1", "--", "true"], &["--memory", "1B", "too little", "at least 16MiB"]).await;
    cli.rejects(&["create", "--memory", "15M"], &["--memory", "at least 16MiB"]).await;
    cli.usage_error(&["run", "--memory", "5X", "--", "true"], &["--memory", "unknown unit", "\"X\"", "512M"]).await;
    cli.usage_error(&["run", "--tmp-size", "0", "--", "true"], &["--tmp-size", "zero"]).await;
    cli.rejects(&["run", "--tmp-size", "1K", "--", "true"], &["--tmp", "at least 1MiB"]).await;
}

#[tokio::test]
async fn invalid_pids_cpus_and_timeouts_are_refused() {
    let cli = Cli::new();
    for pids in ["100000", "0", "7"] {
        cli.rejects(&["run", "--pids", pids, "--", "true"], &["--pids", pids, "between 8 and 16384"]).await;
    }
    cli.usage_error(&["run", "--pids", "-5", "--", "true"], &["-5"]).await;
    cli.usage_error(&["run", "--pids", "many", "--", "true"], &["--pids", "many"]).await;
    cli.usage_error(&["run", "--cpus", "0", "--", "true"], &["--cpus", "zero", "0.5"]).await;
    cli.usage_error(&["run", "--cpus", "abc", "--", "true"], &["--cpus", "\"abc\"", "not valid", "0.5"]).await;
    cli.usage_error(&["run", "--cpus", "2000", "--", "true"], &["--cpus", "0.01..=1024"]).await;
    cli.usage_error(&["run", "--timeout", "0", "--", "true"], &["--timeout", "zero", "1m30s"]).await;
    cli.usage_error(&["create", "--timeout", "0"], &["--timeout", "zero"]).await;
    cli.usage_error(&["run", "--timeout", "5d", "--", "true"], &["--timeout", "unknown unit"]).await;
    cli.rejects(&["create", "--timeout", "400000h"], &["--timeout", "longer than a year"]).await;
}

#[tokio::test]
async fn invalid_env_and_user_are_refused() {
    let cli = Cli::new();
    cli.usage_error(&["run", "--env", "1BAD=x", "--", "true"], &["--env", "\"1BAD\"", "not a valid variable name"])
        .await;
    cli.usage_error(&["run", "-e", "A-B=x", "--", "true"], &["\"A-B\"", "letters, digits and _"]).await;
    cli.usage_error(&["run", "--env", "NOEQUALS", "--", "true"], &["NAME=VALUE"]).await;
    cli.usage_error(&["run", "--cmd-env", "1X=y", "--", "true"], &["--cmd-env", "not a valid variable name"]).await;
    cli.rejects(&["run", "--user", "0:0", "--", "true"], &["--user", "root", "non-zero uid and gid", "1000:1000"])
        .await;
    cli.rejects(&["run", "--user", "0", "--", "true"], &["--user", "root"]).await;
    cli.rejects(&["create", "--user", "1000:0"], &["--user", "root"]).await;
    cli.usage_error(&["run", "--user", "abc", "--", "true"], &["--user", "uid:gid", "1000:1000"]).await;
}

#[tokio::test]
async fn invalid_root_filesystems_are_refused() {
    let cli = Cli::new();
    // A relative path resolves against the working directory (our data directory here), where
    // it does not exist.
    let resolved = cli.data().join("relative/dir");
    cli.rejects(&["run", "--rootfs", "relative/dir", "--", "true"], &[resolved.to_str().unwrap(), "not a directory"])
        .await;
    cli.rejects(&["run", "--rootfs", "/nonexistent", "--", "true"], &["/nonexistent", "not a directory", "unpacked"])
        .await;
    cli.rejects(&["create", "--rootfs", "/etc/hostname"], &["/etc/hostname", "not a directory"]).await;
}

#[tokio::test]
async fn commands_on_missing_or_malformed_sandbox_ids_fail() {
    let cli = Cli::new();
    let missing = "sbx-000000000000";
    let not_found: &[&str] = &["no sandbox sbx-000000000000", "paddock ls"];
    cli.rejects(&["exec", missing, "--", "true"], not_found).await;
    cli.rejects(&["inspect", missing], not_found).await;
    cli.rejects(&["rm", missing], not_found).await;
    cli.rejects(&["pause", missing], not_found).await;
    cli.rejects(&["resume", missing], not_found).await;
    let malformed: &[&str] = &["\"../etc\" is not a sandbox id", "sbx-0123456789ab"];
    cli.rejects(&["exec", "../etc", "--", "true"], malformed).await;
    cli.rejects(&["inspect", "../etc"], malformed).await;
    cli.rejects(&["rm", "../etc"], malformed).await;
    cli.rejects(&["inspect", "SBX-ABC"], &["is not a sandbox id"]).await;
    // Removing several reports each failure on its own line and still fails.
    let out = cli.run(&["rm", missing, "../etc"]).await;
    assert_eq!(out.code, ERROR_EXIT, "{out:?}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(lines[0].contains("no sandbox") && lines[1].contains("not a sandbox id"), "{out:?}");
    assert_eq!(cli.entries("sandboxes"), Vec::<String>::new());
    cli.usage_error(&["rm"], &["required"]).await;
}

#[tokio::test]
async fn cp_needs_exactly_one_sandbox_side() {
    let cli = Cli::new();
    std::fs::write(cli.data().join("local.txt"), "local").unwrap();
    cli.rejects(&["cp", "a", "b"], &["neither \"a\" nor \"b\" names a sandbox path", "SANDBOX_ID:/path"]).await;
    cli.rejects(&["cp", "local.txt", "/tmp/elsewhere"], &["neither", "SANDBOX_ID:/path"]).await;
    cli.rejects(&["cp", "../etc:/x", "local.txt"], &["neither", "SANDBOX_ID:/path"]).await;
    cli.rejects(&["cp", "sbx-000000000000:/a", "sbx-000000000001:/b"], &["between two sandboxes", "local file first"])
        .await;
    cli.rejects(&["cp", "local.txt", "sbx-000000000000:/workspace/x"], &["no sandbox sbx-000000000000"]).await;
    cli.rejects(&["cp", "missing.txt", "sbx-000000000000:/workspace/x"], &["missing.txt"]).await;
    cli.usage_error(&["cp", "a"], &["required"]).await;
    assert_eq!(std::fs::read_to_string(cli.data().join("local.txt")).unwrap(), "local");
    // A failed download creates no local file.
    cli.rejects(&["cp", "sbx-000000000000:/workspace/x", "fresh.txt"], &["no sandbox"]).await;
    assert!(!cli.data().join("fresh.txt").exists());
}

/// BUG: a failed download deletes the local file it was meant to replace.
#[tokio::test]

async fn a_failed_download_keeps_an_existing_local_file() {
    let cli = Cli::new();
    let keep = cli.data().join("keep.txt");
    std::fs::write(&keep, "precious").unwrap();
    cli.rejects(&["cp", "sbx-000000000000:/workspace/x", "keep.txt"], &["no sandbox"]).await;
    assert_eq!(std::fs::read_to_string(&keep).ok().as_deref(), Some("precious"));
}

/// BUG: `run` destroys the sandbox it ran in, even when `acquire` handed it the thread's
/// long-lived sandbox from `create --workspace` (killing whatever ran there).
#[tokio::test]

async fn run_on_a_workspace_keeps_the_threads_live_sandbox() {
    let cli = Cli::new();
    let id = cli.ok(&["create", "--workspace", "T"]).await.trim().to_owned();
    let out = cli.run(&["run", "--workspace", "T", "--", "true"]).await;
    let still = cli.run(&["exec", &id, "--", "true"]).await;
    cli.ok(&["workspace", "rm", "T"]).await;
    assert_eq!(still.code, 0, "run ({out:?}) destroyed the live sandbox {id}: {still:?}");
}

// --- Happy paths ----------------------------------------------------------------------------

#[tokio::test]
async fn run_streams_output_and_exits_with_the_command() {
    let cli = Cli::new();
    let before = paddock_cgroups();
    let out = cli.run(&["run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"]).await;
    assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (7, "out\n", "err\n"));
    let out = cli.run(&["run", "--", "true"]).await;
    assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (0, "", ""));
    cli.assert_nothing_left(&before, "run");
}

#[tokio::test]
async fn run_honours_valid_limits_at_their_bounds() {
    let cli = Cli::new();
    let before = paddock_cgroups();
    let thread = long_thread(512);
    let args = [
        "run",
        "--memory",
        "16Mi",
        "--pids",
        "16",
        "--cpus",
        "0.01",
        "--tmp-size",
        "1Mi",
        "--env",
        "GOOD=yes",
        "--user",
        "1001:1001",
        "--workspace",
        &thread,
        "--timeout",
        "1m",
        "--cmd-env",
        "CMD=1",
        "-w",
        "sub",
        "--",
        "sh",
        "-c",
        "echo $GOOD $CMD; id -u; pwd",
    ];
    let out = cli.run(&["run", "--workspace", &thread, "--user", "1001:1001", "--", "mkdir", "sub"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let out = cli.run(&args).await;
    assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (0, "yes 1\n1001\n/workspace/sub\n", ""));
    cli.ok(&["workspace", "rm", &thread]).await;
    cli.assert_nothing_left(&before, "run with limits");
}

#[tokio::test]
async fn run_timeout_kills_the_command_with_124() {
    let cli = Cli::new();
    let before = paddock_cgroups();
    let start = Instant::now();
    let out = cli.run(&["run", "--timeout", "1s", "--", "sleep", "30"]).await;
    assert_eq!(out.code, 124, "{out:?}");
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
    assert!(out.stderr.contains("timed out after 1s") && out.stderr.contains("--timeout"), "{out:?}");
    // A command that ends in time is not affected.
    let out = cli.run(&["run", "--timeout", "30s", "--", "echo", "quick"]).await;
    assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (0, "quick\n", ""));
    cli.assert_nothing_left(&before, "run --timeout");
}

#[tokio::test]
async fn run_of_a_missing_or_unexecutable_program_exits_127_or_126() {
    let cli = Cli::new();
    let before = paddock_cgroups();
    let out = cli.run(&["run", "--", "definitely-not-a-command"]).await;
    assert_eq!(out.code, 127, "{out:?}");
    assert!(out.stderr.contains("definitely-not-a-command"), "{out:?}");
    let out = cli.run(&["run", "--", "/etc/hostname"]).await;
    assert_eq!(out.code, 126, "{out:?}");
    assert!(out.stderr.contains("/etc/hostname"), "{out:?}");
    cli.assert_nothing_left(&before, "run of a missing program");
}

#[tokio::test]
async fn create_ls_exec_inspect_rm() {
    let cli = Cli::new();
    let before = paddock_cgroups();
    let created = cli.ok(&["create"]).await;
    assert_eq!(created.lines().count(), 1, "{created:?}");
    let id = SandboxId::parse(created.trim()).expect("create prints a sandbox id");
    assert_eq!(cli.entries("sandboxes"), [id.to_string()]);

    let listed: Vec<SandboxInfo> = serde_json::from_str(&cli.ok(&["ls", "--json"]).await).expect("ls --json");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((&listed[0].id, listed[0].state), (&id, SandboxState::Running));
    assert!(cli.ok(&["ls"]).await.contains(id.as_str()));
    let info: SandboxInfo = serde_json::from_str(&cli.ok(&["inspect", id.as_str()]).await).expect("inspect");
    assert_eq!(info.id, id);

    let out = cli.run(&["exec", id.as_str(), "--", "echo", "hi"]).await;
    assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (0, "hi\n", ""));
    // State persists between execs of one sandbox; exit codes come through.
    assert_eq!(cli.run(&["exec", id.as_str(), "--", "sh", "-c", "echo kept > /tmp/k"]).await.code, 0);
    let out = cli.run(&["exec", id.as_str(), "--", "sh", "-c", "cat /tmp/k; exit 3"]).await;
    assert_eq!((out.code, out.stdout.as_str()), (3, "kept\n"));

    // cp both ways, through the CLI.
    std::fs::write(cli.data().join("up.txt"), "uploaded\n").unwrap();
    let remote = format!("{id}:/workspace/in.txt");
    assert_eq!(cli.ok(&["cp", "up.txt", &remote]).await, "/workspace/in.txt (9 bytes)\n");
    let out = cli.run(&["exec", id.as_str(), "--", "cat", "/workspace/in.txt"]).await;
    assert_eq!((out.code, out.stdout.as_str()), (0, "uploaded\n"));
    cli.ok(&["cp", &remote, "down.txt"]).await;
    assert_eq!(std::fs::read_to_string(cli.data().join("down.txt")).unwrap(), "uploaded\n");
    let out = cli.run(&["cp", &format!("{id}:/workspace/absent"), "absent.txt"]).await;
    assert_eq!((out.code, out.stderr.lines().count()), (ERROR_EXIT, 1), "{out:?}");
    assert!(out.stderr.contains("/workspace/absent") && out.stderr.contains("No such file"), "{out:?}");
    assert!(!cli.data().join("absent.txt").exists());

    assert_eq!(cli.ok(&["rm", id.as_str()]).await, format!("{id}\n"));
    assert_eq!(cli.entries("sandboxes"), Vec::<String>::new());
    assert_eq!(cli.ok(&["ls", "--json"]).await.trim(), "[]");
    common::assert_nothing_left(cli.data(), &id);
    cli.rejects(&["exec", id.as_str(), "--", "true"], &["no sandbox", id.as_str()]).await;
    cli.assert_nothing_left(&before, "create/rm");
}

#[tokio::test]
async fn a_workspace_persists_across_runs_until_removed() {
    let cli = Cli::new();
    let before = paddock_cgroups();
    let out = cli.run(&["run", "--workspace", "T", "--", "sh", "-c", "echo data > /workspace/f"]).await;
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
    assert_eq!(cli.entries("sandboxes"), Vec::<String>::new(), "run keeps the workspace, not the sandbox");
    let out = cli.run(&["run", "--workspace", "T", "--", "cat", "/workspace/f"]).await;
    assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (0, "data\n", ""));
    // Another thread's workspace is separate.
    let out = cli.run(&["run", "--workspace", "other", "--", "cat", "/workspace/f"]).await;
    assert_ne!(out.code, 0, "{out:?}");
    cli.ok(&["workspace", "rm", "other"]).await;

    let name = cli.ok(&["workspace", "name", "T"]).await.trim().to_owned();
    assert!(cli.data().join("workspaces").join(&name).is_dir());
    assert_eq!(cli.ok(&["workspace", "rm", "T"]).await, "T\n");
    assert!(!cli.data().join("workspaces").join(&name).exists(), "workspace rm left the workspace");
    // Removed means gone: a new run starts empty.
    let out = cli.run(&["run", "--workspace", "T", "--", "cat", "/workspace/f"]).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.stdout, "");
    cli.ok(&["workspace", "rm", "T"]).await;
    cli.rejects(&["workspace", "rm", "T"], &["thread T has no workspace"]).await;
    cli.assert_nothing_left(&before, "workspace runs");
}

#[tokio::test]
async fn piped_stdin_reaches_the_command() {
    let cli = Cli::new();
    let before = paddock_cgroups();
    let out = cli.run_with_stdin(&["run", "--", "cat"], b"hello\nworld\n".to_vec()).await;
    assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (0, "hello\nworld\n", ""));
    // Larger than any pipe buffer, so it must stream both ways.
    let big: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
    let out = cli.run_with_stdin(&["run", "--", "cat"], big.clone().into_bytes()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout == big, "stdin came back as {} bytes of {}", out.stdout.len(), big.len());
    // Without piped input the command reads end-of-file at once.
    let out = cli.run(&["run", "--", "wc", "-c"]).await;
    assert_eq!((out.code, out.stdout.trim()), (0, "0"));
    // Our stdin is /dev/null there: the command gets its own /dev/null rather than a pipe
    // relaying nothing, even with -i; piped input comes through a pipe.
    for args in [&["run", "--", "readlink", "/proc/self/fd/0"][..], &["run", "-i", "--", "readlink", "/proc/self/fd/0"]]
    {
        let out = cli.run(args).await;
        assert_eq!((out.code, out.stdout.trim()), (0, "/dev/null"), "{args:?}: {}", out.stderr);
    }
    let out = cli.run_with_stdin(&["run", "--", "readlink", "/proc/self/fd/0"], Vec::new()).await;
    assert!(out.code == 0 && out.stdout.starts_with("pipe:"), "{out:?}");
    // Output written in pieces, without newlines, arrives whole and in order on each stream.
    let out = cli.run(&["run", "--", "sh", "-c", "printf a; sleep 0.05; printf b >&2; printf c"]).await;
    assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (0, "ac", "b"));
    cli.assert_nothing_left(&before, "stdin");
}

#[tokio::test]
async fn a_terminal_is_relayed_and_never_handed_to_the_sandbox() {
    let cli = Cli::new();
    // script(1) gives the CLI a real pseudo-terminal as stdin, stdout and stderr.
    let inner = format!("{EXE} run -- sh -c 'readlink /proc/self/fd/0 /proc/self/fd/1 /proc/self/fd/2; echo relayed'");
    let out = tokio::process::Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env_clear()
        .env("PADDOCK_DATA_DIR", cli.data())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("script(1) from util-linux");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("relayed"), "{text}");
    assert!(!text.contains("/dev/pts") && !text.contains("/dev/tty"), "the sandbox got the terminal: {text}");
    assert_eq!(text.matches("pipe:").count(), 2, "stdout and stderr are relayed through pipes: {text}");
}

#[tokio::test]
async fn a_file_the_caller_redirects_output_to_is_never_handed_to_the_sandbox() {
    let cli = Cli::new();
    let id = cli.ok(&["create"]).await.trim().to_owned();
    // Confined first: uid 1000, no capabilities (the target below is a marker file of ours).
    assert_eq!(cli.ok(&["exec", &id, "--", "id", "-u"]).await, "1000\n");
    assert_eq!(
        cli.ok(&["exec", &id, "--", "grep", "CapEff", "/proc/self/status"]).await,
        "CapEff:\t0000000000000000\n"
    );
    // `paddock exec … >> caller.log`, and the command leaves a process behind that writes
    // (and would truncate) later: with the caller's own file it could, long after the exit.
    let log = cli.data().join("caller.log");
    std::fs::write(&log, "before\n").unwrap();
    let file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let script = "(sleep 1; : > /proc/self/fd/1; echo late) >/dev/stdout 2>/dev/null & echo now";
    let status =
        cli.command(&["exec", &id, "--", "sh", "-c", script]).stdout(Stdio::from(file)).status().await.unwrap();
    assert!(status.success());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "before\nnow\n",
        "a process left in the sandbox reached the caller's file after the CLI exited"
    );
    cli.ok(&["rm", &id]).await;
}

/// A command starts with no signal blocked and none ignored, however `paddock run` itself was
/// started: here from a shell's background job, which ignores SIGINT and SIGQUIT, while the
/// sandbox's init blocks SIGCHLD for itself. A shell that waits for its background child hears
/// of its exit (with SIGCHLD blocked, dash's `wait` slept forever).
#[tokio::test]
async fn commands_start_with_no_signal_blocked_or_ignored_however_the_cli_was_started() {
    let cli = Cli::new();
    // `grep` leaves its signal mask and dispositions as it got them; `timeout` bounds a hang.
    let script = format!(
        "{EXE} run -- grep -E '^Sig(Blk|Ign):' /proc/self/status & wait $!; \
         {EXE} run -- sh -c 'sleep 0.2 & wait; echo waited' & wait $!"
    );
    let mut c = tokio::process::Command::new("timeout");
    c.args(["60", "sh", "-c", &script])
        .env_clear()
        .env("PADDOCK_DATA_DIR", cli.data())
        .env("PATH", "/usr/bin:/bin")
        .current_dir(cli.data())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = finish(c.spawn().expect("starting sh"), &[&script]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let field = |name: &str| {
        let line = out.stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}: {out:?}"));
        u64::from_str_radix(line[name.len()..].trim(), 16).expect("a hex signal set")
    };
    assert_eq!(field("SigBlk:"), 0, "the command started with signals blocked: {out:?}");
    // SIGINT is 2, SIGQUIT 3: bits 1 and 2.
    assert_eq!(field("SigIgn:") & 0b110, 0, "the command started ignoring SIGINT or SIGQUIT: {out:?}");
    assert!(out.stdout.ends_with("waited\n"), "{out:?}");
}

/// `paddock check` on the local runtime, through the runtime-neutral report: a sandbox starts
/// confined, the report says so (human and JSON), and nothing is left behind.
#[tokio::test]
async fn check_proves_a_sandbox_starts_confined_and_leaves_nothing() {
    let cli = Cli::new();
    let before = paddock_cgroups();
    let human = cli.run(&["check"]).await;
    assert_eq!(human.code, 0, "{human:?}");
    assert!(human.stdout.contains("local runtime") && human.stdout.contains("ok   sandbox"), "{human:?}");
    assert!(human.stdout.trim_end().ends_with("ready"), "{human:?}");
    let json = cli.run(&["check", "--json"]).await;
    assert_eq!(json.code, 0, "{json:?}");
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(report["items"][0]["check"], "sandbox");
    assert_eq!(report["items"][0]["status"], "pass");
    cli.assert_nothing_left(&before, "paddock check");
}
