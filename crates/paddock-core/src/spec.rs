//! What a caller asks for when it creates a sandbox, with safe defaults and validation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::egress::EgressPolicy;
use crate::naming::{NamingMode, ThreadId};
use crate::units::{format_bytes, format_duration};

/// How the sandbox reaches the network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkPolicy {
    /// A network namespace with only loopback: zero egress, no DNS.
    #[default]
    LoopbackOnly,
    /// Egress through the runtime's enforcer, as the policy allows (DNS included). A policy
    /// that denies everything still gets the enforcer, so a later change can open it.
    Egress(EgressPolicy),
}

impl NetworkPolicy {
    /// The policy in OpenSandbox's shape (loopback only is deny-all).
    pub fn policy(&self) -> EgressPolicy {
        match self {
            NetworkPolicy::LoopbackOnly => EgressPolicy::deny_all(),
            NetworkPolicy::Egress(p) => p.clone(),
        }
    }
}

/// Resource limits; every sandbox has all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Resources {
    /// Memory (including `/tmp` and `/dev/shm` contents), bytes.
    pub memory_bytes: u64,
    /// CPU quota in thousandths of a CPU.
    pub millicpus: u32,
    /// Most processes and threads alive at once.
    pub pids: u32,
    /// Size cap of `/tmp`, bytes.
    pub tmp_bytes: u64,
    /// Size cap of `/workspace`, bytes. A persistent workspace gets its size (and inode cap)
    /// when it is first created and keeps it. `None` leaves it bounded only by the host's disk:
    /// library callers may ask for that; the CLI and the API always give a cap.
    pub workspace_bytes: Option<u64>,
    /// Most files and directories `/workspace` may hold, so that one sandbox cannot use up the
    /// inodes of the filesystem it lives on. Applies whenever `workspace_bytes` is set.
    pub workspace_inodes: u64,
}

pub const DEFAULT_MEMORY: u64 = 512 << 20;
pub const DEFAULT_MILLICPUS: u32 = 1000;
pub const DEFAULT_PIDS: u32 = 512;
pub const DEFAULT_TMP: u64 = 256 << 20;
pub const MIN_MEMORY: u64 = 16 << 20;
pub const MAX_PIDS: u32 = 16_384;
pub const MIN_PIDS: u32 = 8;
pub const MAX_MILLICPUS: u32 = 1_024_000;
pub const MIN_TMP: u64 = 1 << 20;
pub const MIN_WORKSPACE: u64 = 16 << 20;
pub const MAX_WORKSPACE: u64 = 16 << 40;
/// Enough for a few package installs and a repository checkout; operators change it with
/// `paddock serve --workspace-size` and callers per sandbox.
pub const DEFAULT_WORKSPACE: u64 = 2 << 30;
/// `node_modules` trees run to tens of thousands of files; a quarter million leaves room while
/// keeping a sandbox from the host filesystem's inodes.
pub const DEFAULT_WORKSPACE_INODES: u64 = 256 << 10;
pub const MIN_WORKSPACE_INODES: u64 = 1024;
/// ext4 and tmpfs both count inodes in 32 bits.
pub const MAX_WORKSPACE_INODES: u64 = u32::MAX as u64;

impl Default for Resources {
    fn default() -> Self {
        Self {
            memory_bytes: DEFAULT_MEMORY,
            millicpus: DEFAULT_MILLICPUS,
            pids: DEFAULT_PIDS,
            tmp_bytes: DEFAULT_TMP,
            workspace_bytes: Some(DEFAULT_WORKSPACE),
            workspace_inodes: DEFAULT_WORKSPACE_INODES,
        }
    }
}

/// The identity processes run as inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

impl Default for User {
    fn default() -> Self {
        Self { uid: 1000, gid: 1000 }
    }
}

/// The persistent workspace a sandbox mounts at `/workspace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceRef {
    pub thread: ThreadId,
    #[serde(default)]
    pub naming: NamingMode,
}

/// Everything needed to create a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSpec {
    /// What the sandbox's `/` is made of, as the caller named it; the runtime resolves it (the
    /// local runtime: `host` or an unpacked root directory; Kubernetes: an image reference).
    /// `None` is the runtime's default.
    pub image: Option<String>,
    pub resources: Resources,
    /// The environment of every command, on top of `HOME=/workspace` and a default `PATH`.
    /// The host's environment is never inherited.
    pub env: BTreeMap<String, String>,
    pub user: User,
    /// Lifetime after which the sandbox is destroyed; `None` keeps it until removed.
    pub timeout_secs: Option<u64>,
    /// Persistent workspace; without one, `/workspace` lives and dies with the sandbox.
    pub workspace: Option<WorkspaceRef>,
    pub network: NetworkPolicy,
    /// Free-form labels for the caller's bookkeeping.
    pub labels: BTreeMap<String, String>,
    /// The directory commands start in when they name none; `None` is `/workspace`. A runtime
    /// sets it from an image's `WorkingDir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// What the image runs by default (its `Entrypoint` then `Cmd`), when the runtime knows:
    /// the entrypoint of an API sandbox whose request names none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub image_command: Vec<String>,
    /// Credentials to pull `image` with (OpenSandbox's `image.auth`): used once, at create,
    /// and never stored, handed to another process or returned.
    #[serde(skip)]
    pub image_auth: Option<RegistryAuth>,
    /// Host directories and named volumes mounted besides the workspace.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volume::VolumeMount>,
    /// The server's gateway, as the host reaches it: a runtime that supports gateways
    /// (`Capabilities::gateway`) gives the sandbox a way to this address and nothing new
    /// besides, and sets [`GATEWAY_ENV`] in its environment to the URL that leads there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<std::net::SocketAddr>,
    /// What the runtime's forwarder sends after the sandbox's id in its first line
    /// ([`GATEWAY_PREAMBLE`]), so the gateway knows the line comes from a forwarder and not
    /// from any process that can reach its port. Never given to the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_secret: Option<GatewaySecret>,
    /// The credential proxy (OpenSandbox's `credentialProxy.enabled`): the sandbox gets a CA
    /// of its own in its trust store and CA variables, so its vault may bind `https` hosts
    /// (`Capabilities::credential_vault`). Bindings over plain `http` do not need it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credential_proxy: bool,
    /// The run tier whose attempt this sandbox holds (`interactive`, `batch`, …), for a runtime
    /// that schedules by priority: the Kubernetes runtime gives the Pod the PriorityClass its
    /// operator mapped to the tier (`--priority-class TIER=CLASS`), so the cluster evicts and
    /// preempts batch work before a turn someone waits for. `None` for plain sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

/// The proof of a gateway forwarder: kept with the sandbox's record (root's), never printed.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GatewaySecret(pub String);

impl std::fmt::Debug for GatewaySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewaySecret(<redacted>)")
    }
}

/// The variable that holds the gateway's base URL inside a sandbox with a gateway.
pub const GATEWAY_ENV: &str = "PADDOCK_GATEWAY";

/// Makes the values of a gateway spec's environment that start with `$PADDOCK_GATEWAY` start
/// with the URL the runtime gives the sandbox instead (so the server can name paths on the
/// gateway, such as the model route, without knowing where each runtime puts it).
pub fn expand_gateway(env: &mut BTreeMap<String, String>, url: &str) {
    let prefix = format!("${GATEWAY_ENV}");
    for v in env.values_mut() {
        if let Some(rest) = v.strip_prefix(&prefix) {
            *v = format!("{url}{rest}");
        }
    }
    env.insert(GATEWAY_ENV.to_owned(), url.to_owned());
}

/// The first line a runtime's forwarder may send the gateway on each connection, followed by
/// a space, the sandbox's id, a space and the spec's [`GatewaySecret`], before the sandbox's
/// own bytes: the gateway then refuses a token of another sandbox there. Only the forwarder can
/// write it, since it comes first, and only it holds the secret, so no other process that
/// reaches the gateway's port can claim to be a sandbox.
pub const GATEWAY_PREAMBLE: &str = "PADDOCK-GATEWAY-FROM";

/// A registry user name and password (or token).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryAuth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

/// A spec that cannot be run, with the field at fault and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: &'static str,
    pub message: String,
}

fn err(field: &'static str, message: impl Into<String>) -> SpecError {
    SpecError { field, message: message.into() }
}

/// The `PATH` commands get unless the spec sets its own.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Checks an environment variable name: a POSIX shell name.
pub fn validate_env_name(name: &str) -> Result<(), SpecError> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(err(
            "env",
            format!("{name:?} is not a valid variable name: use letters, digits and _, not starting with a digit"),
        ))
    }
}

/// The longest `NAME=value` the kernel passes to a program (`MAX_ARG_STRLEN`).
pub const MAX_ENV_ENTRY: usize = 128 << 10;
/// The most environment, in bytes, a sandbox or a command may carry.
pub const MAX_ENV_TOTAL: usize = 1 << 20;
/// The most variables in one environment.
pub const MAX_ENV_VARS: usize = 4096;

/// Checks a whole environment map: names, NUL bytes and sizes a program can actually receive.
pub fn validate_env(env: &BTreeMap<String, String>) -> Result<(), SpecError> {
    if env.len() > MAX_ENV_VARS {
        return Err(err("env", format!("{} variables are too many: pass at most {MAX_ENV_VARS}", env.len())));
    }
    let mut total = 0usize;
    for (k, v) in env {
        validate_env_name(k)?;
        if v.contains('\0') {
            return Err(err("env", format!("the value of {k} contains a NUL byte, which no process can receive")));
        }
        let entry = k.len() + 1 + v.len();
        if entry > MAX_ENV_ENTRY {
            return Err(err(
                "env",
                format!(
                    "{k} is {entry} bytes long; the kernel passes at most {MAX_ENV_ENTRY} bytes per variable: put large data in a file instead"
                ),
            ));
        }
        total += entry + 1;
    }
    if total > MAX_ENV_TOTAL {
        return Err(err(
            "env",
            format!(
                "the environment is {total} bytes; at most {MAX_ENV_TOTAL} are accepted: put large data in a file instead"
            ),
        ));
    }
    Ok(())
}

/// The environment a command starts with: exactly the spec's and the request's variables, plus
/// `HOME` and `PATH` unless they set those themselves.
pub fn command_env(
    spec_env: &BTreeMap<String, String>,
    request_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env =
        BTreeMap::from([("HOME".to_owned(), "/workspace".to_owned()), ("PATH".to_owned(), DEFAULT_PATH.to_owned())]);
    env.extend(spec_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(request_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

impl SandboxSpec {
    /// Rejects impossible or unsafe specs with a message that says what to change.
    pub fn validate(&self) -> Result<(), SpecError> {
        if let NetworkPolicy::Egress(p) = &self.network {
            p.validate().map_err(|m| err("networkPolicy", m))?;
        }
        crate::volume::validate_volumes(&self.volumes)?;
        let r = &self.resources;
        if r.memory_bytes < MIN_MEMORY {
            return Err(err(
                "memory",
                format!(
                    "{} is too little to start a process: give at least {}",
                    format_bytes(r.memory_bytes),
                    format_bytes(MIN_MEMORY)
                ),
            ));
        }
        if !(MIN_PIDS..=MAX_PIDS).contains(&r.pids) {
            return Err(err("pids", format!("{} is out of range: choose between {MIN_PIDS} and {MAX_PIDS}", r.pids)));
        }
        if r.millicpus == 0 || r.millicpus > MAX_MILLICPUS {
            return Err(err(
                "cpus",
                format!("{} millicpus is out of range: choose between 0.01 and 1024 CPUs", r.millicpus),
            ));
        }
        if r.tmp_bytes < MIN_TMP {
            return Err(err(
                "tmp",
                format!("{} is too small for /tmp: give at least {}", format_bytes(r.tmp_bytes), format_bytes(MIN_TMP)),
            ));
        }
        if let Some(w) = r.workspace_bytes
            && !(MIN_WORKSPACE..=MAX_WORKSPACE).contains(&w)
        {
            return Err(err(
                "workspace-size",
                format!(
                    "{} is out of range: choose between {} and {}",
                    format_bytes(w),
                    format_bytes(MIN_WORKSPACE),
                    format_bytes(MAX_WORKSPACE)
                ),
            ));
        }
        if !(MIN_WORKSPACE_INODES..=MAX_WORKSPACE_INODES).contains(&r.workspace_inodes) {
            return Err(err(
                "workspace-inodes",
                format!(
                    "{} is out of range: choose between {MIN_WORKSPACE_INODES} and {MAX_WORKSPACE_INODES}",
                    r.workspace_inodes
                ),
            ));
        }
        if self.user.uid >= 1_000_000 || self.user.gid >= 1_000_000 {
            return Err(err("user", "uid and gid must be below 1000000: choose an ordinary id such as 1000:1000"));
        }
        if self.user.uid == 0 || self.user.gid == 0 {
            return Err(err(
                "user",
                "running as root inside a sandbox is not supported: choose a non-zero uid and gid such as 1000:1000",
            ));
        }
        if let Some(t) = self.timeout_secs {
            if t == 0 {
                return Err(err("timeout", "must be at least one second; leave it unset for no timeout"));
            }
            if t > 366 * 24 * 3600 {
                return Err(err(
                    "timeout",
                    format!(
                        "{} is longer than a year: leave it unset for no timeout",
                        format_duration(std::time::Duration::from_secs(t))
                    ),
                ));
            }
        }
        if let Some(image) = &self.image
            && (image.trim().is_empty() || image.len() > 4096 || image.contains('\0'))
        {
            return Err(err("image", "an image name must be non-empty text of at most 4096 bytes"));
        }
        if let Some(dir) = &self.working_dir
            && (!dir.starts_with('/') || dir.len() > 4096 || dir.contains('\0'))
        {
            return Err(err("working_dir", "the working directory must be an absolute path of at most 4096 bytes"));
        }
        validate_env(&self.env)
    }
}

/// A spec that passed [`SandboxSpec::validate`], which is what `Runtime::create` (and
/// `create_and_exec`, `acquire`) take: the edge (the server's handler, the CLI) validates once
/// and no runtime checks the caller's part again. It can only be made by validating, also when
/// deserialized (the local runtime's supervisor reads one from its pipe, a process boundary),
/// and it cannot be changed in place: a runtime that adds to a spec (an image's environment,
/// a resolved volume) takes it apart with [`ValidatedSpec::into_inner`] and answers for what
/// it adds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SandboxSpec", into = "SandboxSpec")]
pub struct ValidatedSpec(SandboxSpec);

impl ValidatedSpec {
    /// The spec, to change: what comes of it is no longer known to be valid.
    pub fn into_inner(self) -> SandboxSpec {
        self.0
    }
}

impl Default for ValidatedSpec {
    /// The default spec, which is valid (a test says so).
    fn default() -> Self {
        Self(SandboxSpec::default())
    }
}

impl std::ops::Deref for ValidatedSpec {
    type Target = SandboxSpec;

    fn deref(&self) -> &SandboxSpec {
        &self.0
    }
}

impl TryFrom<SandboxSpec> for ValidatedSpec {
    type Error = SpecError;

    fn try_from(spec: SandboxSpec) -> Result<Self, SpecError> {
        spec.validated()
    }
}

impl From<ValidatedSpec> for SandboxSpec {
    fn from(spec: ValidatedSpec) -> Self {
        spec.0
    }
}

impl SandboxSpec {
    /// This spec, checked once (see [`ValidatedSpec`]).
    pub fn validated(self) -> Result<ValidatedSpec, SpecError> {
        self.validate()?;
        Ok(ValidatedSpec(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_spec_is_valid_and_safe() {
        let s = SandboxSpec::default();
        s.validate().unwrap();
        assert_eq!(*ValidatedSpec::default(), s, "ValidatedSpec::default is this spec");
        assert_eq!(s.user, User { uid: 1000, gid: 1000 });
        assert_eq!(s.resources.pids, 512);
        assert_eq!((s.resources.workspace_bytes, s.resources.workspace_inodes), (Some(2 << 30), 262_144));
        assert_eq!(s.network, NetworkPolicy::LoopbackOnly);
    }

    #[test]
    fn impossible_limits_are_rejected_with_the_field() {
        let mut s = SandboxSpec::default();
        s.resources.memory_bytes = 1;
        assert_eq!(s.validate().unwrap_err().field, "memory");
        let mut s = SandboxSpec::default();
        s.resources.pids = 1_000_000;
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, "pids");
        assert!(e.to_string().contains("between 8 and 16384"), "{e}");
        let mut s = SandboxSpec::default();
        s.resources.workspace_inodes = 10;
        assert_eq!(s.validate().unwrap_err().field, "workspace-inodes");
        let mut s = SandboxSpec::default();
        s.user.uid = 0;
        assert_eq!(s.validate().unwrap_err().field, "user");
        let s = SandboxSpec { image: Some(" ".into()), ..Default::default() };
        assert_eq!(s.validate().unwrap_err().field, "image");
    }

    #[test]
    fn env_names_and_values_are_checked() {
        for bad in ["", "1A", "A-B", "A B", "A=B"] {
            assert!(validate_env_name(bad).is_err(), "{bad:?}");
        }
        for good in ["A", "_", "a_1", "PATH"] {
            validate_env_name(good).unwrap();
        }
        let mut s = SandboxSpec::default();
        s.env.insert("X".into(), "a\0b".into());
        assert_eq!(s.validate().unwrap_err().field, "env");
        let mut s = SandboxSpec::default();
        s.env.insert("BIG".into(), "x".repeat(MAX_ENV_ENTRY));
        let e = s.validate().unwrap_err();
        assert!(e.message.contains("per variable"), "{e}");
        let mut s = SandboxSpec::default();
        for i in 0..10 {
            s.env.insert(format!("V{i}"), "x".repeat(120 << 10));
        }
        assert!(s.validate().unwrap_err().message.contains("at most 1048576"));
    }

    #[test]
    fn command_env_is_exactly_spec_and_request_plus_home_and_path() {
        let spec = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        let req = BTreeMap::from([("B".to_owned(), "2".to_owned()), ("PATH".to_owned(), "/x".to_owned())]);
        let env = command_env(&spec, &req);
        assert_eq!(env.keys().collect::<Vec<_>>(), ["A", "B", "HOME", "PATH"]);
        assert_eq!(env["PATH"], "/x");
        assert_eq!(env["HOME"], "/workspace");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = serde_json::from_str::<SandboxSpec>(r#"{"resources":{"memory":1}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn a_validated_spec_is_made_only_by_validating_also_from_json() {
        let bad = SandboxSpec { user: User { uid: 0, gid: 0 }, ..Default::default() };
        assert_eq!(bad.clone().validated().unwrap_err().field, "user");
        let json = serde_json::to_string(&bad).unwrap();
        let e = serde_json::from_str::<ValidatedSpec>(&json).unwrap_err().to_string();
        assert!(e.contains("root inside a sandbox"), "deserializing validates: {e}");
        let good = SandboxSpec { env: [("A".to_owned(), "1".to_owned())].into(), ..Default::default() };
        let v = good.clone().validated().unwrap();
        let back: ValidatedSpec = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!((back.clone().into_inner(), &back.env), (good, &v.env));
    }
}
