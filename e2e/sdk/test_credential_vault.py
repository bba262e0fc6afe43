"""The credential vault through the unmodified SDK (`sandbox.credential_vault`), against a
private outside world (e2e/egress_world.py: a network namespace with an echo server that
answers what it received, and a test CA), never a real outside host. The shape is
OpenSandbox's own end-to-end test: the sandbox calls with no secret, the echo server sees each
auth type injected; a runtime change adds, replaces and deletes a binding. Then what only a
credential proxy that decrypts can show: https injection for a bound host, every other host
left opaque, a Host that is not the connection's refused, placeholders resolved only where a
binding matches, and no secret anywhere inside the sandbox."""

from __future__ import annotations

import hashlib
import json

import pytest
from opensandbox import SandboxSync
from opensandbox.models.sandboxes import CredentialProxyConfig, NetworkPolicy, NetworkRule

from conftest import PaddockServer, capabilities, egress_world, out, run_ok, sandboxes_on

NET = "10.77.63"
# OpenSandbox's own test host, resolved by the operator's --egress-host (no resolver names it).
HOST = "credential-vault-e2e.opensandbox.test"
SECRETS = {
    "bearer-token": "vault-bearer-token",
    "basic-token": "dXNlcjpwYXNz",
    "api-key-token": "vault-api-key-token",
    "client-id": "vault-client-id",
    "client-secret": "vault-client-secret",
}


@pytest.fixture(scope="module")
def world():
    with egress_world("v", NET) as info:
        yield info


@pytest.fixture(scope="module")
def vault_server(world):
    s = PaddockServer(
        "vault",
        ["--egress-dns", world["dns"], "--egress-allow-private", f"{world['ip']}/32",
         "--egress-allow-private", f"{world['raw_ip']}/32", "--egress-host", f"{HOST}={world['raw_ip']}",
         "--egress-ca", world["ca"]],
    )
    try:
        s.start()
        if not capabilities(s).get("credentialVault", capabilities(s).get("credential_vault")):
            pytest.skip("this runtime has no credential vault")
        yield s
    finally:
        s.cleanup()


@pytest.fixture
def make(vault_server, mode):
    with sandboxes_on(vault_server, mode) as create:
        yield create


def fetch(sb: SandboxSync, args: str) -> dict | str:
    ex = sb.commands.run(f"curl -sS -m 10 {args}")
    text = "".join(out(ex))
    try:
        return json.loads(text)
    except ValueError:
        return text


def sha(v: str) -> str:
    return hashlib.sha256(v.encode()).hexdigest()


def confined(sb: SandboxSync) -> None:
    assert run_ok(sb, "id -u") == ["1000"]
    assert run_ok(sb, "grep CapEff /proc/self/status") == ["CapEff:\t0000000000000000"]


def no_secret_inside(sb: SandboxSync, secrets) -> None:
    # The middle character in a bracket expression: neither the command line nor grep's own
    # (read back through /proc) holds a match.
    for s in secrets:
        k = len(s) // 2
        found = run_ok(
            sb,
            f"a='{s[:k]}'; c='{s[k]}'; b='{s[k + 1:]}'; "
            "(env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline; cat /run/paddock/* /tmp/* 2>/dev/null) "
            "2>/dev/null | tr '\\0' '\\n' | grep -c \"$a[$c]$b\" || true",
        )
        assert found == ["0"], f"a secret is inside the sandbox: {found}"


def test_every_auth_type_is_injected_and_a_change_adds_replaces_and_deletes(make, world, vault_server):
    sb = make(network_policy=NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target=HOST)]))
    confined(sb)
    match = lambda path: {"schemes": ["http"], "hosts": [HOST], "methods": ["GET"], "paths": [path]}  # noqa: E731
    state = sb.credential_vault.create(
        credentials=[{"name": n, "source": {"value": v}} for n, v in SECRETS.items()],
        bindings=[
            {"name": "bearer", "match": match("/echo/bearer"), "auth": {"type": "bearer", "credential": "bearer-token"}},
            {"name": "basic", "match": match("/echo/basic"), "auth": {"type": "basic", "credential": "basic-token"}},
            {"name": "api-key", "match": match("/echo/api-key"),
             "auth": {"type": "apiKey", "name": "X-Api-Key", "credential": "api-key-token"}},
            {"name": "custom-headers", "match": match("/echo/custom-headers"),
             "auth": {"type": "customHeaders", "headers": [{"name": "X-Client-Id", "credential": "client-id"},
                                                            {"name": "X-Client-Secret", "credential": "client-secret"}]}},
        ],
    )
    assert state.revision == 1
    shown = json.dumps(sb.credential_vault.get().model_dump(mode="json"))
    assert not any(v in shown for v in SECRETS.values()), shown
    assert {b.auth.type for b in state.bindings} == {"bearer", "basic", "apiKey", "customHeaders"}
    # Each part alone, as the SDK reads it: names, revisions and auth types, never a value.
    assert sorted(c.name for c in sb.credential_vault.list_credentials()) == sorted(SECRETS)
    one = sb.credential_vault.get_credential("client-id")
    assert (one.name, one.revision) == ("client-id", 1), one
    assert sorted(b.name for b in sb.credential_vault.list_bindings()) == ["api-key", "basic", "bearer", "custom-headers"]
    assert sb.credential_vault.get_binding("api-key").auth.type == "apiKey"
    with pytest.raises(Exception) as missing:
        sb.credential_vault.get_binding("no-such-binding")
    assert "404" in str(missing.value) or "not found" in str(missing.value).lower(), missing.value

    got = fetch(sb, f"-H 'Authorization: Bearer made-up' http://{HOST}/echo/bearer")
    # The upstream got the vault's value, not the sandbox's; echoed back, it is overwritten.
    assert got["digests"]["authorization"] == sha("Bearer vault-bearer-token"), got
    assert got["headers"]["authorization"] == "Bearer " + "*" * len("vault-bearer-token"), got
    # A client that takes compressed answers gets a plain one, searched like any other.
    got = fetch(sb, f"--compressed http://{HOST}/echo/bearer")
    assert got["headers"]["authorization"] == "Bearer " + "*" * len("vault-bearer-token"), got
    assert got["headers"]["accept-encoding"] == "identity", got
    # An upstream that compresses although asked for identity: decompressed, searched, masked.
    got = fetch(sb, f"'http://{HOST}/echo/bearer?force=gzip'")
    assert got["headers"]["authorization"] == "Bearer " + "*" * len("vault-bearer-token"), got
    # A coding the proxy cannot undo is refused rather than passed unread (a 502 saying why).
    text = fetch(sb, f"-w ' %{{http_code}}' 'http://{HOST}/echo/bearer?force=br'")
    assert isinstance(text, str) and text.endswith(" 502") and '"br"' in text, text
    assert "vault-bearer-token" not in text, text
    assert fetch(sb, f"http://{HOST}/echo/basic")["digests"]["authorization"] == sha("Basic dXNlcjpwYXNz")
    assert fetch(sb, f"http://{HOST}/echo/api-key")["digests"]["x-api-key"] == sha("vault-api-key-token")
    d = fetch(sb, f"http://{HOST}/echo/custom-headers")["digests"]
    assert (d["x-client-id"], d["x-client-secret"]) == (sha("vault-client-id"), sha("vault-client-secret"))
    # A path no binding matches gets nothing.
    assert "authorization" not in fetch(sb, f"http://{HOST}/echo/other")["headers"]
    no_secret_inside(sb, SECRETS.values())

    # A runtime change, OpenSandbox's sequence: add, replace, delete, each at the next revision.
    s2 = sb.credential_vault.patch(
        expected_revision=1,
        credentials={"add": [{"name": "runtime-token", "source": {"value": "vault-runtime-token"}}]},
        bindings={"add": [{"name": "runtime-added", "match": match("/echo/runtime"),
                           "auth": {"type": "apiKey", "name": "X-Runtime-Token", "credential": "runtime-token"}}]},
    )
    assert s2.revision == 2
    assert fetch(sb, f"http://{HOST}/echo/runtime")["digests"]["x-runtime-token"] == sha("vault-runtime-token")
    s3 = sb.credential_vault.patch(
        expected_revision=2,
        credentials={"replace": [{"name": "runtime-token", "source": {"value": "vault-runtime-token-replaced"}}]},
    )
    assert s3.revision == 3
    assert fetch(sb, f"http://{HOST}/echo/runtime")["digests"]["x-runtime-token"] == sha("vault-runtime-token-replaced")
    # A stale revision changes nothing.
    with pytest.raises(Exception) as stale:
        sb.credential_vault.patch(expected_revision=2, bindings={"delete": ["runtime-added"]})
    assert "409" in str(stale.value) or "revision" in str(stale.value).lower(), stale.value
    s4 = sb.credential_vault.patch(expected_revision=3, bindings={"delete": ["runtime-added"]})
    assert s4.revision == 4 and "runtime-added" not in [b.name for b in s4.bindings]
    assert "x-runtime-token" not in fetch(sb, f"http://{HOST}/echo/runtime")["headers"]
    sb.credential_vault.delete()
    assert "authorization" not in fetch(sb, f"http://{HOST}/echo/bearer")["headers"]
    # Nothing of a value is in the server's data directory in clear: not its logs, its
    # database, the sandbox's record or the enforcer's log (the vault is sealed).
    for path in [*vault_server.data_dir.rglob("*"), vault_server.log_path]:
        if path.is_file() and not path.is_symlink() and path.stat().st_size < (64 << 20):
            data = path.read_bytes()
            assert not any(v.encode() in data for v in SECRETS.values()), f"a secret is in {path} in clear"


def test_a_bound_host_must_be_allowed_and_placeholders_resolve_only_where_bound(make, world):
    sb = make(network_policy=NetworkPolicy(default_action="deny", egress=[
        NetworkRule(action="allow", target=HOST), NetworkRule(action="allow", target="other.test")]))
    confined(sb)
    with pytest.raises(Exception) as refused:
        sb.credential_vault.create(
            credentials=[{"name": "t", "source": {"value": "vault-t"}}],
            bindings=[{"name": "b", "match": {"schemes": ["http"], "hosts": ["denied.test"]},
                       "auth": {"type": "bearer", "credential": "t"}}],
        )
    assert "400" in str(refused.value) or "egress policy" in str(refused.value), refused.value
    sb.credential_vault.create(
        credentials=[{"name": "t", "source": {"value": "vault-placeholder-value"}},
                     {"name": "r", "source": {"value": "vault-redirect-token"}}],
        bindings=[{"name": "b", "match": {"schemes": ["http"], "hosts": [HOST], "paths": ["/echo/*"]},
                   "auth": {"type": "passthrough"}},
                  {"name": "r", "match": {"schemes": ["http"], "hosts": [HOST], "paths": ["/redirect"]},
                   "auth": {"type": "bearer", "credential": "r"}}],
    )
    # A redirect to another host: the injected header does not follow it.
    got = fetch(sb, f"-L 'http://{HOST}/redirect?to=http%3A%2F%2Fother.test%2Fecho%2Fr'")
    assert got["path"] == "/echo/r" and "authorization" not in got["headers"], got
    got = fetch(sb, f"-H 'X-Token: paddock:secret:t' 'http://{HOST}/echo/p?k=paddock:secret:t'")
    assert got["digests"]["x-token"] == sha("vault-placeholder-value"), got
    assert got["path"] == "/echo/p?k=" + "*" * len("vault-placeholder-value"), got
    # The same placeholder to a host no binding matches is refused, never sent.
    text = fetch(sb, f"-w ' %{{http_code}}' -H 'X-Token: paddock:secret:t' http://other.test/echo/p")
    assert isinstance(text, str) and text.endswith(" 403") and "placeholder" in text, text


def test_https_is_decrypted_only_for_a_bound_host(make, world):
    sb = make(
        network_policy=NetworkPolicy(default_action="deny", egress=[
            NetworkRule(action="allow", target="allowed.test"), NetworkRule(action="allow", target="other.test")]),
        credential_proxy=CredentialProxyConfig(enabled=True),
    )
    confined(sb)
    # The sandbox trusts its own CA through the usual variables; its key is not inside.
    env = dict(line.split("=", 1) for line in run_ok(sb, "env") if "=" in line)
    assert env.get("SSL_CERT_FILE") == "/run/paddock/ca-bundle.pem", env
    assert env.get("NODE_EXTRA_CA_CERTS") == "/run/paddock/ca.pem", env
    assert run_ok(sb, "grep -c 'PRIVATE KEY' /run/paddock/* || true") == ["/run/paddock/ca-bundle.pem:0", "/run/paddock/ca.pem:0"]
    assert run_ok(sb, "touch /run/paddock/x 2>/dev/null && echo wrote || echo refused") == ["refused"]
    sb.credential_vault.create(
        credentials=[{"name": "t", "source": {"value": "vault-https-token"}}],
        bindings=[{"name": "b", "match": {"hosts": ["allowed.test"]}, "auth": {"type": "bearer", "credential": "t"}}],
    )
    got = fetch(sb, "https://allowed.test/echo/x")
    assert got["digests"]["authorization"] == sha("Bearer vault-https-token"), got
    assert got["sni"] == "allowed.test", got
    # Only HTTP/1.1 is offered on a decrypted connection: no HTTP/2 to coalesce hosts on.
    assert run_ok(sb, "curl -sS --http2 -o /dev/null -w '%{http_version}' https://allowed.test/echo/x") == ["1.1"]
    # other.test is not bound: its TLS is the world's own, end to end (the sandbox's CA did not
    # sign it, so curl trusting only that CA fails), and nothing is added.
    assert "certificate" in str(fetch(sb, "--cacert /run/paddock/ca.pem https://other.test/echo/x 2>&1")).lower()
    run_ok(sb, "cat > /tmp/world-ca.pem <<'EOF'\n" + open(world["ca"]).read() + "EOF")
    got = fetch(sb, "--cacert /tmp/world-ca.pem https://other.test/echo/x")
    assert "authorization" not in got["headers"], got
    # The SNI of the bound host with the Host of another: refused on the decrypted connection.
    text = fetch(sb, "-w ' %{http_code}' -H 'Host: other.test' https://allowed.test/echo/x")
    assert isinstance(text, str) and text.endswith(" 403"), text
    no_secret_inside(sb, ["vault-https-token"])


def test_a_vault_given_at_create_is_in_force_from_the_first_request(make, world, vault_server):
    # The unmodified SDK sends it as an extension; Paddock's own field is the same JSON.
    vault = {
        "credentials": [{"name": "t", "source": {"type": "inline", "value": "vault-at-create-token"}}],
        "bindings": [{"name": "b", "match": {"schemes": ["http"], "hosts": [HOST], "paths": ["/echo/at-create"]},
                      "auth": {"type": "bearer", "credential": "t"}}],
    }
    sb = make(
        network_policy=NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target=HOST)]),
        extensions={"paddock.credentialVault": json.dumps(vault)},
    )
    confined(sb)
    got = fetch(sb, f"http://{HOST}/echo/at-create")
    assert got["digests"]["authorization"] == sha("Bearer vault-at-create-token"), got
    assert sb.credential_vault.get().revision == 1
    # The value is kept nowhere the API shows: not the sandbox's extensions, not its vault.
    info = json.dumps(sb.get_info().model_dump(mode="json"))
    assert "vault-at-create-token" not in info and "paddock.credentialVault" not in info, info
    no_secret_inside(sb, ["vault-at-create-token"])
    # A vault the sandbox's egress does not allow is refused before anything is made.
    bad = dict(vault, bindings=[dict(vault["bindings"][0], match={"schemes": ["http"], "hosts": ["other.test"]})])
    with pytest.raises(Exception) as refused:
        make(network_policy=NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target=HOST)]),
             extensions={"paddock.credentialVault": json.dumps(bad)})
    assert "400" in str(refused.value) or "other.test" in str(refused.value), refused.value
