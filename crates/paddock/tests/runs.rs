//! Runs on the real local runtime, as root: drivers written in plain `sh` + `curl` call home
//! through the gateway forwarder in their sandbox's network namespace, reach nothing else, and
//! runs survive a `kill -9` of the server, a sandbox destroyed under them and a drain.

mod common;

use std::time::{Duration, Instant};

use common::server::{Server, data_dir};
use serde_json::{Value, json};

/// Waits until the run is `state` at `epoch` (any epoch when `None`).
fn wait_state(s: &Server, id: &str, state: &str, epoch: Option<i64>) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, run) = s.api("GET", &format!("/v1/runs/{id}"), None);
        assert_eq!(status, 200, "{run}");
        if run["state"] == state && epoch.is_none_or(|e| run["epoch"] == e) {
            return run;
        }
        assert!(Instant::now() < until, "run never became {state} at epoch {epoch:?}: {run}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn submit(s: &Server, script: &str, extra: Value) -> String {
    let mut body = json!({"tier": "interactive", "command": ["sh", "-c", script]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let (status, run) = s.api("POST", "/v1/runs", Some(&body));
    assert_eq!(status, 201, "{run}");
    run["id"].as_str().unwrap().to_owned()
}

/// The body of a GET of the API, as bytes.
fn fetch(s: &Server, path: &str) -> Vec<u8> {
    let resp = s.agent.get(&s.url(path)).header("OPEN-SANDBOX-API-KEY", &s.key).call().unwrap();
    assert_eq!(resp.status().as_u16(), 200, "GET {path}");
    resp.into_body().read_to_vec().unwrap()
}

fn output(s: &Server, id: &str) -> String {
    String::from_utf8(fetch(s, &format!("/v1/runs/{id}/output"))).unwrap()
}

fn events(s: &Server, id: &str) -> String {
    String::from_utf8(fetch(s, &format!("/v1/runs/{id}/events"))).unwrap()
}

/// The driver of the first test: everything a driver does, with `curl` only.
const DRIVER: &str = r#"set -e
auth="Authorization: Bearer $PADDOCK_TOKEN"
curl -fsS -X POST -H "$auth" "$PADDOCK_GATEWAY/v1/heartbeat" > /dev/null
mkdir -p /tmp/in /tmp/out
curl -fsS -H "$auth" "$PADDOCK_GATEWAY/v1/inputs" | tar -x -C /tmp/in
curl -fsS -X POST -H "$auth" -H 'content-type: application/json' \
  -d "{\"type\": \"token\", \"data\": \"$PADDOCK_TOKEN\"}" "$PADDOCK_GATEWAY/v1/events" > /dev/null
# Nothing but the gateway: a TEST-NET address and this host's API port.
echo "outside=$(curl -sS -m 3 -o /dev/null -w '%{http_code}' http://192.0.2.1/ 2>/dev/null || echo refused)"
echo "host-api=$(curl -sS -m 3 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$API_PORT/health" 2>/dev/null || echo refused)"
tr a-z A-Z < /tmp/in/task.txt > /tmp/out/answer.txt
tar -C /tmp/out -cf /tmp/result.tar .
curl -fsS -X PUT -H "$auth" --data-binary @/tmp/result.tar "$PADDOCK_GATEWAY/v1/result" > /dev/null
echo done
"#;

fn tar_of(name: &str, body: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(name), body).unwrap();
    let out = std::process::Command::new("tar").arg("-C").arg(dir.path()).args(["-cf", "-", name]).output().unwrap();
    assert!(out.status.success());
    out.stdout
}

#[test]
fn a_sh_and_curl_driver_calls_home_and_reaches_nothing_else() {
    let data = data_dir();
    let s = Server::start(data.path(), &[]);
    use base64::Engine;
    let inputs = base64::engine::general_purpose::STANDARD.encode(tar_of("task.txt", b"shout this"));
    let id = submit(&s, DRIVER, json!({"inputs": inputs, "env": {"API_PORT": s.port.to_string()}}));
    let run = wait_state(&s, &id, "succeeded", Some(1));
    let out = output(&s, &id);
    assert!(out.contains("done"), "{run}\n{out}");
    assert!(!out.contains("outside=200") && out.contains("outside="), "the sandbox reached an outside address:\n{out}");
    assert!(out.contains("host-api=000"), "the sandbox reached the host's API port:\n{out}");
    assert!(run["firstCallAt"].is_string() && run["hasResult"] == true, "{run}");
    let result = fetch(&s, &format!("/v1/runs/{id}/result"));
    let dir = tempfile::tempdir().unwrap();
    let mut tar = std::process::Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(dir.path())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(tar.stdin.as_mut().unwrap(), &result).unwrap();
    drop(tar.stdin.take());
    assert!(tar.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(dir.path().join("answer.txt")).unwrap(), "SHOUT THIS");

    // The first run's token, used from another run's sandbox, is refused by the gateway: the
    // forwarder says which sandbox the connection comes from.
    let resp = events(&s, &id);
    let token = resp
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|e| e["type"] == "driver")
        .and_then(|e| e["data"]["data"].as_str().map(str::to_owned))
        .expect("the driver's token event");
    let thief = r#"curl -sS -o /dev/null -w 'stolen=%{http_code}\n' -X POST -H "Authorization: Bearer $STOLEN" "$PADDOCK_GATEWAY/v1/heartbeat""#;
    let other = submit(&s, thief, json!({"env": {"STOLEN": token}}));
    wait_state(&s, &other, "succeeded", None);
    let out = output(&s, &other);
    assert!(out.contains("stolen=403"), "another sandbox's token was not refused:\n{out}");
    // Nothing is left of either run's sandbox, and the sandbox list never showed them.
    for run in [&id, &other] {
        let (_, r) = s.api("GET", &format!("/v1/runs/{run}"), None);
        let sandbox = r["sandboxId"].as_str().unwrap().to_owned();
        assert!(!sandbox_alive(data.path(), &sandbox), "run {run}'s sandbox {sandbox} is left");
    }
    let (_, list) = s.api("GET", "/v1/sandboxes", None);
    assert!(list["items"].as_array().unwrap().is_empty(), "run sandboxes are the run API's: {list}");
}

/// A driver that calls home, then finishes at once from its second attempt on, and otherwise
/// works for five minutes.
const SECOND_TIME_LUCKY: &str = r#"curl -fsS -X POST -H "Authorization: Bearer $PADDOCK_TOKEN" "$PADDOCK_GATEWAY/v1/heartbeat" > /dev/null || exit 1
[ "$PADDOCK_EPOCH" -ge 2 ] && exit 0
sleep 300"#;

/// The local runtime's sandboxes are Linux namespaces under seccomp, with no host device and
/// no containers of their own: a run asking for namespaces runs, one asking for a VM, /dev/kvm
/// or nested containers is refused when submitted.
#[test]
fn the_local_runtime_runs_work_it_can_isolate_and_refuses_a_vm_or_kvm_at_submission() {
    let data = data_dir();
    let s = Server::start(data.path(), &[]);
    let (_, caps) = s.api("GET", "/v1/capabilities", None);
    assert_eq!(caps["isolation"], "namespaces", "{caps}");
    let id = submit(&s, "true", json!({"requires": {"isolation": "namespaces"}}));
    let run = wait_state(&s, &id, "succeeded", Some(1));
    assert_eq!(run["requires"], json!({"isolation": "namespaces"}), "{run}");
    for requires in [json!({"isolation": "vm"}), json!({"devices": ["/dev/kvm"]}), json!({"nestedContainers": true})] {
        let body = json!({"command": ["true"], "requires": requires});
        let (status, err) = s.api("POST", "/v1/runs", Some(&body));
        assert_eq!((status, err["code"].as_str()), (400, Some("UNSUPPORTED")), "{requires}: {err}");
    }
}

fn sandbox_alive(data: &std::path::Path, id: &str) -> bool {
    let out = std::process::Command::new(common::EXE)
        .args(["--data-dir", data.to_str().unwrap(), "--json", "ls"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains(id)
}

#[test]
fn runs_survive_a_killed_server_a_lost_sandbox_and_a_drain() {
    let data = data_dir();
    let mut s = Server::start(data.path(), &[]);
    // kill -9 of the server mid-run: the next start takes the attempt back and runs it again.
    let id = submit(&s, SECOND_TIME_LUCKY, json!({}));
    let first = wait_state(&s, &id, "running", Some(1));
    let sandbox = first["sandboxId"].as_str().unwrap().to_owned();
    s.kill9();
    let s = Server::start(data.path(), &[]);
    let run = wait_state(&s, &id, "succeeded", Some(2));
    assert_eq!(run["attempt"], 2, "{run}");
    assert!(!sandbox_alive(data.path(), &sandbox), "the lost attempt's sandbox {sandbox} is left");

    // The sandbox destroyed under a running attempt: lost, and run again.
    let id = submit(&s, SECOND_TIME_LUCKY, json!({}));
    let first = wait_state(&s, &id, "running", Some(1));
    let sandbox = first["sandboxId"].as_str().unwrap();
    let rm = std::process::Command::new(common::EXE)
        .args(["--data-dir", data.path().to_str().unwrap(), "rm", sandbox])
        .output()
        .unwrap();
    assert!(rm.status.success(), "{}", String::from_utf8_lossy(&rm.stderr));
    let run = wait_state(&s, &id, "succeeded", Some(2));
    assert_eq!(run["attempt"], 2, "{run}");

    // SIGTERM: the server drains for --drain-timeout, then requeues what still runs.
    drop(s);
    let mut s = Server::start(data.path(), &["--drain-timeout", "1s"]);
    let id = submit(&s, SECOND_TIME_LUCKY, json!({}));
    wait_state(&s, &id, "running", Some(1));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(s.child.id().cast_signed()).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while s.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "the server did not stop after its drain");
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = Server::start(data.path(), &[]);
    wait_state(&s, &id, "succeeded", Some(2));
    let events = events(&s, &id);
    assert!(events.contains("its server stopped before it finished"), "the drain did not requeue it:\n{events}");
    let (status, page) = s.api("GET", "/v1/runs?state=succeeded", None);
    assert_eq!(status, 200);
    assert_eq!(page["items"].as_array().unwrap().len(), 3, "{page}");
}

/// A model upstream on loopback: answers every request with `{"ok": true}` and keeps the head
/// of each request it got.
fn model_upstream() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = heads.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut head = String::new();
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0u8; length];
            let _ = reader.read_exact(&mut body);
            keep.lock().unwrap().push(head);
            let answer = "{\"ok\": true}";
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (port, heads)
}

#[test]
fn the_model_route_adds_a_key_no_sandbox_ever_holds() {
    const KEY: &str = "sk-never-inside-0123";
    let (port, heads) = model_upstream();
    let data = data_dir();
    let base = format!("http://127.0.0.1:{port}/v1");
    let s = Server::launch(
        data.path(),
        &["--api-key", common::server::KEY, "--llm-base", &base, "--llm-env", "OPENAI_BASE_URL"],
        &[("PADDOCK_LLM_KEY", KEY)],
    );
    let id = s.create();
    // The forwarders' proof is in the sandbox's record on the host, and nowhere inside.
    let record: Value =
        serde_json::from_slice(&std::fs::read(data.path().join("sandboxes").join(&id).join("record.json")).unwrap())
            .unwrap();
    let secret = record["info"]["spec"]["gateway_secret"].as_str().expect("the record keeps the forwarders' secret");
    assert_eq!(secret.len(), 64, "{record}");
    // In halves with the middle character in a bracket expression, so neither the script's nor
    // grep's own command line holds a match: grep's argument `a[c]b` does not match `a[c]b`
    // (a regex dot would, and grep read its own command line through /proc now and then).
    let (a, c, b) = (&secret[..32], &secret[32..33], &secret[33..]);
    let script = format!(
        r#"a={a}; c={c}; b={b}
echo "secret-in-env=$(env | grep -c "$a[$c]$b")"
echo "secret-in-proc=$(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | grep -c "$a[$c]$b")"
curl -sS -H 'Authorization: Bearer made-up' -H 'content-type: application/json' -d '{{"model": "m"}}' "$OPENAI_BASE_URL/chat/completions"; echo
echo "base=$PADDOCK_LLM_BASE"
echo "in-env=$(env | grep -c {KEY})"
echo "in-proc=$(cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c {KEY})"
echo "upstream-direct=$(curl -sS -m 3 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/v1/models 2>/dev/null || echo refused)""#
    );
    let (lines, code) = s.run(&id, &script, false);
    let out = lines.join("\n");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(r#"{"ok": true}"#), "the call did not reach the upstream:\n{out}");
    assert!(out.contains("base=http://127.0.0.1:8081/llm/v1"), "{out}");
    assert!(out.contains("\nin-env=0") && out.contains("\nin-proc=0"), "the key is inside the sandbox:\n{out}");
    assert!(
        out.contains("secret-in-env=0") && out.contains("secret-in-proc=0"),
        "the forwarders' secret is inside:\n{out}"
    );
    assert!(out.contains("upstream-direct=000"), "the sandbox reached the upstream past the route:\n{out}");
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].starts_with("POST /v1/chat/completions "), "{}", heads[0]);
    assert!(
        heads[0].to_ascii_lowercase().contains(&format!("authorization: bearer {}", KEY.to_ascii_lowercase())),
        "{}",
        heads[0]
    );
    assert!(!heads[0].contains("made-up"), "the sandbox's own credential went upstream: {}", heads[0]);
}

#[test]
fn capacity_is_worked_out_for_a_machine_described_by_flags() {
    let out = std::process::Command::new(common::EXE)
        .args(["--json", "capacity", "--cpus", "2", "--memory", "24GiB"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // (24 - 1) GiB / (512 + 32) MiB = 43 by memory; 8 by CPU.
    assert_eq!(
        (v["fits"].as_u64(), v["bounds"]["byMemory"].as_u64(), v["bounds"]["byCpu"].as_u64()),
        (Some(8), Some(43), Some(8)),
        "{v}"
    );
    let human = std::process::Command::new(common::EXE)
        .args(["capacity", "--cpus", "64", "--memory", "8GiB", "--sandbox-memory", "1GiB"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.starts_with("6 sandboxes of 1GiB fit: 256 by CPU"), "{text}");
}
