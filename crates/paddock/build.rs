//! Links libgcc's unwinder into `paddock` instead of loading `libgcc_s.so.1` at every start.
//!
//! Every command a user runs starts this binary, and `paddock run` waits for that start. With
//! libgcc_s the dynamic loader maps, relocates and searches one more shared object, and the
//! object's constructor probes the CPU's features with `cpuid`, which traps to the hypervisor
//! on a VM; together 0.6–0.7 ms of a 12 ms `paddock run -- echo x` (BENCHMARKS.md, "Thin LTO,
//! a static unwinder, and the CLI's launcher…"). Rust's standard library asks the linker for `-lgcc_s` by name and
//! offers no switch for the static unwinder on glibc targets short of a fully static binary
//! (which breaks glibc's name service lookups), so this script puts a one-line linker script of
//! that name first on the search path, naming `libgcc_eh.a`: the same unwinder, linked in the
//! way `gcc -static-libgcc` links it for C programs.
//!
//! Only for a native linux-gnu build whose C compiler knows a `libgcc_eh.a`; otherwise, or with
//! `PADDOCK_DYNAMIC_LIBGCC=1`, the binary links libgcc_s as before.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PADDOCK_DYNAMIC_LIBGCC");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo::rustc-check-cfg=cfg(static_libgcc)");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let native = var("TARGET") == var("HOST");
    if var("CARGO_CFG_TARGET_OS") != "linux" || var("CARGO_CFG_TARGET_ENV") != "gnu" || !native {
        return;
    }
    if std::env::var_os("PADDOCK_DYNAMIC_LIBGCC").is_some_and(|v| !v.is_empty() && v != "0") {
        return;
    }
    let Some(libgcc_eh) = static_unwinder() else {
        println!("cargo:warning=no libgcc_eh.a found by the C compiler: paddock loads libgcc_s.so.1 at start");
        return;
    };
    let dir = PathBuf::from(var("OUT_DIR")).join("static-libgcc");
    let script = format!("INPUT({})\n", libgcc_eh.display());
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join("libgcc_s.so"), script)) {
        println!("cargo:warning=cannot write the libgcc_s linker script in {}: {e}", dir.display());
        return;
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    // For the test that no libgcc_s is loaded.
    println!("cargo:rustc-cfg=static_libgcc");
}

/// The C compiler's `libgcc_eh.a`, if it has one: `-print-file-name` prints the bare name when
/// it finds none.
fn static_unwinder() -> Option<PathBuf> {
    let cc = std::env::var("CC").ok().filter(|c| !c.is_empty()).unwrap_or_else(|| "cc".into());
    let out = Command::new(cc).arg("-print-file-name=libgcc_eh.a").output().ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (out.status.success() && path.is_absolute() && path.is_file()).then_some(path)
}
