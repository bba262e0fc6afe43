//! Commands in the keeper Pod: through its agent (`agent`) when one is up, else over
//! `pods/exec` (WebSocket, channel protocol v5).
//!
//! Every user command runs under a small `sh` wrapper that starts it in a new session (so a
//! signal reaches everything it started) with exactly the requested environment, and records
//! the session id under `/tmp` so a second exec can signal it. kube's own pipes do not signal
//! EOF when their writer is dropped, so the streams handed out are tokio duplex pipes pumped
//! by a task that owns the connection.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::Api;
use kube::api::{AttachParams, AttachedProcess};
use paddock_core::runtime::{ExecOutcome, Execution, Process, RuntimeError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::oneshot;

use crate::agent::{self, Agents, RunError};
use crate::objects::CONTAINER;

/// `sh -c WRAPPER paddock-exec TOKEN CWD PROGRAM [NAME=VALUE... PROGRAM ARGS...]`
///
/// Without the trailing words, the wrapper sources them from `TOKEN.args`, staged by
/// `STAGE_SCRIPT` (see `wrap`).
///
/// The command runs in the background so the wrapper learns its pid (`$!`); a non-interactive
/// shell gives a background job `/dev/null` as stdin, hence the detour through fd 3. `setsid`
/// succeeds without forking because a background job never leads a process group, so the pid
/// is the session id. `env -i` makes the environment exactly the requested one; it and `setsid`
/// exit 127 for a missing program like a shell does. The command runs at `oom_score_adj` 1000
/// (the wrapper and the keeper keep theirs), so the kernel takes it before the keeper when the
/// container's memory runs out. A command killed while the container's
/// OOM-kill counter moved, or its memory peak rose to the limit, leaves a `TOKEN.oom` marker
/// for `OOM_SCRIPT`.
pub const WRAPPER: &str = r#"t=$1 d=$2 prog=$3; shift 3
if [ "$#" = 0 ]; then a="/tmp/.paddock-exec/$t.args"; . "$a" || exit 126; rm -f "$a"; fi
if [ -z "$d" ]; then d=${PWD:-/}; [ "$d" = / ] && d=/workspace; fi
if ! cd "$d" 2>/dev/null; then
  printf 'paddock: cannot run "%s": working directory %s does not exist\n' "$prog" "$d" >&2; exit 127
fi
mkdir -p /tmp/.paddock-exec 2>/dev/null
oom() { n= m= l= x=; for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
  [ -r "$f" ] && while read -r k v; do [ "$k" = oom_kill ] && n=$v; [ "$k" = max ] && x=$v; done <"$f"; done
  [ -r /sys/fs/cgroup/memory/memory.failcnt ] && read -r x </sys/fs/cgroup/memory/memory.failcnt
  for f in /sys/fs/cgroup/memory/memory.max_usage_in_bytes /sys/fs/cgroup/memory.peak; do [ -r "$f" ] && read -r m <"$f"; done
  for f in /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max; do [ -r "$f" ] && read -r l <"$f"; done; }
oom; o=$n op=$m ox=$x
exec 3<&0
( { echo 1000 >/proc/self/oom_score_adj; } 2>/dev/null; exec setsid env -i "$@" ) <&3 3<&- &
p=$!
exec 3<&-
echo "$p" >"/tmp/.paddock-exec/$t" 2>/dev/null
wait "$p"; c=$?
rm -f "/tmp/.paddock-exec/$t"
if [ "$c" = 137 ]; then oom
  # The kernel counts an OOM kill in the cgroup whose limit was hit, which may be the Pod's
  # (the same limit, plus the pause container's pages): a new peak at the limit counts too,
  # and so does the container hitting its limit while the command ran (failcnt, or the
  # `max` events of cgroup v2) before the SIGKILL.
  full=; case "$m:$l" in *[!0-9:]*|:*|*:) ;; *) [ "$m" != "$op" ] && [ $((m + 4194304)) -ge "$l" ] && full=1;; esac
  { [ "$n" != "$o" ] || [ -n "$full" ] || [ "$x" != "$ox" ]; } && : >"/tmp/.paddock-exec/$t.oom"; fi
exit "$c""#;

/// `sh -c OOM paddock-oom TOKEN`: prints `oom` (once) when the command was OOM-killed.
pub const OOM_SCRIPT: &str = r#"f="/tmp/.paddock-exec/$1.oom"
[ -e "$f" ] && rm -f "$f" && echo oom
true"#;

/// `sh -c SIGNAL paddock-signal TOKEN SIGNUM`: exits 3 when the command has not recorded its
/// session yet (or has ended), else signals the whole session's process group.
///
/// dash (`/bin/sh` of Debian and Ubuntu images) reads `kill -s 9 -PID` as an unknown option
/// and needs `--` before a process group; busybox's `kill` refuses `--`. Each form is tried in
/// turn: without the second, a dash image's command lost only its shell to a timeout, and what
/// the shell had started ran on with the output pipe.
pub const SIGNAL_SCRIPT: &str = r#"f="/tmp/.paddock-exec/$1"
[ -s "$f" ] || exit 3
read p <"$f" || exit 3
kill -s "$2" "-$p" 2>/dev/null || kill -s "$2" -- "-$p" 2>/dev/null || kill -s "$2" "$p""#;

/// `sh -c STAGE paddock-stage TOKEN` stores its input as `TOKEN.args` for the wrapper.
///
/// `cat` must not be the script's last command: the shell would then run it as the exec's
/// own process, and on this stack (kubelet 1.34, containerd 1.6) that process's stdin ends
/// early, losing the tail of the input. A child of the exec's process receives all of it.
pub const STAGE_SCRIPT: &str = r#"mkdir -p /tmp/.paddock-exec || exit 1
cat >"/tmp/.paddock-exec/$1.args"
exit $?"#;

/// Largest environment plus argv sent inline. The exec request carries its argv in the URL,
/// which the HTTP stack caps at 64 KiB, and URL encoding may triple every byte.
pub const INLINE_LIMIT: usize = 8 << 10;

/// A user command under the wrapper: its argv, and the `set --` line to stage first when its
/// words are too long for the request URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrapped {
    pub argv: Vec<String>,
    pub staged: Option<String>,
}

/// Quotes a word for `sh`: inside single quotes nothing is special but the quote itself.
pub fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Wraps `argv`. `env -i` treats leading `NAME=VALUE` words as variables, so the program is
/// never confused with one: names are validated shell names.
pub fn wrap(token: &str, cwd: &str, env: &BTreeMap<String, String>, argv: &[String]) -> Wrapped {
    let program = argv.first().cloned().unwrap_or_default();
    let mut out =
        vec!["sh".into(), "-c".into(), WRAPPER.into(), "paddock-exec".into(), token.into(), cwd.into(), program];
    let words: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).chain(argv.iter().cloned()).collect();
    if words.iter().map(|w| w.len() + 1).sum::<usize>() <= INLINE_LIMIT {
        out.extend(words);
        return Wrapped { argv: out, staged: None };
    }
    let quoted: Vec<String> = words.iter().map(|w| sh_quote(w)).collect();
    Wrapped { argv: out, staged: Some(format!("set -- {}\n", quoted.join(" "))) }
}

/// Resolves an exec working directory: relative paths start at `/workspace`; none is `""`,
/// which the wrapper and the agent read as the container's own working directory (the
/// image's `WorkingDir`), or `/workspace` when that is `/`.
pub fn resolve_cwd(cwd: Option<&str>) -> Result<String, RuntimeError> {
    match cwd {
        None | Some("") => Ok(String::new()),
        Some(c) if c.contains('\0') => {
            Err(RuntimeError::InvalidArgument(format!("working directory {c:?} contains a NUL byte")))
        }
        Some(c) if c.starts_with('/') => Ok(c.into()),
        Some(c) => Ok(format!("/workspace/{c}")),
    }
}

/// The exit code an exec's final Status reports; `Err` when the exec itself failed.
pub fn exit_code(status: &Status) -> Result<i32, String> {
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    if status.reason.as_deref() == Some("NonZeroExitCode")
        && let Some(code) = status
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.reason.as_deref() == Some("ExitCode"))
            .and_then(|c| c.message.as_deref())
            .and_then(|m| m.trim().parse::<i32>().ok())
    {
        return Ok(code);
    }
    Err(status.message.clone().unwrap_or_else(|| "the exec ended without an exit code".into()))
}

/// How a wrapper's exit code reads: a shell reports death by signal `n` as `128 + n`.
pub fn outcome(code: i32, timed_out: bool) -> ExecOutcome {
    if timed_out {
        return ExecOutcome { exit_code: 124, signal: Some(9), timed_out: true, oom_killed: false };
    }
    let signal = (129..=192).contains(&code).then_some(code - 128);
    ExecOutcome { exit_code: code, signal, timed_out: false, oom_killed: false }
}

pub const PIPE: usize = 64 << 10;

/// One exec: caller-side pipe ends and the exit code once the connection ends.
pub struct Running {
    pub stdin: Option<DuplexStream>,
    pub stdout: DuplexStream,
    pub stderr: DuplexStream,
    pub done: oneshot::Receiver<Result<i32, RuntimeError>>,
}

/// Maps a failed exec request; the pod name is in every message so the user can look.
pub fn exec_error(pod: &str, e: kube::Error) -> RuntimeError {
    match e {
        kube::Error::Api(s) if s.code == 404 => {
            RuntimeError::NotFound(format!("the sandbox's Pod {pod} no longer exists: {}", s.message))
        }
        kube::Error::Api(s) if s.code == 400 || s.code == 409 => {
            RuntimeError::Unavailable(format!("the sandbox's Pod {pod} cannot run commands: {}", s.message))
        }
        kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(code))
            if code.as_u16() == 404 =>
        {
            RuntimeError::NotFound(format!("the sandbox's Pod {pod} no longer exists"))
        }
        kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(code))
            if code.as_u16() == 400 =>
        {
            RuntimeError::Unavailable(format!(
                "the sandbox's Pod {pod} cannot run commands (HTTP 400: it is not running; see `kubectl describe pod {pod}`)"
            ))
        }
        other => RuntimeError::System(format!("exec in Pod {pod}: {other}")),
    }
}

/// How commands reach a Pod: its agent when one is up, else `pods/exec`.
#[derive(Clone)]
pub struct Transport {
    pub pods: Api<Pod>,
    pub agents: Arc<Agents>,
}

impl Transport {
    /// Starts `argv` in the keeper container.
    pub async fn start(&self, pod: &str, argv: Vec<String>, stdin: bool) -> Result<Running, RuntimeError> {
        if let Some(sender) = self.agents.sender(pod, None) {
            match agent::run(sender, pod, argv.clone(), stdin).await {
                Ok(running) => return Ok(running),
                Err(RunError::Failed(e)) => return Err(e),
                Err(RunError::NotSent(e)) => {
                    tracing::debug!(pod, error = %e, "the agent's connection is gone: pods/exec instead");
                    self.agents.forget_closed(pod);
                }
            }
        }
        start_pods_exec(&self.pods, pod, argv, stdin).await
    }
}

/// Starts `argv` in the keeper container with one `pods/exec` call.
pub async fn start_pods_exec(
    pods: &Api<Pod>,
    pod: &str,
    argv: Vec<String>,
    stdin: bool,
) -> Result<Running, RuntimeError> {
    let params = AttachParams::default()
        .container(CONTAINER)
        .stdin(stdin)
        .stdout(true)
        .stderr(true)
        .max_stdin_buf_size(PIPE)
        .max_stdout_buf_size(PIPE)
        .max_stderr_buf_size(PIPE);
    let mut attached = pods.exec(pod, argv, &params).await.map_err(|e| exec_error(pod, e))?;
    let (out_user, out_pump) = tokio::io::duplex(PIPE);
    let (err_user, err_pump) = tokio::io::duplex(PIPE);
    let out_task = tokio::spawn(pump(attached.stdout(), out_pump));
    let err_task = tokio::spawn(pump(attached.stderr(), err_pump));
    let (stdin_user, in_task) = match attached.stdin() {
        Some(kube_in) => {
            let (user, pump_end) = tokio::io::duplex(PIPE);
            (Some(user), Some(tokio::spawn(pump_stdin(pump_end, kube_in))))
        }
        None => (None, None),
    };
    let (tx, done) = oneshot::channel();
    let pod = pod.to_owned();
    tokio::spawn(drive(attached, pod, out_task, err_task, in_task, tx));
    Ok(Running { stdin: stdin_user, stdout: out_user, stderr: err_user, done })
}

/// Owns the connection (dropping kube's handle aborts it) until the command's status arrives.
async fn drive(
    mut attached: AttachedProcess,
    pod: String,
    out_task: tokio::task::JoinHandle<()>,
    err_task: tokio::task::JoinHandle<()>,
    in_task: Option<tokio::task::JoinHandle<()>>,
    tx: oneshot::Sender<Result<i32, RuntimeError>>,
) {
    let status = match attached.take_status() {
        Some(s) => s.await,
        None => None,
    };
    if let Some(t) = &in_task {
        t.abort();
    }
    let result = match status {
        Some(status) => {
            // kube shuts its output pipes after the status: the pumps finish by themselves.
            let _ = out_task.await;
            let _ = err_task.await;
            exit_code(&status).map_err(|m| RuntimeError::System(format!("exec in Pod {pod}: {m}")))
        }
        None => {
            // kube leaves its pipes open when the connection breaks: stop the pumps so the
            // caller's streams end.
            out_task.abort();
            err_task.abort();
            Err(RuntimeError::Unavailable(format!(
                "the connection to the sandbox's Pod {pod} was lost before the command ended"
            )))
        }
    };
    let _ = attached.join().await;
    let _ = tx.send(result);
}

/// Copies kube's output pipe to the caller's; once the caller stops reading, output is
/// discarded so the command is never blocked on a reader that is gone.
async fn pump<R: AsyncRead + Unpin>(from: Option<R>, mut to: DuplexStream) {
    let Some(mut from) = from else { return };
    let mut buf = vec![0u8; 32 << 10];
    let mut open = true;
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if open && to.write_all(&buf[..n]).await.is_err() {
                    open = false;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

/// Copies the caller's input to kube's; end of input (the caller's end dropped or shut) is
/// passed on as a stream close, which the command reads as EOF.
async fn pump_stdin<W: AsyncWrite + Unpin>(mut from: DuplexStream, mut to: W) {
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = to.shutdown().await;
}

/// The control of a user command.
pub struct KubeExecution {
    control: Control,
    pod: String,
    token: String,
    done: Option<oneshot::Receiver<Ended>>,
    outcome: Option<ExecOutcome>,
}

/// Sends `signal` to a command's session. Returns false while the wrapper has not recorded
/// it yet (or after the command ended).
async fn send_signal(transport: &Transport, pod: &str, token: &str, signal: i32) -> Result<bool, RuntimeError> {
    let argv =
        vec!["sh".into(), "-c".into(), SIGNAL_SCRIPT.into(), "paddock-signal".into(), token.into(), signal.to_string()];
    let (code, _, stderr) = collect(transport.start(pod, argv, false).await?, None).await?;
    match code {
        0 => Ok(true),
        3 => Ok(false),
        _ => Err(RuntimeError::System(format!(
            "signalling a command in Pod {pod}: {}",
            String::from_utf8_lossy(&stderr).trim()
        ))),
    }
}

/// Waits for the command, killing its whole session at `deadline`. Runs as its own task so
/// the deadline holds whether or not anyone waits.
async fn watch(
    control: Control,
    pod: String,
    token: String,
    mut done: oneshot::Receiver<Result<i32, RuntimeError>>,
    deadline: Option<tokio::time::Instant>,
    tx: oneshot::Sender<Ended>,
) {
    let vanished = || RuntimeError::System(format!("the exec in Pod {pod} vanished"));
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = &mut done => {
            let r = r.unwrap_or_else(|_| Err(vanished()));
            let oom = matches!(r, Ok(137)) && control.oom_killed(&pod, &token).await;
            let _ = tx.send((r, false, oom));
        }
        _ = sleep => {
            // Retried: the wrapper may not have recorded the session yet.
            for _ in 0..50 {
                match control.signal(&pod, &token, 9).await {
                    Ok(false) => tokio::time::sleep(Duration::from_millis(100)).await,
                    Ok(true) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, pod, "killing a command at its deadline");
                        break;
                    }
                }
            }
            let r = done.await.unwrap_or_else(|_| Err(vanished()));
            let _ = tx.send((r, true, false));
        }
    }
}

/// How a command ended: its exit code, whether its deadline killed it, whether it was
/// OOM-killed.
type Ended = (Result<i32, RuntimeError>, bool, bool);

/// How long the runtime's own helper calls (a signal, the OOM verdict) may take.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(10);

async fn oom_killed(transport: &Transport, pod: &str, token: &str) -> bool {
    let argv = vec!["sh".into(), "-c".into(), OOM_SCRIPT.into(), "paddock-oom".into(), token.into()];
    match transport.start(pod, argv, false).await {
        Ok(r) => matches!(collect(r, None).await, Ok((0, out, _)) if out.starts_with(b"oom")),
        Err(_) => false,
    }
}

fn finish(r: Result<Ended, oneshot::error::RecvError>) -> Result<ExecOutcome, RuntimeError> {
    match r {
        Ok((_, true, _)) => Ok(outcome(124, true)),
        Ok((code, false, oom)) => Ok(ExecOutcome { oom_killed: oom, ..outcome(code?, false) }),
        Err(_) => Err(RuntimeError::System("the command's watcher vanished".into())),
    }
}

#[async_trait::async_trait]
impl Execution for KubeExecution {
    fn pid(&self) -> Option<u32> {
        None
    }

    async fn signal(&mut self, signal: i32) -> Result<(), RuntimeError> {
        if !(1..=64).contains(&signal) {
            return Err(RuntimeError::InvalidArgument(format!("{signal} is not a signal number (1 to 64)")));
        }
        // The wrapper records the session right after starting it: retry briefly while it
        // has not, and stop once the command has ended (then there is nothing to signal).
        for _ in 0..50 {
            if self.outcome.is_some() || self.control.signal(&self.pod, &self.token, signal).await? {
                return Ok(());
            }
            if let Some(done) = &mut self.done
                && let Ok(r) = tokio::time::timeout(Duration::from_millis(100), done).await
            {
                self.done = None;
                self.outcome = Some(finish(r)?);
                return Ok(());
            }
        }
        Err(RuntimeError::Timeout(format!("the command in Pod {} did not start within 5 s", self.pod)))
    }

    async fn wait(&mut self) -> Result<ExecOutcome, RuntimeError> {
        if let Some(o) = self.outcome {
            return Ok(o);
        }
        let Some(done) = &mut self.done else {
            return Err(RuntimeError::InvalidArgument("the command's outcome was already taken".into()));
        };
        let o = finish(done.await)?;
        self.done = None;
        self.outcome = Some(o);
        Ok(o)
    }
}

/// Most of a script's standard output `collect` keeps: a listing of `MAX_LISTED_ENTRIES`
/// long paths fits. A script's output comes from inside the sandbox (its agent can be
/// replaced), so it is bounded like any other untrusted input.
pub const MAX_SCRIPT_OUTPUT: u64 = 256 << 20;
/// Most of a script's standard error `collect` keeps (it only ever carries messages).
pub const MAX_SCRIPT_ERRORS: u64 = 64 << 10;

/// Runs an exec to the end, feeding it `input` and collecting both outputs, each up to its
/// bound; more is an error, never kept.
pub async fn collect(
    running: Running,
    input: Option<&mut (dyn AsyncRead + Send + Unpin)>,
) -> Result<(i32, Vec<u8>, Vec<u8>), RuntimeError> {
    let Running { stdin, stdout, stderr, done } = running;
    let (mut stdout, mut stderr) = (stdout.take(MAX_SCRIPT_OUTPUT + 1), stderr.take(MAX_SCRIPT_ERRORS));
    let feed = async {
        if let (Some(mut w), Some(r)) = (stdin, input) {
            let copied = tokio::io::copy(r, &mut w).await;
            let _ = w.shutdown().await;
            copied.map(|_| ())
        } else {
            Ok(())
        }
    };
    let mut out = Vec::new();
    let mut err = Vec::new();
    let (fed, _, _) = tokio::join!(feed, stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
    if out.len() as u64 > MAX_SCRIPT_OUTPUT {
        return Err(RuntimeError::Exhausted(format!(
            "a script in the sandbox wrote more than {} MiB; nothing of it was kept",
            MAX_SCRIPT_OUTPUT >> 20
        )));
    }
    // The rest of the outputs is not wanted: the pumps drop what the closed pipes refuse.
    drop((stdout, stderr));
    let code = done.await.map_err(|_| RuntimeError::System("an exec vanished".into()))??;
    // A command that failed early stops reading its input: its own error says more.
    if code == 0 {
        fed.map_err(|e| RuntimeError::from_io("sending data into the sandbox", &e))?;
    }
    Ok((code, out, err))
}

/// How a running user command is signalled and its OOM kill found out: through the
/// wrapper's files in `/tmp/.paddock-exec`, or by the agent that started it.
#[derive(Clone)]
pub enum Control {
    Wrapper(Box<Transport>),
    Agent(agent::Sender, Arc<AtomicBool>),
}

impl Control {
    async fn signal(&self, pod: &str, token: &str, signal: i32) -> Result<bool, RuntimeError> {
        match self {
            Control::Wrapper(t) => tokio::time::timeout(HELPER_TIMEOUT, send_signal(t, pod, token, signal))
                .await
                .map_err(|_| RuntimeError::Timeout(format!("signalling a command in Pod {pod} took too long")))?,
            Control::Agent(sender, _) => agent::signal(sender.clone(), pod, token, signal).await,
        }
    }

    async fn oom_killed(&self, pod: &str, token: &str) -> bool {
        match self {
            Control::Wrapper(t) => {
                tokio::time::timeout(HELPER_TIMEOUT, oom_killed(t, pod, token)).await.unwrap_or(false)
            }
            // The agent's exit frame said, before the command's end was passed on.
            Control::Agent(_, oom) => oom.load(Ordering::Relaxed),
        }
    }
}

/// A started user command as a `Process`, killed at `timeout`.
pub fn process(running: Running, control: Control, pod: &str, token: String, timeout: Option<Duration>) -> Process {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let (tx, done) = oneshot::channel();
    tokio::spawn(watch(control.clone(), pod.to_owned(), token.clone(), running.done, deadline, tx));
    let control = KubeExecution { control, pod: pod.to_owned(), token, done: Some(done), outcome: None };
    Process {
        stdin: running.stdin.map(|s| Box::new(s) as paddock_core::runtime::ByteWriter),
        stdout: Box::new(running.stdout),
        stderr: Box::new(running.stderr),
        control: Box::new(control),
    }
}

#[cfg(test)]
#[expect(clippy::disallowed_methods, reason = "a test's fixtures may block: each test has a runtime of its own")]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    use super::*;

    fn status(json: serde_json::Value) -> Status {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn exit_codes_come_from_the_status() {
        assert_eq!(exit_code(&status(serde_json::json!({"status": "Success"}))), Ok(0));
        let failed = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            message: Some(
                "command terminated with non-zero exit code: error executing command [sh], exit code 3".into(),
            ),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("3".into()),
                    field: None,
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(exit_code(&failed), Ok(3));
        let broken = status(serde_json::json!({"status": "Failure", "reason": "InternalError", "message": "boom"}));
        assert_eq!(exit_code(&broken), Err("boom".into()));
    }

    #[test]
    fn outcomes_read_signals_and_timeouts() {
        assert_eq!(outcome(0, false).signal, None);
        assert_eq!(outcome(143, false).signal, Some(15));
        assert_eq!(outcome(127, false).signal, None);
        let t = outcome(137, true);
        assert_eq!((t.exit_code, t.timed_out), (124, true));
    }

    #[test]
    fn cwd_is_resolved_under_the_workspace() {
        assert_eq!(resolve_cwd(None).unwrap(), "");
        assert_eq!(resolve_cwd(Some("a b")).unwrap(), "/workspace/a b");
        assert_eq!(resolve_cwd(Some("/tmp")).unwrap(), "/tmp");
        assert!(resolve_cwd(Some("a\0")).is_err());
    }

    #[test]
    fn wrapper_argv_passes_everything_as_words() {
        let env = BTreeMap::from([("A".to_owned(), "x y".to_owned())]);
        let w = wrap("tok", "/workspace", &env, &["echo".into(), "$A'\"".into()]);
        assert_eq!(w.staged, None);
        assert_eq!(&w.argv[..2], ["sh", "-c"]);
        assert_eq!(&w.argv[3..], ["paddock-exec", "tok", "/workspace", "echo", "A=x y", "echo", "$A'\""]);
        let big = BTreeMap::from([("B".to_owned(), "it's\n".repeat(2000))]);
        let w = wrap("tok", "/workspace", &big, &["echo".into()]);
        assert_eq!(&w.argv[3..], ["paddock-exec", "tok", "/workspace", "echo"]);
        assert!(w.staged.unwrap().starts_with("set -- 'B=it'\\''s\n"));
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
    }

    /// Runs the wrapper with the host's busybox, when there is one, to check the shell text.
    #[test]
    fn wrapper_runs_under_busybox() {
        let Ok(bb) = which_busybox() else {
            eprintln!("skipped: no busybox on this host");
            return;
        };
        let env = BTreeMap::from([("GREETING".to_owned(), "hi there".to_owned())]);
        let mut argv = wrap(
            "unit-test",
            "/",
            &env,
            &["sh".into(), "-c".into(), "echo \"$GREETING\"; echo \"$HOME\"; cat; exit 7".into()],
        )
        .argv;
        argv[0] = "sh".into();
        let out = std::process::Command::new(&bb)
            .args(&argv)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(b"from stdin\n")?;
                c.wait_with_output()
            })
            .unwrap();
        assert_eq!(out.status.code(), Some(7));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hi there\n\nfrom stdin\n");
        let missing = wrap("unit-test-2", "/", &BTreeMap::new(), &["no-such-program-x".into()]).argv;
        let st = std::process::Command::new(&bb).args(&missing).stderr(std::process::Stdio::null()).status().unwrap();
        assert_eq!(st.code(), Some(127));
        let badcwd = wrap("unit-test-3", "/no/such/dir", &BTreeMap::new(), &["true".into()]).argv;
        let out = std::process::Command::new(&bb).args(&badcwd).output().unwrap();
        assert_eq!(out.status.code(), Some(127));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot run \"true\": working directory /no/such/dir does not exist"), "{err}");
        // No directory: the wrapper's own (the container's `WorkingDir`), or /workspace for /.
        let here = std::env::temp_dir().join(format!("paddock-wrapper-cwd-{}", std::process::id()));
        std::fs::create_dir_all(&here).unwrap();
        let pwd = wrap("unit-test-5", "", &BTreeMap::new(), &["sh".into(), "-c".into(), "pwd".into()]).argv;
        let out = std::process::Command::new(&bb).args(&pwd).current_dir(&here).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), here.to_str().unwrap());
        std::fs::remove_dir(&here).unwrap();
        let out = std::process::Command::new(&bb).args(&pwd).current_dir("/").output().unwrap();
        if std::path::Path::new("/workspace").is_dir() {
            assert_eq!(String::from_utf8_lossy(&out.stdout), "/workspace\n");
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("working directory /workspace does not exist"), "{err}");
        }
        // Words too long for a URL go through a staged file, quotes and newlines intact.
        let value = "it's \"odd\"\n$(no) `no` \\".repeat(1000);
        let env = BTreeMap::from([("V".to_owned(), value.clone())]);
        let w = wrap("unit-test-4", "/", &env, &["sh".into(), "-c".into(), "printf %s \"$V\"".into()]);
        std::fs::create_dir_all("/tmp/.paddock-exec").unwrap();
        std::fs::write("/tmp/.paddock-exec/unit-test-4.args", w.staged.unwrap()).unwrap();
        let out = std::process::Command::new(&bb).args(&w.argv).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), value);
        assert!(!std::path::Path::new("/tmp/.paddock-exec/unit-test-4.args").exists());
    }

    /// The signal script reaches everything a command started, under this host's `/bin/sh`
    /// (dash on Debian) and under busybox when the host has it.
    #[test]
    fn the_signal_script_kills_the_whole_session_under_dash_and_busybox() {
        let mut shells = vec![vec!["/bin/sh".to_owned()]];
        if let Ok(bb) = which_busybox() {
            shells.push(vec![bb, "sh".to_owned()]);
        }
        for (i, shell) in shells.iter().enumerate() {
            let token = format!("unit-signal-{}-{i}", std::process::id());
            let grandchild_file = std::env::temp_dir().join(format!("{token}.gc"));
            // A session of its own, as the wrapper's `setsid` makes: a shell and a `sleep` it
            // started, which holds on to nothing but must die with it.
            let mut leader = std::process::Command::new("setsid")
                .args(["sh", "-c", "sleep 30 & echo $! >\"$0\"; wait", grandchild_file.to_str().unwrap()])
                .spawn()
                .unwrap();
            let mut grandchild = None;
            for _ in 0..100 {
                grandchild = std::fs::read_to_string(&grandchild_file).ok().and_then(|s| s.trim().parse::<u32>().ok());
                if grandchild.is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let grandchild = grandchild.expect("the session's sleep started");
            std::fs::create_dir_all("/tmp/.paddock-exec").unwrap();
            std::fs::write(format!("/tmp/.paddock-exec/{token}"), format!("{}\n", leader.id())).unwrap();
            let st = std::process::Command::new(&shell[0])
                .args(&shell[1..])
                .args(["-c", SIGNAL_SCRIPT, "paddock-signal", &token, "9"])
                .status()
                .unwrap();
            // Gone before any assertion, so a failing run leaves nothing behind for the next.
            let _ = std::fs::remove_file(format!("/tmp/.paddock-exec/{token}"));
            let _ = std::fs::remove_file(&grandchild_file);
            assert_eq!(st.code(), Some(0), "{shell:?}");
            let ended = leader.wait().unwrap();
            assert_eq!(std::os::unix::process::ExitStatusExt::signal(&ended), Some(9), "{shell:?}: {ended:?}");
            let alive = || {
                std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                    .is_ok_and(|s| s.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
            };
            let mut waited = 0;
            while alive() && waited < 100 {
                std::thread::sleep(std::time::Duration::from_millis(20));
                waited += 1;
            }
            assert!(!alive(), "{shell:?}: the command's own child outlived the signal");
        }
    }

    fn which_busybox() -> Result<String, ()> {
        ["/usr/bin/busybox", "/bin/busybox"]
            .iter()
            .find(|p| std::path::Path::new(p).exists())
            .map(|p| p.to_string())
            .ok_or(())
    }
}
