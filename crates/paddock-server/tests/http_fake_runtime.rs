//! The server's HTTP behaviour against `FakeRuntime` (no isolation: see `fake/mod.rs`), so it
//! runs without root or a cluster: lifecycle, streamed commands, files, the errors a runtime's
//! limits become, and capabilities. The privileged suite (`crates/paddock/tests/server.rs`)
//! covers the same API on real sandboxes.

mod fake;

use std::time::Duration;

use axum::http::StatusCode;
use fake::server::{Server, assert_error};
use serde_json::{Value, json};

#[tokio::test]
async fn fake_runtime_capabilities_come_from_the_runtime() {
    let s = Server::new().await;
    let (status, caps) = s.call("GET", "/v1/capabilities", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((caps["runtime"].as_str(), caps["pause"].as_bool()), (Some("fake"), Some(false)), "{caps}");
    let (status, doc) = s.call("GET", "/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["paths"]["/capabilities"]["get"].is_object(), "capabilities are documented");
    // The lifecycle routes too: the API fuzz run (e2e/fuzz/run) only reaches what is documented.
    for (path, method) in
        [("/sandboxes", "post"), ("/sandboxes/{id}", "delete"), ("/sandboxes/{id}/renew-expiration", "post")]
    {
        assert!(doc["paths"][path][method].is_object(), "{method} {path} is not documented");
    }
    assert!(doc["components"]["schemas"]["CreateRequest"].is_object());
    // Each sandbox's execd routes, as the server proxies them, and the volume routes.
    for (path, method) in [
        ("/sandboxes/{id}/proxy/44772/command", "post"),
        ("/sandboxes/{id}/proxy/44772/files/upload", "post"),
        ("/sandboxes/{id}/proxy/44772/code/contexts/{context}", "delete"),
        ("/sandboxes/{id}/proxy/44772/session/{session}/run", "post"),
        ("/volumes/{name}", "delete"),
    ] {
        assert!(doc["paths"][path][method].is_object(), "{method} {path} is not documented");
    }
    // Readable without the key, at /v1 and at the root, like /health.
    for uri in ["/v1/openapi.json", "/openapi.json"] {
        let (status, plain) = s.with_headers("GET", uri, &[]).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert_eq!(plain, doc);
    }
    let (status, _) = s.with_headers("GET", "/v1/capabilities", &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "only the document is open");
}

#[tokio::test]
async fn fake_runtime_images_and_pause_it_cannot_serve_are_400_in_its_own_words() {
    let s = Server::new().await;
    let (status, body) = s.call("POST", "/v1/sandboxes", Some(json!({"image": {"uri": "python:3.11"}}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&body, "NOT_SUPPORTED");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("fake runtime") && !message.contains("local"), "the runtime's words: {message}");
    let id = s.create().await;
    let (status, body) = s.call("POST", &format!("/v1/sandboxes/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error(&body, "NOT_SUPPORTED");
    let (_, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(info["status"]["state"], "Running", "a refused pause changes nothing: {info}");
}

#[tokio::test]
async fn fake_runtime_commands_stream_events_with_exit_codes() {
    let s = Server::new().await;
    let id = s.create().await;
    let body = serde_json::to_vec(&json!({"command": "echo out; echo err >&2; exit 3"})).unwrap();
    let (status, events) = s.raw("POST", &Server::execd(&id, "/command"), "application/json", body).await;
    assert_eq!(status, StatusCode::OK);
    let events: Vec<Value> = String::from_utf8(events)
        .unwrap()
        .split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let json = f.trim().strip_prefix("data:").unwrap_or(f).trim();
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{f:?}: {e}"))
        })
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"init"), "{events:?}");
    assert!(events.iter().any(|e| e["type"] == "stdout" && e["text"] == "out"), "{events:?}");
    assert!(events.iter().any(|e| e["type"] == "stderr" && e["text"] == "err"), "{events:?}");
    let last = events.last().unwrap();
    assert_eq!((last["type"].as_str(), last["error"]["evalue"].as_str()), (Some("error"), Some("3")), "{last}");
}

#[tokio::test]
async fn fake_runtime_files_round_trip_and_errors_are_typed() {
    let s = Server::new().await;
    let id = s.create().await;
    let boundary = "XyZ";
    let mut form = Vec::new();
    form.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n").as_bytes(),
    );
    form.extend_from_slice(br#"{"path": "/workspace/d/a.txt", "mode": 600}"#);
    form.extend_from_slice(format!("\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
    form.extend_from_slice(b"hello\x00bytes");
    form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let ct = format!("multipart/form-data; boundary={boundary}");
    let (status, out) = s.raw("POST", &Server::execd(&id, "/files/upload"), &ct, form).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let (status, back) =
        s.raw("GET", &Server::execd(&id, "/files/download?path=/workspace/d/a.txt"), "application/json", vec![]).await;
    assert_eq!((status, back.as_slice()), (StatusCode::OK, &b"hello\x00bytes"[..]));
    let (_, info) = s.call("GET", &Server::execd(&id, "/files/info?path=/workspace/d/a.txt"), None).await;
    assert_eq!(info["/workspace/d/a.txt"]["mode"], 600, "{info}");
    let (status, body) = s.call("GET", &Server::execd(&id, "/files/download?path=/workspace/none"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "FILE_NOT_FOUND");
    let (status, body) = s.call("GET", &Server::execd(&id, "/files/download?path=/etc/hostname"), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_error(&body, "PERMISSION_DENIED");
}

#[tokio::test]
async fn fake_runtime_replace_refuses_to_grow_a_file_beyond_its_memory_bound() {
    let s = Server::new().await;
    let id = s.create().await;
    let body = serde_json::to_vec(&json!({"command": "head -c 1000000 /dev/zero | tr '\\0' a > big"})).unwrap();
    let (status, _) = s.raw("POST", &Server::execd(&id, "/command"), "application/json", body).await;
    assert_eq!(status, StatusCode::OK);
    // A million matches each replaced by 100 bytes would need 100 MB.
    let (status, body) = s
        .call(
            "POST",
            &Server::execd(&id, "/files/replace"),
            Some(json!({"/workspace/big": {"old": "a", "new": "b".repeat(100)}})),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_error(&body, "FILE_TOO_LARGE");
}

#[tokio::test]
async fn fake_runtime_metrics_come_from_the_runtime() {
    let s = Server::new().await;
    let id = s.create().await;
    let (status, m) = s.call("GET", &Server::execd(&id, "/metrics"), None).await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert_eq!(m["mem_used_mib"], 64.0, "{m}");
    let cpu = m["cpu_used_pct"].as_f64().unwrap();
    assert!((20.0..30.0).contains(&cpu), "the fake burns a quarter CPU, read {cpu}");
}

#[tokio::test]
async fn fake_runtime_workspaces_keep_files_across_release() {
    let s = Server::new().await;
    let (status, first) =
        s.call("POST", "/v1/workspaces/thread-1/acquire", Some(json!({"image": {"uri": "fake"}}))).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    let body = serde_json::to_vec(&json!({"command": "echo kept > note"})).unwrap();
    s.raw("POST", &Server::execd(&id, "/command"), "application/json", body).await;
    assert_eq!(s.call("POST", "/v1/workspaces/thread-1/release", None).await.0, StatusCode::NO_CONTENT);
    let (_, second) = s.call("POST", "/v1/workspaces/thread-1/acquire", Some(json!({"image": {"uri": "fake"}}))).await;
    let id2 = second["id"].as_str().unwrap().to_owned();
    assert_ne!(id, id2, "a released thread gets a new sandbox");
    let (status, back) =
        s.raw("GET", &Server::execd(&id2, "/files/download?path=/workspace/note"), "application/json", vec![]).await;
    assert_eq!((status, back.as_slice()), (StatusCode::OK, &b"kept\n"[..]));
}

#[tokio::test]
async fn fake_runtime_health_reports_a_runtime_that_cannot_work() {
    let s = Server::new().await;
    let (status, body) = s.call("GET", "/health", None).await;
    assert_eq!((status, &body["runtime"]["ok"]), (StatusCode::OK, &json!(true)), "{body}");
    s.rt.set_health(Some(paddock_core::runtime::RuntimeError::Exhausted(
        "the disk of the data directory is full".into(),
    )));
    let (status, body) = s.call("GET", "/health", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["runtime"]["ok"], json!(false));
    assert!(body["problems"].to_string().contains("disk of the data directory is full"), "{body}");
    s.rt.set_health(None);
    assert_eq!(s.call("GET", "/health", None).await.0, StatusCode::OK);
}

#[tokio::test]
async fn fake_runtime_a_hung_sandbox_costs_a_timeout_not_a_hung_request() {
    let s = Server::new().await;
    let (hung, fine) = (s.create().await, s.create().await);
    s.rt.hang_files(&hung);
    let started = std::time::Instant::now();
    let (status, body) = s.call("GET", &Server::execd(&hung, "/files/info?path=/workspace"), None).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_error(&body, "TIMEOUT");
    assert!(started.elapsed() < Duration::from_secs(10), "the deadline (2 s here) was not applied");
    let (status, body) = s.call("GET", &Server::execd(&fine, "/files/info?path=/workspace"), None).await;
    assert_eq!(status, StatusCode::OK, "another sandbox keeps working: {body}");
}

#[tokio::test]
async fn fake_runtime_workspace_caps_default_to_the_servers_and_are_set_per_sandbox() {
    use paddock_core::runtime::{Runtime, SandboxId};
    let s = Server::new().await;
    let resources = |id: String| {
        let rt = s.rt.clone();
        async move { rt.get(&SandboxId::parse(&id).unwrap()).await.unwrap().spec.resources }
    };
    // The server names no size (no --workspace-size): the runtime's default applies, as the
    // Kubernetes runtime's --workspace-pvc-size does.
    let r = resources(s.create().await).await;
    assert_eq!((r.workspace_bytes, r.workspace_inodes), (Some(96 << 20), paddock_core::spec::DEFAULT_WORKSPACE_INODES));
    let sized = Server::with_config(|c| c.workspace_bytes = Some(32 << 20)).await;
    let id = SandboxId::parse(&sized.create().await).unwrap();
    assert_eq!(
        sized.rt.get(&id).await.unwrap().spec.resources.workspace_bytes,
        Some(32 << 20),
        "the server's flag wins"
    );
    let body = json!({"image": {"uri": "fake"}, "entrypoint": ["true"], "timeout": 600,
        "resourceLimits": {"workspace": "64Mi", "workspace-inodes": "5000"}});
    let (status, created) = s.call("POST", "/v1/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let r = resources(created["id"].as_str().unwrap().to_owned()).await;
    assert_eq!((r.workspace_bytes, r.workspace_inodes), (Some(64 << 20), 5000));
    for (k, v) in [("workspace", "lots"), ("workspace-inodes", "-1"), ("workspace", "1Ki"), ("workspace-inodes", "3")] {
        let body = json!({"image": {"uri": "fake"}, "entrypoint": ["true"], "resourceLimits": {k: v}});
        let (status, err) = s.call("POST", "/v1/sandboxes", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{k}={v}: {err}");
        assert!(err["message"].as_str().unwrap().contains("workspace"), "{k}={v}: {err}");
    }
}

#[tokio::test]
async fn fake_runtime_path_parameters_are_typed_with_json_errors_on_every_route_family() {
    let s = Server::new().await;
    let id = s.create().await;
    // A segment that is not UTF-8 once decoded: a `{code, message}` 400, never axum's plain text.
    for uri in [
        "/v1/sandboxes/%FF".to_owned(),
        "/v1/sandboxes/%FF/credential-vault".to_owned(),
        "/v1/sandboxes/%FF/networkpolicy".to_owned(),
        "/v1/sandboxes/%FF/endpoints/8080".to_owned(),
        "/v1/workspaces/%FF/release".to_owned(),
        "/v1/runs/%FF".to_owned(),
        format!("/v1/sandboxes/{id}/credential-vault/bindings/%FF"),
        format!("/v1/sandboxes/{id}/proxy/44772/command/status/%FF"),
        format!("/v1/sandboxes/{id}/proxy/44772/code/contexts/%FF"),
    ] {
        let method = if uri.contains("/release") { "POST" } else { "GET" };
        let (status, body) = s.call(method, &uri, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}: {body}");
        assert!(body["message"].as_str().is_some_and(|m| m.contains("invalid path")), "{uri}: {body}");
    }
    // A sandbox that does not exist is the same 404 under every route that names one, in the
    // lifecycle API, the egress and vault APIs, execd and the port proxy.
    let gone = "sbx-000000000000";
    for (method, path) in [
        ("GET", ""),
        ("POST", "/pause"),
        ("GET", "/networkpolicy"),
        ("GET", "/egress"),
        ("GET", "/credential-vault/credentials"),
        ("GET", "/endpoints/8080"),
        ("POST", "/signatures/revoke"),
        ("GET", "/proxy/44772/ping"),
        ("GET", "/proxy/44772/command/status/x"),
        ("GET", "/proxy/8080/"),
    ] {
        let uri = format!("/v1/sandboxes/{gone}{path}");
        let (status, body) = s.call(method, &uri, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {uri}: {body}");
        assert!(body["message"].as_str().is_some_and(|m| m.contains("GET /v1/sandboxes")), "{uri}: {body}");
    }
    // And the sandbox that does exist is found by each of them.
    let (status, body) = s.call("GET", &format!("/v1/sandboxes/{id}/proxy/44772/command/status/x"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no such command, in the sandbox that exists: {body}");
    assert!(!body["message"].as_str().unwrap_or_default().contains("GET /v1/sandboxes"), "{body}");
}
