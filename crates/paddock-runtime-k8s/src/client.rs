//! The Kubernetes client, built as kube's default one is but with `TCP_NODELAY`.
//!
//! kube's own stack leaves Nagle's algorithm on. A request/response connection barely notices,
//! but the agent's port-forward is one long-lived connection on which a command's HTTP/2
//! HEADERS and DATA frames leave as separate small writes: the second waited for the API
//! server's delayed ACK, 40 ms per command (measured: 45 ms of a 52 ms round trip).
//!
//! Two more differences, both against a race kube's stack loses now and then: the API server
//! closes a connection idle for 90 s, and hyper's pool kept idle connections for exactly 90 s,
//! so a request could go out on a connection the server was closing ("client error
//! (SendRequest)", seen failing a sandbox's kill in CI). Idle connections are dropped after
//! 60 s here, and a read that failed in transport is sent again on a fresh connection.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use hyper::header::UPGRADE;
use hyper::{Method, Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
use paddock_core::runtime::RuntimeError;
use tower::retry::{Policy, RetryLayer};
use tower::{BoxError, ServiceBuilder};

/// Shorter than the API server's 90 s idle timeout, so the client gives a connection up first.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// How often a request that failed in transport is sent again, and the pause before each.
const TRANSPORT_RETRIES: [Duration; 2] = [Duration::from_millis(20), Duration::from_millis(200)];

/// A client from the in-cluster service account, else `KUBECONFIG` / `~/.kube/config`.
pub async fn infer() -> Result<Client, RuntimeError> {
    let config = Config::infer().await.map_err(|e| {
        RuntimeError::Unavailable(format!("no Kubernetes configuration found (in-cluster or KUBECONFIG): {e}"))
    })?;
    from_config(config)
}

/// A client for the kubeconfig's context `context` (`KUBECONFIG` / `~/.kube/config`).
pub async fn for_context(context: &str) -> Result<Client, RuntimeError> {
    let options = kube::config::KubeConfigOptions { context: Some(context.to_owned()), ..Default::default() };
    let config = Config::from_kubeconfig(&options).await.map_err(|e| {
        RuntimeError::Unavailable(format!(
            "the kubeconfig context {context:?} cannot be used (see `kubectl config get-contexts`): {e}"
        ))
    })?;
    from_config(config)
}

/// A client for `config` (its cluster, credentials, proxy-less).
pub fn from_config(config: Config) -> Result<Client, RuntimeError> {
    let bad =
        |e: kube::Error| RuntimeError::InvalidArgument(format!("the Kubernetes configuration cannot be used: {e}"));
    if config.proxy_url.is_some() {
        // kube's own stack speaks to proxies; keep it (and Nagle) there.
        return Client::try_from(config).map_err(bad);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http).map_err(bad)?;
    // kube's own order: retries of 429/503/504 (honouring Retry-After) outside the
    // credentials, so a retried request is signed afresh.
    let retry = RetryLayer::new(Retry {
        server: RetryPolicy::server_retry(),
        statuses: config.default_retry,
        transport_attempts: 0,
    });
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .layer(retry)
        .option_layer(config.auth_layer().map_err(bad)?)
        .layer(config.extra_headers_layer().map_err(bad)?)
        .map_err(BoxError::from)
        .service(
            hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE)
                .pool_timer(TokioTimer::new())
                .build(https),
        );
    Ok(Client::new(service, config.default_namespace))
}

/// kube's server retry (429/503/504, when the configuration asks for it), plus a short retry of
/// requests that failed in transport: any read (`GET`, `HEAD`), since sending one twice is
/// harmless, and any request whose connection was never made, since nothing of it was sent.
/// An upgrade (`pods/exec`, `pods/portforward`) is a `GET` that starts something, so it is sent
/// again only in the second case: a command never runs twice.
#[derive(Clone)]
struct Retry {
    /// kube's policy: it retries the statuses (when `statuses`) and copies requests for any retry.
    server: RetryPolicy,
    statuses: bool,
    transport_attempts: usize,
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for Retry {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(&mut self, req: &mut Request<Body>, result: &mut Result<Response<Res>, BoxError>) -> Option<Self::Future> {
        match result {
            Err(e) => {
                let pause = TRANSPORT_RETRIES.get(self.transport_attempts).copied()?;
                if !transport_retry_is_safe(req, e) {
                    return None;
                }
                self.transport_attempts += 1;
                tracing::debug!(method = %req.method(), uri = %req.uri(), error = %e, "Kubernetes request failed in transport; sending it again");
                Some(Box::pin(tokio::time::sleep(pause)))
            }
            Ok(_) if self.statuses => {
                let sleep = Policy::<Request<Body>, Response<Res>, BoxError>::retry(&mut self.server, req, result)?;
                Some(Box::pin(sleep))
            }
            Ok(_) => None,
        }
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        // kube's copy: bodies that stream (none of the runtime's plain API calls) cannot be
        // sent twice.
        Policy::<Request<Body>, Response<Res>, BoxError>::clone_request(&mut self.server, req)
    }
}

/// Whether a request that ended in `error` (no response) may be sent again.
fn transport_retry_is_safe<B>(req: &Request<B>, error: &BoxError) -> bool {
    let Some(transport) = error.downcast_ref::<hyper_util::client::legacy::Error>() else {
        // Not the connection's failure (the credentials, say): another try changes nothing.
        return false;
    };
    let read = matches!(*req.method(), Method::GET | Method::HEAD) && !req.headers().contains_key(UPGRADE);
    transport.is_connect() || read
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::PostParams;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    const CONFIG_MAP: &str = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"default"}}"#;

    /// Reads one request (head and `Content-Length` body); `None` when the peer closed first.
    async fn read_request(conn: &mut TcpStream) -> Option<String> {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let length = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + length {
                    return head.lines().next().map(str::to_string);
                }
            }
            let n = conn.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn respond(conn: &mut TcpStream) {
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{CONFIG_MAP}",
            CONFIG_MAP.len()
        );
        conn.write_all(reply.as_bytes()).await.unwrap();
    }

    /// An API server that, like one closing an idle connection just as a request arrives,
    /// answers each connection's first request and drops the connection on its second,
    /// unanswered. It records every request line it read.
    async fn closing_server() -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let Some(first) = read_request(&mut conn).await else { return };
                    log.lock().unwrap().push(first);
                    respond(&mut conn).await;
                    if let Some(second) = read_request(&mut conn).await {
                        log.lock().unwrap().push(second);
                    }
                });
            }
        });
        (url, seen)
    }

    fn client(url: &str) -> Client {
        from_config(Config::new(url.parse().unwrap())).unwrap()
    }

    #[tokio::test]
    async fn a_read_on_a_connection_the_server_closes_is_sent_again_on_a_new_one() {
        let (url, seen) = closing_server().await;
        let api: Api<ConfigMap> = Api::namespaced(client(&url), "default");
        api.get("a").await.expect("the first read");
        let again = api.get("a").await;
        assert!(again.is_ok(), "the second read should have been retried: {again:?}");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "one read, the one the server dropped, its retry: {seen:?}");
        assert!(seen.iter().all(|l| l.starts_with("GET ")), "{seen:?}");
    }

    #[tokio::test]
    async fn a_write_that_may_have_reached_the_server_is_not_sent_twice() {
        let (url, seen) = closing_server().await;
        let api: Api<ConfigMap> = Api::namespaced(client(&url), "default");
        api.get("a").await.expect("the first read");
        let cm: ConfigMap = serde_json::from_str(CONFIG_MAP).unwrap();
        let create = api.create(&PostParams::default(), &cm).await;
        assert!(create.is_err(), "the server dropped the create unanswered, yet it succeeded");
        let seen = seen.lock().unwrap().clone();
        let posts = seen.iter().filter(|l| l.starts_with("POST ")).count();
        assert_eq!(posts, 1, "a create the server may have applied must not be sent again: {seen:?}");
    }

    #[tokio::test]
    async fn a_request_whose_connection_was_refused_is_tried_again() {
        // Bind, learn the port, close: the first connection attempt is refused.
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}");
        let api: Api<ConfigMap> = Api::namespaced(client(&url), "default");
        let server = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
            let (mut conn, _) = listener.accept().await.unwrap();
            let line = read_request(&mut conn).await.unwrap();
            respond(&mut conn).await;
            line
        });
        let cm: ConfigMap = serde_json::from_str(CONFIG_MAP).unwrap();
        let created = api.create(&PostParams::default(), &cm).await;
        assert!(created.is_ok(), "a create whose connection was refused should be retried: {created:?}");
        assert!(server.await.unwrap().starts_with("POST "));
    }
}
