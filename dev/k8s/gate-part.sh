# Sourced by dev/k8s/paddock: the `gate` part. `paddock gate` from a sandbox Pod must pass on
# the cluster, and must fail — naming the API server — once a NetworkPolicy lets that sandbox
# reach it: the gate can fail. No probe leaves this machine: the passing case stands in TEST-NET
# addresses for the outside world, and the weakened sandbox, open to all egress, is aimed at
# in-cluster targets only.
gate_part() {
  local ns id out rc=0
  step "paddock gate: every check passes from a sandbox Pod, whose one way home is the gate's gateway"
  ns=$(fresh_ns gate)
  # The gate serves a gateway of its own at the node's address, which the probing Pod's policy
  # opens on that port alone: it must answer, while the API server and the kubelet on the
  # same address must not.
  out=$("$bin" $serve_args --namespace "$ns" --gateway-address "$NODE_IP:18798" gate "${gate_offline[@]}" 2>&1) \
    || die "paddock gate failed on the cluster: $out"
  echo "$out" | grep -E '^(PASS|FAIL|SKIP)'
  echo "$out" | grep -q "^PASS  reaches its gateway" || die "the gate did not reach its own gateway from the Pod: $out"
  step "paddock gate: a sandbox a NetworkPolicy opens to the API server fails it"
  id=$("$bin" $serve_args --namespace "$ns" create --timeout 10m | tail -n1)
  K apply -f - >/dev/null <<POLICY
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: gate-weakened, namespace: $ns}
spec:
  podSelector: {matchLabels: {paddock.dev/sandbox: $id}}
  policyTypes: [Egress]
  egress: [{}]
POLICY
  # kube-router applies a new policy within a moment; the gate must then see the API server.
  for _ in 1 2 3 4 5; do
    rc=0; out=$("$bin" $serve_args --namespace "$ns" gate --sandbox "$id" --no-outside-probes 2>&1) || rc=$?
    [ "$rc" = 1 ] && break
    sleep 2
  done
  echo "$out" | grep -E '^(FAIL|PASS)' || true
  [ "$rc" = 1 ] || die "the gate did not fail (exit $rc) for a sandbox the API server is open to"
  echo "$out" | grep -q '^FAIL  Kubernetes API' || die "the gate failed, but not on the API server: $out"
  "$bin" $serve_args --namespace "$ns" rm "$id" >/dev/null
}
