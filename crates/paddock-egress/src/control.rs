//! How the runtime talks to a running enforcer: one JSON request and one JSON reply per line
//! over a Unix socket only root can reach (it lives in the sandbox's host-side directory).

use std::path::Path;
use std::sync::Arc;

use paddock_core::egress::{EgressPolicy, EgressStatus};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::state::Enforcer;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    Set {
        policy: EgressPolicy,
    },
    /// Replaces the credential vault (`None` empties it); answered once it is in force.
    SetVault {
        vault: Option<paddock_core::vault::Vault>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reply {
    Ok(EgressStatus),
    Error(String),
}

/// The most bytes one request may take (a policy of 4096 long rules, or a full vault, fits).
const MAX_REQUEST: u64 = 8 << 20;

/// Serves the control socket; `on_set` runs after a new policy is in force (the runtime
/// persists it there, so a restarted enforcer comes back with it).
pub async fn serve(
    enf: Arc<Enforcer>,
    listener: UnixListener,
    on_set: Arc<dyn Fn(&EgressPolicy) + Send + Sync>,
) -> std::io::Result<()> {
    loop {
        let (conn, _) = listener.accept().await?;
        let (enf, on_set) = (enf.clone(), on_set.clone());
        tokio::spawn(async move {
            let (rd, mut wr) = conn.into_split();
            let mut lines = tokio::io::AsyncReadExt::take(BufReader::new(rd), MAX_REQUEST).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = match serde_json::from_str::<Request>(&line) {
                    Ok(Request::Status) => Reply::Ok(enf.status()),
                    Ok(Request::Set { policy }) => match policy.validate() {
                        Ok(()) => {
                            enf.set_policy(policy.clone());
                            on_set(&policy);
                            Reply::Ok(enf.status())
                        }
                        Err(e) => Reply::Error(e),
                    },
                    Ok(Request::SetVault { vault }) => {
                        enf.set_vault(vault);
                        Reply::Ok(enf.status())
                    }
                    Err(e) => Reply::Error(format!("not a control request: {e}")),
                };
                let mut out = serde_json::to_vec(&reply).unwrap_or_default();
                out.push(b'\n');
                if wr.write_all(&out).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// Sends one request to the enforcer whose control socket is at `path`.
pub async fn call(path: &Path, request: &Request) -> std::io::Result<Reply> {
    let conn = UnixStream::connect(path).await?;
    let (rd, mut wr) = conn.into_split();
    let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    line.push(b'\n');
    wr.write_all(&line).await?;
    let mut lines = BufReader::new(rd).lines();
    let reply = lines.next_line().await?.ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the egress enforcer closed the connection")
    })?;
    serde_json::from_str(&reply).map_err(std::io::Error::other)
}
