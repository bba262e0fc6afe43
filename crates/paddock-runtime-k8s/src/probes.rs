//! What `paddock-bench --kubernetes` and the cluster tests need from the cluster beyond the `Runtime` calls
//! it times: the baseline of a bare Pod's create → Ready, a sandbox's Pod name for the
//! `kubectl exec` baseline, and the claim model's warm pool.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use paddock_core::runtime::{RuntimeError, SandboxId};
use serde_json::json;

impl crate::KubeRuntime {
    /// The name of a sandbox's Pod.
    pub async fn pod_name(&self, id: &SandboxId) -> Result<String, RuntimeError> {
        let pod = self.find(id).await?;
        pod.metadata.name.ok_or_else(|| RuntimeError::System(format!("the Pod of {id} has no name")))
    }

    /// The baseline: one bare Pod of the default image (hardened like a sandbox's, with no
    /// PVC and no NetworkPolicy) from create to Ready; it is deleted afterwards, untimed.
    pub async fn bare_pod_ready(&self) -> Result<Duration, RuntimeError> {
        let mut b = [0u8; 4];
        rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| RuntimeError::System(format!("getrandom: {e}")))?;
        let name = format!("paddock-bench-bare-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>());
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "paddock", "paddock.dev/bench": "bare"}},
            "spec": {
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "terminationGracePeriodSeconds": 0,
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": crate::objects::CONTAINER,
                    "image": self.config.default_image,
                    "imagePullPolicy": self.config.image_pull_policy,
                    "command": crate::objects::KEEPER_COMMAND,
                    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}},
                }],
            },
        }))
        .map_err(|e| RuntimeError::System(format!("building the bench Pod: {e}")))?;
        let t0 = Instant::now();
        self.pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| crate::api_error("creating a bench Pod", e))?;
        let ready = async {
            let deadline = t0 + self.config.ready_timeout;
            loop {
                let pod = self.pods.get(&name).await.map_err(|e| crate::api_error("reading a bench Pod", e))?;
                let is_ready = pod
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if is_ready {
                    return Ok(t0.elapsed());
                }
                if Instant::now() > deadline {
                    return Err(RuntimeError::Timeout(format!("bench Pod {name} was not Ready in time")));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        .await;
        let gone = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        let _ = self.pods.delete(&name, &gone).await;
        ready
    }

    /// The same runtime on the same client with another sandbox model and warm-pool size.
    pub fn with_model(&self, model: crate::SandboxModel, warm_pool: u32) -> Self {
        let config = crate::KubeConfig { model, warm_pool, ..self.config.clone() };
        Self::new(self.pods.clone().into_client(), config)
    }

    /// Ready Pods waiting in the default profile's warm pool (claim model).
    pub async fn default_pool_ready(&self) -> Result<u64, RuntimeError> {
        let spec = self.prepare(paddock_core::spec::ValidatedSpec::default())?;
        let name = self.ensure_profile(&spec).await?;
        let pool = self.pools.get(&name).await.map_err(|e| crate::api_error("reading the warm pool", e))?;
        Ok(pool.data.pointer("/status/readyReplicas").and_then(serde_json::Value::as_u64).unwrap_or(0))
    }

    /// Deletes the warm pools and templates of every profile this runtime made sure of, so a
    /// benchmark leaves no Pods running.
    pub async fn drain_pools(&self) -> Result<(), RuntimeError> {
        let names: Vec<String> =
            self.profiles.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(n, _)| n).collect();
        for name in names {
            for api in [&self.pools, &self.templates] {
                match api.delete(&name, &DeleteParams::foreground()).await {
                    Ok(_) => {}
                    Err(e) if crate::is_code(&e, 404) => {}
                    Err(e) => return Err(crate::api_error(&format!("deleting {name}"), e)),
                }
            }
        }
        Ok(())
    }
}

impl crate::KubeRuntime {
    /// Waits until commands to `pod` go through its agent; false without an agent or when it
    /// did not come up within `within`.
    pub async fn wait_agent(&self, pod: &str, within: Duration) -> bool {
        if !self.transport.agents.enabled() {
            return false;
        }
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if self.transport.agents.sender(pod, None).is_some() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// The same runtime with every command over `pods/exec`: the agent's baseline.
    pub fn without_agent(&self) -> Self {
        let config = crate::KubeConfig { agent: None, ..self.config.clone() };
        Self::new(self.pods.clone().into_client(), config)
    }
}
