//! `paddock tenant ...`: tenants and their API keys, in the server's database on the data
//! directory. A running `paddock serve` on the same directory honours a change at once (a new
//! key on its first use) or within seconds (a removal, a quota, a model route). `add` and `rotate` print the
//! new key alone on their last line, so `| tail -1` is the key.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use paddock_core::units::{format_bytes, parse_bytes, parse_duration};
use paddock_server::tenants::{self, Quotas};
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Add a tenant and print its API key (shown once: only its digest is kept).
    Add {
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
        #[command(flatten)]
        route: RouteArgs,
    },
    /// List tenants, their quotas and their keys' ids (never the keys).
    Ls,
    /// Give a tenant a new key and print it; its current keys keep working for --grace.
    Rotate {
        name: String,
        /// How long the old keys keep working (e.g. 1h, 0s: not at all).
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        grace: Duration,
    },
    /// Remove a tenant and its keys. What it made stays, for the CLI on this data directory.
    Rm { name: String },
    /// Change a tenant's quotas or model route: what is given replaces, the rest stays
    /// (--clear drops all quotas first, --no-llm the route).
    Set {
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
        /// Start from no quotas.
        #[arg(long)]
        clear: bool,
        #[command(flatten)]
        route: RouteArgs,
        /// Take the tenant's own model route away (its sandboxes use paddock serve --llm-base
        /// again, if given).
        #[arg(long, conflicts_with_all = ["llm_base", "llm_key_file"])]
        no_llm: bool,
    },
    /// Print the SHA-256 digest of a key read from standard input, for `--tenants FILE`.
    Digest,
}

#[derive(Debug, Args)]
pub struct QuotaArgs {
    /// Sandboxes the tenant may have at once.
    #[arg(long, value_name = "N")]
    max_sandboxes: Option<u64>,
    /// Memory limits of its sandboxes, summed (e.g. 16GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<u64>,
    /// Unfinished runs of a tier, TIER=N (repeatable).
    #[arg(long = "max-runs", value_name = "TIER=N", value_parser = parse_tier_count)]
    max_runs: Vec<(String, u64)>,
    /// Tokens its sandboxes may spend through the model route, in all.
    #[arg(long, value_name = "N")]
    max_model_tokens: Option<u64>,
}

/// The tenant's own model route: its sandboxes' `$PADDOCK_LLM_BASE` reaches this upstream
/// instead of `paddock serve --llm-base`'s, with the key from the file added outside them.
#[derive(Debug, Args)]
pub struct RouteArgs {
    /// An OpenAI-compatible model API the tenant's sandboxes call (normalised to one /v1).
    #[arg(long, value_name = "URL")]
    llm_base: Option<String>,
    /// The provider key for --llm-base: the first line of this file, which the server reads as
    /// each call goes out (keep it 0600; replacing it rotates the key). Its path is stored,
    /// never the key.
    #[arg(long, value_name = "PATH")]
    llm_key_file: Option<std::path::PathBuf>,
}

impl RouteArgs {
    /// The route these flags give, on top of the tenant's `current` one; `None`: no change.
    fn route(self, current: Option<&tenants::ModelRoute>) -> Result<Option<tenants::ModelRoute>> {
        let base = match (self.llm_base, current) {
            (None, None) if self.llm_key_file.is_some() => {
                bail!("--llm-key-file needs a route to send the key to: give --llm-base URL too")
            }
            (None, None) => return Ok(None),
            (None, Some(c)) if self.llm_key_file.is_none() => return Ok(Some(c.clone())),
            (None, Some(c)) => c.base.clone(),
            (Some(b), _) => b,
        };
        // A new base without a key file keeps no old key: that key was for another upstream.
        let key_file = self.llm_key_file;
        if let Some(path) = &key_file {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!("reading --llm-key-file {}: the server reads it on each call", path.display())
            })?;
            if text.lines().next().unwrap_or("").trim().is_empty() {
                bail!("--llm-key-file {} is empty: its first line is the provider key", path.display());
            }
        }
        Ok(Some(tenants::ModelRoute::new(&base, key_file.as_deref())?))
    }
}

fn describe_route(route: Option<&tenants::ModelRoute>) -> String {
    match route {
        None => "no model route of its own".into(),
        Some(r) => match &r.key_file {
            Some(f) => format!("model route {} (key from {})", r.base, f.display()),
            None => format!("model route {} (no key)", r.base),
        },
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}

fn parse_tier_count(s: &str) -> Result<(String, u64), String> {
    let (tier, n) = s.split_once('=').ok_or_else(|| format!("{s:?}: give TIER=N, e.g. batch=10"))?;
    let n = n.trim().parse().map_err(|_| format!("{s:?}: N must be a whole number"))?;
    Ok((tier.trim().to_owned(), n))
}

impl QuotaArgs {
    fn apply(self, q: &mut Quotas) {
        if let Some(n) = self.max_sandboxes {
            q.sandboxes = Some(n);
        }
        if let Some(n) = self.max_memory {
            q.memory_bytes = Some(n);
        }
        for (tier, n) in self.max_runs {
            q.runs.insert(tier, n);
        }
        if let Some(n) = self.max_model_tokens {
            q.model_tokens = Some(n);
        }
    }
}

fn describe(q: &Quotas) -> String {
    let mut parts = Vec::new();
    if let Some(n) = q.sandboxes {
        parts.push(format!("sandboxes {n}"));
    }
    if let Some(n) = q.memory_bytes {
        parts.push(format!("memory {}", format_bytes(n)));
    }
    for (tier, n) in &q.runs {
        parts.push(format!("runs.{tier} {n}"));
    }
    if let Some(n) = q.model_tokens {
        parts.push(format!("modelTokens {n}"));
    }
    if parts.is_empty() { "no quotas".into() } else { parts.join(", ") }
}

async fn open(data_dir: &Path) -> Result<paddock_server::store::Store> {
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let path = data_dir.join("server.db");
    paddock_server::secrets::prepare_database_file(&path)?;
    paddock_server::store::Store::open(&path)
        .await
        .with_context(|| format!("opening the server's database {}", path.display()))
}

pub async fn run(command: TenantCommand, data_dir: &Path, json: bool) -> Result<u8> {
    if let TenantCommand::Digest = command {
        let mut key = String::new();
        std::io::stdin().read_to_string(&mut key).context("reading the key from standard input")?;
        let key = key.trim();
        if key.is_empty() {
            bail!("no key on standard input: echo the key into `paddock tenant digest`");
        }
        let d = tenants::digest_hex(key);
        if json {
            println!("{}", json!({"keySha256": d}));
        } else {
            println!("{d}");
        }
        return Ok(0);
    }
    let store = open(data_dir).await?;
    let pool = store.pool();
    match command {
        TenantCommand::Add { name, quotas, route } => {
            let mut q = Quotas::default();
            quotas.apply(&mut q);
            // Checked before the tenant exists, so a bad route adds nothing.
            let route = route.route(None)?;
            tenants::validate_name(&name)?;
            let key = tenants::add_with_route(pool, &name, &q, route.as_ref()).await?;
            if json {
                println!("{}", json!({"name": name, "quotas": q, "modelRoute": route, "key": key}));
            } else {
                println!(
                    "added tenant {name} ({}; {}); its API key, shown only now:",
                    describe(&q),
                    describe_route(route.as_ref())
                );
                println!("{key}");
            }
        }
        TenantCommand::Rotate { name, grace } => {
            let key = tenants::rotate(pool, &name, grace).await?;
            if json {
                println!("{}", json!({"name": name, "graceSeconds": grace.as_secs(), "key": key}));
            } else {
                println!(
                    "new key for tenant {name}; its previous keys work for {}s more. The new key, shown only now:",
                    grace.as_secs()
                );
                println!("{key}");
            }
        }
        TenantCommand::Rm { name } => {
            tenants::remove(pool, &name).await?;
            let (left, _) = store.held_by(&name).await.unwrap_or_default();
            if json {
                println!("{}", json!({"removed": name, "sandboxesLeft": left}));
            } else {
                println!("removed tenant {name} and its keys");
                if left > 0 {
                    println!("{left} of its sandboxes still exist: `paddock ls` shows them, `paddock rm` removes them");
                }
            }
        }
        TenantCommand::Set { name, quotas, clear, route, no_llm } => {
            let current = tenants::list(pool).await?.into_iter().find(|t| t.name == name);
            let Some(current) = current else { bail!(tenants::TenantError::NotFound(name)) };
            let route = if no_llm { None } else { route.route(current.model_route.as_ref())? };
            let mut q = if clear { Quotas::default() } else { current.quotas };
            quotas.apply(&mut q);
            tenants::set_quotas(pool, &name, &q).await?;
            if route != current.model_route {
                tenants::set_model_route(pool, &name, route.as_ref()).await?;
            }
            if json {
                println!("{}", json!({"name": name, "quotas": q, "modelRoute": route}));
            } else {
                println!("tenant {name}: {}; {}", describe(&q), describe_route(route.as_ref()));
            }
        }
        TenantCommand::Ls => {
            let all = tenants::list(pool).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else if all.is_empty() {
                println!(
                    "no tenants: the server's own key (the api-key file) is the only one; add one with `paddock tenant add NAME`"
                );
            } else {
                println!("{:<24} {:<30} {:<40} QUOTAS", "NAME", "KEYS", "MODEL ROUTE");
                for t in all {
                    let keys: Vec<String> = t
                        .keys
                        .iter()
                        .map(|k| match k.expires_at_ms {
                            Some(e) => {
                                let left = (e - paddock_server::store::now_ms()).max(0) / 1000;
                                format!("{} ({left}s left)", k.id)
                            }
                            None => k.id.clone(),
                        })
                        .collect();
                    let route = t.model_route.as_ref().map_or("-".to_owned(), |r| r.base.clone());
                    println!("{:<24} {:<30} {:<40} {}", t.name, keys.join(" "), route, describe(&t.quotas));
                }
            }
        }
        TenantCommand::Digest => unreachable!("handled above"),
    }
    Ok(0)
}
