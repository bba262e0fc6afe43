//! `paddock-bench`, the HTTP section: the same sandboxes driven through `paddock serve`.
//!
//! The bench starts `paddock serve` as a child process (its own data directory under /tmp, a
//! free loopback port, no API key) and measures, with a blocking HTTP/1.1 client that keeps its
//! connection alive as SDKs do:
//!
//! 1. create → first output → destroy: `POST /v1/sandboxes`, then `POST …/proxy/44772/command`
//!    `{"command":"echo x"}` read until its first `stdout` event and on to the end of the stream,
//!    then `DELETE /v1/sandboxes/{id}`; interleaved with the library path (`create` → `exec echo
//!    x` → `destroy`) so that the ratio is taken under the same noise;
//! 2. exec round trip into one running sandbox, one client: `{"command":"true"}` (run as `bash -c
//!    true`) and `{"argv":["/bin/true"]}` (no shell) until the stream ends, `GET …/ping` as the
//!    floor of any request, and the library's `exec /bin/true`, all interleaved;
//! 3. the same round trip with 32 clients at once (32 threads, one connection each), against one
//!    sandbox and spread over several: per-request percentiles and requests per second;
//! 4. the code interpreter: `POST …/code/context {"language":"python"}` (a Python driver started
//!    in the sandbox) until its 200, the first `POST …/code` run in it, and the round trip of a
//!    run in a warm context, each until `execution_complete`.
//!
//! Every sandbox the server made is deleted through the API; after the server is killed, a
//! runtime opened on its data directory removes anything still there, then the directory goes.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use paddock_core::runtime::Runtime;
use paddock_runtime_local::LocalRuntime;
use paddock_runtime_local::layout::DataDir;
use serde::Serialize;
use serde_json::{Value, json};

use super::{
    Aim, ColdOut, ColdSamples, Config, ExecOut, LABEL, Live, Progress, Stats, cleanup, create, destroy, ms,
    paddock_cold_once, paddock_true_once, ratio, settle, times,
};

/// The execd port the server answers itself.
const EXECD_PORT: u16 = 44772;
/// Clients in flight at once for the concurrent measurement.
const CLIENTS: usize = 32;
/// Sandboxes the concurrent clients are spread over in the second concurrent measurement.
const SPREAD: usize = 8;
/// Requests each concurrent client sends before the clock starts (its connection is made then).
const CLIENT_WARMUP: usize = 2;
/// Longest any single request may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the server may take to answer `/health` after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The aims from the issue.
const AIM_FIRST_OUTPUT_MS: f64 = 15.0;
const AIM_EXEC_MS: f64 = 2.0;

// ---------------------------------------------------------------------------------------------
// The server and the client

/// A `paddock serve` child process and its data directory.
struct Server {
    child: Child,
    dir: PathBuf,
    command: String,
    client: Client,
    /// Set once [`Server::shutdown`] has run; until then, dropping the server kills it.
    done: bool,
}

/// A blocking HTTP client of one server: one agent, so one kept-alive connection at a time.
#[derive(Clone)]
struct Client {
    agent: ureq::Agent,
    base: String,
    label: String,
    /// The server's data directory, for [`settle`].
    data: DataDir,
}

impl Client {
    fn new(base: &str, label: &str, data: DataDir) -> Self {
        // Every phase but name resolution has a timeout: with a global one, ureq resolves
        // `127.0.0.1` on a thread it spawns for every request (to time it out), which added
        // 0.3-0.5 ms to each measured request here, none of it the server's.
        let t = Some(HTTP_TIMEOUT);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(t)
            .timeout_send_request(t)
            .timeout_send_body(t)
            .timeout_recv_response(t)
            .timeout_recv_body(t)
            .build()
            .into();
        Self { agent, base: base.to_owned(), label: label.to_owned(), data }
    }

    /// Another client of the same server, with a connection of its own.
    fn fresh(&self) -> Self {
        Self::new(&self.base, &self.label, self.data.clone())
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn execd(&self, sandbox: &str, path: &str) -> String {
        self.url(&format!("/v1/sandboxes/{sandbox}/proxy/{EXECD_PORT}{path}"))
    }

    /// `GET path` → (status, body).
    fn get(&self, path: &str) -> Result<(u16, String)> {
        let mut r = self.agent.get(self.url(path)).call().with_context(|| format!("GET {path}"))?;
        let status = r.status().as_u16();
        Ok((status, r.body_mut().read_to_string().with_context(|| format!("reading the answer to GET {path}"))?))
    }

    /// `POST /v1/sandboxes` → the new sandbox's id.
    fn create(&self) -> Result<String> {
        let body = json!({
            "image": {"uri": "host"},
            "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 600,
            "metadata": {LABEL: self.label},
        });
        let mut r = self
            .agent
            .post(self.url("/v1/sandboxes"))
            .header("content-type", "application/json")
            .send(body.to_string())
            .context("POST /v1/sandboxes")?;
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().context("reading the answer to POST /v1/sandboxes")?;
        if status != 202 {
            bail!("POST /v1/sandboxes answered {status}, not 202: {text}");
        }
        let v: Value = serde_json::from_str(&text).with_context(|| format!("POST /v1/sandboxes answered {text}"))?;
        v["id"].as_str().map(str::to_owned).ok_or_else(|| anyhow!("POST /v1/sandboxes answered no id: {text}"))
    }

    /// `DELETE /v1/sandboxes/{id}`.
    fn delete(&self, id: &str) -> Result<()> {
        let mut r = self.agent.delete(self.url(&format!("/v1/sandboxes/{id}"))).call().context("DELETE")?;
        let status = r.status().as_u16();
        if status != 204 {
            let text = r.body_mut().read_to_string().unwrap_or_default();
            bail!("DELETE /v1/sandboxes/{id} answered {status}, not 204: {text}");
        }
        Ok(())
    }

    /// `GET …/ping`, the floor of any request through the sandbox routes.
    fn ping(&self, sandbox: &str) -> Result<Duration> {
        let t0 = Instant::now();
        let mut r = self.agent.get(self.execd(sandbox, "/ping")).call().context("GET …/ping")?;
        let status = r.status().as_u16();
        r.body_mut().read_to_string().context("reading the answer to GET …/ping")?;
        let d = t0.elapsed();
        if status != 200 {
            bail!("GET /v1/sandboxes/{sandbox}/proxy/{EXECD_PORT}/ping answered {status}, not 200");
        }
        Ok(d)
    }

    /// `POST …/command` with `body`, its event stream read to the end; times from `t0`.
    fn command(&self, sandbox: &str, body: &Value, t0: Instant) -> Result<Streamed> {
        self.stream(sandbox, "/command", body, t0)
    }

    /// `POST …/code/context {"language":"python"}`: the new context's id.
    fn code_context(&self, sandbox: &str) -> Result<String> {
        let mut r = self
            .agent
            .post(self.execd(sandbox, "/code/context"))
            .header("content-type", "application/json")
            .send(json!({"language": "python"}).to_string())
            .context("POST …/code/context")?;
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().context("reading the answer to POST …/code/context")?;
        if status != 200 {
            bail!("POST /v1/sandboxes/{sandbox}/proxy/{EXECD_PORT}/code/context answered {status}: {text}");
        }
        let v: Value = serde_json::from_str(&text).context("POST …/code/context answered no JSON")?;
        v["id"].as_str().map(str::to_owned).ok_or_else(|| anyhow!("POST …/code/context answered no id: {text}"))
    }

    fn delete_code_context(&self, sandbox: &str, context: &str) -> Result<()> {
        let mut r = self
            .agent
            .delete(self.execd(sandbox, &format!("/code/contexts/{context}")))
            .call()
            .context("DELETE …/code/contexts/{id}")?;
        let status = r.status().as_u16();
        let _ = r.body_mut().read_to_string();
        if status != 200 {
            bail!("DELETE /v1/sandboxes/{sandbox}/proxy/{EXECD_PORT}/code/contexts/{context} answered {status}");
        }
        Ok(())
    }

    /// `POST …{path}` with `body`, its event stream read to the end; times from `t0`.
    fn stream(&self, sandbox: &str, path: &str, body: &Value, t0: Instant) -> Result<Streamed> {
        let mut r = self
            .agent
            .post(self.execd(sandbox, path))
            .header("content-type", "application/json")
            .send(body.to_string())
            .with_context(|| format!("POST …{path} {body}"))?;
        let status = r.status().as_u16();
        if status != 200 {
            let text = r.body_mut().read_to_string().unwrap_or_default();
            bail!("POST /v1/sandboxes/{sandbox}/proxy/{EXECD_PORT}{path} {body} answered {status}: {text}");
        }
        let mut s = Streamed { init: None, first_stdout: None, end: Duration::ZERO };
        let mut ended = None;
        let mut reader = BufReader::new(r.into_body().into_reader());
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).with_context(|| format!("reading the event stream of {body}"))? == 0 {
                break;
            }
            let Some(data) = line.trim_end().strip_prefix("data:") else { continue };
            let event: Value = serde_json::from_str(data.trim())
                .with_context(|| format!("an event of {body} is not JSON: {}", line.trim_end()))?;
            match event["type"].as_str() {
                Some("init") => s.init = s.init.or(Some(t0.elapsed())),
                Some("stdout") => s.first_stdout = s.first_stdout.or(Some(t0.elapsed())),
                Some("execution_complete") => ended = Some(Ok(())),
                Some("error") => ended = Some(Err(event["error"].to_string())),
                _ => {}
            }
        }
        // Drain anything after the last line so the connection goes back to the pool.
        let _ = reader.read_to_end(&mut Vec::new());
        s.end = t0.elapsed();
        match ended {
            Some(Ok(())) => Ok(s),
            Some(Err(e)) => bail!("{body} in sandbox {sandbox} failed: {e}"),
            None => bail!("the event stream of {body} in sandbox {sandbox} ended without execution_complete"),
        }
    }

    /// Ids of every sandbox the server knows.
    fn list(&self) -> Result<Vec<String>> {
        let (status, text) = self.get("/v1/sandboxes?pageSize=200")?;
        if status != 200 {
            bail!("GET /v1/sandboxes answered {status}: {text}");
        }
        let v: Value = serde_json::from_str(&text).context("GET /v1/sandboxes answered no JSON")?;
        Ok(v["items"].as_array().into_iter().flatten().filter_map(|i| i["id"].as_str().map(str::to_owned)).collect())
    }
}

/// When the events of one command stream arrived, from the moment the request was sent.
struct Streamed {
    init: Option<Duration>,
    first_stdout: Option<Duration>,
    end: Duration,
}

impl Server {
    fn start(label: &str) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("pbs")
            .tempdir_in("/tmp")
            .context("creating a data directory for `paddock serve` under /tmp")?
            .keep();
        let started = Self::spawn(&dir, label);
        if started.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let mut server = started?;
        if let Err(e) = server.wait_healthy() {
            server.kill();
            let log = server.log_tail();
            let _ = std::fs::remove_dir_all(&server.dir);
            server.done = true;
            return Err(e.context(format!("starting `{}`; its log ends:\n{log}", server.command)));
        }
        Ok(server)
    }

    fn spawn(dir: &std::path::Path, label: &str) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port on 127.0.0.1")?
            .port();
        let exe = crate::paddock_binary();
        let listen = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("serve.log")).context("creating the server's log file")?;
        let child = Command::new(exe)
            .arg("--data-dir")
            .arg(dir)
            .args(["serve", "--listen", &listen, "--insecure-no-auth"])
            .env_remove("PADDOCK_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} serve", exe.display()))?;
        let command =
            format!("{} --data-dir {} serve --listen {listen} --insecure-no-auth", exe.display(), dir.display());
        Ok(Self {
            child,
            dir: dir.to_owned(),
            command,
            client: Client::new(&format!("http://{listen}"), label, DataDir::new(dir)),
            done: false,
        })
    }

    fn wait_healthy(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().context("checking on `paddock serve`")? {
                bail!("`paddock serve` exited ({status}) before it answered /health");
            }
            if let Ok((200, _)) = self.client.get("/health") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("`paddock serve` did not answer GET /health within {} s", START_TIMEOUT.as_secs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Deletes every sandbox through the API, kills the server, removes whatever sandbox is still
    /// in its data directory with a runtime of its own, and removes the directory.
    async fn shutdown(mut self, rt: &LocalRuntime) -> Result<()> {
        let client = self.client.clone();
        let deleted = tokio::task::spawn_blocking(move || -> Result<()> {
            for id in client.list()? {
                client.delete(&id)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| anyhow!("the cleanup task failed: {e}"))
        .and_then(|r| r);
        if let Err(e) = &deleted {
            eprintln!(
                "paddock-bench: deleting the HTTP sandboxes through the API failed ({e:#}); removing them directly"
            );
        }
        self.kill();
        self.done = true;
        let exe = crate::paddock_binary();
        let own = LocalRuntime::new(&self.dir, exe, rt.naming())
            .with_context(|| format!("opening the server's data directory {}", self.dir.display()))?;
        let mut left = Vec::new();
        for info in own.list().await.context("listing the server's sandboxes")? {
            if let Err(e) = own.destroy(&info.id).await {
                left.push(format!("{} ({e})", info.id));
            }
        }
        if !left.is_empty() {
            bail!(
                "could not remove these sandboxes of the bench's server: {}; remove them with `paddock --data-dir {} rm ID`",
                left.join(", "),
                self.dir.display()
            );
        }
        std::fs::remove_dir_all(&self.dir)
            .with_context(|| format!("removing the server's data directory {}", self.dir.display()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if !self.done {
            self.kill();
            eprintln!(
                "paddock-bench: the HTTP server was stopped without cleanup; check `paddock --data-dir {} ls`",
                self.dir.display()
            );
        }
    }
}

/// Runs `f` on the blocking pool, so that the async runtime (and Ctrl-C) stay responsive.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| anyhow!("an HTTP client task failed: {e}"))?
}

// ---------------------------------------------------------------------------------------------
// The section

pub(super) async fn run(rt: &LocalRuntime, cfg: &Config, cold: &ColdOut, exec: &ExecOut) -> Result<HttpOut> {
    let label = cfg.run_label.clone();
    let server = blocking(move || Server::start(&label)).await?;
    eprintln!("paddock-bench: [5/5] started `{}`", server.command);
    let client = server.client.clone();
    let live = Live::default();
    let stop = Arc::new(AtomicBool::new(false));
    let result = tokio::select! {
        r = measure(rt, cfg, &client, &live, &stop, cold, exec) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted; the sandboxes the bench created are being removed")),
    };
    // Client threads still running stop after their current request.
    stop.store(true, Ordering::SeqCst);
    let lib_cleaned = cleanup(rt, cfg, &live, result.is_err()).await;
    let log = server.log_tail();
    let command = server.command.clone();
    let cleaned = server.shutdown(rt).await;
    let mut out = result.map_err(|e| e.context(format!("measuring `{command}`; its log ends:\n{log}")))?;
    lib_cleaned?;
    cleaned?;
    out.server = command;
    Ok(out)
}

async fn measure(
    rt: &LocalRuntime,
    cfg: &Config,
    client: &Client,
    live: &Live,
    stop: &Arc<AtomicBool>,
    cold: &ColdOut,
    exec: &ExecOut,
) -> Result<HttpOut> {
    let cold_out = cold_start(rt, cfg, client, live, cold).await?;
    let sandbox = {
        let c = client.clone();
        blocking(move || c.create()).await?
    };
    let measured = async {
        let exec_out = exec_round_trip(rt, cfg, client, live, &sandbox, exec).await?;
        let per_client = (cfg.iterations / 4).max(2);
        let mut concurrent = Vec::new();
        for (kind, spread) in [(Kind::Command, 1), (Kind::Argv, 1), (Kind::Command, SPREAD), (Kind::Argv, SPREAD)] {
            concurrent.push(concurrent_round_trip(client, &sandbox, kind, spread, per_client, stop).await?);
        }
        let code = code_interpreter(cfg, client, &sandbox).await?;
        Ok::<_, anyhow::Error>((exec_out, concurrent, code))
    }
    .await;
    let c = client.clone();
    let deleted = blocking(move || c.delete(&sandbox)).await;
    let (exec_out, concurrent, code) = measured?;
    deleted?;
    let runs = {
        let (c, n, baseline) = (client.clone(), cfg.iterations.clamp(5, 50), cold_out.http_first_output.p50_ms);
        blocking(move || runs(&c, n, baseline)).await?
    };
    Ok(HttpOut { server: String::new(), clients: CLIENTS, cold: cold_out, exec: exec_out, concurrent, code, runs })
}

// ---------------------------------------------------------------------------------------------
// 6. runs

/// Gateway calls each run's driver makes on one kept-alive connection (curl reuses it for
/// every URL on its command line), through the forwarder in its sandbox.
const GATEWAY_CALLS: usize = 20;

/// `n` runs one after another, each admitted into an idle server: admission is the server's
/// own `createdAt` → `firstCallAt` (queued → the driver's first gateway call), and each driver
/// times its gateway heartbeats with curl (`%{time_total}`), the first (connection set up) left
/// out. The baseline is the HTTP create → first output of this same bench run.
fn runs(client: &Client, n: usize, baseline_ms: f64) -> Result<RunsOut> {
    let driver = format!(
        "curl -s -w '%{{time_total}}\\n' -X POST -H \"Authorization: Bearer $PADDOCK_TOKEN\" $(for i in $(seq {GATEWAY_CALLS}); do printf -- '-o /dev/null %s ' \"$PADDOCK_GATEWAY/v1/heartbeat\"; done)"
    );
    let mut progress = Progress::new("[5/5] HTTP: runs (submit → first gateway call; gateway round trip)", n);
    let mut admission = Vec::with_capacity(n);
    let mut gateway = Vec::with_capacity(n * GATEWAY_CALLS);
    for i in 0..n {
        let body = json!({"tier": "interactive", "image": "host", "command": ["sh", "-c", driver], "timeout": 60});
        let mut r = client
            .agent
            .post(client.url("/v1/runs"))
            .header("content-type", "application/json")
            .send(body.to_string())
            .context("POST /v1/runs")?;
        let text = r.body_mut().read_to_string().context("reading the answer to POST /v1/runs")?;
        let id = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["id"].as_str().map(str::to_owned))
            .ok_or_else(|| anyhow!("POST /v1/runs answered {text}"))?;
        let until = Instant::now() + Duration::from_secs(60);
        let run = loop {
            let (_, text) = client.get(&format!("/v1/runs/{id}"))?;
            let run: Value =
                serde_json::from_str(&text).with_context(|| format!("GET /v1/runs/{id} answered {text}"))?;
            match run["state"].as_str() {
                Some("succeeded") => break run,
                Some("failed" | "cancelled") => bail!("run {id} ended {}: {}", run["state"], run["reason"]),
                _ if Instant::now() > until => bail!("run {id} did not finish within 60 s: {run}"),
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let at = |k: &str| run[k].as_str().and_then(unix_ms_of);
        let (Some(created), Some(first)) = (at("createdAt"), at("firstCallAt")) else {
            bail!("run {id} has no firstCallAt: its driver never reached the gateway: {run}");
        };
        admission.push(Duration::from_millis(u64::try_from(first - created).unwrap_or(0)));
        let (_, output) = client.get(&format!("/v1/runs/{id}/output"))?;
        let times: Vec<f64> = output.lines().filter_map(|l| l.trim().parse::<f64>().ok()).collect();
        if times.len() != GATEWAY_CALLS {
            bail!("run {id}'s driver timed {} gateway calls, not {GATEWAY_CALLS}: {output}", times.len());
        }
        gateway.extend(times.iter().skip(1).map(|s| Duration::from_secs_f64(*s)));
        progress.tick(i + 1);
    }
    let admission = Stats::of(&admission);
    let ratio = (baseline_ms > 0.0).then(|| admission.p50_ms / baseline_ms);
    Ok(RunsOut {
        admission,
        create_first_output_p50_ms: baseline_ms,
        ratio_admission_p50: ratio,
        gateway_round_trip: Stats::of(&gateway),
    })
}

// ---------------------------------------------------------------------------------------------
// 4. the code interpreter

async fn code_interpreter(cfg: &Config, client: &Client, sandbox: &str) -> Result<CodeOut> {
    let n = cfg.warmup + cfg.iterations;
    let mut progress = Progress::new("[5/5] HTTP: code interpreter (Python context create, first run, warm run)", n);
    let (mut create, mut first, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    let run = |c: &Client, id: &str, context: &str, code: &str| -> Result<Duration> {
        let t0 = Instant::now();
        Ok(c.stream(id, "/code", &json!({"code": code, "context": {"id": context, "language": "python"}}), t0)?.end)
    };
    for i in 0..n {
        let (c, id) = (client.clone(), sandbox.to_owned());
        let (made, ran, again) = blocking(move || {
            let t0 = Instant::now();
            let context = c.code_context(&id)?;
            let made = t0.elapsed();
            let ran = run(&c, &id, &context, "x = 1\nx + 1")?;
            let again = run(&c, &id, &context, "x + 1")?;
            c.delete_code_context(&id, &context)?;
            Ok((made, ran, again))
        })
        .await?;
        if i >= cfg.warmup {
            create.push(made);
            first.push(ran);
            warm.push(again);
        }
        progress.tick(i + 1);
    }
    Ok(CodeOut { context_create: Stats::of(&create), first_run: Stats::of(&first), warm_run: Stats::of(&warm) })
}

// ---------------------------------------------------------------------------------------------
// 1. create → first output → destroy

struct HttpColdOnce {
    create: Duration,
    first: Duration,
    end: Duration,
    total: Duration,
}

fn http_cold_once(client: &Client) -> Result<HttpColdOnce> {
    let t0 = Instant::now();
    let id = client.create()?;
    let create = t0.elapsed();
    let ran = client.command(&id, &json!({"command": "echo x"}), t0);
    let deleted = client.delete(&id);
    let total = t0.elapsed();
    let s = ran?;
    deleted?;
    let first = s.first_stdout.ok_or_else(|| anyhow!("`echo x` in sandbox {id} printed no stdout event"))?;
    Ok(HttpColdOnce { create, first, end: s.end, total })
}

async fn cold_start(
    rt: &LocalRuntime,
    cfg: &Config,
    client: &Client,
    live: &Live,
    cold: &ColdOut,
) -> Result<HttpColdOut> {
    let mut lib = ColdSamples::default();
    let (mut total, mut first, mut create, mut to_first, mut to_end, mut destroy) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let n = cfg.warmup + cfg.iterations;
    let mut progress = Progress::new("[5/5] HTTP: create → first output → destroy (HTTP and library interleaved)", n);
    for i in 0..n {
        let l = paddock_cold_once(rt, cfg, live).await?;
        settle(rt.data_dir()).await?;
        let c = client.clone();
        let h = blocking(move || http_cold_once(&c)).await?;
        settle(&client.data).await?;
        if i >= cfg.warmup {
            lib.push(l);
            total.push(h.total);
            first.push(h.first);
            create.push(h.create);
            to_first.push(h.first - h.create);
            to_end.push(h.end - h.first);
            destroy.push(h.total - h.end);
        }
        progress.tick(i + 1);
    }
    let http_total = Stats::of(&total);
    let http_first_output = Stats::of(&first);
    let library_total = Stats::of(&lib.total);
    let library_first_output = Stats::of(&lib.first);
    Ok(HttpColdOut {
        ratio_total_p50: ratio(&http_total, Some(&library_total)),
        ratio_first_output_p50: ratio(&http_first_output, Some(&library_first_output)),
        ratio_total_vs_cold_section_p50: ratio(&http_total, Some(&cold.paddock_total)),
        ratio_first_output_vs_cold_section_p50: ratio(&http_first_output, Some(&cold.paddock_first_output)),
        http_total,
        http_first_output,
        http_create: Stats::of(&create),
        http_create_to_first_output: Stats::of(&to_first),
        http_first_output_to_end: Stats::of(&to_end),
        http_destroy: Stats::of(&destroy),
        library_total,
        library_first_output,
    })
}

// ---------------------------------------------------------------------------------------------
// 2. exec round trip, one client

#[derive(Clone, Copy)]
enum Kind {
    Command,
    Argv,
}

impl Kind {
    fn body(self) -> Value {
        match self {
            Kind::Command => json!({"command": "true"}),
            Kind::Argv => json!({"argv": ["/bin/true"]}),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Command => "command \"true\" (bash -c)",
            Kind::Argv => "argv [\"/bin/true\"]",
        }
    }
}

/// One `true` through the API: (until the init event, until the stream ended).
fn round_trip(client: &Client, sandbox: &str, kind: Kind) -> Result<(Duration, Duration)> {
    let t0 = Instant::now();
    let s = client.command(sandbox, &kind.body(), t0)?;
    Ok((s.init.unwrap_or(s.end), s.end))
}

async fn exec_round_trip(
    rt: &LocalRuntime,
    cfg: &Config,
    client: &Client,
    live: &Live,
    sandbox: &str,
    exec: &ExecOut,
) -> Result<HttpExecOut> {
    let lib_id = create(rt, cfg, live).await?;
    let measured = async {
        let mut v: [Vec<Duration>; 6] = Default::default();
        let n = cfg.warmup + cfg.iterations;
        let mut progress =
            Progress::new("[5/5] HTTP: exec round trip, 1 client (ping, command, argv, library interleaved)", n);
        for i in 0..n {
            let (c, id) = (client.clone(), sandbox.to_owned());
            let (ping, cmd, argv) = blocking(move || {
                Ok((c.ping(&id)?, round_trip(&c, &id, Kind::Command)?, round_trip(&c, &id, Kind::Argv)?))
            })
            .await?;
            let (_, lib) = paddock_true_once(rt, &lib_id).await?;
            if i >= cfg.warmup {
                for (samples, d) in v.iter_mut().zip([ping, cmd.1, cmd.0, argv.1, argv.0, lib]) {
                    samples.push(d);
                }
            }
            progress.tick(i + 1);
        }
        Ok::<_, anyhow::Error>(v)
    }
    .await;
    let destroyed = destroy(rt, live, &lib_id).await;
    let [ping, cmd, cmd_init, argv, argv_init, lib] = measured?;
    destroyed?;
    let command_round_trip = Stats::of(&cmd);
    let argv_round_trip = Stats::of(&argv);
    let library_round_trip = Stats::of(&lib);
    Ok(HttpExecOut {
        ratio_command_p50: ratio(&command_round_trip, Some(&library_round_trip)),
        ratio_argv_p50: ratio(&argv_round_trip, Some(&library_round_trip)),
        ratio_argv_vs_exec_section_p50: ratio(&argv_round_trip, Some(&exec.paddock_round_trip)),
        ping: Stats::of(&ping),
        command_round_trip,
        command_until_init: Stats::of(&cmd_init),
        argv_round_trip,
        argv_until_init: Stats::of(&argv_init),
        library_round_trip,
    })
}

// ---------------------------------------------------------------------------------------------
// 3. exec round trip, 32 clients

async fn concurrent_round_trip(
    client: &Client,
    sandbox: &str,
    kind: Kind,
    spread: usize,
    per_client: usize,
    stop: &Arc<AtomicBool>,
) -> Result<ConcurrentOut> {
    // The shared sandbox, plus `spread - 1` more made for this measurement.
    let mut made = Vec::new();
    for _ in 1..spread {
        let c = client.clone();
        match blocking(move || c.create()).await {
            Ok(id) => made.push(id),
            Err(e) => {
                delete_all(client, made).await?;
                return Err(e);
            }
        }
    }
    let sandboxes: Vec<String> = std::iter::once(sandbox.to_owned()).chain(made.iter().cloned()).collect();
    let (c, stop) = (client.clone(), stop.clone());
    let measured = blocking(move || clients(&c, &sandboxes, kind, per_client, &stop)).await;
    delete_all(client, made).await?;
    let (wall, samples) = measured?;
    Ok(ConcurrentOut {
        request: kind.body(),
        clients: CLIENTS,
        sandboxes: spread,
        requests: samples.len(),
        wall_s: wall.as_secs_f64(),
        requests_per_s: samples.len() as f64 / wall.as_secs_f64(),
        round_trip: Stats::of(&samples),
    })
}

async fn delete_all(client: &Client, ids: Vec<String>) -> Result<()> {
    let c = client.clone();
    blocking(move || {
        let mut first_err = None;
        for id in ids {
            if let Err(e) = c.delete(&id) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    })
    .await
}

/// `CLIENTS` threads, each with its own connection, each sending `per_client` requests to its
/// sandbox (client i uses sandbox i mod the number of sandboxes) after a short warm-up; returns
/// the wall time from the common start to the last answer and every request's round trip.
fn clients(
    client: &Client,
    sandboxes: &[String],
    kind: Kind,
    per_client: usize,
    stop: &AtomicBool,
) -> Result<(Duration, Vec<Duration>)> {
    let label =
        format!("[5/5] HTTP: exec round trip, {CLIENTS} clients, {}, {} sandbox(es)", kind.name(), sandboxes.len());
    let total = CLIENTS * per_client;
    let mut progress = Progress::new(&label, total);
    let done = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let start = Barrier::new(CLIENTS + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (sandbox, mine, start, done, failed) =
                    (&sandboxes[i % sandboxes.len()], client.fresh(), &start, &done, &failed);
                s.spawn(move || -> Result<(Vec<Duration>, Instant)> {
                    let warm = (0..CLIENT_WARMUP).try_for_each(|_| round_trip(&mine, sandbox, kind).map(drop));
                    start.wait();
                    warm?;
                    let mut out = Vec::with_capacity(per_client);
                    for _ in 0..per_client {
                        if stop.load(Ordering::SeqCst) || failed.load(Ordering::SeqCst) {
                            bail!("stopped");
                        }
                        match round_trip(&mine, sandbox, kind) {
                            Ok((_, d)) => out.push(d),
                            Err(e) => {
                                failed.store(true, Ordering::SeqCst);
                                return Err(e);
                            }
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((out, Instant::now()))
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        while handles.iter().any(|h| !h.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            progress.tick(done.load(Ordering::Relaxed).min(total - 1));
        }
        let mut samples = Vec::with_capacity(total);
        let mut last = t0;
        let mut first_err = None;
        for h in handles {
            match h.join().map_err(|_| anyhow!("an HTTP client thread panicked")).and_then(|r| r) {
                Ok((out, end)) => {
                    samples.extend(out);
                    last = last.max(end);
                }
                Err(e) if e.to_string() == "stopped" => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e.context(format!("{CLIENTS} clients sending {}", kind.body())));
        }
        if samples.len() != total {
            bail!("interrupted");
        }
        progress.tick(total);
        Ok((last - t0, samples))
    })
}

// ---------------------------------------------------------------------------------------------
// The report

#[derive(Serialize)]
pub(super) struct HttpOut {
    /// The server command line.
    server: String,
    clients: usize,
    cold: HttpColdOut,
    exec: HttpExecOut,
    concurrent: Vec<ConcurrentOut>,
    code: CodeOut,
    runs: RunsOut,
}

#[derive(Serialize)]
struct RunsOut {
    /// `POST /v1/runs` (`createdAt`) → the driver's first gateway call (`firstCallAt`).
    admission: Stats,
    /// The baseline: HTTP create → first output (a plain sandbox and its first command), p50.
    create_first_output_p50_ms: f64,
    ratio_admission_p50: Option<f64>,
    /// A heartbeat from inside the sandbox through its forwarder, kept-alive, by curl.
    gateway_round_trip: Stats,
}

#[derive(Serialize)]
struct CodeOut {
    /// `POST …/code/context {"language":"python"}` → 200 (a Python driver started and ready).
    context_create: Stats,
    /// The first `POST …/code` in that context (`x = 1; x + 1`) until `execution_complete`.
    first_run: Stats,
    /// A second run in the same, warm context (`x + 1`).
    warm_run: Stats,
}

#[derive(Serialize)]
struct HttpColdOut {
    /// `POST /v1/sandboxes` → `POST …/command {"command":"echo x"}` → stream end → `DELETE`.
    http_total: Stats,
    /// `POST /v1/sandboxes` sent → first `stdout` event read.
    http_first_output: Stats,
    /// `POST /v1/sandboxes` → 202 read.
    http_create: Stats,
    /// 202 read → first `stdout` event read (the command's request included).
    http_create_to_first_output: Stats,
    /// First `stdout` event → end of the event stream.
    http_first_output_to_end: Stats,
    /// `DELETE` → 204.
    http_destroy: Stats,
    /// The library path, interleaved with the HTTP iterations.
    library_total: Stats,
    library_first_output: Stats,
    /// HTTP / library (interleaved), p50.
    ratio_total_p50: Option<f64>,
    ratio_first_output_p50: Option<f64>,
    /// HTTP / the cold-start section's library figures, p50.
    ratio_total_vs_cold_section_p50: Option<f64>,
    ratio_first_output_vs_cold_section_p50: Option<f64>,
}

#[derive(Serialize)]
struct HttpExecOut {
    /// `GET …/proxy/44772/ping`: what any request through the sandbox routes costs at least.
    ping: Stats,
    /// `{"command":"true"}` (`bash -c true`) until the stream ends.
    command_round_trip: Stats,
    command_until_init: Stats,
    /// `{"argv":["/bin/true"]}` until the stream ends.
    argv_round_trip: Stats,
    argv_until_init: Stats,
    /// The library's `exec /bin/true`, interleaved.
    library_round_trip: Stats,
    ratio_command_p50: Option<f64>,
    ratio_argv_p50: Option<f64>,
    /// argv / the exec section's library figure, p50.
    ratio_argv_vs_exec_section_p50: Option<f64>,
}

#[derive(Serialize)]
struct ConcurrentOut {
    request: Value,
    clients: usize,
    sandboxes: usize,
    requests: usize,
    wall_s: f64,
    requests_per_s: f64,
    round_trip: Stats,
}

impl HttpOut {
    pub(super) fn aims(&self) -> Vec<Aim> {
        let first = self.cold.http_first_output.p50_ms;
        let mut out = vec![Aim {
            aim: format!("HTTP create → first output p50 ≤ {AIM_FIRST_OUTPUT_MS} ms"),
            measured: format!("{} (p99 {})", ms(first), ms(self.cold.http_first_output.p99_ms)),
            hit: Some(first <= AIM_FIRST_OUTPUT_MS),
        }];
        let r = &self.runs;
        out.push(Aim {
            aim: "run admission (queued → first gateway call) p50 ≤ 2× HTTP create → first output".into(),
            measured: format!(
                "{} vs {} ({})",
                ms(r.admission.p50_ms),
                ms(r.create_first_output_p50_ms),
                times(r.ratio_admission_p50)
            ),
            hit: r.ratio_admission_p50.map(|x| x <= 2.0),
        });
        out.push(Aim {
            aim: format!("gateway write round trip p50 ≤ {AIM_EXEC_MS} ms"),
            measured: format!("{} (p99 {})", ms(r.gateway_round_trip.p50_ms), ms(r.gateway_round_trip.p99_ms)),
            hit: Some(r.gateway_round_trip.p50_ms <= AIM_EXEC_MS),
        });
        for (what, s) in
            [("command \"true\"", &self.exec.command_round_trip), ("argv /bin/true", &self.exec.argv_round_trip)]
        {
            out.push(Aim {
                aim: format!("HTTP exec round trip p50 ≤ {AIM_EXEC_MS} ms, 1 client, {what}"),
                measured: format!("{} (p99 {})", ms(s.p50_ms), ms(s.p99_ms)),
                hit: Some(s.p50_ms <= AIM_EXEC_MS),
            });
        }
        out
    }

    pub(super) fn print(&self, cold: &ColdOut, exec: &ExecOut) {
        let row = |name: &str, s: &Stats| {
            println!("  {name:<44} {:>10} {:>10} {:>10}", ms(s.p50_ms), ms(s.p90_ms), ms(s.p99_ms));
        };
        let c = &self.cold;
        println!("HTTP API: create → first output → destroy           {:>10} {:>10} {:>10}", "p50", "p90", "p99");
        row("http", &c.http_total);
        row("library, interleaved with http", &c.library_total);
        row("library, cold-start section", &cold.paddock_total);
        println!("  {:<44} {:>10}", "ratio http / library interleaved (p50)", times(c.ratio_total_p50));
        println!(
            "  {:<44} {:>10}",
            "ratio http / library cold-start section (p50)",
            times(c.ratio_total_vs_cold_section_p50)
        );
        row("http, to first output", &c.http_first_output);
        row("library interleaved, to first output", &c.library_first_output);
        row("library cold-start section, to first output", &cold.paddock_first_output);
        println!("  {:<44} {:>10}", "ratio http / library interleaved (p50)", times(c.ratio_first_output_p50));
        println!(
            "  {:<44} {:>10}",
            "ratio http / library cold-start section (p50)",
            times(c.ratio_first_output_vs_cold_section_p50)
        );
        row("http: create (POST → 202)", &c.http_create);
        row("http: 202 → first stdout event", &c.http_create_to_first_output);
        row("http: first stdout event → stream end", &c.http_first_output_to_end);
        row("http: destroy (DELETE → 204)", &c.http_destroy);
        println!();
        let e = &self.exec;
        println!("HTTP API: exec round trip, 1 client                {:>10} {:>10} {:>10}", "p50", "p90", "p99");
        row("http command \"true\" (bash -c true)", &e.command_round_trip);
        row("http command \"true\", until init event", &e.command_until_init);
        row("http argv [\"/bin/true\"]", &e.argv_round_trip);
        row("http argv, until init event", &e.argv_until_init);
        row("http GET …/ping (floor of any request)", &e.ping);
        row("library exec /bin/true, interleaved", &e.library_round_trip);
        row("library exec /bin/true, exec section", &exec.paddock_round_trip);
        println!("  {:<44} {:>10}", "ratio http command / library interleaved", times(e.ratio_command_p50));
        println!("  {:<44} {:>10}", "ratio http argv / library interleaved", times(e.ratio_argv_p50));
        println!();
        println!(
            "HTTP API: exec round trip, {} clients               {:>10} {:>10} {:>10} {:>10}",
            self.clients, "p50", "p90", "p99", "req/s"
        );
        for r in &self.concurrent {
            let kind = if r.request.get("argv").is_some() { "argv" } else { "command" };
            let name = format!(
                "{kind}, {} sandbox{}, {} requests",
                r.sandboxes,
                if r.sandboxes == 1 { "" } else { "es" },
                r.requests
            );
            println!(
                "  {name:<44} {:>10} {:>10} {:>10} {:>10.0}",
                ms(r.round_trip.p50_ms),
                ms(r.round_trip.p90_ms),
                ms(r.round_trip.p99_ms),
                r.requests_per_s
            );
        }
        println!();
        println!("HTTP API: code interpreter (Python), 1 client      {:>10} {:>10} {:>10}", "p50", "p90", "p99");
        row("POST /code/context (driver started, ready)", &self.code.context_create);
        row("first POST /code run in it", &self.code.first_run);
        row("POST /code run, warm context", &self.code.warm_run);
        println!();
        println!("HTTP API: runs, one at a time                       {:>10} {:>10} {:>10}", "p50", "p90", "p99");
        row("submit → driver's first gateway call", &self.runs.admission);
        println!(
            "  {:<44} {:>10}",
            "HTTP create → first output (this run), p50",
            ms(self.runs.create_first_output_p50_ms)
        );
        println!("  {:<44} {:>10}", "ratio admission / create → first output", times(self.runs.ratio_admission_p50));
        row("gateway heartbeat from inside, kept alive", &self.runs.gateway_round_trip);
    }
}

/// An RFC 3339 timestamp of the API (any offset) → milliseconds since the epoch.
fn unix_ms_of(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}
