# Shared helpers for dev/k8s scripts. Sourced, not executed.
set -Eeuo pipefail
K8S_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$K8S_DIR/versions.env"

CACHE=${PADDOCK_K8S_CACHE:-/var/cache/paddock-k8s}
BIN=$CACHE/bin
STATE=${PADDOCK_K8S_STATE:-/var/lib/paddock-k8s}
RUN=$STATE/run        # pidfiles
LOGS=$STATE/logs
PKI=$STATE/pki
NODE=paddock-node
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
SVC_CIDR=10.96.0.0/16
SVC_API_IP=10.96.0.1
BRIDGE=pk8s0
NFT_TABLE=paddock_k8s
CTRD_ROOT=$STATE/containerd
CTRD_STATE=/run/paddock-k8s/containerd
CTRD_SOCK=$CTRD_STATE/containerd.sock
KUBELET_ROOT=$STATE/kubelet
CNI_CONF_DIR=$STATE/cni/net.d
export GOTOOLCHAIN=local

T0=${T0:-$(date +%s)}
CUR_STEP=""
CUR_LOG=""
_ts() { local s=$(( $(date +%s) - T0 )); printf '%02d:%02d' $((s/60)) $((s%60)); }
step() { CUR_STEP=$1; CUR_LOG=${2:-}; echo "[$(_ts)] ==> $1" >&2; }
info() { echo "[$(_ts)]     $*" >&2; }
exec 9>&2   # the original stderr: die() reports there even when called under a redirection
die() {
  {
    echo "[$(_ts)] FAILED at step '${CUR_STEP:-?}': $*"
    if [ -n "$CUR_LOG" ]; then
      echo "        log: $CUR_LOG"
      [ -f "$CUR_LOG" ] && { echo "        --- last lines of $CUR_LOG ---"; tail -n 25 "$CUR_LOG" | sed 's/^/        /'; }
    fi
  } >&9
  exit 1
}
_on_err() { local rc=$?; die "command failed (exit $rc): ${BASH_COMMAND}"; }
trap _on_err ERR

need_root() { [ "$(id -u)" = 0 ] || { echo "must run as root" >&2; exit 1; }; }

# wait_for SECONDS DESCRIPTION CMD... : poll CMD every 0.5s until success
wait_for() {
  local t=$1 what=$2; shift 2
  local end=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out after ${t}s waiting for $what"
    sleep 0.5
  done
}

# pid_alive NAME : pidfile exists and process alive with matching exe
pid_alive() {
  local f=$RUN/$1.pid p
  [ -f "$f" ] || return 1
  p=$(head -n1 "$f"); [ -n "$p" ] && running "$p" || return 1
  # guard against pid reuse: the pidfile's 2nd line is the executable we started
  [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$(sed -n 2p "$f")" ]
}

# running PID: alive and not a zombie (our daemons are reaped by PID 1, which can be slow)
running() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# start_daemon NAME CMD... : start in background, own process group, log + pidfile
start_daemon() {
  local name=$1; shift
  mkdir -p "$RUN" "$LOGS"
  if pid_alive "$name"; then info "$name already running (pid $(head -n1 "$RUN/$name.pid"))"; return 0; fi
  CUR_LOG=$LOGS/$name.log
  echo "=== start $(date -Is): $*" >>"$LOGS/$name.log"
  local exe; exe=$(readlink -f "$(command -v "$1")")
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null 9>&- &
  printf '%s\n%s\n' "$!" "$exe" >"$RUN/$name.pid"
  local i; for i in $(seq 1 20); do pid_alive "$name" && break; sleep 0.1; done  # wait for exec
  info "$name started (pid $!, log $LOGS/$name.log)"
}

# stop_daemon NAME : TERM the pid from the pidfile (if it is still our executable), then KILL
stop_daemon() {
  local name=$1 f=$RUN/$1.pid p i
  [ -f "$f" ] || return 0
  p=$(head -n1 "$f")
  if pid_alive "$1"; then
    local s=$(date +%s%N)
    kill -TERM "$p" 2>/dev/null || true
    for i in $(seq 1 $(( ${STOP_GRACE:-10} * 10 ))); do running "$p" || break; sleep 0.1; done
    running "$p" && { kill -KILL "$p" 2>/dev/null; info "$name killed after ${STOP_GRACE:-10}s grace"; } || true
    info "$name stopped (pid $p, $(( ($(date +%s%N) - s) / 1000000 ))ms)"
  fi
  rm -f "$f"
}

kctl() { "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }
