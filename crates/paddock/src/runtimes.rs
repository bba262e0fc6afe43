//! Which runtime this process drives: the one place that knows the runtimes by name. Everything
//! after it (the server, the CLI) holds an `Arc<dyn Runtime>`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use paddock_core::naming::NamingMode;
use paddock_core::runtime::Runtime;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// Namespaces, cgroups, seccomp and Landlock on this machine (no daemon, no cluster).
    Local,
    /// Pods on a Kubernetes cluster (keeper Pod + PVC + NetworkPolicy per sandbox).
    Kubernetes,
}

#[derive(Debug, Clone, Args)]
pub struct RuntimeOpts {
    /// Where sandboxes run.
    #[arg(long = "runtime", global = true, env = "PADDOCK_RUNTIME", value_enum, default_value = "local")]
    pub kind: RuntimeKind,
}

/// Opens the chosen runtime.
pub async fn open(opts: &RuntimeOpts, data_dir: &Path, naming: NamingMode) -> Result<Arc<dyn Runtime>> {
    match opts.kind {
        RuntimeKind::Local => {
            let exe = std::env::current_exe().context("finding the paddock binary to start supervisors with")?;
            Ok(Arc::new(paddock_runtime_local::LocalRuntime::new(data_dir, exe, naming)?))
        }
        RuntimeKind::Kubernetes => anyhow::bail!("the kubernetes runtime is not built into this binary yet"),
    }
}
