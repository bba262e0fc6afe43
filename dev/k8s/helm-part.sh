# The `helm` part of dev/k8s/paddock (sourced by it): both charts installed on the dev cluster.
#
#  1. the server image from the release binary (dev/k8s/server-image), imported into containerd;
#  2. the server refuses to start with a default timeout below 60 s or above the maximum;
#  3. `helm install` paddock-infra (a fresh namespace, PVC reaper with a 2 s TTL, namespace kept
#     on uninstall so a workspace PVC survives it) and paddock (the server) into it; the server
#     Pod becomes Ready (its start already lists Pods: the egress backstop lets it reach the API)
#     and meets Pod Security restricted; `helm upgrade` keeps the generated API key;
#  4. the SDK suite through `kubectl port-forward` to the ClusterIP Service (PADDOCK_HELM_E2E
#     picks tests with pytest -k); a workspace made through the API (acquire, release) whose PVC
#     is kept; a run calling home; the data directory on a PVC (persistence) outlives the
#     server Pod: a tenant added in it keeps its key on the next Pod;
#  5. `paddock check --no-probe` with the server's ServiceAccount token; `kubectl auth can-i
#     --as` the server's ServiceAccount: every verb in check.rs NEEDED is allowed; the claim verbs (rbac.claimModel off), secrets, other namespaces and cluster-scoped
#     writes are denied; the same for the reaper's ServiceAccount;
#  6. the backstop: a Pod labelled managed-by=paddock cannot reach the API server, the same
#     Pod labelled as the server can; `paddock gate` passes from a sandbox in that namespace;
#  7. the CronJob, triggered twice (kubectl create job --from): an unused PVC is marked, then
#     deleted;
#  8. `helm uninstall` of both: nothing of the charts remains, and of Paddock's own objects only
#     the kept workspace PVC (then the namespace is deleted by hand);
#  9. the claim model in a second namespace that enforces Pod Security restricted (rbac.claimModel,
#     runtime.model=claim, warmPool 1, no CAP_CHOWN init container): Ready, SDK tests
#     (PADDOCK_HELM_CLAIM_E2E, default test_lifecycle), `paddock gate`, uninstall deletes it all.

# `kubectl port-forward` to the chart's Service, restarted whenever it exits: kubectl ends the
# whole forward when one forwarded connection is reset, which says nothing about the server.
# The loop runs in a session of its own, so killing -$helm_pf ends it and its kubectl.
forward() { # namespace port
  setsid bash -c 'while true; do "$0" -n "$1" port-forward svc/paddock "$2:80" >/dev/null 2>&1; sleep 0.2; done' \
    "$BIN/kubectl" "$1" "$2" &
  helm_pf=$!
}

HELM=$BIN/helm
helm_ns="" helm_infra="" helm_pf=""

helm_cleanup() {
  [ -n "$helm_pf" ] && { kill -- "-$helm_pf" 2>/dev/null; wait "$helm_pf" 2>/dev/null; } || true
  helm_pf=""
  if [ -n "$helm_ns" ]; then
    "$HELM" uninstall paddock -n "$helm_ns" --wait --timeout 60s >/dev/null 2>&1 || true
    [ -n "$helm_infra" ] && "$HELM" uninstall "$helm_infra" -n default --wait --timeout 60s >/dev/null 2>&1 || true
    K delete namespace "$helm_ns" --wait=false >/dev/null 2>&1 || true
    helm_ns=""
  fi
}

# needs NEEDED|CLAIM_NEEDED: the runtime's verbs from check.rs, one "VERB RESOURCE[.GROUP] [--subresource=S]" a line
needs() {
  python3 - "$REPO/crates/paddock-runtime-k8s/src/check.rs" "$1" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
block = re.search(sys.argv[2] + r": &\[Need\] = &\[(.*?)\];", src, re.S).group(1)
for g, r, s, v in re.findall(r'need\("([^"]*)", "([^"]*)", "([^"]*)", "([^"]*)"\)', block):
    print(v, r + "." + g if g else r, "--subresource=" + s if s else "")
PY
}

# can NS SA EXPECT(yes|no) VERB RESOURCE [kubectl auth can-i flags...]
can() {
  local ns=$1 sa=$2 want=$3 got; shift 3
  got=$(K auth can-i "$@" --as "system:serviceaccount:$ns:$sa" 2>/dev/null) || true
  [ "$got" = "$want" ] || die "kubectl auth can-i $* as $sa: got '$got', want '$want'"
}

helm_charts() {
  local rel_bin=${PADDOCK_RELEASE_BIN:-$REPO/target/release/paddock} image key port=18790 out left
  [ -x "$HELM" ] || "$K8S_DIR/build" helm kubeconform
  [ -x "$rel_bin" ] || (cd "$REPO" && cargo build --release -p paddock --locked)

  step "helm: the server image from $rel_bin, imported into the cluster"
  image=$("$K8S_DIR/server-image" "$rel_bin" | sed -n 's/^IMAGE=//p')
  [ -n "$image" ] || die "dev/k8s/server-image printed no image name"

  step "helm: the server refuses to start with a default timeout below 60 s or above the maximum"
  local scratch rc
  scratch=$(mktemp -d -p "$scratch_root")
  for t in "--default-timeout 59s" "--default-timeout 3601s --max-timeout 3600s"; do
    rc=0
    # shellcheck disable=SC2086
    out=$(PADDOCK_API_KEY=k timeout 30 "$rel_bin" --data-dir "$scratch" serve --listen 127.0.0.1:0 $t 2>&1) || rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || die "serve started with $t (rc $rc): $out"
    grep -q "must be at least 60s and at most the maximum" <<<"$out" || die "the refusal with $t does not say why: $out"
    info "$t: $(grep -o 'the default session timeout.*' <<<"$out" | head -1)"
  done
  rm -rf "$scratch"

  helm_ns="paddock-helm-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
  helm_infra="$helm_ns-infra"
  step "helm: install paddock-infra (namespace $helm_ns) and paddock into it"
  # the dev cluster: hostPath volumes need --chown-workspace, which needs Pod Security baseline;
  # the API server is 10.96.0.1 (Service) = 10.244.0.1:6443 (endpoint)
  "$HELM" install "$helm_infra" "$REPO/charts/paddock-infra" -n default --wait --timeout 60s \
    --set namespace.name="$helm_ns" --set 'apiServer.cidrs={10.96.0.1/32,10.244.0.1/32}' \
    --set namespace.podSecurity=baseline --set namespace.keepOnUninstall=true \
    --set pvcReaper.ttl=2s --set pvcReaper.image.repository="${image%:*}" --set pvcReaper.image.tag="${image##*:}" \
    --set pvcReaper.image.pullPolicy=Never >/dev/null || die "helm install paddock-infra failed"
  K get namespace "$helm_ns" -o jsonpath='{.metadata.labels}' | grep -q '"pod-security.kubernetes.io/enforce":"baseline"' \
    || die "the namespace lacks its Pod Security labels"
  out=$("$HELM" install paddock "$REPO/charts/paddock" -n "$helm_ns" --wait --timeout 120s \
    --set image.repository="${image%:*}" --set image.tag="${image##*:}" --set image.pullPolicy=Never \
    --set runtime.sandboxImagePullPolicy=Never --set runtime.cpuRequest=0.01 --set runtime.chownWorkspace=true 2>&1) || {
    K -n "$helm_ns" get pods -o wide >&2 || true
    K -n "$helm_ns" logs deploy/paddock --tail 30 >&2 || true
    die "helm install paddock failed: $out"
  }
  K -n "$helm_ns" wait --for=condition=Ready pod -l app.kubernetes.io/component=server,app.kubernetes.io/name=paddock --timeout 60s >/dev/null \
    || die "the server Pod is not Ready"
  info "server Pod Ready: $(K -n "$helm_ns" get pods -l app.kubernetes.io/name=paddock -o jsonpath='{.items[0].metadata.name}')"
  # paddock-infra's PriorityClasses exist and the server Pod has the platform one.
  local prio
  prio=$(K -n "$helm_ns" get pods -l app.kubernetes.io/name=paddock -o jsonpath='{.items[0].spec.priorityClassName} {.items[0].spec.priority}')
  [ "$prio" = "paddock-$helm_ns-platform 100000" ] || die "the server Pod's priority is \"$prio\" (want paddock-$helm_ns-platform 100000)"
  [ "$(K get priorityclass "paddock-$helm_ns-batch" -o jsonpath='{.value} {.preemptionPolicy}')" = "1000 Never" ] \
    || die "paddock-infra's batch PriorityClass is missing or preempts"
  info "priorities: the server Pod is $prio; the batch class never preempts"
  # the namespace enforces baseline here (for --chown-workspace); the server Pod meets restricted:
  # a server-side dry run of enforce=restricted warns about every Pod that does not
  out=$(K label --dry-run=server --overwrite namespace "$helm_ns" pod-security.kubernetes.io/enforce=restricted 2>&1)
  ! grep -qi warning <<<"$out" || die "the server Pod does not meet Pod Security restricted: $out"
  info "the server Pod meets Pod Security restricted (server-side dry run of enforce=restricted: no warning)"
  [ "$(K -n "$helm_ns" get svc paddock -o jsonpath='{.spec.type}')" = ClusterIP ] || die "the Service is not ClusterIP"
  key=$(K -n "$helm_ns" get secret paddock-api-key -o jsonpath='{.data.api-key}' | base64 -d)
  [ ${#key} -ge 32 ] || die "the generated API key is missing or short"

  step "helm: upgrade keeps the generated API key"
  "$HELM" upgrade paddock "$REPO/charts/paddock" -n "$helm_ns" --reuse-values --wait --timeout 120s >/dev/null \
    || die "helm upgrade failed"
  [ "$(K -n "$helm_ns" get secret paddock-api-key -o jsonpath='{.data.api-key}' | base64 -d)" = "$key" ] \
    || die "helm upgrade changed the API key"

  step "helm: the SDK suite through the Service (kubectl port-forward svc/paddock $port:80)"
  forward "$helm_ns" "$port"
  wait_for 30 "the port-forward to the server" curl -sf "http://127.0.0.1:$port/health"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/sandboxes")" = 401 ] \
    || die "the server answers without the API key"
  # All but one: the SDK pool's default 24 h lifetime is above the chart's default timeouts.max
  # (8 h), which refuses it by design. Tests that restart the server or use its data directory
  # skip themselves against an external server.
  PADDOCK_BIN=$rel_bin PADDOCK_E2E_IMAGE=paddock.local/sandbox:1 PADDOCK_E2E_URL="127.0.0.1:$port" \
    PADDOCK_E2E_API_KEY="$key" "$REPO/e2e/run" -k "${PADDOCK_HELM_E2E:-not test_the_sdk_pools_default_lifetime_is_accepted}" \
    || die "the SDK suite through the chart's Service failed"

  step "helm: a workspace through the API (acquire, release): its PVC stays"
  local auth=(-H "OPEN-SANDBOX-API-KEY: $key")
  curl -sf "${auth[@]}" -XPOST "http://127.0.0.1:$port/v1/workspaces/helm-kept/acquire" >/dev/null || die "acquire failed"
  curl -sf "${auth[@]}" -XPOST "http://127.0.0.1:$port/v1/workspaces/helm-kept/release" >/dev/null || die "release failed"

  step "helm: a run whose driver calls home to the server Pod's gateway (runs.gateway)"
  # The driver's heartbeat goes to $PADDOCK_GATEWAY, the server Pod's address on 8081; busybox
  # wget fails on anything but a 2xx, and so would the run.
  out=$(PADDOCK_API_KEY=$key "$rel_bin" --json runs submit --server "http://127.0.0.1:$port" --timeout 300 --wait -- \
    sh -c 'wget -q -O- --header "Authorization: Bearer $PADDOCK_TOKEN" --post-data "" "$PADDOCK_GATEWAY/v1/heartbeat" >/dev/null') \
    || die "paddock runs submit through the chart's Service failed: $out"
  python3 -c 'import json,sys; s=[json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]; assert [e for e in s if e["type"]=="state"][-1]["data"]["state"]=="succeeded"' "$out" \
    || die "the run through the chart's server did not succeed: $out"
  info "the run succeeded; its driver reached the gateway at the server Pod's address"

  step "helm: the server's data directory outlives its Pod (upgrade to persistence: a PVC)"
  # An upgrade from the emptyDir moves the Deployment to Recreate on the chart's claim (the
  # hostPath provisioner ignores fsGroup: persistence.chown). A tenant added in the database of
  # the server Pod, which is then deleted: the next Pod mounts the same claim, so the tenant's
  # key works there.
  "$HELM" upgrade paddock "$REPO/charts/paddock" -n "$helm_ns" --reuse-values --wait --timeout 120s \
    --set persistence.enabled=true --set persistence.chown=true >/dev/null || die "helm upgrade to persistence failed"
  [ "$(K -n "$helm_ns" get deploy paddock -o jsonpath='{.spec.strategy.type} {.spec.template.spec.volumes[?(@.name=="data")].persistentVolumeClaim.claimName}')" = "Recreate paddock-data" ] \
    || die "the upgraded Deployment is not Recreate on the claim paddock-data"
  local sel=app.kubernetes.io/component=server,app.kubernetes.io/name=paddock old tkey
  wait_for 120 "one server Pod after the upgrade" sh -c "[ \"\$('$BIN/kubectl' -n '$helm_ns' get pods -l '$sel' -o name | wc -l)\" = 1 ]"
  K -n "$helm_ns" wait --for=condition=Ready pod -l "$sel" --timeout 90s >/dev/null || die "the upgraded server Pod is not Ready"
  old=$(K -n "$helm_ns" get pods -l "$sel" -o jsonpath='{.items[0].metadata.name}')
  tkey=$(K -n "$helm_ns" exec "$old" -c server -- /paddock --data-dir /data tenant add helm-kept | tail -1) \
    || die "paddock tenant add in the server Pod failed"
  K -n "$helm_ns" delete pod "$old" --timeout=90s >/dev/null || die "deleting the server Pod failed"
  wait_for 120 "the tenant's key to work on the server's next Pod" \
    curl -sf -H "OPEN-SANDBOX-API-KEY: $tkey" "http://127.0.0.1:$port/v1/sandboxes"
  local new
  new=$(K -n "$helm_ns" get pods -l "$sel" -o jsonpath='{.items[0].metadata.name}')
  [ -n "$new" ] && [ "$new" != "$old" ] || die "no new server Pod after deleting $old"
  info "Pod $old deleted; on $new the tenant added before still has its key"
  kill -- "-$helm_pf" 2>/dev/null; wait "$helm_pf" 2>/dev/null || true; helm_pf=""
  local kept
  kept=$(K -n "$helm_ns" get pvc -l paddock.dev/thread-hash -o name)
  [ "$(wc -w <<<"$kept")" = 1 ] || die "want one workspace PVC after the release, found: $kept"
  info "kept: $kept"

  step "helm: paddock check --no-probe with the server's ServiceAccount token"
  local kc; kc=$(mktemp -p "$scratch_root")
  cat >"$kc" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {certificate-authority: $PKI/ca.crt, server: "https://$NODE_IP:6443"}}]
users: [{name: sa, user: {token: $(K -n "$helm_ns" create token paddock-server --duration 10m)}}]
contexts: [{name: c, context: {cluster: c, user: sa, namespace: $helm_ns}}]
current-context: c
EOF
  out=$(KUBECONFIG=$kc "$rel_bin" --runtime kubernetes --namespace "$helm_ns" check --no-probe 2>&1) || {
    rm -f "$kc"; die "paddock check as the server's ServiceAccount failed: $out"; }
  rm -f "$kc"
  # `warn namespace`: the Role has no `get namespaces` (not needed to run), so check cannot tell
  info "exit 0: $(grep -cE '^ *ok ' <<<"$out") ok, $(grep -cE '^ *warn ' <<<"$out") warn ($(grep -E '^ *warn ' <<<"$out" | awk '{print $2}' | tr '\n' ' '))"

  step "helm: kubectl auth can-i as the server's ServiceAccount"
  local sa=paddock-server n_yes=0 n_no=0 line verb res
  # `kubectl auth can-i create pods/exec` would ask about a Pod named exec: subresources go in --subresource
  while read -r verb res sub; do
    can "$helm_ns" $sa yes "$verb" "$res" $sub -n "$helm_ns"; n_yes=$((n_yes + 1))
    can "$helm_ns" $sa no "$verb" "$res" $sub -n default; n_no=$((n_no + 1))
  done < <(needs NEEDED)
  [ "$n_yes" -ge 17 ] || die "read only $n_yes verbs from check.rs NEEDED"
  while read -r verb res sub; do
    can "$helm_ns" $sa no "$verb" "$res" $sub -n "$helm_ns"; n_no=$((n_no + 1))
  done < <(needs CLAIM_NEEDED)
  for line in "get secrets" "list secrets" "create secrets" "watch secrets" "update pods" "create pods --subresource=attach" "create pods --subresource=ephemeralcontainers" "get pods --subresource=log" \
              "patch persistentvolumeclaims" "create serviceaccounts --subresource=token" "create roles.rbac.authorization.k8s.io" \
              "create rolebindings.rbac.authorization.k8s.io" "patch networkpolicies.networking.k8s.io" \
              "delete resourcequotas" "create configmaps"; do
    # shellcheck disable=SC2086
    can "$helm_ns" $sa no $line -n "$helm_ns"; n_no=$((n_no + 1))
  done
  for line in "list pods -n kube-system" "create pods -n default" "get secrets -n kube-system" "list pods -A" \
              "create namespaces" "delete namespaces" "create clusterroles.rbac.authorization.k8s.io" \
              "create clusterrolebindings.rbac.authorization.k8s.io" "create persistentvolumes" "delete nodes" \
              "create runtimeclasses.node.k8s.io" "get runtimeclasses.node.k8s.io" \
              "create customresourcedefinitions.apiextensions.k8s.io"; do
    # shellcheck disable=SC2086
    can "$helm_ns" $sa no $line; n_no=$((n_no + 1))
  done
  info "server ServiceAccount: $n_yes needed verbs allowed; $n_no others denied (claim verbs, secrets, other namespaces, cluster scope)"
  for line in "list pods" "list persistentvolumeclaims" "patch persistentvolumeclaims" "delete persistentvolumeclaims"; do
    # shellcheck disable=SC2086
    can "$helm_ns" paddock-pvc-reaper yes $line -n "$helm_ns"
  done
  for line in "get pods" "create pods" "create pods --subresource=exec" "create persistentvolumeclaims" "get secrets" "list pods -n default"; do
    # shellcheck disable=SC2086
    can "$helm_ns" paddock-pvc-reaper no -n "$helm_ns" $line   # a -n in $line wins
  done
  info "reaper ServiceAccount: list pods, list/patch/delete PVCs; nothing else"

  step "helm: the egress backstop (a managed-by=paddock Pod cannot reach the API server; the server's labels can)"
  probe() { # probe NAME COMPONENT -> exit status of a TCP connect to the API server's endpoint
    K -n "$helm_ns" run "$1" --image=paddock.local/sandbox:1 --image-pull-policy=Never --restart=Never \
      --labels="app.kubernetes.io/managed-by=paddock,app.kubernetes.io/component=$2" \
      --overrides='{"spec":{"automountServiceAccountToken":false,"securityContext":{"runAsNonRoot":true,"runAsUser":65532,"seccompProfile":{"type":"RuntimeDefault"}},"containers":[{"name":"'"$1"'","image":"paddock.local/sandbox:1","imagePullPolicy":"Never","command":["sh","-c","sleep 3; for i in 1 2 3; do nc -w 3 10.244.0.1 6443 </dev/null && exit 0; sleep 1; done; exit 1"],"securityContext":{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}},"resources":{"limits":{"cpu":"100m","memory":"32Mi"}}}]}}' \
      >/dev/null || die "could not start probe Pod $1"
    wait_for 60 "probe Pod $1 to finish" sh -c "'$BIN/kubectl' -n '$helm_ns' get pod '$1' -o jsonpath='{.status.phase}' | grep -Eq 'Succeeded|Failed'"
    local phase; phase=$(K -n "$helm_ns" get pod "$1" -o jsonpath='{.status.phase}')
    K -n "$helm_ns" delete pod "$1" --wait=false >/dev/null
    [ "$phase" = Succeeded ]
  }
  probe probe-sandbox sandbox && die "a managed-by=paddock Pod reached the API server (10.244.0.1:6443)"
  probe probe-server server || die "a Pod with the server's labels could not reach the API server"
  info "sandbox-labelled Pod: no connection; server-labelled Pod: connected"

  step "helm: paddock gate from a sandbox in the chart's namespace (its Pod Security, quota, LimitRange and backstop apply)"
  "$bin" $serve_args --namespace "$helm_ns" gate "${gate_offline[@]}" || die "paddock gate failed in the chart-installed namespace $helm_ns"

  step "helm: the PVC reaper CronJob, run twice (kubectl create job --from=cronjob/paddock-pvc-reaper)"
  K -n "$helm_ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: helm-unused
  labels: {app.kubernetes.io/managed-by: paddock}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Mi}}
EOF
  reap() { # reap JOB -> its log
    K -n "$helm_ns" create job --from=cronjob/paddock-pvc-reaper "$1" >/dev/null || die "could not create job $1"
    K -n "$helm_ns" wait --for=condition=complete "job/$1" --timeout 120s >/dev/null || {
      K -n "$helm_ns" logs "job/$1" >&2 || true
      die "job $1 did not complete"
    }
    K -n "$helm_ns" logs "job/$1"
  }
  # the kept workspace is unused too, and the TTL here is 2 s: out of the reaper's sight meanwhile
  K -n "$helm_ns" label pvc -l paddock.dev/thread-hash app.kubernetes.io/managed-by=paddock-kept --overwrite >/dev/null
  out=$(reap reap-1)
  info "run 1: $out"
  K -n "$helm_ns" get pvc helm-unused -o jsonpath='{.metadata.annotations}' | grep -q 'paddock.dev/unused-since' \
    || die "run 1 did not mark the unused PVC"
  sleep 3
  out=$(reap reap-2)
  info "run 2: $(tr '\n' ' ' <<<"$out")"
  grep -q "deleted helm-unused" <<<"$out" || die "run 2 did not delete the PVC unused for longer than the TTL"
  K -n "$helm_ns" label pvc -l paddock.dev/thread-hash app.kubernetes.io/managed-by=paddock --overwrite >/dev/null
  local sc; sc=$(K -n "$helm_ns" get job reap-2 -o jsonpath='{.spec.template.spec.containers[0].securityContext}')
  info "the reaper ran with securityContext $sc"

  step "helm: uninstall both; only the kept workspace PVC remains"
  left=$(K -n "$helm_ns" get pods -l paddock.dev/sandbox -o name)
  [ -z "$left" ] || die "sandbox Pods remain after the SDK suite and the release: $left"
  "$HELM" uninstall paddock -n "$helm_ns" --wait --timeout 60s >/dev/null || die "helm uninstall paddock failed"
  "$HELM" uninstall "$helm_infra" -n default --wait --timeout 60s >/dev/null || die "helm uninstall paddock-infra failed"
  local infra_release=$helm_infra; helm_infra=""
  local left kinds=pods,deployments,replicasets,services,secrets,serviceaccounts,roles,rolebindings,networkpolicies,resourcequotas,limitranges,cronjobs,jobs,configmaps,persistentvolumeclaims
  # what the uninstall deleted takes its dependents along (ReplicaSets, Pods, the Jobs made from
  # the CronJob) by garbage collection, a few seconds later
  # (only where these releases put things: other sessions may run Paddock on the same cluster)
  leftovers() {
    local ns
    for ns in "$helm_ns" default; do
      K -n "$ns" get "$kinds" -l app.kubernetes.io/part-of=paddock -o name 2>/dev/null
      K -n "$ns" get "$kinds" -l app.kubernetes.io/managed-by=paddock -o name 2>/dev/null | grep -vxF "$kept" || true
    done
    K get clusterroles,clusterrolebindings,priorityclasses -l "app.kubernetes.io/instance=$infra_release" -o name 2>/dev/null
  }
  local end=$(( $(date +%s) + 90 ))
  while left=$(leftovers) && [ -n "$left" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 1; done
  [ -z "$left" ] || die "helm uninstall left objects of the charts or of Paddock behind (besides the kept workspace PVC): $left"
  K -n "$helm_ns" get "$kept" >/dev/null || die "the kept workspace PVC is gone"
  K get namespace "$helm_ns" >/dev/null || die "the namespace (keepOnUninstall) is gone"
  info "left: namespace $helm_ns (keepOnUninstall) with $kept; nothing else"
  K delete namespace "$helm_ns" --wait=false >/dev/null
  helm_ns=""

  helm_claim "$image" "$rel_bin"
}

# The claim model: paddock-infra with rbac.claimModel, the server with --model claim --warm-pool 1.
# Its start makes the default profile's SandboxTemplate and SandboxWarmPool (so Ready proves the
# claim verbs suffice); a sandbox created through the Service is a SandboxClaim; the uninstall
# (namespace not kept) leaves nothing.
helm_claim() {
  local image=$1 rel_bin=$2 port=18791 key
  helm_ns="paddock-helmc-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
  helm_infra="$helm_ns-infra"
  # Pod Security `restricted` (the chart's default): the server's, the warm pool's and every
  # sandbox Pod must meet it. No workspace here, so no CAP_CHOWN init container (which only
  # `baseline` admits, for provisioners like hostPath that ignore fsGroup).
  step "helm: the claim model under Pod Security restricted (rbac.claimModel, runtime.model=claim, warmPool 1; namespace $helm_ns)"
  "$HELM" install "$helm_infra" "$REPO/charts/paddock-infra" -n default --wait --timeout 60s \
    --set namespace.name="$helm_ns" --set 'apiServer.cidrs={10.96.0.1/32,10.244.0.1/32}' \
    --set namespace.podSecurity=restricted --set rbac.claimModel=true --set pvcReaper.enabled=false >/dev/null \
    || die "helm install paddock-infra (claim) failed"
  while read -r verb res sub; do
    can "$helm_ns" paddock-server yes "$verb" "$res" $sub -n "$helm_ns"
  done < <(needs CLAIM_NEEDED)
  "$HELM" install paddock "$REPO/charts/paddock" -n "$helm_ns" --wait --timeout 120s \
    --set image.repository="${image%:*}" --set image.tag="${image##*:}" --set image.pullPolicy=Never \
    --set runtime.sandboxImagePullPolicy=Never --set runtime.cpuRequest=0.01 --set runtime.chownWorkspace=false \
    --set runtime.model=claim --set runtime.warmPool=1 >/dev/null || {
    K -n "$helm_ns" logs deploy/paddock --tail 30 >&2 || true
    die "helm install paddock (claim model) failed"
  }
  [ "$(K get namespace "$helm_ns" -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}')" = restricted ] \
    || die "namespace $helm_ns does not enforce Pod Security restricted"
  K -n "$helm_ns" get sandboxwarmpools.extensions.agents.x-k8s.io -o name | grep -q . \
    || die "the claim-model server made no SandboxWarmPool"
  key=$(K -n "$helm_ns" get secret paddock-api-key -o jsonpath='{.data.api-key}' | base64 -d)
  forward "$helm_ns" "$port"
  wait_for 30 "the port-forward to the claim-model server" curl -sf "http://127.0.0.1:$port/health"
  PADDOCK_BIN=$rel_bin PADDOCK_E2E_IMAGE=paddock.local/sandbox:1 PADDOCK_E2E_URL="127.0.0.1:$port" \
    PADDOCK_E2E_API_KEY="$key" "$REPO/e2e/run" -k "${PADDOCK_HELM_CLAIM_E2E:-test_lifecycle}" \
    || die "the SDK tests through the claim-model server failed"
  step "helm: paddock gate from a sandbox under Pod Security restricted"
  "$bin" --runtime kubernetes --image-pull-policy Never --cpu-request 0.01 --namespace "$helm_ns" gate "${gate_offline[@]}" \
    || die "paddock gate failed in the restricted namespace $helm_ns"
  kill -- "-$helm_pf" 2>/dev/null; wait "$helm_pf" 2>/dev/null || true; helm_pf=""
  "$HELM" uninstall paddock -n "$helm_ns" --wait --timeout 60s >/dev/null || die "helm uninstall paddock (claim) failed"
  "$HELM" uninstall "$helm_infra" -n default --wait --timeout 60s >/dev/null || die "helm uninstall paddock-infra (claim) failed"
  helm_infra=""
  wait_for 120 "namespace $helm_ns to be deleted (keepOnUninstall false)" sh -c "! '$BIN/kubectl' get namespace '$helm_ns'"
  [ -z "$(K get clusterroles,clusterrolebindings,priorityclasses -l "app.kubernetes.io/instance=$helm_ns-infra" -o name)" ] || die "cluster-scoped chart objects remain"
  [ -z "$(K -n default get all -l "app.kubernetes.io/instance=$helm_ns-infra" -o name)" ] || die "chart objects remain in default"
  info "claim model: server Ready with a warm pool, SDK tests passed, uninstall removed the namespace"
  helm_ns=""
}
