//! The RuntimeClass (gVisor, Kata, Firecracker) sandbox Pods run under, checked before use.

use k8s_openapi::api::node::v1::RuntimeClass;
use kube::{Api, Client};
use paddock_core::runtime::RuntimeError;

/// Checks that RuntimeClass `name` exists; the error names it and what to do.
pub async fn check_exists(client: &Client, name: &str) -> Result<String, RuntimeError> {
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    match classes.get_opt(name).await {
        Ok(Some(class)) => Ok(class.handler),
        Ok(None) => Err(RuntimeError::InvalidArgument(format!(
            "RuntimeClass {name:?} does not exist in the cluster: install it (e.g. gVisor's runsc handler and its RuntimeClass), or start without --runtime-class"
        ))),
        Err(e) => Err(RuntimeError::Unavailable(format!(
            "could not read RuntimeClass {name:?} ({e}): the server needs `get` on runtimeclasses.node.k8s.io"
        ))),
    }
}

impl crate::KubeRuntime {
    /// Checks the configured RuntimeClass, if any; returns its handler.
    pub async fn check_runtime_class(&self) -> Result<Option<String>, RuntimeError> {
        match &self.config.runtime_class {
            Some(name) => check_exists(&self.pods.clone().into_client(), name).await.map(Some),
            None => Ok(None),
        }
    }
}
