//! What a sandbox's own token may do, route by route, against `FakeRuntime` (no isolation: see
//! `fake/mod.rs`). Whoever holds that token runs code in the sandbox, so it must never change
//! what the sandbox may reach, nor touch the server's lifecycle, runs or other sandboxes.

mod fake;

use axum::http::StatusCode;
use fake::server::{Server, assert_error};
use serde_json::json;

/// Every method and path of the server's OpenAPI document with its parameters filled in for
/// sandbox `id`, plus the egress sidecar's routes (served on port 18080 through the proxy).
async fn every_route(s: &Server, id: &str) -> Vec<(String, String)> {
    let mut routes: Vec<(String, String)> =
        s.openapi_routes().await.into_iter().map(|(m, p)| (m, format!("/v1{}", fill(&p["/v1".len()..], id)))).collect();
    for method in ["GET", "PUT", "POST", "PATCH", "DELETE"] {
        routes.push((method.into(), format!("/v1/sandboxes/{id}/proxy/18080/policy")));
    }
    // The vault changes what the sandbox's requests carry: every method on each of its paths.
    for rest in [
        "credential-vault",
        "credential-vault/credentials",
        "credential-vault/credentials/p1",
        "credential-vault/bindings",
        "credential-vault/bindings/p1",
    ] {
        for method in ["GET", "PUT", "POST", "PATCH", "DELETE"] {
            routes.push((method.into(), format!("/v1/sandboxes/{id}/proxy/18080/{rest}")));
        }
    }
    routes
}

/// `{id}` is the sandbox, `{port}` a port of it, any other parameter a name that exists nowhere.
fn fill(path: &str, id: &str) -> String {
    let mut out = path.replace("{id}", id).replace("{port}", "8080");
    while let Some(start) = out.find('{') {
        let end = out[start..].find('}').map_or(out.len(), |e| start + e + 1);
        out.replace_range(start..end, "p1");
    }
    out
}

#[tokio::test]
async fn fake_runtime_a_sandbox_token_reaches_only_its_own_sandbox_and_never_its_egress() {
    let s = Server::new().await;
    let body = json!({"image": {"uri": "fake"}, "networkPolicy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "allowed.test"}]}});
    let (status, created) = s.call("POST", "/v1/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let (_, execd) = s.call("GET", &format!("/v1/sandboxes/{id}/endpoints/44772"), None).await;
    let token = execd["headers"]["x-paddock-sandbox-token"].as_str().unwrap().to_owned();

    let mut may = Vec::new();
    for (method, path) in every_route(&s, &id).await {
        let (status, answer) = s
            .with_headers(&method, &path, &[("x-paddock-sandbox-token", &token), ("content-type", "application/json")])
            .await;
        if status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN {
            may.push(format!("{method} {path} -> {}", status.as_u16()));
            continue;
        }
        assert!(answer["code"].is_string() && answer["message"].is_string(), "{method} {path}: {answer}");
    }
    // The list, for whoever reads the test's output: what a sandbox token opens.
    println!("a sandbox token may call:\n  {}", may.join("\n  "));
    let own = format!("/v1/sandboxes/{id}/proxy/");
    for line in &may {
        let (method, rest) = line.split_once(' ').unwrap();
        assert!(rest.starts_with(&own), "a sandbox token opens a route outside its sandbox's proxy: {line}");
        if rest.starts_with(&format!("{own}18080")) {
            assert!(method == "GET", "a sandbox token may change its egress: {line}");
        }
    }
    assert!(may.iter().any(|l| l.contains("/proxy/44772/command")), "the token runs commands: {may:?}");
    assert!(
        may.iter().any(|l| l.starts_with("GET ") && l.contains("/proxy/18080/policy")),
        "and reads its policy: {may:?}"
    );

    // Opening the sandbox with a PUT through the sidecar is refused, and the policy is unchanged.
    let sidecar = format!("/v1/sandboxes/{id}/proxy/18080/policy");
    let (status, refused) = s.with_headers("PUT", &sidecar, &[("x-paddock-sandbox-token", &token)]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_error(&refused, "EGRESS_NEEDS_API_KEY");
    let (_, policy) = s.call("GET", &sidecar, None).await;
    assert_eq!(policy["policy"]["defaultAction"], "deny", "{policy}");

    // The endpoint of port 18080, asked for with the API key, carries a token that may change
    // the policy (the SDK's direct mode) and opens nothing else.
    let (_, egress) = s.call("GET", &format!("/v1/sandboxes/{id}/endpoints/18080"), None).await;
    let egress_token = egress["headers"]["x-execd-access-token"].as_str().unwrap().to_owned();
    assert_ne!(egress_token, token, "{egress}");
    let rule = json!([{"action": "allow", "target": "more.test"}]);
    let (status, changed) = s.without_key("PATCH", &sidecar, &[("x-execd-access-token", &egress_token)], &rule).await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["policy"]["egress"][0]["target"], "more.test", "{changed}");
    let (status, _) =
        s.with_headers("GET", &Server::execd(&id, "/ping"), &[("x-execd-access-token", &egress_token)]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the egress token runs no command");
    let other = s.create().await;
    let (status, _) = s
        .with_headers(
            "GET",
            &format!("/v1/sandboxes/{other}/proxy/18080/policy"),
            &[("x-execd-access-token", &egress_token)],
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "nor opens another sandbox's egress");
}

/// A signed endpoint of port 44772 as the path to its `/ping`.
async fn signed(s: &Server, id: &str, expires: u64) -> String {
    let (status, ep) = s.call("GET", &format!("/v1/sandboxes/{id}/endpoints/44772?expires={expires}"), None).await;
    assert_eq!(status, StatusCode::OK, "{ep}");
    let endpoint = ep["endpoint"].as_str().unwrap().to_owned();
    format!("/r/{}/ping", endpoint.rsplit_once("/r/").unwrap().1)
}

/// A signed link (to port 44772 it runs commands for up to a week) can be revoked: every link
/// of the sandbox made before stops working, its unused tickets too; links made after work.
#[tokio::test]
async fn fake_runtime_signed_links_and_tickets_of_a_sandbox_can_be_revoked() {
    let s = Server::new().await;
    let id = s.create().await;
    let expires = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let old = signed(&s, &id, expires).await;
    let (status, body) = s.with_headers("GET", &old, &[]).await;
    assert_eq!(status, StatusCode::OK, "a signed link runs execd with no key: {body}");
    let (_, ticket) = s.call("POST", &format!("/v1/sandboxes/{id}/tickets"), Some(json!({"port": 44772}))).await;
    let query = ticket["query"].as_str().unwrap().to_owned();

    // Revoking takes the API key, never a link of its own.
    let revoke = format!("/v1/sandboxes/{id}/signatures/revoke");
    assert_eq!(s.with_headers("POST", &revoke, &[]).await.0, StatusCode::UNAUTHORIZED);
    let (status, revoked) = s.call("POST", &revoke, None).await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert_eq!((revoked["signingEpoch"].as_i64(), revoked["ticketsDropped"].as_i64()), (Some(1), Some(1)), "{revoked}");

    let (status, body) = s.with_headers("GET", &old, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_error(&body, "INVALID_ROUTE_SIGNATURE");
    let (status, body) = s.with_headers("GET", &format!("/r/{id}-44772/ping?{query}"), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_error(&body, "INVALID_TICKET");
    let new = signed(&s, &id, expires).await;
    assert_ne!(new, old);
    assert_eq!(s.with_headers("GET", &new, &[]).await.0, StatusCode::OK, "a link made after works");
    // Revoked again: the newer one goes too.
    s.call("POST", &revoke, None).await;
    assert_eq!(s.with_headers("GET", &new, &[]).await.0, StatusCode::UNAUTHORIZED);
}
