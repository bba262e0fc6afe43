//! Runs and their events in SQLite. Every change to an attempt is one conditional statement
//! naming the epoch it is for, so a stale attempt (an older epoch, a server that lost it)
//! changes nothing: fencing is in the database, not in memory.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::sqlite::{SqlitePool, SqliteRow};

use crate::store::now_ms;

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Queued,
    Starting,
    Running,
    /// Between attempts: the last one was lost or asked to run again, and the run waits for
    /// its backoff before it is queued with the others.
    Requeued,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunState {
    pub const ALL: [RunState; 7] =
        [Self::Queued, Self::Starting, Self::Running, Self::Requeued, Self::Succeeded, Self::Failed, Self::Cancelled];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Requeued => "requeued",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// What a run was submitted with (its inputs are a file of their own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    pub image: Option<String>,
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub resources: BTreeMap<String, String>,
    /// Seconds each attempt may run.
    pub timeout: u64,
    /// What the sandbox may reach besides the gateway (nothing when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<paddock_core::egress::EgressPolicy>,
    /// What its sandbox must give (checked at submission).
    #[serde(default, skip_serializing_if = "paddock_core::requires::Requirements::is_empty")]
    pub requires: paddock_core::requires::Requirements,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRow {
    pub seq: i64,
    pub id: String,
    pub tier: String,
    pub state: RunState,
    pub thread: Option<String>,
    pub evaluation: Option<String>,
    pub spec: RunSpec,
    pub idempotency_key: Option<String>,
    pub attempt: i64,
    pub max_attempts: i64,
    pub epoch: i64,
    pub sandbox_id: Option<String>,
    pub boot: Option<String>,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
    pub has_inputs: bool,
    pub has_result: bool,
    pub lease_expires_ms: Option<i64>,
    pub not_before_ms: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub first_call_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    /// Who submitted it (`tenants`). Its thread and idempotency key are stored scoped to it.
    pub tenant: String,
}

fn from_row(r: &SqliteRow) -> Result<RunRow, sqlx::Error> {
    let state: String = r.try_get("state")?;
    let spec: String = r.try_get("request")?;
    Ok(RunRow {
        seq: r.try_get("seq")?,
        id: r.try_get("id")?,
        tier: r.try_get("tier")?,
        state: RunState::parse(&state)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown run state {state:?}").into()))?,
        thread: r.try_get("thread")?,
        evaluation: r.try_get("evaluation")?,
        spec: serde_json::from_str(&spec).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        idempotency_key: r.try_get("idempotency_key")?,
        attempt: r.try_get("attempt")?,
        max_attempts: r.try_get("max_attempts")?,
        epoch: r.try_get("epoch")?,
        sandbox_id: r.try_get("sandbox_id")?,
        boot: r.try_get("boot")?,
        exit_code: r.try_get("exit_code")?,
        reason: r.try_get("reason")?,
        has_inputs: r.try_get::<i64, _>("has_inputs")? != 0,
        has_result: r.try_get::<i64, _>("has_result")? != 0,
        lease_expires_ms: r.try_get("lease_expires_ms")?,
        not_before_ms: r.try_get("not_before_ms")?,
        created_at_ms: r.try_get("created_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
        started_at_ms: r.try_get("started_at_ms")?,
        first_call_at_ms: r.try_get("first_call_at_ms")?,
        finished_at_ms: r.try_get("finished_at_ms")?,
        tenant: r.try_get("tenant")?,
    })
}

/// One event of a run, as the events stream gives it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunEvent {
    pub seq: i64,
    #[serde(rename = "type")]
    pub kind: String,
    pub data: serde_json::Value,
    #[serde(rename = "atMs")]
    pub at_ms: i64,
}

/// What a listing asks for.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub tier: Option<String>,
    pub state: Option<RunState>,
    pub thread: Option<String>,
    pub tenant: String,
}

const ACTIVE: [RunState; 2] = [RunState::Starting, RunState::Running];
/// The most events a run keeps: a driver that sends more is refused, so no sandbox can fill the
/// server's disk through its events.
pub const MAX_EVENTS: i64 = 10_000;

#[derive(Debug, Clone)]
pub struct RunStore {
    pool: SqlitePool,
}

/// The outcome of an insert with an idempotency key.
pub enum Inserted {
    New(RunRow),
    Existing(RunRow),
}

impl RunStore {
    pub fn new(pool: SqlitePool) -> Self {
        Self { pool }
    }

    /// Inserts a new run with its first state event in one transaction: the scheduler may
    /// admit it the moment the row exists, and its `starting` must follow `queued`.
    pub async fn insert(&self, r: &RunRow) -> Result<Inserted, sqlx::Error> {
        let spec = serde_json::to_string(&r.spec).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "INSERT INTO runs (id, tier, state, thread, evaluation, request, idempotency_key, max_attempts, has_inputs, created_at_ms, updated_at_ms, tenant)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(&r.id)
        .bind(&r.tier)
        .bind(r.state.as_str())
        .bind(&r.thread)
        .bind(&r.evaluation)
        .bind(spec)
        .bind(&r.idempotency_key)
        .bind(r.max_attempts)
        .bind(i64::from(r.has_inputs))
        .bind(r.created_at_ms)
        .bind(r.updated_at_ms)
        .bind(&r.tenant)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0
            && let Some(key) = &r.idempotency_key
        {
            let row = sqlx::query("SELECT * FROM runs WHERE idempotency_key = ?").bind(key).fetch_one(&mut *tx).await?;
            tx.commit().await?;
            return Ok(Inserted::Existing(from_row(&row)?));
        }
        let first = serde_json::json!({
            "state": r.state.as_str(), "attempt": 0, "epoch": 0, "exitCode": null, "reason": null, "sandboxId": null,
        });
        sqlx::query("INSERT INTO run_events (run_id, seq, type, data, at_ms) VALUES (?, 1, 'state', ?, ?)")
            .bind(&r.id)
            .bind(first.to_string())
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query("SELECT * FROM runs WHERE id = ?").bind(&r.id).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(Inserted::New(from_row(&row)?))
    }

    /// Runs an update of a run's current attempt, whose last two parameters are the states of
    /// an attempt under way; whether it changed the run.
    async fn on_current<'q>(
        &self,
        q: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<bool, sqlx::Error> {
        let done = q.bind(ACTIVE[0].as_str()).bind(ACTIVE[1].as_str()).execute(&self.pool).await?;
        Ok(done.rows_affected() == 1)
    }

    /// The runs of a tenant's evaluation, in task order.
    pub async fn of_evaluation(&self, evaluation: &str, tenant: &str) -> Result<Vec<RunRow>, sqlx::Error> {
        let rows = sqlx::query("SELECT * FROM runs WHERE evaluation = ? AND tenant = ? ORDER BY seq")
            .bind(evaluation)
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(from_row).collect()
    }

    pub async fn existing_by_key(&self, key: &str) -> Result<Option<RunRow>, sqlx::Error> {
        let row =
            sqlx::query("SELECT * FROM runs WHERE idempotency_key = ?").bind(key).fetch_optional(&self.pool).await?;
        row.as_ref().map(from_row).transpose()
    }

    pub async fn get(&self, id: &str) -> Result<Option<RunRow>, sqlx::Error> {
        let row = sqlx::query("SELECT * FROM runs WHERE id = ?").bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Runs matching `filter`, oldest first, after submission number `after` (a page's cursor).
    pub async fn list(&self, filter: &Filter, after: i64, limit: i64) -> Result<Vec<RunRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT * FROM runs WHERE seq > ?1 AND (?2 IS NULL OR tier = ?2) AND (?3 IS NULL OR state = ?3)
             AND (?4 IS NULL OR thread = ?4) AND tenant = ?6 ORDER BY seq LIMIT ?5",
        )
        .bind(after)
        .bind(&filter.tier)
        .bind(filter.state.map(RunState::as_str))
        .bind(&filter.thread)
        .bind(limit)
        .bind(&filter.tenant)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(from_row).collect()
    }

    /// Runs waiting for a sandbox (queued, or requeued with their backoff over), in
    /// submission order.
    pub async fn waiting(&self, now: i64) -> Result<Vec<RunRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT * FROM runs WHERE state = ?1 OR (state = ?2 AND COALESCE(not_before_ms, 0) <= ?3) ORDER BY seq",
        )
        .bind(RunState::Queued.as_str())
        .bind(RunState::Requeued.as_str())
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(from_row).collect()
    }

    /// When the next requeued run's backoff ends, if one waits.
    pub async fn next_backoff_end(&self) -> Result<Option<i64>, sqlx::Error> {
        // Only backoffs still running: one that ended is a waiting run like any other, admitted
        // when something changes, not a reason to wake at once again and again.
        sqlx::query_scalar("SELECT MIN(not_before_ms) FROM runs WHERE state = ? AND not_before_ms > ?")
            .bind(RunState::Requeued.as_str())
            .bind(now_ms())
            .fetch_one(&self.pool)
            .await
    }

    /// Runs with an attempt under way (starting or running), by any server.
    pub async fn active(&self) -> Result<Vec<RunRow>, sqlx::Error> {
        let rows = sqlx::query("SELECT * FROM runs WHERE state IN (?, ?) ORDER BY seq")
            .bind(ACTIVE[0].as_str())
            .bind(ACTIVE[1].as_str())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(from_row).collect()
    }

    /// A tenant's runs of a tier that have not finished (its runs quota counts them).
    pub async fn unfinished_of(&self, tenant: &str, tier: &str) -> Result<u64, sqlx::Error> {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE tenant = ? AND tier = ? AND state NOT IN (?, ?, ?)")
                .bind(tenant)
                .bind(tier)
                .bind(RunState::Succeeded.as_str())
                .bind(RunState::Failed.as_str())
                .bind(RunState::Cancelled.as_str())
                .fetch_one(&self.pool)
                .await?;
        Ok(n.max(0).cast_unsigned())
    }

    /// Whether a run of `thread` other than `except` is not yet finished.
    pub async fn thread_busy(&self, thread: &str, except: &str) -> Result<bool, sqlx::Error> {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE thread = ? AND id != ? AND state NOT IN (?, ?, ?)")
                .bind(thread)
                .bind(except)
                .bind(RunState::Succeeded.as_str())
                .bind(RunState::Failed.as_str())
                .bind(RunState::Cancelled.as_str())
                .fetch_one(&self.pool)
                .await?;
        Ok(n > 0)
    }

    /// Starts the next attempt of a waiting run: a new epoch, owned by `boot`. `None` when the
    /// run is no longer waiting (cancelled, or taken by another server).
    pub async fn begin_attempt(&self, id: &str, epoch: i64, boot: &str) -> Result<Option<i64>, sqlx::Error> {
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE runs SET state = ?, attempt = attempt + 1, epoch = epoch + 1, boot = ?, sandbox_id = NULL,
             started_at_ms = ?, first_call_at_ms = NULL, lease_expires_ms = NULL, exit_code = NULL, has_result = 0,
             not_before_ms = NULL, updated_at_ms = ? WHERE id = ? AND epoch = ? AND state IN (?, ?)",
        )
        .bind(RunState::Starting.as_str())
        .bind(boot)
        .bind(now)
        .bind(now)
        .bind(id)
        .bind(epoch)
        .bind(RunState::Queued.as_str())
        .bind(RunState::Requeued.as_str())
        .execute(&self.pool)
        .await?;
        Ok((done.rows_affected() == 1).then_some(epoch + 1))
    }

    /// Records the sandbox of the current attempt.
    pub async fn set_sandbox(&self, id: &str, epoch: i64, sandbox: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE runs SET sandbox_id = ?, updated_at_ms = ? WHERE id = ? AND epoch = ? AND state IN (?, ?)",
        )
        .bind(sandbox)
        .bind(now_ms())
        .bind(id)
        .bind(epoch);
        self.on_current(done).await
    }

    /// A gateway call of the current attempt: the run is running, and its lease is renewed to
    /// `lease_until` when one is given. `false` when the attempt is not current (or its lease
    /// ran out): the caller answers STALE_ATTEMPT.
    pub async fn touch(
        &self,
        id: &str,
        epoch: i64,
        sandbox: &str,
        lease_until: Option<i64>,
    ) -> Result<bool, sqlx::Error> {
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE runs SET state = ?, first_call_at_ms = COALESCE(first_call_at_ms, ?),
             lease_expires_ms = COALESCE(?, lease_expires_ms), updated_at_ms = ?
             WHERE id = ? AND epoch = ? AND sandbox_id = ?
             AND (lease_expires_ms IS NULL OR lease_expires_ms >= ?) AND state IN (?, ?)",
        )
        .bind(RunState::Running.as_str())
        .bind(now)
        .bind(lease_until)
        .bind(now)
        .bind(id)
        .bind(epoch)
        .bind(sandbox)
        .bind(now);
        self.on_current(done).await
    }

    /// Whether `epoch` is the current attempt of run `id`, in `sandbox`, not ended and with its
    /// lease (if it has one yet) unexpired: what a run token is worth outside the gateway's
    /// own writes (the model route).
    pub async fn is_current(&self, id: &str, epoch: i64, sandbox: &str) -> Result<bool, sqlx::Error> {
        let row = sqlx::query(
            "SELECT 1 FROM runs WHERE id = ? AND epoch = ? AND sandbox_id = ?
             AND (lease_expires_ms IS NULL OR lease_expires_ms >= ?) AND state IN (?, ?)",
        )
        .bind(id)
        .bind(epoch)
        .bind(sandbox)
        .bind(now_ms())
        .bind(RunState::Starting.as_str())
        .bind(RunState::Running.as_str())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }

    /// Ends the current attempt, and the run with it, as `state`.
    pub async fn finish(
        &self,
        id: &str,
        epoch: i64,
        state: RunState,
        exit_code: Option<i64>,
        reason: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE runs SET state = ?, exit_code = ?, reason = ?, finished_at_ms = ?, updated_at_ms = ?
             WHERE id = ? AND epoch = ? AND state IN (?, ?)",
        )
        .bind(state.as_str())
        .bind(exit_code)
        .bind(reason)
        .bind(now)
        .bind(now)
        .bind(id)
        .bind(epoch);
        self.on_current(done).await
    }

    /// Ends the current attempt without ending the run: it waits until `not_before` and is
    /// then admitted again, with a new epoch.
    /// An attempt stopped through no fault of its own (preempted, its server drained) is
    /// `charged: false`: it gets a new epoch but does not count against `maxAttempts`.
    pub async fn requeue(
        &self,
        id: &str,
        epoch: i64,
        exit_code: Option<i64>,
        reason: &str,
        not_before: i64,
        charged: bool,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE runs SET state = ?, attempt = attempt - ?, exit_code = ?, reason = ?, not_before_ms = ?,
             lease_expires_ms = NULL, updated_at_ms = ? WHERE id = ? AND epoch = ? AND state IN (?, ?)",
        )
        .bind(RunState::Requeued.as_str())
        .bind(i64::from(!charged))
        .bind(exit_code)
        .bind(reason)
        .bind(not_before)
        .bind(now_ms())
        .bind(id)
        .bind(epoch);
        self.on_current(done).await
    }

    /// Cancels a run that has not ended. `false` when it had.
    pub async fn cancel(&self, id: &str) -> Result<bool, sqlx::Error> {
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE runs SET state = ?, reason = 'cancelled', finished_at_ms = ?, updated_at_ms = ?
             WHERE id = ? AND state NOT IN (?, ?, ?)",
        )
        .bind(RunState::Cancelled.as_str())
        .bind(now)
        .bind(now)
        .bind(id)
        .bind(RunState::Succeeded.as_str())
        .bind(RunState::Failed.as_str())
        .bind(RunState::Cancelled.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    pub async fn set_inputs(&self, id: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query("UPDATE runs SET has_inputs = 1, updated_at_ms = ? WHERE id = ? AND state = ?")
            .bind(now_ms())
            .bind(id)
            .bind(RunState::Queued.as_str())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Marks the result of the current attempt as kept; `false` (and nothing marked) when the
    /// attempt is no longer current.
    pub async fn set_result(&self, id: &str, epoch: i64, sandbox: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE runs SET has_result = 1, updated_at_ms = ? WHERE id = ? AND epoch = ? AND sandbox_id = ?
             AND (lease_expires_ms IS NULL OR lease_expires_ms >= ?) AND state IN (?, ?)",
        )
        .bind(now_ms())
        .bind(id)
        .bind(epoch)
        .bind(sandbox)
        .bind(now_ms());
        self.on_current(done).await
    }

    /// Appends an event; answers its number.
    pub async fn event(&self, run: &str, kind: &str, data: &serde_json::Value) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "INSERT INTO run_events (run_id, seq, type, data, at_ms)
             VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_events WHERE run_id = ?1), ?2, ?3, ?4) RETURNING seq",
        )
        .bind(run)
        .bind(kind)
        .bind(data.to_string())
        .bind(now_ms())
        .fetch_one(&self.pool)
        .await
    }

    /// Appends an event of the driver, only while its attempt is current. `None` when not.
    pub async fn driver_event(
        &self,
        run: &str,
        epoch: i64,
        sandbox: &str,
        data: &serde_json::Value,
    ) -> Result<Option<i64>, sqlx::Error> {
        let now = now_ms();
        sqlx::query_scalar(
            "INSERT INTO run_events (run_id, seq, type, data, at_ms)
             SELECT ?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_events WHERE run_id = ?1), 'driver', ?2, ?3
             WHERE EXISTS (SELECT 1 FROM runs WHERE id = ?1 AND epoch = ?4 AND sandbox_id = ?5 AND state IN (?6, ?7)
                           AND (lease_expires_ms IS NULL OR lease_expires_ms >= ?3))
             AND (SELECT COUNT(*) FROM run_events WHERE run_id = ?1) < ?8
             RETURNING seq",
        )
        .bind(run)
        .bind(data.to_string())
        .bind(now)
        .bind(epoch)
        .bind(sandbox)
        .bind(ACTIVE[0].as_str())
        .bind(ACTIVE[1].as_str())
        .bind(MAX_EVENTS)
        .fetch_optional(&self.pool)
        .await
    }

    pub async fn events_after(&self, run: &str, after: i64, limit: i64) -> Result<Vec<RunEvent>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT seq, type, data, at_ms FROM run_events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        )
        .bind(run)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let data: String = r.try_get("data")?;
                Ok(RunEvent {
                    seq: r.try_get("seq")?,
                    kind: r.try_get("type")?,
                    data: serde_json::from_str(&data).unwrap_or(serde_json::Value::Null),
                    at_ms: r.try_get("at_ms")?,
                })
            })
            .collect()
    }
}
