//! The agent binary on this host (no cluster, no root): the protocol the Kubernetes runtime
//! speaks to it, and what a command gets (exact environment, working directory, input, exit
//! codes as a shell reports them, a process group that one signal ends).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use paddock_agent_wire::{Decoder, ERROR, EXIT, SPEC, STDERR, STDIN, STDOUT, encode};
use serde_json::json;

struct Agent {
    /// The agent's pid (the shell that started it is gone).
    pid: String,
    sender: SendRequest<Full<Bytes>>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").arg(&self.pid).status();
    }
}

async fn start() -> Agent {
    start_in(Path::new(".")).await
}

/// The agent started in `dir`, as the runtime starts it in the container's working directory.
async fn start_in(dir: &Path) -> Agent {
    // A free port: the agent's own (44770) may be taken on a test host.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // Started as the runtime starts it: a background job of a shell, which begins with
    // SIGINT and SIGQUIT ignored.
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            "\"$0\" --id test-id --port \"$1\" </dev/null >/dev/null 2>&1 & echo $!",
            env!("CARGO_BIN_EXE_paddock-agent"),
        ])
        .arg(port.to_string())
        .current_dir(dir)
        .output()
        .unwrap();
    let pid = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    for _ in 0..100 {
        if let Ok(s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s)).await.unwrap();
            tokio::spawn(conn);
            return Agent { pid, sender };
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = std::process::Command::new("kill").arg(&pid).status();
    panic!("the agent did not listen on port {port}");
}

/// The response's status and frames.
async fn call(agent: &Agent, path: &str, spec: serde_json::Value, stdin: &[u8]) -> (StatusCode, Vec<(u8, Bytes)>) {
    let mut body = encode(SPEC, &serde_json::to_vec(&spec).unwrap()).to_vec();
    for chunk in stdin.chunks(7) {
        body.extend_from_slice(&encode(STDIN, chunk));
    }
    let req = hyper::Request::post(format!("http://agent{path}")).body(Full::new(Bytes::from(body))).unwrap();
    let mut sender = agent.sender.clone();
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let mut d = Decoder::default();
    d.push(&bytes);
    let mut frames = Vec::new();
    if status == StatusCode::OK {
        while let Some(f) = d.next_frame().unwrap() {
            frames.push(f);
        }
    }
    (status, frames)
}

/// `POST /signal?QUERY`, bodyless: its status.
async fn signal(agent: &Agent, query: &str) -> StatusCode {
    let req = hyper::Request::post(format!("http://agent/signal?{query}")).body(Full::new(Bytes::new())).unwrap();
    let mut sender = agent.sender.clone();
    sender.ready().await.unwrap();
    sender.send_request(req).await.unwrap().status()
}

/// Standard output, standard error and the exit frame's bytes.
fn split(frames: &[(u8, Bytes)]) -> (String, String, Vec<u8>) {
    let text =
        |kind| String::from_utf8(frames.iter().filter(|f| f.0 == kind).flat_map(|f| f.1.to_vec()).collect()).unwrap();
    let exit = frames.iter().find(|f| f.0 == EXIT || f.0 == ERROR).map(|f| f.1.to_vec()).expect("an end frame");
    (text(STDOUT), text(STDERR), exit)
}

fn exit_of(end: &[u8]) -> (i32, u8) {
    (i32::from_be_bytes(end[..4].try_into().unwrap()), end[4])
}

fn exec(argv: &[&str], env: serde_json::Value, cwd: &str, token: &str, stdin: bool) -> serde_json::Value {
    json!({"argv": argv, "env": env, "cwd": cwd, "token": token, "stdin": stdin})
}

#[tokio::test]
async fn commands_get_exactly_what_was_asked_and_report_as_a_shell_would() {
    let agent = start().await;
    let mut sender = agent.sender.clone();
    let id = sender
        .send_request(hyper::Request::get("http://agent/id").body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    assert_eq!(id.into_body().collect().await.unwrap().to_bytes(), format!("test-id {}", paddock_agent_wire::PROTOCOL));

    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_str().unwrap();
    let env = json!({"A": "x 'y'", "PATH": "/usr/bin:/bin"});
    let spec = exec(&["sh", "-c", "echo \"$A\"; pwd; cat; echo err >&2; exit 3"], env, cwd, "t1", true);
    let (status, frames) = call(&agent, "/exec", spec, b"from stdin\n").await;
    assert_eq!(status, StatusCode::OK);
    let (out, err, end) = split(&frames);
    assert_eq!(out, format!("x 'y'\n{cwd}\nfrom stdin\n"));
    assert_eq!(err, "err\n");
    assert_eq!(exit_of(&end), (3, 0));

    // The environment is exactly the given one.
    let (_, frames) = call(&agent, "/exec", exec(&["/usr/bin/env"], json!({"ONLY": "1"}), cwd, "t2", false), b"").await;
    assert_eq!(split(&frames).0, "ONLY=1\n");

    // The kernel's first choice when the container's memory runs out is the command (and what
    // it starts), before the agent, which keeps its own score: at least 500, so that it goes
    // before the keeper.
    let argv = ["sh", "-c", "cat /proc/self/oom_score_adj; cat /proc/$$/oom_score_adj"];
    let (_, frames) = call(&agent, "/exec", exec(&argv, json!({"PATH": "/usr/bin:/bin"}), cwd, "t6", false), b"").await;
    assert_eq!(split(&frames).0, "1000\n1000\n");
    let own: i32 = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap().trim().parse().unwrap();
    let agents = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", agent.pid)).unwrap();
    assert_eq!(agents.trim(), own.max(500).to_string());

    // A missing directory or program: the command never starts, and says why.
    let (_, frames) = call(&agent, "/exec", exec(&["true"], json!({}), "/no/such/dir", "t3", false), b"").await;
    let (_, err, end) = split(&frames);
    assert_eq!(exit_of(&end), (127, 0));
    assert!(err.contains("cannot run \"true\": working directory /no/such/dir does not exist"), "{err}");
    let (_, frames) = call(&agent, "/exec", exec(&["no-such-program-x"], json!({}), cwd, "t4", false), b"").await;
    assert_eq!(exit_of(&split(&frames).2), (127, 0));

    // Output larger than any pipe or frame arrives whole.
    let big = exec(&["head", "-c", "3000000", "/dev/zero"], json!({"PATH": "/usr/bin:/bin"}), cwd, "t5", false);
    let (_, frames) = call(&agent, "/exec", big, b"").await;
    assert_eq!(split(&frames).0.len(), 3_000_000);

    // The runtime's own scripts: the agent's environment, four-byte exit codes.
    let (_, frames) = call(&agent, "/run", json!({"argv": ["sh", "-c", "exit 5"], "stdin": false}), b"").await;
    assert_eq!(split(&frames).2, 5i32.to_be_bytes());

    // Bad requests are refused, not run.
    let (status, _) = call(&agent, "/exec", json!({"argv": "not a list"}), b"").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call(&agent, "/nope", json!({}), b"").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(signal(&agent, "token=never-started&signal=15").await, StatusCode::NOT_FOUND);
    assert_eq!(signal(&agent, "token=x").await, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_command_naming_no_directory_starts_where_the_agent_started_or_in_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let pwd = || exec(&["pwd"], json!({"PATH": "/usr/bin:/bin"}), "", "d1", false);
    let agent = start_in(dir.path()).await;
    let (_, frames) = call(&agent, "/exec", pwd(), b"").await;
    assert_eq!(split(&frames).0, format!("{}\n", dir.path().display()));
    drop(agent);
    // Started in `/`, as in a container whose image has no WorkingDir: `/workspace`.
    let agent = start_in(Path::new("/")).await;
    let (_, frames) = call(&agent, "/exec", pwd(), b"").await;
    let (out, err, end) = split(&frames);
    if Path::new("/workspace").is_dir() {
        assert_eq!(out, "/workspace\n");
    } else {
        assert_eq!(exit_of(&end), (127, 0));
        assert!(err.contains("working directory /workspace does not exist"), "{err}");
    }
}

#[tokio::test]
async fn one_signal_ends_the_commands_whole_process_group() {
    let agent = start().await;
    let dir = tempfile::tempdir().unwrap();
    // A marker no other process on this host has in its command line.
    let marker = format!("sleep 30.{}", std::process::id());
    let script = format!("{marker} & {marker}1; echo never");
    let spec =
        exec(&["sh", "-c", &script], json!({"PATH": "/usr/bin:/bin"}), dir.path().to_str().unwrap(), "sig", false);
    let running = call(&agent, "/exec", spec, b"");
    let signalled = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        signal(&agent, "token=sig&signal=15").await
    };
    let ((_, frames), status) = tokio::join!(running, signalled);
    assert_eq!(status, StatusCode::OK);
    let (out, _, end) = split(&frames);
    assert_eq!((out.as_str(), exit_of(&end)), ("", (143, 0)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker) && !c.contains("sh -c"))
        .collect();
    assert!(left.is_empty(), "the background sleep outlived the signal: {left:?}");
    // Once it ended, its token is gone.
    assert_eq!(signal(&agent, "token=sig&signal=15").await, StatusCode::NOT_FOUND);

    // SIGINT interrupts: a command does not inherit the ignored disposition the agent
    // started with.
    let spec = exec(&["sleep", "30"], json!({"PATH": "/usr/bin:/bin"}), dir.path().to_str().unwrap(), "int", false);
    let running = call(&agent, "/exec", spec, b"");
    let interrupted = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        signal(&agent, "token=int&signal=2").await
    };
    let started = std::time::Instant::now();
    let ((_, frames), status) = tokio::join!(running, interrupted);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(exit_of(&split(&frames).2), (130, 0));
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}
