//! `paddock runs ...`: the run API of a `paddock serve`, from the command line. Human output
//! by default, `--json` for scripts.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand};
use paddock_core::units::parse_duration;
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct RunsArgs {
    /// The server's base URL.
    #[arg(long, env = "PADDOCK_SERVER", default_value = "http://127.0.0.1:8080", global = true)]
    server: String,
    #[command(subcommand)]
    command: RunsCommand,
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// Queue a run: its driver command runs in a sandbox of its own (or its thread's), with
    /// $PADDOCK_GATEWAY and $PADDOCK_TOKEN to call home.
    Submit {
        /// The tier (default: the server's lowest).
        #[arg(long)]
        tier: Option<String>,
        /// The sandbox's image (default: the runtime's).
        #[arg(long)]
        image: Option<String>,
        /// A thread whose persistent workspace the run gets; its runs never run at once.
        #[arg(long)]
        thread: Option<String>,
        /// With --thread: refuse (409) instead of waiting while the thread has a run.
        #[arg(long)]
        reject_if_busy: bool,
        /// NAME=VALUE for the driver's environment (repeatable).
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Memory of the sandbox, e.g. 1Gi.
        #[arg(long)]
        memory: Option<String>,
        /// CPUs of the sandbox, e.g. 500m or 2.
        #[arg(long)]
        cpus: Option<String>,
        /// How long each attempt may run (default 1h, at most 8h).
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// Attempts before a run that keeps being lost fails (default 3).
        #[arg(long)]
        max_attempts: Option<i64>,
        /// A tar the driver fetches with GET $PADDOCK_GATEWAY/v1/inputs.
        #[arg(long, value_name = "FILE.tar")]
        inputs: Option<PathBuf>,
        /// Submitting again with the same key gives the same run.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Follow the run until it ends; exit 0 only if it succeeded.
        #[arg(long)]
        wait: bool,
        /// The driver and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// List runs.
    Ls {
        #[arg(long)]
        tier: Option<String>,
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        thread: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show one run.
    Get { id: String },
    /// Cancel a run (its attempt is stopped, its sandbox given back).
    Cancel { id: String },
    /// Print a run's events (state changes, attempts, the driver's own), following until it ends.
    Events {
        id: String,
        /// Only events after this number.
        #[arg(long, default_value_t = 0)]
        after: i64,
    },
    /// Write the result tar the driver uploaded (to FILE, or stdout).
    Result {
        id: String,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Print the driver's output (its first MiB).
    Output { id: String },
}

struct Client {
    base: String,
    key: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    fn new(server: &str, data_dir: &Path) -> Self {
        let key = std::env::var("PADDOCK_API_KEY")
            .ok()
            .or_else(|| std::env::var("OPEN_SANDBOX_API_KEY").ok())
            .filter(|k| !k.is_empty())
            .or_else(|| std::fs::read_to_string(data_dir.join("api-key")).ok().map(|k| k.trim().to_owned()));
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .build()
            .into();
        Self { base: server.trim_end_matches('/').to_owned(), key, agent }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v1{path}", self.base)
    }

    fn auth<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.key {
            Some(k) => r.header("OPEN-SANDBOX-API-KEY", k),
            None => r,
        }
    }

    /// The body of a successful answer, or the server's `{code, message}` as the error.
    fn answer(&self, r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<ureq::Body> {
        let r =
            r.map_err(|e| anyhow!("cannot reach the server at {}: {e} (set --server or PADDOCK_SERVER)", self.base))?;
        let status = r.status();
        let mut body = r.into_body();
        if status.is_success() {
            return Ok(body);
        }
        let text = body.read_to_string().unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        match (v["code"].as_str(), v["message"].as_str()) {
            (Some(code), Some(message)) => bail!("{message} ({code}, HTTP {})", status.as_u16()),
            _ => bail!("the server answered HTTP {}: {text}", status.as_u16()),
        }
    }

    fn json(&self, r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<Value> {
        let text = self.answer(r)?.read_to_string().context("reading the server's answer")?;
        serde_json::from_str(&text).context("the server's answer is not JSON")
    }

    fn get(&self, path: &str) -> Result<Value> {
        self.json(self.auth(self.agent.get(self.url(path))).call())
    }

    fn post(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Result<Value> {
        let mut r = self.auth(self.agent.post(self.url(path)));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        self.json(r.header("content-type", "application/json").send(body.to_string()))
    }
}

fn human(run: &Value) {
    let s = |k: &str| run[k].as_str().unwrap_or("-").to_owned();
    let mut line = format!(
        "{}  {}  tier {}  attempt {}/{}  epoch {}",
        s("id"),
        s("state"),
        s("tier"),
        run["attempt"],
        run["maxAttempts"],
        run["epoch"]
    );
    if let Some(code) = run["exitCode"].as_i64() {
        line.push_str(&format!("  exit {code}"));
    }
    if let Some(r) = run["reason"].as_str() {
        line.push_str(&format!("  ({r})"));
    }
    println!("{line}");
}

fn print(run: &Value, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(run).expect("JSON prints"));
    } else {
        human(run);
    }
}

/// Prints each event of a run's stream; answers the last state seen.
fn follow(c: &Client, id: &str, after: i64, json: bool) -> Result<Option<String>> {
    let r = c
        .auth(c.agent.get(c.url(&format!("/runs/{id}/events?after={after}"))))
        .header("accept", "text/event-stream")
        .call();
    let body = c.answer(r)?;
    let mut last_state = None;
    for line in std::io::BufReader::new(body.into_reader()).lines() {
        let line = line.context("reading the event stream")?;
        let Some(data) = line.strip_prefix("data:") else { continue };
        let ev: Value = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
        if ev["type"] == "state" {
            last_state = ev["data"]["state"].as_str().map(str::to_owned);
        }
        if json {
            println!("{ev}");
        } else {
            let d = &ev["data"];
            let what = match ev["type"].as_str() {
                Some("state") => format!(
                    "state {} (attempt {}, epoch {}){}",
                    d["state"].as_str().unwrap_or("?"),
                    d["attempt"],
                    d["epoch"],
                    d["reason"].as_str().map(|r| format!(": {r}")).unwrap_or_default()
                ),
                Some("attempt") => {
                    format!("attempt {} in sandbox {}", d["attempt"], d["sandboxId"].as_str().unwrap_or("?"))
                }
                Some("driver") => format!("driver {}: {}", d["type"].as_str().unwrap_or("?"), d["data"]),
                Some(other) => format!("{other}: {d}"),
                None => continue,
            };
            println!("{:>4}  {}  {what}", ev["seq"], ev["at"].as_str().unwrap_or(""));
        }
        let _ = std::io::stdout().flush();
    }
    Ok(last_state)
}

pub fn run(args: RunsArgs, data_dir: &Path, json: bool) -> Result<u8> {
    let c = Client::new(&args.server, data_dir);
    match args.command {
        RunsCommand::Submit {
            tier,
            image,
            thread,
            reject_if_busy,
            env,
            memory,
            cpus,
            timeout,
            max_attempts,
            inputs,
            idempotency_key,
            wait,
            command,
        } => {
            let mut envs = BTreeMap::new();
            for kv in env {
                let (k, v) = kv.split_once('=').ok_or_else(|| anyhow!("--env {kv:?}: write it as NAME=VALUE"))?;
                envs.insert(k.to_owned(), v.to_owned());
            }
            let mut resources = BTreeMap::new();
            if let Some(m) = memory {
                resources.insert("memory", m);
            }
            if let Some(c) = cpus {
                resources.insert("cpu", c);
            }
            let mut body = json!({"command": command, "env": envs, "resources": resources});
            let set = |body: &mut Value, k: &str, v: Value| {
                body[k] = v;
            };
            if let Some(t) = tier {
                set(&mut body, "tier", json!(t));
            }
            if let Some(i) = image {
                set(&mut body, "image", json!(i));
            }
            if let Some(t) = thread {
                set(&mut body, "thread", json!(t));
            }
            if reject_if_busy {
                set(&mut body, "ifBusy", json!("reject"));
            }
            if let Some(t) = timeout {
                set(&mut body, "timeout", json!(t.as_secs().max(1)));
            }
            if let Some(m) = max_attempts {
                set(&mut body, "maxAttempts", json!(m));
            }
            if let Some(path) = inputs {
                let mut raw = Vec::new();
                std::fs::File::open(&path)
                    .and_then(|mut f| f.read_to_end(&mut raw))
                    .with_context(|| format!("reading --inputs {}", path.display()))?;
                use base64::Engine;
                set(&mut body, "inputs", json!(base64::engine::general_purpose::STANDARD.encode(raw)));
            }
            let headers: Vec<(&str, &str)> =
                idempotency_key.as_deref().map(|k| vec![("Idempotency-Key", k)]).unwrap_or_default();
            let run = c.post("/runs", &body, &headers)?;
            let id = run["id"].as_str().unwrap_or_default().to_owned();
            if !wait {
                if json {
                    print(&run, true);
                } else {
                    println!("{id}");
                }
                return Ok(0);
            }
            if !json {
                eprintln!("paddock: run {id} queued; following it (Ctrl-C stops following, not the run)");
            }
            follow(&c, &id, 0, json)?;
            let end = c.get(&format!("/runs/{id}"))?;
            if !json {
                human(&end);
            }
            Ok(if end["state"] == "succeeded" { 0 } else { 1 })
        }
        RunsCommand::Ls { tier, state, thread, limit } => {
            let mut q = vec![format!("limit={limit}")];
            for (k, v) in [("tier", tier), ("state", state), ("thread", thread)] {
                if let Some(v) = v {
                    q.push(format!("{k}={}", form_encode(&v)));
                }
            }
            let page = c.get(&format!("/runs?{}", q.join("&")))?;
            if json {
                print(&page, true);
            } else {
                for run in page["items"].as_array().into_iter().flatten() {
                    human(run);
                }
                if let Some(next) = page["next"].as_str() {
                    eprintln!("paddock: more runs follow (the API's ?after={next})");
                }
            }
            Ok(0)
        }
        RunsCommand::Get { id } => {
            print(&c.get(&format!("/runs/{id}"))?, json);
            Ok(0)
        }
        RunsCommand::Cancel { id } => {
            print(&c.post(&format!("/runs/{id}/cancel"), &json!({}), &[])?, json);
            Ok(0)
        }
        RunsCommand::Events { id, after } => {
            follow(&c, &id, after, json)?;
            Ok(0)
        }
        RunsCommand::Result { id, output } => {
            let body = c.answer(c.auth(c.agent.get(c.url(&format!("/runs/{id}/result")))).call())?;
            let mut reader = body.into_reader();
            match output {
                Some(path) => {
                    let mut f = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
                    let n = std::io::copy(&mut reader, &mut f).context("writing the result")?;
                    if json {
                        println!("{}", json!({"path": path, "bytes": n}));
                    } else {
                        eprintln!("paddock: wrote {n} bytes to {}", path.display());
                    }
                }
                None => {
                    std::io::copy(&mut reader, &mut std::io::stdout().lock()).context("writing the result")?;
                }
            }
            Ok(0)
        }
        RunsCommand::Output { id } => {
            let body = c.answer(c.auth(c.agent.get(c.url(&format!("/runs/{id}/output")))).call())?;
            std::io::copy(&mut body.into_reader(), &mut std::io::stdout().lock()).context("writing the output")?;
            Ok(0)
        }
    }
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
