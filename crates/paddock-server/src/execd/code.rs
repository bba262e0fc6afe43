//! `/code`: persistent code-interpreter contexts (Python, JavaScript, Bash), and the driver
//! engine that `/session` (persistent bash sessions) shares.
//!
//! Every context is one driver process in the sandbox, started with `Runtime::exec`, so this
//! works on any runtime. The seam gives a process only stdin, stdout and stderr, so:
//! requests go to the driver's stdin (JSON lines; shell lines for bash), the user's code reads
//! `/dev/null`, and the driver's structured replies (result, error, exit code, done) are
//! marker lines on stdout — a byte 0x1E, `PADDOCK-<nonce> `, JSON — after the user's output,
//! which it flushes first. A done marker on stderr says stderr is drained as well. The nonce is
//! random per context, so ordinary output never looks like a marker.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use paddock_core::runtime::{ByteReader, ByteWriter, ExecOutcome, ExecRequest, Execution, Process, SandboxId};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::ExecdState;
use super::stream_headers;
use super::text::{LineSplitter, parse_query, query_one};
use super::{ApiPath, ContextParam, InSandbox, invalid_body, missing_query};
use crate::error::{ApiError, ApiResult};
use crate::store::now_ms;

const PYTHON_DRIVER: &str = include_str!("drivers/python.py");
const NODE_DRIVER: &str = include_str!("drivers/node.js");
const BASH_DRIVER: &str = include_str!("drivers/bash.sh");
const JAVA_DRIVER: &str = include_str!("drivers/PaddockDriver.java");
const GO_DRIVER: &str = include_str!("drivers/driver.go");
/// Builds the Go driver (its `$1`) with the image's `go` and runs it (it removes its build
/// directory once started, as the Java driver does). The build cache goes to
/// the sandbox's /tmp unless one is set (a sandbox's HOME may be read-only), and no toolchain
/// is ever downloaded.
const GO_LAUNCH: &str = "d=$(mktemp -d) && printf '%s' \"$1\" > \"$d/driver.go\" && export GOCACHE=\"${GOCACHE:-${TMPDIR:-/tmp}/.paddock-go-cache}\" GOTOOLCHAIN=\"${GOTOOLCHAIN:-local}\" && go build -o \"$d/driver\" \"$d/driver.go\" && rm -f \"$d/driver.go\" && exec \"$d/driver\" \"$d\"";
/// Writes the Java driver (its `$1`) to a directory of its own and runs it from source; the
/// driver removes the directory once started.
const JAVA_LAUNCH: &str = "d=$(mktemp -d) && printf '%s' \"$1\" > \"$d/PaddockDriver.java\" && exec java -XX:TieredStopAtLevel=1 \"$d/PaddockDriver.java\" \"$d\"";

/// Most code contexts (and, separately, bash sessions) per sandbox: each is a process in the
/// sandbox and a few descriptors and a task in the server.
pub const MAX_CONTEXTS_PER_SANDBOX: usize = 32;
/// How long a new driver may take to say it is ready (an interpreter's cold start on a busy
/// machine; the SDK's own request timeout is 30 s).
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// After an interrupt, how long a run may take to stop before its driver is killed (its
/// context then starts afresh).
const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// How often an interrupt is repeated while its run goes on.
const INTERRUPT_AGAIN: Duration = Duration::from_millis(400);
/// After stdout's done marker, how long stderr's may take (a driver writes them back to back).
const STDERR_DRAIN: Duration = Duration::from_secs(2);
const PING_EVERY: Duration = Duration::from_secs(3);
const STREAM_BUFFER: usize = 64;
/// A marker longer than this is not one: results carry images, so it is generous, but it bounds
/// what a sandbox can make the server buffer per context.
const MAX_MARKER: usize = 8 << 20;
/// Bytes of events one run may have queued for a client that reads slowly: beyond them the
/// run (and so its driver, whose pipes fill) waits. Counting events alone would let a few
/// large results pile up gigabytes in the server.
const STREAM_BYTES: usize = 4 << 20;
/// How long handing a cell to its driver may take before the driver counts as dead.
const REQUEST_WRITE_TIMEOUT: Duration = Duration::from_secs(15);
/// A `text/plain` result larger than this travels once, as `text` (what every SDK reads),
/// instead of under both keys.
const DUPLICATE_TEXT_MAX: usize = 64 << 10;
const SIGINT: i32 = 2;
const SIGKILL: i32 = 9;
/// The message the SDK's helpers recognise for a context that already runs something.
const BUSY: &str = "error running codes session is busy";

/// Languages a context can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Language {
    Python,
    JavaScript,
    /// On the Node driver, each cell turned into JavaScript first (`drivers/node.js`).
    TypeScript,
    /// A JShell per context (`drivers/PaddockDriver.java`).
    Java,
    /// Each cell a program, declarations kept (`drivers/driver.go`).
    Go,
    Bash,
}

impl Language {
    pub(super) fn parse(name: &str) -> ApiResult<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "python" | "python3" => Ok(Self::Python),
            "javascript" | "js" | "node" => Ok(Self::JavaScript),
            "typescript" | "ts" => Ok(Self::TypeScript),
            "java" => Ok(Self::Java),
            "go" | "golang" => Ok(Self::Go),
            "bash" | "shell" | "sh" => Ok(Self::Bash),
            other => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "LANGUAGE_NOT_SUPPORTED",
                format!(
                    "language {other:?} is not supported by Paddock's code interpreter: use python, javascript, typescript, java, go or bash"
                ),
            )),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::JavaScript => "javascript",
            Self::TypeScript => "typescript",
            Self::Java => "java",
            Self::Go => "go",
            Self::Bash => "bash",
        }
    }

    /// How long a driver may take to say it is ready: Java starts two JVMs, and Go builds its
    /// driver, which the first time in a sandbox compiles the parts of the standard library
    /// it needs (about 10 s on 2 cores).
    fn ready_timeout(self) -> Duration {
        match self {
            Self::Java => Duration::from_secs(60),
            Self::Go => Duration::from_secs(120),
            _ => READY_TIMEOUT,
        }
    }

    fn interpreter(self) -> &'static str {
        match self {
            Self::Python => "python3",
            Self::JavaScript | Self::TypeScript => "node",
            Self::Java => "java",
            Self::Go => "go",
            Self::Bash => "bash",
        }
    }

    fn argv(self) -> Vec<String> {
        let v: &[&str] = match self {
            Self::Python => &["python3", "-c", PYTHON_DRIVER],
            Self::JavaScript | Self::TypeScript => &["node", "-e", NODE_DRIVER],
            Self::Java => &["sh", "-c", JAVA_LAUNCH, "sh", JAVA_DRIVER],
            Self::Go => &["sh", "-c", GO_LAUNCH, "sh", GO_DRIVER],
            // The driver is fed on stdin (see `request`), which stays the request channel.
            Self::Bash => &["bash", "--noprofile", "--norc", "-s"],
        };
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The bytes that ask the driver to run `code` (in `cwd` for this run, bash only).
    fn request(self, code: &str, cwd: Option<&str>) -> Vec<u8> {
        match self {
            Self::Python | Self::JavaScript | Self::TypeScript | Self::Java | Self::Go => {
                let mut line = serde_json::to_vec(&json!({ "code": code })).unwrap_or_default();
                line.push(b'\n');
                line
            }
            Self::Bash => bash_request(code, cwd).into_bytes(),
        }
    }
}

/// `s` as a bash `$'…'` word: every byte but `'`, `\` and control characters stands for itself.
/// NUL cannot be passed to a shell at all and is dropped.
pub(super) fn bash_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 3);
    out.push_str("$'");
    for c in s.chars() {
        match c {
            '\0' => {}
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// One run for the bash driver: shell lines it reads from stdin and runs at top level. The cell
/// is written to a file and sourced with stdin from /dev/null, so heredocs and reads in it stay
/// away from the request channel; a `cwd` applies to this run only, unless the cell moves on.
fn bash_request(code: &str, cwd: Option<&str>) -> String {
    let mut s = String::from("__paddock_prev=; __paddock_here=; ");
    let write_and_source =
        format!("{{ printf '%s' {} >\"$__PADDOCK_CELL\" && . \"$__PADDOCK_CELL\" </dev/null; }}", bash_quote(code));
    match cwd {
        Some(dir) => s.push_str(&format!(
            "__paddock_prev=$PWD; cd -- {} && {{ __paddock_here=$PWD; {write_and_source}; }}; __paddock_rc=$?; \
             if [ -n \"$__paddock_here\" ] && [ \"$PWD\" = \"$__paddock_here\" ]; then cd -- \"$__paddock_prev\"; fi; ",
            bash_quote(dir)
        )),
        None => s.push_str(&format!("{write_and_source}; __paddock_rc=$?; ")),
    }
    s.push_str(
        "printf '%s{\"t\":\"exit\",\"code\":%d}\\n' \"$__PADDOCK_MARK\" \"$__paddock_rc\"; \
         printf '%s{\"t\":\"done\"}\\n' \"$__PADDOCK_MARK\"; printf '%s{\"t\":\"done\"}\\n' \"$__PADDOCK_MARK\" >&2\n",
    );
    s
}

/// A piece of a driver's output stream.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Piece {
    /// The user's output.
    Output(Vec<u8>),
    /// A marker's JSON.
    Marker(Vec<u8>),
}

/// Splits a driver's stream into the user's output and marker lines (`\x1ePADDOCK-<nonce> JSON\n`).
/// Output is passed on at once; only bytes that may begin a marker wait for more. Linear in the
/// bytes pushed: the buffer is consumed once per push, and a waiting marker is searched for its
/// end only in bytes not searched before.
pub(super) struct Framer {
    marker: Vec<u8>,
    pending: Vec<u8>,
    /// Bytes of `pending` (a marker waiting for its newline) already searched for it.
    scanned: usize,
}

impl Framer {
    pub(super) fn new(nonce: &str) -> Self {
        Self { marker: format!("\x1ePADDOCK-{nonce} ").into_bytes(), pending: Vec::new(), scanned: 0 }
    }

    pub(super) fn push(&mut self, data: &[u8]) -> Vec<Piece> {
        self.pending.extend_from_slice(data);
        let mut pieces = Vec::new();
        let mut output = Vec::new();
        let mut at = 0;
        loop {
            let Some(i) = self.pending[at..].iter().position(|&b| b == 0x1e) else {
                output.extend_from_slice(&self.pending[at..]);
                at = self.pending.len();
                break;
            };
            output.extend_from_slice(&self.pending[at..at + i]);
            at += i;
            let rest = &self.pending[at..];
            if rest.len() < self.marker.len() {
                if self.marker.starts_with(rest) {
                    break; // may be a marker: wait for more
                }
            } else if rest.starts_with(&self.marker) {
                let from = self.scanned.max(self.marker.len());
                if let Some(end) = rest[from..].iter().position(|&b| b == b'\n').map(|e| e + from) {
                    if !output.is_empty() {
                        pieces.push(Piece::Output(std::mem::take(&mut output)));
                    }
                    pieces.push(Piece::Marker(rest[self.marker.len()..end].to_vec()));
                    at += end + 1;
                    self.scanned = 0;
                    continue;
                }
                if rest.len() <= MAX_MARKER {
                    self.scanned = rest.len();
                    break;
                }
            }
            // Not a marker (or one too long to be ours): the byte is the user's.
            self.scanned = 0;
            output.push(0x1e);
            at += 1;
        }
        self.pending.drain(..at);
        if !output.is_empty() {
            pieces.push(Piece::Output(output));
        }
        pieces
    }

    /// What is left once the stream ended: the user's.
    pub(super) fn finish(&mut self) -> Vec<u8> {
        self.scanned = 0;
        std::mem::take(&mut self.pending)
    }
}

/// Turns output bytes into text without splitting a UTF-8 character across events.
#[derive(Default)]
pub(super) struct Utf8Chunks {
    carry: Vec<u8>,
}

impl Utf8Chunks {
    pub(super) fn push(&mut self, data: &[u8]) -> String {
        self.carry.extend_from_slice(data);
        let mut cut = self.carry.len();
        // A lead byte among the last three whose sequence is not complete waits for the rest.
        for back in 1..=3.min(self.carry.len()) {
            let b = self.carry[self.carry.len() - back];
            if b & 0xC0 == 0xC0 {
                let need = if b >= 0xF0 {
                    4
                } else if b >= 0xE0 {
                    3
                } else {
                    2
                };
                if need > back {
                    cut = self.carry.len() - back;
                }
                break;
            }
            if b & 0xC0 != 0x80 {
                break;
            }
        }
        let text = String::from_utf8_lossy(&self.carry[..cut]).into_owned();
        self.carry.drain(..cut);
        text
    }

    pub(super) fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.carry).into_owned();
        self.carry.clear();
        text
    }
}

/// One event line, as the SDKs parse it: SSE `data:` framing, integer-ms `timestamp`.
pub(super) fn frame(mut event: Value) -> Bytes {
    if let Some(o) = event.as_object_mut() {
        o.insert("timestamp".into(), json!(now_ms()));
    }
    let mut out = b"data: ".to_vec();
    out.extend(serde_json::to_vec(&event).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

fn error_event(ename: &str, evalue: &str, traceback: Vec<String>) -> Value {
    json!({"type": "error", "error": {"ename": ename, "evalue": evalue, "traceback": traceback}})
}

/// A running driver process and the framing state of its streams.
struct Driver {
    stdin: ByteWriter,
    stdout: Option<ByteReader>,
    stderr: Option<ByteReader>,
    out: Framer,
    err: Framer,
    /// Resolves once the process ended.
    exited: oneshot::Receiver<Result<ExecOutcome, paddock_core::runtime::RuntimeError>>,
    outcome: Option<ExecOutcome>,
}

/// What a context is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Code,
    Session,
}

pub(super) struct Context {
    pub(super) id: String,
    pub(super) language: Language,
    kind: Kind,
    /// Where a session's shell starts (again, after `exit`).
    cwd: Option<String>,
    /// The driver; held for the whole of a run, so a second run finds it locked.
    driver: Arc<tokio::sync::Mutex<Option<Driver>>>,
    /// Signals for the current driver's execution (interrupt without the run's lock). Dropping
    /// it kills the driver.
    signals: Mutex<Option<mpsc::UnboundedSender<i32>>>,
    running: AtomicBool,
    generation: AtomicU64,
    count: AtomicU64,
}

impl Context {
    fn signal(&self, sig: i32) {
        if let Some(tx) = lock(&self.signals).as_ref() {
            let _ = tx.send(sig);
        }
    }

    /// SIGINT to the running cell; the driver is killed if the run has not ended after a grace
    /// period (the context then starts afresh on its next run).
    ///
    /// The SIGINT is sent again every [`INTERRUPT_AGAIN`] until the run ends: one that comes
    /// before the cell's code started (JShell still compiling it, a timeout that fired while a
    /// loaded machine was starting the command) finds nothing to stop, and the run would go on
    /// until the kill took the context's state with it. Every driver ignores one that finds it
    /// idle.
    pub(super) fn interrupt(self: &Arc<Self>) {
        if !self.running.load(Ordering::SeqCst) {
            return;
        }
        let generation = self.generation.load(Ordering::SeqCst);
        self.signal(SIGINT);
        let ctx = Arc::downgrade(self);
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + INTERRUPT_GRACE;
            loop {
                tokio::time::sleep(INTERRUPT_AGAIN.min(until.saturating_duration_since(tokio::time::Instant::now())))
                    .await;
                let Some(ctx) = ctx.upgrade() else { return };
                if !ctx.running.load(Ordering::SeqCst) || ctx.generation.load(Ordering::SeqCst) != generation {
                    return;
                }
                if tokio::time::Instant::now() >= until {
                    ctx.signal(SIGKILL);
                    return;
                }
                ctx.signal(SIGINT);
            }
        });
    }

    fn describe(&self) -> Value {
        json!({"id": self.id, "language": self.language.name()})
    }
}

impl Context {
    /// Kills the driver now, whether or not a run holds the context: a deleted context must
    /// not keep a cell running that nobody can interrupt any more.
    fn kill(&self) {
        self.signal(SIGKILL);
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.kill();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data behind, still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct PerSandbox {
    contexts: HashMap<String, Arc<Context>>,
    defaults: HashMap<Language, String>,
}

/// The contexts and sessions of every sandbox, in this server's memory (like execd's): they
/// die with their sandbox, and with the server.
#[derive(Default)]
pub struct Contexts {
    sandboxes: Mutex<HashMap<String, PerSandbox>>,
}

impl Contexts {
    /// Drops every context of a deleted sandbox (their drivers are killed).
    pub fn forget_sandbox(&self, id: &str) {
        let gone = lock(&self.sandboxes).remove(id);
        for ctx in gone.iter().flat_map(|s| s.contexts.values()) {
            ctx.kill();
        }
    }

    pub(super) fn get(&self, sandbox: &SandboxId, id: &str, kind: Kind) -> Option<Arc<Context>> {
        lock(&self.sandboxes).get(sandbox.as_str())?.contexts.get(id).filter(|c| c.kind == kind).cloned()
    }

    pub(super) fn remove(&self, sandbox: &SandboxId, id: &str, kind: Kind) -> Option<Arc<Context>> {
        let mut all = lock(&self.sandboxes);
        let s = all.get_mut(sandbox.as_str())?;
        if s.contexts.get(id).is_none_or(|c| c.kind != kind) {
            return None;
        }
        s.defaults.retain(|_, d| d != id);
        let ctx = s.contexts.remove(id);
        if let Some(c) = &ctx {
            c.kill();
        }
        ctx
    }

    fn list(&self, sandbox: &SandboxId, language: Option<Language>) -> Vec<Arc<Context>> {
        let all = lock(&self.sandboxes);
        let mut v: Vec<_> = all
            .get(sandbox.as_str())
            .map(|s| {
                s.contexts
                    .values()
                    .filter(|c| c.kind == Kind::Code && language.is_none_or(|l| c.language == l))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    fn remove_language(&self, sandbox: &SandboxId, language: Language) {
        let gone: Vec<Arc<Context>> = {
            let mut all = lock(&self.sandboxes);
            let Some(s) = all.get_mut(sandbox.as_str()) else { return };
            s.defaults.remove(&language);
            let ids: Vec<String> = s
                .contexts
                .values()
                .filter(|c| c.kind == Kind::Code && c.language == language)
                .map(|c| c.id.clone())
                .collect();
            ids.iter().filter_map(|id| s.contexts.remove(id)).collect()
        };
        for ctx in &gone {
            ctx.kill();
        }
    }

    fn count(&self, sandbox: &SandboxId, kind: Kind) -> usize {
        lock(&self.sandboxes)
            .get(sandbox.as_str())
            .map_or(0, |s| s.contexts.values().filter(|c| c.kind == kind).count())
    }

    fn check_room(&self, sandbox: &SandboxId, kind: Kind) -> ApiResult<()> {
        if self.count(sandbox, kind) < MAX_CONTEXTS_PER_SANDBOX { Ok(()) } else { Err(room_error(sandbox, kind)) }
    }

    /// Starts a driver and registers a new context for it.
    pub(super) async fn create(
        &self,
        state: &ExecdState,
        sandbox: &SandboxId,
        language: Language,
        kind: Kind,
        cwd: Option<String>,
    ) -> ApiResult<Arc<Context>> {
        self.check_room(sandbox, kind)?;
        let ctx = Arc::new(Context {
            id: super::unique_hex::<16>(),
            language,
            kind,
            cwd,
            driver: Arc::new(tokio::sync::Mutex::new(None)),
            signals: Mutex::new(None),
            running: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            count: AtomicU64::new(0),
        });
        let driver = start_driver(state, sandbox, &ctx).await?;
        *ctx.driver.lock().await = Some(driver);
        // Checked again, with the insert under one lock: other creates may have finished while
        // this driver started.
        let mut all = lock(&self.sandboxes);
        let s = all.entry(sandbox.as_str().to_owned()).or_default();
        if s.contexts.values().filter(|c| c.kind == kind).count() >= MAX_CONTEXTS_PER_SANDBOX {
            return Err(room_error(sandbox, kind));
        }
        s.contexts.insert(ctx.id.clone(), ctx.clone());
        Ok(ctx)
    }

    /// The default context of `language`, made on first use.
    async fn default_for(
        &self,
        state: &ExecdState,
        sandbox: &SandboxId,
        language: Language,
    ) -> ApiResult<Arc<Context>> {
        let existing = {
            let all = lock(&self.sandboxes);
            all.get(sandbox.as_str()).and_then(|s| s.defaults.get(&language).and_then(|id| s.contexts.get(id)).cloned())
        };
        if let Some(ctx) = existing {
            return Ok(ctx);
        }
        let ctx = self.create(state, sandbox, language, Kind::Code, None).await?;
        let mut all = lock(&self.sandboxes);
        let s = all.entry(sandbox.as_str().to_owned()).or_default();
        // Two first runs raced: the first default wins, the other context goes.
        if let Some(other) = s.defaults.get(&language).and_then(|id| s.contexts.get(id)).cloned() {
            s.contexts.remove(&ctx.id);
            return Ok(other);
        }
        s.defaults.insert(language, ctx.id.clone());
        Ok(ctx)
    }
}

fn room_error(sandbox: &SandboxId, kind: Kind) -> ApiError {
    let (what, how) = match kind {
        Kind::Code => ("code contexts", "DELETE /code/contexts/{id}"),
        Kind::Session => ("bash sessions", "DELETE /session/{id}"),
    };
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "TOO_MANY_CONTEXTS",
        format!("sandbox {sandbox} already has {MAX_CONTEXTS_PER_SANDBOX} {what}: delete some first ({how})"),
    )
}

/// Starts a context's driver and waits until it says it is ready on both streams.
async fn start_driver(state: &ExecdState, sandbox: &SandboxId, ctx: &Context) -> ApiResult<Driver> {
    let nonce = super::unique_hex::<12>();
    let language = ctx.language;
    // Variables persisted with set_env reach contexts and sessions started later, as commands.
    let mut env = super::env::persisted_env(state, sandbox).await?;
    env.insert("EXECD_ENVS".to_owned(), super::env::ENV_FILE.to_owned());
    env.insert("PADDOCK_CODE_NONCE".to_owned(), nonce.clone());
    if language == Language::Python {
        env.insert("PYTHONIOENCODING".to_owned(), "utf-8".to_owned());
        // No display here: figures are rendered to PNG results after each cell.
        env.insert("MPLBACKEND".to_owned(), "Agg".to_owned());
    }
    if language == Language::TypeScript {
        env.insert("PADDOCK_CODE_LANG".to_owned(), "typescript".to_owned());
    }
    let request = ExecRequest { argv: language.argv(), cwd: ctx.cwd.clone(), env, timeout_ms: None, stdin: true };
    let Process { stdin, stdout, stderr, control } = state.rt.exec(sandbox, request).await.map_err(|e| {
        let e = ApiError::from(e);
        ApiError::new(
            e.status,
            e.code,
            format!("cannot start {} for a {} context: {}", language.interpreter(), language.name(), e.message),
        )
    })?;
    let (signals, signal_rx) = mpsc::unbounded_channel();
    let (done_tx, exited) = oneshot::channel();
    tokio::spawn(supervise(control, signal_rx, done_tx));
    *lock(&ctx.signals) = Some(signals);
    let Some(mut stdin) = stdin else {
        return Err(ApiError::internal("the runtime gave the driver no stdin"));
    };
    if language == Language::Bash {
        // Errors surface below as a driver that never became ready.
        let _ = stdin.write_all(BASH_DRIVER.as_bytes()).await;
        let _ = stdin.flush().await;
    }
    let mut driver = Driver {
        stdin,
        stdout: Some(stdout),
        stderr: Some(stderr),
        out: Framer::new(&nonce),
        err: Framer::new(&nonce),
        exited,
        outcome: None,
    };
    let mut early_err = Vec::new();
    let ready = tokio::time::timeout(language.ready_timeout(), async {
        let (mut out_ready, mut err_ready) = (false, false);
        let (mut ob, mut eb) = (vec![0u8; 8192], vec![0u8; 8192]);
        while !(out_ready && err_ready) {
            tokio::select! {
                r = read_some(&mut driver.stdout, &mut ob) => match r {
                    Ok(n @ 1..) => out_ready |= driver.out.push(&ob[..n]).iter().any(|p| matches!(p, Piece::Marker(_))),
                    _ => { driver.stdout = None; return false; }
                },
                r = read_some(&mut driver.stderr, &mut eb) => match r {
                    Ok(n @ 1..) => {
                        for p in driver.err.push(&eb[..n]) {
                            match p {
                                Piece::Marker(_) => err_ready = true,
                                Piece::Output(o) if early_err.len() < 4096 => early_err.extend(o),
                                Piece::Output(_) => {}
                            }
                        }
                    }
                    _ => { driver.stderr = None; if !out_ready { return false; } }
                },
            }
        }
        true
    })
    .await;
    match ready {
        Ok(true) => Ok(driver),
        Ok(false) => {
            let outcome = tokio::time::timeout(Duration::from_secs(5), &mut driver.exited).await;
            // What it said on the way out says why.
            if let Some(mut e) = driver.stderr.take() {
                let mut rest = Vec::new();
                let _ = tokio::time::timeout(Duration::from_millis(500), e.read_to_end(&mut rest)).await;
                early_err.extend(
                    driver
                        .err
                        .push(&rest)
                        .into_iter()
                        .filter_map(|p| match p {
                            Piece::Output(o) => Some(o),
                            Piece::Marker(_) => None,
                        })
                        .flatten(),
                );
            }
            let said = String::from_utf8_lossy(&early_err[..early_err.len().min(4096)]).trim().to_owned();
            let code = match outcome {
                Ok(Ok(Ok(o))) => Some(o.exit_code),
                _ => None,
            };
            let interp = language.interpreter();
            let message = match code {
                Some(127) => format!(
                    "this sandbox's image has no `{interp}`, needed for {} contexts: use an image that has it{}",
                    language.name(),
                    if said.is_empty() { String::new() } else { format!(" ({said})") }
                ),
                _ => format!(
                    "`{interp}` for a {} context exited{} before it was ready: {}",
                    language.name(),
                    code.map(|c| format!(" with status {c}")).unwrap_or_default(),
                    if said.is_empty() { "it said nothing" } else { &said }
                ),
            };
            // The language is Paddock's, but this image lacks what it needs.
            Err(ApiError::new(StatusCode::BAD_REQUEST, "LANGUAGE_NOT_SUPPORTED", message))
        }
        Err(_) => {
            *lock(&ctx.signals) = None;
            Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "TIMEOUT",
                format!(
                    "`{}` did not start within {}s in sandbox {sandbox}: the sandbox may be overloaded or paused",
                    language.interpreter(),
                    language.ready_timeout().as_secs()
                ),
            ))
        }
    }
}

/// Owns a driver's execution: forwards signals to it, kills it once nobody can signal it any
/// more (its context is gone), and reports how it ended.
async fn supervise(
    mut execution: Box<dyn Execution>,
    mut signals: mpsc::UnboundedReceiver<i32>,
    done: oneshot::Sender<Result<ExecOutcome, paddock_core::runtime::RuntimeError>>,
) {
    let mut open = true;
    let outcome = loop {
        tokio::select! {
            r = execution.wait() => break r,
            s = signals.recv(), if open => {
                let sig = s.unwrap_or_else(|| { open = false; SIGKILL });
                if let Err(e) = execution.signal(sig).await {
                    tracing::debug!("signal {sig} to a code driver: {e}");
                }
            }
        }
    };
    let _ = done.send(outcome);
}

async fn read_some(pipe: &mut Option<ByteReader>, buf: &mut [u8]) -> std::io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

/// How a run's output becomes events.
enum Output {
    /// `/code`: chunks as they come, newlines kept.
    Chunks { out: Utf8Chunks, err: Utf8Chunks },
    /// `/session`: one event per line, like `/command`.
    Lines { out: LineSplitter, err: LineSplitter },
}

impl Output {
    fn events(&mut self, stderr: bool, data: &[u8]) -> Vec<Value> {
        let kind = if stderr { "stderr" } else { "stdout" };
        match self {
            Self::Chunks { out, err } => {
                let text = if stderr { err.push(data) } else { out.push(data) };
                if text.is_empty() { vec![] } else { vec![json!({"type": kind, "text": text})] }
            }
            Self::Lines { out, err } => {
                let lines = if stderr { err.push(data) } else { out.push(data) };
                lines.into_iter().map(|l| json!({"type": kind, "text": l})).collect()
            }
        }
    }

    fn finish(&mut self) -> Vec<Value> {
        let (o, e) = match self {
            Self::Chunks { out, err } => (Some(out.finish()), Some(err.finish())),
            Self::Lines { out, err } => (out.finish(), err.finish()),
        };
        let mut v = Vec::new();
        for (kind, text) in [("stdout", o), ("stderr", e)] {
            if let Some(t) = text.filter(|t| !t.is_empty()) {
                v.push(json!({"type": kind, "text": t}));
            }
        }
        v
    }
}

/// Sends events to the client; once it is gone, the run is interrupted and drained quietly.
struct Sink {
    tx: mpsc::Sender<Frame>,
    gone: bool,
    /// `STREAM_BYTES` of queued events; each frame holds its size until the body sends it.
    budget: Arc<tokio::sync::Semaphore>,
}

/// An event on its way to the client, holding its share of the run's byte budget.
type Frame = (Bytes, Option<tokio::sync::OwnedSemaphorePermit>);

impl Sink {
    async fn send(&mut self, ctx: &Arc<Context>, event: Value) {
        if self.gone {
            return;
        }
        let bytes = frame(event);
        let share = u32::try_from(bytes.len().clamp(1, STREAM_BYTES)).unwrap_or(u32::MAX);
        // Closed only if the semaphore is dropped, which it is not while `self` lives.
        let permit = self.budget.clone().acquire_many_owned(share).await.ok();
        if self.tx.send((bytes, permit)).await.is_err() {
            self.gone = true;
            // Nobody waits for this run any more (E2B does the same).
            ctx.interrupt();
        }
    }
}

/// What to run: the code, a working directory for this run (bash), a time limit.
struct Cell {
    code: String,
    cwd: Option<String>,
    timeout: Option<Duration>,
}

/// Runs one cell on the context's driver (starting a fresh one if the last died), streaming
/// events, and ends with `execution_complete` (code) or the exit status (sessions).
async fn run_cell(
    state: ExecdState,
    sandbox: SandboxId,
    ctx: Arc<Context>,
    mut slot: tokio::sync::OwnedMutexGuard<Option<Driver>>,
    cell: Cell,
    mut sink: Sink,
) {
    let Cell { code, cwd, timeout } = cell;
    let t0 = Instant::now();
    ctx.generation.fetch_add(1, Ordering::SeqCst);
    ctx.running.store(true, Ordering::SeqCst);
    let mut output = match ctx.kind {
        Kind::Code => Output::Chunks { out: Utf8Chunks::default(), err: Utf8Chunks::default() },
        Kind::Session => Output::Lines { out: LineSplitter::default(), err: LineSplitter::default() },
    };
    if slot.is_none() {
        match start_driver(&state, &sandbox, &ctx).await {
            Ok(d) => *slot = Some(d),
            Err(e) => {
                sink.send(&ctx, error_event(e.code, &e.message, vec![])).await;
                ctx.running.store(false, Ordering::SeqCst);
                return;
            }
        }
    }
    let Some(driver) = slot.as_mut() else { return };
    let count = ctx.count.fetch_add(1, Ordering::SeqCst) + 1;
    let mut exit_code: Option<i32> = None;
    // A driver that stopped reading its stdin (blocked writing output nobody reads between
    // runs, such as a JavaScript timer's) must not hold the run for ever: after a while it
    // counts as dead and is replaced.
    let request = ctx.language.request(&code, cwd.as_deref());
    let written = tokio::time::timeout(REQUEST_WRITE_TIMEOUT, async {
        driver.stdin.write_all(&request).await?;
        driver.stdin.flush().await
    })
    .await;
    let mut died = !matches!(written, Ok(Ok(())));
    let (mut out_done, mut err_done) = (false, false);
    let (mut ob, mut eb) = (vec![0u8; 32 << 10], vec![0u8; 32 << 10]);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut timed_out = false;
    let mut stderr_until: Option<tokio::time::Instant> = None;
    while !(died || out_done && err_done) {
        let mut events = Vec::new();
        tokio::select! {
            r = read_some(&mut driver.stdout, &mut ob), if !out_done => match r {
                Ok(n @ 1..) => {
                    for p in driver.out.push(&ob[..n]) {
                        match p {
                            Piece::Output(o) => events.extend(output.events(false, &o)),
                            Piece::Marker(m) => match marker_events(&m, ctx.kind, count, &mut exit_code) {
                                Some(ev) => events.extend(ev),
                                None => {
                                    out_done = true;
                                    stderr_until = Some(tokio::time::Instant::now() + STDERR_DRAIN);
                                }
                            },
                        }
                    }
                }
                _ => { driver.stdout = None; died = true; }
            },
            r = read_some(&mut driver.stderr, &mut eb), if !err_done => match r {
                Ok(n @ 1..) => {
                    for p in driver.err.push(&eb[..n]) {
                        match p {
                            Piece::Output(o) => events.extend(output.events(true, &o)),
                            Piece::Marker(_) => err_done = true,
                        }
                    }
                }
                _ => { driver.stderr = None; err_done = true; }
            },
            _ = async { match stderr_until { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                err_done = true;
            }
            _ = async { match deadline { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } }, if !timed_out => {
                timed_out = true;
                ctx.interrupt();
            }
            r = &mut driver.exited, if driver.outcome.is_none() => {
                // The driver is gone, though what it started may hold its pipes open: read
                // what is already there, briefly, then stop waiting for markers.
                driver.outcome = Some(r.ok().and_then(Result::ok).unwrap_or(ExecOutcome { exit_code: -1, signal: None, timed_out: false, oom_killed: false }));
                if let Some(mut o) = driver.stdout.take() {
                    let mut rest = Vec::new();
                    let _ = tokio::time::timeout(Duration::from_millis(200), o.read_to_end(&mut rest)).await;
                    for p in driver.out.push(&rest) {
                        match p {
                            Piece::Output(o) => events.extend(output.events(false, &o)),
                            Piece::Marker(m) => events.extend(marker_events(&m, ctx.kind, count, &mut exit_code).unwrap_or_default()),
                        }
                    }
                }
                died = true;
            }
            _ = ping.tick() => events.push(json!({"type": "ping", "text": "pong"})),
        }
        for e in events {
            sink.send(&ctx, e).await;
        }
    }
    if died {
        // The driver is gone: say what is left, and how it ended; the next run starts afresh.
        if let Some(mut e) = driver.stderr.take() {
            let mut rest = Vec::new();
            let _ = tokio::time::timeout(Duration::from_millis(200), e.read_to_end(&mut rest)).await;
            let mut tail = driver.err.push(&rest);
            tail.push(Piece::Output(driver.err.finish()));
            for p in tail {
                if let Piece::Output(o) = p {
                    for ev in output.events(true, &o) {
                        sink.send(&ctx, ev).await;
                    }
                }
            }
        }
        let tail = driver.out.finish();
        for ev in output.events(false, &tail) {
            sink.send(&ctx, ev).await;
        }
        let outcome = match driver.outcome {
            Some(o) if o.exit_code >= 0 => Some(o),
            Some(_) => None,
            None => match tokio::time::timeout(Duration::from_secs(5), &mut driver.exited).await {
                Ok(Ok(Ok(o))) => Some(o),
                _ => None,
            },
        };
        *slot = None;
        *lock(&ctx.signals) = None;
        let status = outcome.map_or(-1, |o| o.exit_code);
        if ctx.language == Language::Bash && outcome.is_some_and(|o| o.signal.is_none()) {
            // `exit N` in a cell: the cell's status is N; a fresh shell takes over next time.
            exit_code = Some(status);
            if ctx.kind == Kind::Code && status != 0 {
                let ev = error_event("CommandExecError", &status.to_string(), vec![]);
                sink.send(&ctx, ev).await;
            }
        } else {
            let how = match outcome {
                Some(o) if o.signal == Some(SIGKILL) && timed_out => {
                    "was killed: the run did not stop when interrupted after its timeout".to_owned()
                }
                Some(o) if o.signal == Some(SIGKILL) => {
                    "was killed (an interrupt that did not stop the run, or the sandbox ran out of memory)".to_owned()
                }
                Some(o) => format!("exited with status {}", o.exit_code),
                None => "ended".to_owned(),
            };
            let message = format!(
                "the {} interpreter of this context {how}; its state is lost and the next run starts a fresh one",
                ctx.language.name()
            );
            exit_code = Some(if status > 0 { status } else { 137 });
            let ename = if ctx.kind == Kind::Code { "ContextRestarted" } else { "CommandExecError" };
            let evalue = if ctx.kind == Kind::Code { message.clone() } else { status.to_string() };
            let traceback = if ctx.kind == Kind::Code { vec![] } else { vec![message] };
            sink.send(&ctx, error_event(ename, &evalue, traceback)).await;
            ctx.running.store(false, Ordering::SeqCst);
            if ctx.kind == Kind::Session {
                return;
            }
        }
    }
    for ev in output.finish() {
        sink.send(&ctx, ev).await;
    }
    ctx.running.store(false, Ordering::SeqCst);
    let elapsed = paddock_core::units::millis(t0.elapsed());
    state.metrics.exec_seconds.observe(t0.elapsed().as_secs_f64());
    match (ctx.kind, exit_code) {
        (Kind::Session, Some(c)) if c != 0 => {
            // Like `/command`: a failure is an error event with the status, and no completion.
            sink.send(&ctx, error_event("CommandExecError", &c.to_string(), vec![])).await;
        }
        _ => sink.send(&ctx, json!({"type": "execution_complete", "execution_time": elapsed})).await,
    }
    drop(slot);
}

/// The events a stdout marker stands for; `None` for `done`.
fn marker_events(json: &[u8], kind: Kind, count: u64, exit_code: &mut Option<i32>) -> Option<Vec<Value>> {
    let v: Value = serde_json::from_slice(json).unwrap_or(Value::Null);
    match v["t"].as_str() {
        Some("done") => None,
        Some(t @ ("result" | "display")) => {
            let mut results = v["data"].as_object().cloned().unwrap_or_default();
            let text = results.get("text/plain").cloned().unwrap_or(json!(""));
            // SDK 1.1.1 (Python) reads `text` only; the JavaScript and C# SDKs `text/plain`,
            // then `text`: a large value goes once, as `text`.
            if text.as_str().is_some_and(|t| t.len() > DUPLICATE_TEXT_MAX) {
                results.remove("text/plain");
            }
            results.insert("text".into(), text);
            let result = json!({"type": "result", "results": results});
            // Only the cell's value counts as its execution result (a figure is displayed).
            Some(if t == "result" {
                vec![json!({"type": "execution_count", "execution_count": count}), result]
            } else {
                vec![result]
            })
        }
        Some("error") => {
            let traceback: Vec<String> = v["traceback"]
                .as_array()
                .map(|a| a.iter().map(|l| l.as_str().unwrap_or_default().to_owned()).collect())
                .unwrap_or_default();
            let ename = v["ename"].as_str().filter(|s| !s.is_empty()).unwrap_or("Error");
            Some(vec![error_event(ename, v["evalue"].as_str().unwrap_or_default(), traceback)])
        }
        Some("exit") => {
            let code = v["code"].as_i64().and_then(|c| i32::try_from(c).ok()).unwrap_or(1);
            *exit_code = Some(code);
            if kind == Kind::Code && code != 0 {
                // A failed bash cell, as `/command` reports one.
                return Some(vec![error_event("CommandExecError", &code.to_string(), vec![])]);
            }
            Some(vec![])
        }
        // `ready` and anything unknown carry nothing for the client.
        _ => Some(vec![]),
    }
}

/// Starts streaming a run on `ctx`: `init` (the context id, which `interrupt` takes) first,
/// then the run's events; a context that already runs something answers "session is busy".
pub(super) fn start_run(
    state: ExecdState,
    sandbox: SandboxId,
    ctx: Arc<Context>,
    code: String,
    cwd: Option<String>,
    timeout: Option<Duration>,
) -> Response {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let _ = tx.try_send((frame(json!({"type": "init", "text": ctx.id})), None));
    match ctx.driver.clone().try_lock_owned() {
        Ok(slot) => {
            let cell = Cell { code, cwd, timeout };
            let budget = Arc::new(tokio::sync::Semaphore::new(STREAM_BYTES));
            tokio::spawn(run_cell(state, sandbox, ctx, slot, cell, Sink { tx, gone: false, budget }));
        }
        Err(_) => {
            let _ = tx.try_send((frame(error_event("RUNTIME_ERROR", BUSY, vec![])), None));
        }
    }
    // A frame's share of the budget is given back as the body takes it.
    let body = Body::from_stream(ReceiverStream::new(rx).map(|(bytes, _share): Frame| Ok::<_, Infallible>(bytes)));
    stream_headers(body.into_response())
}

fn context_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "CONTEXT_NOT_FOUND",
        format!(
            "no code context {id:?} in this sandbox: create one with POST /code/context, or list them with GET /code/contexts"
        ),
    )
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> ApiResult<T> {
    let body = if body.iter().all(u8::is_ascii_whitespace) { &b"{}"[..] } else { body };
    serde_json::from_slice(body).map_err(|e| invalid_body(format!("invalid {what}: {e}")))
}

#[derive(Deserialize)]
struct CreateContext {
    language: Option<String>,
}

/// `POST /code/context {language}` → 200 `{id, language}` (exactly 200: the SDK needs it).
pub async fn create_context(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    body: Bytes,
) -> ApiResult<Response> {
    let req: CreateContext = parse_json(&body, "context request (send {\"language\": \"python\"})")?;
    let language = Language::parse(req.language.as_deref().unwrap_or("python"))?;
    let ctx = state.commands.contexts.create(&state, &sandbox, language, Kind::Code, None).await?;
    Ok(axum::Json(ctx.describe()).into_response())
}

/// `GET /code/contexts/{context}`.
pub async fn get_context(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    ApiPath(ContextParam { context: id }): ApiPath<ContextParam>,
) -> ApiResult<Response> {
    let ctx = state.commands.contexts.get(&sandbox, &id, Kind::Code).ok_or_else(|| context_not_found(&id))?;
    Ok(axum::Json(ctx.describe()).into_response())
}

/// `DELETE /code/contexts/{context}`: ends the context's interpreter.
pub async fn delete_context(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    ApiPath(ContextParam { context: id }): ApiPath<ContextParam>,
) -> ApiResult<StatusCode> {
    state.commands.contexts.remove(&sandbox, &id, Kind::Code).ok_or_else(|| context_not_found(&id))?;
    Ok(StatusCode::OK)
}

fn language_query(raw: Option<&str>) -> ApiResult<Option<Language>> {
    let q = parse_query(raw);
    query_one(&q, "language").map(Language::parse).transpose()
}

/// `GET /code/contexts?language=` (every language without it).
pub async fn list_contexts(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let language = language_query(raw.as_deref())?;
    let list: Vec<Value> = state.commands.contexts.list(&sandbox, language).iter().map(|c| c.describe()).collect();
    Ok(axum::Json(list).into_response())
}

/// `DELETE /code/contexts?language=`: every context of that language, the default one too.
pub async fn delete_contexts(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
) -> ApiResult<StatusCode> {
    let language = language_query(raw.as_deref())?
        .ok_or_else(|| missing_query("language", "the language whose contexts to delete"))?;
    state.commands.contexts.remove_language(&sandbox, language);
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
struct RunCode {
    code: Option<String>,
    context: Option<RunContext>,
}

#[derive(Deserialize)]
struct RunContext {
    id: Option<String>,
    language: Option<String>,
}

/// `POST /code {code, context: {id?, language?}}`: the run's events; without an id, the
/// language's default context.
pub async fn run(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    body: Bytes,
) -> ApiResult<Response> {
    let req: RunCode =
        parse_json(&body, "run request (send {\"code\": \"...\", \"context\": {\"language\": \"python\"}})")?;
    let code = req
        .code
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| invalid_body("no code given: send a non-empty \"code\""))?;
    let (id, language) = match req.context {
        Some(c) => (c.id.filter(|i| !i.is_empty()), c.language.filter(|l| !l.is_empty())),
        None => (None, None),
    };
    let language = language.as_deref().map(Language::parse).transpose()?;
    let ctx = match id {
        Some(id) => {
            let ctx = state.commands.contexts.get(&sandbox, &id, Kind::Code).ok_or_else(|| context_not_found(&id))?;
            if let Some(l) = language.filter(|l| *l != ctx.language) {
                return Err(invalid_body(format!(
                    "context {id} runs {}, not {}: leave out the language or pick a {} context",
                    ctx.language.name(),
                    l.name(),
                    l.name()
                )));
            }
            ctx
        }
        None => state.commands.contexts.default_for(&state, &sandbox, language.unwrap_or(Language::Python)).await?,
    };
    Ok(start_run(state, sandbox, ctx, code, None, None))
}

/// `DELETE /code?id=`: interrupts the context's running cell (a no-op when it runs nothing).
pub async fn interrupt(
    State(state): State<ExecdState>,
    InSandbox(sandbox, _): InSandbox,
    RawQuery(raw): RawQuery,
) -> ApiResult<StatusCode> {
    let q = parse_query(raw.as_deref());
    let id = query_one(&q, "id").ok_or_else(|| missing_query("id", "the context id from the run's init event"))?;
    let ctx = state.commands.contexts.get(&sandbox, id, Kind::Code).ok_or_else(|| context_not_found(id))?;
    ctx.interrupt();
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(nonce: &str, json: &str) -> Vec<u8> {
        format!("\x1ePADDOCK-{nonce} {json}\n").into_bytes()
    }

    #[test]
    fn framer_separates_output_from_markers() {
        let mut f = Framer::new("abc");
        let mut input = b"hello\n".to_vec();
        input.extend(marker("abc", r#"{"t":"done"}"#));
        input.extend(b"after");
        assert_eq!(
            f.push(&input),
            vec![
                Piece::Output(b"hello\n".to_vec()),
                Piece::Marker(br#"{"t":"done"}"#.to_vec()),
                Piece::Output(b"after".to_vec())
            ]
        );
    }

    #[test]
    fn framer_waits_for_a_split_marker_and_passes_lookalikes_through() {
        let mut f = Framer::new("abc");
        let m = marker("abc", r#"{"t":"result"}"#);
        // Byte by byte: the output before it comes out at once, the marker once whole.
        let mut pieces = f.push(b"x");
        for b in &m {
            pieces.extend(f.push(std::slice::from_ref(b)));
        }
        assert_eq!(pieces, vec![Piece::Output(b"x".to_vec()), Piece::Marker(br#"{"t":"result"}"#.to_vec())]);
        // A record separator that is no marker (or another nonce's) is the user's output.
        assert_eq!(f.push(b"\x1eplain"), vec![Piece::Output(b"\x1eplain".to_vec())]);
        let other = marker("zzz", "{}");
        assert_eq!(f.push(&other), vec![Piece::Output(other.clone())]);
        // An unfinished prefix at the end is returned by finish.
        assert_eq!(f.push(b"\x1ePAD"), vec![]);
        assert_eq!(f.finish(), b"\x1ePAD".to_vec());
    }

    #[test]
    fn framer_passes_floods_of_separators_and_finds_a_marker_split_in_its_body() {
        let mut f = Framer::new("abc");
        // A megabyte of record separators is output, byte for byte (and in linear time: the
        // buffer is consumed once per push).
        let flood = vec![0x1e_u8; 1 << 20];
        let got: Vec<u8> = f
            .push(&flood)
            .into_iter()
            .flat_map(|p| match p {
                Piece::Output(o) => o,
                Piece::Marker(m) => panic!("no marker in a flood: {m:?}"),
            })
            .chain(f.finish())
            .collect();
        assert_eq!(got, flood);
        // A marker whose JSON arrives in pieces is found once its newline comes, with the
        // output around it kept in order.
        let m = marker("abc", r#"{"t":"result","data":{"text/plain":"1"}}"#);
        let (head, tail) = m.split_at(20);
        let mut pieces = f.push(b"a");
        pieces.extend(f.push(head));
        pieces.extend(f.push(&tail[..5]));
        pieces.extend(f.push(&tail[5..]));
        pieces.extend(f.push(b"b"));
        assert_eq!(
            pieces,
            vec![
                Piece::Output(b"a".to_vec()),
                Piece::Marker(br#"{"t":"result","data":{"text/plain":"1"}}"#.to_vec()),
                Piece::Output(b"b".to_vec())
            ]
        );
    }

    #[test]
    fn utf8_chunks_never_split_a_character() {
        let mut u = Utf8Chunks::default();
        let s = "é€😀".as_bytes();
        let mut got = String::new();
        for b in s {
            got.push_str(&u.push(std::slice::from_ref(b)));
            assert!(!got.contains('\u{fffd}'), "{got:?}");
        }
        assert_eq!(got, "é€😀");
        assert_eq!(u.push(b"ok\n"), "ok\n");
        assert_eq!(u.push(&[0xE2, 0x82]), "");
        assert_eq!(u.finish(), "\u{fffd}");
    }

    #[test]
    fn bash_words_survive_quoting() {
        for s in ["plain", "it's", "back\\slash", "line\nbreak\ttab\x1b[0m", "ünï €", "$HOME `x` $(y)"] {
            let out = std::process::Command::new("bash")
                .args(["--noprofile", "--norc", "-c", &format!("printf %s {}", bash_quote(s))])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
        assert_eq!(bash_quote("a\0b"), "$'ab'");
    }

    #[test]
    fn markers_become_the_sdks_events() {
        let mut exit = None;
        let ev = marker_events(br#"{"t":"result","data":{"text/plain":"4"}}"#, Kind::Code, 3, &mut exit).unwrap();
        assert_eq!(ev[0], json!({"type": "execution_count", "execution_count": 3}));
        assert_eq!(ev[1]["results"], json!({"text": "4", "text/plain": "4"}));
        let ev = marker_events(
            br#"{"t":"display","data":{"text/plain":"<Figure>","image/png":"iVBO"}}"#,
            Kind::Code,
            3,
            &mut exit,
        )
        .unwrap();
        assert_eq!(
            ev,
            vec![
                json!({"type": "result", "results": {"text": "<Figure>", "text/plain": "<Figure>", "image/png": "iVBO"}})
            ]
        );
        let ev = marker_events(br#"{"t":"error","ename":"","evalue":"x","traceback":null}"#, Kind::Code, 1, &mut exit)
            .unwrap();
        assert_eq!(ev[0]["error"], json!({"ename": "Error", "evalue": "x", "traceback": []}));
        let ev = marker_events(br#"{"t":"exit","code":2}"#, Kind::Code, 1, &mut exit).unwrap();
        assert_eq!((ev[0]["error"]["ename"].as_str(), exit), (Some("CommandExecError"), Some(2)));
        assert!(marker_events(br#"{"t":"exit","code":0}"#, Kind::Session, 1, &mut exit).unwrap().is_empty());
        assert_eq!(marker_events(br#"{"t":"done"}"#, Kind::Code, 1, &mut exit), None);
        assert_eq!(marker_events(b"not json", Kind::Code, 1, &mut exit), Some(vec![]));
        let f = frame(json!({"type": "init", "text": "c"}));
        let v: Value = serde_json::from_slice(f.strip_prefix(b"data: ").unwrap().trim_ascii()).unwrap();
        assert!(v["timestamp"].as_i64().unwrap() > 1_600_000_000_000 && f.ends_with(b"\n\n"), "{v}");
    }

    #[test]
    fn languages_parse_with_clear_refusals() {
        assert_eq!(Language::parse("Python").unwrap(), Language::Python);
        assert_eq!(Language::parse("javascript").unwrap(), Language::JavaScript);
        assert_eq!(Language::parse("TypeScript").unwrap(), Language::TypeScript);
        assert_eq!(Language::parse("java").unwrap(), Language::Java);
        assert_eq!(Language::parse("go").unwrap(), Language::Go);
        let e = Language::parse("cobol").unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "LANGUAGE_NOT_SUPPORTED"));
        assert!(e.message.contains("typescript, java, go or bash"), "{}", e.message);
    }
}
