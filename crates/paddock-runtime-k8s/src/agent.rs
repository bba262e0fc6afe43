//! Paddock's agent in each sandbox Pod: one warm HTTP/2 connection per Pod over
//! `pods/portforward` instead of a `pods/exec` call (a `runc exec` plus a WebSocket set up and
//! torn down) per command. The wire format is `paddock_agent_wire`'s.
//!
//! The agent is brought up in the background when a Pod's first command arrives: connect, and if
//! nothing answers (or an agent of another build does), upload the static binary into the
//! Pod's `/tmp` over one `pods/exec` and start it there. Meanwhile, and whenever the agent is
//! gone, commands take `pods/exec`, so the agent only ever makes commands faster: a sandbox
//! that kills it, a full `/tmp` or a Pod without `sh` lose nothing but speed. A request is
//! retried over `pods/exec` only when it was never sent, so no command runs twice.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use paddock_agent_wire::{Decoder, ERROR, EXIT, ExecSpec, PORT, RunSpec, SPEC, STDERR, STDIN, STDOUT, encode};
use paddock_core::runtime::RuntimeError;
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, oneshot};

use crate::exec::{PIPE, Running};
use crate::port::PortStream;

type Body = BoxBody<Bytes, Infallible>;
pub type Sender = SendRequest<Body>;

/// Least time between two bring-ups of one Pod's agent (each may upload the binary): a
/// sandbox that keeps killing its agent, or an image it cannot run in, costs the API server
/// one upload per Pod this often at most, doubling with every failure in a row.
const RETRY_AFTER: Duration = Duration::from_secs(30);
const MAX_RETRY_AFTER: Duration = Duration::from_secs(900);
/// How long a started agent may take to answer, and any request to it that is not a command.
const START_TIMEOUT: Duration = Duration::from_secs(5);
/// A bring-up still `Starting` after this long is taken for lost.
const STARTING_TIMEOUT: Duration = Duration::from_secs(120);

/// `sh -c INSTALL paddock-agent-install ID`: stores the binary read from stdin as
/// `/tmp/.paddock-agent/agent-ID` (removing other builds' binaries, which count against the
/// Pod's `/tmp`) and starts it detached, its output in `agent-ID.log`. A temporary name of its
/// own per install, so two servers installing at once do not clash. `cat` is not the last
/// command: see `exec::STAGE_SCRIPT`.
const INSTALL_SCRIPT: &str = r#"d=/tmp/.paddock-agent; f="$d/agent-$1"; t="$f.new.$$"
mkdir -p "$d" && chmod 700 "$d" || exit 1
for o in "$d"/agent-*; do case "$o" in "$f"|"$f.log"|"$f".new.*) ;; *) rm -f "$o";; esac; done
cat >"$t" && chmod 700 "$t" && mv -f "$t" "$f" || { rm -f "$t"; exit 1; }
"$f" --id "$1" </dev/null >"$f.log" 2>&1 &
exit 0"#;

/// The agent binary the runtime uploads, and its id (a hash of its bytes).
#[derive(Clone)]
pub struct AgentBinary {
    bytes: Bytes,
    id: String,
}

impl AgentBinary {
    /// Reads the agent from `path`; refuses one that is not a static executable, which would
    /// fail in images without (the same) libc.
    #[expect(
        clippy::disallowed_methods,
        reason = "the agent binary is read once, when the runtime is configured at startup"
    )]
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("reading the agent {}: {e}", path.display()))?;
        if !is_static_elf(&bytes) {
            return Err(format!(
                "{} is not a static x86-64 executable: build the agent with dev/build-agent --release",
                path.display()
            ));
        }
        let id = sha2::Sha256::digest(&bytes).iter().take(8).map(|b| format!("{b:02x}")).collect();
        Ok(Self { bytes: bytes.into(), id })
    }

    pub fn id(&self) -> &str {
        &self.id
    }
}

/// A static `paddock-agent` beside the executable `exe` (an install) or built by
/// `dev/build-agent` in the cargo target directory `exe` is in (a checkout).
#[expect(clippy::disallowed_methods, reason = "run once at startup, to find the agent binary")]
pub fn find_beside(exe: &Path) -> Option<std::path::PathBuf> {
    let dir = exe.parent()?;
    let mut candidates = vec![dir.join("paddock-agent")];
    if let Some(target) = dir.parent() {
        for profile in ["release", "debug"] {
            candidates.push(target.join("x86_64-unknown-linux-gnu").join(profile).join("paddock-agent"));
        }
    }
    candidates.into_iter().find(|p| std::fs::read(p).is_ok_and(|b| is_static_elf(&b)))
}

/// Whether `elf` is a 64-bit little-endian executable without a program interpreter (a
/// dynamically linked one names its loader in a `PT_INTERP` header).
pub fn is_static_elf(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| elf.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let u64_at = |o: usize| elf.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    // ELF magic, 64-bit, little-endian; x86-64.
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") || u16_at(18) != Some(62) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else { return false };
    (0..usize::from(phnum)).all(|i| {
        let at = usize::try_from(phoff).unwrap_or(usize::MAX).saturating_add(i * usize::from(phentsize));
        matches!(u32_at(at), Some(t) if t != PT_INTERP)
    })
}

enum State {
    /// A bring-up runs; its generation, so only it writes its result back.
    Starting(u64, Instant),
    /// Connected to the agent of the Pod with this uid, checked before and after connecting.
    Ready(Sender, String),
    Failed,
}

struct Entry {
    state: State,
    /// When the last bring-up started, and how many failed in a row since one succeeded.
    started: Instant,
    failures: u32,
}

impl Entry {
    fn backoff(&self) -> Duration {
        RETRY_AFTER.saturating_mul(1 << self.failures.min(5)).min(MAX_RETRY_AFTER)
    }
}

/// The agents of every Pod this server uses.
pub struct Agents {
    binary: Option<AgentBinary>,
    pods: Api<Pod>,
    conns: Mutex<HashMap<String, Entry>>,
    generation: std::sync::atomic::AtomicU64,
}

impl Agents {
    pub fn new(binary: Option<AgentBinary>, pods: Api<Pod>) -> Self {
        Self { binary, pods, conns: Mutex::default(), generation: Default::default() }
    }

    pub fn enabled(&self) -> bool {
        self.binary.is_some()
    }

    /// The connection to the agent of Pod `pod` with uid `uid`, only when it is up: never
    /// starts one. A thread's Pods share a name, so the uid tells a replacement apart.
    pub fn ready(&self, pod: &str, uid: &str) -> Option<Sender> {
        match self.conns.lock().unwrap_or_else(|p| p.into_inner()).get(pod).map(|e| &e.state) {
            Some(State::Ready(s, u)) if u == uid && !s.is_closed() => Some(s.clone()),
            _ => None,
        }
    }

    /// A connection to `pod`'s agent when one is up (for the Pod with uid `uid`, when the
    /// caller knows it); otherwise starts bringing one up, at most once per backoff, and
    /// returns `None`, so this command takes `pods/exec`.
    pub fn sender(self: &Arc<Self>, pod: &str, uid: Option<&str>) -> Option<Sender> {
        let binary = self.binary.as_ref()?;
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = conns.get(pod) {
            match &e.state {
                State::Ready(s, u) if !s.is_closed() && uid.is_none_or(|uid| uid == u) => return Some(s.clone()),
                State::Starting(_, at) if at.elapsed() < STARTING_TIMEOUT => return None,
                _ if e.started.elapsed() < e.backoff() => return None,
                _ => {}
            }
        }
        // Entries of Pods that are gone would pile up: drop dead ones while here.
        conns.retain(|_, e| match &e.state {
            State::Ready(s, _) => !s.is_closed() || e.started.elapsed() < e.backoff(),
            State::Failed => e.started.elapsed() < e.backoff(),
            State::Starting(_, at) => at.elapsed() < STARTING_TIMEOUT,
        });
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let failures = conns.get(pod).map_or(0, |e| e.failures);
        let now = Instant::now();
        conns.insert(pod.to_owned(), Entry { state: State::Starting(generation, now), started: now, failures });
        let me = Arc::clone(self);
        let (pod, uid, binary) = (pod.to_owned(), uid.map(str::to_owned), binary.clone());
        tokio::spawn(async move {
            let result = bring_up(&me.pods, &pod, uid.as_deref(), &binary).await;
            let quiet = match &result {
                // Most failures are a short-lived sandbox deleted meanwhile: only one whose
                // Pod still runs says something about the image or the cluster.
                Err(_) => !matches!(me.pods.get_opt(&pod).await, Ok(Some(_))),
                Ok(_) => true,
            };
            let mut conns = me.conns.lock().unwrap_or_else(|p| p.into_inner());
            // Only this bring-up's own entry: a newer one, or a `forget`, wins.
            let Some(entry) =
                conns.get_mut(&pod).filter(|e| matches!(e.state, State::Starting(g, _) if g == generation))
            else {
                return;
            };
            match result {
                Ok((sender, uid)) => {
                    entry.state = State::Ready(sender, uid);
                    entry.failures = 0;
                }
                Err(e) => {
                    if quiet {
                        tracing::debug!(pod, error = %e, "no agent: the Pod is gone");
                    } else {
                        tracing::info!(pod, error = %e, "no agent in the Pod: its commands take pods/exec");
                    }
                    entry.state = State::Failed;
                    entry.failures = entry.failures.saturating_add(1);
                }
            }
        });
        None
    }

    /// Forgets `pod`'s connection (its Pod is being deleted).
    pub fn forget(&self, pod: &str) {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(pod);
    }

    /// Forgets `pod`'s connection if it is closed (a request found it so), leaving a newer
    /// bring-up or a live connection alone.
    pub fn forget_closed(&self, pod: &str) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(conns.get(pod).map(|e| &e.state), Some(State::Ready(s, _)) if s.is_closed()) {
            conns.remove(pod);
        }
    }
}

/// The uid of the Pod named `pod` now.
async fn pod_uid(pods: &Api<Pod>, pod: &str) -> Result<String, String> {
    match pods.get_opt(pod).await {
        Ok(Some(p)) => p.metadata.uid.ok_or_else(|| format!("Pod {pod} has no uid")),
        Ok(None) => Err(format!("Pod {pod} is gone")),
        Err(e) => Err(format!("reading Pod {pod}: {e}")),
    }
}

/// Connects to the Pod's agent, replacing (another protocol) or starting it as needed. The
/// Pod is reached by name: its uid read before and after the connection is made must be the
/// same (and the expected one), so the connection is known to lead into that very Pod.
async fn bring_up(
    pods: &Api<Pod>,
    pod: &str,
    expected: Option<&str>,
    binary: &AgentBinary,
) -> Result<(Sender, String), String> {
    let uid = pod_uid(pods, pod).await?;
    if expected.is_some_and(|e| e != uid) {
        return Err(format!("Pod {pod} was replaced"));
    }
    let verified = async |sender: Sender| match pod_uid(pods, pod).await {
        Ok(now) if now == uid => Ok((sender, uid.clone())),
        Ok(_) => Err(format!("Pod {pod} was replaced while its agent was reached")),
        Err(e) => Err(e),
    };
    match connect(pods, pod).await {
        Ok((sender, answer)) if compatible(&answer) => return verified(sender).await,
        Ok((sender, _)) => {
            // An agent speaking another protocol: it ends, ours starts (its file differs).
            let _ = request(sender, "/exit").await;
        }
        Err(_) => {}
    }
    install(pods, pod, binary).await?;
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        match connect(pods, pod).await {
            Ok((sender, answer)) if compatible(&answer) => return verified(sender).await,
            // The agent told to exit may still be there for a moment.
            Ok(_) | Err(_) if started.elapsed() < START_TIMEOUT => {}
            Ok((_, answer)) => return Err(format!("the agent on port {PORT} speaks another protocol ({answer})")),
            Err(e) => return Err(format!("the started agent never answered: {e}")),
        }
    }
}

/// Whether an agent's `/id` answer (`ID PROTOCOL`) speaks this server's protocol: agents of
/// other builds that do are used as they are, so two server versions never take turns
/// replacing each other's agents.
fn compatible(answer: &str) -> bool {
    answer.split_whitespace().nth(1) == Some(paddock_agent_wire::PROTOCOL)
}

async fn install(pods: &Api<Pod>, pod: &str, binary: &AgentBinary) -> Result<(), String> {
    let argv = vec!["sh".into(), "-c".into(), INSTALL_SCRIPT.into(), "paddock-agent-install".into(), binary.id.clone()];
    let running = crate::exec::start_pods_exec(pods, pod, argv, true).await.map_err(|e| e.to_string())?;
    let mut input: &[u8] = &binary.bytes;
    let (code, _, err) = crate::exec::collect(running, Some(&mut input)).await.map_err(|e| e.to_string())?;
    if code != 0 {
        return Err(format!("installing the agent failed ({code}): {}", String::from_utf8_lossy(&err).trim()));
    }
    Ok(())
}

/// One port-forwarded HTTP/2 connection to the agent, and the id it reports.
async fn connect(pods: &Api<Pod>, pod: &str) -> Result<(Sender, String), String> {
    let mut pf = pods.portforward(pod, &[PORT]).await.map_err(|e| format!("port-forward: {e}"))?;
    let (Some(stream), Some(error)) = (pf.take_stream(PORT), pf.take_error(PORT)) else {
        return Err("the port-forward gave no stream".into());
    };
    let io = TokioIo::new(PortStream::new(stream, Box::pin(error)));
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        // A forward that broke silently is found by a ping, not by the next command hanging.
        .keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        // The connection's window holds every stream's: a command whose output nobody reads
        // fills only its own stream's window, never the Pod's whole connection.
        .initial_stream_window_size(paddock_agent_wire::STREAM_WINDOW)
        .initial_connection_window_size(paddock_agent_wire::CONNECTION_WINDOW)
        .handshake(io)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let id = request(sender.clone(), "/id").await?;
    Ok((sender, id))
}

/// A bodyless request whose answer is short text (`/id`, `/exit`).
async fn request(mut sender: Sender, path: &str) -> Result<String, String> {
    sender.ready().await.map_err(|e| format!("the agent's connection: {e}"))?;
    let method = if path == "/id" { hyper::Method::GET } else { hyper::Method::POST };
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://agent{path}"))
        .body(http_body_util::Empty::new().boxed())
        .map_err(|e| e.to_string())?;
    let answer = async {
        let resp = sender.send_request(req).await.map_err(|e| format!("the agent's answer: {e}"))?;
        let body = http_body_util::Limited::new(resp.into_body(), 4096)
            .collect()
            .await
            .map_err(|e| format!("the agent's answer: {e}"))?;
        Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
    };
    tokio::time::timeout(START_TIMEOUT, answer).await.map_err(|_| "the agent did not answer in time".to_owned())?
}

/// Why a command could not go to the agent.
pub enum RunError {
    /// Nothing was sent: the caller may use `pods/exec` instead.
    NotSent(String),
    /// The request was sent; the command may have started.
    Failed(RuntimeError),
}

/// Starts `argv` through the agent: the same caller-side pipes and exit code as
/// `exec::start_pods_exec`.
pub async fn run(sender: Sender, pod: &str, argv: Vec<String>, stdin: bool) -> Result<Running, RunError> {
    let spec = serde_json::to_vec(&RunSpec { argv, stdin }).map_err(|e| RunError::NotSent(e.to_string()))?;
    Ok(start(sender, pod, "/run", spec, stdin).await?.0)
}

/// Starts a user command natively (no shell wrapper); the flag is set when it was OOM-killed.
pub async fn exec(sender: Sender, pod: &str, spec: &ExecSpec) -> Result<(Running, Arc<AtomicBool>), RunError> {
    let body = serde_json::to_vec(spec).map_err(|e| RunError::NotSent(e.to_string()))?;
    start(sender, pod, "/exec", body, spec.stdin).await
}

/// Signals the process group of the command started with `token`; false when it no longer
/// runs. The request has no body (HEADERS only, which HTTP/2 flow control never holds back),
/// so a signal gets through even while other streams of the Pod are stalled.
pub async fn signal(mut sender: Sender, pod: &str, token: &str, signal: i32) -> Result<bool, RuntimeError> {
    let lost = |e: &dyn std::fmt::Display| {
        RuntimeError::Unavailable(format!("signalling a command in Pod {pod}: the agent's connection: {e}"))
    };
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("token", token)
        .append_pair("signal", &signal.to_string())
        .finish();
    let req = hyper::Request::builder()
        .method(hyper::Method::POST)
        .uri(format!("http://agent/signal?{query}"))
        .body(http_body_util::Empty::new().boxed())
        .map_err(|e| RuntimeError::System(e.to_string()))?;
    let answer = async {
        sender.ready().await.map_err(|e| lost(&e))?;
        let resp = sender.send_request(req).await.map_err(|e| lost(&e))?;
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), 4096).collect().await.map_err(|e| lost(&e))?;
        Ok::<_, RuntimeError>((status, body.to_bytes()))
    };
    let (status, body) = tokio::time::timeout(START_TIMEOUT, answer)
        .await
        .map_err(|_| RuntimeError::Timeout(format!("the agent in Pod {pod} did not answer a signal in time")))??;
    match status {
        hyper::StatusCode::OK => Ok(true),
        hyper::StatusCode::NOT_FOUND => Ok(false),
        hyper::StatusCode::BAD_REQUEST => {
            Err(RuntimeError::InvalidArgument(String::from_utf8_lossy(&body).into_owned()))
        }
        other => Err(RuntimeError::System(format!("the agent in Pod {pod} answered a signal with {other}"))),
    }
}

async fn start(
    mut sender: Sender,
    pod: &str,
    path: &str,
    spec: Vec<u8>,
    stdin: bool,
) -> Result<(Running, Arc<AtomicBool>), RunError> {
    sender.ready().await.map_err(|e| RunError::NotSent(e.to_string()))?;
    let spec = encode(SPEC, &spec);
    // Without input the request is one DATA frame that ends the stream, so its frames leave
    // together.
    let (body, body_tx) = if stdin {
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(8);
        let _ = tx.try_send(Ok(Frame::data(spec)));
        (BodyExt::boxed(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx))), Some(tx))
    } else {
        (http_body_util::Full::new(spec).boxed(), None)
    };
    let req = hyper::Request::builder()
        .method(hyper::Method::POST)
        .uri(format!("http://agent{path}"))
        .body(body)
        .map_err(|e| RunError::NotSent(e.to_string()))?;
    let lost = |e: &dyn std::fmt::Display| {
        RunError::Failed(RuntimeError::Unavailable(format!(
            "the connection to the agent in the sandbox's Pod {pod} was lost: {e}"
        )))
    };
    let stdin_user = body_tx.map(|tx| {
        let (user, pump_end) = tokio::io::duplex(PIPE);
        tokio::spawn(feed(pump_end, tx));
        user
    });
    let resp = sender.send_request(req).await.map_err(|e| lost(&e))?;
    if resp.status() != hyper::StatusCode::OK {
        return Err(RunError::Failed(RuntimeError::System(format!(
            "the agent in Pod {pod} refused a command ({})",
            resp.status()
        ))));
    }
    let (out_user, out_pump) = tokio::io::duplex(PIPE);
    let (err_user, err_pump) = tokio::io::duplex(PIPE);
    let (tx, done) = oneshot::channel();
    let oom = Arc::new(AtomicBool::new(false));
    tokio::spawn(relay(resp.into_body(), out_pump, err_pump, pod.to_owned(), Arc::clone(&oom), tx));
    Ok((Running { stdin: stdin_user, stdout: out_user, stderr: err_user, done }, oom))
}

/// The caller's input as STDIN frames; its end ends the request body.
async fn feed(mut from: DuplexStream, tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>) {
    let mut buf = vec![0u8; 32 << 10];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 || tx.send(Ok(Frame::data(encode(STDIN, &buf[..n])))).await.is_err() {
            break;
        }
    }
}

/// Splits the response's frames into the caller's pipes; a caller that stops reading gets
/// its output dropped (as `exec::pump` does), never the command blocked.
async fn relay(
    mut body: hyper::body::Incoming,
    mut out: DuplexStream,
    mut err: DuplexStream,
    pod: String,
    oom: Arc<AtomicBool>,
    tx: oneshot::Sender<Result<i32, RuntimeError>>,
) {
    let mut decoder = Decoder::default();
    let (mut out_open, mut err_open) = (true, true);
    let result = 'body: loop {
        loop {
            match decoder.next_frame() {
                Ok(Some((STDOUT, data))) => {
                    if out_open && out.write_all(&data).await.is_err() {
                        out_open = false;
                    }
                }
                Ok(Some((STDERR, data))) => {
                    if err_open && err.write_all(&data).await.is_err() {
                        err_open = false;
                    }
                }
                Ok(Some((EXIT, data))) => {
                    // Four bytes of exit code, then (from `/exec`) one of whether it was an OOM kill.
                    let code = data.get(..4).and_then(|c| <[u8; 4]>::try_from(c).ok()).map(i32::from_be_bytes);
                    oom.store(data.get(4) == Some(&1), Ordering::Relaxed);
                    break 'body code.ok_or_else(|| {
                        RuntimeError::System(format!("the agent in Pod {pod} sent a malformed exit code"))
                    });
                }
                Ok(Some((ERROR, data))) => {
                    let text = String::from_utf8_lossy(&data[..data.len().min(4096)]).into_owned();
                    break 'body Err(RuntimeError::System(format!("the agent in Pod {pod}: {text}")));
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => break 'body Err(RuntimeError::System(format!("the agent in Pod {pod}: {e}"))),
            }
        }
        match body.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    decoder.push(&data);
                }
            }
            Some(Err(e)) => {
                break Err(RuntimeError::Unavailable(format!(
                    "the connection to the agent in the sandbox's Pod {pod} was lost before the command ended: {e}"
                )));
            }
            None => {
                break Err(RuntimeError::Unavailable(format!(
                    "the agent in the sandbox's Pod {pod} ended before the command did"
                )));
            }
        }
    };
    let _ = out.shutdown().await;
    let _ = err.shutdown().await;
    let _ = tx.send(result);
}

#[cfg(test)]
#[expect(clippy::disallowed_methods, reason = "a test's fixtures may block: each test has a runtime of its own")]
mod tests {
    use super::*;

    #[test]
    fn only_static_elf_executables_are_uploaded() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // Test binaries are linked dynamically here.
        assert!(!is_static_elf(&me));
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        assert!(!is_static_elf(&me[..40]));
        let mut fake = me[..64].to_vec();
        // No program headers at all: nothing names an interpreter.
        fake[56] = 0;
        fake[57] = 0;
        assert!(is_static_elf(&fake));
    }

    #[test]
    fn the_agent_is_found_beside_the_binary_or_in_the_static_target_dir_and_only_if_static() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let mut static_elf = me[..64].to_vec();
        static_elf[56] = 0;
        static_elf[57] = 0;
        let root = std::env::temp_dir().join(format!("paddock-agent-find-{}", std::process::id()));
        let release = root.join("target/release");
        let static_release = root.join("target/x86_64-unknown-linux-gnu/release");
        std::fs::create_dir_all(&release).unwrap();
        std::fs::create_dir_all(&static_release).unwrap();
        let exe = release.join("paddock");
        assert_eq!(find_beside(&exe), None);
        // A dynamically linked agent beside the binary is passed over for the static build.
        std::fs::write(release.join("paddock-agent"), &me).unwrap();
        std::fs::write(static_release.join("paddock-agent"), &static_elf).unwrap();
        assert_eq!(find_beside(&exe), Some(static_release.join("paddock-agent")));
        std::fs::write(release.join("paddock-agent"), &static_elf).unwrap();
        assert_eq!(find_beside(&exe), Some(release.join("paddock-agent")));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
