//! The Kubernetes client, built as kube's default one is but with `TCP_NODELAY`.
//!
//! kube's own stack leaves Nagle's algorithm on. A request/response connection barely notices,
//! but the agent's port-forward is one long-lived connection on which a command's HTTP/2
//! HEADERS and DATA frames leave as separate small writes: the second waited for the API
//! server's delayed ACK, 40 ms per command (measured: 45 ms of a 52 ms round trip).

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use paddock_core::runtime::RuntimeError;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// A client from the in-cluster service account, else `KUBECONFIG` / `~/.kube/config`.
pub async fn infer() -> Result<Client, RuntimeError> {
    let config = Config::infer().await.map_err(|e| {
        RuntimeError::Unavailable(format!("no Kubernetes configuration found (in-cluster or KUBECONFIG): {e}"))
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
    let retry = config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer().map_err(bad)?)
        .layer(config.extra_headers_layer().map_err(bad)?)
        .map_err(BoxError::from)
        .service(hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https));
    Ok(Client::new(service, config.default_namespace))
}
