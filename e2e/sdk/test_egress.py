"""Egress policy through the real SDK: `network_policy=` at create, `get_egress_policy`,
`patch_egress_rules`, `delete_egress_rules`, against a private outside world
(e2e/egress_world.py: a network namespace with DNS, HTTP and HTTPS servers and a test CA),
never a real outside host. A server of its own resolves with that world's DNS and lets
sandboxes reach its two addresses (a private range, refused otherwise)."""

from __future__ import annotations

import json

import pytest
from opensandbox import SandboxSync
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

from conftest import PaddockServer, capabilities, egress_world, out, run_ok, sandboxes_on

NET = "10.77.61"


@pytest.fixture(scope="module")
def world():
    with egress_world("e", NET) as info:
        yield info


@pytest.fixture(scope="module")
def egress_server(world):
    s = PaddockServer(
        "egress",
        ["--egress-dns", world["dns"], "--egress-allow-private", f"{world['ip']}/32",
         "--egress-allow-private", f"{world['raw_ip']}/32"],
    )
    try:
        s.start()
        if "domain-rules" not in capabilities(s).get("network", []):
            pytest.skip("this runtime does not enforce domain rules")
        yield s
    finally:
        s.cleanup()


@pytest.fixture
def make(egress_server, mode):
    with sandboxes_on(egress_server, mode) as create:
        yield create


def curl(sb: SandboxSync, args: str) -> tuple[int | None, list[str]]:
    ex = sb.commands.run(f"curl -sS -m 10 {args}; echo exit=$?")
    lines = out(ex)
    text = "".join(lines)
    code = int(text.rsplit("exit=", 1)[1].strip()) if "exit=" in text else None
    return code, lines


def test_a_policy_given_at_create_is_enforced_and_changed_through_the_sdk(make, world):
    sb = make(network_policy=NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="allowed.test")]))
    assert run_ok(sb, "id -u") == ["1000"]
    sb.files.write_file("/tmp/ca.pem", world["ca_pem"])

    code, lines = curl(sb, "--cacert /tmp/ca.pem https://allowed.test/")
    assert code == 0 and "hello from outside host=allowed.test sni=allowed.test" in "".join(lines), lines
    code, _ = curl(sb, "--cacert /tmp/ca.pem https://denied.test/")
    assert code == 6, "a denied name must not resolve"

    policy = sb.get_egress_policy()
    assert policy.default_action == "deny"
    assert [(r.action, r.target) for r in policy.egress] == [("allow", "allowed.test")]

    # A patch flips allowed and denied for the next connection, without a restart.
    sb.patch_egress_rules([NetworkRule(action="deny", target="allowed.test"), NetworkRule(action="allow", target="denied.test")])
    code, lines = curl(sb, "--cacert /tmp/ca.pem https://denied.test/")
    assert code == 0 and "host=denied.test" in "".join(lines), lines
    code, _ = curl(sb, "https://allowed.test/")
    assert code == 6

    sb.delete_egress_rules(["denied.test"])
    assert [(r.action, r.target) for r in sb.get_egress_policy().egress] == [("deny", "allowed.test")]
    code, _ = curl(sb, "https://denied.test/")
    assert code == 6


def test_a_denied_plain_http_request_is_told_why_and_the_operator_sees_it(make, world, egress_server):
    sb = make(network_policy=NetworkPolicy(default_action="allow", egress=[NetworkRule(action="deny", target=world["raw_ip"])]))
    code, lines = curl(sb, f"-w ' %{{http_code}}' http://{world['raw_ip']}/")
    text = "".join(lines)
    assert code == 0 and "403" in text and "egress policy denied" in text, text
    code, lines = curl(sb, "http://allowed.test/")
    assert code == 0 and "hello from outside" in "".join(lines)
    # Paddock's view: counters and the deny log; /metrics counts it per sandbox.
    import urllib.request

    req = urllib.request.Request(
        f"{egress_server.base_url}/v1/sandboxes/{sb.id}/egress", headers={"OPEN-SANDBOX-API-KEY": egress_server.api_key}
    )
    status = json.load(urllib.request.urlopen(req, timeout=10))
    assert status["counters"]["connections_denied"] >= 1, status
    assert any(world["raw_ip"] in d["target"] and "egress rule 0" in d["reason"] for d in status["denials"]), status
    metrics = urllib.request.urlopen(f"{egress_server.base_url}/metrics", timeout=10).read().decode()
    assert f'paddock_egress_connections_total{{sandbox="{sb.id}",verdict="denied"}}' in metrics


def test_without_a_policy_a_sandbox_has_no_network_and_no_dns(make, world):
    sb = make()
    assert sb.get_egress_policy().default_action == "deny"
    code, _ = curl(sb, f"http://{world['ip']}/")
    assert code != 0
    code, _ = curl(sb, "http://allowed.test/")
    assert code == 6
