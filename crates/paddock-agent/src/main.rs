//! `paddock-agent --id ID`: Paddock's agent in a Kubernetes sandbox Pod (see the library's
//! docs for the protocol). The Kubernetes runtime uploads it into the Pod's `/tmp` and starts
//! it with `pods/exec` once; after that a command costs one HTTP/2 stream on a warm
//! port-forward instead of a `pods/exec` call (a `runc exec` and a WebSocket each).
//!
//! It runs only what the runtime sends (its `sh` wrapper, file scripts), as the sandbox's own
//! user: it adds no privilege, and listens on the Pod's loopback, which nothing outside the
//! Pod reaches but a port-forward. It must be a static binary: sandbox images may have no libc
//! or another one (`dev/build-agent` builds it so).

mod oom;

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use paddock_agent_wire::{
    CONNECTION_WINDOW, Decoder, ERROR, EXIT, ExecSpec, MAX_SPEC, MAX_STREAMS, PORT, PROTOCOL, READINESS_PORT, RunSpec,
    SPEC, STDERR, STDIN, STDOUT, STREAM_WINDOW, encode,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

type Body = BoxBody<Bytes, Infallible>;

/// How long output is still read after a command exits while its pipe stays open (a
/// background child of the command holds it) before the exit is reported. Output the command
/// wrote before it exited is at most a pipe's worth and is read well within it.
const GRACE: Duration = Duration::from_secs(1);
/// The most a Linux pipe holds (`/proc/sys/fs/pipe-max-size`'s default).
const PIPE_MAX: usize = 1 << 20;

const USAGE: &str = "usage: paddock-agent --id ID [--port PORT]";

fn main() -> ExitCode {
    default_cwd();
    oom::settle_own_score();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (id, port) = match args.as_slice() {
        [flag, id] if flag == "--id" => (id.clone(), PORT),
        // Another port: for tests on a host, where 44770 may be taken.
        [flag, id, p, port] if flag == "--id" && p == "--port" => match port.parse() {
            Ok(port) => (id.clone(), port),
            Err(_) => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("paddock-agent: starting its runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(Bytes::from(id), port)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("paddock-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(id: Bytes, port: u16) -> std::io::Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("listening on 127.0.0.1:{port}: {e}")))?;
    // Started as a background job of a shell, the agent finds SIGINT and SIGQUIT ignored, and
    // an ignored signal stays ignored across exec: commands could not be interrupted. A
    // handled one is reset to the default in every child.
    for kind in [SignalKind::interrupt(), SignalKind::quit()] {
        if let Ok(mut s) = signal(kind) {
            tokio::spawn(async move { while s.recv().await.is_some() {} });
        }
    }
    // The code-interpreter SDK's readiness probe only connects; the sandbox may hold the port.
    if let Ok(probe) = TcpListener::bind(("127.0.0.1", READINESS_PORT)).await {
        tokio::spawn(async move {
            while let Ok((s, _)) = probe.accept().await {
                drop(s);
            }
        });
    }
    let running = Running::default();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors, or a connection aborted before it was taken: not fatal.
                eprintln!("paddock-agent: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (id, running) = (id.clone(), running.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(req, id.clone(), running.clone()));
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .max_concurrent_streams(MAX_STREAMS)
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    r
}

async fn handle(req: Request<Incoming>, id: Bytes, running: Running) -> Result<Response<Body>, Infallible> {
    Ok(match (req.method(), req.uri().path()) {
        (&Method::GET, "/id") => full(StatusCode::OK, format!("{} {PROTOCOL}", String::from_utf8_lossy(&id))),
        (&Method::POST, "/exit") => {
            tokio::spawn(async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                std::process::exit(0);
            });
            full(StatusCode::OK, "exiting")
        }
        (&Method::POST, "/run") => run(req.into_body(), None).await,
        (&Method::POST, "/exec") => run(req.into_body(), Some(running)).await,
        (&Method::POST, "/signal") => send_signal(req.uri().query().unwrap_or_default(), &running),
        _ => {
            full(StatusCode::NOT_FOUND, "no such route: the agent serves GET /id, POST /run, /exec, /signal and /exit")
        }
    })
}

/// User commands that run, by token: their process group ids.
type Running = Arc<Mutex<HashMap<String, u32>>>;

/// Reads the first frame of a request body: the spec.
async fn read_spec<T: serde::de::DeserializeOwned>(
    body: &mut Incoming,
    decoder: &mut Decoder,
) -> Result<T, Response<Body>> {
    loop {
        match decoder.next_frame() {
            Ok(Some((SPEC, data))) => {
                return serde_json::from_slice(&data)
                    .map_err(|e| full(StatusCode::BAD_REQUEST, format!("unreadable spec: {e}")));
            }
            Ok(Some((kind, _))) => {
                return Err(full(StatusCode::BAD_REQUEST, format!("frame kind {kind} before the spec")));
            }
            Ok(None) => {}
            Err(e) => return Err(full(StatusCode::BAD_REQUEST, e.to_string())),
        }
        match body.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    decoder.push(&data);
                }
            }
            _ => return Err(full(StatusCode::BAD_REQUEST, "the request ended before its spec")),
        }
    }
}

/// `POST /signal?token=T&signal=N`: everything is in the query, so the request is HEADERS
/// alone, which flow control never holds back.
fn send_signal(query: &str, running: &Running) -> Response<Body> {
    let mut token = None;
    let mut number = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "token" => token = Some(v.into_owned()),
            "signal" => number = v.parse::<i32>().ok(),
            _ => {}
        }
    }
    let (Some(token), Some(number)) = (token, number) else {
        return full(StatusCode::BAD_REQUEST, "give token=T&signal=N");
    };
    let Some(sig) = signal_of(number) else {
        return full(StatusCode::BAD_REQUEST, format!("signal {number} has no name the agent can send"));
    };
    let pgid = running.lock().unwrap_or_else(|p| p.into_inner()).get(&token).copied();
    let Some(pgid) = pgid.and_then(|p| rustix::process::Pid::from_raw(p.cast_signed())) else {
        return full(StatusCode::NOT_FOUND, "no such command runs");
    };
    match rustix::process::kill_process_group(pgid, sig) {
        Ok(()) => full(StatusCode::OK, "signalled"),
        Err(e) => full(StatusCode::NOT_FOUND, format!("signalling the command: {e}")),
    }
}

fn signal_of(n: i32) -> Option<rustix::process::Signal> {
    rustix::process::Signal::from_named_raw(n)
}

/// Where a command that names no directory starts: the directory the agent started in, which
/// is the container's (the image's `WorkingDir`), or `/workspace` when that is `/`, as the
/// runtime's shell wrapper and the local runtime decide.
fn default_cwd() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| match std::env::current_dir() {
        Ok(d) if d != Path::new("/") => d,
        _ => PathBuf::from("/workspace"),
    })
}

/// Starts the command of a `/run` (`running` is `None`) or `/exec` request and streams its
/// output.
async fn run(mut body: Incoming, running: Option<Running>) -> Response<Body> {
    let mut decoder = Decoder::with_limit(MAX_SPEC);
    let (argv, stdin, exec) = if running.is_none() {
        match read_spec::<RunSpec>(&mut body, &mut decoder).await {
            Ok(spec) => (spec.argv, spec.stdin, None),
            Err(r) => return r,
        }
    } else {
        match read_spec::<ExecSpec>(&mut body, &mut decoder).await {
            Ok(spec) => (spec.argv.clone(), spec.stdin, Some(spec)),
            Err(r) => return r,
        }
    };
    let Some((program, args)) = argv.split_first() else {
        return full(StatusCode::BAD_REQUEST, "an empty command line");
    };
    let program = program.clone();
    let mut command = tokio::process::Command::new(&program);
    command.args(args);
    let cwd = exec.as_ref().map(|spec| if spec.cwd.is_empty() { default_cwd() } else { Path::new(&spec.cwd) });
    if let (Some(spec), Some(cwd)) = (&exec, cwd) {
        command.env_clear().envs(&spec.env).current_dir(cwd);
    }
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(16);
    let response = Response::new(BodyExt::boxed(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx))));
    if let Some(cwd) = cwd
        && !cwd.is_dir()
    {
        // As the shell wrapper reports it: the command never started.
        let message =
            format!("paddock: cannot run \"{program}\": working directory {} does not exist\n", cwd.display());
        let _ = tx.try_send(Ok(Frame::data(encode(STDERR, message.as_bytes()))));
        let _ = tx.try_send(Ok(Frame::data(encode(EXIT, &exit_frame(127, false)))));
        return response;
    }
    command
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a signal reaches everything it starts, and nothing aimed at
        // the agent's group reaches it.
        .process_group(0);
    let before = exec.as_ref().map(|_| oom::Counters::read());
    let mut child = match oom::spawn_first_to_kill(&mut command) {
        Ok(c) => c,
        Err(e) if exec.is_some() => {
            // A shell reports a program it cannot run as 127 (missing) or 126 (not runnable).
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            let message = format!("paddock: {program}: {e}\n");
            let _ = tx.try_send(Ok(Frame::data(encode(STDERR, message.as_bytes()))));
            let _ = tx.try_send(Ok(Frame::data(encode(EXIT, &exit_frame(code, false)))));
            return response;
        }
        Err(e) => {
            let _ = tx.try_send(Ok(Frame::data(encode(ERROR, format!("starting {program}: {e}").as_bytes()))));
            return response;
        }
    };
    let registered = match (&exec, &running, child.id()) {
        (Some(spec), Some(running), Some(pid)) => {
            running.lock().unwrap_or_else(|p| p.into_inner()).insert(spec.token.clone(), pid);
            Some((spec.token.clone(), running.clone()))
        }
        _ => None,
    };
    if let Some(stdin) = child.stdin.take() {
        tokio::spawn(feed(decoder, body, stdin));
    }
    let (exited_tx, exited) = watch::channel(false);
    let out = child.stdout.take().map(|p| tokio::spawn(forward(p, STDOUT, tx.clone(), exited.clone())));
    let err = child.stderr.take().map(|p| tokio::spawn(forward(p, STDERR, tx.clone(), exited)));
    tokio::spawn(async move {
        use std::os::unix::process::ExitStatusExt;
        let status = child.wait().await;
        // Read at once: later, another command's OOM kill could be taken for this one's.
        // A SIGKILL while the container's memory counters moved: the limit.
        let oom = match (&status, before) {
            (Ok(s), Some(before)) => s.signal() == Some(9) && before.oom_since(),
            _ => false,
        };
        let _ = exited_tx.send(true);
        for task in [out, err].into_iter().flatten() {
            let _ = task.await;
        }
        // Signals reach the group while its output still flows (a background child of the
        // command may hold the pipes).
        if let Some((token, running)) = registered {
            running.lock().unwrap_or_else(|p| p.into_inner()).remove(&token);
        }
        let frame = match status {
            Ok(s) => {
                let code = paddock_agent_wire::exit_code(s.code(), s.signal());
                if before.is_some() { encode(EXIT, &exit_frame(code, oom)) } else { encode(EXIT, &code.to_be_bytes()) }
            }
            Err(e) => encode(ERROR, format!("waiting for the command: {e}").as_bytes()),
        };
        let _ = tx.send(Ok(Frame::data(frame))).await;
    });
    response
}

fn exit_frame(code: i32, oom: bool) -> [u8; 5] {
    let c = code.to_be_bytes();
    [c[0], c[1], c[2], c[3], u8::from(oom)]
}

/// Copies the request's stdin frames into the command; the body's end closes its input.
async fn feed(mut decoder: Decoder, mut body: Incoming, mut stdin: tokio::process::ChildStdin) {
    loop {
        loop {
            match decoder.next_frame() {
                Ok(Some((STDIN, data))) => {
                    if stdin.write_all(&data).await.is_err() {
                        return;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return,
            }
        }
        match body.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    decoder.push(&data);
                }
            }
            _ => break,
        }
    }
    let _ = stdin.shutdown().await;
}

/// Sends a pipe's output as frames until its end, or until [`GRACE`] after the command
/// exited (a background child of the command may hold the pipe open for ever). Once the
/// server stops listening, output is still read (and dropped) so the command never blocks on
/// a full pipe.
async fn forward<R: AsyncRead + Unpin>(
    mut pipe: R,
    kind: u8,
    tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    mut exited: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 32 << 10];
    let mut open = true;
    let mut deadline: Option<tokio::time::Instant> = None;
    // Past the deadline, what is already in the pipe is still read (a slow reader may have
    // held this loop up), but no more than a pipe can hold.
    let mut late = 0usize;
    loop {
        if deadline.is_none() && *exited.borrow() {
            deadline = Some(tokio::time::Instant::now() + GRACE);
        }
        let n = match deadline {
            // A timeout polls its future first: data already there is read even when late.
            Some(d) => match tokio::time::timeout_at(d, pipe.read(&mut buf)).await {
                Ok(Ok(n)) if tokio::time::Instant::now() >= d => {
                    late += n;
                    if late > PIPE_MAX {
                        return;
                    }
                    Ok(n)
                }
                Ok(r) => r,
                Err(_) => return,
            },
            None => tokio::select! {
                r = pipe.read(&mut buf) => r,
                _ = exited.changed() => continue,
            },
        };
        match n {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if open && tx.send(Ok(Frame::data(encode(kind, &buf[..n])))).await.is_err() {
                    open = false;
                }
            }
        }
    }
}
