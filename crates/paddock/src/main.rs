//! `paddock`: the one binary. The CLI, the hidden per-sandbox supervisor entry point, and (later)
//! the server all live here; the supervisor is dispatched before any async runtime exists, so it
//! stays single-threaded.

mod cli;
mod gate;
mod image_cmd;
mod output;
mod runs_cmd;
mod runtimes;
mod serve;
mod tenant_cmd;

use std::process::ExitCode;

fn main() -> ExitCode {
    // Every create starts a supervisor: spare it building the whole CLI's parser (about half a
    // millisecond) when it is started the one way `LocalRuntime` starts it.
    let early: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some((data_dir, id)) = supervise_args(&early) {
        return supervise(&data_dir, &id);
    }
    if is_launcher(&early) {
        return exit_code(paddock_runtime_local::launcher::main());
    }
    let create = may_create(&early);
    // The freed heap is copied into a forked launcher too: no copy of the arguments may be
    // left in it.
    paddock_sys::process::wipe(early);
    // A command that may start a sandbox here forks its supervisor's launcher now, while this
    // process holds nothing but its arguments and environment (which the launcher erases): it
    // becomes the sandbox's supervisor when asked, where an exec of this binary costs about a
    // millisecond.
    if create {
        // On an error (a descriptor the starter passed, say) supervisors are exec'd instead.
        if let Ok(launcher) = paddock_runtime_local::launcher::Launcher::fork_now() {
            runtimes::give_forked_launcher(launcher);
        }
    }
    let args = cli::Cli::parse_command_line();
    if let cli::Command::Supervise { id } = &args.command {
        return supervise(&args.data_dir, id);
    }
    // The egress enforcer enters a sandbox's network namespace on its only thread, so it
    // starts its own (single-threaded) async runtime after that.
    if let cli::Command::EgressEnforcer { id } = &args.command {
        return match paddock_core::runtime::SandboxId::parse(id) {
            Ok(id) => exit_code(paddock_runtime_local::egress::main(&args.data_dir, &id)),
            Err(e) => {
                eprintln!("paddock: {e}");
                ExitCode::from(2)
            }
        };
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
    let result = runtime.block_on(cli::run(args));
    // Dropping the runtime would wait for its idle blocking-pool threads (the ones behind
    // tokio's stdout, stderr and file handles) to wake up and exit, a millisecond or more on a
    // busy machine at the end of every command. Everything was written and flushed before `run`
    // returned, so nothing is lost by not waiting.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("paddock: error: {e:#}");
            ExitCode::from(cli::ERROR_EXIT)
        }
    }
}

/// `__supervise --data-dir DIR --id ID`, exactly as the local runtime passes it.
fn supervise_args(args: &[std::ffi::OsString]) -> Option<(std::path::PathBuf, String)> {
    match args {
        [sub, dd, data_dir, i, id] if sub == "__supervise" && dd == "--data-dir" && i == "--id" => {
            Some((data_dir.into(), id.to_str()?.to_owned()))
        }
        _ => None,
    }
}

/// `__launcher`, exactly as the local runtime passes it.
fn is_launcher(args: &[std::ffi::OsString]) -> bool {
    matches!(args, [a] if a == "__launcher")
}

/// Whether a command line may create a sandbox: `run` or `create` before any `--`. A false
/// positive costs a fork (and a launcher that waits for the command's end); a miss, an exec
/// per create.
fn may_create(args: &[std::ffi::OsString]) -> bool {
    args.iter().take_while(|a| *a != "--").any(|a| a == "run" || a == "create")
}

fn supervise(data_dir: &std::path::Path, id: &str) -> ExitCode {
    let id = match paddock_core::runtime::SandboxId::parse(id) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("paddock: {e}");
            return ExitCode::from(2);
        }
    };
    exit_code(paddock_runtime_local::supervisor::main(data_dir, &id, None))
}

/// A helper's status as this process's exit code: one outside 0..=255 is 255, never a
/// truncation that could read as success (256 would be 0).
fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_runtimes_own_supervise_and_launcher_lines_skip_the_parser() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let ok = super::supervise_args(&args(&["__supervise", "--data-dir", "/d", "--id", "sbx-1"]));
        assert_eq!(ok, Some(("/d".into(), "sbx-1".to_owned())));
        assert_eq!(super::supervise_args(&args(&["__supervise", "--id", "x", "--data-dir", "/d"])), None);
        assert_eq!(super::supervise_args(&args(&["__supervise", "--data-dir", "/d", "--id", "x", "y"])), None);
        assert_eq!(super::supervise_args(&args(&["run", "--", "echo"])), None);
        assert!(super::is_launcher(&args(&["__launcher"])));
        assert!(!super::is_launcher(&args(&["__launcher", "x"])));
        assert!(!super::is_launcher(&args(&["run", "__launcher"])));
        assert!(super::may_create(&args(&["--data-dir", "/d", "run", "--", "echo"])));
        assert!(super::may_create(&args(&["create", "--image", "host"])));
        assert!(!super::may_create(&args(&["ls"])));
        assert!(!super::may_create(&args(&["exec", "sbx-1", "--", "run"])));
    }

    /// `build.rs` links libgcc's unwinder into the binary: no libgcc_s is loaded, and a panic
    /// still unwinds (running destructors on the way) to where it is caught, as the server's
    /// tasks and the tests rely on.
    #[test]
    fn panics_unwind_through_the_linked_in_unwinder() {
        struct Dropped<'a>(&'a std::cell::Cell<bool>);
        impl Drop for Dropped<'_> {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        let dropped = std::cell::Cell::new(false);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _guard = Dropped(&dropped);
            std::panic::resume_unwind(Box::new(7_u32));
        }));
        assert_eq!(caught.err().and_then(|p| p.downcast::<u32>().ok()).map(|b| *b), Some(7));
        assert!(dropped.get(), "the unwinder skipped a destructor");
        let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
        if cfg!(static_libgcc) {
            assert!(!maps.contains("libgcc_s"), "libgcc_s is loaded although build.rs linked libgcc_eh:\n{maps}");
        }
    }
}
