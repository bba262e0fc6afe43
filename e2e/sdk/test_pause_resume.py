"""Pause and resume through the real SDK: a paused sandbox runs nothing; a resumed one
still has its memory (a shell loop keeps its counter in a variable and continues)."""

from __future__ import annotations

import time

import pytest
from conftest import capabilities, require, run_ok, wait_until
from opensandbox import SandboxSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync

COUNTER = "/tmp/e2e-counter"
STEP_S = 0.2
# The loop's state lives only in the shell variable `i`; the file is just a window on it.
LOOP = (
    f"i=0; while :; do i=$((i+1)); echo $i > {COUNTER}.tmp && mv {COUNTER}.tmp {COUNTER}; "
    f"sleep {STEP_S}; done"
)


def _counter(sb: SandboxSync) -> int:
    return int(sb.files.read_file(COUNTER).strip())


def _state(sb: SandboxSync) -> str:
    return sb.get_info().status.state


def test_pause_stops_everything_and_resume_keeps_memory(make_sandbox, conn, server):
    require(server, "pause")
    sb = make_sandbox()
    loop = sb.commands.run(LOOP, opts=RunCommandOpts(background=True))
    assert loop.id
    wait_until(lambda: sb.commands.get_command_status(loop.id).running, 5, "the loop to run")
    wait_until(lambda: int(run_ok(sb, f"cat {COUNTER} 2>/dev/null || echo 0")[0]) >= 10, 10, "the counter to reach 10")

    before = _counter(sb)
    t_before = time.monotonic()
    sb.pause()
    state = wait_until(lambda: (s := _state(sb)) != "Pausing" and s, 10, "pause to settle")
    assert state == "Paused", state
    assert sb.is_healthy() is False, "a paused sandbox runs nothing: it is not healthy"
    time.sleep(3.0)
    assert _state(sb) == "Paused"

    resumed = SandboxSync.resume(sb.id, connection_config=conn)
    try:
        assert resumed.id == sb.id
        after_resume = _counter(resumed)
        paused_for = time.monotonic() - t_before
        assert paused_for >= 3.0
        # Running freely for `paused_for` seconds would add about paused_for / STEP_S (>= 15).
        assert after_resume - before <= 5, (
            f"counter went {before} -> {after_resume} across {paused_for:.1f}s of pause: "
            "the sandbox kept running while paused"
        )
        assert _state(resumed) == "Running"
        assert resumed.is_healthy() is True

        time.sleep(1.5)
        later = _counter(resumed)
        assert later > after_resume, f"the loop did not continue after resume ({after_resume} -> {later})"
        # Had the loop been restarted (memory lost) it would count from 1 again.
        assert later >= before, f"counter restarted: {before} before pause, {later} after resume"
        assert resumed.commands.get_command_status(loop.id).running is True
        assert run_ok(resumed, "echo resumed-ok") == ["resumed-ok"]
    finally:
        resumed.close()


def test_paused_sandbox_is_listed_paused_and_can_be_killed(make_sandbox, conn, server):
    require(server, "pause")
    sb = make_sandbox()
    sb.pause()
    wait_until(lambda: _state(sb) == "Paused", 10, "state Paused")
    manager = SandboxManagerSync.create(conn)
    try:
        paused = manager.list_sandbox_infos(SandboxFilter(states=["Paused"], page_size=200)).sandbox_infos
        assert sb.id in {i.id for i in paused}
        running = manager.list_sandbox_infos(SandboxFilter(states=["Running"], page_size=200)).sandbox_infos
        assert sb.id not in {i.id for i in running}
    finally:
        manager.close()
    # A paused sandbox can be killed directly.
    sb.kill()
    with pytest.raises(SandboxApiException) as ei:
        sb.get_info()
    assert ei.value.status_code == 404


def test_pause_on_a_runtime_that_cannot_is_a_clear_error(make_sandbox, server):
    caps = capabilities(server)
    if caps.get("pause"):
        pytest.skip(f"the {caps.get('runtime')} runtime can pause")
    sb = make_sandbox()
    with pytest.raises(SandboxApiException) as refused:
        sb.pause()
    text = str(refused.value)
    assert "NOT_SUPPORTED" in text or "cannot pause" in text, text
    # Nothing changed: the sandbox still runs commands.
    assert run_ok(sb, "echo still-running") == ["still-running"]
