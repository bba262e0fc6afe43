//! Runs and the gateway against `FakeRuntime` (no isolation: its commands are host processes;
//! see `fake/mod.rs`), so admission, preemption, epochs, leases and every refusal of the
//! gateway are tested without root. Each driver here is a shell script that hands the test its
//! token through a file and waits to be told how to exit, so the test plays the driver's
//! gateway calls itself, including the ones a stale or foreign attempt would make. The
//! privileged suite (`crates/paddock/tests/runs.rs`) runs real drivers in real sandboxes.

#![expect(clippy::disallowed_methods, reason = "a test's fixtures may block: each test has a runtime of its own")]

mod fake;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use fake::server::{Server, assert_error};
use serde_json::{Value, json};

/// Writes `$D/token.<epoch>` and exits with what the test writes to `$D/exit.<epoch>`.
const DRIVER: &str = r#"printf %s "$PADDOCK_TOKEN" > "$D/token.$PADDOCK_EPOCH.part" && mv "$D/token.$PADDOCK_EPOCH.part" "$D/token.$PADDOCK_EPOCH"
while [ ! -e "$D/exit.$PADDOCK_EPOCH" ]; do sleep 0.02; done
exit "$(cat "$D/exit.$PADDOCK_EPOCH")""#;

/// A directory the drivers share with the test. Not under /tmp, which the fake maps to each
/// sandbox's own.
fn shared_dir() -> tempfile::TempDir {
    // Never below /tmp: the fake runtime maps a /tmp/… path in a command's environment into
    // the sandbox's own /tmp, so a checkout under /tmp (a CI clone) would send the driver's
    // files elsewhere and every driver would seem never to start.
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let base = if base.starts_with("/tmp") { Path::new("/var/tmp") } else { base };
    tempfile::tempdir_in(base).unwrap()
}

fn run_body(dir: &Path, tier: &str) -> Value {
    json!({"tier": tier, "image": "fake", "command": ["sh", "-c", DRIVER], "env": {"D": dir.display().to_string()}})
}

async fn submit(s: &Server, body: Value) -> String {
    let (status, run) = s.call("POST", "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    run["id"].as_str().unwrap().to_owned()
}

async fn run_of(s: &Server, id: &str) -> Value {
    let (status, run) = s.call("GET", &format!("/v1/runs/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    run
}

/// Waits until the run is in `state` (and, when given, at `epoch`).
async fn wait_state(s: &Server, id: &str, state: &str, epoch: Option<i64>) -> Value {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let run = run_of(s, id).await;
        if run["state"] == state && epoch.is_none_or(|e| run["epoch"] == e) {
            return run;
        }
        assert!(Instant::now() < until, "run never became {state} (epoch {epoch:?}): {run}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The token the driver of `epoch` wrote.
async fn token(dir: &Path, epoch: i64) -> String {
    let path = dir.join(format!("token.{epoch}"));
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(t) = std::fs::read_to_string(&path) {
            return t;
        }
        assert!(Instant::now() < until, "the driver of epoch {epoch} never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn exit_with(dir: &Path, epoch: i64, code: i32) {
    std::fs::write(dir.join(format!("exit.{epoch}")), code.to_string()).unwrap();
}

/// One gateway call over a fresh connection, as a driver's `curl` makes it; `from` is the
/// forwarder's line a local sandbox's connection starts with.
/// What a sandbox's forwarder sends after the preamble: its id and the forwarders' secret.
fn forwarder(s: &Server, sandbox: &str) -> String {
    format!("{sandbox} {}", s.state.token_key.gateway_secret())
}

async fn gateway(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    from: Option<&str>,
) -> (u16, Vec<u8>) {
    let (method, path, token, body) = (method.to_owned(), path.to_owned(), token.to_owned(), body.to_vec());
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let from = from.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        let mut req = Vec::new();
        if let Some(f) = from {
            req.extend_from_slice(format!("{} {f}\r\n", paddock_core::spec::GATEWAY_PREAMBLE).as_bytes());
        }
        req.extend_from_slice(
            format!(
                "{method} {path} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n",
                body.len()
            )
            .as_bytes(),
        );
        for (k, v) in headers {
            req.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(&body);
        // A connection the gateway closes (a forged forwarder line) answers status 0.
        let _ = tcp.write_all(&req);
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut out = Vec::new();
        let _ = tcp.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out);
        let status: u16 = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let at = out.windows(4).position(|w| w == b"\r\n\r\n").map_or(out.len(), |p| p + 4);
        let mut body = out[at..].to_vec();
        if text.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            body = unchunk(&body);
        }
        (status, body)
    })
    .await
    .unwrap()
}

fn unchunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = b.windows(2).position(|w| w == b"\r\n") else { return out };
        let n = usize::from_str_radix(std::str::from_utf8(&b[..line_end]).unwrap().trim(), 16).unwrap_or(0);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[line_end + 2..line_end + 2 + n]);
        b = &b[line_end + 2 + n + 2..];
    }
}

fn code_of(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body).map(|v| v["code"].as_str().unwrap_or_default().to_owned()).unwrap_or_default()
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, body) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        let name = path.as_bytes();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        b.append(&h, *body).unwrap();
    }
    b.into_inner().unwrap()
}

fn sha256_header(body: &[u8]) -> String {
    use base64::Engine;
    use sha2::Digest;
    format!("sha-256=:{}:", base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(body)))
}

#[tokio::test]
async fn bad_run_requests_are_refused_with_the_reason() {
    let s = Server::new().await;
    let ok = || json!({"image": "fake", "command": ["true"]});
    let with = |k: &str, v: Value| {
        let mut b = ok();
        b[k] = v;
        b
    };
    let hostile = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(tar_of(&[("/etc/marker", b"x")]))
    };
    for (body, says) in [
        (with("tier", json!("urgent")), "not one of this server's"),
        (with("command", json!([])), "command"),
        (with("timeout", json!(0)), "timeout"),
        (with("timeout", json!(28_801)), "28800"),
        (with("maxAttempts", json!(0)), "maxAttempts"),
        (with("maxAttempts", json!(21)), "maxAttempts"),
        (with("env", json!({"PADDOCK_TOKEN": "x"})), "PADDOCK_TOKEN"),
        (with("env", json!({"1BAD": "x"})), "variable name"),
        (with("resources", json!({"memory": "lots"})), "memory"),
        (with("thread", json!("")), "thread"),
        (with("inputs", json!("!!!")), "base64"),
        (with("inputs", json!(hostile)), "unsafe path"),
        (with("colour", json!("blue")), "unknown field"),
    ] {
        let (status, err) = s.call("POST", "/v1/runs", Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {err}");
        assert!(err["message"].as_str().unwrap().contains(says), "{body}: {err} should say {says:?}");
        assert!(err["code"].is_string(), "{err}");
    }
    let (status, err) = s.call("GET", "/v1/runs/run-nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&err, "NOT_FOUND");
    let (status, err) = s.call("GET", "/v1/runs?state=sleeping", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    // Nothing was queued by any of them.
    let (_, page) = s.call("GET", "/v1/runs", None).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 0, "{page}");
}

#[tokio::test]
async fn a_run_larger_than_its_tiers_memory_budget_is_refused_not_queued_forever() {
    use paddock_server::runs::tiers::{Capacity, Tier, Tiers};
    let s = Server::with_config(|c| {
        c.runs.tiers = Tiers {
            tiers: vec![
                Tier { name: "interactive".into(), concurrency: 2, memory: None },
                Tier { name: "batch".into(), concurrency: 2, memory: Some(1 << 30) },
            ],
            capacity: Capacity { runs: 4, memory: Some(4 << 30) },
        };
    })
    .await;
    let body = |tier: &str, memory: &str| json!({"image": "fake", "command": ["true"], "tier": tier, "resources": {"memory": memory}});
    for (tier, memory, whose) in [("batch", "2Gi", "tier \"batch\""), ("interactive", "8Gi", "capacity")] {
        let (status, err) = s.call("POST", "/v1/runs", Some(body(tier, memory))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
        let says = err["message"].as_str().unwrap();
        assert!(says.contains("memory budget") && says.contains(whose), "{err}");
    }
    let (status, made) = s.call("POST", "/v1/runs", Some(body("batch", "256Mi"))).await;
    assert_eq!(status, StatusCode::CREATED, "one that fits is queued: {made}");
}

#[tokio::test]
async fn a_driver_calls_home_and_its_exit_status_is_the_outcome() {
    let s = Server::new().await;
    let dir = shared_dir();
    let inputs = tar_of(&[("task.json", br#"{"n": 1}"#)]);
    let mut body = run_body(dir.path(), "interactive");
    use base64::Engine;
    body["inputs"] = json!(base64::engine::general_purpose::STANDARD.encode(&inputs));
    let id = submit(&s, body).await;
    let t = token(dir.path(), 1).await;
    let run = run_of(&s, &id).await;
    assert_eq!(
        (run["state"].as_str(), run["epoch"].as_i64(), run["attempt"].as_i64()),
        (Some("starting"), Some(1), Some(1)),
        "{run}"
    );

    let (status, hb) = gateway(s.gateway, "POST", "/v1/heartbeat", &t, &[], b"", None).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&hb));
    let hb: Value = serde_json::from_slice(&hb).unwrap();
    assert!(hb["leaseExpiresAt"].as_str().is_some_and(|l| l.ends_with('Z')), "{hb}");
    assert_eq!(run_of(&s, &id).await["state"], "running");

    let (status, got) = gateway(s.gateway, "GET", "/v1/inputs", &t, &[], b"", None).await;
    assert_eq!((status, got == inputs), (200, true), "the driver gets the inputs as given");
    let ev = br#"{"type": "progress", "data": {"pct": 40}}"#;
    let (status, _) =
        gateway(s.gateway, "POST", "/v1/events", &t, &[("content-type", "application/json")], ev, None).await;
    assert_eq!(status, 201);

    let result = tar_of(&[("out/report.txt", b"all good")]);
    let (status, body) =
        gateway(s.gateway, "PUT", "/v1/result", &t, &[("content-digest", "sha-256=:AAAA:")], &result, None).await;
    assert_eq!((status, code_of(&body).as_str()), (400, "INVALID_ARGUMENT"), "a digest that does not match is refused");
    let hostile = {
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_entry_type(tar::EntryType::Regular);
        h.as_old_mut().name[..12].copy_from_slice(b"../../marker");
        h.set_cksum();
        let mut b = tar::Builder::new(Vec::new());
        b.append(&h, &b"x"[..]).unwrap();
        b.into_inner().unwrap()
    };
    let (status, body) = gateway(s.gateway, "PUT", "/v1/result", &t, &[], &hostile, None).await;
    assert_eq!((status, code_of(&body).as_str()), (400, "INVALID_ARCHIVE"), "{}", String::from_utf8_lossy(&body));
    let (status, body) =
        gateway(s.gateway, "PUT", "/v1/result", &t, &[("content-digest", &sha256_header(&result))], &result, None)
            .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));

    exit_with(dir.path(), 1, 0);
    let run = wait_state(&s, &id, "succeeded", Some(1)).await;
    assert_eq!((run["exitCode"].as_i64(), run["hasResult"].as_bool()), (Some(0), Some(true)), "{run}");
    let (status, kept) = s.request("GET", &format!("/v1/runs/{id}/result"), &[], Vec::new()).await;
    assert_eq!((status, kept == result), (StatusCode::OK, true), "the result is what the driver uploaded");

    // A finished run takes no more writes, and the sandbox was given back.
    let (status, body) = gateway(s.gateway, "POST", "/v1/heartbeat", &t, &[], b"", None).await;
    assert_eq!((status, code_of(&body).as_str()), (409, "STALE_ATTEMPT"));
    let sandbox = run["sandboxId"].as_str().unwrap();
    let (status, _) = s.call("GET", &format!("/v1/sandboxes/{sandbox}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the run's sandbox is destroyed when it ends");

    // The events, in order, and again from where a client left off.
    let (status, all) = s.request("GET", &format!("/v1/runs/{id}/events"), &[], Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    let all = String::from_utf8(all).unwrap();
    let kinds: Vec<&str> = all.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(kinds, ["state", "state", "attempt", "state", "driver", "result", "state"], "{all}");
    let (_, rest) = s.request("GET", &format!("/v1/runs/{id}/events"), &[("last-event-id", "5")], Vec::new()).await;
    let rest = String::from_utf8(rest).unwrap();
    let ids: Vec<&str> = rest.lines().filter_map(|l| l.strip_prefix("id: ")).collect();
    assert_eq!(ids, ["6", "7"], "resumed after Last-Event-ID: {rest}");
}

#[tokio::test]
async fn wrong_and_foreign_tokens_change_nothing() {
    let s = Server::new().await;
    let dir = shared_dir();
    let id = submit(&s, run_body(dir.path(), "batch")).await;
    let t = token(dir.path(), 1).await;
    let run = run_of(&s, &id).await;
    let sandbox = run["sandboxId"].as_str().unwrap().to_owned();
    let (status, body) = gateway(s.gateway, "POST", "/v1/heartbeat", "", &[], b"", None).await;
    assert_eq!((status, code_of(&body).as_str()), (401, "MISSING_TOKEN"));
    let (status, body) = gateway(s.gateway, "POST", "/v1/heartbeat", "not-a-token", &[], b"", None).await;
    assert_eq!((status, code_of(&body).as_str()), (401, "INVALID_TOKEN"));
    let forged = t.replacen(&format!(".1.{sandbox}."), &format!(".2.{sandbox}."), 1);
    assert_ne!(forged, t);
    let (status, body) = gateway(s.gateway, "POST", "/v1/heartbeat", &forged, &[], b"", None).await;
    assert_eq!((status, code_of(&body).as_str()), (401, "INVALID_TOKEN"), "an edited epoch breaks the signature");
    // Through the forwarder of another sandbox, this token is not that sandbox's.
    let other = forwarder(&s, "sbx-0123456789ab");
    let (status, body) = gateway(s.gateway, "POST", "/v1/heartbeat", &t, &[], b"", Some(&other)).await;
    assert_eq!((status, code_of(&body).as_str()), (403, "FOREIGN_TOKEN"));
    // A line without the forwarders' secret (any process on this host can reach the port) is
    // no forwarder's: the connection is closed, whatever sandbox it names.
    for line in [sandbox.clone(), format!("{sandbox} not-the-secret"), format!("{sandbox} {}", "0".repeat(64))] {
        let (status, body) = gateway(s.gateway, "POST", "/v1/heartbeat", &t, &[], b"", Some(&line)).await;
        assert_eq!(status, 0, "{line}: {}", String::from_utf8_lossy(&body));
    }
    assert_eq!(run_of(&s, &id).await["state"], "starting", "no refused call counted as the driver's");
    let own = forwarder(&s, &sandbox);
    let (status, _) = gateway(s.gateway, "POST", "/v1/heartbeat", &t, &[], b"", Some(&own)).await;
    assert_eq!(status, 200, "its own sandbox's forwarder passes it");
    let (status, body) = gateway(s.gateway, "GET", "/v1/nothing", &t, &[], b"", None).await;
    assert_eq!((status, code_of(&body).as_str()), (404, "NOT_FOUND"));
    exit_with(dir.path(), 1, 0);
    wait_state(&s, &id, "succeeded", None).await;
}

/// A heartbeat over a direct connection (no forwarder line) from the local address `from`, as
/// a Kubernetes Pod calls the gateway's address: answers the status and the error code.
async fn heartbeat_from(gateway: SocketAddr, from: std::net::IpAddr, token: &str) -> (u16, String) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut tcp = socket.connect(gateway).await.unwrap();
    let req = format!(
        "POST /v1/heartbeat HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Length: 0\r\n\r\n"
    );
    tokio::io::AsyncWriteExt::write_all(&mut tcp, req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut tcp, &mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").map_or(out.len(), |p| p + 4);
    let body = if text.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        unchunk(&out[at..])
    } else {
        out[at..].to_vec()
    };
    (status, if body.is_empty() { String::new() } else { code_of(&body) })
}

#[tokio::test]
async fn fake_runtime_a_token_is_refused_from_any_address_but_its_sandboxs() {
    // Sandboxes at 127.0.0.2 with no forwarder, as Pods that dial the gateway's address: a
    // token that leaked out of its sandbox must be worth nothing from anywhere else.
    let pod: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let s = Server::on(fake::FakeRuntime::new().with_addresses(vec![pod]), |_| {}).await;
    let caps = s.call("GET", "/v1/capabilities", None).await.1;
    assert_eq!(caps["gateway_names_sandbox"], false, "{caps}");
    let dir = shared_dir();
    let id = submit(&s, run_body(dir.path(), "batch")).await;
    let t = token(dir.path(), 1).await;
    let elsewhere: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    assert_eq!(heartbeat_from(s.gateway, elsewhere, &t).await, (403, "FOREIGN_TOKEN".to_owned()));
    assert_eq!(run_of(&s, &id).await["state"], "starting", "the refused call did not count as the driver's");
    assert_eq!(heartbeat_from(s.gateway, pod, &t).await, (200, String::new()), "its sandbox's address passes it");
    wait_state(&s, &id, "running", Some(1)).await;
    exit_with(dir.path(), 1, 0);
    wait_state(&s, &id, "succeeded", None).await;
}

#[tokio::test]
async fn a_requeued_attempt_gets_a_new_epoch_and_the_stale_one_writes_nothing() {
    let s = Server::new().await;
    let dir = shared_dir();
    let id = submit(&s, run_body(dir.path(), "batch")).await;
    let old = token(dir.path(), 1).await;
    let (status, _) = gateway(s.gateway, "POST", "/v1/heartbeat", &old, &[], b"", None).await;
    assert_eq!(status, 200);
    let first = tar_of(&[("r", b"from the first attempt")]);
    assert_eq!(gateway(s.gateway, "PUT", "/v1/result", &old, &[], &first, None).await.0, 201);
    // 75: the driver asks to run again.
    exit_with(dir.path(), 1, 75);
    let new = token(dir.path(), 2).await;
    let run = wait_state(&s, &id, "starting", Some(2)).await;
    assert_eq!((run["attempt"].as_i64(), run["hasResult"].as_bool()), (Some(2), Some(false)), "{run}");
    let (status, _) = s.request("GET", &format!("/v1/runs/{id}/result"), &[], Vec::new()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "an earlier attempt's result is not the run's");
    let result = tar_of(&[("r", b"from the current attempt")]);
    let (status, _) = gateway(s.gateway, "PUT", "/v1/result", &new, &[], &result, None).await;
    assert_eq!(status, 201);
    for (method, path, body) in [
        ("POST", "/v1/heartbeat", &b""[..]),
        ("GET", "/v1/inputs", &b""[..]),
        ("POST", "/v1/events", &br#"{"type": "late"}"#[..]),
        ("PUT", "/v1/result", &tar_of(&[("r", b"stale")])[..]),
    ] {
        let (status, out) =
            gateway(s.gateway, method, path, &old, &[("content-type", "application/json")], body, None).await;
        assert_eq!(
            (status, code_of(&out).as_str()),
            (409, "STALE_ATTEMPT"),
            "{method} {path}: {}",
            String::from_utf8_lossy(&out)
        );
        assert!(String::from_utf8_lossy(&out).contains("current epoch is 2"), "{}", String::from_utf8_lossy(&out));
    }
    let (_, kept) = s.request("GET", &format!("/v1/runs/{id}/result"), &[], Vec::new()).await;
    assert_eq!(kept, result, "the stale upload replaced nothing");
    exit_with(dir.path(), 2, 0);
    wait_state(&s, &id, "succeeded", Some(2)).await;
    // The stream of a run that ended ends after its last event.
    let (_, events) = s.request("GET", &format!("/v1/runs/{id}/events?after=0"), &[], Vec::new()).await;
    assert!(!String::from_utf8_lossy(&events).contains("late"), "the stale event was not recorded");
}

#[tokio::test]
async fn interactive_work_preempts_the_newest_batch_attempt_which_runs_again_later() {
    use paddock_server::runs::tiers::{Capacity, Tier, Tiers};
    let s = Server::with_config(|c| {
        c.runs.tiers = Tiers {
            tiers: vec![
                Tier { name: "interactive".into(), concurrency: 2, memory: None },
                Tier { name: "batch".into(), concurrency: 2, memory: None },
            ],
            capacity: Capacity { runs: 2, memory: None },
        };
    })
    .await;
    let (d1, d2, d3) = (shared_dir(), shared_dir(), shared_dir());
    let b1 = submit(&s, run_body(d1.path(), "batch")).await;
    token(d1.path(), 1).await;
    let b2 = submit(&s, run_body(d2.path(), "batch")).await;
    let b2_old = token(d2.path(), 1).await;
    let i1 = submit(&s, run_body(d3.path(), "interactive")).await;
    // The newest batch attempt makes room; the older one keeps running.
    let requeued = wait_state(&s, &b2, "requeued", Some(1)).await;
    assert!(requeued["reason"].as_str().unwrap().contains("preempted"), "{requeued}");
    token(d3.path(), 1).await;
    assert_eq!(run_of(&s, &i1).await["state"], "starting");
    assert_eq!(run_of(&s, &b1).await["state"], "starting", "only one attempt was preempted");
    let (status, _) = gateway(s.gateway, "POST", "/v1/heartbeat", &b2_old, &[], b"", None).await;
    assert_eq!(status, 409, "the preempted attempt is stale");
    // Batch never preempts: with the interactive run done, b2 runs again with a new epoch.
    exit_with(d3.path(), 1, 0);
    wait_state(&s, &i1, "succeeded", None).await;
    let b2_new = token(d2.path(), 2).await;
    assert_ne!(b2_new, b2_old);
    exit_with(d2.path(), 2, 0);
    exit_with(d1.path(), 1, 0);
    let run = wait_state(&s, &b2, "succeeded", Some(2)).await;
    assert_eq!(run["attempt"], 1, "a preemption is a new epoch but not one of the run's attempts: {run}");
    wait_state(&s, &b1, "succeeded", Some(1)).await;
}

#[tokio::test]
async fn a_threads_runs_take_turns_and_a_busy_thread_can_refuse() {
    let s = Server::new().await;
    let (d1, d2) = (shared_dir(), shared_dir());
    let mut first = run_body(d1.path(), "interactive");
    first["thread"] = json!("thread-a");
    let r1 = submit(&s, first).await;
    token(d1.path(), 1).await;
    let mut second = run_body(d2.path(), "interactive");
    second["thread"] = json!("thread-a");
    let r2 = submit(&s, second.clone()).await;
    second["ifBusy"] = json!("reject");
    let (status, err) = s.call("POST", "/v1/runs", Some(second)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_error(&err, "THREAD_BUSY");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(run_of(&s, &r2).await["state"], "queued", "the second turn waits for the first");
    // The first turn leaves a file in the thread's workspace; the second finds it.
    exit_with(d1.path(), 1, 0);
    wait_state(&s, &r1, "succeeded", None).await;
    token(d2.path(), 1).await;
    exit_with(d2.path(), 1, 0);
    wait_state(&s, &r2, "succeeded", None).await;
    let (_, page) = s.call("GET", "/v1/runs?thread=thread-a&state=succeeded&limit=1", None).await;
    assert_eq!(page["items"][0]["id"], r1.as_str(), "{page}");
    let next = page["next"].as_str().unwrap();
    let (_, page) = s.call("GET", &format!("/v1/runs?thread=thread-a&limit=1&after={next}"), None).await;
    assert_eq!((page["items"][0]["id"].as_str(), page["next"].as_str()), (Some(r2.as_str()), None), "{page}");
}

#[tokio::test]
async fn cancel_stops_the_attempt_and_gives_its_sandbox_back() {
    let s = Server::new().await;
    let dir = shared_dir();
    let id = submit(&s, run_body(dir.path(), "batch")).await;
    let t = token(dir.path(), 1).await;
    let sandbox = run_of(&s, &id).await["sandboxId"].as_str().unwrap().to_owned();
    let (status, run) = s.call("POST", &format!("/v1/runs/{id}/cancel"), None).await;
    assert_eq!((status, run["state"].as_str()), (StatusCode::OK, Some("cancelled")), "{run}");
    let until = Instant::now() + Duration::from_secs(10);
    while s.call("GET", &format!("/v1/sandboxes/{sandbox}"), None).await.0 != StatusCode::NOT_FOUND {
        assert!(Instant::now() < until, "the cancelled run's sandbox was never destroyed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _) = gateway(s.gateway, "POST", "/v1/heartbeat", &t, &[], b"", None).await;
    assert_eq!(status, 409);
    // Cancelling again changes nothing; the run stays cancelled.
    let (_, run) = s.call("POST", &format!("/v1/runs/{id}/cancel"), None).await;
    assert_eq!(run["state"], "cancelled");
}

#[tokio::test]
async fn the_same_idempotency_key_gives_the_same_run() {
    let s = Server::new().await;
    let dir = shared_dir();
    let body = serde_json::to_vec(&run_body(dir.path(), "batch")).unwrap();
    let headers = [("content-type", "application/json"), ("idempotency-key", "turn-42")];
    let (status, a) = s.request("POST", "/v1/runs", &headers, body.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, b) = s.request("POST", "/v1/runs", &headers, body).await;
    assert_eq!(status, StatusCode::OK);
    let (a, b): (Value, Value) = (serde_json::from_slice(&a).unwrap(), serde_json::from_slice(&b).unwrap());
    assert_eq!(a["id"], b["id"]);
    let (_, page) = s.call("GET", "/v1/runs", None).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    token(dir.path(), 1).await;
    exit_with(dir.path(), 1, 0);
}

#[tokio::test]
async fn missed_leases_and_start_deadlines_lose_the_attempt_until_none_is_left() {
    let s = Server::with_config(|c| {
        c.runs.lease = Duration::from_millis(500);
        c.runs.start_deadline = Duration::from_millis(700);
    })
    .await;
    let dir = shared_dir();
    let mut body = run_body(dir.path(), "batch");
    body["maxAttempts"] = json!(2);
    let id = submit(&s, body).await;
    let t = token(dir.path(), 1).await;
    let (status, _) = gateway(s.gateway, "POST", "/v1/heartbeat", &t, &[], b"", None).await;
    assert_eq!(status, 200);
    // No heartbeat after that one: the lease runs out and the attempt is lost.
    let run = wait_state(&s, &id, "requeued", Some(1)).await;
    assert!(run["reason"].as_str().unwrap().contains("lease"), "{run}");
    // The second attempt never calls home: its start deadline takes it, and it was the last.
    token(dir.path(), 2).await;
    let run = wait_state(&s, &id, "failed", Some(2)).await;
    assert!(run["reason"].as_str().unwrap().contains("start deadline"), "{run}");
    assert!(run["reason"].as_str().unwrap().contains("last attempt"), "{run}");
}

#[tokio::test]
async fn tiers_are_listed_with_what_they_hold() {
    let s = Server::new().await;
    let (status, t) = s.call("GET", "/v1/tiers", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(t["tiers"][0]["name"], "interactive", "{t}");
    assert_eq!(t["tiers"][1]["name"], "batch", "{t}");
    assert_eq!(t["capacity"]["runs"], 8, "{t}");
}

/// An OpenAI-compatible upstream that records what reaches it: path, Authorization, body.
async fn fake_model() -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>) {
    use axum::extract::Request;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |req: Request| {
        let record = record.clone();
        async move {
            let path = req.uri().path().to_owned();
            let auth = req.headers().get("authorization").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
            let body = axum::body::to_bytes(req.into_body(), 1 << 20).await.unwrap();
            record.lock().unwrap().push((path.clone(), auth, String::from_utf8_lossy(&body).into_owned()));
            let asked: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if path.ends_with("/chat/completions") && asked["stream"] == true {
                // As OpenAI streams: usage only when the request asked for it.
                let mut chunks = vec!["data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n".to_owned()];
                if asked["stream_options"]["include_usage"] == true {
                    chunks.push("data: {\"choices\":[],\"usage\":{\"total_tokens\":21}}\n\n".to_owned());
                }
                chunks.push("data: [DONE]\n\n".to_owned());
                let body = axum::body::Body::from_stream(tokio_stream::iter(
                    chunks.into_iter().map(|c| Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(c))),
                ));
                return axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap();
            }
            if path.ends_with("/stream") {
                let chunks = ["data: {\"n\":1}\n\n", "data: {\"n\":2}\n\n", "data: [DONE]\n\n"];
                let body = axum::body::Body::from_stream(tokio_stream::iter(
                    chunks.map(|c| Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(c))),
                ));
                return axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap();
            }
            axum::response::Response::builder()
                .header("content-type", "application/json")
                .body(axum::body::Body::from(json!({"path": path, "usage": {"total_tokens": 7}}).to_string()))
                .unwrap()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

#[tokio::test]
async fn the_model_route_adds_the_key_outside_and_reaches_only_its_upstream() {
    const KEY: &str = "sk-never-in-a-sandbox";
    let (upstream, seen) = fake_model().await;
    let s = Server::with_config(|c| {
        c.llm = Some(paddock_server::llm::LlmConfig {
            default: Some(paddock_server::llm::Upstream {
                base: paddock_server::llm::normalise_base(&format!("http://{upstream}/v1/")).unwrap(),
                key: Some(KEY.into()),
            }),
            tenants: Default::default(),
            env: vec!["OPENAI_BASE_URL".into()],
        });
    })
    .await;
    let dir = shared_dir();
    let script = format!("env > \"$D/env\"; {DRIVER}");
    let mut body = run_body(dir.path(), "batch");
    body["command"] = json!(["sh", "-c", script]);
    let id = submit(&s, body).await;
    let token = token(dir.path(), 1).await;
    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    let route = format!("http://{}/llm/v1", s.gateway);
    assert!(env.contains(&format!("PADDOCK_LLM_BASE={route}\n")), "{env}");
    assert!(env.contains(&format!("OPENAI_BASE_URL={route}\n")), "{env}");
    assert!(!env.contains(KEY), "the provider key reached the sandbox's environment");
    let sandbox = forwarder(&s, run_of(&s, &id).await["sandboxId"].as_str().unwrap());

    // From a sandbox (the forwarder's line), whatever credential it sends: the key goes upstream.
    let ask = br#"{"model": "m-1", "messages": []}"#;
    let (status, out) = gateway(
        s.gateway,
        "POST",
        "/llm/v1/chat/completions",
        "sk-made-up-by-the-sandbox",
        &[("content-type", "application/json"), ("x-api-key", "also-made-up")],
        ask,
        Some(&sandbox),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
    let answer: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(answer["path"], "/v1/chat/completions", "one /v1, whatever the base was written as");
    {
        let seen = seen.lock().unwrap();
        let (path, auth, body) = seen.last().unwrap();
        assert_eq!((path.as_str(), auth.as_str()), ("/v1/chat/completions", format!("Bearer {KEY}").as_str()));
        assert_eq!(body.as_bytes(), ask);
    }
    // A streamed answer comes through as it is streamed.
    let (status, out) = gateway(s.gateway, "POST", "/llm/v1/stream", "x", &[], b"{}", Some(&sandbox)).await;
    assert_eq!(status, 200);
    assert_eq!(String::from_utf8_lossy(&out), "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n");
    // A streamed completion that did not ask for usage: the route asks for it (so its tokens
    // count against the tenant), and takes the usage event out again on the way back.
    let pool = s.state.tenants.pool().clone();
    let before = paddock_server::tenants::model_tokens_used(&pool, "default").await.unwrap();
    let ask = br#"{"model": "m-1", "stream": true, "messages": []}"#;
    let (status, out) = gateway(s.gateway, "POST", "/llm/v1/chat/completions", "x", &[], ask, Some(&sandbox)).await;
    assert_eq!(status, 200);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n",
        "the client sees what it asked for"
    );
    let sent: Value = serde_json::from_str(&seen.lock().unwrap().last().unwrap().2).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let until = Instant::now() + Duration::from_secs(5);
    while paddock_server::tenants::model_tokens_used(&pool, "default").await.unwrap() < before + 21 {
        assert!(Instant::now() < until, "the streamed call's 21 tokens were not counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One that asked keeps its usage event.
    let ask = br#"{"stream": true, "stream_options": {"include_usage": true}}"#;
    let (_, out) = gateway(s.gateway, "POST", "/llm/v1/chat/completions", "x", &[], ask, Some(&sandbox)).await;
    assert!(String::from_utf8_lossy(&out).contains("\"total_tokens\":21"));
    // Without a forwarder's line, a run's token is the way in; nothing else is.
    let (status, _) = gateway(s.gateway, "GET", "/llm/v1/models", &token, &[], b"", None).await;
    assert_eq!(status, 200);
    let calls = seen.lock().unwrap().len();
    let (status, out) = gateway(s.gateway, "GET", "/llm/v1/models", "sk-anything", &[], b"", None).await;
    assert_eq!((status, code_of(&out).as_str()), (401, "NOT_A_SANDBOX"));
    // Nor does a process that names a sandbox without the forwarders' secret reach the model.
    let bare = run_of(&s, &id).await["sandboxId"].as_str().unwrap().to_owned();
    let (status, _) = gateway(s.gateway, "GET", "/llm/v1/models", "sk-anything", &[], b"", Some(&bare)).await;
    assert_eq!(status, 0);
    assert_eq!(seen.lock().unwrap().len(), calls, "a refused call never reached the upstream");
    exit_with(dir.path(), 1, 0);
    wait_state(&s, &id, "succeeded", None).await;
    // A run's token is signed for good, but calls the model only while its attempt runs.
    let (status, out) = gateway(s.gateway, "GET", "/llm/v1/models", &token, &[], b"", None).await;
    assert_eq!((status, code_of(&out).as_str()), (401, "STALE_ATTEMPT"), "{}", String::from_utf8_lossy(&out));
    assert_eq!(seen.lock().unwrap().len(), calls, "an ended run's token reached the upstream");
}

#[tokio::test]
async fn an_evaluation_queues_its_tasks_together_or_refuses_them_all() {
    let s = Server::new().await;
    let task = |name: &str, script: &str| json!({"name": name, "image": "fake", "command": ["sh", "-c", script]});
    let (status, err) = s
        .call(
            "POST",
            "/v1/evaluations",
            Some(json!({"tasks": [task("ok", "exit 0"), {"name": "broken", "image": "fake", "command": []}]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert!(err["message"].as_str().unwrap().contains("task 1 (broken)"), "{err}");
    let (_, page) = s.call("GET", "/v1/runs", None).await;
    assert!(page["items"].as_array().unwrap().is_empty(), "a refused evaluation queues nothing: {page}");
    let (status, ev) = s
        .call(
            "POST",
            "/v1/evaluations",
            Some(json!({"name": "smoke", "tier": "batch", "tasks": [task("pass", "exit 0"), task("fail", "exit 3")]})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ev}");
    assert_eq!(ev["tasks"], 2);
    let id = ev["id"].as_str().unwrap().to_owned();
    let until = Instant::now() + Duration::from_secs(20);
    let ev = loop {
        let (_, ev) = s.call("GET", &format!("/v1/evaluations/{id}"), None).await;
        if ev["done"] == true {
            break ev;
        }
        assert!(Instant::now() < until, "the evaluation never finished: {ev}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((ev["states"]["succeeded"].as_u64(), ev["states"]["failed"].as_u64()), (Some(1), Some(1)), "{ev}");
    assert_eq!(ev["runs"][1]["exitCode"], 3, "{ev}");
    let (status, _) = s.call("GET", "/v1/evaluations/eval-nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// One sandbox that opens many gateway connections and trickles their bodies holds only its
/// share (an eighth of `--gateway-max-connections`); other sandboxes' calls go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_one_sandbox_holds_only_its_share_of_the_gateway() {
    let s = Server::new().await;
    let (greedy, other) = (s.create().await, s.create().await);
    let share = paddock_server::runs::RunOptions::for_tests().gateway_max_connections / 8;
    let stalled = |sandbox: &str| {
        let mut c = std::net::TcpStream::connect(s.gateway).unwrap();
        let head = format!(
            "{} {}\r\nPOST /v1/events HTTP/1.1\r\nHost: gateway\r\nContent-Length: 100\r\n\r\n{{",
            paddock_core::spec::GATEWAY_PREAMBLE,
            forwarder(&s, sandbox)
        );
        c.write_all(head.as_bytes()).unwrap();
        c
    };
    let held: Vec<_> = (0..share).map(|_| stalled(&greedy)).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One more from the same sandbox is closed at once ...
    let mut extra = stalled(&greedy);
    extra.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    let closed_at = Instant::now();
    assert_eq!(extra.read(&mut buf).unwrap_or(0), 0, "the connection past the share was served");
    assert!(closed_at.elapsed() < Duration::from_secs(3));
    // ... while another sandbox is answered (401: its token is made up, but it was heard).
    let (status, _) = gateway(s.gateway, "GET", "/v1/run", "made-up", &[], b"", Some(&forwarder(&s, &other))).await;
    assert_eq!(status, 401);
    // Its share comes back when its connections close.
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = gateway(s.gateway, "GET", "/v1/run", "made-up", &[], b"", Some(&forwarder(&s, &greedy))).await;
    assert_eq!(status, 401);
}

/// How an attempt ended must reach the database even when the database refuses a write for a
/// while (another writer holds it past the busy timeout): the run does not stay `running` for
/// the rest of the server's life, it becomes `succeeded` once the database takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempts_end_is_recorded_once_the_database_takes_writes_again() {
    use sqlx::Connection;
    let s = Server::new().await;
    let dir = shared_dir();
    let id = submit(&s, run_body(dir.path(), "batch")).await;
    let t = token(dir.path(), 1).await;
    let (status, _) = gateway(s.gateway, "POST", "/v1/heartbeat", &t, &[], b"", None).await;
    assert_eq!(status, 200);
    wait_state(&s, &id, "running", Some(1)).await;

    // Another process's write transaction, held past the server's 5 s busy timeout.
    let url = format!("sqlite://{}", s.data_dir().join("server.db").display());
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE").execute(&mut other).await.unwrap();
    exit_with(dir.path(), 1, 0);
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(run_of(&s, &id).await["state"], "running", "the write could not have gone through");
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    drop(other);

    let run = wait_state(&s, &id, "succeeded", Some(1)).await;
    assert_eq!(run["exitCode"], 0, "{run}");
}

/// A tenant given its own model route while the server runs (`paddock tenant set acme
/// --llm-base URL --llm-key-file PATH` writes the database; here the same function does): a
/// server started without any --llm-base mounts the route anyway, new sandboxes of that tenant
/// get `$PADDOCK_LLM_BASE`, calls carry the key read from its file (replacing the file rotates
/// it), another tenant still has no route, and taking the route away ends it.
#[tokio::test]
async fn fake_runtime_a_tenants_own_model_route_is_set_while_serving_and_its_key_file_is_read_per_call() {
    use paddock_server::tenants::{self, ModelRoute, Quotas};
    let (upstream, seen) = fake_model().await;
    let s = Server::new().await;
    let pool = s.state.tenants.pool().clone();
    let acme = tenants::add(&pool, "acme", &Quotas::default()).await.unwrap();
    tenants::add(&pool, "other", &Quotas::default()).await.unwrap();
    let create_as = |key: String| {
        let s = &s;
        async move {
            let headers = [("open-sandbox-api-key", key.as_str()), ("content-type", "application/json")];
            let body = json!({"image": {"uri": "fake"}, "entrypoint": ["sleep", "60"], "timeout": 600});
            let (status, out) = s.bare("POST", "/v1/sandboxes", &headers, serde_json::to_vec(&body).unwrap()).await;
            let out: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(status, StatusCode::ACCEPTED, "{out}");
            out["id"].as_str().unwrap().to_owned()
        }
    };
    let env_of = |id: String| {
        let s = &s;
        async move {
            let id = paddock_core::runtime::SandboxId::parse(&id).unwrap();
            s.state.rt.get(&id).await.unwrap().spec.env
        }
    };
    let call = |sandbox: String| {
        let s = &s;
        async move {
            let (status, out) = gateway(
                s.gateway,
                "POST",
                "/llm/v1/chat/completions",
                "sk-made-up",
                &[],
                br#"{"model": "m"}"#,
                Some(&forwarder(s, &sandbox)),
            )
            .await;
            (status, code_of(&out))
        }
    };

    // No route anywhere yet: the route is mounted and says whose job it is to give one.
    let before = create_as(acme.clone()).await;
    assert!(!env_of(before.clone()).await.contains_key("PADDOCK_LLM_BASE"));
    assert_eq!(call(before.clone()).await, (404, "NO_MODEL_ROUTE".to_owned()));

    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("acme.key");
    std::fs::write(&key_file, "sk-acme-1\n").unwrap();
    let route = ModelRoute::new(&format!("http://{upstream}"), Some(&key_file)).unwrap();
    tenants::set_model_route(&pool, "acme", Some(&route)).await.unwrap();
    // Within the tenants' reload: the sandbox made before calls through it too.
    let until = Instant::now() + Duration::from_secs(10);
    while call(before.clone()).await.0 != 200 {
        assert!(Instant::now() < until, "the route set while serving was never used");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let last_auth = || seen.lock().unwrap().last().unwrap().1.clone();
    assert_eq!(last_auth(), "Bearer sk-acme-1");
    let after = create_as(acme.clone()).await;
    let env = env_of(after.clone()).await;
    let route = format!("http://{}/llm/v1", s.gateway);
    assert_eq!(env.get("PADDOCK_LLM_BASE"), Some(&route), "{env:?}");
    assert!(!env.values().any(|v| v.contains("sk-acme")), "the key reached the sandbox: {env:?}");
    // Replacing the file rotates the key on the next call.
    std::fs::write(&key_file, "sk-acme-2\n").unwrap();
    assert_eq!(call(after.clone()).await.0, 200);
    assert_eq!(last_auth(), "Bearer sk-acme-2");
    // A key file gone is a clear 503, and nothing goes upstream without the key.
    std::fs::remove_file(&key_file).unwrap();
    let calls = seen.lock().unwrap().len();
    assert_eq!(call(after.clone()).await, (503, "MODEL_KEY_UNREADABLE".to_owned()));
    assert_eq!(seen.lock().unwrap().len(), calls);
    // Another tenant has none.
    let others = tenants::list(&pool).await.unwrap().into_iter().find(|t| t.name == "other").unwrap();
    assert!(others.model_route.is_none());
    // Taken away: within the reload, the route answers 404 again.
    tenants::set_model_route(&pool, "acme", None).await.unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while call(after.clone()).await.0 != 404 {
        assert!(Instant::now() < until, "the route taken away was still used");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in [before, after] {
        s.call("DELETE", &format!("/v1/sandboxes/{id}"), None).await;
    }
}

/// Work that needs what the runtime cannot give (a boundary, a device, containers inside) is a
/// 400 UNSUPPORTED at submission naming it, for a run and for any task of an evaluation, and
/// nothing is queued; `GET /v1/capabilities` says what the runtime gives.
#[tokio::test]
async fn fake_runtime_work_needing_what_the_runtime_lacks_is_refused_at_submission_naming_it() {
    let s = Server::new().await;
    let (_, caps) = s.call("GET", "/v1/capabilities", None).await;
    assert_eq!(
        (caps["isolation"].as_str(), caps["nested_containers"].as_bool()),
        (Some("none"), Some(false)),
        "{caps}"
    );
    let run = |requires: Value| json!({"image": "fake", "command": ["true"], "requires": requires});
    for (requires, names) in [
        (json!({"isolation": "gvisor"}), "requires.isolation gvisor"),
        (json!({"isolation": "vm"}), "requires.isolation vm"),
        (json!({"devices": ["/dev/kvm"]}), "requires.devices /dev/kvm"),
        (json!({"nestedContainers": true}), "requires.nestedContainers"),
        (json!({"isolation": "steel"}), "not a kind of boundary"),
    ] {
        let (status, err) = s.call("POST", "/v1/runs", Some(run(requires.clone()))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{requires}: {err}");
        assert_error(&err, "UNSUPPORTED");
        assert!(err["message"].as_str().unwrap().contains(names), "{requires}: {err}");
    }
    let (status, err) = s.call("POST", "/v1/runs", Some(run(json!({"gpus": 1})))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an unknown requirement is refused, not ignored: {err}");
    let task =
        |name: &str, requires: Value| json!({"name": name, "image": "fake", "command": ["true"], "requires": requires});
    let (status, err) = s
        .call(
            "POST",
            "/v1/evaluations",
            Some(json!({"tasks": [task("plain", json!({})), task("vm", json!({"devices": ["/dev/kvm"]}))]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert_error(&err, "UNSUPPORTED");
    assert!(err["message"].as_str().unwrap().starts_with("task 1 (vm): requires.devices /dev/kvm"), "{err}");
    let (_, page) = s.call("GET", "/v1/runs", None).await;
    assert!(page["items"].as_array().unwrap().is_empty(), "a refused submission queues nothing: {page}");
    // Asking for nothing is asking for nothing.
    let (status, created) = s.call("POST", "/v1/runs", Some(run(json!({})))).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert!(created["requires"].is_null(), "{created}");
}
