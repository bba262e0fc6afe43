//! OpenSandbox compatibility details against `FakeRuntime` (no isolation: see `fake/mod.rs`):
//! honest 501s for what Paddock does not serve, `set_env`, lifetimes, entrypoint failures.

mod fake;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use fake::server::{Server, assert_error};
use paddock_core::units::unix_ms as now_ms;
use serde_json::{Value, json};

/// Every execd, egress and lifecycle route the SDK 1.1.1 may call that Paddock does not serve.
const UNSERVED_EXECD: [(&str, &str, &str); 9] = [
    ("POST", "/pty", "PTY"),
    ("GET", "/pty/abc/ws", "PTY"),
    ("GET", "/code/no/such/route", "not an execd route"),
    ("GET", "/v1/isolated/capabilities", "isolated sessions"),
    ("POST", "/v1/isolated/session", "isolated sessions"),
    ("GET", "/v1/filesystem/1000/1000/files/info", "another uid/gid"),
    ("GET", "/metrics/watch", "poll GET /metrics"),
    ("GET", "/proxy/8080/x", "endpoints"),
    ("GET", "/no/such/thing", "not an execd route"),
];

fn message(body: &Value) -> &str {
    body["message"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn fake_runtime_unserved_execd_routes_are_501_in_both_sdk_modes() {
    let s = Server::new().await;
    let id = s.create().await;
    let (_, direct) = s.call("GET", &format!("/v1/sandboxes/{id}/endpoints/44772"), None).await;
    let token = direct["headers"]["x-paddock-sandbox-token"].as_str().unwrap().to_owned();
    for (method, path, feature) in UNSERVED_EXECD {
        let started = Instant::now();
        // Proxy mode: the API key.
        let (status, body) = s.call(method, &Server::execd(&id, path), None).await;
        assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{method} {path}: {body}");
        assert_error(&body, "NOT_SUPPORTED");
        assert!(message(&body).contains(feature), "{method} {path} names {feature:?}: {body}");
        assert!(!message(&body).contains("port 44772"), "never blames the sandbox: {body}");
        // Direct mode: only the sandbox's token, as the SDK sends it.
        let (status, body) =
            s.with_headers(method, &Server::execd(&id, path), &[("x-paddock-sandbox-token", &token)]).await;
        assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "direct {method} {path}: {body}");
        assert!(started.elapsed() < Duration::from_secs(1), "{method} {path} was slow");
    }
    // Without credentials an unserved route still needs them first: a 501 is no way around auth.
    let (status, body) = s.with_headers("POST", &Server::execd(&id, "/pty"), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // The bare port and a trailing slash are never forwarded into the sandbox either.
    for path in ["", "/"] {
        let (status, body) = s.call("GET", &Server::execd(&id, path), None).await;
        assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{path:?}: {body}");
    }
    // Served routes are untouched by the catch-all.
    assert_eq!(s.call("GET", &Server::execd(&id, "/ping"), None).await.0, StatusCode::OK);
    // A sandbox that does not exist is still a 404 on served routes.
    assert_eq!(s.call("GET", &Server::execd("sbx-000000000000", "/ping"), None).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn fake_runtime_unserved_egress_and_lifecycle_routes_are_501() {
    let s = Server::new().await;
    let id = s.create().await;
    let egress = |p: &str| format!("/v1/sandboxes/{id}/proxy/18080{p}");
    for (method, path, feature) in [
        ("GET", egress("/metrics"), "/credential-vault"),
        ("POST", format!("/v1/sandboxes/{id}/snapshots"), "snapshots"),
        ("GET", "/v1/snapshots".into(), "snapshots"),
        ("POST", "/v1/templates".into(), "templates"),
        ("GET", "/v1/pools/p1".into(), "pools"),
    ] {
        let (status, body) = s.call(method, &path, None).await;
        assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{method} {path}: {body}");
        assert_error(&body, "NOT_SUPPORTED");
        assert!(message(&body).contains(feature), "{method} {path} names {feature:?}: {body}");
    }
    // The credential vault needs an egress enforcer of Paddock's, which this runtime lacks:
    // a 400 that says so, in both places.
    for path in [egress("/credential-vault"), format!("/v1/sandboxes/{id}/credential-vault")] {
        let (status, body) = s.call("GET", &path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_error(&body, "NOT_SUPPORTED");
        assert!(message(&body).contains("egress enforcer"), "{body}");
    }
    let (status, body) = s.call("POST", &egress("/credential-vault/credentials"), Some(json!({}))).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    // A signed endpoint further away than a signed route may last is refused, not shortened.
    let (status, body) = s.call("GET", &format!("/v1/sandboxes/{id}/endpoints/44772?expires=4102444800"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error(&body, "INVALID_ARGUMENT");
    let (status, body) = s.call("GET", &egress("/policy"), None).await;
    assert_eq!((status, body["policy"]["defaultAction"].as_str()), (StatusCode::OK, Some("deny")), "{body}");
    // The diagnostics routes are documented (the API fuzz run reaches them); the 501s are named
    // in the description only, since a documented 5xx would be a fuzz failure by definition.
    let (_, doc) = s.call("GET", "/v1/openapi.json", None).await;
    assert!(doc["paths"]["/sandboxes/{id}/diagnostics/logs"]["get"].is_object(), "{doc}");
    assert!(doc["info"]["description"].as_str().unwrap().contains("501"), "{doc}");
}

#[tokio::test]
async fn fake_runtime_egress_policy_api_follows_opensandbox_semantics() {
    let s = Server::new().await;
    let body = json!({
        "image": {"uri": "fake"},
        "networkPolicy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}
    });
    let (status, created) = s.call("POST", "/v1/sandboxes", Some(body.clone())).await;
    assert!(status.is_success(), "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let sidecar = format!("/v1/sandboxes/{id}/proxy/18080/policy");
    let lifecycle = format!("/v1/sandboxes/{id}/networkpolicy");
    let rules = |v: &Value| v["policy"]["egress"].clone();

    let (status, got) = s.call("GET", &sidecar, None).await;
    assert_eq!((status, got["mode"].as_str()), (StatusCode::OK, Some("enforcing")), "{got}");
    assert_eq!(rules(&got), json!([{"action": "allow", "target": "pypi.org"}]));

    // PATCH: new rules first, one rule per target (case-insensitive), the default kept.
    let patch = json!([{"action": "deny", "target": "PyPI.org"}, {"action": "allow", "target": "*.npmjs.org"}]);
    let (status, got) = s.call("PATCH", &sidecar, Some(patch)).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(
        rules(&got),
        json!([{"action": "deny", "target": "PyPI.org"}, {"action": "allow", "target": "*.npmjs.org"}])
    );
    assert_eq!(got["policy"]["defaultAction"], "deny");

    // DELETE by target, idempotent; the lifecycle route is the same policy.
    let (_, got) = s.call("DELETE", &lifecycle, Some(json!(["*.NPMJS.org", "absent.example"]))).await;
    assert_eq!(rules(&got), json!([{"action": "deny", "target": "PyPI.org"}]), "{got}");
    let (status, got) = s.call("DELETE", &sidecar, Some(json!(["absent.example"]))).await;
    assert_eq!((status, got["reason"].as_str()), (StatusCode::OK, Some("no matching targets found")), "{got}");

    // PUT replaces the whole policy.
    let (_, got) = s.call("PUT", &lifecycle, Some(json!({"defaultAction": "allow"}))).await;
    assert_eq!((got["mode"].as_str(), rules(&got)), (Some("allow_all"), json!([])), "{got}");

    // Bad rules are a 400 naming the rule, and change nothing.
    for bad in [
        json!([{"action": "allow", "target": "exa mple.com"}]),
        json!([{"action": "maybe", "target": "a.b"}]),
        json!({"x": 1}),
    ] {
        let (status, got) = s.call("PATCH", &sidecar, Some(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {got}");
        assert_error(&got, "INVALID_ARGUMENT");
    }
    let (_, got) = s.call("GET", &sidecar, None).await;
    assert_eq!(got["mode"], "allow_all");

    // Rules scoped to ports (OpenSandbox 1.2): on an address, or with no target for every
    // address; read back as given. A domain with ports and bad ports are 400s naming why.
    let ported =
        json!([{"action": "allow", "target": "192.0.2.0/24", "ports": [22, 443]}, {"action": "deny", "ports": [25]}]);
    let (status, got) = s.call("PATCH", &sidecar, Some(ported.clone())).await;
    assert_eq!((status, rules(&got)), (StatusCode::OK, ported), "{got}");
    for (bad, why) in [
        (json!([{"action": "allow", "target": "pypi.org", "ports": [443]}]), "domain"),
        (json!([{"action": "allow", "ports": [0]}]), "out of range"),
        (json!([{"action": "allow", "ports": [80, 80]}]), "twice"),
        (json!([{"action": "allow", "ports": []}]), "empty"),
        (json!([{"action": "allow", "ports": (1..=257).collect::<Vec<u32>>()}]), "at most 256"),
        (json!([{"action": "allow"}]), "empty"),
    ] {
        let (status, got) = s.call("PATCH", &sidecar, Some(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {got}");
        assert!(message(&got).contains(why), "{bad}: {got}");
    }
    let (_, got) = s.call("DELETE", &lifecycle, Some(json!(["192.0.2.0/24"]))).await;
    assert_eq!(rules(&got), json!([{"action": "deny", "ports": [25]}]), "{got}");
    let mut bad_create = body.clone();
    bad_create["networkPolicy"]["egress"][0]["target"] = json!("10.0.0.0/99"); // not-a-probe: an invalid rule, refused
    let (status, got) = s.call("POST", "/v1/sandboxes", Some(bad_create)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{got}");
    assert!(message(&got).contains("egress rule 0"), "{got}");

    // Paddock's own view adds the counters; /metrics has them per sandbox.
    let (status, got) = s.call("GET", &format!("/v1/sandboxes/{id}/egress"), None).await;
    assert_eq!((status, got["counters"]["connections_denied"].as_u64()), (StatusCode::OK, Some(0)), "{got}");
    let (_, text) = s.raw("GET", "/metrics", "text/plain", Vec::new()).await;
    let text = String::from_utf8(text).unwrap();
    let line = format!("paddock_egress_connections_total{{sandbox=\"{id}\",verdict=\"denied\"}} 3");
    assert!(text.contains(&line), "{line} not in:\n{text}");
}

/// Runs a shell command through `/command` and returns its stdout lines and exit code.
async fn run(s: &Server, id: &str, body: Value) -> (Vec<String>, Option<i64>) {
    let (status, out) =
        s.raw("POST", &Server::execd(id, "/command"), "application/json", serde_json::to_vec(&body).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let mut lines = Vec::new();
    let mut code = None;
    for frame in String::from_utf8(out).unwrap().split("\n\n").filter(|f| !f.trim().is_empty()) {
        let json = frame.trim().strip_prefix("data:").unwrap_or(frame).trim();
        let event: Value = serde_json::from_str(json).unwrap();
        match event["type"].as_str() {
            Some("stdout") => lines.push(event["text"].as_str().unwrap().to_owned()),
            Some("execution_complete") => code = Some(0),
            Some("error") => code = event["error"]["evalue"].as_str().and_then(|v| v.parse().ok()),
            _ => {}
        }
    }
    (lines, code)
}

#[tokio::test]
async fn fake_runtime_set_env_persists_for_later_commands_and_request_envs_win() {
    let s = Server::new().await;
    let id = s.create().await;
    // What the SDK's commands.set_env runs, for a plain and a quoted value.
    let set = |k: &str, entry: &str| {
        let quoted = format!("'{}'", entry.replace('\'', "'\\''"));
        json!({"command": format!(
            "if [ -z \"${{EXECD_ENVS:-}}\" ]; then echo 'EXECD_ENVS is not set; cannot persist {k}' >&2; exit 1; fi\nmkdir -p \"$(dirname \"$EXECD_ENVS\")\"\nprintf '%s\\n' {quoted} >> \"$EXECD_ENVS\""
        )})
    };
    assert_eq!(run(&s, &id, set("GREETING", "GREETING='hello world'")).await.1, Some(0));
    assert_eq!(run(&s, &id, set("QUOTED", r#"QUOTED="it's \"x\"""#)).await.1, Some(0));
    let (out, code) = run(&s, &id, json!({"command": "echo \"$GREETING|$QUOTED\""})).await;
    assert_eq!((out, code), (vec!["hello world|it's \"x\"".to_owned()], Some(0)));
    let (out, _) = run(&s, &id, json!({"command": "echo $GREETING", "envs": {"GREETING": "mine"}})).await;
    assert_eq!(out, ["mine"], "the request's envs win over the file");
    // Another sandbox has its own file.
    let other = s.create().await;
    let (out, _) = run(&s, &other, json!({"command": "echo \"[$GREETING]\""})).await;
    assert_eq!(out, ["[]"]);
    // Garbage in the file is skipped, never a failed command.
    run(&s, &id, json!({"command": "printf 'junk\\n1BAD=x\\nOK2=y\\n' >> \"$EXECD_ENVS\""})).await;
    let (out, code) = run(&s, &id, json!({"command": "echo \"$GREETING $OK2\""})).await;
    assert_eq!((out, code), (vec!["hello world y".to_owned()], Some(0)));
    // A file too big to be an env file is refused with its path, not read without bound.
    run(&s, &id, json!({"command": "head -c 300000 /dev/zero | tr '\\0' a >> \"$EXECD_ENVS\""})).await;
    let (status, body) = s.call("POST", &Server::execd(&id, "/command"), Some(json!({"command": "true"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(message(&body).contains("/tmp/.paddock/envs"), "{body}");
}

#[tokio::test]
async fn fake_runtime_timeout_null_means_no_expiry_which_survives_a_restart() {
    use paddock_core::runtime::{Runtime, SandboxId};
    let s = Server::new().await;
    let (status, created) =
        s.call("POST", "/v1/sandboxes", Some(json!({"image": {"uri": "fake"}, "timeout": null}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(
        created.get("expiresAt").is_none(),
        "no expiry is no expiresAt (the SDK reads null as a bad time): {created}"
    );
    let sid = SandboxId::parse(&id).unwrap();
    assert_eq!(s.rt.get(&sid).await.unwrap().expires_unix_ms, None, "the runtime was asked for no expiry");
    // An absent timeout is the default session, not no expiry.
    let (_, default) = s.call("POST", "/v1/sandboxes", Some(json!({"image": {"uri": "fake"}}))).await;
    assert!(default["expiresAt"].is_string(), "{default}");
    let s = s.restarted().await;
    let (status, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert!(info.get("expiresAt").is_none() && info["status"]["state"] == "Running", "{info}");
    // A renewal gives it an expiry, beyond the create-time maximum (2 h here) too.
    let at = time_in(Duration::from_secs(5 * 3600));
    let (status, renewed) =
        s.call("POST", &format!("/v1/sandboxes/{id}/renew-expiration"), Some(json!({"expiresAt": at}))).await;
    assert_eq!(status, StatusCode::OK, "renew is not capped by --max-timeout: {renewed}");
    let (_, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert!(info["expiresAt"].is_string(), "{info}");
    let runtime_expiry = s.rt.get(&sid).await.unwrap().expires_unix_ms.unwrap();
    let want = now_ms() + 5 * 3600 * 1000;
    assert!(runtime_expiry.abs_diff(want) < 60_000, "the runtime holds the new expiry: {runtime_expiry} vs {want}");
    // Shortening is allowed; the past is not.
    let (status, _) = s
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/renew-expiration"),
            Some(json!({"expiresAt": time_in(Duration::from_secs(120))})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = s
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/renew-expiration"),
            Some(json!({"expiresAt": "2001-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn fake_runtime_no_expiry_refused_names_the_flag_and_too_long_names_max_timeout() {
    let s = Server::with_config(|c| c.allow_no_expiry = false).await;
    let (status, body) =
        s.call("POST", "/v1/sandboxes", Some(json!({"image": {"uri": "fake"}, "timeout": null}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(message(&body).contains("--allow-no-expiry"), "{body}");
    let (status, body) =
        s.call("POST", "/v1/sandboxes", Some(json!({"image": {"uri": "fake"}, "timeout": 86400}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(message(&body).contains("--max-timeout") && message(&body).contains("7200s"), "{body}");
}

/// RFC 3339 for now + `d`, as the SDK's renew sends it.
fn time_in(d: Duration) -> String {
    let secs = (now_ms() / 1000 + d.as_secs()).cast_signed();
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

async fn wait_for_state(s: &Server, id: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
        if info["status"]["state"] == want {
            return info;
        }
        assert!(Instant::now() < deadline, "{id} never became {want}: {info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn fake_runtime_an_entrypoint_that_exits_fails_the_sandbox_with_its_reason_and_output() {
    let s = Server::new().await;
    let body = json!({"image": {"uri": "fake"},
        "entrypoint": ["sh", "-c", "echo starting up; echo 'config missing' >&2; exit 3"]});
    let (status, created) = s.call("POST", "/v1/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let info = wait_for_state(&s, &id, "Failed").await;
    assert_eq!(info["status"]["reason"], "ENTRYPOINT_EXITED", "{info}");
    let why = info["status"]["message"].as_str().unwrap();
    assert!(why.contains("exit status 3") && why.contains("config missing"), "{why}");
    // Not healthy, so the SDK's is_healthy() says so.
    let (status, body) = s.call("GET", &Server::execd(&id, "/ping"), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_error(&body, "SANDBOX_FAILED");
    // Pausing would hide it.
    let (status, _) = s.call("POST", &format!("/v1/sandboxes/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    // The output and the events, through OpenSandbox's diagnostics routes.
    let (status, logs) = s.call("GET", &format!("/v1/sandboxes/{id}/diagnostics/logs?scope=container"), None).await;
    assert_eq!(status, StatusCode::OK, "{logs}");
    assert_eq!((logs["kind"].as_str(), logs["delivery"].as_str()), (Some("logs"), Some("inline")), "{logs}");
    let text = logs["content"].as_str().unwrap();
    assert!(text.contains("starting up") && text.contains("config missing"), "{logs}");
    let (status, events) = s.call("GET", &format!("/v1/sandboxes/{id}/diagnostics/events?scope=all"), None).await;
    assert_eq!(status, StatusCode::OK, "{events}");
    let text = events["content"].as_str().unwrap();
    assert!(text.contains("EntrypointStarted") && text.contains("EntrypointExited: exit status 3"), "{text}");
    let (status, body) = s.call("GET", &format!("/v1/sandboxes/{id}/diagnostics/logs?scope=bogus"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // A restart keeps the reason and the output (the state database has them).
    let s = s.restarted().await;
    let (_, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(
        (info["status"]["state"].as_str(), info["status"]["reason"].as_str()),
        (Some("Failed"), Some("ENTRYPOINT_EXITED"))
    );
    let (_, logs) = s.call("GET", &format!("/v1/sandboxes/{id}/diagnostics/logs?scope=container"), None).await;
    assert!(logs["content"].as_str().unwrap().contains("config missing"), "{logs}");
    // Deleting it still works, and then it is gone.
    assert_eq!(s.call("DELETE", &format!("/v1/sandboxes/{id}"), None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(s.call("GET", &format!("/v1/sandboxes/{id}"), None).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn fake_runtime_a_running_entrypoints_output_can_be_read() {
    let s = Server::new().await;
    let body = json!({"image": {"uri": "fake"}, "entrypoint": ["sh", "-c", "echo serving on 8000; exec sleep 1000"]});
    let (_, created) = s.call("POST", "/v1/sandboxes", Some(body)).await;
    let id = created["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, logs) = s.call("GET", &format!("/v1/sandboxes/{id}/diagnostics/logs?scope=container"), None).await;
        assert_eq!(status, StatusCode::OK, "{logs}");
        if logs["content"].as_str().unwrap().contains("serving on 8000") {
            break;
        }
        assert!(Instant::now() < deadline, "the entrypoint's output never showed: {logs}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(info["status"]["state"], "Running", "{info}");
    assert_eq!(s.call("GET", &Server::execd(&id, "/ping"), None).await.0, StatusCode::OK);
}

#[tokio::test]
async fn fake_runtime_sandboxes_made_outside_the_server_are_seen_and_managed() {
    use paddock_core::runtime::Runtime;
    use paddock_core::spec::SandboxSpec;
    let s = Server::new().await;
    // What `paddock create` does on the same data directory: straight to the runtime.
    let spec = SandboxSpec {
        image: Some("fake".into()),
        timeout_secs: Some(600),
        labels: [("team".to_owned(), "cli".to_owned())].into(),
        ..Default::default()
    };
    let cli = s.rt.create(spec.clone().validated().unwrap()).await.unwrap().id.to_string();
    let (status, list) = s.call("GET", "/v1/sandboxes", None).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = list["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&cli.as_str()), "the CLI's sandbox is listed: {list}");
    let (status, info) = s.call("GET", &format!("/v1/sandboxes/{cli}"), None).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert_eq!((info["status"]["state"].as_str(), info["metadata"]["team"].as_str()), (Some("Running"), Some("cli")));
    assert!(info["expiresAt"].is_string(), "its runtime expiry: {info}");
    // Found by id alone, too, before any list or reconcile.
    let other = s.rt.create(spec.clone().validated().unwrap()).await.unwrap().id.to_string();
    assert_eq!(s.call("GET", &Server::execd(&other, "/ping"), None).await.0, StatusCode::OK);
    let (out, code) = run(&s, &other, json!({"command": "echo managed"})).await;
    assert_eq!((out, code), (vec!["managed".to_owned()], Some(0)));
    assert_eq!(s.call("DELETE", &format!("/v1/sandboxes/{cli}"), None).await.0, StatusCode::NO_CONTENT);
    assert!(s.rt.get(&paddock_core::runtime::SandboxId::parse(&cli).unwrap()).await.is_err(), "really destroyed");
    // A sandbox the API is creating right now (its label says so, its row is not written yet)
    // is not adopted behind its back.
    let mut mid_create = spec;
    mid_create.labels.insert("paddock.dev/origin".into(), "api".into());
    let young = s.rt.create(mid_create.validated().unwrap()).await.unwrap().id.to_string();
    assert_eq!(s.call("GET", &format!("/v1/sandboxes/{young}"), None).await.0, StatusCode::NOT_FOUND);
    // The API's own sandboxes do not show the label.
    let id = s.create().await;
    let (_, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(info["metadata"], json!({}), "{info}");
}

#[tokio::test]
async fn fake_runtime_401s_say_where_the_key_is() {
    let s = Server::new().await;
    for headers in [&[][..], &[("open-sandbox-api-key", "wrong")][..]] {
        let (status, body) = s.with_headers("GET", "/v1/sandboxes", headers).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        let m = message(&body);
        assert!(m.contains("OPEN-SANDBOX-API-KEY") && m.contains("/api-key"), "names the header and the file: {m}");
    }
}

/// OpenSandbox's own names for the two credentials: `X-EXECD-ACCESS-TOKEN` for a sandbox's
/// token (given out beside Paddock's name) and `X-API-Key` for the API key (the Go SDK's).
#[tokio::test]
async fn fake_runtime_opensandbox_credential_names_open_what_paddocks_do() {
    let s = Server::new().await;
    let (id, other) = (s.create().await, s.create().await);
    let (_, direct) = s.call("GET", &format!("/v1/sandboxes/{id}/endpoints/44772"), None).await;
    let token = direct["headers"]["x-execd-access-token"].as_str().unwrap().to_owned();
    assert_eq!(direct["headers"]["x-paddock-sandbox-token"], token.as_str(), "{direct}");
    let ping = Server::execd(&id, "/ping");
    assert_eq!(s.with_headers("GET", &ping, &[("X-EXECD-ACCESS-TOKEN", &token)]).await.0, StatusCode::OK);
    let (status, body) =
        s.with_headers("GET", &Server::execd(&other, "/ping"), &[("X-EXECD-ACCESS-TOKEN", &token)]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a token opens its own sandbox only: {body}");
    let (status, _) = s.with_headers("GET", &ping, &[("X-EXECD-ACCESS-TOKEN", "00")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(s.with_headers("GET", "/v1/sandboxes", &[("X-API-Key", "test-key")]).await.0, StatusCode::OK);
    let (status, body) = s.with_headers("GET", "/v1/sandboxes", &[("X-API-Key", "wrong")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "INVALID_API_KEY");
}

/// OpenSandbox's renew intent: `extensions["access.renew.extend.seconds"]` makes traffic to the
/// sandbox push its expiry out; extensions Paddock does not know are refused, never ignored.
#[tokio::test]
async fn fake_runtime_access_renews_a_sandbox_that_asked_for_it() {
    let s = Server::new().await;
    let body = json!({"image": {"uri": "fake"}, "timeout": 600, "extensions": {"access.renew.extend.seconds": "3600"}});
    let (status, created) = s.call("POST", "/v1/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let expiry = |v: &Value| paddock_server::time_fmt::parse_rfc3339(v["expiresAt"].as_str().unwrap()).unwrap();
    let (_, before) = s.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(s.call("GET", &Server::execd(&id, "/ping"), None).await.0, StatusCode::OK);
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, now) = s.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
        if expiry(&now) - expiry(&before) > 2_000_000 {
            break;
        }
        assert!(Instant::now() < until, "an access did not renew it: {before} → {now}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (extensions, timeout, says) in [
        (json!({"access.renew.extend.seconds": "soon"}), json!(600), "whole number"),
        (json!({"access.renew.extend.seconds": "0"}), json!(600), "from 1"),
        (json!({"access.renew.extend.seconds": "60"}), Value::Null, "has none"),
        (json!({"storage.class": "fast"}), json!(600), "not supported"),
    ] {
        let body = json!({"image": {"uri": "fake"}, "timeout": timeout, "extensions": extensions});
        let (status, err) = s.call("POST", "/v1/sandboxes", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
        assert!(message(&err).contains(says), "{err} should say {says:?}");
    }
}

/// An omitted timeout is no expiry (OpenSandbox's schema), and the idle reaper gives back what
/// nobody uses: a sandbox without expiry is deleted, a thread's released (its workspace kept);
/// one in use, with a command running, or with an expiry of its own stays.
#[tokio::test]
async fn fake_runtime_idle_sandboxes_are_given_back_and_busy_ones_stay() {
    let s = Server::with_config(|c| c.default_timeout = None).await;
    let make = |body: Value| {
        let s = &s;
        async move {
            let (status, created) = s.call("POST", "/v1/sandboxes", Some(body)).await;
            assert_eq!(status, StatusCode::ACCEPTED, "{created}");
            created["id"].as_str().unwrap().to_owned()
        }
    };
    let forgotten = make(json!({"image": {"uri": "fake"}})).await;
    let (_, row) = s.call("GET", &format!("/v1/sandboxes/{forgotten}"), None).await;
    assert!(row["expiresAt"].is_null(), "an omitted timeout is no expiry: {row}");
    let expiring = make(json!({"image": {"uri": "fake"}, "timeout": 600})).await;
    let working = make(json!({"image": {"uri": "fake"}})).await;
    let used = make(json!({"image": {"uri": "fake"}})).await;
    let (status, ws) =
        s.call("POST", "/v1/workspaces/idle-thread/acquire", Some(json!({"image": {"uri": "fake"}}))).await;
    assert_eq!(status, StatusCode::OK, "{ws}");
    let thread_box = ws["id"].as_str().unwrap().to_owned();
    let (status, _) = s
        .call("POST", &Server::execd(&working, "/command"), Some(json!({"command": "sleep 30", "background": true})))
        .await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(s.call("GET", &Server::execd(&used, "/ping"), None).await.0, StatusCode::OK);
    paddock_server::lifecycle::reap_idle(&s.state, Duration::from_secs(1)).await;
    assert!(gone(&s, &forgotten).await, "a sandbox without expiry nobody used is deleted");
    assert!(gone(&s, &thread_box).await, "a thread's idle sandbox is released");
    assert!(!gone(&s, &expiring).await, "a sandbox with an expiry keeps it");
    assert!(!gone(&s, &working).await, "a sandbox with a command running is not idle");
    assert!(!gone(&s, &used).await, "a sandbox used just now is not idle");
    // The thread's workspace was kept: acquiring it again gives a new sandbox on it.
    let (status, again) =
        s.call("POST", "/v1/workspaces/idle-thread/acquire", Some(json!({"image": {"uri": "fake"}}))).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    s.call("DELETE", &format!("/v1/sandboxes/{working}"), None).await;
}

async fn gone(s: &Server, id: &str) -> bool {
    s.call("GET", &format!("/v1/sandboxes/{id}"), None).await.0 == StatusCode::NOT_FOUND
}
