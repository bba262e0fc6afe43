//! Runs: agent work that waits its turn by tier, runs in a sandbox as attempts, survives
//! losing its sandbox, and calls home through one gateway.
//!
//! A run is queued in the database, admitted by its tier's budget and the capacity over all
//! tiers (interactive before batch, first come first served within a tier), and then driven
//! by one task of this server: a sandbox is made (or its thread's workspace acquired) with a
//! way home to the gateway, the run's command (its driver) is started with a token for this
//! run, this attempt's epoch and this sandbox, and the driver's exit status is the outcome.
//! An attempt that is lost (its sandbox gone, its start deadline or lease missed, its server
//! killed) or preempted is requeued with a new epoch; every write of the gateway names its
//! epoch, so an older attempt changes nothing.
//!
//! This module knows the runtime only through the `Runtime` seam (`Capabilities::gateway`
//! and `SandboxSpec::gateway`), and the rest of the server only through [`Runs`].

pub mod api;
pub mod gateway;
pub(crate) mod origin;
pub mod store;
mod tarcheck;
pub mod tiers;
mod upload;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use paddock_core::naming::ThreadId;
use paddock_core::runtime::{ExecOutcome, ExecRequest, Runtime, RuntimeError, SandboxId, SandboxState};
use paddock_core::spec::{SandboxSpec, ValidatedSpec, WorkspaceRef};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, broadcast, watch};

use crate::error::{ApiError, ApiResult};
use crate::secrets::TokenKey;
use crate::store::now_ms;
use store::{RunRow, RunSpec, RunState, RunStore};
use tiers::Tiers;

/// A run's timeout when its request gives none, and the most it may ask for.
pub const DEFAULT_RUN_TIMEOUT: u64 = 3600;
pub const MAX_RUN_TIMEOUT: u64 = 28_800;
/// Attempts when the request gives no `maxAttempts`, and the most it may ask for.
pub const DEFAULT_MAX_ATTEMPTS: i64 = 3;
pub const MAX_MAX_ATTEMPTS: i64 = 20;
/// How often attempts of servers that ended are looked for while this one runs.
const TAKE_BACK_EVERY: Duration = Duration::from_secs(60);
/// The label of a sandbox made for a run: the run's id.
pub const RUN_LABEL: &str = "paddock.dev/run";
/// The most of a driver's output kept (its newest bytes are dropped past it).
const MAX_OUTPUT: u64 = 1 << 20;

/// How runs are run; built by the CLI (`paddock serve --tier ...`).
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub tiers: Tiers,
    /// Where the gateway listens on the host; port 0 picks one. `None`: 127.0.0.1:8081, or
    /// a free port when that one is taken (sandboxes of the local runtime find the gateway
    /// on their own loopback whatever the host's port).
    pub gateway_listen: Option<SocketAddr>,
    pub gateway_max_connections: usize,
    /// How long a heartbeat keeps an attempt's lease.
    pub lease: Duration,
    /// How long a driver has, from its attempt's admission, to make its first gateway call.
    pub start_deadline: Duration,
    /// Exit codes of a driver that ask for the run to run again.
    pub requeue_codes: Vec<i32>,
    /// Bounds on a result or inputs tar.
    pub max_tar_bytes: u64,
    pub max_tar_entries: usize,
}

impl RunOptions {
    pub fn defaults(tiers: Tiers) -> Self {
        Self {
            tiers,
            gateway_listen: None,
            gateway_max_connections: 256,
            lease: Duration::from_secs(60),
            start_deadline: Duration::from_secs(600),
            requeue_codes: vec![75, 76],
            max_tar_bytes: 64 << 20,
            max_tar_entries: 10_000,
        }
    }

    /// The defaults on a free gateway port, for tests in-process.
    pub fn for_tests() -> Self {
        let mut o = Self::defaults(Tiers::default_for(tiers::Capacity { runs: 8, memory: None }));
        o.gateway_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        o
    }
}

/// The gateway's address on the host when `--gateway-listen` is not given.
pub const DEFAULT_GATEWAY: SocketAddr =
    SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 8081));

/// Why an attempt is being stopped by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Cancel,
    Preempt,
    Drain,
}

/// An attempt this server drives.
struct Active {
    /// The attempt's epoch: the entry is its task's only while the epochs match.
    epoch: i64,
    rank: usize,
    memory: u64,
    /// When it was admitted: the newest is preempted first.
    admitted_ms: i64,
    thread: Option<String>,
    stop: watch::Sender<Option<Stop>>,
}

/// How an attempt ended.
#[derive(Debug)]
enum Outcome {
    Exited(ExecOutcome),
    /// Its sandbox, deadline, lease or server was lost: run it again if attempts remain.
    Lost(String),
    Stopped(Stop),
    /// It can never run as asked (an image the runtime refuses, say).
    Refused(String),
}

/// The runs of one server.
pub struct Runs {
    store: RunStore,
    opts: RunOptions,
    rt: Arc<dyn Runtime>,
    key: Arc<TokenKey>,
    data_dir: PathBuf,
    boot: String,
    /// Caps of `/workspace` for run sandboxes, as for API sandboxes.
    workspace: (Option<u64>, u64),
    /// The model routes, whose variables a run's sandbox gets (by its tenant) under its own.
    llm: Arc<crate::llm::Routes>,
    wake: Notify,
    /// The id of a run whose events changed, for the event streams.
    changed: broadcast::Sender<String>,
    active: Mutex<HashMap<String, Active>>,
    draining: AtomicBool,
    gateway: OnceLock<SocketAddr>,
}

/// Where runs live and what their sandboxes get, from the server that drives them.
pub struct Home {
    /// The server's data directory (inputs and results under `runs/`).
    pub data_dir: PathBuf,
    /// The server's start (`boot.rs`), which owns the attempts it drives.
    pub boot: String,
    /// Caps of `/workspace`, as for API sandboxes.
    pub workspace: (Option<u64>, u64),
    /// The model routes, whose variables sandboxes get (by their tenant).
    pub llm: Arc<crate::llm::Routes>,
}

impl Runs {
    pub fn new(
        opts: RunOptions,
        rt: Arc<dyn Runtime>,
        pool: sqlx::SqlitePool,
        key: Arc<TokenKey>,
        home: Home,
    ) -> Arc<Self> {
        let Home { data_dir, boot, workspace, llm } = home;
        Arc::new(Self {
            store: RunStore::new(pool),
            opts,
            rt,
            key,
            data_dir,
            boot,
            workspace,
            llm,
            wake: Notify::new(),
            changed: broadcast::channel(1024).0,
            active: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            gateway: OnceLock::new(),
        })
    }

    pub fn options(&self) -> &RunOptions {
        &self.opts
    }

    /// Where the gateway listens, once it does.
    pub fn gateway_addr(&self) -> Option<SocketAddr> {
        self.gateway.get().copied()
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.data_dir.join("runs").join(id)
    }

    fn lock_active(&self) -> std::sync::MutexGuard<'_, HashMap<String, Active>> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an event and tells the event streams.
    async fn note(&self, run: &str, kind: &str, data: serde_json::Value) {
        if let Err(e) = self.store.event(run, kind, &data).await {
            tracing::warn!(run, error = %e, "recording a run event");
        }
        self.announce(run);
    }

    /// Tells event streams that `run` has a new event.
    fn announce(&self, run: &str) {
        let _ = self.changed.send(run.to_owned());
    }

    async fn note_state(&self, run: &str) {
        if let Ok(Some(r)) = self.store.get(run).await {
            let data = json!({
                "state": r.state.as_str(), "attempt": r.attempt, "epoch": r.epoch,
                "exitCode": r.exit_code, "reason": r.reason, "sandboxId": r.sandbox_id,
            });
            self.note(run, "state", data).await;
        }
    }

    /// Takes back what a server that ended left under way: its attempts are lost (their
    /// sandboxes destroyed) and their runs requeued with a new epoch, or failed when no
    /// attempt is left. Attempts of a live server on the same data directory are its own.
    /// A sandbox made for a run (labelled with it) that no live attempt holds is destroyed
    /// too: one a crash left between the runtime's create and the run's row.
    pub async fn recover(&self) {
        let kept = self.take_back().await;
        match self.rt.list().await {
            Ok(all) => {
                for info in all {
                    let Some(run) = info.spec.labels.get(RUN_LABEL) else { continue };
                    if kept.contains(run) {
                        continue;
                    }
                    tracing::info!(run = %run, sandbox = %info.id, "destroying a run's sandbox no attempt holds");
                    if let Err(e) = self.rt.destroy(&info.id).await {
                        tracing::warn!(sandbox = %info.id, error = %e, "destroying a run's leftover sandbox");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing sandboxes to find runs' leftovers"),
        }
        self.wake.notify_one();
    }

    /// Takes back the attempts of servers that ended (see [`Runs::recover`]); answers the runs
    /// whose attempts a live server (this one or another) still drives.
    async fn take_back(&self) -> std::collections::HashSet<String> {
        let mut kept = std::collections::HashSet::new();
        let Ok(active) = self.store.active().await else { return kept };
        for run in active {
            let ended = match run.boot.clone() {
                Some(b) if b == self.boot => false,
                Some(b) => {
                    let dd = self.data_dir.clone();
                    tokio::task::spawn_blocking(move || crate::boot::ended_or_gone(&dd, &b)).await.unwrap_or(false)
                }
                None => true,
            };
            if !ended {
                kept.insert(run.id.clone());
                continue;
            }
            tracing::info!(run = %run.id, epoch = run.epoch, "the server driving this attempt ended: it is lost");
            self.put_away(&run, run.sandbox_id.as_deref()).await;
            self.settle(&run, run.epoch, Outcome::Lost("the server driving it stopped".into())).await;
        }
        kept
    }

    /// Admits waiting runs whenever something changes, until the server drains.
    pub async fn schedule(self: Arc<Self>) {
        let mut taken_back = tokio::time::Instant::now();
        loop {
            // Another server on the same data directory may have died with attempts under way:
            // they are taken back within a minute, not only at this server's next start.
            if taken_back.elapsed() >= TAKE_BACK_EVERY {
                taken_back = tokio::time::Instant::now();
                self.take_back().await;
            }
            if !self.draining.load(Ordering::SeqCst)
                && let Err(e) = self.admit().await
            {
                tracing::warn!(error = %e, "admitting runs");
            }
            // Asleep until a run arrives or ends, or the next backoff ends: an idle server
            // with queued runs does nothing.
            let wait = match self.store.next_backoff_end().await {
                Ok(Some(t)) => Duration::from_millis(u64::try_from(t - now_ms()).unwrap_or(0)).min(TAKE_BACK_EVERY),
                _ => TAKE_BACK_EVERY,
            };
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn memory_of(spec: &RunSpec) -> u64 {
        let mut s = SandboxSpec::default();
        let _ = crate::resources::apply(&mut s, spec.resources.iter());
        s.resources.memory_bytes.saturating_add(tiers::SANDBOX_OVERHEAD)
    }

    async fn admit(self: &Arc<Self>) -> Result<(), sqlx::Error> {
        let tiers = &self.opts.tiers;
        let mut waiting: Vec<(usize, RunRow)> = self
            .store
            .waiting(now_ms())
            .await?
            .into_iter()
            .filter_map(|r| tiers.rank(&r.tier).map(|rank| (rank, r)))
            .collect();
        waiting.sort_by_key(|(rank, r)| (*rank, r.seq));
        for (rank, run) in waiting {
            let memory = Self::memory_of(&run.spec);
            let verdict = {
                let active = self.lock_active();
                if run.thread.is_some() && active.values().any(|a| a.thread == run.thread) {
                    continue;
                }
                let tier = &tiers.tiers[rank];
                let in_tier: Vec<&Active> = active.values().filter(|a| a.rank == rank).collect();
                let tier_ok = in_tier.len() < tier.concurrency as usize
                    && tier.memory.is_none_or(|m| in_tier.iter().map(|a| a.memory).sum::<u64>() + memory <= m);
                let total_ok = active.len() < tiers.capacity.runs as usize
                    && tiers
                        .capacity
                        .memory
                        .is_none_or(|m| active.values().map(|a| a.memory).sum::<u64>() + memory <= m);
                match (tier_ok, total_ok) {
                    (true, true) => Some(true),
                    (true, false) => Some(false),
                    _ => None,
                }
            };
            match verdict {
                Some(true) => self.start(rank, memory, run).await?,
                // Its tier has room but all tiers together have none: make room by stopping
                // the newest attempt of a lower tier, unless one is being stopped already.
                Some(false) => {
                    self.preempt_below(rank);
                    // Nothing of a lower tier may take the room this run waits for.
                    break;
                }
                None => {}
            }
        }
        Ok(())
    }

    fn preempt_below(&self, rank: usize) {
        let active = self.lock_active();
        if active.values().any(|a| *a.stop.borrow() == Some(Stop::Preempt)) {
            return;
        }
        let victim = active
            .iter()
            .filter(|(_, a)| a.rank > rank && a.stop.borrow().is_none())
            .max_by_key(|(_, a)| (a.rank, a.admitted_ms));
        if let Some((id, a)) = victim {
            tracing::info!(run = %id, "preempting the newest attempt of a lower tier for waiting work");
            let _ = a.stop.send(Some(Stop::Preempt));
        }
    }

    async fn start(self: &Arc<Self>, rank: usize, memory: u64, run: RunRow) -> Result<(), sqlx::Error> {
        let Some(epoch) = self.store.begin_attempt(&run.id, run.epoch, &self.boot).await? else { return Ok(()) };
        let (stop, stop_rx) = watch::channel(None);
        self.lock_active().insert(
            run.id.clone(),
            Active { epoch, rank, memory, admitted_ms: now_ms(), thread: run.thread.clone(), stop },
        );
        self.note_state(&run.id).await;
        let me = self.clone();
        tokio::spawn(async move {
            let row = me.store.get(&run.id).await.ok().flatten().unwrap_or(run);
            let (outcome, sandbox) = me.drive(&row, epoch, stop_rx).await;
            me.put_away(&row, sandbox.as_deref()).await;
            // Out of the count before the run can be admitted again, and only this attempt's
            // entry: a next attempt's must never be taken out by the one before.
            {
                let mut active = me.lock_active();
                if active.get(&row.id).is_some_and(|a| a.epoch == epoch) {
                    active.remove(&row.id);
                }
            }
            me.settle(&row, epoch, outcome).await;
            me.wake.notify_one();
        });
        Ok(())
    }

    /// The sandbox spec of an attempt, checked (a run's resources were at submission; what
    /// the server adds, too, is checked here once, not by the runtime).
    fn spec_of(&self, run: &RunRow) -> Result<ValidatedSpec, String> {
        let tenant = crate::tenants::Tenant::named(&run.tenant);
        let mut env: BTreeMap<String, String> = self.llm.sandbox_env(&tenant).into_iter().collect();
        env.extend(run.spec.env.clone());
        let mut spec = SandboxSpec { image: run.spec.image.clone(), env, ..Default::default() };
        spec.resources.workspace_bytes = self.workspace.0;
        spec.resources.workspace_inodes = self.workspace.1;
        crate::resources::apply(&mut spec, run.spec.resources.iter()).map_err(|e| e.message)?;
        if let Some(p) = &run.spec.network_policy {
            spec.network = crate::resources::network_of(p.clone()).map_err(|e| e.message)?;
        }
        // The supervisor ends a sandbox this long after its run's timeout even if no server
        // is left to: a crash never leaves one behind for good.
        spec.timeout_secs = Some(run.spec.timeout + 600);
        spec.gateway = Some(*self.gateway.get().ok_or("the gateway is not listening")?);
        spec.gateway_secret = Some(paddock_core::spec::GatewaySecret(self.key.gateway_secret()));
        spec.labels.insert(RUN_LABEL.into(), run.id.clone());
        spec.tier = Some(run.tier.clone());
        if let Some(t) = &run.thread {
            let thread = ThreadId::new(t.clone()).map_err(|e| e.to_string())?;
            spec.workspace = Some(WorkspaceRef { thread, naming: Default::default() });
        }
        spec.validated().map_err(|e| e.to_string())
    }

    /// Gets a sandbox for an attempt: a new one, or its thread's (made again when the one
    /// there has no gateway, e.g. one acquired through the workspace API).
    async fn sandbox_for(&self, run: &RunRow, spec: ValidatedSpec) -> Result<SandboxId, RuntimeError> {
        match &spec.workspace {
            None => Ok(self.rt.create(spec).await?.id),
            Some(w) => {
                let thread = w.thread.clone();
                let info = self.rt.acquire(&thread, spec.clone()).await?;
                if info.spec.gateway.is_some() && info.state == SandboxState::Running {
                    return Ok(info.id);
                }
                tracing::info!(run = %run.id, thread = %thread, "the thread's sandbox has no gateway: making it again");
                self.rt.release(&thread).await?;
                Ok(self.rt.acquire(&thread, spec).await?.id)
            }
        }
    }

    async fn drive(
        &self,
        run: &RunRow,
        epoch: i64,
        mut stop: watch::Receiver<Option<Stop>>,
    ) -> (Outcome, Option<String>) {
        let spec = match self.spec_of(run) {
            Ok(s) => s,
            Err(e) => return (Outcome::Refused(e), None),
        };
        let sandbox = match self.sandbox_for(run, spec).await {
            Ok(id) => id,
            Err(
                e @ (RuntimeError::InvalidArgument(_) | RuntimeError::InvalidSpec(_) | RuntimeError::Unsupported(_)),
            ) => {
                return (Outcome::Refused(e.to_string()), None);
            }
            Err(e) => return (Outcome::Lost(format!("no sandbox: {e}")), None),
        };
        let sid = sandbox.to_string();
        match self.store.set_sandbox(&run.id, epoch, &sid).await {
            Ok(true) => {}
            _ => return (Outcome::Stopped(Stop::Cancel), Some(sid)),
        }
        self.note(&run.id, "attempt", json!({"attempt": run.attempt, "epoch": epoch, "sandboxId": sid})).await;
        if let Some(s) = *stop.borrow() {
            return (Outcome::Stopped(s), Some(sid));
        }
        let mut env = BTreeMap::new();
        env.insert("PADDOCK_TOKEN".to_owned(), self.key.run_token(&run.id, epoch, &sid));
        env.insert("PADDOCK_RUN_ID".to_owned(), run.id.clone());
        env.insert("PADDOCK_EPOCH".to_owned(), epoch.to_string());
        let request = ExecRequest {
            argv: run.spec.command.clone(),
            env,
            timeout_ms: Some(run.spec.timeout.saturating_mul(1000)),
            ..Default::default()
        };
        let mut process = match self.rt.exec(&sandbox, request).await {
            Ok(p) => p,
            Err(e @ (RuntimeError::InvalidArgument(_) | RuntimeError::InvalidSpec(_))) => {
                return (Outcome::Refused(e.to_string()), Some(sid));
            }
            Err(e) => return (Outcome::Lost(format!("the driver could not start: {e}")), Some(sid)),
        };
        let output = self.dir(&run.id).join("output.log");
        let (out, err) = (
            std::mem::replace(&mut process.stdout, Box::new(tokio::io::empty())),
            std::mem::replace(&mut process.stderr, Box::new(tokio::io::empty())),
        );
        tokio::spawn(keep_output(output, out, err));
        let wait = process.control.wait();
        tokio::pin!(wait);
        loop {
            let deadline = self.next_deadline(run, epoch).await;
            let outcome = tokio::select! {
                r = &mut wait => match r {
                    Ok(o) => Some(self.classify(&sandbox, o).await),
                    Err(e) => Some(Outcome::Lost(format!("the driver's sandbox stopped answering: {e}"))),
                },
                changed = stop.changed() => match (changed, *stop.borrow()) {
                    (Ok(()), Some(s)) => Some(Outcome::Stopped(s)),
                    (Ok(()), None) => None,
                    // Nobody can stop it any more: never the case while its entry lives.
                    (Err(_), _) => Some(Outcome::Stopped(Stop::Cancel)),
                },
                () = tokio::time::sleep(deadline.unwrap_or(Duration::from_secs(3600))) => self.missed(run, epoch).await,
            };
            if let Some(o) = outcome {
                return (o, Some(sid));
            }
        }
    }

    /// How long until the attempt's start deadline or lease should be looked at again.
    async fn next_deadline(&self, run: &RunRow, epoch: i64) -> Option<Duration> {
        let row = self.store.get(&run.id).await.ok().flatten()?;
        if row.epoch != epoch {
            return None;
        }
        let at = match (row.first_call_at_ms, row.lease_expires_ms) {
            (None, _) => row.started_at_ms? + paddock_core::units::millis_i64(self.opts.start_deadline),
            (Some(_), Some(lease)) => lease,
            (Some(_), None) => return None,
        };
        Some(Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0) + 50))
    }

    /// Whether the attempt missed its start deadline or its lease.
    async fn missed(&self, run: &RunRow, epoch: i64) -> Option<Outcome> {
        let row = self.store.get(&run.id).await.ok().flatten()?;
        if row.epoch != epoch || row.state.is_terminal() {
            return Some(Outcome::Stopped(Stop::Cancel));
        }
        let now = now_ms();
        match (row.first_call_at_ms, row.lease_expires_ms) {
            (None, _)
                if row.started_at_ms.is_some_and(|s| {
                    now >= s.saturating_add(paddock_core::units::millis_i64(self.opts.start_deadline))
                }) =>
            {
                Some(Outcome::Lost(format!(
                    "its driver did not call the gateway within the start deadline ({}s)",
                    self.opts.start_deadline.as_secs()
                )))
            }
            (Some(_), Some(lease)) if now > lease => {
                Some(Outcome::Lost("its driver stopped heartbeating: the lease expired".into()))
            }
            _ => None,
        }
    }

    /// An exit by SIGKILL may be the sandbox going away under the driver: that is a lost
    /// attempt, not the driver's failure.
    async fn classify(&self, sandbox: &SandboxId, o: ExecOutcome) -> Outcome {
        if o.signal == Some(9) && !o.oom_killed {
            match self.rt.get(sandbox).await {
                Ok(info) if info.state == SandboxState::Running => {}
                _ => return Outcome::Lost("its sandbox is gone".into()),
            }
        }
        Outcome::Exited(o)
    }

    /// Gives back an attempt's sandbox: destroyed, or released when it holds a thread's
    /// workspace (which is kept).
    async fn put_away(&self, run: &RunRow, sandbox: Option<&str>) {
        let result = match (&run.thread, sandbox) {
            (Some(t), _) => match ThreadId::new(t.clone()) {
                Ok(thread) => self.rt.release(&thread).await,
                Err(_) => Ok(()),
            },
            (None, Some(id)) => match SandboxId::parse(id) {
                Ok(id) => match self.rt.destroy(&id).await {
                    Err(RuntimeError::NotFound(_)) => Ok(()),
                    other => other,
                },
                Err(_) => Ok(()),
            },
            (None, None) => Ok(()),
        };
        if let Err(e) = result {
            tracing::warn!(run = %run.id, error = %e, "giving back a run's sandbox");
        }
    }

    /// Records how an attempt ended. The record is the only way out of `starting` or
    /// `running` while this server lives (its recovery looks only at attempts of servers that
    /// ended), so a database that fails the write (busy, full, briefly unwritable) is asked
    /// again until it takes it.
    async fn settle(&self, run: &RunRow, epoch: i64, outcome: Outcome) {
        let mut pause = Duration::from_millis(250);
        loop {
            match self.record(run, epoch, &outcome).await {
                Ok(true) => return self.note_state(&run.id).await,
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(run = %run.id, error = %e, retry_in = ?pause, "recording how an attempt ended; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    async fn record(&self, run: &RunRow, epoch: i64, outcome: &Outcome) -> Result<bool, sqlx::Error> {
        let s = &self.store;
        let attempts_left = run.attempt_of(epoch) < run.max_attempts;
        let backoff = |n: i64| now_ms() + 1000 * (1i64 << (n.clamp(1, 7) - 1)).min(60);
        match outcome {
            Outcome::Exited(o) => {
                let code = Some(i64::from(o.exit_code));
                if o.exit_code == 0 {
                    s.finish(&run.id, epoch, RunState::Succeeded, code, None).await
                } else if o.timed_out || o.exit_code == 124 {
                    let why = format!("timeout: the attempt ran longer than {}s", run.spec.timeout);
                    s.finish(&run.id, epoch, RunState::Failed, code, Some(&why)).await
                } else if self.opts.requeue_codes.contains(&o.exit_code) && attempts_left {
                    let why = format!("the driver asked to run again (exit {})", o.exit_code);
                    s.requeue(&run.id, epoch, code, &why, now_ms(), true).await
                } else if o.oom_killed {
                    s.finish(&run.id, epoch, RunState::Failed, code, Some("the sandbox ran out of memory")).await
                } else {
                    let why = format!("the driver exited with {}", o.exit_code);
                    s.finish(&run.id, epoch, RunState::Failed, code, Some(&why)).await
                }
            }
            Outcome::Lost(why) if attempts_left => {
                let at = backoff(run.attempt_of(epoch));
                s.requeue(&run.id, epoch, None, &format!("lost: {why}"), at, true).await
            }
            Outcome::Lost(why) => {
                let why =
                    format!("lost on its last attempt ({} of {}): {why}", run.attempt_of(epoch), run.max_attempts);
                s.finish(&run.id, epoch, RunState::Failed, None, Some(&why)).await
            }
            // Work stopped to make room, or by a server going down, is not the run's fault: it
            // runs again whatever its attempts, and the stop is not one of them.
            Outcome::Stopped(Stop::Preempt) => {
                s.requeue(&run.id, epoch, None, "preempted for higher-priority work", now_ms(), false).await
            }
            Outcome::Stopped(Stop::Drain) => {
                s.requeue(&run.id, epoch, None, "its server stopped before it finished", now_ms(), false).await
            }
            Outcome::Stopped(Stop::Cancel) => Ok(false),
            Outcome::Refused(why) => {
                s.finish(&run.id, epoch, RunState::Failed, None, Some(&format!("cannot run: {why}"))).await
            }
        }
    }

    /// Stops admitting, lets attempts finish for up to `timeout`, then requeues the rest with
    /// a new epoch (they run again on the next start).
    pub async fn drain(&self, timeout: Duration) {
        self.draining.store(true, Ordering::SeqCst);
        let until = tokio::time::Instant::now() + timeout;
        while !self.lock_active().is_empty() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for a in self.lock_active().values() {
            let _ = a.stop.send(Some(Stop::Drain));
        }
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        while !self.lock_active().is_empty() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Asks the attempt of a run this server drives to stop.
    fn stop(&self, id: &str, why: Stop) {
        if let Some(a) = self.lock_active().get(id) {
            let _ = a.stop.send(Some(why));
        }
    }

    /// The sandboxes attempts hold now (never idle while they do).
    pub async fn sandboxes_held(&self) -> std::collections::HashSet<String> {
        self.store.active().await.unwrap_or_default().into_iter().filter_map(|r| r.sandbox_id).collect()
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The run a gateway token opens, when the token's signature holds.
    fn token_subject(&self, token: &str) -> Option<(String, i64, String)> {
        self.key.verify_run_token(token)
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<String> {
        self.changed.subscribe()
    }

    pub(crate) fn store(&self) -> &RunStore {
        &self.store
    }

    fn not_found(id: &str) -> ApiError {
        ApiError::not_found(format!("no run {id:?}: list runs with GET /v1/runs"))
    }

    pub(crate) async fn get(&self, id: &str) -> ApiResult<RunRow> {
        self.store.get(id).await?.ok_or_else(|| Self::not_found(id))
    }
}

impl RunRow {
    /// The number of the attempt with this epoch (epochs and attempts move together).
    fn attempt_of(&self, epoch: i64) -> i64 {
        self.attempt + (epoch - self.epoch)
    }
}

/// Keeps the first [`MAX_OUTPUT`] bytes of a driver's output (stdout and stderr as they
/// come) and reads the rest away, so the driver never blocks on a full pipe.
async fn keep_output(path: PathBuf, out: paddock_core::runtime::ByteReader, err: paddock_core::runtime::ByteReader) {
    let file = match tokio::fs::OpenOptions::new().create(true).append(true).open(&path).await {
        Ok(f) => Some(Arc::new(tokio::sync::Mutex::new((f, 0u64)))),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "keeping a driver's output");
            None
        }
    };
    let pump = |mut r: paddock_core::runtime::ByteReader,
                file: Option<Arc<tokio::sync::Mutex<(tokio::fs::File, u64)>>>| async move {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(f) = &file {
                let mut g = f.lock().await;
                let room = MAX_OUTPUT.saturating_sub(g.1);
                let take = usize::try_from(room).unwrap_or(usize::MAX).min(n);
                if take > 0 {
                    use tokio::io::AsyncWriteExt;
                    if g.0.write_all(&buf[..take]).await.is_ok() {
                        g.1 += take as u64;
                    }
                }
            }
        }
    };
    tokio::join!(pump(out, file.clone()), pump(err, file));
}
