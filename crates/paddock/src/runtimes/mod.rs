//! Which runtime this process drives: the one place that knows the runtimes by name, the
//! table `RUNTIMES`. Everything after it (the server, the CLI) holds an `Arc<dyn Runtime>`.
//!
//! Adding a runtime: its crate; a module here with its options (a clap `Args` group, flattened
//! into `RuntimeOpts`) and its `Entry`; and that entry in `RUNTIMES`.

mod kubernetes;
mod local;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use clap::builder::{PossibleValue, PossibleValuesParser};
use paddock_core::naming::NamingMode;
use paddock_core::preflight::CheckStatus;
use paddock_core::runtime::Runtime;

pub use kubernetes::reap_pvcs;
pub use local::give_forked_launcher;

/// What the binary needs of a runtime besides the `Runtime` trait: how to open it with this
/// command line's options, and its answer to the options only some runtimes take. Each is
/// the runtime's own to give, so nothing outside its module compares runtime names.
pub struct Entry {
    /// `--runtime NAME`.
    pub name: &'static str,
    /// Its line under `--runtime` in `--help`.
    pub about: &'static str,
    /// Opens it. A server (`serving`) also starts the runtime's own background work.
    pub open: OpenFn,
    /// Where its sandboxes dial the runs' gateway when they do not reach it through a
    /// forwarder of their own (`--gateway-address`); an error when it has no use for one.
    pub gateway_address: fn(&RuntimeOpts) -> Result<Option<SocketAddr>>,
    /// The run tiers it gives a scheduler priority (`--priority-class`); an error when it has
    /// none to give.
    pub priority_tiers: fn(&RuntimeOpts) -> Result<Vec<String>>,
    /// Pulls a sandbox's image with progress on stderr before a CLI create, for a runtime
    /// whose sandboxes pull into this host's store, instead of a create that waits in silence.
    pub prepull: Option<PrepullFn>,
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type OpenFn = for<'a> fn(&'a RuntimeOpts, &'a Path, NamingMode, bool) -> BoxFuture<'a, Result<Arc<dyn Runtime>>>;
pub type PrepullFn = for<'a> fn(&'a RuntimeOpts, &'a Path, Option<&'a str>) -> BoxFuture<'a, Result<()>>;

/// Every runtime this binary drives; the first is the default.
pub const RUNTIMES: &[Entry] = &[local::ENTRY, kubernetes::ENTRY];

fn runtime_names() -> PossibleValuesParser {
    PossibleValuesParser::new(RUNTIMES.iter().map(|e| PossibleValue::new(e.name).help(e.about)))
}

#[derive(Debug, Clone, Args)]
pub struct RuntimeOpts {
    /// Where sandboxes run.
    #[arg(long = "runtime", global = true, env = "PADDOCK_RUNTIME", default_value = RUNTIMES[0].name, value_parser = runtime_names())]
    pub runtime: String,
    #[command(flatten)]
    pub kube: kubernetes::KubeOpts,
    #[command(flatten)]
    pub images: local::ImageOpts,
    #[command(flatten)]
    pub egress: local::EgressOpts,
    /// Let sandboxes mount host directories below DIR (OpenSandbox's `host` volumes; local
    /// runtime). Without one, host paths are refused. Repeatable.
    #[arg(
        long = "volume-root",
        global = true,
        value_name = "DIR",
        env = "PADDOCK_VOLUME_ROOTS",
        value_delimiter = ':'
    )]
    pub volume_roots: Vec<std::path::PathBuf>,
}

impl RuntimeOpts {
    /// The chosen runtime's entry.
    pub fn entry(&self) -> Result<&'static Entry> {
        RUNTIMES.iter().find(|e| e.name == self.runtime).ok_or_else(|| {
            let names: Vec<&str> = RUNTIMES.iter().map(|e| e.name).collect();
            anyhow::anyhow!("there is no runtime {:?}: give --runtime {}", self.runtime, names.join(" or "))
        })
    }

    /// Where the chosen runtime's sandboxes dial the runs' gateway, when they do not reach it
    /// through a forwarder of their own.
    pub fn gateway_address(&self) -> Result<Option<SocketAddr>> {
        (self.entry()?.gateway_address)(self)
    }

    /// The run tiers `--priority-class` names, for a runtime with scheduler priorities.
    pub fn priority_tiers(&self) -> Result<Vec<String>> {
        (self.entry()?.priority_tiers)(self)
    }
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((a, b)) if !a.trim().is_empty() && !b.trim().is_empty() => Ok((a.trim().to_owned(), b.trim().to_owned())),
        _ => Err(format!("{s:?} is not NAME=VALUE")),
    }
}

/// `paddock check`: whether this runtime can run sandboxes here, item by item. Exit status 0
/// only when everything needed passes.
pub async fn check(opts: &RuntimeOpts, data_dir: &Path, naming: NamingMode, probe: bool, json: bool) -> Result<u8> {
    // The runtime as a CLI command opens it, with this command line's options: what is
    // checked is what would serve.
    let rt = open(opts, data_dir, naming, false).await?;
    let report = rt.check(probe).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("paddock check: {} runtime, namespace {}", rt.capabilities().runtime, report.namespace);
        for item in &report.items {
            let mark = match item.status {
                CheckStatus::Pass => "ok  ",
                CheckStatus::Warn => "warn",
                CheckStatus::Fail => "FAIL",
            };
            println!("  {mark} {:<44} {}", item.check, item.detail);
        }
        if !report.missing.is_empty() {
            println!("missing permissions: {}", report.missing.join(", "));
        }
        println!("network policy: {}", report.network_policy);
        println!("{}", if report.ok() { "ready" } else { "NOT ready: fix the items marked FAIL" });
    }
    Ok(if report.ok() { 0 } else { 1 })
}

/// Pulls a sandbox's image with progress before a CLI create, when the chosen runtime pulls
/// into this host's store.
pub async fn prepull(opts: &RuntimeOpts, data_dir: &Path, image: Option<&str>) -> Result<()> {
    match opts.entry()?.prepull {
        Some(prepull) => prepull(opts, data_dir, image).await,
        None => Ok(()),
    }
}

/// Opens the chosen runtime. A server (`serving`) also starts the runtime's own background
/// work (reaping expired sandboxes on Kubernetes, the supervisor launcher of the local one).
pub async fn open(opts: &RuntimeOpts, data_dir: &Path, naming: NamingMode, serving: bool) -> Result<Arc<dyn Runtime>> {
    (opts.entry()?.open)(opts, data_dir, naming, serving).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn opts(line: &str) -> RuntimeOpts {
        crate::cli::Cli::try_parse_from(std::iter::once("paddock").chain(line.split_whitespace())).unwrap().runtime
    }

    #[test]
    fn every_runtime_in_the_table_is_chosen_by_its_name_and_local_is_the_default() {
        let names: Vec<&str> = RUNTIMES.iter().map(|e| e.name).collect();
        assert_eq!(names, ["local", "kubernetes"]);
        assert_eq!(opts("ps").entry().unwrap().name, "local");
        for name in names {
            assert_eq!(opts(&format!("--runtime {name} ps")).entry().unwrap().name, name);
        }
        let e = crate::cli::Cli::try_parse_from(["paddock", "--runtime", "qemu", "ps"]).unwrap_err().to_string();
        assert!(e.contains("[possible values: local, kubernetes]"), "{e}");
    }

    #[test]
    fn options_of_one_runtime_are_refused_by_another_and_answered_by_their_own() {
        let given = "--gateway-address 192.0.2.5:8081 --priority-class batch=paddock-batch ps";
        let local = opts(&format!("--runtime local {given}"));
        let e = local.gateway_address().unwrap_err().to_string();
        assert!(e.contains("--gateway-address 192.0.2.5:8081 is for the Kubernetes runtime"), "{e}");
        let e = local.priority_tiers().unwrap_err().to_string();
        assert!(e.contains("--priority-class is for the Kubernetes runtime"), "{e}");
        let plain = opts("--runtime local ps");
        assert_eq!(plain.gateway_address().unwrap(), None);
        assert!(plain.priority_tiers().unwrap().is_empty());

        let kube = opts(&format!("--runtime kubernetes {given}"));
        assert_eq!(kube.gateway_address().unwrap(), Some("192.0.2.5:8081".parse().unwrap()));
        assert_eq!(kube.priority_tiers().unwrap(), ["batch"]);
        // Only a runtime that pulls into this host's store pulls before a CLI create.
        assert!(local.entry().unwrap().prepull.is_some());
        assert!(kube.entry().unwrap().prepull.is_none());
    }
}
