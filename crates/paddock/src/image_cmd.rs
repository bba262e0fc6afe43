//! `paddock image ...`: pull, list, remove, prune and import the OCI images sandboxes run on.
//! The store is `<data-dir>/images`, shared with the local runtime.

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use paddock_core::units::format_bytes;
use paddock_image::{Credentials, Image, ImageInfo, Progress, PullOptions, RegistryConfig, Store};

// `paddock image …`; registries come from the global `--registry-mirror` and
// `--insecure-registry`, which `serve` uses too.
#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    pub command: ImageCommand,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Download an image (e.g. python:3.11, registry.example.com/team/img:tag, name@sha256:...)
    /// into the store; layers already there are not fetched again.
    Pull {
        reference: String,
        /// Registry user name; the password is read from standard input (--password-stdin).
        #[arg(long, requires = "password_stdin")]
        username: Option<String>,
        /// Read the registry password (or token) from the first line of standard input.
        #[arg(long, requires = "username")]
        password_stdin: bool,
    },
    /// List stored images: names, digest, size, and the sandboxes using each.
    Ls,
    /// Remove image names, then free what no name or sandbox uses any more.
    Rm {
        #[arg(required = true)]
        references: Vec<String>,
        /// Untag even an image sandboxes use (its content stays until they are gone).
        #[arg(long)]
        force: bool,
    },
    /// Free every image, layer and leftover no name or sandbox uses.
    Prune,
    /// Import an OCI image layout (directory or tar) or a `docker save` tarball, for hosts
    /// without a registry; the image is then usable by its name.
    Import {
        file: PathBuf,
        /// The name to store it under (default: the name the archive records).
        #[arg(long)]
        tag: Option<String>,
    },
}

fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..hex.len().min(12)]
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Per-layer progress on stderr: one line redrawn in place on a terminal, a line per layer
/// otherwise (logs and CI stay readable).
fn show_progress(tty: bool) -> impl Fn(&Progress) + Send + Sync {
    move |p: &Progress| match p {
        Progress::Resolving { reference, registry } => eprintln!("resolving {reference} at {registry}"),
        Progress::Resolved { digest, layers } => eprintln!("{digest}: {layers} layer(s)"),
        Progress::Cached { digest } => eprintln!("{}: already stored", short(digest)),
        Progress::Layer { digest, done, total } if tty => {
            let of = if *total > 0 { format!(" / {}", format_bytes(*total)) } else { String::new() };
            eprint!("\r\x1b[K{}: downloading {}{of}", short(digest), format_bytes(*done));
        }
        Progress::Layer { .. } => {}
        Progress::Unpacking { digest } => {
            let clear = if tty { "\r\x1b[K" } else { "" };
            eprintln!("{clear}{}: downloaded, unpacking", short(digest));
        }
        Progress::Done { downloaded_bytes, .. } => eprintln!("downloaded {}", format_bytes(*downloaded_bytes)),
    }
}

fn image_out(img: &Image, json: bool) -> Result<()> {
    if json {
        print_json(&serde_json::json!({
            "name": img.name,
            "digest": img.digest,
            "layers": img.layers.len(),
            "config": img.config,
        }))
    } else {
        println!("{} {}", img.name, img.digest);
        Ok(())
    }
}

fn list_out(infos: &[ImageInfo], json: bool) -> Result<()> {
    if json {
        return print_json(&infos);
    }
    println!("{:<48} {:<12} {:>10} {:<20} USED BY", "NAME", "DIGEST", "SIZE", "CREATED");
    for i in infos {
        let used = if i.holders.is_empty() { "-".to_string() } else { i.holders.join(",") };
        let created = i.created.as_deref().map(|c| c.get(..19).unwrap_or(c)).unwrap_or("-");
        let names = if i.names.is_empty() { vec!["<none>".to_string()] } else { i.names.clone() };
        for n in names {
            println!("{:<48} {:<12} {:>10} {:<20} {}", n, short(&i.digest), format_bytes(i.size), created, used);
        }
    }
    Ok(())
}

/// Gives back the leases of sandboxes that are gone without saying so (a supervisor killed
/// with -9 never releases): their images would otherwise never be pruned. A sandbox's
/// directory exists before its lease is taken and is removed before the lease is released.
fn forget_gone_holders(data_dir: &Path, store: &Store) -> Result<()> {
    for info in store.list()? {
        for holder in &info.holders {
            if !data_dir.join("sandboxes").join(holder).exists() {
                store.release(holder)?;
            }
        }
    }
    Ok(())
}

/// Pulls `reference` with progress on stderr unless the store has it: what `paddock run` and
/// `create` do first, so a long pull is not a silent wait.
pub async fn ensure_pulled(
    data_dir: &Path,
    reference: &str,
    registries: RegistryConfig,
    limits: paddock_image::Limits,
) -> Result<()> {
    let store = Store::open(&data_dir.join("images"))?.with_limits(limits);
    if store.lookup(reference)?.is_some() {
        return Ok(());
    }
    let progress = show_progress(std::io::stderr().is_terminal());
    store.pull(reference, &PullOptions { auth: None, registries, private: false }, &progress).await?;
    Ok(())
}

pub async fn run(
    data_dir: &Path,
    args: ImageArgs,
    registries: RegistryConfig,
    limits: paddock_image::Limits,
    json: bool,
) -> Result<u8> {
    let store = Store::open(&data_dir.join("images"))?.with_limits(limits);
    if !matches!(args.command, ImageCommand::Pull { .. } | ImageCommand::Import { .. }) {
        forget_gone_holders(data_dir, &store)?;
    }
    match args.command {
        ImageCommand::Pull { reference, username, password_stdin } => {
            let auth = match (username, password_stdin) {
                (Some(username), true) => {
                    let mut password = String::new();
                    std::io::stdin().lock().read_line(&mut password).context("reading the password from stdin")?;
                    let password = password.trim_end_matches(['\r', '\n']).to_string();
                    if password.is_empty() {
                        bail!("--password-stdin: standard input gave an empty password");
                    }
                    Some(Credentials { username, password })
                }
                _ => None,
            };
            let opts = PullOptions { auth, registries, private: false };
            let progress = show_progress(std::io::stderr().is_terminal());
            let img = store.pull(&reference, &opts, &progress).await?;
            image_out(&img, json)?;
        }
        ImageCommand::Ls => list_out(&store.list()?, json)?,
        ImageCommand::Rm { references, force } => {
            for r in &references {
                store.remove_with(r, force)?;
                if !json {
                    println!("untagged {}", paddock_image::normalize(r)?);
                }
            }
            let report = tokio::task::spawn_blocking(move || store.prune()).await??;
            if json {
                print_json(&serde_json::json!({ "untagged": references, "pruned": report }))?;
            } else {
                println!("freed {}", format_bytes(report.freed_bytes));
            }
        }
        ImageCommand::Prune => {
            let report = tokio::task::spawn_blocking(move || store.prune()).await??;
            if json {
                print_json(&report)?;
            } else {
                println!(
                    "removed {} image(s), {} layer(s), {} leftover(s); freed {}",
                    report.images.len(),
                    report.layers,
                    report.temp_entries,
                    format_bytes(report.freed_bytes)
                );
            }
        }
        ImageCommand::Import { file, tag } => {
            let img = tokio::task::spawn_blocking(move || store.import(&file, tag.as_deref())).await??;
            image_out(&img, json)?;
        }
    }
    Ok(0)
}
