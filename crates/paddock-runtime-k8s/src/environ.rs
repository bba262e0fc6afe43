//! A sandbox's environment and metrics as read from its Pod: the image's variables from the
//! keeper's `/proc/1/environ`, layered under the spec's and a request's, and the container's
//! cgroup counters.

use std::collections::BTreeMap;

use paddock_core::runtime::SandboxMetrics;
use paddock_core::spec::command_env;

/// Prints the container's own cgroup counters, v1 or v2, as `key value` lines; `read` is a
/// shell builtin, so nothing but `sh` is needed.
pub const METRICS_SCRIPT: &str = r#"r() { [ -r "$2" ] && read -r v <"$2" && echo "$1 $v"; }
r mem1 /sys/fs/cgroup/memory/memory.usage_in_bytes
r cpu1 /sys/fs/cgroup/cpuacct/cpuacct.usage
r cpu1 /sys/fs/cgroup/cpu,cpuacct/cpuacct.usage
r mem2 /sys/fs/cgroup/memory.current
if [ -r /sys/fs/cgroup/cpu.stat ]; then
  while read -r k v; do [ "$k" = usage_usec ] && echo "cpu2 $v"; done </sys/fs/cgroup/cpu.stat
fi
true"#;

/// Reads `METRICS_SCRIPT`'s output; v1 counts CPU in ns, v2 in µs.
pub fn parse_metrics(out: &str) -> SandboxMetrics {
    let mut m = SandboxMetrics::default();
    let values: BTreeMap<&str, u64> = out
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| v.trim().parse().ok().map(|v| (k, v)))
        .collect();
    m.memory_used_bytes = values.get("mem2").or(values.get("mem1")).copied();
    m.cpu_used_ns = values.get("cpu2").map(|us| us * 1000).or(values.get("cpu1").copied());
    m
}

/// Whether a variable of the keeper's environment may be the image's. The kubelet and the
/// container runtime add some that are not, and that commands must not get: the API server's
/// address (`KUBERNETES_SERVICE_*`, `KUBERNETES_PORT*`, set even without service links), the
/// Pod's name (`HOSTNAME`), and a `HOME` (a command's is the workspace unless the spec says
/// otherwise).
pub(crate) fn from_the_image(name: &str) -> bool {
    !(name == "HOME"
        || name == "HOSTNAME"
        || name.starts_with("KUBERNETES_SERVICE_")
        || name.starts_with("KUBERNETES_PORT"))
}

/// `NAME=VALUE` entries of a `/proc/PID/environ`, those with a shell name only (a command's
/// environment is passed as such names) that may be the image's ([`from_the_image`]).
pub(crate) fn parse_environ(bytes: &[u8]) -> BTreeMap<String, String> {
    bytes
        .split(|&b| b == 0)
        .filter_map(|entry| {
            let entry = std::str::from_utf8(entry).ok()?;
            let (name, value) = entry.split_once('=')?;
            paddock_core::spec::validate_env_name(name).ok()?;
            from_the_image(name).then(|| (name.to_owned(), value.to_owned()))
        })
        .collect()
}

/// A sandbox's environment on Kubernetes, as the local runtime makes it for an image root:
/// `HOME` and `PATH` defaults, the image's variables over them, the spec's over those.
pub(crate) fn sandbox_env(
    image: &BTreeMap<String, String>,
    spec: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = command_env(image, &BTreeMap::new());
    env.extend(spec.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// A command's environment: the sandbox's, then the request's.
pub(crate) fn with_request_env(
    base: &BTreeMap<String, String>,
    request: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = base.clone();
    env.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}
