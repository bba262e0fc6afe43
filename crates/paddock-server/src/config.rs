//! Server settings, checked before the server starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How the server is configured; built by the CLI.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// `None` only when serving without auth was asked for explicitly (loopback only).
    pub api_key: Option<String>,
    /// Where the key can be found, for the 401 message (e.g. "the file /var/lib/paddock/api-key").
    pub api_key_location: String,
    /// Session length when a create request gives no timeout; `None` follows OpenSandbox's
    /// schema, where an omitted timeout means no expiry (the idle reaper then bounds it).
    pub default_timeout: Option<Duration>,
    /// How long a sandbox may go unused before it is given back: a thread's is released (its
    /// workspace kept), one without expiry deleted. `None`: never.
    pub idle_timeout: Option<Duration>,
    /// Longest session a create request may ask for.
    pub max_timeout: Duration,
    /// Whether a create may ask for no expiry at all (`timeout: null`).
    pub allow_no_expiry: bool,
    /// Largest upload accepted by the execd file API, bytes.
    pub max_upload_bytes: u64,
    /// How long runtime calls may take before the request fails with `TIMEOUT`.
    pub deadlines: crate::deadline::Deadlines,
    /// How long a connection may take to send a request's headers, counted from when the server
    /// starts waiting for them: it bounds slow senders and idle keep-alive connections alike.
    /// A request body that stops arriving, or a response the client stops reading, for this
    /// long ends the connection too.
    pub header_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// Connections one peer address may hold (`conns`).
    pub max_connections_per_peer: usize,
    /// Request data held in memory at once, bytes: JSON bodies and files edited in place
    /// (`budget.rs`). At least [`MIN_REQUEST_MEMORY`].
    pub max_request_memory: u64,
    /// Size and inode caps of `/workspace` for creates that give none (`resourceLimits`).
    /// `None`: the runtime's default (`Capabilities::default_workspace_bytes`), which
    /// `build_state` puts here.
    pub workspace_bytes: Option<u64>,
    pub workspace_inodes: u64,
    /// Routes `<sandbox-id>-<port>.<domain>` by Host (`--sandbox-domain`); signed endpoints
    /// are then given in that form.
    pub sandbox_domain: Option<String>,
    /// The egress of sandboxes whose create gives no `networkPolicy`.
    pub default_network: paddock_core::spec::NetworkPolicy,
    /// Tiers, capacity and the gateway of runs (`runs`).
    pub runs: crate::runs::RunOptions,
    /// The model route every sandbox gets (`llm`), when `--llm-base` is given.
    pub llm: Option<crate::llm::LlmConfig>,
    /// Caps and the idle time of WebSockets through the port proxy (`tunnels`).
    pub tunnels: crate::tunnels::TunnelLimits,
    /// Tenants besides the database's (`--tenants FILE`, see `tenants`).
    pub tenants_file: Option<PathBuf>,
}

/// The least `max_request_memory`: one `files/replace` of the largest file it edits (64 MiB,
/// held before and after) and its request body must fit, with room to spare.
pub const MIN_REQUEST_MEMORY: u64 = 160 << 20;
/// The default: a few large edits, or a hundred full JSON bodies, at once.
pub const DEFAULT_REQUEST_MEMORY: u64 = 512 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "--max-request-memory must be at least 160MiB (one in-place edit of a 64 MiB file holds twice that, with its request)"
    )]
    RequestMemory,
    #[error(
        "the default session timeout ({default}s) must be at least 60s and at most the maximum ({max}s): adjust --default-timeout or --max-timeout"
    )]
    Timeouts { default: u64, max: u64 },
    #[error(
        "serving without an API key is only allowed on a loopback address, not {0}: set --api-key or listen on 127.0.0.1"
    )]
    NoAuthOffLoopback(SocketAddr),
    #[error("--header-timeout and --max-connections must be more than zero")]
    ConnectionLimits,
    #[error("the default workspace caps cannot be used: {0}; adjust --workspace-size or --workspace-inodes")]
    Workspace(String),
    #[error("runs: {0}; adjust --tier or --capacity")]
    Runs(String),
}

impl ServerConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let max = self.max_timeout.as_secs();
        if let Some(default) = self.default_timeout.map(|d| d.as_secs())
            && (default < 60 || default > max)
        {
            return Err(ConfigError::Timeouts { default, max });
        }
        if self.header_timeout.is_zero() || self.max_connections == 0 {
            return Err(ConfigError::ConnectionLimits);
        }
        if self.max_request_memory < MIN_REQUEST_MEMORY {
            return Err(ConfigError::RequestMemory);
        }
        let mut spec = paddock_core::spec::SandboxSpec::default();
        spec.resources.workspace_bytes = self.workspace_bytes;
        spec.resources.workspace_inodes = self.workspace_inodes;
        spec.validate().map_err(|e| ConfigError::Workspace(e.to_string()))?;
        self.runs.tiers.validate().map_err(|e| ConfigError::Runs(e.0))?;
        if self.api_key.is_none() && !self.listen.ip().is_loopback() {
            return Err(ConfigError::NoAuthOffLoopback(self.listen));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ServerConfig {
        ServerConfig {
            listen: "127.0.0.1:8080".parse().unwrap(),
            data_dir: "/tmp/x".into(),
            api_key: Some("k".into()),
            api_key_location: "the file /tmp/x/api-key".into(),
            default_timeout: Some(Duration::from_secs(3600)),
            idle_timeout: None,
            max_timeout: Duration::from_secs(28800),
            allow_no_expiry: true,
            max_upload_bytes: 1 << 30,
            deadlines: Default::default(),
            header_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_connections_per_peer: 512,
            max_request_memory: DEFAULT_REQUEST_MEMORY,
            workspace_bytes: Some(paddock_core::spec::DEFAULT_WORKSPACE),
            workspace_inodes: paddock_core::spec::DEFAULT_WORKSPACE_INODES,
            default_network: Default::default(),
            sandbox_domain: None,
            runs: crate::runs::RunOptions::for_tests(),
            llm: None,
            tunnels: Default::default(),
            tenants_file: None,
        }
    }

    #[test]
    fn timeouts_are_checked_and_named() {
        config().validate().unwrap();
        let mut c = config();
        c.default_timeout = Some(Duration::from_secs(30));
        let e = c.validate().unwrap_err();
        assert_eq!(e, ConfigError::Timeouts { default: 30, max: 28800 });
        assert!(e.to_string().contains("(30s)") && e.to_string().contains("(28800s)"));
        let mut c = config();
        c.default_timeout = Some(Duration::from_secs(30000));
        assert!(c.validate().is_err());
    }

    #[test]
    fn no_auth_only_on_loopback() {
        let mut c = config();
        c.api_key = None;
        c.validate().unwrap();
        c.listen = "0.0.0.0:8080".parse().unwrap();
        assert!(matches!(c.validate(), Err(ConfigError::NoAuthOffLoopback(_))));
    }

    #[test]
    fn connection_limits_are_positive() {
        let mut c = config();
        c.header_timeout = Duration::ZERO;
        assert_eq!(c.validate(), Err(ConfigError::ConnectionLimits));
        let mut c = config();
        c.max_connections = 0;
        assert_eq!(c.validate(), Err(ConfigError::ConnectionLimits));
    }

    #[test]
    fn default_workspace_caps_are_checked_and_name_the_flags() {
        let mut c = config();
        c.workspace_bytes = Some(1024);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("workspace-size") && e.contains("--workspace-size"), "{e}");
        let mut c = config();
        c.workspace_inodes = 0;
        assert!(matches!(c.validate(), Err(ConfigError::Workspace(_))));
    }
}
