//! Tenants against `FakeRuntime` (no isolation: see `fake/mod.rs`): tenant B's key walks every
//! route of the OpenAPI document against tenant A's objects and finds nothing of them; quotas
//! refuse with 429 and the quota's name.

mod fake;

use axum::http::StatusCode;
use fake::server::{Server, assert_error};
use paddock_server::tenants::{self, Quotas};
use serde_json::{Value, json};

async fn as_tenant(s: &Server, key: &str, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let headers = [("open-sandbox-api-key", key), ("content-type", "application/json")];
    let bytes = body.map(|b| serde_json::to_vec(&b).unwrap()).unwrap_or_default();
    let (status, out) = s.bare(method, uri, &headers, bytes).await;
    (status, serde_json::from_slice(&out).unwrap_or(Value::Null))
}

/// Every method and path of the OpenAPI document (and the proxied egress and vault routes),
/// each parameter filled with one of A's objects.
async fn every_route(s: &Server, fill: &dyn Fn(&str) -> String) -> Vec<(String, String)> {
    let mut routes: Vec<(String, String)> =
        s.openapi_routes().await.into_iter().map(|(m, p)| (m, format!("/v1{}", fill(&p["/v1".len()..])))).collect();
    for rest in ["policy", "credential-vault", "credential-vault/credentials", "credential-vault/bindings/b1"] {
        for method in ["GET", "PUT", "POST", "PATCH", "DELETE"] {
            routes.push((method.into(), fill(&format!("/v1/sandboxes/{{id}}/proxy/18080/{rest}"))));
        }
    }
    for method in ["GET", "POST", "DELETE"] {
        routes.push((method.into(), fill("/v1/sandboxes/{id}/proxy/8080/anything")));
    }
    routes
}

#[tokio::test]
async fn fake_runtime_tenant_b_finds_nothing_of_tenant_a_on_any_route() {
    let s = Server::new().await;
    let pool = s.state.store.pool().clone();
    let ka = tenants::add(&pool, "alpha", &Quotas::default()).await.unwrap();
    let kb = tenants::add(&pool, "beta", &Quotas::default()).await.unwrap();

    // Tenant A's objects: a sandbox, a thread's sandbox, a run, an evaluation.
    let (status, a) = as_tenant(&s, &ka, "POST", "/v1/sandboxes", Some(json!({"image": {"uri": "fake"}}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{a}");
    let id_a = a["id"].as_str().unwrap().to_owned();
    let (status, w) = as_tenant(&s, &ka, "POST", "/v1/workspaces/shared/acquire", None).await;
    assert_eq!(status, StatusCode::OK, "{w}");
    let id_w = w["id"].as_str().unwrap().to_owned();
    assert_eq!(w["workspace"]["thread"], "shared", "a tenant sees its own name of its workspace: {w}");
    let long = json!({"image": "fake", "command": ["sh", "-c", "sleep 60"], "tier": "batch"});
    let (status, run) = as_tenant(&s, &ka, "POST", "/v1/runs", Some(long.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let run_a = run["id"].as_str().unwrap().to_owned();
    let (status, eval) = as_tenant(
        &s,
        &ka,
        "POST",
        "/v1/evaluations",
        Some(json!({"tasks": [{"image": "fake", "command": ["sh", "-c", "sleep 60"]}]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{eval}");
    let eval_a = eval["id"].as_str().unwrap().to_owned();
    let (status, keyed) = as_tenant(&s, &ka, "POST", "/v1/runs", Some(long.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{keyed}");
    let secrets_of_a = [id_a.clone(), id_w.clone(), run_a.clone(), eval_a.clone()];

    let fill = |path: &str| -> String {
        let id = if path.starts_with("/runs/") {
            &run_a
        } else if path.starts_with("/evaluations/") {
            &eval_a
        } else {
            &id_a
        };
        let mut out = path.replace("{id}", id).replace("{thread}", "shared").replace("{port}", "44772");
        while let Some(start) = out.find('{') {
            let end = out[start..].find('}').map_or(out.len(), |e| start + e + 1);
            out.replace_range(start..end, "p1");
        }
        out
    };
    let routes = every_route(&s, &fill).await;
    assert!(routes.len() > 80, "the walk covers the whole API: {}", routes.len());
    let mut walked = 0;
    for (method, path) in &routes {
        let (status, answer) = as_tenant(&s, &kb, method, path, Some(json!({}))).await;
        let text = answer.to_string();
        // Nothing of A's but what the caller itself named (a 404 may repeat the id asked for).
        for secret in secrets_of_a.iter().filter(|x| !path.contains(x.as_str())) {
            assert!(!text.contains(secret.as_str()), "{method} {path} -> {status}: shows A's {secret}: {text}");
        }
        let names_a = secrets_of_a.iter().any(|x| path.contains(x.as_str()));
        if names_a {
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path} with B's key: {answer}");
            assert!(answer["code"].is_string() && answer["message"].is_string(), "{method} {path}: {answer}");
            walked += 1;
        }
    }
    assert!(walked > 40, "routes naming A's objects: {walked}");

    // Everything of A's is as it was, and A still reaches it.
    let (status, got) = as_tenant(&s, &ka, "GET", &format!("/v1/sandboxes/{id_a}"), None).await;
    assert_eq!((status, got["status"]["state"].as_str()), (StatusCode::OK, Some("Running")), "{got}");
    let (status, got) = as_tenant(&s, &ka, "GET", &format!("/v1/sandboxes/{id_w}"), None).await;
    assert_eq!((status, got["status"]["state"].as_str()), (StatusCode::OK, Some("Running")), "{got}");
    let (status, got) = as_tenant(&s, &ka, "GET", &format!("/v1/runs/{run_a}"), None).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_ne!(got["state"], "cancelled", "B cancelled A's run: {got}");
    let (_, listed) = as_tenant(&s, &ka, "GET", "/v1/sandboxes", None).await;
    let ids: Vec<&str> = listed["items"].as_array().unwrap().iter().filter_map(|i| i["id"].as_str()).collect();
    assert!(ids.contains(&id_a.as_str()) && ids.contains(&id_w.as_str()), "{listed}");
    // B's own workspace of the same name is another one.
    let (status, wb) = as_tenant(&s, &kb, "POST", "/v1/workspaces/shared/acquire", None).await;
    assert_eq!(status, StatusCode::OK, "{wb}");
    assert_ne!(wb["id"], id_w.as_str());
    // The server's own key is a tenant too (`default`): it sees none of A's either.
    let (_, listed) = s.call("GET", "/v1/sandboxes", None).await;
    assert!(!listed.to_string().contains(&id_a), "{listed}");
    let (status, err) = s.call("GET", &format!("/v1/runs/{run_a}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    // An idempotency key is the tenant's own: B's same key is B's run.
    let (_, r1) = s
        .bare(
            "POST",
            "/v1/runs",
            &[("open-sandbox-api-key", &ka), ("content-type", "application/json"), ("idempotency-key", "k1")],
            serde_json::to_vec(&long).unwrap(),
        )
        .await;
    let (_, r2) = s
        .bare(
            "POST",
            "/v1/runs",
            &[("open-sandbox-api-key", &kb), ("content-type", "application/json"), ("idempotency-key", "k1")],
            serde_json::to_vec(&long).unwrap(),
        )
        .await;
    let (r1, r2): (Value, Value) = (serde_json::from_slice(&r1).unwrap(), serde_json::from_slice(&r2).unwrap());
    assert_ne!(r1["id"], r2["id"], "B got A's run by its idempotency key: {r1} {r2}");
    for key in [&ka, &kb] {
        let (_, runs) = as_tenant(&s, key, "GET", "/v1/runs", None).await;
        for r in runs["items"].as_array().unwrap() {
            as_tenant(&s, key, "POST", &format!("/v1/runs/{}/cancel", r["id"].as_str().unwrap()), None).await;
        }
    }
}

#[tokio::test]
async fn fake_runtime_quotas_refuse_with_429_naming_the_quota_and_keys_rotate() {
    let s = Server::new().await;
    let pool = s.state.store.pool().clone();
    let quotas = Quotas {
        sandboxes: Some(2),
        memory_bytes: Some(3 << 30),
        runs: [("batch".to_owned(), 1)].into(),
        ..Default::default()
    };
    let k = tenants::add(&pool, "small", &quotas).await.unwrap();
    let create = |mem: &str| json!({"image": {"uri": "fake"}, "resourceLimits": {"memory": mem}});
    let (status, first) = as_tenant(&s, &k, "POST", "/v1/sandboxes", Some(create("2Gi"))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let (status, err) = as_tenant(&s, &k, "POST", "/v1/sandboxes", Some(create("2Gi"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{err}");
    assert_error(&err, "QUOTA_EXCEEDED");
    assert!(err["message"].as_str().unwrap().contains("quota memory"), "{err}");
    let (status, second) = as_tenant(&s, &k, "POST", "/v1/sandboxes", Some(create("512Mi"))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{second}");
    let (status, err) = as_tenant(&s, &k, "POST", "/v1/sandboxes", Some(create("64Mi"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{err}");
    assert!(err["message"].as_str().unwrap().contains("quota sandboxes"), "{err}");
    // Deleting one makes room again.
    let (status, _) =
        as_tenant(&s, &k, "DELETE", &format!("/v1/sandboxes/{}", first["id"].as_str().unwrap()), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, third) = as_tenant(&s, &k, "POST", "/v1/sandboxes", Some(create("64Mi"))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{third}");
    // Runs per tier.
    let run = json!({"image": "fake", "command": ["sh", "-c", "sleep 60"], "tier": "batch"});
    let (status, r) = as_tenant(&s, &k, "POST", "/v1/runs", Some(run.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let (status, err) = as_tenant(&s, &k, "POST", "/v1/runs", Some(run)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{err}");
    assert!(err["message"].as_str().unwrap().contains("quota runs.batch"), "{err}");
    as_tenant(&s, &k, "POST", &format!("/v1/runs/{}/cancel", r["id"].as_str().unwrap()), None).await;
    // A tenant mounts no host path.
    let host = json!({"image": {"uri": "fake"}, "volumes": [{"name": "h", "mountPath": "/mnt/h", "host": {"path": "/var/tmp"}}]});
    let (status, err) = as_tenant(&s, &k, "POST", "/v1/sandboxes", Some(host)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    assert_error(&err, "HOST_VOLUME_FORBIDDEN");
    // The refusals are on /metrics, per tenant.
    let (_, metrics) = s.raw("GET", "/metrics", "text/plain", Vec::new()).await;
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(metrics.contains(r#"paddock_quota_refusals_total{tenant="small",quota="sandboxes"} 1"#), "{metrics}");

    // A rotated key works for its grace; one rotated without grace stops at once.
    let k2 = tenants::rotate(&pool, "small", std::time::Duration::from_secs(60)).await.unwrap();
    for key in [&k, &k2] {
        let (status, body) = as_tenant(&s, key, "GET", "/v1/sandboxes", None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let k3 = tenants::rotate(&pool, "small", std::time::Duration::ZERO).await.unwrap();
    let (status, body) = as_tenant(&s, &k3, "GET", "/v1/sandboxes", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The server reads its tenants again every 2 s; a key that no longer works is refused then.
    tokio::time::sleep(paddock_server::tenants::RELOAD_EVERY + std::time::Duration::from_millis(500)).await;
    let (status, body) = as_tenant(&s, &k2, "GET", "/v1/sandboxes", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_error(&body, "INVALID_API_KEY");
    tenants::remove(&pool, "small").await.unwrap();
    tokio::time::sleep(paddock_server::tenants::RELOAD_EVERY + std::time::Duration::from_millis(500)).await;
    let (status, _) = as_tenant(&s, &k3, "GET", "/v1/sandboxes", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn fake_runtime_a_vault_at_create_on_a_runtime_without_one_is_a_clear_400_and_nothing_is_made() {
    let s = Server::new().await;
    let vault = json!({"credentials": [{"name": "t", "source": {"value": "v"}}], "bindings": []});
    for body in [
        json!({"image": {"uri": "fake"}, "credentialVault": vault}),
        json!({"image": {"uri": "fake"}, "extensions": {"paddock.credentialVault": vault.to_string()}}),
    ] {
        let (status, err) = s.call("POST", "/v1/sandboxes", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
        assert!(err["message"].as_str().unwrap().contains("credentialVault"), "{err}");
    }
    let both =
        json!({"image": {"uri": "fake"}, "credentialVault": vault, "extensions": {"paddock.credentialVault": "{}"}});
    let (status, err) = s.call("POST", "/v1/sandboxes", Some(both)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let (_, listed) = s.call("GET", "/v1/sandboxes", None).await;
    assert_eq!(listed["items"], json!([]), "{listed}");
}
