"""Tenants, from a user's side: keys made with `paddock tenant add` on a running server's data
directory work at once with the unmodified SDK, in both connection modes; a tenant sees none
of another's sandboxes; a quota refuses with 429 naming itself; a removed tenant's key stops."""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta

import pytest
from conftest import EXTERNAL, IMAGE, MODES, PADDOCK_BIN, PaddockServer, run_ok
from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="adds tenants on the server's data directory")


@pytest.fixture(scope="module")
def tenant_server():
    s = PaddockServer("tenants")
    try:
        s.start()
        yield s
    finally:
        s.cleanup()


def tenant(server: PaddockServer, *args: str) -> str:
    """`paddock tenant ...` on the server's data directory; the key is its last line."""
    done = subprocess.run(
        [str(PADDOCK_BIN), "--data-dir", str(server.data_dir), "tenant", *args],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def config(server: PaddockServer, key: str, mode: str) -> ConnectionConfigSync:
    return ConnectionConfigSync(
        domain=server.domain, api_key=key, use_server_proxy=(mode == "proxy"),
        request_timeout=timedelta(seconds=60),
    )


def create(cfg: ConnectionConfigSync) -> SandboxSync:
    return SandboxSync.create(IMAGE, connection_config=cfg, timeout=timedelta(minutes=10),
                              ready_timeout=timedelta(seconds=30))


@pytest.mark.parametrize("mode", MODES)
def test_a_tenant_sees_and_touches_only_its_own_sandboxes(tenant_server, mode):
    ka = tenant(tenant_server, "add", f"alpha-{mode}")
    kb = tenant(tenant_server, "add", f"beta-{mode}")
    assert ka.startswith("pdk_") and kb.startswith("pdk_") and ka != kb
    a, b = config(tenant_server, ka, mode), config(tenant_server, kb, mode)
    sa = create(a)
    try:
        # The key printed a moment ago works on its first request, commands included.
        assert run_ok(sa, "echo alpha") == ["alpha"]
        # Tenant B finds nothing of it: not by id, not in a list, not to kill.
        with pytest.raises(SandboxApiException) as ei:
            SandboxSync.connect(sa.id, connection_config=b)
        assert ei.value.status_code == 404, ei.value
        manager = SandboxManagerSync.create(b)
        try:
            ids = {i.id for i in manager.list_sandbox_infos(SandboxFilter(page_size=200)).sandbox_infos}
            assert sa.id not in ids
            with pytest.raises(SandboxApiException) as ei:
                manager.kill_sandbox(sa.id)
            assert ei.value.status_code == 404
        finally:
            manager.close()
        # Nor does the server's own key, which is the default tenant.
        own = SandboxManagerSync.create(tenant_server.config(mode))
        try:
            ids = {i.id for i in own.list_sandbox_infos(SandboxFilter(page_size=200)).sandbox_infos}
            assert sa.id not in ids
        finally:
            own.close()
        # A's sandbox is untouched and still A's.
        assert run_ok(sa, "echo still") == ["still"]
        mine = SandboxManagerSync.create(a)
        try:
            ids = {i.id for i in mine.list_sandbox_infos(SandboxFilter(page_size=200)).sandbox_infos}
            assert sa.id in ids
        finally:
            mine.close()
    finally:
        sa.kill()
        sa.close()


def test_a_quota_refuses_with_429_and_a_removed_tenant_is_locked_out(tenant_server):
    k = tenant(tenant_server, "add", "gamma", "--max-sandboxes", "1")
    cfg = config(tenant_server, k, "proxy")
    first = create(cfg)
    try:
        with pytest.raises(Exception) as ei:
            create(cfg)
        status = getattr(ei.value, "status_code", None)
        text = f"{ei.value!r} {getattr(ei.value, 'response_body', '')!r}"
        assert status == 429 or "429" in text, text
        assert "quota sandboxes" in text, text
        # Raising the quota takes effect on the running server within its reload interval.
        tenant(tenant_server, "set", "gamma", "--max-sandboxes", "2")
        deadline = time.monotonic() + 10
        while True:
            try:
                second = create(cfg)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        second.kill()
        second.close()
    finally:
        first.kill()
        first.close()
    tenant(tenant_server, "rm", "gamma")
    deadline = time.monotonic() + 10
    while True:
        manager = SandboxManagerSync.create(cfg)
        try:
            manager.list_sandbox_infos(SandboxFilter(page_size=10))
        except SandboxApiException as e:
            assert e.status_code == 401, e
            break
        finally:
            manager.close()
        assert time.monotonic() < deadline, "a removed tenant's key still works after 10 s"
        time.sleep(0.5)


def test_the_cli_lists_tenants_without_keys(tenant_server):
    k = tenant(tenant_server, "add", "delta", "--max-memory", "4GiB", "--max-runs", "batch=3")
    listed = subprocess.run(
        [str(PADDOCK_BIN), "--data-dir", str(tenant_server.data_dir), "tenant", "ls"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert "delta" in listed and "memory 4GiB" in listed and "runs.batch 3" in listed, listed
    assert k not in listed and k[4:20] not in listed
    # Nothing of the key is in the database file: only its digest.
    for f in tenant_server.data_dir.glob("server.db*"):
        assert k[4:].encode() not in f.read_bytes(), f
