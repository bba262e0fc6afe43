//! The sandbox's env file: what `set_env` wrote, read for every command and code context.

use std::collections::BTreeMap;

use paddock_core::runtime::{RuntimeError, SandboxId};
use tokio::io::AsyncReadExt;

use super::ExecdState;
use crate::error::{ApiError, ApiResult};

/// The file `commands.set_env` appends `KEY=VALUE` lines to, named to every command as
/// `EXECD_ENVS` (as OpenSandbox's execd does). It lives in the sandbox's own `/tmp`, which the
/// sandbox user can write on every runtime and which goes with the sandbox.
pub const ENV_FILE: &str = "/tmp/.paddock/envs";
/// Largest env file read; a bigger one is refused rather than truncated to a surprise.
const ENV_FILE_CAP: u64 = 256 << 10;

/// The variables in the sandbox's env file (`ENV_FILE`), read through the runtime like any
/// file of the sandbox; none when it does not exist (or cannot be read by the sandbox user).
pub(super) async fn persisted_env(state: &ExecdState, sandbox: &SandboxId) -> ApiResult<BTreeMap<String, String>> {
    let reader = match state.rt.read_file(sandbox, ENV_FILE).await {
        Ok(r) => r,
        Err(RuntimeError::File { .. }) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e.into()),
    };
    let mut bytes = Vec::new();
    reader
        .take(ENV_FILE_CAP + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| RuntimeError::from_io(format!("reading {ENV_FILE} in sandbox {sandbox}"), &e))?;
    if bytes.len() as u64 > ENV_FILE_CAP {
        return Err(ApiError::bad_request(format!(
            "the env file {ENV_FILE} ($EXECD_ENVS, written by set_env) is larger than {} KiB: delete it (DELETE /files?path={ENV_FILE}) or shorten it",
            ENV_FILE_CAP >> 10
        )));
    }
    Ok(super::text::parse_env_file(&String::from_utf8_lossy(&bytes)))
}
