//! The owner's run API (under the API key): submit, read, list, cancel, follow and fetch.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRef, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use base64::Engine;
use paddock_core::naming::ThreadId;
use paddock_core::requires::Requirements;
use paddock_core::runtime::ExecRequest;
use paddock_core::spec::SandboxSpec;
use serde::Deserialize;
use serde_json::{Value, json};

use super::store::{Filter, Inserted, RunRow, RunSpec, RunState};
use super::{DEFAULT_MAX_ATTEMPTS, DEFAULT_RUN_TIMEOUT, MAX_MAX_ATTEMPTS, MAX_RUN_TIMEOUT, Runs};
use crate::api::ApiJson;
use crate::tenants::{Tenant, Tenants, scoped, unscoped};

/// Held while a tenant with a runs quota counts its runs and inserts one.
static QUOTA_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
use crate::error::{ApiError, ApiResult};
use crate::store::now_ms;
use crate::time_fmt::rfc3339;

/// The run named in the path, read from the store (404 when there is none).
pub struct RunPath(RunRow);

impl<S> FromRequestParts<S> for RunPath
where
    Arc<Runs>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let crate::api::ApiPath(id) = crate::api::ApiPath::<String>::from_request_parts(parts, state).await?;
        let runs = Arc::<Runs>::from_ref(state);
        let run = runs.get(&id).await?;
        // Another tenant's run is as absent as one that never was.
        let tenant = parts.extensions.get::<Tenant>().cloned().unwrap_or_else(Tenant::default_tenant);
        if run.tenant != tenant.as_str() {
            return Err(ApiError::not_found(format!("no run {id:?}: list runs with GET /v1/runs")));
        }
        Ok(RunPath(run))
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum IfBusy {
    /// Wait for the thread's earlier runs.
    #[default]
    Queue,
    /// Refuse with 409 while one is not finished.
    Reject,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SubmitRequest {
    tier: Option<String>,
    image: Option<String>,
    command: Vec<String>,
    thread: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    resources: BTreeMap<String, String>,
    timeout: Option<u64>,
    max_attempts: Option<i64>,
    /// A tar, base64: what `GET /v1/inputs` gives the driver.
    inputs: Option<String>,
    #[serde(default)]
    if_busy: IfBusy,
    /// What the sandbox may reach besides the gateway, as a sandbox's `networkPolicy`
    /// (default: nothing).
    network_policy: Option<paddock_core::egress::EgressPolicy>,
    /// What the sandbox must give beyond an image and resources (a boundary, a device,
    /// containers inside); refused at submission when the runtime cannot.
    #[serde(default)]
    requires: Requirements,
}

/// A run as the API shows it.
pub fn view(r: &RunRow) -> Value {
    let t = |ms: Option<i64>| ms.map(rfc3339);
    let tenant = Tenant::named(&r.tenant);
    json!({
        "id": r.id,
        "tier": r.tier,
        "state": r.state.as_str(),
        "thread": r.thread.as_deref().map(|t| unscoped(&tenant, t).unwrap_or(t)),
        "evaluation": r.evaluation,
        "image": r.spec.image,
        "command": r.spec.command,
        "timeout": r.spec.timeout,
        "attempt": r.attempt,
        "maxAttempts": r.max_attempts,
        "epoch": r.epoch,
        "exitCode": r.exit_code,
        "reason": r.reason,
        "sandboxId": r.sandbox_id,
        "hasInputs": r.has_inputs,
        "hasResult": r.has_result,
        "leaseExpiresAt": t(r.lease_expires_ms),
        "createdAt": rfc3339(r.created_at_ms),
        "updatedAt": rfc3339(r.updated_at_ms),
        "startedAt": t(r.started_at_ms),
        "firstCallAt": t(r.first_call_at_ms),
        "finishedAt": t(r.finished_at_ms),
        "requires": (!r.spec.requires.is_empty()).then_some(&r.spec.requires),
    })
}

fn new_id() -> ApiResult<String> {
    let mut b = [0u8; 8];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| ApiError::internal(format!("getrandom: {e}")))?;
    Ok(format!("run-{}", hex::encode(b)))
}

/// Checks a request against what the server and its runtime can do: every refusal is a 400
/// at submission, never a run that fails later for a reason known now.
fn plan(runs: &Runs, req: &SubmitRequest) -> ApiResult<(String, RunSpec)> {
    let caps = runs.rt.capabilities();
    if !caps.gateway {
        let why = caps.no_gateway_because.as_deref().unwrap_or("it has no way to give one");
        return Err(ApiError::bad_request(format!(
            "runs need a sandbox with a way home to the gateway, which the {} runtime does not give: {why}",
            caps.runtime
        )));
    }
    if let Some(why) = req.requires.unmet(&caps) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "UNSUPPORTED", why));
    }
    let tiers = &runs.opts.tiers;
    let tier = match &req.tier {
        Some(t) if tiers.rank(t).is_some() => t.clone(),
        Some(t) => {
            return Err(ApiError::bad_request(format!("tier {t:?} is not one of this server's: {}", tiers.names())));
        }
        None => tiers.tiers.last().map(|t| t.name.clone()).unwrap_or_default(),
    };
    ExecRequest { argv: req.command.clone(), ..Default::default() }
        .validate()
        .map_err(|e| ApiError::bad_request(format!("command: {e}")))?;
    let timeout = req.timeout.unwrap_or(DEFAULT_RUN_TIMEOUT);
    if timeout == 0 || timeout > MAX_RUN_TIMEOUT {
        return Err(ApiError::bad_request(format!("timeout {timeout}s: give 1 to {MAX_RUN_TIMEOUT} seconds")));
    }
    if let Some(m) = req.max_attempts
        && !(1..=MAX_MAX_ATTEMPTS).contains(&m)
    {
        return Err(ApiError::bad_request(format!("maxAttempts {m}: give 1 to {MAX_MAX_ATTEMPTS}")));
    }
    for reserved in ["PADDOCK_TOKEN", "PADDOCK_GATEWAY", "PADDOCK_RUN_ID", "PADDOCK_EPOCH"] {
        if req.env.contains_key(reserved) {
            return Err(ApiError::bad_request(format!("env: {reserved} is set by Paddock for the driver")));
        }
    }
    if let Some(t) = &req.thread {
        ThreadId::new(t.clone()).map_err(|e| ApiError::bad_request(format!("thread: {e}")))?;
        if !runs.rt.capabilities().persistent_workspaces {
            return Err(ApiError::bad_request("thread: this runtime keeps no workspaces across sandboxes"));
        }
    }
    let mut spec = SandboxSpec { image: req.image.clone(), env: req.env.clone(), ..Default::default() };
    crate::resources::apply(&mut spec, req.resources.iter())?;
    if let Some(p) = &req.network_policy {
        spec.network = crate::resources::network_of(p.clone())?;
    }
    spec.validate().map_err(|e| ApiError::bad_request(e.to_string()))?;
    // A run that no budget could ever admit is refused now, not queued forever.
    let needs = spec.resources.memory_bytes.saturating_add(super::tiers::SANDBOX_OVERHEAD);
    let fmt = paddock_core::units::format_bytes;
    let budgets = [
        (tiers.tiers.iter().find(|t| t.name == tier).and_then(|t| t.memory), format!("tier {tier:?}")),
        (tiers.capacity.memory, "this server's capacity".to_owned()),
    ];
    for (budget, whose) in budgets {
        if let Some(budget) = budget
            && needs > budget
        {
            return Err(ApiError::bad_request(format!(
                "resources: a sandbox of {} memory needs {} with the runtime's overhead, more than the {} memory budget of {whose}: ask for less memory or submit to a tier with a larger budget",
                fmt(spec.resources.memory_bytes),
                fmt(needs),
                fmt(budget)
            )));
        }
    }
    let run = RunSpec {
        image: req.image.clone(),
        command: req.command.clone(),
        env: req.env.clone(),
        resources: req.resources.clone(),
        timeout,
        network_policy: req.network_policy.clone(),
        requires: req.requires.clone(),
    };
    Ok((tier, run))
}

async fn submit(
    State(runs): State<Arc<Runs>>,
    State(tenants): State<Arc<Tenants>>,
    tenant: Tenant,
    headers: HeaderMap,
    ApiJson(req): ApiJson<SubmitRequest>,
) -> ApiResult<Response> {
    if runs.draining() {
        return Err(ApiError::unavailable("this server is stopping and admits no new runs: submit to another"));
    }
    let key = match headers.get("idempotency-key") {
        Some(v) => {
            let k = v.to_str().map_err(|_| ApiError::bad_request("Idempotency-Key is not ASCII"))?.trim();
            if k.is_empty() || k.len() > 255 {
                return Err(ApiError::bad_request("Idempotency-Key is 1 to 255 characters"));
            }
            // Each tenant has keys of its own: a header value cannot hold a newline.
            Some(if tenant.is_default() { k.to_owned() } else { format!("{}\n{k}", tenant.as_str()) })
        }
        None => None,
    };
    if let Some(k) = &key
        && let Some(existing) = runs.store().existing_by_key(k).await?
    {
        return Ok((StatusCode::OK, axum::Json(view(&existing))).into_response());
    }
    let (status, row) = enqueue(&runs, &tenants, &tenant, req, key, None).await?;
    Ok((status, axum::Json(view(&row))).into_response())
}

/// Queues one run (the request already parsed): `201` and the new run, or `200` and the run an
/// idempotency key already made.
async fn enqueue(
    runs: &Arc<Runs>,
    tenants: &Tenants,
    tenant: &Tenant,
    req: SubmitRequest,
    key: Option<String>,
    evaluation: Option<&str>,
) -> ApiResult<(StatusCode, RunRow)> {
    let (tier, spec) = plan(runs, &req)?;
    // The runtime's name of the thread, the tenant's own (`tenants::scoped`).
    let thread = match &req.thread {
        Some(t) => {
            crate::tenants::check_user_name("thread", t)?;
            Some(scoped(tenant, t))
        }
        None => None,
    };
    // Counted and inserted under one lock, so concurrent submits cannot all fit one last place.
    let quota = tenants.quotas(tenant).runs.get(&tier).copied();
    let _counting = match quota {
        Some(_) => Some(QUOTA_LOCK.lock().await),
        None => None,
    };
    if let Some(max) = quota {
        let n = runs.store().unfinished_of(tenant.as_str(), &tier).await?;
        if n >= max {
            let name = format!("runs.{tier}");
            tenants.refused(tenant, &name);
            return Err(crate::tenants::quota_refusal(
                tenant,
                &name,
                format!("{n} of {max} runs of tier {tier:?} have not finished"),
            ));
        }
    }
    if let (Some(t), IfBusy::Reject) = (&thread, req.if_busy)
        && runs.store().thread_busy(t, "").await?
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "THREAD_BUSY",
            format!(
                "thread {:?} has a run that has not finished: wait for it, or submit with ifBusy \"queue\"",
                req.thread.as_deref().unwrap_or_default()
            ),
        ));
    }
    let id = new_id()?;
    let dir = runs.dir(&id);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| ApiError::internal(format!("creating {}: {e}", dir.display())))?;
    let made = async {
        if let Some(b64) = &req.inputs {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|_| ApiError::bad_request("inputs: not base64 (give a tar, base64-encoded)"))?;
            if raw.len() as u64 > runs.opts.max_tar_bytes {
                return Err(ApiError::bad_request(format!(
                    "inputs: larger than {} bytes; upload them with PUT /v1/runs/{{id}}/inputs",
                    runs.opts.max_tar_bytes
                )));
            }
            let path = dir.join("inputs.tar");
            tokio::fs::write(&path, &raw).await.map_err(|e| ApiError::internal(format!("keeping inputs: {e}")))?;
            super::upload::check_tar(runs, path).await?;
        }
        let now = now_ms();
        let row = RunRow {
            seq: 0,
            id: id.clone(),
            tier,
            state: RunState::Queued,
            thread,
            evaluation: evaluation.map(str::to_owned),
            spec,
            idempotency_key: key,
            attempt: 0,
            max_attempts: req.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
            epoch: 0,
            sandbox_id: None,
            boot: None,
            exit_code: None,
            reason: None,
            has_inputs: req.inputs.is_some(),
            has_result: false,
            lease_expires_ms: None,
            not_before_ms: None,
            created_at_ms: now,
            updated_at_ms: now,
            started_at_ms: None,
            first_call_at_ms: None,
            finished_at_ms: None,
            tenant: tenant.as_str().to_owned(),
        };
        Ok(runs.store().insert(&row).await?)
    }
    .await;
    match made {
        Ok(Inserted::New(row)) => {
            // Its `queued` event was written with the row.
            runs.announce(&row.id);
            runs.wake.notify_one();
            Ok((StatusCode::CREATED, row))
        }
        Ok(Inserted::Existing(row)) => {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            Ok((StatusCode::OK, row))
        }
        Err(e) => {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            Err(e)
        }
    }
}

/// The most tasks one evaluation may hold.
const MAX_TASKS: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EvaluationTask {
    name: Option<String>,
    image: Option<String>,
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    resources: BTreeMap<String, String>,
    timeout: Option<u64>,
    inputs: Option<String>,
    network_policy: Option<paddock_core::egress::EgressPolicy>,
    #[serde(default)]
    requires: Requirements,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EvaluationRequest {
    name: Option<String>,
    /// The tier of every task (default: the lowest).
    tier: Option<String>,
    max_attempts: Option<i64>,
    tasks: Vec<EvaluationTask>,
}

/// `POST /v1/evaluations`: a batch of runs over a task list (each an image, a command and
/// inputs), queued together. Every task is checked first: one the runtime cannot run is a `400`
/// naming the task, and nothing is queued.
async fn evaluate(
    State(runs): State<Arc<Runs>>,
    State(tenants): State<Arc<Tenants>>,
    tenant: Tenant,
    ApiJson(req): ApiJson<EvaluationRequest>,
) -> ApiResult<Response> {
    if runs.draining() {
        return Err(ApiError::unavailable("this server is stopping and admits no new runs: submit to another"));
    }
    if req.tasks.is_empty() || req.tasks.len() > MAX_TASKS {
        return Err(ApiError::bad_request(format!("tasks: give 1 to {MAX_TASKS} tasks")));
    }
    if req.name.as_ref().is_some_and(|n| n.len() > 256) {
        return Err(ApiError::bad_request("name: at most 256 characters"));
    }
    let mut submits = Vec::with_capacity(req.tasks.len());
    for (i, t) in req.tasks.into_iter().enumerate() {
        let submit = SubmitRequest {
            tier: req.tier.clone(),
            image: t.image,
            command: t.command,
            thread: None,
            env: t.env,
            resources: t.resources,
            timeout: t.timeout,
            max_attempts: req.max_attempts,
            inputs: t.inputs,
            if_busy: IfBusy::Queue,
            network_policy: t.network_policy,
            requires: t.requires,
        };
        let what = t.name.as_deref().map(|n| format!("task {i} ({n})")).unwrap_or_else(|| format!("task {i}"));
        plan(&runs, &submit).map_err(|e| ApiError::new(e.status, e.code, format!("{what}: {}", e.message)))?;
        // Inputs are checked whole here too, so no task is queued before a later one fails.
        if let Some(b64) = &submit.inputs {
            let raw = base64::engine::general_purpose::STANDARD.decode(b64.trim()).map_err(|_| {
                ApiError::bad_request(format!("{what}: inputs: not base64 (give a tar, base64-encoded)"))
            })?;
            if raw.len() as u64 > runs.opts.max_tar_bytes {
                return Err(ApiError::bad_request(format!(
                    "{what}: inputs: larger than {} bytes",
                    runs.opts.max_tar_bytes
                )));
            }
            let limits =
                super::tarcheck::Limits { max_entries: runs.opts.max_tar_entries, max_bytes: runs.opts.max_tar_bytes };
            super::tarcheck::check(&raw[..], limits).map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, "INVALID_ARCHIVE", format!("{what}: inputs: {}", e.0))
            })?;
        }
        submits.push((what, submit));
    }
    let id = new_id()?.replacen("run-", "eval-", 1);
    let mut ids = Vec::with_capacity(submits.len());
    for (what, submit) in submits {
        let (_, row) = enqueue(&runs, &tenants, &tenant, submit, None, Some(&id))
            .await
            .map_err(|e| ApiError::new(e.status, e.code, format!("{what}: {}", e.message)))?;
        ids.push(row.id);
    }
    let view = evaluation_view(&id, req.name.as_deref(), &runs, &tenant).await?;
    Ok((StatusCode::CREATED, axum::Json(view)).into_response())
}

async fn evaluation_view(id: &str, name: Option<&str>, runs: &Runs, tenant: &Tenant) -> ApiResult<Value> {
    let rows = runs.store().of_evaluation(id, tenant.as_str()).await?;
    if rows.is_empty() {
        return Err(ApiError::not_found(format!("no evaluation {id:?}")));
    }
    let mut states: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &rows {
        *states.entry(r.state.as_str()).or_default() += 1;
    }
    let done = rows.iter().all(|r| r.state.is_terminal());
    let items: Vec<Value> = rows
        .iter()
        .map(|r| json!({"id": r.id, "state": r.state.as_str(), "exitCode": r.exit_code, "reason": r.reason, "hasResult": r.has_result}))
        .collect();
    Ok(json!({"id": id, "name": name, "tasks": rows.len(), "states": states, "done": done, "runs": items}))
}

async fn get_evaluation(
    State(runs): State<Arc<Runs>>,
    tenant: Tenant,
    crate::api::ApiPath(id): crate::api::ApiPath<String>,
) -> ApiResult<axum::Json<Value>> {
    Ok(axum::Json(evaluation_view(&id, None, &runs, &tenant).await?))
}

async fn get_one(RunPath(run): RunPath) -> axum::Json<Value> {
    axum::Json(view(&run))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    tier: Option<String>,
    state: Option<String>,
    thread: Option<String>,
    limit: Option<i64>,
    after: Option<String>,
}

async fn list(
    State(runs): State<Arc<Runs>>,
    tenant: Tenant,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<axum::Json<Value>> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(format!("query: {}", e.body_text())))?;
    let state = match &q.state {
        Some(s) => Some(RunState::parse(s).ok_or_else(|| {
            let all: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
            ApiError::bad_request(format!("state {s:?} is not one of {}", all.join(", ")))
        })?),
        None => None,
    };
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request("limit: give 1 to 1000"));
    }
    let after = match &q.after {
        Some(a) => {
            a.parse::<i64>().map_err(|_| ApiError::bad_request("after: give the `next` of the previous page"))?
        }
        None => 0,
    };
    let thread = q.thread.map(|t| scoped(&tenant, &t));
    let filter = Filter { tier: q.tier, state, thread, tenant: tenant.as_str().to_owned() };
    let rows = runs.store().list(&filter, after, limit + 1).await?;
    // 1 to 1000, checked above.
    let limit = usize::try_from(limit).unwrap_or(1);
    let more = rows.len() > limit;
    let items: Vec<Value> = rows.iter().take(limit).map(view).collect();
    let next = if more { rows.get(limit.saturating_sub(1)).map(|r| r.seq.to_string()) } else { None };
    Ok(axum::Json(json!({"items": items, "next": next})))
}

async fn cancel(State(runs): State<Arc<Runs>>, RunPath(run): RunPath) -> ApiResult<axum::Json<Value>> {
    if runs.store().cancel(&run.id).await? {
        runs.stop(&run.id, super::Stop::Cancel);
        runs.note_state(&run.id).await;
        runs.wake.notify_one();
    }
    Ok(axum::Json(view(&runs.get(&run.id).await?)))
}

async fn result(State(runs): State<Arc<Runs>>, RunPath(run): RunPath) -> ApiResult<Response> {
    let path = runs.dir(&run.id).join("result.tar");
    // An earlier attempt's archive is not this run's result.
    let opened =
        if run.has_result { tokio::fs::File::open(&path).await } else { Err(std::io::ErrorKind::NotFound.into()) };
    match opened {
        Ok(f) => {
            Ok(([(header::CONTENT_TYPE, "application/x-tar")], Body::from_stream(tokio_util::io::ReaderStream::new(f)))
                .into_response())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NO_RESULT",
            format!("run {} has no result: its driver uploads one with PUT $PADDOCK_GATEWAY/v1/result", run.id),
        )),
        Err(e) => Err(ApiError::internal(format!("reading the result: {e}"))),
    }
}

async fn output(State(runs): State<Arc<Runs>>, RunPath(run): RunPath) -> ApiResult<Response> {
    let path = runs.dir(&run.id).join("output.log");
    let bytes = tokio::fs::read(&path).await.unwrap_or_default();
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], bytes).into_response())
}

async fn put_inputs(State(runs): State<Arc<Runs>>, RunPath(run): RunPath, body: Body) -> ApiResult<Response> {
    if run.state != RunState::Queued || run.attempt > 0 {
        return Err(ApiError::conflict(format!(
            "run {} has started: inputs are given before its first attempt (or with the submission)",
            run.id
        )));
    }
    let dir = runs.dir(&run.id);
    let tmp = dir.join("inputs.tar.part");
    let kept = async {
        super::upload::body_to_file(body, &tmp, runs.opts.max_tar_bytes).await?;
        super::upload::check_tar(&runs, tmp.clone()).await?;
        tokio::fs::rename(&tmp, dir.join("inputs.tar"))
            .await
            .map_err(|e| ApiError::internal(format!("keeping inputs: {e}")))?;
        if !runs.store().set_inputs(&run.id).await? {
            let _ = tokio::fs::remove_file(dir.join("inputs.tar")).await;
            return Err(ApiError::conflict(format!(
                "run {} started while its inputs were uploaded: give inputs with the submission to be sure they are there",
                run.id
            )));
        }
        Ok(())
    }
    .await;
    if let Err(e) = kept {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    after: Option<i64>,
}

/// Server-Sent Events: every event of the run from after `Last-Event-ID` (or `?after=`),
/// then new ones as they come, until the run has ended and all were sent.
async fn events(
    State(runs): State<Arc<Runs>>,
    RunPath(run): RunPath,
    headers: HeaderMap,
    Query(q): Query<EventsQuery>,
) -> Response {
    let mut after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .or(q.after)
        .unwrap_or(0);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let mut changed = runs.subscribe();
    let id = run.id.clone();
    tokio::spawn(async move {
        let mut told_end = false;
        loop {
            let batch = match runs.store().events_after(&id, after, 256).await {
                Ok(b) => b,
                Err(_) => return,
            };
            let got = batch.len();
            for ev in batch {
                after = ev.seq;
                // The stream ends after the event that says the run ended, never before it: the
                // row turns terminal a moment before that event is written.
                told_end = ev.kind == "state"
                    && ev.data["state"].as_str().and_then(RunState::parse).is_some_and(RunState::is_terminal);
                let data = json!({"seq": ev.seq, "type": ev.kind, "data": ev.data, "at": rfc3339(ev.at_ms)});
                let event = Event::default().id(ev.seq.to_string()).event(ev.kind.clone()).data(data.to_string());
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            if got == 256 {
                continue;
            }
            let gone = runs.store().get(&id).await.ok().flatten().is_none();
            if told_end || gone {
                return;
            }
            // Woken by any run's change; a lagging receiver just reads the store again.
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    match changed.recv().await {
                        Ok(r) if r == id => return,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            return;
                        }
                    }
                }
            })
            .await;
            if tx.is_closed() {
                return;
            }
        }
    });
    let stream: tokio_stream::wrappers::ReceiverStream<Result<Event, Infallible>> =
        tokio_stream::wrappers::ReceiverStream::new(rx);
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// `GET /v1/tiers`: the tiers, the capacity over them, and what each holds now.
async fn tiers(State(runs): State<Arc<Runs>>) -> axum::Json<Value> {
    let active = runs.lock_active();
    let t = &runs.opts.tiers;
    let items: Vec<Value> = t
        .tiers
        .iter()
        .enumerate()
        .map(|(rank, tier)| {
            json!({
                "name": tier.name, "priority": rank, "concurrency": tier.concurrency, "memory": tier.memory,
                "running": active.values().filter(|a| a.rank == rank).count(),
            })
        })
        .collect();
    axum::Json(json!({
        "tiers": items,
        "capacity": {"runs": t.capacity.runs, "memory": t.capacity.memory, "running": active.len()},
    }))
}

/// The owner routes, for any router state that holds the runs.
pub fn router<S>() -> Router<S>
where
    Arc<Runs>: FromRef<S>,
    Arc<Tenants>: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/runs", post(submit).get(list))
        .route("/runs/{id}", get(get_one))
        .route("/runs/{id}/cancel", post(cancel))
        .route("/runs/{id}/events", get(events))
        .route("/runs/{id}/result", get(result))
        .route("/runs/{id}/output", get(output))
        .route("/runs/{id}/inputs", put(put_inputs).layer(axum::extract::DefaultBodyLimit::disable()))
        .route("/tiers", get(tiers))
        .route("/evaluations", post(evaluate))
        .route("/evaluations/{id}", get(get_evaluation))
}

/// The run routes and the gateway's, for `/v1/openapi.json`. The gateway's are served on its
/// own listener (each names it as its server), under the run's token rather than the API key.
pub fn openapi_paths() -> Value {
    let mut isolations: Vec<&str> = paddock_core::requires::ISOLATIONS.to_vec();
    isolations.push("vm");
    let requires = json!({"type": "object", "additionalProperties": false,
        "description": "what the sandbox must give; a runtime that cannot is a 400 UNSUPPORTED at submission (GET /v1/capabilities: isolation, devices, nested_containers)",
        "properties": {
            "isolation": {"type": "string", "enum": isolations, "description": "the boundary; vm: kata or firecracker"},
            "devices": {"type": "array", "items": {"type": "string", "pattern": "^/dev/"}, "description": "host devices, e.g. /dev/kvm"},
            "nestedContainers": {"type": "boolean", "description": "the work runs containers of its own"}}});
    let error = json!({"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let run = json!({"type": "object", "required": ["id", "tier", "state", "attempt", "epoch"], "properties": {
        "id": {"type": "string"}, "tier": {"type": "string"},
        "state": {"type": "string", "enum": RunState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>()},
        "thread": {"type": ["string", "null"]}, "evaluation": {"type": ["string", "null"]}, "image": {"type": ["string", "null"]},
        "command": {"type": "array", "items": {"type": "string"}}, "timeout": {"type": "integer"},
        "attempt": {"type": "integer"}, "maxAttempts": {"type": "integer"}, "epoch": {"type": "integer"},
        "exitCode": {"type": ["integer", "null"]}, "reason": {"type": ["string", "null"]},
        "sandboxId": {"type": ["string", "null"]}, "hasInputs": {"type": "boolean"}, "hasResult": {"type": "boolean"},
        "leaseExpiresAt": {"type": ["string", "null"]}, "createdAt": {"type": "string"}, "updatedAt": {"type": "string"},
        "startedAt": {"type": ["string", "null"]}, "firstCallAt": {"type": ["string", "null"]},
        "finishedAt": {"type": ["string", "null"]}, "requires": {"anyOf": [requires.clone(), {"type": "null"}]}}});
    let ok =
        |what: &str, schema: Value| json!({"description": what, "content": {"application/json": {"schema": schema}}});
    let id = json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string"}});
    let tar = json!({"description": "a tar archive", "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}});
    let submit = json!({"type": "object", "required": ["command"], "additionalProperties": false, "properties": {
        "tier": {"type": "string", "description": "a tier of `paddock serve --tier` (default: the lowest)"},
        "image": {"type": "string"}, "thread": {"type": "string", "description": "its persistent workspace; a thread's runs take turns"},
        "command": {"type": "array", "minItems": 1, "items": {"type": "string"}, "description": "the driver, run with $PADDOCK_GATEWAY and $PADDOCK_TOKEN"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "resources": {"type": "object", "additionalProperties": {"type": "string"}, "description": "cpu, memory, pids, ephemeral-storage, workspace, workspace-inodes"},
        "timeout": {"type": "integer", "minimum": 1, "maximum": MAX_RUN_TIMEOUT, "default": DEFAULT_RUN_TIMEOUT},
        "maxAttempts": {"type": "integer", "minimum": 1, "maximum": MAX_MAX_ATTEMPTS, "default": DEFAULT_MAX_ATTEMPTS},
        "inputs": {"type": "string", "description": "a tar, base64"},
        "ifBusy": {"type": "string", "enum": ["queue", "reject"], "default": "queue"},
        "networkPolicy": {"$ref": "#/components/schemas/NetworkPolicy"}, "requires": requires.clone()}});
    let gateway_server = json!([{"url": "{gateway}/v1", "description": "the gateway, from inside a run's sandbox",
        "variables": {"gateway": {"default": "http://127.0.0.1:8081", "description": "$PADDOCK_GATEWAY"}}}]);
    let bearer = json!([{"runToken": []}]);
    let task = json!({"type": "object", "required": ["command"], "additionalProperties": false, "properties": {
        "name": {"type": "string"}, "image": {"type": "string"}, "command": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "env": {"type": "object", "additionalProperties": {"type": "string"}}, "resources": {"type": "object", "additionalProperties": {"type": "string"}},
        "timeout": {"type": "integer", "minimum": 1, "maximum": MAX_RUN_TIMEOUT}, "inputs": {"type": "string"},
        "networkPolicy": {"$ref": "#/components/schemas/NetworkPolicy"}, "requires": requires}});
    let evaluation = json!({"type": "object", "required": ["tasks"], "additionalProperties": false, "properties": {
        "name": {"type": "string"}, "tier": {"type": "string"}, "maxAttempts": {"type": "integer", "minimum": 1, "maximum": MAX_MAX_ATTEMPTS},
        "tasks": {"type": "array", "minItems": 1, "maxItems": MAX_TASKS, "items": task}}});
    let gw = |summary: &str, responses: Value| json!({"tags": ["gateway"], "summary": summary, "servers": gateway_server.clone(), "security": bearer.clone(), "responses": responses});
    let stale = json!({"description": "STALE_ATTEMPT: this attempt's epoch is not current, its lease ran out, or its run ended", "content": error["content"].clone()});
    json!({
        "/runs": {
            "post": {"tags": ["runs"], "summary": "Queue a run (Idempotency-Key: the same key gives the same run)",
                "parameters": [{"name": "Idempotency-Key", "in": "header", "required": false, "schema": {"type": "string", "maxLength": 255}}],
                "requestBody": {"required": true, "content": {"application/json": {"schema": submit}}},
                "responses": {"201": ok("queued", run.clone()), "200": ok("the run this Idempotency-Key made", run.clone()),
                    "400": error.clone(), "401": error.clone(), "409": error.clone(),
                    "429": {"description": "QUOTA_EXCEEDED: the tenant's unfinished runs of this tier are at its quota", "content": error["content"].clone()}}},
            "get": {"tags": ["runs"], "summary": "List runs, oldest first",
                "parameters": [
                    {"name": "tier", "in": "query", "schema": {"type": "string"}},
                    {"name": "state", "in": "query", "schema": {"type": "string"}},
                    {"name": "thread", "in": "query", "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                    {"name": "after", "in": "query", "schema": {"type": "string"}, "description": "the previous page's `next`"}],
                "responses": {"200": ok("a page", json!({"type": "object", "properties": {
                    "items": {"type": "array", "items": run.clone()}, "next": {"type": ["string", "null"]}}})),
                    "400": error.clone(), "401": error.clone()}}},
        "/runs/{id}": {"get": {"tags": ["runs"], "summary": "Read a run", "parameters": [id.clone()],
            "responses": {"200": ok("the run", run.clone()), "404": error.clone(), "401": error.clone()}}},
        "/runs/{id}/cancel": {"post": {"tags": ["runs"], "summary": "Cancel a run", "parameters": [id.clone()],
            "responses": {"200": ok("the run, cancelled unless it had ended", run.clone()), "404": error.clone(), "401": error.clone()}}},
        "/runs/{id}/events": {"get": {"tags": ["runs"], "summary": "Follow a run's events (Server-Sent Events; resume with Last-Event-ID)",
            "parameters": [id.clone(), {"name": "after", "in": "query", "schema": {"type": "integer"}},
                {"name": "Last-Event-ID", "in": "header", "required": false, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "events `state`, `attempt`, `driver`, `result`", "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                "404": error.clone(), "401": error.clone()}}},
        "/runs/{id}/result": {"get": {"tags": ["runs"], "summary": "The result tar its driver uploaded", "parameters": [id.clone()],
            "responses": {"200": tar.clone(), "404": error.clone(), "401": error.clone()}}},
        "/runs/{id}/output": {"get": {"tags": ["runs"], "summary": "The driver's output (its first MiB)", "parameters": [id.clone()],
            "responses": {"200": {"description": "stdout and stderr as they came", "content": {"text/plain": {"schema": {"type": "string"}}}},
                "404": error.clone(), "401": error.clone()}}},
        "/runs/{id}/inputs": {"put": {"tags": ["runs"], "summary": "Give a queued run its inputs (a tar)", "parameters": [id.clone()],
            "requestBody": {"required": true, "description": "a tar archive (any Content-Type)",
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
            "responses": {"204": {"description": "kept"}, "400": error.clone(), "404": error.clone(), "409": error.clone(), "401": error.clone()}}},
        "/evaluations": {"post": {"tags": ["runs"], "summary": "Queue a batch of runs over a task list; a task the runtime cannot run is a 400 naming it, and nothing is queued",
            "requestBody": {"required": true, "content": {"application/json": {"schema": evaluation}}},
            "responses": {"201": ok("the evaluation: its runs and how many are in each state", json!({"type": "object"})), "400": error.clone(), "401": error.clone()}}},
        "/evaluations/{id}": {"get": {"tags": ["runs"], "summary": "An evaluation's runs and how many are in each state", "parameters": [id.clone()],
            "responses": {"200": ok("the evaluation", json!({"type": "object"})), "404": error.clone(), "401": error.clone()}}},
        "/tiers": {"get": {"tags": ["runs"], "summary": "The tiers, the capacity over them, and what each holds",
            "responses": {"200": ok("tiers", json!({"type": "object"})), "401": error.clone()}}},
        "/heartbeat": {"post": gw("Renew the attempt's lease (its first call marks the run running)", json!({
            "200": ok("the lease", json!({"type": "object", "properties": {"leaseExpiresAt": {"type": "string"}, "epoch": {"type": "integer"}, "runId": {"type": "string"}}})),
            "401": error.clone(), "403": error.clone(), "409": stale.clone()}))},
        "/inputs": {"get": gw("The run's inputs (a tar)", json!({"200": tar.clone(), "401": error.clone(), "403": error.clone(), "404": error.clone(), "409": stale.clone()}))},
        "/result": {"put": gw("Upload the result (a tar; Content-Digest: sha-256=:…: is checked when sent; safe paths only)", json!({
            "201": ok("kept", json!({"type": "object", "properties": {"entries": {"type": "integer"}}})),
            "400": error.clone(), "401": error.clone(), "403": error.clone(), "409": stale.clone(), "413": error.clone()}))},
        "/events": {"post": gw("Append an event of the driver: {type, data}", json!({
            "201": ok("recorded", json!({"type": "object", "properties": {"seq": {"type": "integer"}}})),
            "400": error.clone(), "401": error.clone(), "403": error.clone(), "409": stale.clone()}))},
        "/run": {"get": gw("The calling attempt's run", json!({"200": ok("the run", run), "401": error.clone(), "409": stale}))},
    })
}
