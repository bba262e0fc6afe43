//! `paddock`: the one binary. The CLI, the hidden per-sandbox supervisor entry point, and (later)
//! the server all live here; the supervisor is dispatched before any async runtime exists, so it
//! stays single-threaded.

mod bench;
mod bench_k8s;
mod cli;
mod gate;
mod image_cmd;
mod output;
mod runtimes;
mod serve;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    if let cli::Command::Supervise { data_dir, id } = &args.command {
        let id = match paddock_core::runtime::SandboxId::parse(id) {
            Ok(id) => id,
            Err(e) => {
                eprintln!("paddock: {e}");
                return ExitCode::from(2);
            }
        };
        return ExitCode::from(paddock_runtime_local::supervisor::main(data_dir, &id) as u8);
    }
    // The server wants every core; a CLI command is one request and is quicker on one thread.
    let builder = if matches!(args.command, cli::Command::Serve(_)) {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match { builder }.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("paddock: error: cannot start the async runtime: {e}");
            return ExitCode::from(125);
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("paddock: error: {e:#}");
            ExitCode::from(cli::ERROR_EXIT)
        }
    }
}
