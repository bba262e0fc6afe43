"""OpenSandbox compatibility details through the real SDK, in both connection modes:
set_env, no-expiry sandboxes, honest errors for what Paddock does not serve, failed
entrypoints with their reason and output, and sandboxes made with the CLI."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import timedelta

import pytest
from opensandbox import SandboxSync
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync

from conftest import IMAGE, PADDOCK_BIN, SERVE_ARGS, capabilities, run_ok, wait_until


def test_set_env_reaches_later_commands(sandbox):
    sandbox.commands.set_env("GREETING", "hello world")
    sandbox.commands.set_env("TRICKY", "it's $HOME \"quoted\"")
    assert run_ok(sandbox, 'echo "$GREETING"') == ["hello world"]
    assert run_ok(sandbox, 'echo "$TRICKY"') == ["it's $HOME \"quoted\""]
    # A later set_env of the same key wins.
    sandbox.commands.set_env("GREETING", "again")
    assert run_ok(sandbox, 'echo "$GREETING"') == ["again"]


def test_set_env_reaches_sessions_started_later(sandbox):
    if sandbox.commands.run("command -v bash").exit_code != 0:
        pytest.skip(f"the image {IMAGE!r} has no bash, which sessions run")
    sandbox.commands.set_env("FOR_SESSIONS", "yes please")
    sid = sandbox.commands.create_session()
    ex = sandbox.commands.run_in_session(sid, 'echo "$FOR_SESSIONS"')
    assert [m.text for m in ex.logs.stdout] == ["yes please"], ex
    sandbox.commands.delete_session(sid)


def test_timeout_none_never_expires_and_renew_gives_an_expiry(make_sandbox):
    sb = make_sandbox(timeout=None)
    info = sb.get_info()
    assert info.status.state == "Running", info.status
    assert info.expires_at is None, info.expires_at
    # renew sets now + timeout, and the create-time maximum does not apply to it.
    sb.renew(timedelta(hours=30))
    info = sb.get_info()
    assert info.expires_at is not None
    remaining = (info.expires_at - info.created_at).total_seconds()
    assert 29 * 3600 < remaining < 31 * 3600, remaining


def test_the_sdk_pools_default_lifetime_is_accepted(make_sandbox):
    # SandboxPool creates with its idle_timeout, 24 h by default.
    sb = make_sandbox(timeout=timedelta(hours=24))
    assert sb.get_info().status.state == "Running"


@pytest.mark.parametrize(
    "call, feature",
    [
        (lambda sb: sb.isolation.capabilities(), "isolated sessions"),
        (lambda sb: sb.files_with_identity(1000, 1000).get_file_info(["/tmp"]), "another uid/gid"),
        (lambda sb: sb.create_snapshot("s1"), "snapshots"),
    ],
    ids=["isolation", "files-with-identity", "snapshot"],
)
def test_unserved_features_fail_fast_with_a_clear_501(sandbox, call, feature):
    started = time.monotonic()
    with pytest.raises(SandboxException) as caught:
        call(sandbox)
    elapsed = time.monotonic() - started
    assert elapsed < 2, f"took {elapsed:.1f}s: the SDK retried it"
    e = caught.value
    text = f"{e} {getattr(e, 'response_body', b'')!r}"
    assert "NOT_SUPPORTED" in text and feature in text, text
    assert "port 44772" not in text, text
    if isinstance(e, SandboxApiException):
        assert e.status_code == 501, e.status_code
    # The sandbox is unharmed.
    assert sandbox.is_healthy()


def test_a_failing_entrypoint_makes_the_sandbox_failed_with_its_reason_and_logs(make_sandbox):
    sb = make_sandbox(
        entrypoint=["sh", "-c", "echo booting; echo 'no config found' >&2; exit 3"],
        skip_health_check=True,
    )
    info = wait_until(
        lambda: (i := sb.get_info()).status.state == "Failed" and i, 15, "the sandbox to become Failed"
    )
    assert info.status.reason == "ENTRYPOINT_EXITED", info.status
    assert "exit status 3" in info.status.message and "no config found" in info.status.message, info.status
    assert not sb.is_healthy()
    logs = sb.get_diagnostic_logs("container")
    assert logs.kind == "logs" and logs.delivery == "inline", logs
    assert "booting" in logs.content and "no config found" in logs.content, logs.content
    events = sb.get_diagnostic_events("all")
    assert "EntrypointExited: exit status 3" in events.content, events.content


def test_a_missing_entrypoint_program_is_reported(server, make_sandbox):
    sb = make_sandbox(entrypoint=["/no/such/program"], skip_health_check=True)
    info = wait_until(lambda: (i := sb.get_info()).status.state == "Failed" and i, 15, "Failed")
    assert info.status.reason == "ENTRYPOINT_EXITED", info.status
    assert "/no/such/program" in info.status.message, info.status
    if capabilities(server)["runtime"] == "local":
        assert "127" in info.status.message, info.status


def test_a_running_entrypoints_logs_can_be_read(make_sandbox):
    sb = make_sandbox(entrypoint=["sh", "-c", "echo listening on 8000; exec sleep 600"])
    logs = wait_until(
        lambda: "listening on 8000" in (sb.get_diagnostic_logs("container").content or ""), 15, "the entrypoint's output"
    )
    assert logs
    assert sb.get_info().status.state == "Running"
    assert sb.is_healthy()


def test_cli_sandboxes_are_seen_and_managed_by_the_server(server, conn):
    out = subprocess.run(
        [str(PADDOCK_BIN), *SERVE_ARGS, "--data-dir", str(server.data_dir), "--json", "create", "--image", IMAGE, "--timeout", "10m"],
        capture_output=True, timeout=60, check=True,
    )
    sid = json.loads(out.stdout)["id"]
    manager = SandboxManagerSync.create(conn)
    try:
        ids = [i.id for i in manager.list_sandbox_infos(SandboxFilter(page_size=200)).sandbox_infos]
        assert sid in ids, ids
        sb = SandboxSync.connect(sid, connection_config=conn)
        try:
            assert run_ok(sb, "echo from-the-api") == ["from-the-api"]
            assert sb.get_info().status.state == "Running"
        finally:
            sb.kill()
            sb.close()
    finally:
        manager.close()
    listed = subprocess.run(
        [str(PADDOCK_BIN), *SERVE_ARGS, "--data-dir", str(server.data_dir), "--json", "ls"], capture_output=True, timeout=30, check=True
    )
    assert sid not in [s["id"] for s in json.loads(listed.stdout)], "the API's kill removed it"


def test_paddock_logs_shows_a_failed_entrypoint(server, make_sandbox):
    sb = make_sandbox(entrypoint=["sh", "-c", "echo last words; exit 7"], skip_health_check=True)
    wait_until(lambda: sb.get_info().status.state == "Failed", 15, "Failed")
    # The server writes the entrypoint's record to its database at the end.
    out = wait_until(
        lambda: (
            r := subprocess.run(
                [str(PADDOCK_BIN), *SERVE_ARGS, "--data-dir", str(server.data_dir), "--json", "logs", sb.id],
                capture_output=True, timeout=30,
            )
        ).returncode == 0 and json.loads(r.stdout),
        10, "paddock logs",
    )
    assert out["state"] == "Failed" and out["entrypoint"]["exitCode"] == 7, out
    assert "last words" in out["output"], out


def test_no_expiry_survives_a_server_restart(restartable_server, mode):
    cfg = restartable_server.config(mode)
    sb = SandboxSync.create(IMAGE, connection_config=cfg, timeout=None, ready_timeout=timedelta(seconds=30))
    try:
        restartable_server.kill_hard()
        restartable_server.start()
        again = SandboxSync.connect(sb.id, connection_config=cfg)
        try:
            info = again.get_info()
            assert info.status.state == "Running", info.status
            assert info.expires_at is None, info.expires_at
            assert run_ok(again, "echo still-here") == ["still-here"]
        finally:
            again.kill()
            again.close()
    finally:
        sb.close()
