//! `/command`: foreground commands streamed as events, background commands with a bounded log,
//! status, logs and interrupt.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use paddock_core::runtime::{
    ByteReader, ExecOutcome, ExecRequest, Execution, FileKind, FileOp, FileReply, Process, RuntimeError, SandboxId,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::ExecdState;
use super::text::{Event, LineSplitter, TailLog, parse_query, query_one};
use super::{ApiPath, CommandParam, InSandbox, Names, invalid_body, missing_query};
use crate::error::{ApiError, ApiResult};
use crate::store::LifecycleState;
use crate::store::now_ms;
use crate::time_fmt::rfc3339;

/// Output kept per background command (the newest bytes).
const LOG_CAP: usize = 1 << 20;
/// Finished commands remembered per sandbox for status queries; older ones are forgotten.
const KEEP_FINISHED: usize = 64;
/// How often a running foreground command's stream carries a keep-alive.
const PING_EVERY: Duration = Duration::from_secs(3);
/// After a command exits, how long in all its stream waits for more output. Background
/// processes it started may hold the pipes open forever; they must not hold the stream. Only
/// waiting counts, not the time a slow client takes to accept what was already there: output
/// left in the pipes at the exit is never lost to the clock.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);
/// After a background command exits, how long output still in its pipes is read before they
/// are closed: processes it left behind must not hold the server's descriptors for ever.
const DRAIN_BACKGROUND_AFTER_EXIT: Duration = Duration::from_secs(1);
/// The most a Linux pipe holds (`/proc/sys/fs/pipe-max-size`'s default): the most output a
/// stream gives after the command's exit, so a process it left flooding the pipe cannot
/// hold the stream either.
const PIPE_MAX: usize = 1 << 20;
/// Most commands running at once in one sandbox through this server. Each holds descriptors
/// and a task in the server; a sandbox must not be able to take all of them from the others.
pub const MAX_RUNNING_PER_SANDBOX: usize = 128;
/// Events buffered between the command and a slow client before the command is slowed down.
const STREAM_BUFFER: usize = 64;
const SIGKILL: i32 = 9;
/// Entrypoint output kept in the state database (the newest bytes), for the CLI and a
/// restarted server; the server's memory keeps `LOG_CAP`.
pub const ENTRYPOINT_TAIL_STORED: usize = 64 << 10;
/// How often a running entrypoint's new output is written to the state database: often enough
/// for `paddock logs` to follow it, rarely enough that a chatty entrypoint in every sandbox does
/// not keep the database busy (at most 64 KiB per sandbox each time).
const ENTRYPOINT_PERSIST_EVERY: Duration = Duration::from_secs(5);
/// Why a sandbox whose entrypoint ended is Failed.
pub const ENTRYPOINT_EXITED: &str = "ENTRYPOINT_EXITED";

/// Commands started through the execd API, per sandbox, for status, logs and interrupt. Also
/// caches what is looked up once per sandbox (its shell, its user and group names).
#[derive(Default)]
pub struct Commands {
    sandboxes: Mutex<HashMap<String, PerSandbox>>,
    /// Code-interpreter contexts and bash sessions (`/code`, `/session`).
    pub(super) contexts: super::code::Contexts,
}

#[derive(Default)]
struct PerSandbox {
    commands: HashMap<String, Arc<Command>>,
    /// Command ids, oldest first, for forgetting old finished commands.
    order: VecDeque<String>,
    shell: Option<&'static str>,
    names: Option<Arc<Names>>,
    /// The last CPU reading (nanoseconds used, at Unix ms), for CPU use as a rate.
    cpu_sample: Option<(u64, u64)>,
    /// The sandbox's entrypoint, kept apart so that it is never forgotten with old commands.
    entrypoint: Option<Arc<Command>>,
}

struct Command {
    id: String,
    content: String,
    background: bool,
    started_at_ms: i64,
    /// Signals for the task that owns the execution (it alone may touch it).
    signals: mpsc::UnboundedSender<i32>,
    status: Mutex<Status>,
    /// Woken when the command ends (`status.running` turns false).
    ended: tokio::sync::Notify,
}

impl Command {
    async fn wait_ended(&self) {
        loop {
            // Created before the check, so an end in between is not missed.
            let ended = self.ended.notified();
            if !lock(&self.status).running {
                return;
            }
            ended.await;
        }
    }

    /// What is kept of it now: the newest `keep` bytes of its log and how it ended.
    fn snapshot(&self, keep: usize) -> crate::store::EntrypointLog {
        let s = lock(&self.status);
        let (tail, truncated) = match &s.log {
            Some(log) => {
                let from = log.end().saturating_sub(keep as u64);
                (log.read_from(from), from > 0)
            }
            None => (Vec::new(), false),
        };
        crate::store::EntrypointLog {
            command: self.content.clone(),
            tail,
            truncated,
            exit_code: s.exit_code,
            error: s.error.clone(),
            started_at_ms: self.started_at_ms,
            finished_at_ms: s.finished_at_ms,
        }
    }
}

struct Status {
    running: bool,
    exit_code: Option<i32>,
    error: Option<String>,
    finished_at_ms: Option<i64>,
    log: Option<TailLog>,
}

/// A command just started: its record, its output streams and its end.
struct Started {
    command: Arc<Command>,
    stdout: ByteReader,
    stderr: ByteReader,
    done: oneshot::Receiver<Result<ExecOutcome, RuntimeError>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data behind, still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn new_command_id() -> String {
    super::unique_hex::<12>()
}

impl Commands {
    /// Starts a sandbox's entrypoint (`argv`, run directly) in the background: its output is
    /// kept in a bounded log, copied to the state database every few seconds, and when it
    /// ends the sandbox is marked Failed with its exit status and last output.
    pub async fn spawn_entrypoint(&self, state: &ExecdState, id: &SandboxId, argv: Vec<String>) -> ApiResult<()> {
        let content = argv.join(" ");
        let env = BTreeMap::from([("EXECD_ENVS".to_owned(), super::env::ENV_FILE.to_owned())]);
        let request = ExecRequest { argv, cwd: None, env, timeout_ms: None, stdin: false };
        let started = self.start(state, id, request, content, true).await?;
        lock(&self.sandboxes).entry(id.as_str().to_owned()).or_default().entrypoint = Some(started.command.clone());
        tokio::spawn(watch_entrypoint(state.clone(), id.clone(), started));
        Ok(())
    }

    /// What this server holds of a sandbox's entrypoint (its newest `keep` bytes of output),
    /// when it started it.
    pub fn entrypoint_log(&self, sandbox: &str, keep: usize) -> Option<crate::store::EntrypointLog> {
        let command = lock(&self.sandboxes).get(sandbox).and_then(|s| s.entrypoint.clone())?;
        Some(command.snapshot(keep))
    }

    /// Drops what is kept about a deleted sandbox's commands.
    pub fn forget_sandbox(&self, id: &str) {
        lock(&self.sandboxes).remove(id);
        self.contexts.forget_sandbox(id);
    }

    fn get(&self, sandbox: &SandboxId, command: &str) -> ApiResult<Arc<Command>> {
        lock(&self.sandboxes).get(sandbox.as_str()).and_then(|s| s.commands.get(command).cloned()).ok_or_else(|| {
            ApiError::not_found(format!(
                "no command {command:?} in sandbox {sandbox}: use the id from the command's init event"
            ))
        })
    }

    fn insert(&self, sandbox: &SandboxId, command: Arc<Command>) {
        let mut all = lock(&self.sandboxes);
        let s = all.entry(sandbox.as_str().to_owned()).or_default();
        s.order.push_back(command.id.clone());
        s.commands.insert(command.id.clone(), command);
        if s.order.len() > KEEP_FINISHED {
            // Forget the oldest finished commands; running ones stay reachable for interrupt.
            let mut excess = s.order.len() - KEEP_FINISHED;
            let commands = &mut s.commands;
            s.order.retain(|id| {
                if excess == 0 {
                    return true;
                }
                let finished = commands.get(id).is_none_or(|c| !lock(&c.status).running);
                if finished {
                    commands.remove(id);
                    excess -= 1;
                }
                !finished
            });
        }
    }

    /// The shell for `command` strings: bash when the sandbox has it, else sh.
    async fn shell(&self, state: &ExecdState, sandbox: &SandboxId) -> ApiResult<&'static str> {
        if let Some(shell) = lock(&self.sandboxes).get(sandbox.as_str()).and_then(|s| s.shell) {
            return Ok(shell);
        }
        let shell = match state.rt.file(sandbox, FileOp::Stat { path: "/bin/bash".into() }).await {
            Ok(FileReply::Stat(s)) if s.kind != FileKind::Dir => "/bin/bash",
            Ok(_) | Err(RuntimeError::File { .. }) => "/bin/sh",
            Err(e) => return Err(e.into()),
        };
        lock(&self.sandboxes).entry(sandbox.as_str().to_owned()).or_default().shell = Some(shell);
        Ok(shell)
    }

    pub(super) fn last_cpu_sample(&self, sandbox: &SandboxId) -> Option<(u64, u64)> {
        lock(&self.sandboxes).get(sandbox.as_str()).and_then(|s| s.cpu_sample)
    }

    pub(super) fn remember_cpu_sample(&self, sandbox: &SandboxId, sample: (u64, u64)) {
        lock(&self.sandboxes).entry(sandbox.as_str().to_owned()).or_default().cpu_sample = Some(sample);
    }

    pub(super) fn cached_names(&self, sandbox: &SandboxId) -> Option<Arc<Names>> {
        lock(&self.sandboxes).get(sandbox.as_str()).and_then(|s| s.names.clone())
    }

    pub(super) fn cache_names(&self, sandbox: &SandboxId, names: Arc<Names>) {
        lock(&self.sandboxes).entry(sandbox.as_str().to_owned()).or_default().names = Some(names);
    }

    /// Commands a client started in a sandbox that are still running (its entrypoint aside).
    pub(crate) fn running_for_clients(&self, sandbox: &SandboxId) -> usize {
        lock(&self.sandboxes).get(sandbox.as_str()).map_or(0, |s| {
            let entrypoint = s.entrypoint.as_ref();
            s.commands
                .values()
                .filter(|c| lock(&c.status).running && !entrypoint.is_some_and(|e| Arc::ptr_eq(e, c)))
                .count()
        })
    }

    fn running(&self, sandbox: &SandboxId) -> usize {
        lock(&self.sandboxes)
            .get(sandbox.as_str())
            .map_or(0, |s| s.commands.values().filter(|c| lock(&c.status).running).count())
    }

    async fn start(
        &self,
        state: &ExecdState,
        sandbox: &SandboxId,
        request: ExecRequest,
        content: String,
        background: bool,
    ) -> ApiResult<Started> {
        if self.running(sandbox) >= MAX_RUNNING_PER_SANDBOX {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "TOO_MANY_COMMANDS",
                format!(
                    "sandbox {sandbox} already runs {MAX_RUNNING_PER_SANDBOX} commands started through the API: wait for some to end or interrupt them (DELETE /command?id=…)"
                ),
            ));
        }
        let Process { stdin: _, stdout, stderr, control: execution } = state.rt.exec(sandbox, request).await?;
        let (signals, signal_rx) = mpsc::unbounded_channel();
        let command = Arc::new(Command {
            id: new_command_id(),
            content,
            background,
            started_at_ms: now_ms(),
            signals,
            status: Mutex::new(Status {
                running: true,
                exit_code: None,
                error: None,
                finished_at_ms: None,
                log: background.then(|| TailLog::new(LOG_CAP)),
            }),
            ended: tokio::sync::Notify::new(),
        });
        self.insert(sandbox, command.clone());
        let (done_tx, done) = oneshot::channel();
        tokio::spawn(supervise(execution, signal_rx, command.clone(), done_tx));
        Ok(Started { command, stdout, stderr, done })
    }
}

/// Owns the execution: forwards signals to it and records how it ended.
async fn supervise(
    mut execution: Box<dyn Execution>,
    mut signals: mpsc::UnboundedReceiver<i32>,
    command: Arc<Command>,
    done: oneshot::Sender<Result<ExecOutcome, RuntimeError>>,
) {
    // `wait` consumes nothing until the exit message is complete, so dropping a pending wait to
    // deliver a signal and waiting again loses nothing.
    let outcome = loop {
        tokio::select! {
            r = execution.wait() => break r,
            Some(sig) = signals.recv() => {
                if let Err(e) = execution.signal(sig).await {
                    tracing::debug!(command = %command.id, "signal {sig}: {e}");
                }
            }
        }
    };
    {
        let mut s = lock(&command.status);
        s.running = false;
        s.finished_at_ms = Some(now_ms());
        match &outcome {
            Ok(o) => {
                s.exit_code = Some(o.exit_code);
                s.error = describe_failure(o);
            }
            Err(e) => s.error = Some(e.to_string()),
        }
    }
    command.ended.notify_waiters();
    let _ = done.send(outcome);
}

fn describe_failure(o: &ExecOutcome) -> Option<String> {
    if o.timed_out {
        Some(format!("timed out and killed (exit status {})", o.exit_code))
    } else if o.oom_killed {
        Some(format!("the sandbox ran out of memory (exit status {})", o.exit_code))
    } else if let Some(sig) = o.signal {
        Some(format!("killed by signal {sig}"))
    } else if o.exit_code != 0 {
        Some(format!("exit status {}", o.exit_code))
    } else {
        None
    }
}

/// Reads a background command's output into its log until both pipes close, or shortly after
/// the command ends.
async fn collect_log(started: Started) {
    let Started { command, stdout, stderr, done } = started;
    let log_into = |mut pipe: ByteReader, command: Arc<Command>| async move {
        let mut buf = vec![0u8; 16 << 10];
        while let Ok(n @ 1..) = pipe.read(&mut buf).await {
            if let Some(log) = lock(&command.status).log.as_mut() {
                log.push(&buf[..n]);
            }
        }
    };
    let both = async { tokio::join!(log_into(stdout, command.clone()), log_into(stderr, command)) };
    tokio::pin!(both);
    tokio::select! {
        _ = &mut both => return,
        _ = done => {}
    }
    let _ = tokio::time::timeout(DRAIN_BACKGROUND_AFTER_EXIT, both).await;
}

/// Keeps an entrypoint's output, copies it to the state database while it runs, and when it
/// ends marks the sandbox Failed with the reason: a sandbox whose entrypoint is gone must not
/// look healthy.
async fn watch_entrypoint(state: ExecdState, sandbox: SandboxId, started: Started) {
    let command = started.command.clone();
    let persist = async {
        let mut stored_end = 0;
        let mut tick = tokio::time::interval(ENTRYPOINT_PERSIST_EVERY);
        loop {
            tick.tick().await;
            let end = lock(&command.status).log.as_ref().map_or(0, TailLog::end);
            if end != stored_end {
                stored_end = end;
                let log = command.snapshot(ENTRYPOINT_TAIL_STORED);
                if let Err(e) = state.store.put_entrypoint_log(sandbox.as_str(), &log).await {
                    tracing::warn!(%sandbox, "storing the entrypoint's output: {e}");
                }
            }
        }
    };
    tokio::select! {
        () = collect_log(started) => {}
        () = persist => {}
    }
    // Its pipes may close long before it ends.
    command.wait_ended().await;
    let log = command.snapshot(ENTRYPOINT_TAIL_STORED);
    if let Err(e) = state.store.put_entrypoint_log(sandbox.as_str(), &log).await {
        tracing::warn!(%sandbox, "storing the entrypoint's output: {e}");
    }
    // Without an exit status the runtime lost the command (the sandbox was deleted, expired
    // or failed); the sandbox's own state says so, not the entrypoint's.
    let Some(code) = log.exit_code else { return };
    match state.rt.get(&sandbox).await {
        Ok(info) if info.state != paddock_core::runtime::SandboxState::Failed => {}
        _ => return,
    }
    let message = entrypoint_failure(&sandbox, &log, code);
    match state.store.get(sandbox.as_str()).await {
        Ok(Some(row)) if matches!(row.state, LifecycleState::Running | LifecycleState::Paused) => {
            tracing::info!(%sandbox, "{message}");
            if let Err(e) =
                state.store.set_state(&row.id, LifecycleState::Failed, Some(ENTRYPOINT_EXITED), Some(&message)).await
            {
                tracing::warn!(%sandbox, "recording the entrypoint's exit: {e}");
            }
        }
        _ => {}
    }
}

/// Most of an entrypoint's last output quoted in a Failed sandbox's status message.
const LAST_OUTPUT_IN_MESSAGE: usize = 1024;

/// The status message of a sandbox whose entrypoint ended: how, and its last output.
fn entrypoint_failure(sandbox: &SandboxId, log: &crate::store::EntrypointLog, code: i32) -> String {
    let how = log.error.clone().unwrap_or_else(|| format!("exit status {code}"));
    let text = String::from_utf8_lossy(&log.tail);
    let text = text.trim_end();
    let mut start = text.len().saturating_sub(LAST_OUTPUT_IN_MESSAGE);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let last = &text[start..];
    let hint = if code == 127 { " (127: the program was not found in the sandbox)" } else { "" };
    let mut message = format!("the entrypoint `{}` ended: {how}{hint}", log.command);
    if last.is_empty() {
        message.push_str("; it wrote no output");
    } else {
        message.push_str(&format!("; its last output: {}{last}", if start > 0 || log.truncated { "…" } else { "" }));
    }
    message.push_str(&format!(
        " (all of it: GET /v1/sandboxes/{sandbox}/diagnostics/logs?scope=container, or `paddock logs {sandbox}`)"
    ));
    message
}

#[derive(Deserialize)]
struct RunCommandRequest {
    command: Option<String>,
    argv: Option<Vec<String>>,
    cwd: Option<String>,
    #[serde(default)]
    background: bool,
    timeout: Option<i64>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    uid: Option<i64>,
    gid: Option<i64>,
}

/// `~` is the sandbox user's home, `/workspace`; relative paths the runtime resolves itself.
pub(super) fn expand_home(path: String) -> String {
    match path.strip_prefix('~') {
        Some("") => "/workspace".into(),
        Some(rest) if rest.starts_with('/') => format!("/workspace{rest}"),
        _ => path,
    }
}

/// `POST /command`.
pub async fn run(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    body: Bytes,
) -> ApiResult<Response> {
    let req: RunCommandRequest = serde_json::from_slice(&body)
        .map_err(|e| invalid_body(format!("invalid command request: {e}: send {{\"command\": \"...\"}}")))?;
    if req.gid.is_some() && req.uid.is_none() {
        return Err(invalid_body("gid needs uid: give both, or neither"));
    }
    if req.uid.is_some() {
        let user = state.rt.get(&sandbox).await?.spec.user;
        let same_user = req.uid == Some(i64::from(user.uid)) && req.gid.is_none_or(|g| g == i64::from(user.gid));
        if !same_user {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "NOT_SUPPORTED",
                format!(
                    "commands run as the sandbox user (uid {}, gid {}); another uid or gid is not supported",
                    user.uid, user.gid
                ),
            ));
        }
    }
    let (argv, content) = match (req.command, req.argv) {
        (Some(_), Some(_)) => return Err(invalid_body("give either command or argv, not both")),
        (Some(c), None) if !c.trim().is_empty() => {
            let shell = state.commands.shell(&state, &sandbox).await?;
            (vec![shell.to_owned(), "-c".to_owned(), c.clone()], c)
        }
        (None, Some(argv)) if argv.first().is_some_and(|a| !a.is_empty()) => {
            let content = argv.join(" ");
            (argv, content)
        }
        _ => return Err(invalid_body("no command given: send a non-empty command string or argv list")),
    };
    let timeout_ms = super::timeout_ms(req.timeout)?;
    // Variables persisted with set_env, then the request's own, which win.
    let mut env = super::env::persisted_env(&state, &sandbox).await?;
    env.extend(req.envs);
    env.entry("EXECD_ENVS".to_owned()).or_insert_with(|| super::env::ENV_FILE.to_owned());
    let request = ExecRequest { argv, cwd: req.cwd.map(expand_home), env, timeout_ms, stdin: false };
    request.validate()?;
    let started = state.commands.start(&state, &sandbox, request, content, req.background).await?;
    let init = Event::init(&started.command.id, now_ms()).frame();
    if req.background {
        let complete = Event::complete(0, now_ms()).frame();
        tokio::spawn(collect_log(started));
        return Ok(super::stream_headers([init, complete].concat().into_response()));
    }
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    // Cannot fail: the channel is new and has room.
    let _ = tx.try_send(init);
    tokio::spawn(stream_output(state, started, tx, Instant::now()));
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, Infallible>));
    Ok(super::stream_headers(body.into_response()))
}

/// Reads from `pipe` when there is one; never completes otherwise.
async fn read_some(pipe: &mut Option<ByteReader>, buf: &mut [u8]) -> std::io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Sends the output of a foreground command as it arrives, then its end. Stops (killing the
/// command's process group) as soon as the client goes away.
async fn stream_output(state: ExecdState, started: Started, tx: mpsc::Sender<Bytes>, t0: Instant) {
    let Started { command, stdout, stderr, done } = started;
    let relayed = relay_output(stdout, stderr, done, &tx).await;
    if relayed.client_gone {
        if relayed.outcome.is_none() {
            let _ = command.signals.send(SIGKILL);
        }
        return;
    }
    let elapsed = t0.elapsed();
    state.metrics.exec_seconds.observe(elapsed.as_secs_f64());
    let last = match relayed.outcome {
        Some(Ok(o)) if o.exit_code == 0 => Event::complete(paddock_core::units::millis(elapsed), now_ms()),
        Some(Ok(o)) => Event::exec_error(o.exit_code.to_string(), now_ms()),
        // The sandbox went away under the command; there is no exit code to report.
        Some(Err(e)) => Event::exec_error(e.to_string(), now_ms()),
        None => Event::exec_error("the command ended without an exit status".into(), now_ms()),
    };
    let _ = tx.send(last.frame()).await;
}

/// How a command's output stream ended.
struct Relayed {
    /// How the command ended, when that became known.
    outcome: Option<Result<ExecOutcome, RuntimeError>>,
    /// The client went away before the end.
    client_gone: bool,
}

/// One of a command's output streams, sent line by line as events.
struct Stream {
    pipe: Option<ByteReader>,
    kind: &'static str,
    lines: LineSplitter,
    buf: Vec<u8>,
    /// Bytes read after the command's exit was known.
    after_exit: usize,
}

impl Stream {
    fn new(pipe: ByteReader, kind: &'static str) -> Self {
        Stream { pipe: Some(pipe), kind, lines: LineSplitter::default(), buf: vec![0u8; 32 << 10], after_exit: 0 }
    }

    /// Sends the complete lines of what a read gave. A stream that ended, failed, or gave its
    /// share after the exit is closed.
    async fn take(&mut self, read: std::io::Result<usize>, exited: bool, tx: &mpsc::Sender<Bytes>) -> Result<(), ()> {
        let Ok(n @ 1..) = read else { return self.close(tx).await };
        send_lines(tx, self.kind, self.lines.push(&self.buf[..n])).await?;
        if exited {
            self.after_exit += n;
            if self.after_exit >= PIPE_MAX {
                return self.close(tx).await;
            }
        }
        Ok(())
    }

    /// Stops reading and sends the last line, even without its newline.
    async fn close(&mut self, tx: &mpsc::Sender<Bytes>) -> Result<(), ()> {
        self.pipe = None;
        send_lines(tx, self.kind, self.lines.finish().into_iter().collect()).await
    }
}

/// Sends a command's output, line by line as events, until its streams end and its exit is
/// known, or its streams waited [`DRAIN_AFTER_EXIT`] in all after the exit.
async fn relay_output(
    stdout: ByteReader,
    stderr: ByteReader,
    mut done: oneshot::Receiver<Result<ExecOutcome, RuntimeError>>,
    tx: &mpsc::Sender<Bytes>,
) -> Relayed {
    let (mut stdout, mut stderr) = (Stream::new(stdout, "stdout"), Stream::new(stderr, "stderr"));
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    let mut outcome = None;
    let mut wait_left = DRAIN_AFTER_EXIT;
    let gone = |outcome| Relayed { outcome, client_gone: true };
    while outcome.is_none() || stdout.pipe.is_some() || stderr.pipe.is_some() {
        let exited = outcome.is_some();
        let waiting_since = tokio::time::Instant::now();
        let step = tokio::select! {
            _ = tx.closed() => Step::ClientGone,
            r = read_some(&mut stdout.pipe, &mut stdout.buf) => Step::Stdout(r),
            r = read_some(&mut stderr.pipe, &mut stderr.buf) => Step::Stderr(r),
            r = &mut done, if !exited => Step::Exited(r),
            _ = tokio::time::sleep(wait_left), if exited => break,
            _ = ping.tick() => Step::Ping,
        };
        if exited {
            // Only the wait counts: what follows (a send to a slow client) costs nothing here.
            wait_left = wait_left.saturating_sub(waiting_since.elapsed());
        }
        let sent = match step {
            Step::ClientGone => Err(()),
            Step::Stdout(r) => stdout.take(r, exited, tx).await,
            Step::Stderr(r) => stderr.take(r, exited, tx).await,
            Step::Exited(r) => {
                outcome =
                    Some(r.unwrap_or_else(|_| Err(RuntimeError::System("the command's supervisor ended".into()))));
                Ok(())
            }
            Step::Ping => tx.send(Event::ping(now_ms()).frame()).await.map_err(drop),
        };
        if sent.is_err() {
            return gone(outcome);
        }
    }
    // Output still in flight from processes that outlived the command ends here.
    let tails = match stdout.close(tx).await {
        Ok(()) => stderr.close(tx).await,
        Err(()) => Err(()),
    };
    match tails {
        Ok(()) => Relayed { outcome, client_gone: false },
        Err(()) => gone(outcome),
    }
}

/// What woke [`relay_output`] up.
enum Step {
    ClientGone,
    Stdout(std::io::Result<usize>),
    Stderr(std::io::Result<usize>),
    Exited(Result<Result<ExecOutcome, RuntimeError>, oneshot::error::RecvError>),
    Ping,
}

/// Sends the lines of one read as one chunk: each line is its own event, but a burst of output
/// costs one write instead of one per line.
async fn send_lines(tx: &mpsc::Sender<Bytes>, kind: &'static str, lines: Vec<String>) -> Result<(), ()> {
    if lines.is_empty() {
        return Ok(());
    }
    let ts = now_ms();
    let chunk: Vec<u8> = lines.into_iter().flat_map(|line| Event::text(kind, line, ts).frame()).collect();
    tx.send(Bytes::from(chunk)).await.map_err(drop)
}

/// `DELETE /command?id=`: kills the command's process group.
pub async fn interrupt(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
) -> ApiResult<StatusCode> {
    let q = parse_query(raw.as_deref());
    let id = query_one(&q, "id").ok_or_else(|| missing_query("id", "the command id to interrupt"))?;
    let command = state.commands.get(&sandbox, id)?;
    if lock(&command.status).running {
        let _ = command.signals.send(SIGKILL);
    }
    Ok(StatusCode::OK)
}

#[derive(Serialize)]
struct CommandStatus<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    content: &'a str,
    running: bool,
    exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    started_at: String,
    finished_at: Option<String>,
}

/// `GET /command/status/{cmd}`.
pub async fn status(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    ApiPath(CommandParam { cmd }): ApiPath<CommandParam>,
) -> ApiResult<Response> {
    let command = state.commands.get(&sandbox, &cmd)?;
    let s = lock(&command.status);
    let body = CommandStatus {
        id: &command.id,
        content: &command.content,
        running: s.running,
        exit_code: s.exit_code,
        error: s.error.clone(),
        started_at: rfc3339(command.started_at_ms),
        finished_at: s.finished_at_ms.map(rfc3339),
    };
    Ok(axum::Json(body).into_response())
}

/// `GET /command/{cmd}/logs?cursor=`: a background command's output from `cursor` on, and the
/// cursor to continue from.
pub async fn logs(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    ApiPath(CommandParam { cmd }): ApiPath<CommandParam>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let command = state.commands.get(&sandbox, &cmd)?;
    let q = parse_query(raw.as_deref());
    // execd reads a malformed cursor as 0.
    let cursor = query_one(&q, "cursor").and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
    let (bytes, next) = {
        let s = lock(&command.status);
        match (&s.log, command.background) {
            (Some(log), true) => (log.read_from(cursor), log.end()),
            _ => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "INVALID_REQUEST_BODY",
                    format!("command {} is not running in background: its output was in its event stream", command.id),
                ));
            }
        }
    };
    let mut r = bytes.into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert("execd-commands-tail-cursor", HeaderValue::from(next));
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homes_expand_to_the_workspace() {
        assert_eq!(expand_home("~".into()), "/workspace");
        assert_eq!(expand_home("~/a".into()), "/workspace/a");
        assert_eq!(expand_home("~x".into()), "~x");
        assert_eq!(expand_home("rel".into()), "rel");
    }

    #[test]
    fn failures_are_described() {
        let ok = ExecOutcome { exit_code: 0, signal: None, timed_out: false, oom_killed: false };
        assert_eq!(describe_failure(&ok), None);
        assert_eq!(describe_failure(&ExecOutcome { exit_code: 3, ..ok }).as_deref(), Some("exit status 3"));
        assert!(describe_failure(&ExecOutcome { exit_code: 137, signal: Some(9), ..ok }).unwrap().contains("signal 9"));
        assert!(
            describe_failure(&ExecOutcome { exit_code: 124, timed_out: true, ..ok }).unwrap().contains("timed out")
        );
    }

    #[test]
    fn run_requests_parse_like_the_sdk_sends_them() {
        let r: RunCommandRequest =
            serde_json::from_slice(br#"{"command":"ls","background":true,"timeout":5000,"envs":{"A":"1"},"uid":1000}"#)
                .unwrap();
        assert_eq!(r.command.as_deref(), Some("ls"));
        assert!(r.background);
        assert_eq!(r.timeout, Some(5000));
        assert_eq!(r.envs.get("A").map(String::as_str), Some("1"));
        let r: RunCommandRequest = serde_json::from_slice(br#"{"argv":["python3","-c","print(1)"]}"#).unwrap();
        assert_eq!(r.argv.unwrap().len(), 3);
        assert!(!r.background);
    }

    /// As the Kubernetes runtime hands output over: all of it written into the streams, their
    /// end, then the exit; a client slower than the wait after the exit still gets every line
    /// of both streams. (The server once raced that wait against output already waiting, and
    /// lost the race half the time: the Kubernetes lane lost 399 of 20000 lines in one run and
    /// the last line of stderr in another.)
    #[tokio::test]
    async fn a_slow_client_gets_all_the_output_left_in_the_streams_at_the_exit() {
        use tokio::io::AsyncWriteExt;
        const LINES: usize = 60000;
        let (mut out_w, out_r) = tokio::io::duplex(1 << 20);
        let (mut err_w, err_r) = tokio::io::duplex(64 << 10);
        let (done_tx, done) = oneshot::channel();
        tokio::spawn(async move {
            let text: String = (1..=LINES).map(|i| format!("{i}\n")).collect();
            out_w.write_all(text.as_bytes()).await.unwrap();
            out_w.shutdown().await.unwrap();
            err_w.write_all(b"done\n").await.unwrap();
            err_w.shutdown().await.unwrap();
            let ok = ExecOutcome { exit_code: 0, signal: None, timed_out: false, oom_killed: false };
            let _ = done_tx.send(Ok(ok));
        });
        let (tx, mut rx) = mpsc::channel(1);
        let relay = tokio::spawn(async move { relay_output(Box::new(out_r), Box::new(err_r), done, &tx).await });
        let mut got = Vec::new();
        while let Some(chunk) = rx.recv().await {
            tokio::time::sleep(DRAIN_AFTER_EXIT * 3 / 2).await;
            got.extend_from_slice(&chunk);
        }
        let relayed = relay.await.unwrap();
        assert!(!relayed.client_gone);
        assert!(matches!(relayed.outcome, Some(Ok(ExecOutcome { exit_code: 0, .. }))));
        let events: Vec<serde_json::Value> = String::from_utf8(got)
            .unwrap()
            .split("\n\n")
            .filter_map(|frame| frame.strip_prefix("data: "))
            .map(|json| serde_json::from_str(json).unwrap())
            .collect();
        let text_of = |kind: &str| -> Vec<String> {
            events.iter().filter(|e| e["type"] == kind).map(|e| e["text"].as_str().unwrap().to_owned()).collect()
        };
        let lines = text_of("stdout");
        assert_eq!(text_of("stderr"), ["done"], "the stderr written last was lost");
        assert_eq!(lines.len(), LINES, "lines lost; the last one that arrived: {:?}", lines.last());
        assert!(lines.iter().enumerate().all(|(i, l)| *l == (i + 1).to_string()), "lines out of order");
    }

    /// Processes a command left behind that go on writing after its exit, one a line every
    /// 5 ms on stderr and one as fast as it can on stdout, hold its stream neither by the clock
    /// nor by the amount: it ends, with at most about a pipe's worth more of the flood.
    #[tokio::test]
    async fn output_that_goes_on_after_the_exit_does_not_hold_the_stream() {
        use tokio::io::AsyncWriteExt;
        let (mut out_w, out_r) = tokio::io::duplex(64 << 10);
        let (mut err_w, err_r) = tokio::io::duplex(64 << 10);
        let (done_tx, done) = oneshot::channel();
        let ok = ExecOutcome { exit_code: 0, signal: None, timed_out: false, oom_killed: false };
        done_tx.send(Ok(ok)).unwrap();
        let flood = tokio::spawn(async move {
            let line = [b'y', b'\n'].repeat(4096);
            let mut written = 0usize;
            while out_w.write_all(&line).await.is_ok() {
                written += line.len();
            }
            written
        });
        let trickle = tokio::spawn(async move {
            while err_w.write_all(b"tick\n").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let (tx, mut rx) = mpsc::channel(8);
        let relay = tokio::spawn(async move { relay_output(Box::new(out_r), Box::new(err_r), done, &tx).await });
        let mut got = 0usize;
        let counted = async {
            while let Some(chunk) = rx.recv().await {
                got += chunk.len();
            }
        };
        tokio::time::timeout(Duration::from_secs(20), counted)
            .await
            .expect("output written after the exit held the stream open");
        let relayed = relay.await.unwrap();
        assert!(!relayed.client_gone);
        // The relay dropped the pipes' ends: both writers stop.
        let flooded = flood.await.unwrap();
        trickle.await.unwrap();
        assert!(flooded >= PIPE_MAX, "the flood stopped at {flooded} bytes: the stream ended for another reason");
        // Each 2-byte line becomes an event of about 60 bytes.
        assert!(got < 100 * PIPE_MAX, "{got} bytes of events for a cap of {PIPE_MAX} bytes of output");
    }

    #[test]
    fn command_ids_are_unique() {
        assert_ne!(new_command_id(), new_command_id());
        assert_eq!(new_command_id().len(), 24);
    }
}
