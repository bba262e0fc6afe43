//! `paddock-bench --kubernetes`: the Kubernetes runtime measured on a real cluster,
//! each figure beside the nearest baseline run in the same process: a bare Pod's create →
//! Ready for acquire, `kubectl exec` of the same command for exec, and the local runtime's
//! exec round trip on this machine for the 3× aim. Medians and ratios: these machines are noisy.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use paddock_core::naming::ThreadId;
use paddock_core::runtime::{ExecRequest, Runtime, SandboxId};
use paddock_core::spec::{SandboxSpec, ValidatedSpec};
use paddock_runtime_k8s::KubeRuntime;
use serde::Serialize;

use crate::local::{Progress, Stats};

// `--iterations` (default 10 here) and `--quick` (3) are shared with the local benchmark.
#[derive(Debug, Args)]
#[command(next_help_heading = "Kubernetes benchmark")]
pub struct KubeBenchArgs {
    /// The kubectl binary for the `kubectl exec` baseline.
    #[arg(long, env = "PADDOCK_KUBECTL", default_value = "kubectl")]
    pub kubectl: PathBuf,
    /// The runtime's own options, as `paddock --runtime kubernetes` takes them.
    #[command(flatten)]
    pub runtime: paddock_runtime_k8s::cli::KubeOpts,
}

#[derive(Debug, Serialize)]
struct Report {
    namespace: String,
    iterations: usize,
    /// A new thread: PVC + Pod + NetworkPolicy to Ready.
    cold_acquire: Stats,
    /// The baseline of cold acquire: a bare Pod, create → Ready.
    bare_pod_ready: Stats,
    /// Acquire of a thread whose sandbox runs.
    warm_reacquire: Stats,
    /// Whether commands went through Paddock's agent in the Pod (else `pods/exec`).
    agent: bool,
    /// `true` in a running sandbox, until its exit status is known.
    exec_round_trip: Stats,
    /// The same over one `pods/exec` call per command (no agent).
    exec_round_trip_pods_exec: Stats,
    /// The baseline: `kubectl exec POD -- true` as a process.
    kubectl_exec: Stats,
    /// The local runtime's exec round trip on this machine, for the 3× aim.
    local_exec_round_trip: Option<Stats>,
    /// `create` in the keeper model: policy + Pod to Ready (no PVC).
    keeper_create: Stats,
    /// `create` in the claim model with a ready Pod waiting in the warm pool.
    claim_from_warm_pool: Stats,
    /// `create` in the claim model on a profile whose pool is empty (the controller starts a Pod).
    claim_without_pool: Stats,
    ratio_exec_vs_kubectl_p50: f64,
    ratio_exec_vs_pods_exec_p50: f64,
    ratio_exec_vs_local_p50: Option<f64>,
    ratio_cold_acquire_vs_bare_pod_p50: f64,
    ratio_warm_claim_vs_keeper_create_p50: f64,
}

fn thread(label: &str) -> Result<ThreadId> {
    let mut b = [0u8; 4];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())?;
    Ok(ThreadId::new(format!("bench-{label}-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>()))?)
}

fn spec() -> ValidatedSpec {
    let mut s = SandboxSpec::default();
    s.resources.millicpus = 500;
    s.resources.memory_bytes = 128 << 20;
    s.resources.tmp_bytes = 16 << 20;
    s.resources.workspace_bytes = Some(64 << 20);
    s.validated().expect("the bench's spec is valid")
}

async fn exec_true(rt: &dyn Runtime, id: &SandboxId) -> Result<Duration> {
    let t0 = Instant::now();
    let request = ExecRequest { argv: vec!["true".into()], ..Default::default() };
    let mut control = rt.exec(id, request).await?.control;
    let outcome = control.wait().await?;
    let took = t0.elapsed();
    if outcome.exit_code != 0 {
        bail!("`true` in sandbox {id} exited {}", outcome.exit_code);
    }
    Ok(took)
}

pub async fn run(
    rt: Arc<KubeRuntime>,
    local: Option<paddock_runtime_local::LocalRuntime>,
    args: KubeBenchArgs,
    (iterations, quick): (Option<usize>, bool),
    json: bool,
) -> Result<u8> {
    let n = iterations.unwrap_or(if quick { 3 } else { 10 }).max(1);
    let namespace = rt.config().namespace.clone();
    rt.preflight().await.context("the cluster is not usable for the benchmark")?;

    // 1. Cold acquire against a bare Pod, interleaved so both see the same cluster.
    let (mut cold, mut bare) = (Vec::new(), Vec::new());
    let mut progress = Progress::new("[1/4] cold acquire (new PVC + Pod) vs a bare Pod", n);
    for i in 0..n {
        let t = thread("cold")?;
        let t0 = Instant::now();
        let acquired = rt.acquire(&t, spec()).await;
        let took = t0.elapsed();
        let removed = rt.destroy_workspace(&t).await;
        acquired.context("cold acquire")?;
        removed.context("removing the bench workspace")?;
        cold.push(took);
        bare.push(rt.bare_pod_ready().await.context("the bare Pod baseline")?);
        progress.tick(i + 1);
    }

    // 2. Warm re-acquire and 3. exec round trips, on one running sandbox.
    let t = thread("warm")?;
    let info = rt.acquire(&t, spec()).await.context("acquiring the bench sandbox")?;
    // Steady state: the agent's upload would otherwise share the CPUs with the re-acquires.
    let agent = rt.wait_agent(&rt.pod_name(&info.id).await?, Duration::from_secs(30)).await;
    let measured = async {
        let (mut warm, mut exec, mut kubectl, mut pods_exec) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut progress = Progress::new("[2/4] warm re-acquire", n);
        for i in 0..n {
            let t0 = Instant::now();
            let again = rt.acquire(&t, spec()).await?;
            warm.push(t0.elapsed());
            if again.id != info.id {
                bail!("re-acquire returned {} instead of the running {}", again.id, info.id);
            }
            progress.tick(i + 1);
        }
        let pod = rt.pod_name(&info.id).await?;
        let mut progress = Progress::new("[3/4] exec round trip vs pods/exec vs kubectl exec", n);
        exec_true(rt.as_ref(), &info.id).await?; // warm-up
        let no_agent = rt.without_agent();
        exec_true(&no_agent, &info.id).await?;
        for i in 0..n {
            exec.push(exec_true(rt.as_ref(), &info.id).await?);
            pods_exec.push(exec_true(&no_agent, &info.id).await?);
            let t0 = Instant::now();
            let status = tokio::process::Command::new(&args.kubectl)
                .args(["-n", &namespace, "exec", &pod, "-c", "sandbox", "--", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await
                .with_context(|| format!("running {} (set --kubectl)", args.kubectl.display()))?;
            kubectl.push(t0.elapsed());
            if !status.success() {
                bail!("`kubectl exec {pod} -- true` failed ({status})");
            }
            progress.tick(i + 1);
        }
        Ok((warm, exec, kubectl, pods_exec))
    }
    .await;
    let removed = rt.destroy_workspace(&t).await;
    let (warm, exec, kubectl, pods_exec) = measured?;
    removed.context("removing the bench workspace")?;

    // 4. The claim model: a warm pool's Pod vs one the controller starts vs a keeper Pod.
    let claims = rt.with_model(paddock_runtime_k8s::SandboxModel::Claim, 1);
    // A profile of its own on a runtime that keeps no Pods warm: every claim starts one.
    let cold_claims = rt.with_model(paddock_runtime_k8s::SandboxModel::Claim, 0);
    let cold_spec = || {
        let mut s = spec().into_inner();
        s.resources.memory_bytes = 96 << 20;
        s.validated().expect("the bench's spec is valid")
    };
    let (mut keeper, mut warm_claim, mut cold_claim) = (Vec::new(), Vec::new(), Vec::new());
    let mut progress = Progress::new("[4/4] create: warm-pool claim vs empty-pool claim vs keeper Pod", n);
    for i in 0..n {
        let deadline = Instant::now() + Duration::from_secs(120);
        while claims.default_pool_ready().await? < 1 {
            if Instant::now() > deadline {
                bail!("the warm pool has no ready Pod after 120 s; check the agent-sandbox controller");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (samples, runtime, spec) in [
            (&mut warm_claim, &claims, ValidatedSpec::default()),
            (&mut cold_claim, &cold_claims, cold_spec()),
            (&mut keeper, rt.as_ref(), spec()),
        ] {
            let t0 = Instant::now();
            let info = runtime.create(spec).await.context("creating a bench sandbox")?;
            samples.push(t0.elapsed());
            runtime.destroy(&info.id).await.context("destroying a bench sandbox")?;
        }
        progress.tick(i + 1);
    }
    claims.drain_pools().await.context("removing the bench warm pools")?;
    cold_claims.drain_pools().await.context("removing the bench warm pools")?;

    let local_exec = match local {
        Some(local) => {
            let info = local.create(ValidatedSpec::default()).await.context("a local sandbox for the baseline")?;
            let mut samples = Vec::new();
            let measured = async {
                exec_true(&local, &info.id).await?;
                for _ in 0..n.max(10) {
                    samples.push(exec_true(&local, &info.id).await?);
                }
                anyhow::Ok(())
            }
            .await;
            local.destroy(&info.id).await?;
            measured?;
            Some(Stats::of(&samples))
        }
        None => None,
    };

    let (cold, bare, warm, exec, kubectl, pods_exec) = (
        Stats::of(&cold),
        Stats::of(&bare),
        Stats::of(&warm),
        Stats::of(&exec),
        Stats::of(&kubectl),
        Stats::of(&pods_exec),
    );
    let report = Report {
        namespace,
        iterations: n,
        ratio_exec_vs_kubectl_p50: exec.p50_ms / kubectl.p50_ms,
        ratio_exec_vs_pods_exec_p50: exec.p50_ms / pods_exec.p50_ms,
        ratio_exec_vs_local_p50: local_exec.as_ref().map(|l| exec.p50_ms / l.p50_ms),
        ratio_cold_acquire_vs_bare_pod_p50: cold.p50_ms / bare.p50_ms,
        ratio_warm_claim_vs_keeper_create_p50: Stats::of(&warm_claim).p50_ms / Stats::of(&keeper).p50_ms,
        keeper_create: Stats::of(&keeper),
        claim_from_warm_pool: Stats::of(&warm_claim),
        claim_without_pool: Stats::of(&cold_claim),
        cold_acquire: cold,
        bare_pod_ready: bare,
        warm_reacquire: warm,
        agent,
        exec_round_trip: exec,
        exec_round_trip_pods_exec: pods_exec,
        kubectl_exec: kubectl,
        local_exec_round_trip: local_exec,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let row = |name: &str, s: &Stats| println!("  {name:<38} p50 {:>9.2} ms   p99 {:>9.2} ms", s.p50_ms, s.p99_ms);
    println!("paddock-bench, kubernetes runtime (namespace {}, {} iterations)", report.namespace, n);
    row("cold acquire (PVC + Pod + policy)", &report.cold_acquire);
    row("  baseline: bare Pod create -> Ready", &report.bare_pod_ready);
    row("warm re-acquire", &report.warm_reacquire);
    let through = if report.agent { "exec round trip (`true`), agent" } else { "exec round trip (`true`), NO agent" };
    row(through, &report.exec_round_trip);
    row("  baseline: one pods/exec per command", &report.exec_round_trip_pods_exec);
    row("  baseline: kubectl exec -- true", &report.kubectl_exec);
    if let Some(l) = &report.local_exec_round_trip {
        row("  local runtime exec round trip", l);
    }
    row("create, keeper model (policy + Pod)", &report.keeper_create);
    row("create, claim from a warm pool", &report.claim_from_warm_pool);
    row("create, claim on an empty pool", &report.claim_without_pool);
    println!(
        "ratios (p50): cold acquire / bare Pod {:.2}x; exec / pods/exec {:.3}x; exec / kubectl exec {:.3}x{}",
        report.ratio_cold_acquire_vs_bare_pod_p50,
        report.ratio_exec_vs_pods_exec_p50,
        report.ratio_exec_vs_kubectl_p50,
        report.ratio_exec_vs_local_p50.map(|r| format!("; exec / local exec {r:.1}x")).unwrap_or_default()
    );
    let aim = |ok: bool| if ok { "hit" } else { "MISS" };
    println!(
        "aims: re-acquire <= 20 ms p50: {} ({:.1} ms); warm-pool claim <= 200 ms p50: {} ({:.0} ms); exec within 3x of local: {}",
        aim(report.warm_reacquire.p50_ms <= 20.0),
        report.warm_reacquire.p50_ms,
        aim(report.claim_from_warm_pool.p50_ms <= 200.0),
        report.claim_from_warm_pool.p50_ms,
        report
            .ratio_exec_vs_local_p50
            .map(|r| format!("{} ({r:.1}x)", aim(r <= 3.0)))
            .unwrap_or_else(|| "not measured".into())
    );
    Ok(0)
}
