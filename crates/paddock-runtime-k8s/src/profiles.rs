//! The claim model's side of the runtime (`--model claim`): SandboxClaims, the profiles they
//! are made from (a template and a warm pool each, `claim` builds the objects), adopting a
//! claimed Pod as a sandbox, and reaping idle profiles and orphaned claims.

use super::*;

impl KubeRuntime {
    /// Deletes claims whose Pod never got Paddock's labels (the server that made them died
    /// before writing them) once they are older than any create could take.
    pub(crate) async fn reap_orphan_claims(&self, pods: &[Pod], now: u64) -> Result<usize, RuntimeError> {
        let lp = ListParams::default().labels(objects::SANDBOX_LABEL);
        let claims = self.sandbox_claims.list(&lp).await.map_err(|e| api_error("listing sandbox claims", e))?.items;
        if claims.is_empty() {
            return Ok(0);
        }
        let live: HashSet<String> =
            pods.iter().filter_map(|p| p.metadata.labels.as_ref()?.get(objects::SANDBOX_LABEL).cloned()).collect();
        let grace = paddock_core::units::millis(self.config.ready_timeout).saturating_add(60_000);
        let mut n = 0;
        for c in claims.iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
            let id = c.metadata.labels.as_ref().and_then(|l| l.get(objects::SANDBOX_LABEL));
            let created = c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(objects::CREATED_ANNOTATION))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            if id.is_some_and(|id| !live.contains(id)) && created + grace < now {
                let name = c.metadata.name.clone().unwrap_or_default();
                match self.delete_claim(&name, false).await {
                    Ok(()) => {
                        tracing::info!(claim = name, "orphaned sandbox claim deleted");
                        n += 1;
                    }
                    Err(e) => tracing::warn!(claim = name, error = %e, "deleting an orphaned sandbox claim"),
                }
            }
        }
        Ok(n)
    }

    pub(crate) async fn ensure_claim(
        &self,
        thread: &ThreadId,
        naming: NamingMode,
        name: &str,
        spec: &SandboxSpec,
    ) -> Result<(), RuntimeError> {
        let bytes = spec.resources.workspace_bytes.unwrap_or(self.config.workspace_default_bytes);
        let claim =
            objects::pvc(&self.config.namespace, name, thread, naming, bytes, self.config.storage_class.as_deref())
                .map_err(|e| RuntimeError::System(format!("building PVC {name}: {e}")))?;
        match self.claims.create(&PostParams::default(), &claim).await {
            Ok(_) => Ok(()),
            Err(e) if is_code(&e, 409) => {
                // A claim being deleted would be re-bound with its old data, or vanish under
                // the new Pod: wait for it to go, then make a fresh one.
                let existing = self.claims.get_opt(name).await.map_err(|e| api_error("reading a workspace PVC", e))?;
                // A named volume that took the workspace's name first is not its workspace.
                if existing
                    .as_ref()
                    .is_some_and(|c| c.metadata.labels.as_ref().is_some_and(|l| l.contains_key(objects::VOLUME_LABEL)))
                {
                    return Err(RuntimeError::Conflict(format!(
                        "PVC {name}, the workspace of thread {thread}, is taken by a named volume: delete that volume (paddock volume rm {name})"
                    )));
                }
                if existing.is_some_and(|c| c.metadata.deletion_timestamp.is_some()) {
                    self.wait_claim_gone(name).await?;
                    return Box::pin(self.ensure_claim(thread, naming, name, spec)).await;
                }
                Ok(())
            }
            Err(e) => Err(api_error(&format!("creating workspace PVC {name}"), e)),
        }
    }

    /// Deletes a sandbox's claim in the foreground: the claim stays visible until its Sandbox
    /// and Pod are gone, so waiting for the claim waits for the Pod.
    pub(crate) async fn delete_claim(&self, name: &str, wait: bool) -> Result<(), RuntimeError> {
        match self.sandbox_claims.delete(name, &DeleteParams::foreground()).await {
            Ok(_) => {}
            Err(e) if is_code(&e, 404) => return Ok(()),
            Err(e) => return Err(api_error(&format!("deleting sandbox claim {name}"), e)),
        }
        if !wait {
            return Ok(());
        }
        let hint = || format!("check the agent-sandbox controller and `kubectl describe sandboxclaim {name}`");
        wait_gone(&self.sandbox_claims, name, |_| true, || format!("sandbox claim {name}"), hint).await
    }

    /// Makes sure the template and warm pool of `spec`'s profile exist; returns their name.
    /// The default profile's pool keeps `warm_pool` Pods started; any other starts its Pods
    /// on demand (a pool of zero), so an unusual spec costs no idle Pods.
    pub(crate) async fn ensure_profile(&self, spec: &SandboxSpec) -> Result<String, RuntimeError> {
        self.claim_profile(spec, true)
            .await?
            .ok_or_else(|| RuntimeError::System("the default profile was refused".into()))
    }

    /// The pool of `spec`'s profile, made if needed; `None` when the namespace holds
    /// `MAX_PROFILES` profiles already (the caller then starts a keeper Pod): every distinct
    /// shape a client asks for would otherwise leave a template and a pool in the cluster.
    /// `always` exempts a profile from that bound (the default one).
    pub(crate) async fn claim_profile(&self, spec: &SandboxSpec, always: bool) -> Result<Option<String>, RuntimeError> {
        let pod_spec = self.profile_pod_spec(spec);
        let name = claim::profile_name(&pod_spec);
        let known = self.profiles.lock().unwrap_or_else(|p| p.into_inner()).get(&name).copied();
        if known.is_some_and(|at| at.elapsed() < PROFILE_RECHECK) {
            return Ok(Some(name));
        }
        let ns = &self.config.namespace;
        // Marks the profile used (the reaper spares it) and tells whether it exists.
        let touch =
            serde_json::json!({"metadata": {"annotations": {claim::LAST_USED_ANNOTATION: now_ms().to_string()}}});
        let exists = match self.templates.patch(&name, &PatchParams::default(), &Patch::Merge(&touch)).await {
            Ok(_) => true,
            Err(e) if is_code(&e, 404) => false,
            Err(e) => return Err(api_error("marking a SandboxTemplate used", e)),
        };
        if exists && known.is_some() {
            // Its pool was made when it was first used here, and is only deleted with it.
            self.profiles.lock().unwrap_or_else(|p| p.into_inner()).insert(name.clone(), std::time::Instant::now());
            return Ok(Some(name));
        }
        if !exists && !always {
            let lp = ListParams::default().labels(&format!("{}=paddock", objects::MANAGED_BY));
            let made = self.templates.list(&lp).await.map_err(|e| api_error("listing SandboxTemplates", e))?;
            if made.items.len() >= MAX_PROFILES {
                tracing::info!(profile = name, "{MAX_PROFILES} sandbox profiles exist: this one gets a keeper Pod");
                return Ok(None);
            }
        }
        let template = claim::template(ns, &name, &pod_spec, now_ms())
            .map_err(|e| RuntimeError::System(format!("building SandboxTemplate {name}: {e}")))?;
        match self.templates.create(&PostParams::default(), &template).await {
            Ok(_) => {}
            Err(e) if is_code(&e, 409) => {}
            Err(e) => {
                return Err(api_error(
                    &format!("creating SandboxTemplate {name} (is agent-sandbox installed, with its CRDs?)"),
                    e,
                ));
            }
        }
        // The default profile and the first few others this server sees keep warm Pods (an
        // SDK's default size rarely is Paddock's); any further profile starts cold, so clients
        // sending many distinct specs cannot pin idle Pods on the cluster.
        let default = self.profile_pod_spec(&self.prepare(paddock_core::spec::ValidatedSpec::default())?);
        let warm = claim::profile_name(&default) == name
            || self.profiles.lock().unwrap_or_else(|p| p.into_inner()).len() <= MAX_WARM_PROFILES;
        let replicas = if warm { self.config.warm_pool } else { 0 };
        let pool = claim::warm_pool(ns, &name, replicas)
            .map_err(|e| RuntimeError::System(format!("building SandboxWarmPool {name}: {e}")))?;
        match self.pools.create(&PostParams::default(), &pool).await {
            Ok(_) => {}
            Err(e) if is_code(&e, 409) => {
                // Another server (or an earlier run) made it: only its size may differ.
                let patch = serde_json::json!({"spec": {"replicas": replicas}});
                self.pools
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| api_error(&format!("sizing SandboxWarmPool {name}"), e))?;
            }
            Err(e) => return Err(api_error(&format!("creating SandboxWarmPool {name}"), e)),
        }
        self.profiles.lock().unwrap_or_else(|p| p.into_inner()).insert(name.clone(), std::time::Instant::now());
        Ok(Some(name))
    }

    /// Deletes the claim profiles that are idle: not the default one, not used by any server
    /// for `profile_idle`, and not named by any claim. The template goes first, on the
    /// condition that nobody touched it since it was listed (a server that claims from a
    /// profile touches its template first), then its pool. Pools left without a template
    /// (a delete cut short) go too. A template without a last-used mark (made by an older
    /// server) is marked now and judged later.
    pub(crate) async fn reap_idle_profiles(&self, now: u64) -> Result<usize, RuntimeError> {
        let lp = ListParams::default().labels(&format!("{}=paddock", objects::MANAGED_BY));
        let templates = self.templates.list(&lp).await.map_err(|e| api_error("listing SandboxTemplates", e))?.items;
        let pools = self.pools.list(&lp).await.map_err(|e| api_error("listing SandboxWarmPools", e))?.items;
        let idle_ms = paddock_core::units::millis(self.config.profile_idle);
        let default =
            claim::profile_name(&self.profile_pod_spec(&self.prepare(paddock_core::spec::ValidatedSpec::default())?));
        let mut idle = Vec::new();
        for t in templates.iter().filter(|t| t.metadata.deletion_timestamp.is_none()) {
            let Some(name) = t.metadata.name.clone().filter(|n| *n != default) else { continue };
            let marked = t.metadata.annotations.as_ref().and_then(|a| a.get(claim::LAST_USED_ANNOTATION));
            match marked.and_then(|v| v.parse::<u64>().ok()) {
                Some(at) if at.saturating_add(idle_ms) < now => idle.push((name, t.metadata.resource_version.clone())),
                Some(_) => {}
                None => {
                    let touch = serde_json::json!({"metadata": {"annotations": {claim::LAST_USED_ANNOTATION: now.to_string()}}});
                    let _ = self.templates.patch(&name, &PatchParams::default(), &Patch::Merge(&touch)).await;
                }
            }
        }
        let live: HashSet<&str> = templates.iter().filter_map(|t| t.metadata.name.as_deref()).collect();
        let orphans: Vec<String> = pools
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .filter(|n| !live.contains(n.as_str()) && *n != default)
            .collect();
        if idle.is_empty() && orphans.is_empty() {
            return Ok(0);
        }
        let claims = self.sandbox_claims.list(&ListParams::default()).await;
        let claims = claims.map_err(|e| api_error("listing sandbox claims", e))?.items;
        let in_use: HashSet<&str> = claims.iter().filter_map(claim::pool_of).collect();
        let mut n = 0;
        for (name, version) in idle.into_iter().filter(|(n, _)| !in_use.contains(n.as_str())) {
            let dp = DeleteParams {
                preconditions: Some(Preconditions { uid: None, resource_version: version }),
                ..DeleteParams::default()
            };
            match self.templates.delete(&name, &dp).await {
                Ok(_) => {}
                // Touched (used) since it was listed, or gone already.
                Err(e) if is_code(&e, 409) || is_code(&e, 404) => continue,
                Err(e) => {
                    tracing::warn!(profile = name, error = %api_error("deleting an idle profile", e), "reaping profiles");
                    continue;
                }
            }
            self.profiles.lock().unwrap_or_else(|p| p.into_inner()).remove(&name);
            match self.pools.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_code(&e, 404) => {}
                Err(e) => {
                    tracing::warn!(profile = name, error = %api_error("deleting an idle profile's pool", e), "reaping profiles")
                }
            }
            tracing::info!(profile = name, "idle sandbox profile deleted");
            n += 1;
        }
        for name in orphans.into_iter().filter(|n| !in_use.contains(n.as_str())) {
            match self.pools.delete(&name, &DeleteParams::default()).await {
                Ok(_) => n += 1,
                Err(e) if is_code(&e, 404) => {}
                Err(e) => {
                    tracing::warn!(pool = name, error = %api_error("deleting a pool without a template", e), "reaping profiles")
                }
            }
        }
        Ok(n)
    }

    /// The Pod spec a profile's pool starts: the spec's environment is left out (a warm Pod
    /// exists before anyone asks for it), commands get it at exec time.
    pub(crate) fn profile_pod_spec(&self, spec: &SandboxSpec) -> serde_json::Value {
        let mut spec = spec.clone();
        spec.env.clear();
        let image = spec.image.clone().unwrap_or_else(|| self.config.default_image.clone());
        objects::pod_spec(&self.shape(&image), &spec, None, false)
    }

    /// Claims a Pod from the spec's pool, waits for the controller to hand one over, and
    /// writes the sandbox's labels and annotations onto it.
    /// `Ok(None)`: no pool for this profile (too many exist); the caller makes a keeper Pod.
    pub(crate) async fn create_claimed(&self, spec: &SandboxSpec) -> Result<Option<SandboxInfo>, RuntimeError> {
        let Some(pool) = self.claim_profile(spec, false).await? else { return Ok(None) };
        let spec = spec.clone();
        let id = SandboxId::from_random(random()?);
        let now = now_ms();
        let expires = spec.timeout_secs.map(|t| now + t * 1000);
        let name = claim::claim_name(&id);
        let object = claim::claim(&self.config.namespace, &id, &pool, &spec, now, expires)
            .map_err(|e| RuntimeError::System(format!("building SandboxClaim {name}: {e}")))?;
        self.sandbox_claims
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| api_error(&format!("creating SandboxClaim {name}"), e))?;
        match self.adopt_claimed(&id, &name, &spec, now, expires).await {
            Ok(pod) => Self::info_of(&pod).map(Some),
            Err(e) => {
                if let Err(cleanup) = self.delete_claim(&name, false).await {
                    tracing::warn!(error = %cleanup, claim = name, "cleaning up a claim that was not served");
                }
                Err(e)
            }
        }
    }

    pub(crate) async fn adopt_claimed(
        &self,
        id: &SandboxId,
        name: &str,
        spec: &SandboxSpec,
        now: u64,
        expires: Option<u64>,
    ) -> Result<Pod, RuntimeError> {
        let started = tokio::time::Instant::now();
        let deadline = started + self.config.ready_timeout;
        let pod_name = loop {
            let c = self.sandbox_claims.get_opt(name).await.map_err(|e| api_error("reading a sandbox claim", e))?;
            let Some(c) = c else {
                return Err(RuntimeError::Unavailable(format!(
                    "sandbox claim {name} disappeared while waiting for a Pod (deleted by another request or server); try again"
                )));
            };
            match claim::readiness(&c) {
                (Some(true), _) if claim::pod_name(&c).is_some() => break claim::pod_name(&c).unwrap_or_default(),
                (Some(false), why) => {
                    return Err(RuntimeError::Unavailable(format!(
                        "the agent-sandbox controller refused sandbox claim {name}: {why}"
                    )));
                }
                (_, why) if tokio::time::Instant::now() > deadline => {
                    return Err(RuntimeError::Timeout(format!(
                        "sandbox claim {name} got no ready Pod within {} s ({why}); check the agent-sandbox controller, the warm pool (`kubectl get sandboxwarmpool`) and node capacity",
                        self.config.ready_timeout.as_secs()
                    )));
                }
                // A warm Pod is handed over in tens of milliseconds: poll fast at first, then
                // back off for a cold start.
                _ if started.elapsed() < Duration::from_secs(2) => tokio::time::sleep(Duration::from_millis(10)).await,
                _ => tokio::time::sleep(POLL).await,
            }
        };
        let names = Names { pod: pod_name.clone(), network_policy: String::new(), pvc: None };
        let mut annotations = objects::sandbox_annotations(&names, spec, now, expires)
            .map_err(|e| RuntimeError::System(format!("building annotations for Pod {pod_name}: {e}")))?;
        annotations.insert(claim::CLAIM_ANNOTATION.into(), name.to_owned());
        let patch = serde_json::json!({
            "metadata": {"labels": objects::pod_labels(id, spec), "annotations": annotations}
        });
        let pod = self
            .pods
            .patch(&pod_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| api_error(&format!("labelling claimed Pod {pod_name}"), e))?;
        match objects::phase(&pod) {
            PodPhase::Ready => Ok(pod),
            _ => self.wait_ready(&pod_name, pod.metadata.uid.as_deref()).await,
        }
    }

    pub(crate) async fn wait_claim_gone(&self, name: &str) -> Result<(), RuntimeError> {
        let hint = || format!("a Pod may still use it (`kubectl describe pvc {name}`)");
        wait_gone(&self.claims, name, |_| true, || format!("PVC {name}"), hint).await
    }
}
