//! The server's state in SQLite: one file in the data directory, created on first start, with
//! migrations applied at open. The runtime owns the processes; this owns what the API adds
//! (metadata, image, entrypoint, lifecycle state). No secret is stored here: sandbox tokens are
//! derived (`secrets`), and the file is 0600.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRow {
    pub id: String,
    pub state: LifecycleState,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub image: String,
    pub entrypoint: Vec<String>,
    pub metadata: BTreeMap<String, String>,
    pub extensions: BTreeMap<String, String>,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub updated_at_ms: i64,
    /// Who made it (`tenants`): the default tenant for the server's own key and the CLI's.
    pub tenant: String,
    /// Its memory limit, bytes (0: none), counted against its tenant's memory quota.
    pub memory_bytes: i64,
}

/// A sandbox's state in the lifecycle API (OpenSandbox's names), as the store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LifecycleState {
    Running,
    Paused,
    /// Its runtime reports it failed (or its entrypoint exited): it may still be deleted.
    Failed,
    /// Gone from its runtime: deleted, expired or lost. Final.
    Terminated,
}

impl LifecycleState {
    pub const ALL: [Self; 4] = [Self::Running, Self::Paused, Self::Failed, Self::Terminated];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "Running",
            Self::Paused => "Paused",
            Self::Failed => "Failed",
            Self::Terminated => "Terminated",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }

    /// What a runtime's own state is here.
    pub fn of(state: paddock_core::runtime::SandboxState) -> Self {
        match state {
            paddock_core::runtime::SandboxState::Running => Self::Running,
            paddock_core::runtime::SandboxState::Paused => Self::Paused,
            paddock_core::runtime::SandboxState::Failed => Self::Failed,
        }
    }

    /// The reason the API gives for being in this state by the runtime's word.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Running => "SANDBOX_RUNNING",
            Self::Paused => "SANDBOX_PAUSED",
            Self::Failed => "SANDBOX_FAILED",
            Self::Terminated => "SANDBOX_GONE",
        }
    }
}

impl serde::Serialize for LifecycleState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl std::fmt::Display for LifecycleState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is kept of a sandbox's entrypoint: its newest output and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrypointLog {
    pub command: String,
    pub tail: Vec<u8>,
    /// Older output was dropped (only the newest is kept).
    pub truncated: bool,
    pub exit_code: Option<i32>,
    /// How it ended, in words, when not a plain success.
    pub error: Option<String>,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
}

fn json_col<T: serde::de::DeserializeOwned + Default>(row: &SqliteRow, col: &str) -> T {
    row.try_get::<String, _>(col).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default()
}

fn from_row(row: &SqliteRow) -> Result<SandboxRow, sqlx::Error> {
    Ok(SandboxRow {
        id: row.try_get("id")?,
        state: {
            let s: String = row.try_get("state")?;
            LifecycleState::parse(&s)
                .ok_or_else(|| sqlx::Error::Decode(format!("unknown sandbox state {s:?}").into()))?
        },
        reason: row.try_get("reason")?,
        message: row.try_get("message")?,
        image: row.try_get("image")?,
        entrypoint: json_col(row, "entrypoint"),
        metadata: json_col(row, "metadata"),
        extensions: json_col(row, "extensions"),
        created_at_ms: row.try_get("created_at_ms")?,
        expires_at_ms: row.try_get("expires_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
        tenant: row.try_get("tenant")?,
        memory_bytes: row.try_get("memory_bytes")?,
    })
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(paddock_core::units::millis_i64).unwrap_or(0)
}

impl Store {
    /// Opens (creating if needed) the database file and applies pending migrations.
    pub async fn open(path: &Path) -> Result<Self, sqlx::Error> {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // With a write-ahead log, NORMAL survives any crash of the server process (commits
            // are in the log before they return); only a power loss can drop the newest ones.
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            .busy_timeout(std::time::Duration::from_secs(5));
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await?;
        let had_clear_tokens: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM pragma_table_info('sandboxes') WHERE name = 'token'")
                .fetch_one(&pool)
                .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        if had_clear_tokens > 0 {
            // Dropping the column leaves the old tokens in freed pages (and in the log): rebuild
            // the file and empty the log so no copy of it holds one.
            sqlx::query("VACUUM").execute(&pool).await?;
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(&pool).await?;
        }
        Ok(Self { pool })
    }

    /// The connection pool, for the tables of other parts of the server (runs).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Whether the database answers a trivial query.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map(drop)
    }

    pub async fn insert(&self, r: &SandboxRow) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO sandboxes (id, state, reason, message, image, entrypoint, metadata, extensions, created_at_ms, expires_at_ms, updated_at_ms, tenant, memory_bytes)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&r.id)
        .bind(r.state.as_str())
        .bind(&r.reason)
        .bind(&r.message)
        .bind(&r.image)
        .bind(serde_json::to_string(&r.entrypoint).unwrap_or_default())
        .bind(serde_json::to_string(&r.metadata).unwrap_or_default())
        .bind(serde_json::to_string(&r.extensions).unwrap_or_default())
        .bind(r.created_at_ms)
        .bind(r.expires_at_ms)
        .bind(r.updated_at_ms)
        .bind(&r.tenant)
        .bind(r.memory_bytes)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The tenant of a sandbox the store knows.
    pub async fn tenant_of(&self, id: &str) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar("SELECT tenant FROM sandboxes WHERE id = ?").bind(id).fetch_optional(&self.pool).await
    }

    /// What a tenant's sandboxes hold that its quotas count: how many exist, and their memory.
    pub async fn held_by(&self, tenant: &str) -> Result<(u64, u64), sqlx::Error> {
        let (n, bytes): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), COALESCE(SUM(memory_bytes), 0) FROM sandboxes WHERE tenant = ? AND state != 'Terminated'",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok((n.max(0).cast_unsigned(), bytes.max(0).cast_unsigned()))
    }

    pub async fn get(&self, id: &str) -> Result<Option<SandboxRow>, sqlx::Error> {
        let row = sqlx::query("SELECT * FROM sandboxes WHERE id = ?").bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Every sandbox, oldest first.
    pub async fn list(&self) -> Result<Vec<SandboxRow>, sqlx::Error> {
        let rows = sqlx::query("SELECT * FROM sandboxes ORDER BY created_at_ms, id").fetch_all(&self.pool).await?;
        rows.iter().map(from_row).collect()
    }

    pub async fn set_state(
        &self,
        id: &str,
        state: LifecycleState,
        reason: Option<&str>,
        message: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE sandboxes SET state = ?, reason = ?, message = ?, updated_at_ms = ? WHERE id = ?")
            .bind(state.as_str())
            .bind(reason)
            .bind(message)
            .bind(now_ms())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn set_metadata(&self, id: &str, metadata: &BTreeMap<String, String>) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE sandboxes SET metadata = ?, updated_at_ms = ? WHERE id = ?")
            .bind(serde_json::to_string(metadata).unwrap_or_default())
            .bind(now_ms())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn set_expires(&self, id: &str, expires_at_ms: Option<i64>) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE sandboxes SET expires_at_ms = ?, updated_at_ms = ? WHERE id = ?")
            .bind(expires_at_ms)
            .bind(now_ms())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn delete(&self, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM sandboxes WHERE id = ?").bind(id).execute(&self.pool).await?;
        sqlx::query("DELETE FROM entrypoint_logs WHERE id = ?").bind(id).execute(&self.pool).await?;
        sqlx::query("DELETE FROM route_epochs WHERE id = ?").bind(id).execute(&self.pool).await?;
        Ok(())
    }

    /// The epoch a sandbox's signed routes are signed with (0 until revoked once).
    pub async fn route_epoch(&self, id: &str) -> Result<i64, sqlx::Error> {
        let epoch: Option<i64> = sqlx::query_scalar("SELECT epoch FROM route_epochs WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(epoch.unwrap_or(0))
    }

    /// Revokes every signed route of a sandbox: its epoch moves on; the new one.
    pub async fn bump_route_epoch(&self, id: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "INSERT INTO route_epochs (id, epoch) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET epoch = epoch + 1 RETURNING epoch",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
    }

    /// Stores (replacing) what is kept of a sandbox's entrypoint, while its row exists.
    pub async fn put_entrypoint_log(&self, id: &str, log: &EntrypointLog) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT OR REPLACE INTO entrypoint_logs (id, command, tail, truncated, exit_code, error, started_at_ms, finished_at_ms)
             SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)",
        )
        .bind(id)
        .bind(&log.command)
        .bind(&log.tail)
        .bind(log.truncated)
        .bind(log.exit_code)
        .bind(&log.error)
        .bind(log.started_at_ms)
        .bind(log.finished_at_ms)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn entrypoint_log(&self, id: &str) -> Result<Option<EntrypointLog>, sqlx::Error> {
        let row = sqlx::query("SELECT * FROM entrypoint_logs WHERE id = ?").bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| {
            Ok(EntrypointLog {
                command: r.try_get("command")?,
                tail: r.try_get("tail")?,
                truncated: r.try_get("truncated")?,
                exit_code: r.try_get("exit_code")?,
                error: r.try_get("error")?,
                started_at_ms: r.try_get("started_at_ms")?,
                finished_at_ms: r.try_get("finished_at_ms")?,
            })
        })
        .transpose()
    }
}

#[cfg(test)]
#[expect(clippy::disallowed_methods, reason = "a test's fixtures may block: each test has a runtime of its own")]
mod tests {
    use super::*;

    fn row(id: &str) -> SandboxRow {
        SandboxRow {
            id: id.into(),
            state: LifecycleState::Running,
            reason: None,
            message: None,
            image: "host".into(),
            entrypoint: vec!["tail".into(), "-f".into(), "/dev/null".into()],
            metadata: BTreeMap::from([("team".into(), "a".into())]),
            extensions: BTreeMap::new(),
            created_at_ms: 1,
            expires_at_ms: Some(2),
            updated_at_ms: 1,
            tenant: "default".into(),
            memory_bytes: 0,
        }
    }

    #[tokio::test]
    async fn rows_survive_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(&path).await.unwrap();
        store.insert(&row("sbx-a")).await.unwrap();
        store.set_state("sbx-a", LifecycleState::Paused, Some("PAUSED"), None).await.unwrap();
        store.set_metadata("sbx-a", &BTreeMap::from([("k".into(), "v".into())])).await.unwrap();
        drop(store);
        let store = Store::open(&path).await.unwrap();
        let got = store.get("sbx-a").await.unwrap().unwrap();
        assert_eq!(got.state, LifecycleState::Paused);
        assert_eq!(got.metadata["k"], "v");
        assert_eq!(got.entrypoint, ["tail", "-f", "/dev/null"]);
        let log = EntrypointLog {
            command: "sh -c exit 3".into(),
            tail: b"bye\n".to_vec(),
            truncated: false,
            exit_code: Some(3),
            error: Some("exit status 3".into()),
            started_at_ms: 5,
            finished_at_ms: Some(6),
        };
        store.put_entrypoint_log("sbx-a", &log).await.unwrap();
        store.put_entrypoint_log("sbx-none", &log).await.unwrap();
        assert!(store.entrypoint_log("sbx-none").await.unwrap().is_none(), "only for a sandbox with a row");
        drop(store);
        let store = Store::open(&path).await.unwrap();
        assert_eq!(store.entrypoint_log("sbx-a").await.unwrap(), Some(log));
        store.delete("sbx-a").await.unwrap();
        assert!(store.get("sbx-a").await.unwrap().is_none());
        assert!(store.entrypoint_log("sbx-a").await.unwrap().is_none(), "goes with its sandbox");
        assert!(store.insert(&row("sbx-b")).await.is_ok());
        assert!(store.insert(&row("sbx-b")).await.is_err(), "ids are unique");
    }

    #[tokio::test]
    async fn clear_tokens_of_an_older_database_are_gone_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let secret = "clear-token-0123456789abcdef";
        {
            // The database as the first version left it: only the first migration, a clear token.
            let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
                .unwrap()
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal);
            let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await.unwrap();
            let mut old = sqlx::migrate!("./migrations");
            old.migrations = std::borrow::Cow::Owned(old.migrations[..1].to_vec());
            old.run(&pool).await.unwrap();
            sqlx::query(
                "INSERT INTO sandboxes VALUES ('sbx-old', 'Running', NULL, NULL, 'host', '[]', '{}', '{}', ?, 1, 2, 1)",
            )
            .bind(secret)
            .execute(&pool)
            .await
            .unwrap();
            pool.close().await;
        }
        let contains =
            |p: &Path| std::fs::read(p).is_ok_and(|b| b.windows(secret.len()).any(|w| w == secret.as_bytes()));
        assert!(contains(&path) || contains(&dir.path().join("state.db-wal")), "the old file held the token");
        let store = Store::open(&path).await.unwrap();
        assert_eq!(
            store.get("sbx-old").await.unwrap().unwrap().state,
            LifecycleState::Running,
            "old rows keep working"
        );
        for f in ["state.db", "state.db-wal", "state.db-shm"] {
            assert!(!contains(&dir.path().join(f)), "{f} still holds a clear token");
        }
    }
}
