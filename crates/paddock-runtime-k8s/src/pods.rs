//! A sandbox's objects on the cluster: finding, starting, waiting for and deleting its Pod,
//! its volumes and its NetworkPolicy, saying why a Pod is stuck, and running a script in it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use paddock_core::naming::{NamingMode, ThreadId, sanitize_hashed};
use paddock_core::runtime::{RuntimeError, SandboxId, SandboxInfo};
use paddock_core::spec::SandboxSpec;
use paddock_core::volume::VolumeSource;

use crate::objects::{self, Names, PodPhase};
use crate::{KubeRuntime, POLL, api_error, is_code, now_ms, wait_gone};
use crate::{claim, exec};

impl KubeRuntime {
    pub(crate) async fn list_pods(&self) -> Result<Vec<Pod>, RuntimeError> {
        let lp = ListParams::default().labels(objects::SANDBOX_LABEL);
        Ok(self.pods.list(&lp).await.map_err(|e| api_error("listing sandbox Pods", e))?.items)
    }

    /// The Pod of a sandbox, found by its label (one LIST): names of a thread's Pods are
    /// reused by later sandboxes, so a name alone does not identify a sandbox.
    pub(crate) async fn find(&self, id: &SandboxId) -> Result<Pod, RuntimeError> {
        let lp = ListParams::default().labels(&format!("{}={id}", objects::SANDBOX_LABEL));
        let pods = self.pods.list(&lp).await.map_err(|e| api_error("looking up a sandbox", e))?;
        pods.items.into_iter().find(|p| p.metadata.deletion_timestamp.is_none()).ok_or_else(|| {
            RuntimeError::NotFound(format!(
                "sandbox {id} does not exist (it was destroyed or expired; see `paddock ls`)"
            ))
        })
    }

    /// The name of a sandbox's Pod, which must be ready for commands.
    pub(crate) async fn ready_pod(&self, id: &SandboxId) -> Result<String, RuntimeError> {
        let pod = self.find(id).await?;
        self.ready_pod_of(id, &pod)
    }

    /// Makes the named volumes `spec` mounts that do not exist yet (where it may), and refuses
    /// claims that are not volumes a sandbox may mount: a thread's workspace is its own.
    pub(crate) async fn ensure_volumes(&self, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        for v in &spec.volumes {
            let VolumeSource::Named { name, create, size_bytes, .. } = &v.source else { continue };
            match self.claims.get_opt(name).await.map_err(|e| api_error("reading a volume's PVC", e))? {
                Some(c) => {
                    let labels = c.metadata.labels.unwrap_or_default();
                    // Only claims that are volumes: Paddock's own, or ones the operator marked
                    // as such. Any other PVC of the namespace (a thread's workspace, another
                    // application's data) is not a sandbox's to mount.
                    if labels.get(objects::VOLUME_LABEL) != Some(name)
                        || labels.contains_key(objects::THREAD_HASH_LABEL)
                    {
                        return Err(RuntimeError::InvalidArgument(format!(
                            "volume {}: PVC {name} exists but is not a volume sandboxes may mount (a thread's workspace, or another application's claim); to share a claim of your own with sandboxes, label it {}={name}",
                            v.name,
                            objects::VOLUME_LABEL
                        )));
                    }
                    if c.metadata.deletion_timestamp.is_some() {
                        return Err(RuntimeError::Conflict(format!(
                            "volume {}: PVC {name} is being deleted: try again once it is gone",
                            v.name
                        )));
                    }
                }
                None if !create => {
                    return Err(RuntimeError::NotFound(format!(
                        "volume {}: named volume {name} does not exist: create it (createIfNotExists) or see `paddock volume ls`",
                        v.name
                    )));
                }
                None => {
                    let bytes =
                        size_bytes.or(spec.resources.workspace_bytes).unwrap_or(self.config.workspace_default_bytes);
                    let pvc = objects::named_volume_pvc(
                        &self.config.namespace,
                        name,
                        bytes,
                        self.config.storage_class.as_deref(),
                    )
                    .map_err(|e| RuntimeError::System(format!("building PVC {name}: {e}")))?;
                    match self.claims.create(&PostParams::default(), &pvc).await {
                        Ok(_) => {}
                        // Made meanwhile: by another create of the same volume, or as something
                        // else; checked as an existing claim is.
                        Err(e) if is_code(&e, 409) => return Box::pin(self.ensure_volumes(spec)).await,
                        Err(e) => return Err(api_error(&format!("creating volume PVC {name}"), e)),
                    }
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn ensure_policy(
        &self,
        id: &SandboxId,
        names: &Names,
        spec: &SandboxSpec,
    ) -> Result<(), RuntimeError> {
        let np = objects::network_policy(&self.config.namespace, id, names, spec)
            .map_err(|e| RuntimeError::System(format!("building NetworkPolicy: {e}")))?;
        match self.policies.create(&PostParams::default(), &np).await {
            Ok(_) => Ok(()),
            // A thread's policy outlives its Pods; this Pod's spec may ask for other rules.
            Err(e) if is_code(&e, 409) => self.set_policy_rules(&names.network_policy, spec).await,
            Err(e) => Err(api_error(&format!("creating NetworkPolicy {}", names.network_policy), e)),
        }
    }

    /// Replaces the egress rules of an existing NetworkPolicy with those of `spec`'s policy.
    pub(crate) async fn set_policy_rules(&self, name: &str, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        let rules = objects::policy_rules(spec).map_err(RuntimeError::Unsupported)?;
        // A merge patch replaces a list whole.
        let patch = serde_json::json!({"spec": {"egress": rules}});
        self.policies
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| api_error(&format!("updating NetworkPolicy {name}"), e))
    }

    /// Deletes a Pod (only this very Pod: its uid is a precondition) and its NetworkPolicy,
    /// then waits until the Pod is gone when asked. A thread's PVC is kept.
    pub(crate) async fn delete_sandbox_pod(&self, pod: &Pod, wait: bool) -> Result<(), RuntimeError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.transport.agents.forget(&name);
        self.located.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, l| l.pod != name);
        if let Some(claim) = pod.metadata.annotations.as_ref().and_then(|a| a.get(claim::CLAIM_ANNOTATION)) {
            // The controller owns a claimed Pod: deleting it would only make it start another.
            return self.delete_claim(claim, wait).await;
        }
        let dp = DeleteParams {
            grace_period_seconds: Some(1),
            preconditions: Some(Preconditions { uid: pod.metadata.uid.clone(), resource_version: None }),
            ..DeleteParams::default()
        };
        match self.pods.delete(&name, &dp).await {
            Ok(_) => {}
            // Gone already, or replaced by a new Pod of the same name (uid mismatch).
            Err(e) if is_code(&e, 404) || is_code(&e, 409) => {}
            Err(e) => return Err(api_error(&format!("deleting Pod {name}"), e)),
        }
        if let Some(np) = pod.metadata.annotations.as_ref().and_then(|a| a.get(objects::NETPOL_ANNOTATION)) {
            self.delete_policy(np).await?;
        }
        if wait {
            self.wait_pod_gone(&name, pod.metadata.uid.as_deref()).await?;
        }
        Ok(())
    }

    pub(crate) async fn delete_policy(&self, name: &str) -> Result<(), RuntimeError> {
        match self.policies.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_code(&e, 404) => Ok(()),
            Err(e) => Err(api_error(&format!("deleting NetworkPolicy {name}"), e)),
        }
    }

    /// Waits until no Pod `name` (with `uid`, when given) exists: a terminating Pod still
    /// holds its name and its volume.
    pub(crate) async fn wait_pod_gone(&self, name: &str, uid: Option<&str>) -> Result<(), RuntimeError> {
        // A Pod of that name with another uid is a replacement: the one we deleted is gone.
        let same = |p: &Pod| uid.is_none() || p.metadata.uid.as_deref() == uid;
        wait_gone(
            &self.pods,
            name,
            same,
            || format!("Pod {name}"),
            || format!("check the node (`kubectl describe pod {name}`)"),
        )
        .await
    }

    /// Waits for Pod `name` (with `uid`) to be Running and Ready. Failures say what to check.
    pub(crate) async fn wait_ready(&self, name: &str, uid: Option<&str>) -> Result<Pod, RuntimeError> {
        let started = tokio::time::Instant::now();
        let deadline = started + self.config.ready_timeout;
        loop {
            let pod = self.pods.get_opt(name).await.map_err(|e| api_error("reading a starting Pod", e))?;
            let Some(pod) = pod.filter(|p| uid.is_none() || p.metadata.uid.as_deref() == uid) else {
                return Err(RuntimeError::Unavailable(format!(
                    "Pod {name} disappeared while starting (deleted by another request or server); try again"
                )));
            };
            match objects::phase(&pod) {
                // Its agent is brought up by its first command, not here: many sandboxes end
                // without one, and each bring-up uploads the agent through the API server.
                PodPhase::Ready => return Ok(pod),
                PodPhase::Gone(why) => {
                    return Err(RuntimeError::Unavailable(format!(
                        "Pod {name} stopped while starting: {why}; check `kubectl describe pod {name}` and the image's `sh`"
                    )));
                }
                PodPhase::Starting(Some(why)) if !why.starts_with("ErrImagePull") => {
                    return Err(self.diagnose(&pod, Some(why)).await);
                }
                PodPhase::Starting(_) if tokio::time::Instant::now() > deadline => {
                    return Err(self.diagnose(&pod, None).await);
                }
                // Most Pods start within a few seconds: look often then, so a create does not
                // wait a poll interval longer than the Pod took; back off after that.
                PodPhase::Starting(_) if started.elapsed() < Duration::from_secs(4) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                PodPhase::Starting(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Why a Pod is not ready, from its conditions, its claim and its recent events.
    pub(crate) async fn diagnose(&self, pod: &Pod, stuck: Option<String>) -> RuntimeError {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let mut findings = Vec::new();
        let mut exhausted = false;
        if let Some(why) = &stuck {
            findings.push(format!(
                "the container cannot start ({why}); check the image name and that the node has it (imagePullPolicy {})",
                self.config.image_pull_policy
            ));
        }
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten();
        for c in conditions.filter(|c| c.type_ == "PodScheduled" && c.status == "False") {
            let msg = c.message.clone().unwrap_or_default();
            exhausted |= msg.contains("Insufficient");
            findings.push(format!("not scheduled: {msg}; check node capacity, taints and the PVC's binding"));
        }
        if let Some(claim) = pod.metadata.annotations.as_ref().and_then(|a| a.get(objects::WORKSPACE_ANNOTATION))
            && let Ok(Some(c)) = self.claims.get_opt(claim).await
        {
            let phase = c.status.and_then(|s| s.phase).unwrap_or_else(|| "Pending".into());
            if phase != "Bound" {
                findings.push(format!(
                    "workspace PVC {claim} is {phase}; check its StorageClass ({}) and provisioner",
                    self.config.storage_class.as_deref().unwrap_or("cluster default")
                ));
            }
        }
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        if let Ok(events) = self.events.list(&lp).await {
            let mut warnings: Vec<_> =
                events.items.into_iter().filter(|e| e.type_.as_deref() == Some("Warning")).collect();
            warnings.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
            for e in warnings.iter().rev().take(3) {
                findings.push(format!(
                    "event {}: {}",
                    e.reason.as_deref().unwrap_or("?"),
                    e.message.as_deref().unwrap_or_default().trim()
                ));
            }
        }
        if findings.is_empty() {
            findings.push("no condition or event explains it; check `kubectl describe pod` and the node".into());
        }
        let message = if stuck.is_some() {
            format!("Pod {name} cannot start: {}", findings.join("; "))
        } else {
            format!(
                "Pod {name} was not ready within {} s: {}",
                self.config.ready_timeout.as_secs(),
                findings.join("; ")
            )
        };
        if exhausted {
            RuntimeError::Exhausted(message)
        } else if stuck.is_some() {
            RuntimeError::Unavailable(message)
        } else {
            RuntimeError::Timeout(message)
        }
    }

    /// Creates the Pod (its policy first, so it never runs unprotected) and waits for it.
    /// `Ok(None)` when a Pod of that name exists already.
    pub(crate) async fn start_pod(
        &self,
        id: &SandboxId,
        names: &Names,
        spec: &SandboxSpec,
    ) -> Result<Option<Pod>, RuntimeError> {
        self.ensure_policy(id, names, spec).await?;
        let now = now_ms();
        let expires = spec.timeout_secs.map(|t| now + t * 1000);
        let image = spec.image.clone().unwrap_or_else(|| self.config.default_image.clone());
        let pod = objects::pod(&self.shape(&image), id, names, spec, now, expires)
            .map_err(|e| RuntimeError::System(format!("building Pod {}: {e}", names.pod)))?;
        let created = match self.pods.create(&PostParams::default(), &pod).await {
            Ok(p) => p,
            Err(e) if is_code(&e, 409) => return Ok(None),
            Err(e) => {
                // A thread's policy stays for the next try; a one-off sandbox's goes with it.
                if spec.workspace.is_none() {
                    let _ = self.delete_policy(&names.network_policy).await;
                }
                return Err(api_error(&format!("creating Pod {}", names.pod), e));
            }
        };
        match self.wait_ready(&names.pod, created.metadata.uid.as_deref()).await {
            Ok(p) => Ok(Some(p)),
            Err(e) => {
                // Leave nothing half-made behind: the next create or acquire starts afresh.
                if let Err(cleanup) = self.delete_sandbox_pod(&created, false).await {
                    tracing::warn!(error = %cleanup, pod = names.pod, "cleaning up a Pod that did not start");
                }
                Err(e)
            }
        }
    }

    pub(crate) fn info_of(pod: &Pod) -> Result<SandboxInfo, RuntimeError> {
        objects::info(pod).ok_or_else(|| {
            RuntimeError::System(format!(
                "Pod {} has no readable sandbox labels/annotations",
                pod.metadata.name.as_deref().unwrap_or_default()
            ))
        })
    }

    /// Runs one of the runtime's own scripts and collects its output.
    pub(crate) async fn script(
        &self,
        id: &SandboxId,
        argv: Vec<String>,
        input: Option<&mut (dyn tokio::io::AsyncRead + Send + Unpin)>,
    ) -> Result<(i32, Vec<u8>, Vec<u8>), RuntimeError> {
        let pod = self.ready_pod(id).await?;
        let running = self.transport.start(&pod, argv, input.is_some()).await?;
        exec::collect(running, input).await
    }

    /// Names of a thread's objects in every naming mode the thread may have been used with.
    pub(crate) fn all_thread_names(thread: &ThreadId) -> Vec<Names> {
        [NamingMode::Hashed, NamingMode::DawnCompat].iter().map(|m| objects::thread_names(thread, *m)).collect()
    }

    /// Deletes every keeper Pod and policy of a thread and waits until the Pods are gone.
    pub(crate) async fn stop_thread(&self, thread: &ThreadId) -> Result<(), RuntimeError> {
        let lp = ListParams::default().labels(&format!(
            "{}={}",
            objects::THREAD_HASH_LABEL,
            sanitize_hashed(thread.as_str())
        ));
        let mut pods = self.pods.list(&lp).await.map_err(|e| api_error("listing a thread's Pods", e))?.items;
        for names in Self::all_thread_names(thread) {
            if let Some(p) = self.pods.get_opt(&names.pod).await.map_err(|e| api_error("reading a Pod", e))?
                && !pods.iter().any(|q| q.metadata.uid == p.metadata.uid)
            {
                pods.push(p);
            }
            self.delete_policy(&names.network_policy).await?;
        }
        for p in &pods {
            self.delete_sandbox_pod(p, false).await?;
        }
        for p in &pods {
            self.wait_pod_gone(p.metadata.name.as_deref().unwrap_or_default(), p.metadata.uid.as_deref()).await?;
        }
        Ok(())
    }
}
