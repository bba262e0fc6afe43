# Sourced by dev/k8s/paddock: the `runs` part. Runs on the Kubernetes runtime, as a user
# submits them: a server with --gateway-address (an address of this node that sandbox Pods
# reach, which their NetworkPolicy opens on that port alone) runs a driver in a keeper Pod that
# calls home with its token, and its events, state and a thread's workspace come back. A run
# on the claim model is refused at submission, saying why.
runs_part() {
  local ns d url id out state gw="$NODE_IP:18797" pid
  ns=$(fresh_ns runs)
  d=$(mktemp -d)
  step "runs on Kubernetes: a driver in a keeper Pod calls the gateway at $gw (namespace $ns)"
  "$bin" --data-dir "$d" $serve_args --namespace "$ns" --gateway-address "$gw" \
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
  { kill "$pid"; wait "$pid"; } 2>/dev/null || true
  rm -rf "$d"
  step "runs on the claim model are refused at submission"
  d=$(mktemp -d)
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
