//! `/code` contexts and `/session` bash sessions against `FakeRuntime` (host processes, no
//! isolation: see `fake/mod.rs`): state kept between runs, results, errors, interrupt, busy
//! contexts, deletion. Needs python3, bash, node (with the typescript package), a JDK and Go on
//! the host, as `.ci/run` has them.

mod fake;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use fake::server::{Server, assert_error};
use serde_json::{Value, json};

fn events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let json = f.trim().strip_prefix("data:").unwrap_or(f).trim();
            let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{f:?}: {e}"));
            assert!(v["timestamp"].is_i64() && v["type"].is_string(), "every event has type and timestamp: {v}");
            v
        })
        .collect()
}

fn of<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn text(events: &[Value], kind: &str) -> String {
    of(events, kind).iter().map(|e| e["text"].as_str().unwrap_or_default()).collect()
}

async fn run(s: &Server, id: &str, body: Value) -> Vec<Value> {
    let (status, out) =
        s.raw("POST", &Server::execd(id, "/code"), "application/json", serde_json::to_vec(&body).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    events(&out)
}

async fn context(s: &Server, id: &str, language: &str) -> String {
    let (status, body) = s.call("POST", &Server::execd(id, "/code/context"), Some(json!({"language": language}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["language"], language);
    body["id"].as_str().unwrap().to_owned()
}

fn have(program: &str) -> bool {
    std::process::Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success())
}

#[tokio::test]
async fn fake_runtime_python_context_keeps_state_and_reports_results_and_errors() {
    let s = Server::new().await;
    let id = s.create().await;
    let ctx = context(&s, &id, "python").await;
    let ev = run(&s, &id, json!({"code": "x = 41", "context": {"id": ctx, "language": "python"}})).await;
    assert_eq!((ev[0]["type"].as_str(), ev[0]["text"].as_str()), (Some("init"), Some(ctx.as_str())), "{ev:?}");
    assert!(of(&ev, "result").is_empty() && of(&ev, "error").is_empty(), "{ev:?}");
    assert_eq!(ev.last().unwrap()["type"], "execution_complete", "{ev:?}");

    let ev = run(
        &s,
        &id,
        json!({"code": "import sys\nprint('hi')\nprint('oops', file=sys.stderr)\nx + 1", "context": {"id": ctx}}),
    )
    .await;
    assert_eq!(text(&ev, "stdout"), "hi\n", "{ev:?}");
    assert_eq!(text(&ev, "stderr"), "oops\n", "{ev:?}");
    let result = of(&ev, "result");
    assert_eq!(result.len(), 1, "{ev:?}");
    assert_eq!(
        (result[0]["results"]["text"].as_str(), result[0]["results"]["text/plain"].as_str()),
        (Some("42"), Some("42"))
    );
    assert_eq!(of(&ev, "execution_count")[0]["execution_count"], 2, "{ev:?}");
    assert_eq!(ev.last().unwrap()["type"], "execution_complete");

    let ev = run(&s, &id, json!({"code": "def f():\n    return undefined_name\nf()", "context": {"id": ctx}})).await;
    let err = &of(&ev, "error")[0]["error"];
    assert_eq!(err["ename"], "NameError", "{ev:?}");
    assert!(err["evalue"].as_str().unwrap().contains("undefined_name"));
    let tb: Vec<&str> = err["traceback"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert_eq!(tb.first(), Some(&"Traceback (most recent call last):"), "{tb:?}");
    assert!(tb.iter().any(|l| l.contains("<cell-3>") && l.contains("line 2")), "cell source in the traceback: {tb:?}");
    assert!(!tb.iter().any(|l| l.contains("<string>")), "no driver frames: {tb:?}");
    assert_eq!(ev.last().unwrap()["type"], "execution_complete", "complete follows an error");

    // Top-level await runs in the context's event loop.
    let ev = run(&s, &id, json!({"code": "import asyncio\nawait asyncio.sleep(0.01)\nawait asyncio.sleep(0, result=x)", "context": {"id": ctx}})).await;
    assert_eq!(of(&ev, "result")[0]["results"]["text"], "41", "{ev:?}");

    // Rich values carry their other MIME types too (IPython's display protocol).
    let png = "class P:\n    def __repr__(self): return 'P()'\n    def _repr_png_(self): return b'\\x89PNG'\nP()";
    let ev = run(&s, &id, json!({"code": png, "context": {"id": ctx}})).await;
    let results = &of(&ev, "result")[0]["results"];
    assert_eq!((results["text"].as_str(), results["image/png"].as_str()), (Some("P()"), Some("iVBORw==")), "{ev:?}");

    // Get, list, the default context of a language, delete.
    let (status, got) = s.call("GET", &Server::execd(&id, &format!("/code/contexts/{ctx}")), None).await;
    assert_eq!((status, got), (StatusCode::OK, json!({"id": ctx, "language": "python"})));
    let ev = run(&s, &id, json!({"code": "y = 1\ny", "context": {"language": "python"}})).await;
    let default = ev[0]["text"].as_str().unwrap().to_owned();
    assert_ne!(default, ctx, "an id-less run uses the language's default context");
    let ev = run(&s, &id, json!({"code": "'x' in dir()"})).await;
    assert_eq!(
        (ev[0]["text"].as_str(), of(&ev, "result")[0]["results"]["text"].as_str()),
        (Some(default.as_str()), Some("False"))
    );
    let (_, list) = s.call("GET", &Server::execd(&id, "/code/contexts?language=python"), None).await;
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    let (status, _) = s.call("DELETE", &Server::execd(&id, &format!("/code/contexts/{ctx}")), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = s.call("GET", &Server::execd(&id, &format!("/code/contexts/{ctx}")), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "CONTEXT_NOT_FOUND");
    let (status, _) = s.call("DELETE", &Server::execd(&id, "/code/contexts?language=python"), None).await;
    assert_eq!(status, StatusCode::OK);
    let (_, list) = s.call("GET", &Server::execd(&id, "/code/contexts?language=python"), None).await;
    assert_eq!(list, json!([]));
}

#[tokio::test]
async fn fake_runtime_code_refusals_are_clear() {
    let s = Server::new().await;
    let id = s.create().await;
    let (status, body) = s.call("POST", &Server::execd(&id, "/code/context"), Some(json!({"language": "cobol"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&body, "LANGUAGE_NOT_SUPPORTED");
    let (status, body) =
        s.call("POST", &Server::execd(&id, "/code"), Some(json!({"code": "1", "context": {"id": "nope"}}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "CONTEXT_NOT_FOUND");
    let (status, body) = s.call("POST", &Server::execd(&id, "/code"), Some(json!({"code": "  "}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&body, "INVALID_REQUEST_BODY");
    let (status, body) = s.raw("POST", &Server::execd(&id, "/code"), "application/json", b"{not json".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&body));
    let (status, body) = s.call("DELETE", &Server::execd(&id, "/code?id=nope"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "CONTEXT_NOT_FOUND");
    let (status, body) = s.call("DELETE", &Server::execd(&id, "/code/contexts"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&body, "MISSING_QUERY");
}

#[tokio::test]
async fn fake_runtime_interrupt_ends_a_busy_loop_and_a_busy_context_is_refused() {
    let s = Server::new().await;
    let id = s.create().await;
    let ctx = context(&s, &id, "python").await;
    run(&s, &id, json!({"code": "kept = 'yes'", "context": {"id": ctx}})).await;
    let t0 = Instant::now();
    let looping = run(&s, &id, json!({"code": "while True:\n    pass", "context": {"id": ctx}}));
    let meanwhile = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let busy = run(&s, &id, json!({"code": "1", "context": {"id": ctx}})).await;
        let (status, _) = s.call("DELETE", &Server::execd(&id, &format!("/code?id={ctx}")), None).await;
        assert_eq!(status, StatusCode::OK);
        busy
    };
    let (ev, busy) = tokio::join!(looping, meanwhile);
    assert!(t0.elapsed() < Duration::from_secs(5), "the interrupt took {:?}", t0.elapsed());
    let err = &of(&ev, "error")[0]["error"];
    assert_eq!(err["ename"], "KeyboardInterrupt", "{ev:?}");
    assert!(
        of(&busy, "error").iter().any(|e| e["error"]["evalue"].as_str().unwrap().contains("session is busy")),
        "{busy:?}"
    );
    let ev = run(&s, &id, json!({"code": "kept", "context": {"id": ctx}})).await;
    assert_eq!(of(&ev, "result")[0]["results"]["text"], "'yes'", "the context survived the interrupt: {ev:?}");
}

#[tokio::test]
async fn fake_runtime_deleting_a_context_or_its_sandbox_kills_the_driver() {
    let s = Server::new().await;
    let id = s.create().await;
    let mut pids = Vec::new();
    for _ in 0..2 {
        let ctx = context(&s, &id, "python").await;
        let ev = run(&s, &id, json!({"code": "import os\nos.getpid()", "context": {"id": ctx}})).await;
        let pid: u32 = of(&ev, "result")[0]["results"]["text"].as_str().unwrap().parse().unwrap();
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
        pids.push((ctx, pid));
    }
    let (status, _) = s.call("DELETE", &Server::execd(&id, &format!("/code/contexts/{}", pids[0].0)), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = s.call("DELETE", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for (_, pid) in pids {
        let t0 = Instant::now();
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(t0.elapsed() < Duration::from_secs(5), "driver {pid} still runs");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn fake_runtime_bash_and_javascript_contexts_keep_state() {
    let s = Server::new().await;
    let id = s.create().await;
    let ctx = context(&s, &id, "bash").await;
    let ev = run(
        &s,
        &id,
        json!({"code": "cd /tmp\nexport GREETING=hello\ncount=5\nf() { echo \"f:$1\"; }", "context": {"id": ctx}}),
    )
    .await;
    assert_eq!(ev.last().unwrap()["type"], "execution_complete", "{ev:?}");
    let ev = run(&s, &id, json!({"code": "echo \"$GREETING $count $PWD\"; f x; read line; echo \"read:[$line]\"", "context": {"id": ctx}})).await;
    assert_eq!(text(&ev, "stdout"), "hello 5 /tmp\nf:x\nread:[]\n", "{ev:?}");
    let ev = run(&s, &id, json!({"code": "echo before; false", "context": {"id": ctx}})).await;
    assert_eq!(of(&ev, "error")[0]["error"]["evalue"], "1", "{ev:?}");
    // `exit` ends the shell; the context goes on with a fresh one.
    let ev = run(&s, &id, json!({"code": "exit 3", "context": {"id": ctx}})).await;
    assert_eq!(of(&ev, "error")[0]["error"]["evalue"], "3", "{ev:?}");
    let ev = run(&s, &id, json!({"code": "echo again", "context": {"id": ctx}})).await;
    assert_eq!(text(&ev, "stdout"), "again\n", "{ev:?}");

    assert!(have("node"), "the JavaScript half needs node on this host (Debian: apt-get install nodejs)");
    let js = context(&s, &id, "javascript").await;
    let ev =
        run(&s, &id, json!({"code": "var n = 20; const m = 1; console.log('log', n)", "context": {"id": js}})).await;
    assert_eq!(text(&ev, "stdout"), "log 20\n", "{ev:?}");
    let ev = run(&s, &id, json!({"code": "n * 2 + m", "context": {"id": js}})).await;
    assert_eq!(of(&ev, "result")[0]["results"]["text"], "41", "{ev:?}");
    let ev = run(&s, &id, json!({"code": "null.x", "context": {"id": js}})).await;
    assert_eq!(of(&ev, "error")[0]["error"]["ename"], "TypeError", "{ev:?}");
    let ev = run(&s, &id, json!({"code": "await Promise.resolve(7)", "context": {"id": js}})).await;
    assert!(!of(&ev, "error").is_empty() || !of(&ev, "result").is_empty(), "{ev:?}");
    let ev = run(&s, &id, json!({"code": "(async () => 7)()", "context": {"id": js}})).await;
    assert_eq!(of(&ev, "result")[0]["results"]["text"], "7", "promises are awaited: {ev:?}");
    // A synchronous endless loop breaks on interrupt; the context keeps its state.
    let t0 = Instant::now();
    let looping = run(&s, &id, json!({"code": "while (true) {}", "context": {"id": js}}));
    let interrupt = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.call("DELETE", &Server::execd(&id, &format!("/code?id={js}")), None).await
    };
    let (ev, (status, _)) = tokio::join!(looping, interrupt);
    assert_eq!(status, StatusCode::OK);
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(of(&ev, "error")[0]["error"]["evalue"].as_str().unwrap().contains("SIGINT"), "{ev:?}");
    let ev = run(&s, &id, json!({"code": "n", "context": {"id": js}})).await;
    assert_eq!(of(&ev, "result")[0]["results"]["text"], "20", "{ev:?}");
}

#[tokio::test]
async fn fake_runtime_sessions_keep_cwd_and_exports() {
    let s = Server::new().await;
    let id = s.create().await;
    let (status, body) = s.call("POST", &Server::execd(&id, "/session"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let session = body["session_id"].as_str().unwrap().to_owned();
    let run_in = async |command: &str, extra: Value| {
        let mut body = json!({"command": command});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, out) = s
            .raw(
                "POST",
                &Server::execd(&id, &format!("/session/{session}/run")),
                "application/json",
                serde_json::to_vec(&body).unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        events(&out)
    };
    // The fake's commands are host processes: a directory of the host's /tmp, removed on drop.
    let dir = tempfile::Builder::new().prefix("pdk-s").tempdir_in("/tmp").unwrap();
    let dir_name = dir.path().display().to_string();
    let ev = run_in(&format!("cd {dir_name} && export SESSION_VAR=kept"), json!({})).await;
    assert_eq!(ev.last().unwrap()["type"], "execution_complete", "{ev:?}");
    let ev = run_in("pwd; echo $SESSION_VAR; printf 'a\\nb'", json!({})).await;
    let lines: Vec<&str> = of(&ev, "stdout").iter().map(|e| e["text"].as_str().unwrap()).collect();
    assert_eq!(lines, [dir_name.as_str(), "kept", "a", "b"], "one event per line, like /command: {ev:?}");
    // A cwd for one run only.
    let ev = run_in("pwd", json!({"cwd": "/tmp"})).await;
    assert_eq!(text(&ev, "stdout"), "/tmp");
    let ev = run_in("pwd; exit_code=4; (exit $exit_code)", json!({})).await;
    assert_eq!(text(&ev, "stdout"), dir_name);
    let last = ev.last().unwrap();
    assert_eq!((last["type"].as_str(), last["error"]["evalue"].as_str()), (Some("error"), Some("4")), "{ev:?}");
    // A timeout interrupts the run; the session lives on.
    let t0 = Instant::now();
    let ev = run_in("sleep 30", json!({"timeout": 500})).await;
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    assert_eq!(ev.last().unwrap()["type"], "error", "{ev:?}");
    let ev = run_in("echo $SESSION_VAR", json!({})).await;
    assert_eq!(text(&ev, "stdout"), "kept", "{ev:?}");
    // A timeout that fires before the shell even started the command (1 ms): the interrupt is
    // sent again until the run ends, so the session is not killed with its state.
    let t0 = Instant::now();
    let ev = run_in("sleep 20", json!({"timeout": 1})).await;
    assert_eq!(ev.last().unwrap()["type"], "error", "{ev:?}");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    let ev = run_in("echo $SESSION_VAR; pwd", json!({})).await;
    assert_eq!(text(&ev, "stdout"), format!("kept{dir_name}"), "the shell lived on: {ev:?}");

    let (status, _) = s.call("DELETE", &Server::execd(&id, &format!("/session/{session}")), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = s.call("DELETE", &Server::execd(&id, &format!("/session/{session}")), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "SESSION_NOT_FOUND");
    let (status, body) = s
        .raw(
            "POST",
            &Server::execd(&id, &format!("/session/{session}/run")),
            "application/json",
            br#"{"command":"ls"}"#.to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{}", String::from_utf8_lossy(&body));
}

#[tokio::test]
async fn fake_runtime_a_missing_interpreter_is_a_clear_400_not_a_hang() {
    let s = Server::new().await;
    let (status, body) = s
        .call(
            "POST",
            "/v1/sandboxes",
            Some(json!({
                "image": {"uri": "fake"},
                "env": {"PATH": "/nonexistent"},
                "entrypoint": ["/usr/bin/tail", "-f", "/dev/null"]
            })),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    let t0 = Instant::now();
    for (language, interpreter) in [("python", "python3"), ("javascript", "node"), ("bash", "bash")] {
        let (status, body) =
            s.call("POST", &Server::execd(&id, "/code/context"), Some(json!({"language": language}))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["message"].as_str().unwrap().contains(interpreter), "names the interpreter: {body}");
    }
    let (status, body) = s.call("POST", &Server::execd(&id, "/code"), Some(json!({"code": "1"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = s.call("POST", &Server::execd(&id, "/session"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn fake_runtime_contexts_and_sessions_per_sandbox_are_bounded() {
    let s = Server::new().await;
    let id = s.create().await;
    let mut sessions = Vec::new();
    for _ in 0..32 {
        let (status, body) = s.call("POST", &Server::execd(&id, "/session"), Some(json!({"cwd": "/tmp"}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        sessions.push(body["session_id"].as_str().unwrap().to_owned());
    }
    let (status, body) = s.call("POST", &Server::execd(&id, "/session"), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_error(&body, "TOO_MANY_CONTEXTS");
    // Sessions and code contexts are counted apart.
    context(&s, &id, "bash").await;
    let (status, _) = s.call("DELETE", &Server::execd(&id, &format!("/session/{}", sessions[0])), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = s.call("POST", &Server::execd(&id, "/session"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn fake_runtime_deleting_a_context_stops_the_cell_it_is_running() {
    let s = Server::new().await;
    let id = s.create().await;
    let ctx = context(&s, &id, "python").await;
    let spin = "import os\nprint(os.getpid(), flush=True)\nwhile True:\n    pass";
    let running = run(&s, &id, json!({"code": spin, "context": {"id": ctx}}));
    let delete = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        s.call("DELETE", &Server::execd(&id, &format!("/code/contexts/{ctx}")), None).await
    };
    // The run ends because its driver is killed: a deleted context leaves nothing running
    // that no one could interrupt any more.
    let (ev, (status, _)) = tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(running, delete) })
        .await
        .expect("the spinning cell ended once its context was deleted");
    assert_eq!(status, StatusCode::OK);
    let pid: u32 = text(&ev, "stdout").trim().parse().unwrap_or_else(|_| panic!("{ev:?}"));
    let t0 = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(t0.elapsed() < Duration::from_secs(5), "driver {pid} still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// TypeScript on the Node driver: types are stripped (Node 22.13+) or transpiled by the
/// typescript package (CI installs it globally, as `.ci/run` says); state is kept as in
/// JavaScript. (An image with neither gets a 400 naming both: the driver says so before it is
/// ready, as a missing interpreter does, tested below.)
#[tokio::test]
async fn fake_runtime_typescript_contexts_keep_state_and_type_annotations_run() {
    let s = Server::new().await;
    let id = s.create().await;
    let ts = context(&s, &id, "typescript").await;
    let first = "const x: number = 40;\ninterface P { n: number }\nfunction add(a: number): number { return a + 2 }";
    let ev = run(&s, &id, json!({"code": first, "context": {"id": ts}})).await;
    assert!(of(&ev, "error").is_empty(), "{ev:?}");
    let ev =
        run(&s, &id, json!({"code": "const p: P = { n: add(x) };\nconsole.log('hi');\np.n", "context": {"id": ts}}))
            .await;
    assert_eq!(text(&ev, "stdout"), "hi\n", "{ev:?}");
    assert_eq!(of(&ev, "result")[0]["results"]["text"], "42", "{ev:?}");
    let ev = run(&s, &id, json!({"code": "(null as any).x", "context": {"id": ts}})).await;
    assert_eq!(of(&ev, "error")[0]["error"]["ename"], "TypeError", "{ev:?}");
    // A TypeScript context is listed as one, apart from JavaScript's.
    let (_, list) = s.call("GET", &Server::execd(&id, "/code/contexts?language=typescript"), None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
}

/// Java: a JShell per context (CI's machine has a JDK), state kept between runs, the last
/// expression's value as the result, exceptions and compile errors as errors, and an interrupt
/// that stops a loop while the context lives on.
#[tokio::test]
async fn fake_runtime_java_contexts_keep_state_in_a_jshell() {
    assert!(
        have("java"),
        "the Java context test needs a JDK on this host (Debian: apt-get install default-jdk-headless)"
    );
    let s = Server::new().await;
    let id = s.create().await;
    let java = context(&s, &id, "java").await;
    let ev =
        run(&s, &id, json!({"code": "int x = 40;\nint add(int a) { return a + 2; }", "context": {"id": java}})).await;
    assert!(of(&ev, "error").is_empty() && of(&ev, "result").is_empty(), "{ev:?}");
    let ev = run(&s, &id, json!({"code": "System.out.println(\"hi\");\nadd(x)", "context": {"id": java}})).await;
    assert_eq!(text(&ev, "stdout"), "hi\n", "{ev:?}");
    assert_eq!(of(&ev, "result")[0]["results"]["text"], "42", "{ev:?}");
    let ev = run(&s, &id, json!({"code": "Object o = null;\no.toString()", "context": {"id": java}})).await;
    // Named as the IJava kernel (and OpenSandbox's suite) names it, the value saying what was thrown.
    assert_eq!(of(&ev, "error")[0]["error"]["ename"], "EvalException", "{ev:?}");
    assert!(of(&ev, "error")[0]["error"]["evalue"].as_str().unwrap().contains("NullPointerException"), "{ev:?}");
    let ev = run(&s, &id, json!({"code": "undefinedThing + 1", "context": {"id": java}})).await;
    assert_eq!(of(&ev, "error")[0]["error"]["ename"], "CompilationError", "{ev:?}");
    assert!(of(&ev, "error")[0]["error"]["evalue"].as_str().unwrap().contains("cannot find symbol"), "{ev:?}");
    let t0 = Instant::now();
    let looping = run(&s, &id, json!({"code": "while (true) { x = x + 0; }", "context": {"id": java}}));
    let interrupt = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        s.call("DELETE", &Server::execd(&id, &format!("/code?id={java}")), None).await
    };
    let (ev, (status, _)) = tokio::join!(looping, interrupt);
    assert_eq!(status, StatusCode::OK);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?} {ev:?}", t0.elapsed());
    let ev = run(&s, &id, json!({"code": "x + 2", "context": {"id": java}})).await;
    assert_eq!(of(&ev, "result")[0]["results"]["text"], "42", "the context lived on: {ev:?}");
    // An interrupt that comes while JShell is still compiling the cell (nothing to stop yet) is
    // sent again until the run ends, so the context is not killed with its state.
    let t0 = Instant::now();
    let looping =
        run(&s, &id, json!({"code": "int spin() { while (true) { x = x + 0; } }\nspin()", "context": {"id": java}}));
    let interrupt = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.call("DELETE", &Server::execd(&id, &format!("/code?id={java}")), None).await
    };
    let (ev, (status, _)) = tokio::join!(looping, interrupt);
    assert_eq!(status, StatusCode::OK);
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?} {ev:?}", t0.elapsed());
    let ev = run(&s, &id, json!({"code": "x + 2", "context": {"id": java}})).await;
    assert_eq!(of(&ev, "result")[0]["results"]["text"], "42", "the context lived on an early interrupt: {ev:?}");
}

/// Where this host's `go` is: on PATH, or where the official archive puts it.
fn go_dir() -> Option<std::path::PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|d| d.join("go").is_file());
    on_path.or_else(|| Some(std::path::PathBuf::from("/usr/local/go/bin")).filter(|d| d.join("go").is_file()))
}

/// Go: a cell that is a whole program runs as one (OpenSandbox's suite sends those); other
/// cells keep their declarations for later cells and run their statements once; compile
/// errors and panics are errors; an interrupt ends the cell, not the context.
#[tokio::test]
async fn fake_runtime_go_contexts_run_programs_and_keep_declarations() {
    let go = go_dir().expect("the Go context test needs a Go toolchain on this host (CI's machine has /usr/local/go)");
    let s = Server::new().await;
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", go.display());
    let (status, body) =
        s.call("POST", "/v1/sandboxes", Some(json!({"image": {"uri": "fake"}, "env": {"PATH": path}}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    let ctx = context(&s, &id, "go").await;
    let whole = "package main\nimport \"fmt\"\nfunc main() {\n    fmt.Print(\"Hello from Go!\")\n}";
    let ev = run(&s, &id, json!({"code": whole, "context": {"id": ctx}})).await;
    assert_eq!(text(&ev, "stdout"), "Hello from Go!", "{ev:?}");
    let ev = run(
        &s,
        &id,
        json!({"code": "import \"fmt\"\nvar x = 40\nfunc add(a int) int { return a + 2 }", "context": {"id": ctx}}),
    )
    .await;
    assert!(of(&ev, "error").is_empty(), "{ev:?}");
    let ev = run(&s, &id, json!({"code": "fmt.Println(\"hi\", add(x))", "context": {"id": ctx}})).await;
    assert_eq!(text(&ev, "stdout"), "hi 42\n", "declarations and imports are kept: {ev:?}");
    let ev =
        run(&s, &id, json!({"code": "func main() {\n\tfmt.Println(\"own\", add(1))\n}", "context": {"id": ctx}})).await;
    assert_eq!(text(&ev, "stdout"), "own 3\n", "a cell's own main runs, with the kept declarations: {ev:?}");
    let broken = "package main\nfunc main() {\n    undeclaredVariable++\n}";
    let ev = run(&s, &id, json!({"code": broken, "context": {"id": ctx}})).await;
    assert_eq!(of(&ev, "error")[0]["error"]["ename"], "CompilationError", "{ev:?}");
    assert!(of(&ev, "error")[0]["error"]["evalue"].as_str().unwrap().contains("undeclaredVariable"), "{ev:?}");
    let ev = run(&s, &id, json!({"code": "var s []int\n_ = s[3]", "context": {"id": ctx}})).await;
    assert!(text(&ev, "stderr").contains("index out of range"), "{ev:?}");
    assert_eq!(of(&ev, "error")[0]["error"]["ename"], "ExitError", "{ev:?}");
    let looping = run(&s, &id, json!({"code": "for {}", "context": {"id": ctx}}));
    let interrupt = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        s.call("DELETE", &Server::execd(&id, &format!("/code?id={ctx}")), None).await
    };
    let (ev, (status, _)) = tokio::join!(looping, interrupt);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(of(&ev, "error")[0]["error"]["ename"], "Interrupted", "{ev:?}");
    let ev = run(&s, &id, json!({"code": "fmt.Println(add(0))", "context": {"id": ctx}})).await;
    assert_eq!(text(&ev, "stdout"), "2\n", "the context lived on: {ev:?}");
}
