//! `paddock-bench`: Paddock measured against a baseline run in the same process, on this
//! machine (the local runtime against bubblewrap, and the HTTP API of `paddock serve`) or on a
//! cluster (the Kubernetes runtime against bare Pods and `kubectl exec`). Results and the
//! commands that reproduce them are in BENCHMARKS.md.
//!
//! It is its own binary so that the product carries none of it: it drives the public `Runtime`
//! of each runtime crate, and spawns the `paddock` binary under measurement (`--paddock`, by
//! default the one beside this binary) for supervisors, `paddock run` and `paddock serve`.

mod kube;
mod local;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use clap::Parser;
use paddock_core::naming::NamingMode;

#[derive(Debug, Parser)]
#[command(
    name = "paddock-bench",
    version,
    about = "Measure Paddock against bubblewrap on this machine, or against bare Pods on a cluster (see BENCHMARKS.md)"
)]
struct Cli {
    /// The paddock binary under measurement: it runs the supervisors, `paddock run` and
    /// `paddock serve` [default: `paddock` beside this binary].
    #[arg(long, value_name = "PATH")]
    paddock: Option<PathBuf>,
    /// The data directory sandboxes are made in (an image given with --image must be in its
    /// store).
    #[arg(long, env = "PADDOCK_DATA_DIR", default_value = "/var/lib/paddock")]
    data_dir: PathBuf,
    /// Measure the Kubernetes runtime on the cluster of the kubeconfig instead of the local one.
    #[arg(long)]
    kubernetes: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    local: local::BenchArgs,
    #[command(flatten)]
    kube: kube::KubeBenchArgs,
}

/// The paddock binary under measurement, set once before any section starts.
static PADDOCK: OnceLock<PathBuf> = OnceLock::new();

/// The paddock binary under measurement.
fn paddock_binary() -> &'static Path {
    PADDOCK.get().map_or(Path::new("paddock"), PathBuf::as_path)
}

fn find_paddock(given: Option<PathBuf>) -> Result<PathBuf> {
    let path = match given {
        Some(p) => p,
        None => std::env::current_exe().context("finding this binary's directory")?.with_file_name("paddock"),
    };
    anyhow::ensure!(
        path.is_file(),
        "no paddock binary at {}: build it (cargo build --release -p paddock) or pass --paddock PATH",
        path.display()
    );
    std::fs::canonicalize(&path).with_context(|| format!("resolving {}", path.display()))
}

async fn run(cli: Cli) -> Result<u8> {
    let paddock = find_paddock(cli.paddock)?;
    let _ = PADDOCK.set(paddock.clone());
    let naming = NamingMode::Hashed;
    if cli.kubernetes {
        let config = cli.kube.runtime.config(naming)?;
        let rt = Arc::new(paddock_runtime_k8s::KubeRuntime::from_default_kubeconfig(config).await?);
        // The local runtime's exec round trip is the yardstick of the 3x aim; it needs root.
        let local = paddock_runtime_local::LocalRuntime::new(&cli.data_dir, paddock, naming).ok();
        kube::run(rt, local, cli.kube, (cli.local.iterations, cli.local.quick), cli.json).await
    } else {
        let rt = paddock_runtime_local::LocalRuntime::new(&cli.data_dir, paddock, naming)?.with_launcher();
        local::run(&rt, cli.local, cli.json).await
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One thread, as the `paddock bench` command it replaces ran: the figures stay comparable.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("paddock-bench: error: cannot start the async runtime: {e}");
            return ExitCode::from(125);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("paddock-bench: error: {e:#}");
            ExitCode::from(125)
        }
    }
}
