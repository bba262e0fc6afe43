//! `paddock bench`: Paddock measured side by side with bubblewrap in the same run.

use anyhow::Result;
use clap::Args;
use paddock_runtime_local::LocalRuntime;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Iterations of each latency measurement.
    #[arg(long, default_value_t = 200)]
    pub iterations: usize,
}

pub async fn run(_rt: &LocalRuntime, _args: BenchArgs, _json: bool) -> Result<u8> {
    anyhow::bail!("paddock bench is being written")
}
