"""Bash sessions through the real `opensandbox==1.1.1` SDK (`create_session`,
`run_in_session`, `delete_session`): one shell per session, so `cd`, variables and exports
persist between runs; runs stream like `commands.run`."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from conftest import IMAGE, err, out
from opensandbox.exceptions import SandboxException


@pytest.fixture
def sandbox(sandbox):
    if sandbox.commands.run("command -v bash").exit_code != 0:
        pytest.skip(f"the image {IMAGE!r} has no bash, which sessions run")
    return sandbox


def test_a_session_keeps_cwd_and_exports(sandbox):
    sid = sandbox.commands.create_session()
    assert sid
    ex = sandbox.commands.run_in_session(sid, "mkdir -p /tmp/sess && cd /tmp/sess && export SESSION_VAR=kept && plain=also")
    assert ex.exit_code == 0 and ex.error is None, ex
    ex = sandbox.commands.run_in_session(sid, "pwd; echo $SESSION_VAR $plain; bash -c 'echo child:$SESSION_VAR'; echo oops >&2")
    assert ex.exit_code == 0, ex
    assert out(ex) == ["/tmp/sess", "kept also", "child:kept"]
    assert err(ex) == ["oops"]
    # A working directory for one run; the session's own stays.
    ex = sandbox.commands.run_in_session(sid, "pwd", working_directory="/workspace")
    assert out(ex) == ["/workspace"]
    assert out(sandbox.commands.run_in_session(sid, "pwd")) == ["/tmp/sess"]
    sandbox.commands.delete_session(sid)
    with pytest.raises(SandboxException):
        sandbox.commands.run_in_session(sid, "true")


def test_session_exit_codes_and_timeouts(sandbox):
    sid = sandbox.commands.create_session(working_directory="/tmp")
    assert out(sandbox.commands.run_in_session(sid, "pwd")) == ["/tmp"]
    ex = sandbox.commands.run_in_session(sid, "echo partial; (exit 7)")
    assert ex.exit_code == 7 and ex.error is not None, ex
    assert out(ex) == ["partial"]
    t0 = time.monotonic()
    ex = sandbox.commands.run_in_session(sid, "export BEFORE=1; sleep 60", timeout=timedelta(seconds=1))
    assert time.monotonic() - t0 < 15
    assert ex.exit_code not in (0, None), ex
    assert out(sandbox.commands.run_in_session(sid, "echo $BEFORE")) == ["1"], "the session survives a timeout"
    # `exit` ends the shell; the session goes on with a fresh one.
    ex = sandbox.commands.run_in_session(sid, "exit 4")
    assert ex.exit_code == 4, ex
    assert out(sandbox.commands.run_in_session(sid, "echo alive")) == ["alive"]
    sandbox.commands.delete_session(sid)
