//! The Kubernetes runtime's entry: its options and how it opens, and `paddock reap-pvcs`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use paddock_core::naming::NamingMode;
use paddock_core::runtime::Runtime;
pub use paddock_runtime_k8s::cli::KubeOpts;

use super::{BoxFuture, Entry, RuntimeOpts};

pub const ENTRY: Entry = Entry {
    name: "kubernetes",
    about: "Pods on a Kubernetes cluster (keeper Pod + PVC + NetworkPolicy per sandbox)",
    open,
    gateway_address: |opts| Ok(opts.kube.gateway_address),
    priority_tiers: |opts| Ok(opts.kube.priority_classes.iter().map(|(t, _)| t.clone()).collect()),
    // Its sandboxes' images are pulled by the kubelet of the node a Pod lands on.
    prepull: None,
};

fn open<'a>(
    opts: &'a RuntimeOpts,
    _data_dir: &'a Path,
    naming: NamingMode,
    serving: bool,
) -> BoxFuture<'a, Result<Arc<dyn Runtime>>> {
    Box::pin(async move {
        let rt = Arc::new(paddock_runtime_k8s::KubeRuntime::from_default_kubeconfig(opts.kube.config(naming)?).await?);
        if serving {
            rt.preflight().await.context("the Kubernetes runtime cannot start")?;
            if let Some(handler) = rt.check_runtime_class().await.context("the Kubernetes runtime cannot start")? {
                let class = opts.kube.runtime_class.as_deref().unwrap_or_default();
                let isolation = opts.kube.isolation.map(|i| format!("{i:?}").to_lowercase()).unwrap_or_default();
                eprintln!("paddock: sandbox Pods run under RuntimeClass {class} (handler {handler}, {isolation})");
            }
            rt.spawn_reaper();
        }
        let rt: Arc<dyn Runtime> = rt;
        Ok(rt)
    })
}

/// `paddock reap-pvcs`: one run of the workspace PVC reaper (Kubernetes only; a CronJob runs
/// it). Exit status 0 when the run completed.
pub async fn reap_pvcs(opts: &RuntimeOpts, naming: NamingMode, ttl: std::time::Duration, json: bool) -> Result<u8> {
    if opts.runtime != ENTRY.name {
        anyhow::bail!(
            "reap-pvcs reaps Kubernetes workspace PVCs: give --runtime kubernetes (local workspaces end with `paddock workspace rm`)"
        );
    }
    let rt = paddock_runtime_k8s::KubeRuntime::from_default_kubeconfig(opts.kube.config(naming)?).await?;
    let report = rt.reap_pvcs(ttl).await.context("reaping unused workspace PVCs")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let ns = &opts.kube.namespace;
        println!(
            "namespace {ns}: {} in use, {} unused within the TTL, {} deleted",
            report.in_use.len(),
            report.waiting.len(),
            report.deleted.len()
        );
        for name in &report.deleted {
            println!("  deleted {name}");
        }
    }
    Ok(0)
}
