//! The real `paddock serve`, driven over HTTP: auth, sandbox isolation of execd endpoints, bad
//! input, the workspace API, metrics, and a `kill -9` restart that loses nothing.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{KEY, Server, data_dir, free_port, serve_command};
use serde_json::{Value, json};

fn assert_api_error(status: u16, body: &Value, want_status: u16, want_in_message: &str) {
    assert_eq!(status, want_status, "{body}");
    assert!(body["code"].is_string(), "errors are {{code, message}}: {body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains(want_in_message), "{message:?} should mention {want_in_message:?}");
}

#[test]
fn auth_is_required_and_errors_are_code_and_message() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &[]);
    let (status, body) = s.call("GET", "/v1/sandboxes", None, &[]);
    assert_api_error(status, &body, 401, "OPEN-SANDBOX-API-KEY");
    assert_eq!(body["code"], "MISSING_API_KEY");
    let (status, body) = s.call("GET", "/v1/sandboxes", None, &[("OPEN-SANDBOX-API-KEY", "wrong")]);
    assert_eq!((status, body["code"].as_str()), (401, Some("INVALID_API_KEY")));
    assert_eq!(s.call("GET", "/health", None, &[]).0, 200);
    let (status, body) = s.api("GET", "/v1/sandboxes", None);
    assert_eq!(status, 200);
    assert_eq!(body["pagination"]["totalItems"], 0);
    // Served at the root as well as under /v1.
    assert_eq!(s.api("GET", "/sandboxes", None).0, 200);
}

#[test]
fn bad_input_gets_a_clear_4xx_never_a_5xx() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &[]);
    let post = |body: &str| {
        let req = ureq::http::Request::builder()
            .method("POST")
            .uri(s.url("/v1/sandboxes"))
            .header("OPEN-SANDBOX-API-KEY", KEY)
            .header("content-type", "application/json")
            .header("x-request-id", "req-42")
            .body(body.to_owned())
            .unwrap();
        let resp = s.agent.run(req).unwrap();
        let echoed = resp.headers().get("x-request-id").map(|v| v.to_str().unwrap().to_owned());
        let status = resp.status().as_u16();
        let body: Value = serde_json::from_str(&resp.into_body().read_to_string().unwrap()).unwrap_or(Value::Null);
        assert_eq!(echoed.as_deref(), Some("req-42"), "X-Request-ID must be echoed");
        (status, body)
    };
    let cases: &[(&str, &str)] = &[
        ("{", "invalid JSON"),
        (r#"{"image":{"uri":"host"},"bogus":true}"#, "unknown field"),
        (r#"{"image":{"uri":"host"},"timeout":30}"#, "minimum of 60"),
        (r#"{"image":{"uri":"host"},"timeout":999999}"#, "maximum session length"),
        (r#"{"image":{"uri":"host"},"resourceLimits":{"memory":"-1Gi"}}"#, "memory"),
        (r#"{"image":{"uri":"host"},"resourceLimits":{"cpu":"0"}}"#, "cpu"),
        (r#"{"image":{"uri":"host"},"resourceLimits":{"pids":"-5"}}"#, "pids"),
        (r#"{"image":{"uri":"host"},"resourceLimits":{"gpu":"1"}}"#, "not supported"),
        (r#"{"image":{"uri":"Not A Reference"}}"#, "not a valid image reference"),
        (r#"{"image":{"uri":"host"},"networkPolicy":{"egress":[{"action":"allow","target":"a b"}]}}"#, "egress rule 0"),
        (r#"{"image":{"uri":"host"},"networkPolicy":{"defaultAction":"maybe"}}"#, "unknown variant"),
        (r#"{"image":{"uri":"host"},"metadata":{"bad key":"v"}}"#, "label"),
        (r#"{"image":{"uri":"host"},"env":{"1BAD":"x"}}"#, "variable name"),
        (r#"{"image":{"uri":"host"},"volumes":[{"name":"v"}]}"#, "mountPath"),
        (
            r#"{"image":{"uri":"host"},"volumes":[{"name":"v","mountPath":"/mnt/v","host":{"path":"/srv"}}]}"#,
            "--volume-root",
        ),
        (
            r#"{"image":{"uri":"host"},"volumes":[{"name":"v","mountPath":"/mnt/v","ossfs":{"bucket":"b"}}]}"#,
            "not supported",
        ),
        (r#"{"image":{"uri":"host"},"volumes":[{"name":"v","mountPath":"/proc/v","pvc":{"claimName":"c"}}]}"#, "/proc"),
        (
            r#"{"image":{"uri":"host"},"volumes":[{"name":"v","mountPath":"/mnt/v","pvc":{"claimName":"../c"}}]}"#,
            "volume name",
        ),
        (r#"{"image":{"uri":"host"},"volumes":[{"name":"v","mountPath":"/mnt/v"}]}"#, "exactly one"),
        (r#"{"image":{"uri":"host"},"extensions":{"workspace":""}}"#, "empty"),
    ];
    for (body, mention) in cases {
        let (status, resp) = post(body);
        assert_api_error(status, &resp, 400, mention);
    }
    let (status, body) = s.api("GET", "/v1/sandboxes/sbx-000000000000", None);
    assert_api_error(status, &body, 404, "no sandbox");
    let (status, body) = s.api("GET", "/v1/sandboxes?pageSize=1000", None);
    assert_api_error(status, &body, 400, "pageSize");
    let (status, body) = s.api("DELETE", "/v1/sandboxes/..%2Fetc", None);
    assert!(status == 404 || status == 400, "{status} {body}");
    let (status, _) = s.api("GET", "/v1/no/such/route", None);
    assert_eq!(status, 404);
    assert!(
        s.api("GET", "/v1/sandboxes", None).1["items"].as_array().unwrap().is_empty(),
        "a bad request left a sandbox"
    );
}

#[test]
fn a_sandbox_token_opens_only_its_own_sandbox() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &[]);
    let a = s.create();
    let b = s.create();
    let (status, ep) = s.api("GET", &format!("/v1/sandboxes/{a}/endpoints/44772"), None);
    assert_eq!(status, 200, "{ep}");
    let endpoint = ep["endpoint"].as_str().unwrap();
    assert!(endpoint.ends_with(&format!("/sandboxes/{a}/proxy/44772")), "{endpoint}");
    let (name, token) = ep["headers"].as_object().unwrap().iter().next().unwrap();
    let token = token.as_str().unwrap();
    let ping = |id: &str, headers: &[(&str, &str)]| {
        s.call("GET", &format!("/v1/sandboxes/{id}/proxy/44772/ping"), None, headers).0
    };
    assert_eq!(ping(&a, &[(name.as_str(), token)]), 200, "the token opens its own sandbox");
    assert_eq!(ping(&b, &[(name.as_str(), token)]), 401, "A's token must not open B");
    assert_eq!(ping(&a, &[]), 401, "no credentials, no access");
    assert_eq!(ping(&b, &[("OPEN-SANDBOX-API-KEY", KEY)]), 200, "proxy mode uses the API key");
    let (status, ep) = s.api("GET", &format!("/v1/sandboxes/{a}/endpoints/18080?use_server_proxy=true"), None);
    assert_eq!(status, 200);
    assert!(ep.get("headers").is_none() || ep["headers"].as_object().unwrap().is_empty(), "{ep}");
    let (status, policy) = s.api("GET", &format!("/v1/sandboxes/{a}/proxy/18080/policy"), None);
    assert_eq!((status, policy["policy"]["defaultAction"].as_str()), (200, Some("deny")), "{policy}");
}

#[test]
fn data_files_are_private_and_tokens_are_not_stored() {
    use std::os::unix::fs::PermissionsExt;
    let dir = data_dir();
    // No --api-key: the server creates and stores one.
    let mut s = Server::launch(dir.path(), &[], &[]);
    assert!(!s.key.is_empty(), "the server stored no API key");
    let a = s.create();
    let b = s.create();
    let token_of = |s: &Server, id: &str| {
        let (status, ep) = s.api("GET", &format!("/v1/sandboxes/{id}/endpoints/44772"), None);
        assert_eq!(status, 200, "{ep}");
        let (name, token) = ep["headers"].as_object().unwrap().iter().next().unwrap();
        (name.clone(), token.as_str().unwrap().to_owned())
    };
    let (name, token) = token_of(&s, &a);
    let ping = |s: &Server, id: &str, token: &str| {
        s.call("GET", &format!("/v1/sandboxes/{id}/proxy/44772/ping"), None, &[(name.as_str(), token)]).0
    };
    assert_eq!((ping(&s, &a, &token), ping(&s, &b, &token)), (200, 401), "the token opens exactly its sandbox");
    assert_eq!(s.run(&a, "echo written", false).0, ["written"]);
    let files = |dir: &std::path::Path| {
        let mut names: Vec<(String, u32)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_file())
            .map(|e| (e.file_name().into_string().unwrap(), e.metadata().unwrap().permissions().mode() & 0o777))
            .collect();
        names.sort();
        names
    };
    let listed = files(dir.path());
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    for expected in ["api-key", "server.db", "server.db-shm", "server.db-wal", "token-key"] {
        assert!(names.contains(&expected), "{expected} missing from {names:?}");
    }
    for (name, mode) in &listed {
        assert_eq!(*mode, 0o600, "{name} is {mode:o}, not 0600");
    }
    // Neither the database nor its log holds the token, in any encoding.
    for f in ["server.db", "server.db-wal", "server.db-shm"] {
        let bytes = std::fs::read(dir.path().join(f)).unwrap();
        assert!(!bytes.windows(token.len()).any(|w| w == token.as_bytes()), "{f} holds the token in clear");
        let raw =
            (0..token.len()).step_by(2).map(|i| u8::from_str_radix(&token[i..i + 2], 16).unwrap()).collect::<Vec<_>>();
        assert!(!bytes.windows(raw.len()).any(|w| w == raw.as_slice()), "{f} holds the token's bytes");
    }
    // The token is derived from a key that survives a restart, so it keeps working after one.
    s.kill9();
    let s = Server::launch(dir.path(), &[], &[]);
    assert_eq!((ping(&s, &a, &token), ping(&s, &b, &token)), (200, 401));
    assert_eq!(token_of(&s, &a).1, token, "the endpoints API gives out the same token");
    assert_ne!(token_of(&s, &b).1, token);
    assert_eq!(ping(&s, &b, &token_of(&s, &b).1), 200);
}

/// Starts `paddock serve` with stderr captured and returns what it printed up to "serving on".
fn startup_messages(data: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (Child, u16, String) {
    common::require_root();
    let port = free_port();
    // The environment given goes after the removal, so a test may still set the key.
    let mut command = serve_command(data, port, args, &[]);
    let mut child =
        command.env_remove("PADDOCK_API_KEY").envs(env.iter().copied()).stderr(Stdio::piped()).spawn().unwrap();
    let mut printed = String::new();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        printed.push_str(&line);
        printed.push('\n');
        if line.contains("serving on") {
            break;
        }
    }
    // Keep draining so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, port, printed)
}

#[test]
fn the_api_key_comes_from_a_file_or_the_environment_and_the_flag_warns() {
    let dir = data_dir();
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let status = |port: u16, key: &str| {
        let req = ureq::http::Request::builder()
            .uri(format!("http://127.0.0.1:{port}/v1/sandboxes"))
            .header("OPEN-SANDBOX-API-KEY", key)
            .body(())
            .unwrap();
        agent.run(req).unwrap().status().as_u16()
    };
    let stop = |mut child: Child| {
        let _ = child.kill();
        let _ = child.wait();
    };

    // --api-key works but says it is visible to every local user.
    let (child, port, printed) = startup_messages(dir.path(), &["--api-key", KEY], &[]);
    assert!(printed.contains("warning: --api-key") && printed.contains("--api-key-file"), "{printed}");
    assert_eq!(status(port, KEY), 200);
    stop(child);

    // A key file: not in the process list, no warning.
    let file_key = "key-from-a-file-42";
    let key_file = tempfile::Builder::new().prefix("pdkey").tempfile_in("/tmp").unwrap();
    std::fs::write(key_file.path(), format!("{file_key}\n")).unwrap();
    std::fs::set_permissions(key_file.path(), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (child, port, printed) =
        startup_messages(dir.path(), &["--api-key-file", key_file.path().to_str().unwrap()], &[]);
    assert!(!printed.contains("warning"), "{printed}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap();
    assert!(!cmdline.windows(file_key.len()).any(|w| w == file_key.as_bytes()), "the key is in the process list");
    assert_eq!((status(port, file_key), status(port, KEY)), (200, 401));
    stop(child);

    // PADDOCK_API_KEY: no warning either.
    let (child, port, printed) = startup_messages(dir.path(), &[], &[("PADDOCK_API_KEY", "key-from-env-7")]);
    assert!(!printed.contains("warning"), "{printed}");
    assert_eq!((status(port, "key-from-env-7"), status(port, KEY)), (200, 401));
    stop(child);

    // An empty key file is refused with a message that says what to do.
    std::fs::write(key_file.path(), "\n").unwrap();
    let out = Command::new(common::EXE)
        .args(["--data-dir", dir.path().to_str().unwrap(), "serve", "--listen", "127.0.0.1:0"])
        .args(["--api-key-file", key_file.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is empty: put the key on its first line"));
}

#[test]
fn workspaces_over_http_persist_across_release() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &[]);
    let thread = "conversation%2F42";
    let (status, first) = s.api("POST", &format!("/v1/workspaces/{thread}/acquire"), None);
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(first["workspace"]["thread"], "conversation/42");
    let (again_status, again) = s.api("POST", &format!("/v1/workspaces/{thread}/acquire"), Some(&json!({})));
    assert_eq!((again_status, again["id"].as_str()), (200, Some(id.as_str())), "acquire reattaches");
    assert_eq!(s.run(&id, "echo kept > /workspace/note && echo ok", false), (vec!["ok".to_owned()], 0));
    assert_eq!(s.api("POST", &format!("/v1/workspaces/{thread}/release"), None).0, 204);
    assert_eq!(s.api("GET", &format!("/v1/sandboxes/{id}"), None).0, 404, "a released sandbox is gone");
    let (_, second) = s.api("POST", &format!("/v1/workspaces/{thread}/acquire"), None);
    let id2 = second["id"].as_str().unwrap().to_owned();
    assert_ne!(id2, id);
    assert_eq!(s.run(&id2, "cat /workspace/note", false), (vec!["kept".to_owned()], 0));
    assert_eq!(s.api("DELETE", &format!("/v1/workspaces/{thread}"), None).0, 204);
    let (_, third) = s.api("POST", &format!("/v1/workspaces/{thread}/acquire"), None);
    let id3 = third["id"].as_str().unwrap().to_owned();
    assert_eq!(s.run(&id3, "ls -A /workspace | wc -l", false), (vec!["0".to_owned()], 0));
    let (status, body) = s.api("POST", "/v1/workspaces/%0A/acquire", None);
    assert_api_error(status, &body, 400, "control");
    let (status, doc) = s.api("GET", "/v1/openapi.json", None);
    assert_eq!(status, 200);
    assert!(doc["paths"]["/workspaces/{thread}/acquire"].is_object());
}

#[test]
fn kill_9_and_restart_loses_no_sandbox() {
    let dir = data_dir();
    let mut s = Server::start(dir.path(), &[]);
    let id = s.create();
    assert_eq!(s.run(&id, "echo before > /workspace/f; echo ok", false).1, 0);
    // A command running when the server dies.
    assert_eq!(s.run(&id, "for i in $(seq 100); do echo $i >> /tmp/ticks; sleep 0.1; done", true).1, 0);
    s.kill9();
    let s = Server::start(dir.path(), &[]);
    let (status, info) = s.api("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!((status, info["status"]["state"].as_str()), (200, Some("Running")), "{info}");
    let (lines, code) = s.run(&id, "cat /workspace/f; sleep 0.3; wc -l < /tmp/ticks", false);
    assert_eq!(code, 0);
    assert_eq!(lines[0], "before");
    let ticks: u32 = lines[1].trim().parse().unwrap();
    assert!(ticks >= 3, "the background command kept running across the restart: {ticks}");
    let (_, list) = s.api("GET", "/v1/sandboxes", None);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (_, metrics) = s.call("GET", "/metrics", None, &[]);
    let text = metrics.as_str().unwrap_or_default();
    assert!(text.contains("paddock_sandboxes") && text.contains("paddock_create_seconds"), "{text}");
}

#[test]
fn refuses_to_start_with_impossible_timeouts() {
    let dir = data_dir();
    let out = Command::new(common::EXE)
        .args([
            "--data-dir",
            dir.path().to_str().unwrap(),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--default-timeout",
            "30s",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let mut err = String::new();
    out.stderr.as_slice().read_to_string(&mut err).unwrap();
    assert!(err.contains("30s") && err.contains("86400s"), "the message names both values: {err}");
    let out = Command::new(common::EXE)
        .args(["--data-dir", dir.path().to_str().unwrap(), "serve", "--listen", "0.0.0.0:0", "--insecure-no-auth"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
}

#[test]
fn uploads_beyond_the_cap_are_refused_and_below_it_land() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &["--max-upload", "64KiB"]);
    let id = s.create();
    let upload = |size: usize| {
        let boundary = "paddockboundary42";
        let mut body = Vec::new();
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{{\"path\":\"/workspace/up.bin\",\"owner\":null,\"group\":null,\"mode\":644}}\r\n").as_bytes());
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"up.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
        body.extend(std::iter::repeat_n(b'x', size));
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let req = ureq::http::Request::builder()
            .method("POST")
            .uri(s.url(&format!("/v1/sandboxes/{id}/proxy/44772/files/upload")))
            .header("OPEN-SANDBOX-API-KEY", KEY)
            .header("content-type", format!("multipart/form-data; boundary={boundary}"))
            .body(body)
            .unwrap();
        // An agent of its own: the server may close a connection whose upload it refused, and
        // that connection must not be reused for the next request.
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let resp = agent.run(req).unwrap();
        let status = resp.status().as_u16();
        let text = resp.into_body().read_to_string().unwrap_or_default();
        (status, text)
    };
    let (status, text) = upload(1 << 20);
    assert_eq!(status, 413, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert!(body["code"].is_string() && body["message"].is_string(), "{text}");
    assert_eq!(s.run(&id, "test -e /workspace/up.bin && echo present || echo absent", false).0, ["absent"]);
    let (status, text) = upload(1000);
    assert_eq!(status, 200, "{text}");
    assert_eq!(s.run(&id, "stat -c %s /workspace/up.bin", false).0, ["1000"]);
}

#[test]
fn the_proxy_reaches_a_server_inside_the_sandbox() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &[]);
    let id = s.create();
    let (status, body) = s.api("GET", &format!("/v1/sandboxes/{id}/proxy/8000/index.html"), None);
    assert_api_error(status, &body, 502, "port 8000");
    let serve = "echo served-from-sandbox > /workspace/index.html; \
                 nohup python3 -m http.server 8000 --bind 127.0.0.1 -d /workspace >/dev/null 2>&1 & \
                 for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done; echo up";
    assert_eq!(s.run(&id, serve, false).0, ["up"]);
    let (status, body) = s.api("GET", &format!("/v1/sandboxes/{id}/proxy/8000/index.html"), None);
    assert_eq!((status, body.as_str()), (200, Some("served-from-sandbox\n")));
    // The sandbox's token works in direct mode too, and the platform's key never reaches it.
    let (_, ep) = s.api("GET", &format!("/v1/sandboxes/{id}/endpoints/8000"), None);
    let (name, token) = ep["headers"].as_object().unwrap().iter().next().unwrap();
    let (status, _) =
        s.call("GET", &format!("/v1/sandboxes/{id}/proxy/8000/"), None, &[(name.as_str(), token.as_str().unwrap())]);
    assert_eq!(status, 200);
}

/// Reads until the server closes the connection; returns what it sent and how long that took.
fn read_until_closed(conn: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server kept the connection open: {e} after {:?}", started.elapsed()),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), started.elapsed())
}

#[test]
fn slow_and_idle_connections_are_closed_and_cannot_starve_others() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &["--header-timeout", "2s", "--max-connections", "16"]);
    let connect = || TcpStream::connect(("127.0.0.1", s.port)).unwrap();

    // Half a request line, then nothing: closed once the header deadline passes.
    let mut slow = connect();
    slow.write_all(b"GET /hea").unwrap();
    let (_, waited) = read_until_closed(&mut slow);
    assert!(waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10), "closed after {waited:?}");

    // A keep-alive connection that sits idle after a request is closed the same way.
    let mut idle = connect();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let (answer, waited) = read_until_closed(&mut idle);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10), "closed after {waited:?}");

    // Twice as many silent connections as the cap: a normal request still gets through, once the
    // deadline has closed the ones ahead of it.
    let hogs: Vec<TcpStream> = (0..32)
        .map(|_| {
            let mut c = connect();
            c.write_all(b"POST /v1/sandboxes HTTP/1.1\r\n").unwrap();
            c
        })
        .collect();
    let started = Instant::now();
    let (status, _) = s.api("GET", "/v1/sandboxes", None);
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(15), "a normal request waited {:?}", started.elapsed());
    drop(hogs);
    assert_eq!(s.api("GET", "/v1/sandboxes", None).0, 200);
}

/// The hardening issue's reconnecting slowloris: twice the cap of connections from one peer,
/// each trickling its headers and reopened as soon as it is closed. At the cap, the connection
/// longest without a request in flight is closed for a new one, so a real request still gets
/// through in about a second (it took 22 s before, the header deadline's worth), and the peer
/// never holds more than its share.
#[test]
fn reconnecting_slow_clients_cannot_hold_the_server() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &["--header-timeout", "30s", "--max-connections", "32"]);
    let port = s.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reconnects = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let attacker = {
        let (stop, reconnects) = (stop.clone(), reconnects.clone());
        std::thread::spawn(move || {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let open = || {
                let c = TcpStream::connect_timeout(&addr, Duration::from_millis(100)).ok()?;
                c.set_write_timeout(Some(Duration::from_millis(100))).ok()?;
                Some(c)
            };
            let mut conns: Vec<Option<TcpStream>> = (0..64).map(|_| open()).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for c in conns.iter_mut() {
                    let alive = c.as_mut().is_some_and(|c| c.write_all(b"X").is_ok());
                    if !alive {
                        *c = open();
                        reconnects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let mut waits = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let (status, _) = s.api("GET", "/v1/sandboxes", None);
        assert_eq!(status, 200);
        waits.push(started.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    attacker.join().unwrap();
    eprintln!(
        "slowloris: requests waited {waits:?}; the attacker reopened {} connections",
        reconnects.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(waits.iter().all(|w| *w < Duration::from_secs(5)), "a request waited {waits:?} behind slow clients");
    assert!(reconnects.load(std::sync::atomic::Ordering::Relaxed) > 0, "the attacker's connections were never closed");
}

#[test]
fn a_body_that_stops_arriving_or_a_response_left_unread_frees_its_connection() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &["--header-timeout", "2s"]);
    let connect = || TcpStream::connect(("127.0.0.1", s.port)).unwrap();

    // Headers promise a body; ten bytes of it come, then nothing.
    let mut trickle = connect();
    trickle
        .write_all(format!("POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nOPEN-SANDBOX-API-KEY: {KEY}\r\ncontent-type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"image\":").as_bytes())
        .unwrap();
    let (_, waited) = read_until_closed(&mut trickle);
    assert!(waited >= Duration::from_millis(1500) && waited < Duration::from_secs(15), "closed after {waited:?}");

    // A client that asks for 32 MiB and reads none of it: the server gives up on the write
    // instead of holding the connection (and the file stream behind it) forever.
    let id = s.create();
    assert_eq!(s.run(&id, "head -c 32M /dev/zero > /workspace/big && echo made", false).0, ["made"]);
    let mut stuck = connect();
    stuck
        .write_all(format!("GET /v1/sandboxes/{id}/proxy/44772/files/download?path=/workspace/big HTTP/1.1\r\nHost: 127.0.0.1\r\nOPEN-SANDBOX-API-KEY: {KEY}\r\n\r\n").as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_secs(6));
    stuck.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match stuck.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
    assert!(total < 32 << 20, "the server kept writing to a client that read nothing ({total} bytes came)");
    // The server is fine, and so is the sandbox.
    assert_eq!(s.run(&id, "echo still", false).0, ["still"]);
}

/// Sends one request over a connection of its own, the body from a thread (the server may
/// answer and close before it has read it all), and returns the status and JSON body.
fn raw_request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> (u16, Value) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nContent-Length: {}\r\n", body.len());
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    conn.write_all(head.as_bytes()).unwrap();
    let mut writer = conn.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(&body);
    });
    let (answer, _) = read_until_closed(&mut conn);
    let _ = sender.join();
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::String(answer.clone())))
}

#[test]
fn json_routes_refuse_large_bodies_and_uploads_keep_their_limit() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &[]);
    let id = s.create();
    let json = [("OPEN-SANDBOX-API-KEY", KEY), ("Content-Type", "application/json")];
    // 10 MiB of JSON: refused with a {code, message} 413, on the lifecycle and the execd API.
    let big = format!(r#"{{"image":{{"uri":"host"}},"env":{{"A":"{}"}}}}"#, "x".repeat(10 << 20)).into_bytes();
    let (status, body) = raw_request(s.port, "POST", "/v1/sandboxes", &json, big);
    assert_api_error(status, &body, 413, "limit of JSON requests");
    assert_eq!(body["code"], "PAYLOAD_TOO_LARGE");
    let big = format!(r#"{{"command":"echo {}"}}"#, "x".repeat(10 << 20)).into_bytes();
    let (status, body) = raw_request(s.port, "POST", &format!("/v1/sandboxes/{id}/proxy/44772/command"), &json, big);
    assert_api_error(status, &body, 413, "limit of JSON requests");
    // Nothing was created, and the server is fine.
    assert_eq!(s.api("GET", "/v1/sandboxes", None).1["items"].as_array().unwrap().len(), 1);
    assert_eq!(s.run(&id, "echo fine", false).0, ["fine"]);
    // A create with 1 MiB of environment is still accepted.
    let env = json!({"image": {"uri": "host"}, "timeout": 600, "env": {"BIG": "y".repeat(1 << 20)}});
    let (status, created) = s.api("POST", "/v1/sandboxes", Some(&env));
    assert!(status != 413, "a 1 MiB environment must fit the JSON limit: {status} {created}");
    // Uploads still take more than the JSON limit (the default upload limit is 1 GiB).
    let boundary = "paddockboundary43";
    let mut upload = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{{\"path\":\"/workspace/big.bin\"}}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").into_bytes();
    upload.extend(std::iter::repeat_n(b'z', 5 << 20));
    upload.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let (status, body) = raw_request(
        s.port,
        "POST",
        &format!("/v1/sandboxes/{id}/proxy/44772/files/upload"),
        &[("OPEN-SANDBOX-API-KEY", KEY), ("Content-Type", &content_type)],
        upload,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.run(&id, "stat -c %s /workspace/big.bin", false).0, [(5 << 20).to_string()]);
}

#[test]
fn without_auth_only_local_json_requests_are_served() {
    let dir = data_dir();
    let s = Server::launch(dir.path(), &["--insecure-no-auth"], &[]);
    let port = s.port;
    let here = format!("127.0.0.1:{port}");
    let get = |headers: &[(&str, &str)]| raw_request(port, "GET", "/v1/sandboxes", headers, Vec::new());
    assert_eq!(get(&[]).0, 200, "a local client needs no key");
    for host in [here.as_str(), &format!("localhost:{port}"), &format!("[::1]:{port}")] {
        assert_eq!(get(&[("Host", host)]).0, 200, "Host {host}");
    }
    // DNS rebinding: a page's own name resolved to 127.0.0.1 still says that name in Host.
    for host in [format!("rebind.example:{port}"), format!("127.0.0.1:{}", port.wrapping_add(1)), "127.0.0.1".into()] {
        let (status, body) = get(&[("Host", &host)]);
        assert_api_error(status, &body, 403, "loopback address");
        assert_eq!(body["code"], "FORBIDDEN_HOST");
    }
    // A page of another origin, even one sent to the right Host.
    for origin in ["http://evil.example", "null", "https://127.0.0.1.evil.example"] {
        let (status, body) = get(&[("Host", &here), ("Origin", origin)]);
        assert_api_error(status, &body, 403, "other origins");
        assert_eq!(body["code"], "FORBIDDEN_ORIGIN");
    }
    assert_eq!(get(&[("Origin", "http://localhost:3000")]).0, 200, "a local origin is fine");
    // A form or a text/plain fetch (no CORS preflight) cannot send JSON to a JSON route.
    let create = br#"{"image":{"uri":"host"},"timeout":600}"#.to_vec();
    for content_type in [Some("text/plain"), Some("application/x-www-form-urlencoded"), None] {
        let headers: Vec<(&str, &str)> = content_type.map(|c| ("Content-Type", c)).into_iter().collect();
        let (status, body) = raw_request(port, "POST", "/v1/sandboxes", &headers, create.clone());
        assert_api_error(status, &body, 415, "application/json");
    }
    let (status, body) = raw_request(
        port,
        "POST",
        "/v1/sandboxes",
        &[("Host", &format!("rebind.example:{port}")), ("Content-Type", "application/json")],
        create.clone(),
    );
    assert_eq!(status, 403, "{body}");
    assert!(get(&[]).1["items"].as_array().unwrap().is_empty(), "a refused request created a sandbox");
    // The same request, sent properly, works; so do execd calls with JSON, and not without.
    let (status, created) =
        raw_request(port, "POST", "/v1/sandboxes", &[("Content-Type", "application/json; charset=utf-8")], create);
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap();
    let command = br#"{"command":"echo hi"}"#.to_vec();
    let path = format!("/v1/sandboxes/{id}/proxy/44772/command");
    let (status, body) = raw_request(port, "POST", &path, &[("Content-Type", "text/plain")], command.clone());
    assert_api_error(status, &body, 415, "application/json");
    let (status, _) = raw_request(port, "POST", &path, &[("Content-Type", "application/json")], command);
    assert_eq!(status, 200);
}

#[test]
fn the_descriptor_limit_is_raised_and_health_reports_exhaustion() {
    common::require_root();
    let dir = data_dir();
    let port = free_port();
    // Started with a soft limit of 64 under a hard limit of 256, as a shell would leave it.
    let child = Command::new("sh")
        .args(["-c", r#"ulimit -Sn 64 && ulimit -Hn 256 && exec "$0" "$@""#, common::EXE])
        .args(["--data-dir", dir.path().to_str().unwrap(), "serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("PADDOCK_API_KEY", KEY)
        .env("PADDOCK_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let s = Server { child, port, agent, key: KEY.to_owned() };
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.agent.get(&s.url("/health")).call().is_err() {
        assert!(Instant::now() < deadline, "the server did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", s.child.id())).unwrap();
    let nofile = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    assert_eq!(nofile.split_whitespace().collect::<Vec<_>>()[3..5], ["256", "256"], "{nofile}");

    let (status, health) = s.call("GET", "/health", None, &[]);
    assert_eq!((status, health["status"].as_str()), (200, Some("healthy")), "{health}");
    assert_eq!((health["descriptors"]["limit"].as_u64(), health["database"]["ok"].as_bool()), (Some(256), Some(true)));
    // Idle connections until the server holds over 90% of its descriptors, leaving room for
    // the health request itself.
    let open = health["descriptors"]["open"].as_u64().unwrap();
    let hogs: Vec<TcpStream> = (open..234).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let health = loop {
        let (status, health) = s.call("GET", "/health", None, &[]);
        if status == 503 {
            break health;
        }
        assert!(Instant::now() < deadline, "/health stayed healthy with {} idle connections: {health}", hogs.len());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(health["status"], "unhealthy");
    let problem = health["problems"][0].as_str().unwrap_or_default();
    assert!(problem.contains("of its 256 file descriptors"), "{health}");
    // Once the connections close, it recovers.
    drop(hogs);
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.call("GET", "/health", None, &[]).0 != 200 {
        assert!(Instant::now() < deadline, "/health did not recover");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.api("GET", "/v1/sandboxes", None).0, 200);
}

/// A refusal sent before the body is read still leaves the connection usable: the server reads
/// the rest of a small body first, so a client that keeps connections alive and already sent
/// its next request on it gets that answered too (the SDK's httpx saw "Server disconnected"
/// when the server hung up on an unread body).
#[test]
fn a_request_refused_before_its_body_was_read_leaves_its_connection_usable() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &[]);
    let body = br#"{"image": {"uri": "host"}}"#;
    let mut conn = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let head = format!(
        "POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        s.port,
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    // The next request, sent before the first is answered, as a pooled client may.
    conn.write_all(
        format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n", s.port).as_bytes(),
    )
    .unwrap();
    let (answer, _) = read_until_closed(&mut conn);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("MISSING_API_KEY"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 1, "the second request went unanswered: {answer}");
}

#[test]
fn request_bodies_take_room_as_they_arrive_and_no_client_takes_it_all() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &["--max-request-memory", "160MiB", "--header-timeout", "60s"]);
    let id = s.create();
    // Requests that each promise a 2 MiB body and send `sent` bytes of it, then wait.
    let hold = |n: usize, sent: usize| -> Vec<TcpStream> {
        (0..n)
            .map(|_| {
                let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
                c.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
                let mut req = format!("POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nOPEN-SANDBOX-API-KEY: {KEY}\r\ncontent-type: application/json\r\nContent-Length: {}\r\n\r\n{{\"x\":\"", 2 << 20).into_bytes();
                req.extend(std::iter::repeat_n(b'a', sent));
                // A server that stops reading (its share full) leaves the rest unsent.
                let _ = c.write_all(&req);
                c
            })
            .collect()
    };
    let create = || {
        raw_request(
            s.port,
            "POST",
            "/v1/sandboxes",
            &[("OPEN-SANDBOX-API-KEY", KEY), ("content-type", "application/json")],
            br#"{"image":{"uri":"host"},"entrypoint":["true"]}"#.to_vec(),
        )
    };
    // Eighty that promise 160 MiB in all and send a few bytes hold a 64 KiB step each, not
    // what they promise: the same key's next create is served at once.
    let trickling = hold(80, 1);
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let (status, body) = create();
    assert_eq!(status, 202, "{body}");
    assert!(started.elapsed() < Duration::from_secs(5), "it waited for room: {:?}", started.elapsed());
    // Bodies that do send a MiB each fill the key's share (an eighth of the budget, 20 MiB):
    // its next body waits, then is turned away with the reason and a Retry-After ...
    let full = hold(24, 1 << 20);
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    let (status, body) = create();
    assert_api_error(status, &body, 503, "its share of --max-request-memory");
    assert!(started.elapsed() >= Duration::from_secs(5), "it waited for room first: {:?}", started.elapsed());
    // ... while another client, the sandbox's own token, is served, as are bodiless calls.
    let (_, endpoint) =
        s.call("GET", &format!("/v1/sandboxes/{id}/endpoints/44772"), None, &[("OPEN-SANDBOX-API-KEY", KEY)]);
    let token = endpoint["headers"]["x-paddock-sandbox-token"].as_str().unwrap().to_owned();
    let (status, body) = raw_request(
        s.port,
        "POST",
        &format!("/v1/sandboxes/{id}/proxy/44772/command"),
        &[("x-paddock-sandbox-token", &token), ("content-type", "application/json")],
        br#"{"command": "echo other"}"#.to_vec(),
    );
    assert_eq!(status, 200, "another client waited for the first one's room: {body}");
    assert_eq!(s.call("GET", "/health", None, &[]).0, 200);
    assert_eq!(s.call("GET", &format!("/v1/sandboxes/{id}"), None, &[("OPEN-SANDBOX-API-KEY", KEY)]).0, 200);
    // Once the held requests go, their room comes back.
    drop((trickling, full));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.run(&id, "echo room", false).0, ["room"]);
    let (status, _) = raw_request(
        s.port,
        "PATCH",
        &format!("/v1/sandboxes/{id}/metadata"),
        &[("OPEN-SANDBOX-API-KEY", KEY), ("content-type", "application/json")],
        br#"{"k":"v"}"#.to_vec(),
    );
    assert_eq!(status, 200);
}

#[test]
fn a_sandbox_that_stops_its_own_file_workers_costs_a_timeout_not_a_hung_request() {
    let dir = data_dir();
    let s = Server::start(dir.path(), &["--call-timeout", "2s"]);
    let (hung, fine) = (s.create(), s.create());
    assert_eq!(s.run(&hung, "id -u", false).0, ["1000"], "the sandbox is the unprivileged user");
    // A directory slow enough to list that its file worker is still there to be stopped.
    let make = "mkdir /tmp/many && cd /tmp/many && python3 -c 'import os\nfor i in range(60000): os.close(os.open(str(i), os.O_CREAT))' && echo made";
    assert_eq!(s.run(&hung, make, false).0, ["made"]);
    // The sandbox stops every file worker it sees (each one is a fork of its init, which a
    // signal from inside cannot stop).
    // (`[_]_` so the pattern does not match the loop's own shell; a supervisor forked by the
    // launcher, and so its init, reads as the launcher.)
    s.run(&hung, "while true; do pkill -STOP -f '[_]_(supervise|launcher)'; done >/dev/null 2>&1", true);
    std::thread::sleep(Duration::from_millis(300));
    let list = |id: &str| {
        s.call(
            "GET",
            &format!("/v1/sandboxes/{id}/proxy/44772/directories/list?path=/tmp"),
            None,
            &[("OPEN-SANDBOX-API-KEY", KEY)],
        )
    };
    let info = |id: &str| {
        s.call(
            "GET",
            &format!("/v1/sandboxes/{id}/proxy/44772/files/info?path=/workspace"),
            None,
            &[("OPEN-SANDBOX-API-KEY", KEY)],
        )
    };
    let started = Instant::now();
    let (status, body) = s.call(
        "GET",
        &format!("/v1/sandboxes/{hung}/proxy/44772/directories/list?path=/tmp/many"),
        None,
        &[("OPEN-SANDBOX-API-KEY", KEY)],
    );
    assert_api_error(status, &body, 504, "");
    assert_eq!(body["code"], "TIMEOUT", "{body}");
    assert!(started.elapsed() < Duration::from_secs(15), "the 2 s deadline was not applied: {:?}", started.elapsed());
    // Another sandbox, and the server, are untouched; the hung one can still be destroyed.
    let (status, body) = info(&fine);
    assert_eq!(status, 200, "{body}");
    assert_eq!(list(&fine).0, 200);
    assert_eq!(s.call("GET", "/health", None, &[]).0, 200);
    let (status, _) = s.call("DELETE", &format!("/v1/sandboxes/{hung}"), None, &[("OPEN-SANDBOX-API-KEY", KEY)]);
    assert_eq!(status, 204);
}

#[test]
fn running_commands_are_bounded_per_sandbox_and_ended_ones_give_back_their_descriptors() {
    use paddock_server::execd::MAX_RUNNING_PER_SANDBOX;
    let dir = data_dir();
    let s = Server::start(dir.path(), &[]);
    let (greedy, other) = (s.create(), s.create());
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", s.child.id())).unwrap().count();
    let before = fds();
    // Commands that end at once but leave a process holding their output: the server stops
    // reading them when they end, so their pipes do not pile up.
    for _ in 0..20 {
        s.run(&greedy, "sleep 30 & echo started", true);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while fds() > before + 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(fds() <= before + 8, "pipes of ended commands are still open: {} > {before}", fds());
    // Commands that keep running are bounded per sandbox (its entrypoint is one of them)...
    let start = |id: &str| {
        s.call(
            "POST",
            &format!("/v1/sandboxes/{id}/proxy/44772/command"),
            Some(&json!({"command": "exec sleep 60", "background": true})),
            &[("OPEN-SANDBOX-API-KEY", KEY)],
        )
    };
    let mut started = 0;
    let refused = loop {
        let (status, body) = start(&greedy);
        if status != 200 {
            break (status, body);
        }
        started += 1;
        assert!(started < MAX_RUNNING_PER_SANDBOX, "no bound on running commands");
    };
    assert_eq!(started, MAX_RUNNING_PER_SANDBOX - 1);
    assert_api_error(refused.0, &refused.1, 429, "DELETE /command");
    assert_eq!(refused.1["code"], "TOO_MANY_COMMANDS");
    // ... and another sandbox, and the server, are not affected.
    assert_eq!(s.run(&other, "echo fine", false).0, ["fine"]);
    assert_eq!(s.call("GET", "/health", None, &[]).0, 200);
}

/// The parent pid of process `pid`, from `/proc/PID/stat`.
fn ppid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit_once(')').unwrap().1.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn supervisor_pid(data: &std::path::Path, id: &str) -> u32 {
    let record: Value =
        serde_json::from_slice(&std::fs::read(data.join("sandboxes").join(id).join("record.json")).unwrap()).unwrap();
    u32::try_from(record["supervisor_pid"].as_u64().unwrap()).unwrap()
}

#[test]
fn supervisors_are_forked_by_a_clean_launcher_and_execd_once_it_is_gone() {
    let dir = data_dir();
    let secret = "PADDOCK_TEST_SERVER_SECRET=never-in-a-sandbox";
    let s = Server::launch(dir.path(), &["--api-key", KEY], &[secret.split_once('=').unwrap()]);
    let server = s.child.id();
    // The launcher: the server's child, exec'd with an empty environment.
    let launcher = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == b"__launcher"))
                && ppid(pid) == server
        })
        .expect("the server started no supervisor launcher");
    assert_eq!(std::fs::read(format!("/proc/{launcher}/environ")).unwrap(), b"", "the launcher got an environment");

    // A supervisor forked by it: the launcher's child, with nothing of the server's.
    let forked = s.create();
    let supervisor = supervisor_pid(dir.path(), &forked);
    assert_eq!(ppid(supervisor), launcher, "the supervisor was not forked by the launcher");
    let environ = std::fs::read(format!("/proc/{supervisor}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains("PADDOCK_TEST_SERVER_SECRET"),
        "the server's environment reached a supervisor"
    );
    let comm = std::fs::read_to_string(format!("/proc/{supervisor}/comm")).unwrap();
    assert!(forked.starts_with(comm.trim()), "a forked supervisor is named for its sandbox: {comm:?}");
    assert_eq!(
        s.run(&forked, "id -u; echo \"[$PADDOCK_TEST_SERVER_SECRET]\"", false),
        (vec!["1000".into(), "[]".into()], 0)
    );

    // Without it, supervisors are exec'd (children of the server), and the forked one lives on.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(launcher.cast_signed()).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let execd = s.create();
    assert_eq!(ppid(supervisor_pid(dir.path(), &execd)), server);
    assert_eq!(s.run(&execd, "echo exec", false), (vec!["exec".into()], 0));
    assert_eq!(s.run(&forked, "echo still", false), (vec!["still".into()], 0));
    for id in [&forked, &execd] {
        assert_eq!(s.api("DELETE", &format!("/v1/sandboxes/{id}"), None).0, 204);
    }
}

/// SIGTERM drains the server: `/health` says so and new sandboxes get a 503 with the reason
/// (the listener stays open, so clients hear why), a command already running finishes and its
/// stream ends whole, and the server exits as soon as that is done, well within
/// `--drain-timeout`. Its sandboxes keep running for the next server.
#[test]
fn a_sigtermed_server_refuses_new_sandboxes_lets_running_commands_finish_and_exits() {
    let dir = data_dir();
    let mut s = Server::start(dir.path(), &["--drain-timeout", "30s"]);
    let id = s.create();
    // New connections for each request after the signal: a kept-alive one is closed by the drain.
    let fresh = || -> ureq::Agent { ureq::Agent::config_builder().http_status_as_error(false).build().into() };
    let (lines, code, signalled) = std::thread::scope(|scope| {
        let command = scope.spawn(|| s.run(&id, "touch /workspace/started; sleep 4; echo finished", false));
        // The signal goes once the command runs (its marker exists), not after a guess that
        // a busy machine can outlast: a drain with nothing running ends at once.
        let until = Instant::now() + Duration::from_secs(30);
        while s.api("GET", &format!("/v1/sandboxes/{id}/proxy/44772/files/info?path=/workspace/started"), None).0 != 200
        {
            assert!(Instant::now() < until, "the command never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        // A client that connected just before the signal and sends its request after it is
        // answered, not dropped: hyper closes a connection with no request yet at a graceful
        // shutdown, which the drain holds off for a moment.
        let mut early = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        let pid = rustix::process::Pid::from_raw(s.child.id().cast_signed()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let signalled = Instant::now();
        let until = signalled + Duration::from_secs(10);
        loop {
            let resp = fresh().get(s.url("/health")).call().expect("the draining server still answers");
            if resp.status().as_u16() == 503 {
                let body: Value = serde_json::from_str(&resp.into_body().read_to_string().unwrap()).unwrap();
                assert_eq!(body["status"], "draining", "{body}");
                break;
            }
            assert!(Instant::now() < until, "/health never said draining");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::io::Write::write_all(&mut early, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        early.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut early, &mut answer);
        assert!(answer.starts_with("HTTP/1.1 503"), "the connection made before the signal got: {answer:?}");
        let resp = fresh()
            .post(s.url("/v1/sandboxes"))
            .header("OPEN-SANDBOX-API-KEY", KEY)
            .header("content-type", "application/json")
            .send(json!({"image": {"uri": "host"}, "timeout": 600}).to_string())
            .expect("a create while draining is answered");
        let status = resp.status().as_u16();
        let body: Value = serde_json::from_str(&resp.into_body().read_to_string().unwrap()).unwrap();
        assert_api_error(status, &body, 503, "shutting down");
        let (lines, code) = command.join().unwrap();
        (lines, code, signalled)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let exited = loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit within its drain timeout");
        std::thread::sleep(Duration::from_millis(20));
    };
    let exited_after = signalled.elapsed();
    assert!(exited.success(), "the drained server exited with {exited}");
    assert_eq!((lines, code), (vec!["finished".to_owned()], 0), "the running command finished, its stream whole");
    assert!(
        exited_after < Duration::from_secs(15),
        "it exited {exited_after:?} after the signal, not once its work was done"
    );
    // The sandbox outlived its server; the next one sees it (and removes it on drop).
    let next = Server::start(dir.path(), &[]);
    let (status, _) = next.api("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(status, 200, "the sandbox did not outlive the drained server");
}
