//! A server on a `FakeRuntime`, driven in-process through its router.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use paddock_server::ServerConfig;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::FakeRuntime;

const KEY: &str = "test-key";

pub struct Server {
    app: Router,
    /// Where the runs' gateway listens.
    pub gateway: std::net::SocketAddr,
    /// The server's state, for calling its background work directly.
    pub state: paddock_server::state::AppState,
    pub rt: Arc<FakeRuntime>,
    _data: tempfile::TempDir,
}

impl Server {
    pub async fn new() -> Self {
        Self::with_config(|_| {}).await
    }

    /// A server whose configuration `change` adjusts first.
    pub async fn with_config(change: impl FnOnce(&mut ServerConfig)) -> Self {
        Self::on(FakeRuntime::new(), change).await
    }

    /// A server on `rt` (a fake set up some way), its configuration adjusted by `change`.
    pub async fn on(rt: FakeRuntime, change: impl FnOnce(&mut ServerConfig)) -> Self {
        let data = tempfile::tempdir().unwrap();
        let rt = Arc::new(rt);
        let mut config = Self::config(data.path());
        change(&mut config);
        let state = paddock_server::build_state(config, rt.clone()).await.unwrap();
        paddock_server::start_background(&state).await;
        let gateway = state.runs.gateway_addr().unwrap();
        Self { app: paddock_server::app(state.clone()), gateway, state, rt, _data: data }
    }

    /// The server's data directory (its database is `server.db` there).
    pub fn data_dir(&self) -> &std::path::Path {
        self._data.path()
    }

    /// The same data directory and runtime under a new server, as after a restart.
    pub async fn restarted(self) -> Self {
        let config = Self::config(self._data.path());
        let state = paddock_server::build_state(config, self.rt.clone()).await.unwrap();
        paddock_server::start_background(&state).await;
        let gateway = state.runs.gateway_addr().unwrap();
        Self { app: paddock_server::app(state.clone()), gateway, state, rt: self.rt, _data: self._data }
    }

    fn config(data: &std::path::Path) -> ServerConfig {
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data.to_path_buf(),
            api_key: Some(KEY.into()),
            api_key_location: format!("the file {}", data.join("api-key").display()),
            default_timeout: Some(Duration::from_secs(3600)),
            idle_timeout: None,
            max_timeout: Duration::from_secs(7200),
            allow_no_expiry: true,
            max_upload_bytes: 1 << 20,
            header_timeout: Duration::from_secs(30),
            max_connections: 64,
            max_connections_per_peer: 64,
            max_request_memory: paddock_server::config::DEFAULT_REQUEST_MEMORY,
            workspace_bytes: None,
            workspace_inodes: paddock_core::spec::DEFAULT_WORKSPACE_INODES,
            default_network: Default::default(),
            sandbox_domain: None,
            runs: paddock_server::runs::RunOptions::for_tests(),
            llm: None,
            tunnels: Default::default(),
            tenants_file: None,
            deadlines: paddock_server::deadline::Deadlines {
                call: Duration::from_secs(2),
                lifecycle: Duration::from_secs(10),
                stream_idle: Duration::from_secs(2),
            },
        }
    }

    pub async fn raw(&self, method: &str, uri: &str, content_type: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("open-sandbox-api-key", KEY)
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap();
        let res = self.app.clone().oneshot(req).await.unwrap();
        let status = res.status();
        (status, res.into_body().collect().await.unwrap().to_bytes().to_vec())
    }

    /// A request with the API key, these headers and this body.
    pub async fn request(
        &self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, Vec<u8>) {
        let mut all = vec![("open-sandbox-api-key", KEY)];
        all.extend_from_slice(headers);
        self.bare(method, uri, &all, body).await
    }

    /// A request with exactly these headers and this body (no API key unless given).
    pub async fn bare(
        &self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, Vec<u8>) {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = self.app.clone().oneshot(req.body(Body::from(body)).unwrap()).await.unwrap();
        let status = res.status();
        (status, res.into_body().collect().await.unwrap().to_bytes().to_vec())
    }

    /// A request with exactly these headers (no API key unless given), for direct mode.
    pub async fn with_headers(&self, method: &str, uri: &str, headers: &[(&str, &str)]) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = self.app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        let status = res.status();
        let out = res.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&out).unwrap_or(Value::Null))
    }

    /// A JSON request with exactly these headers (no API key unless given).
    pub async fn without_key(
        &self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(uri).header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res =
            self.app.clone().oneshot(req.body(Body::from(serde_json::to_vec(body).unwrap())).unwrap()).await.unwrap();
        let status = res.status();
        let out = res.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&out).unwrap_or(Value::Null))
    }

    pub async fn call(&self, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let bytes = body.map(|b| serde_json::to_vec(&b).unwrap()).unwrap_or_default();
        let (status, out) = self.raw(method, uri, "application/json", bytes).await;
        (status, serde_json::from_slice(&out).unwrap_or(Value::Null))
    }

    /// The server's router, for requests the helpers here cannot make (a body that trickles).
    pub fn router(&self) -> Router {
        self.app.clone()
    }

    pub async fn create(&self) -> String {
        let (status, body) = self.call("POST", "/v1/sandboxes", Some(json!({"image": {"uri": "fake"}}))).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// Every method and path of the server's OpenAPI document served on this listener (the
    /// runs' gateway has servers of its own), as `(METHOD, /v1 + template)`.
    pub async fn openapi_routes(&self) -> Vec<(String, String)> {
        let (status, doc) = self.call("GET", "/v1/openapi.json", None).await;
        assert_eq!(status, StatusCode::OK, "{doc}");
        let mut routes = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("the document lists paths") {
            for method in ["get", "put", "post", "patch", "delete"] {
                if item.get(method).is_some_and(|op| op.get("servers").is_none()) {
                    routes.push((method.to_uppercase(), format!("/v1{path}")));
                }
            }
        }
        routes
    }

    pub fn execd(id: &str, path: &str) -> String {
        format!("/v1/sandboxes/{id}/proxy/44772{path}")
    }
}

/// Every error is `{code, message}` with a non-empty message.
pub fn assert_error(body: &Value, code: &str) {
    assert_eq!(body["code"], code, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
}
