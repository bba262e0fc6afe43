"""Lifecycle API through the real SDK: create, get_info, metadata, renew, kill, list,
connect, auth. Every test runs in direct and server-proxy mode (fixture `mode`)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from conftest import IMAGE, out, run_ok
from opensandbox import Sandbox, SandboxSync
from opensandbox.config import ConnectionConfig
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync


def _now() -> datetime:
    return datetime.now(timezone.utc)


def test_create_and_get_info(make_sandbox):
    sb = make_sandbox(timeout=timedelta(minutes=5), metadata={"tag": "e2e-create"})
    assert isinstance(sb.id, str) and sb.id
    assert sb.is_healthy() is True

    info = sb.get_info()
    assert info.id == sb.id
    assert info.status.state == "Running", info.status
    # The SDK always sends its default entrypoint; OpenSandbox's own e2e checks it comes back.
    assert info.entrypoint[-3:] == ["tail", "-f", "/dev/null"], info.entrypoint
    assert info.metadata is not None and info.metadata.get("tag") == "e2e-create", info.metadata
    assert info.created_at is not None and info.expires_at is not None
    lifetime = info.expires_at - info.created_at
    assert timedelta(minutes=4) <= lifetime <= timedelta(minutes=6), lifetime
    assert abs(_now() - info.created_at) < timedelta(minutes=1), info.created_at

    # The sandbox really runs commands, as the host image's unprivileged user.
    assert run_ok(sb, "echo created-ok") == ["created-ok"]


def test_create_without_timeout_never_expires(make_sandbox):
    # `timeout=None` (sent as null) is the SDK's "until deleted": no expiry, which `paddock
    # serve` allows by default (--allow-no-expiry). GET shows no expiresAt.
    sb = make_sandbox(timeout=None)
    info = sb.get_info()
    assert info.status.state == "Running"
    assert info.expires_at is None, info.expires_at


def test_metadata_round_trip_and_merge_patch(make_sandbox):
    run = uuid.uuid4().hex[:12]
    sb = make_sandbox(metadata={"team": "e2e", "run": run, "keep": "yes"})
    assert sb.get_info().metadata == {"team": "e2e", "run": run, "keep": "yes"}

    patched = sb.patch_metadata({"team": None, "stage": "two", "keep": "changed"})
    expected = {"run": run, "stage": "two", "keep": "changed"}
    assert patched.id == sb.id
    assert patched.metadata == expected, patched.metadata
    assert sb.get_info().metadata == expected


def test_renew_sets_remaining_time(make_sandbox):
    sb = make_sandbox(timeout=timedelta(minutes=5))
    before = sb.get_info()

    resp = sb.renew(timedelta(minutes=20))
    assert resp.expires_at > before.expires_at
    remaining = resp.expires_at - _now()
    assert timedelta(minutes=19) < remaining <= timedelta(minutes=20, seconds=5), remaining

    after = sb.get_info()
    assert abs((after.expires_at - resp.expires_at).total_seconds()) < 2
    remaining = after.expires_at - _now()
    assert timedelta(minutes=18) < remaining < timedelta(minutes=22), remaining

    # Shortening is allowed too (the SDK documents it; the 1.1.1 server does it).
    resp = sb.renew(timedelta(minutes=3))
    remaining = sb.get_info().expires_at - _now()
    assert timedelta(minutes=2) < remaining < timedelta(minutes=4), remaining


def test_kill_then_get_info_is_404(make_sandbox, conn):
    sb = make_sandbox()
    sid = sb.id
    sb.kill()

    with pytest.raises(SandboxApiException) as ei:
        sb.get_info()
    assert ei.value.status_code == 404, f"{ei.value!r} status={ei.value.status_code} body={ei.value.response_body!r}"
    # OpenSandbox echoes/generates X-Request-ID on errors; the SDK surfaces it.
    assert ei.value.request_id, "no X-Request-ID on the 404 response"

    manager = SandboxManagerSync.create(conn)
    try:
        ids = {i.id for i in manager.list_sandbox_infos(SandboxFilter(page_size=200)).sandbox_infos}
        assert sid not in ids
        with pytest.raises(SandboxApiException) as ei:
            manager.kill_sandbox(sid)
        assert ei.value.status_code == 404
    finally:
        manager.close()


def test_unknown_sandbox_is_404(conn):
    manager = SandboxManagerSync.create(conn)
    try:
        with pytest.raises(SandboxApiException) as ei:
            manager.get_sandbox_info("does-not-exist-" + uuid.uuid4().hex[:8])
        assert ei.value.status_code == 404
        assert ei.value.error.code, "error body should be {code, message}"
    finally:
        manager.close()


def test_manager_list_filters_by_state_and_metadata(make_sandbox, conn):
    suite = uuid.uuid4().hex[:12]
    a = make_sandbox(metadata={"suite": suite, "role": "a"})
    b = make_sandbox(metadata={"suite": suite, "role": "b"})
    other = make_sandbox(metadata={"suite": "other-" + suite, "role": "a"})

    manager = SandboxManagerSync.create(conn)
    try:
        def ids(**kw):
            page = manager.list_sandbox_infos(SandboxFilter(page_size=200, **kw))
            return {i.id: i for i in page.sandbox_infos}

        everyone = ids()
        assert {a.id, b.id, other.id} <= set(everyone), set(everyone)

        by_suite = ids(metadata={"suite": suite})
        assert set(by_suite) == {a.id, b.id}
        for info in by_suite.values():
            assert info.status.state == "Running"
            assert info.metadata["suite"] == suite

        assert set(ids(metadata={"suite": suite, "role": "a"})) == {a.id}
        assert set(ids(states=["Running"], metadata={"suite": suite})) == {a.id, b.id}
        assert set(ids(states=["Paused"], metadata={"suite": suite})) == set()
        assert set(ids(states=["Paused", "Running"], metadata={"suite": suite})) == {a.id, b.id}

        b.kill()
        assert set(ids(metadata={"suite": suite})) == {a.id}
    finally:
        manager.close()


def test_connect_to_existing_sandbox(make_sandbox, conn):
    sb = make_sandbox()
    sb.files.write_file("/tmp/connect-marker.txt", "from-the-first-client")

    sb2 = SandboxSync.connect(sb.id, connection_config=conn)
    try:
        assert sb2.id == sb.id
        assert sb2.is_healthy() is True
        ex = sb2.commands.run("echo connect-ok")
        assert ex.error is None and ex.exit_code == 0
        assert out(ex) == ["connect-ok"]
        assert sb2.files.read_file("/tmp/connect-marker.txt") == "from-the-first-client"
        assert sb2.get_info().id == sb.id
    finally:
        sb2.close()


def test_connect_to_unknown_sandbox_fails(conn):
    with pytest.raises(SandboxException):
        SandboxSync.connect(
            "does-not-exist-" + uuid.uuid4().hex[:8],
            connection_config=conn,
            connect_timeout=timedelta(seconds=5),
        )


def test_wrong_api_key_is_rejected(server, mode):
    bad = server.config(mode).model_copy(update={"api_key": "wrong-" + uuid.uuid4().hex})
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(IMAGE, connection_config=bad, ready_timeout=timedelta(seconds=10))
    assert ei.value.status_code == 401, repr(ei.value)

    manager = SandboxManagerSync.create(bad)
    try:
        with pytest.raises(SandboxApiException) as ei:
            manager.list_sandbox_infos(SandboxFilter())
        assert ei.value.status_code == 401
    finally:
        manager.close()


def test_async_sdk_basic_flow(server, mode):
    """The async client (`opensandbox.Sandbox`) does the same basic flow."""

    async def flow():
        cfg = ConnectionConfig(
            domain=server.domain,
            api_key=server.api_key,
            use_server_proxy=(mode == "proxy"),
            request_timeout=timedelta(seconds=60),
        )
        sb = await Sandbox.create(IMAGE, connection_config=cfg, timeout=timedelta(minutes=5))
        try:
            ex = await sb.commands.run("echo hello; echo oops 1>&2; exit 5")
            assert [m.text for m in ex.logs.stdout] == ["hello"]
            assert [m.text for m in ex.logs.stderr] == ["oops"]
            assert ex.exit_code == 5 and ex.error is not None
            data = bytes(range(256)) * 16
            await sb.files.write_file("/tmp/async.bin", data)
            assert await sb.files.read_bytes("/tmp/async.bin") == data
            assert (await sb.get_info()).status.state == "Running"
            await sb.kill()
            with pytest.raises(SandboxApiException) as ei:
                await sb.get_info()
            assert ei.value.status_code == 404
        finally:
            try:
                await sb.kill()
            except SandboxException:
                pass
            await sb.close()

    asyncio.run(flow())


def test_execd_endpoint_needs_credentials(make_sandbox, server, mode):
    """Knowing a sandbox id is not enough to run commands in it: the execd endpoint needs
    the endpoint's own headers (direct mode) or the API key (proxy mode), and one
    sandbox's credentials do not open another sandbox."""
    import httpx

    a = make_sandbox()
    b = make_sandbox()
    ep_a, ep_b = a.get_endpoint(44772), b.get_endpoint(44772)
    cred_a = dict(ep_a.headers or {})
    if mode == "proxy":
        cred_a["OPEN-SANDBOX-API-KEY"] = server.api_key
    body = {"command": "echo reached"}

    with httpx.Client(timeout=30) as http:
        ok = http.post(f"http://{ep_a.endpoint}/command", json=body, headers=cred_a)
        assert ok.status_code == 200 and "reached" in ok.text, (ok.status_code, ok.text[:300])

        bare = http.post(f"http://{ep_a.endpoint}/command", json=body)
        assert bare.status_code in (401, 403), (bare.status_code, bare.text[:300])
        assert "reached" not in bare.text

        if mode == "direct":
            # A's endpoint headers used against B's endpoint.
            crossed = http.post(f"http://{ep_b.endpoint}/command", json=body, headers=dict(ep_a.headers or {}))
            assert crossed.status_code in (401, 403), (crossed.status_code, crossed.text[:300])
            assert "reached" not in crossed.text
