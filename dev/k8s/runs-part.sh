# Sourced by dev/k8s/paddock: the `runs` part. Runs on the Kubernetes runtime, as a user
# submits them: a server with --gateway-address (an address of this node that sandbox Pods
# reach, which their NetworkPolicy opens on that port alone) runs a driver in a keeper Pod that
# calls home with its token, and its events, state and a thread's workspace come back. A run
# on the claim model is refused at submission, saying why.
runs_part() {
  local ns d url id out state gw="$NODE_IP:18797" pid
  ns=$(fresh_ns runs)
  d=$(mktemp -d -p "$scratch_root")
  # Hephaestus's tiers as PriorityClasses: batch below interactive, and batch never preempts.
  local pc=paddock-runs-part
  cluster_objects+=("priorityclass/$pc-interactive" "priorityclass/$pc-batch")
  K apply -f - >/dev/null <<EOF
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: $pc-interactive}
value: 10000
description: "dev/k8s/paddock runs: interactive runs"
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: $pc-batch}
value: 1000
preemptionPolicy: Never
description: "dev/k8s/paddock runs: batch runs, which never preempt"
EOF
  step "runs on Kubernetes: a driver in a keeper Pod calls the gateway at $gw (namespace $ns)"
  "$bin" --data-dir "$d" $serve_args --namespace "$ns" --gateway-address "$gw" \
    --priority-class "interactive=$pc-interactive" --priority-class "batch=$pc-batch" \
    serve --listen 127.0.0.1:18796 --insecure-no-auth >>"$d/log" 2>&1 &
  pid=$!; pids+=("$pid")
  url=http://127.0.0.1:18796
  for _ in $(seq 1 100); do curl -sf "$url/health" >/dev/null && break; sleep 0.2; done
  curl -sf "$url/health" >/dev/null || die "the runs server did not become healthy: $(tail -5 "$d/log")"
  grep -q "gateway on $gw" "$d/log" || die "the gateway does not listen on $gw: $(grep gateway "$d/log")"
  # The driver: a heartbeat and an event through the gateway, then a file in its thread's
  # workspace. busybox wget fails on anything but a 2xx, so the run fails unless both arrive;
  # and it fails (exit 9) if the API server on the gateway's own address answers it.
  local driver='set -e
if nc -w 2 "$NODE" 6443 </dev/null >/dev/null 2>&1; then echo "the driver reached the API server at $NODE:6443" >&2; exit 9; fi
auth="Authorization: Bearer $PADDOCK_TOKEN"
wget -q -O- --header "$auth" --post-data "" "$PADDOCK_GATEWAY/v1/heartbeat" >/dev/null
wget -q -O- --header "$auth" --header "Content-Type: application/json" \
  --post-data "{\"type\": \"progress\", \"data\": {\"from\": \"$(hostname)\", \"turn\": $TURN}}" "$PADDOCK_GATEWAY/v1/events" >/dev/null
echo "turn $TURN" >>/workspace/turns'
  for turn in 1 2; do
    out=$("$bin" --json runs submit --server "$url" --thread kube-thread --env "TURN=$turn" --env "NODE=$NODE_IP" --timeout 300 --wait -- sh -c "$driver") \
      || die "turn $turn: paddock runs submit --wait failed: $out $(tail -5 "$d/log")"
    # --wait --json streams the run's events to its end: its states, its attempt, the driver's own.
    python3 - "$out" "$turn" <<'PY' || die "turn $turn: the run did not succeed with the driver's event: $out"
import json, sys
events = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
states = [e["data"]["state"] for e in events if e["type"] == "state"]
assert states[-1] == "succeeded", states
mine = [e["data"] for e in events if e["type"] == "driver"]
assert mine and mine[0]["type"] == "progress" and mine[0]["data"]["turn"] == int(sys.argv[2]), mine
assert mine[0]["data"]["from"].startswith("paddock-"), mine
PY
    info "turn $turn: the run succeeded; its event came through the gateway from its Pod"
  done
  # The thread's workspace kept both turns: a third run fails unless it finds them.
  out=$("$bin" --json runs submit --server "$url" --thread kube-thread --wait -- \
    sh -c '[ "$(cat /workspace/turns)" = "$(printf "turn 1\nturn 2")" ]') || die "the third run failed: $out"
  python3 -c 'import json,sys; s=[json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]; assert [e for e in s if e["type"]=="state"][-1]["data"]["state"]=="succeeded"' "$out" \
    || die "the thread's workspace did not keep both turns: $out"
  info "the thread's workspace kept both turns across its Pods"
  local n
  n=$(K -n "$ns" get pods,pvc -l paddock.dev/thread-hash -o name | grep -c persistentvolumeclaim || true)
  [ "$n" = 1 ] || die "the thread's runs left $n workspace PVCs (want 1)"
  evicted_attempt "$ns" "$url" "$pc-batch"
  stolen_token "$url"
  { kill "$pid"; wait "$pid"; } 2>/dev/null || true
  rm -rf "$d"
  preempted_batch "$ns" "$gw"
  step "runs on the claim model are refused at submission"
  d=$(mktemp -d -p "$scratch_root")
  "$bin" --data-dir "$d" $serve_args --namespace "$ns" --gateway-address "$gw" --model claim \
    serve --listen 127.0.0.1:18796 --insecure-no-auth >>"$d/log" 2>&1 &
  pid=$!; pids+=("$pid")
  for _ in $(seq 1 100); do curl -sf "$url/health" >/dev/null && break; sleep 0.2; done
  out=$(curl -s -XPOST "$url/v1/runs" -H 'content-type: application/json' -d '{"command": ["true"]}')
  grep -q 'keeper model' <<<"$out" || die "a run on the claim model was not refused clearly: $out"
  info "refused: $out"
  { kill "$pid"; wait "$pid"; } 2>/dev/null || true
  rm -rf "$d"
}

# A batch run whose Pod the cluster evicts (the Eviction API, as the kubelet's node-pressure
# eviction and `kubectl drain` do) is a lost attempt: it runs again under a new epoch and
# succeeds. Its Pod has the batch tier's PriorityClass, so the cluster evicts and preempts it
# before a turn someone waits for.
evicted_attempt() {
  local ns=$1 url=$2 class=$3 out id pod prio
  step "a batch run's Pod is evicted: the attempt is lost, and the run succeeds on a second one"
  # Attempt 1 heartbeats until its Pod is taken; attempt 2 heartbeats once and ends.
  local driver='auth="Authorization: Bearer $PADDOCK_TOKEN"
beat() { wget -q -O- --header "$auth" --post-data "" "$PADDOCK_GATEWAY/v1/heartbeat" >/dev/null; }
beat || exit 3
if [ "$PADDOCK_EPOCH" = 1 ]; then while beat; do sleep 1; done; exit 4; fi'
  out=$("$bin" --json runs submit --server "$url" --tier batch --max-attempts 2 --timeout 300 -- sh -c "$driver") \
    || die "submitting the batch run failed: $out"
  id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$out")
  # Running (its driver called the gateway) on epoch 1, and its Pod.
  for _ in $(seq 1 150); do
    out=$("$bin" --json runs get --server "$url" "$id")
    python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if r["state"]=="running" and r["epoch"]==1 else 1)' "$out" && break
    sleep 0.2
  done
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if r["state"]=="running" else 1)' "$out" \
    || die "the batch run never ran on its first attempt: $out"
  pod=$(K -n "$ns" get pods -l paddock.dev/tier=batch -o jsonpath='{.items[0].metadata.name}')
  [ -n "$pod" ] || die "no Pod is labelled with the batch tier: $(K -n "$ns" get pods --show-labels)"
  prio=$(K -n "$ns" get pod "$pod" -o jsonpath='{.spec.priorityClassName} {.spec.priority} {.spec.preemptionPolicy}')
  [ "$prio" = "$class 1000 Never" ] || die "the batch run's Pod has priority \"$prio\" (want \"$class 1000 Never\")"
  info "its Pod $pod has the batch tier's class: $prio"
  K create --raw "/api/v1/namespaces/$ns/pods/$pod/eviction" -f - >/dev/null <<EOF || die "evicting $pod failed"
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "$pod", "namespace": "$ns"}}
EOF
  out=$("$bin" --json runs events --server "$url" "$id") || die "the evicted run did not succeed: $out"
  python3 - "$out" <<'PY' || die "the evicted attempt was not lost and run again: $out"
import json, sys
events = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
states = [e["data"]["state"] for e in events if e["type"] == "state"]
assert states[-1] == "succeeded", states
assert "requeued" in states, states
epochs = [e["data"]["epoch"] for e in events if e["type"] == "attempt"]
assert epochs == [1, 2], epochs
PY
  info "the evicted attempt was lost, requeued, and epoch 2 succeeded"
}

# A run's token that leaks out of its Pod is worth nothing elsewhere: the gateway sees a Pod's
# own address on each direct connection and refuses a token from any other (403), here from a
# second run's Pod on the same node.
stolen_token() {
  local url=$1 out a tok
  step "a run's token used from another Pod is refused"
  out=$("$bin" --json runs submit --server "$url" --tier interactive --timeout 300 -- sh -c 'auth="Authorization: Bearer $PADDOCK_TOKEN"
echo "token $PADDOCK_TOKEN"
while wget -q -O- --header "$auth" --post-data "" "$PADDOCK_GATEWAY/v1/heartbeat" >/dev/null; do sleep 1; done; exit 4') \
    || die "submitting the run whose token leaks failed: $out"
  a=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$out")
  for _ in $(seq 1 150); do
    tok=$("$bin" runs output --server "$url" "$a" 2>/dev/null | sed -n 's/^token //p' | head -1)
    [ -n "$tok" ] && break
    sleep 0.2
  done
  [ -n "$tok" ] || die "the leaking run never printed its token: $("$bin" --json runs get --server "$url" "$a")"
  # The thief's own token works; the stolen one must get 403 (busybox wget names the status).
  local thief='wget -q -O- --header "Authorization: Bearer $PADDOCK_TOKEN" --post-data "" "$PADDOCK_GATEWAY/v1/heartbeat" >/dev/null || exit 3
out=$(wget -q -O- --header "Authorization: Bearer $STOLEN" --post-data "" "$PADDOCK_GATEWAY/v1/heartbeat" 2>&1) && { echo "the stolen token was taken: $out"; exit 1; }
case "$out" in *403*) exit 0 ;; esac
echo "the stolen token was refused, but not as foreign: $out"; exit 2'
  out=$("$bin" --json runs submit --server "$url" --tier interactive --timeout 300 --env "STOLEN=$tok" --wait -- sh -c "$thief") \
    || die "the thief's run failed (its own token, or the stolen one was not refused with 403): $out"
  out=$("$bin" --json runs get --server "$url" "$a")
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if r["state"]=="running" and r["epoch"]==1 else 1)' "$out" \
    || die "the run whose token leaked is no longer running on its own: $out"
  "$bin" runs cancel --server "$url" "$a" >/dev/null || die "cancelling $a failed"
  info "refused with 403 from the other Pod; the token still works from its own"
}

# Room for one run: a waiting interactive run preempts the running batch attempt (its Pod is
# deleted, the attempt counted as lost), runs, and the batch run runs again under epoch 2 and
# succeeds; its first attempt's token then writes nothing.
preempted_batch() {
  local ns=$1 gw=$2 d url=http://127.0.0.1:18796 pid b out tok1 i
  step "an interactive run preempts the batch attempt, which runs again later under epoch 2"
  d=$(mktemp -d -p "$scratch_root")
  "$bin" --data-dir "$d" $serve_args --namespace "$ns" --gateway-address "$gw" \
    serve --listen 127.0.0.1:18796 --insecure-no-auth --capacity 1 >>"$d/log" 2>&1 &
  pid=$!; pids+=("$pid")
  for _ in $(seq 1 100); do curl -sf "$url/health" >/dev/null && break; sleep 0.2; done
  local beat='beat() { wget -q -O- --header "Authorization: Bearer $PADDOCK_TOKEN" --post-data "" "$PADDOCK_GATEWAY/v1/heartbeat" >/dev/null; }'
  out=$("$bin" --json runs submit --server "$url" --tier batch --max-attempts 3 --timeout 300 -- sh -c "$beat
echo \"token \$PADDOCK_EPOCH \$PADDOCK_TOKEN\"
beat || exit 3
if [ \"\$PADDOCK_EPOCH\" = 1 ]; then while beat; do sleep 1; done; exit 4; fi") || die "submitting the batch run failed: $out"
  b=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$out")
  for _ in $(seq 1 150); do
    tok1=$("$bin" runs output --server "$url" "$b" 2>/dev/null | sed -n 's/^token 1 //p' | head -1)
    out=$("$bin" --json runs get --server "$url" "$b")
    [ -n "$tok1" ] && python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["state"]=="running" else 1)' "$out" && break
    sleep 0.2
  done
  [ -n "$tok1" ] || die "the batch run's first attempt never ran: $out $(tail -5 "$d/log")"
  out=$("$bin" --json runs submit --server "$url" --tier interactive --timeout 300 --wait -- sh -c "$beat
beat") || die "the interactive run did not succeed while the batch run held the only room: $out $(tail -5 "$d/log")"
  out=$("$bin" --json runs events --server "$url" "$b") || die "the preempted batch run did not succeed: $out"
  python3 - "$out" <<'PY' || die "the batch run was not preempted and run again under epoch 2: $out"
import json, sys
events = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
states = [e["data"]["state"] for e in events if e["type"] == "state"]
assert states[-1] == "succeeded" and "requeued" in states, states
epochs = [e["data"]["epoch"] for e in events if e["type"] == "attempt"]
assert epochs == [1, 2], epochs
PY
  # Refused as stale (its Pod gone) or as foreign (its Pod still terminating: this host is
  # not its address); either way it writes nothing.
  out=$(curl -s -XPOST -H "Authorization: Bearer $tok1" "http://$gw/v1/heartbeat")
  grep -qE 'STALE_ATTEMPT|FOREIGN_TOKEN' <<<"$out" || die "the first attempt's token still writes: $out"
  info "preempted, run again under epoch 2 after the interactive run; epoch 1's token: $out"
  { kill "$pid"; wait "$pid"; } 2>/dev/null || true
  rm -rf "$d"
}
