"""execd command API through the real SDK: streaming, exit codes, line splitting,
background commands with status and logs, interrupt, envs and working directory."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from conftest import err, out, run_ok, wait_until
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.execd_sync import ExecutionHandlersSync


def test_stdout_and_stderr_are_split_into_lines(sandbox):
    ex = sandbox.commands.run("echo hello; echo world; echo oops 1>&2")
    assert ex.id, "no init event (execution id)"
    assert ex.exit_code == 0 and ex.error is None, ex
    assert ex.complete is not None
    assert out(ex) == ["hello", "world"]
    assert err(ex) == ["oops"]
    assert all(m.is_error is False for m in ex.logs.stdout)
    assert all(m.is_error is True for m in ex.logs.stderr)
    now_ms = time.time() * 1000
    for m in ex.logs.stdout + ex.logs.stderr:
        assert abs(now_ms - m.timestamp) < 60_000, f"timestamp not in ms near now: {m.timestamp}"

    # An unterminated last line is flushed at exit; many lines keep their order.
    ex = sandbox.commands.run("printf 'a\\nb\\nno-newline'")
    assert out(ex) == ["a", "b", "no-newline"]
    ex = sandbox.commands.run("seq 1 500")
    assert out(ex) == [str(i) for i in range(1, 501)]


def test_output_streams_before_the_command_ends(sandbox):
    arrivals: list[tuple[str, float]] = []
    completed: list[float] = []

    def on_stdout(msg):
        arrivals.append((msg.text, time.monotonic()))

    def on_complete(_):
        completed.append(time.monotonic())

    handlers = ExecutionHandlersSync(on_stdout=on_stdout, on_execution_complete=on_complete)
    ex = sandbox.commands.run("echo first; sleep 2; echo second", handlers=handlers)
    returned = time.monotonic()

    assert ex.exit_code == 0, ex
    assert [t for t, _ in arrivals] == ["first", "second"], arrivals
    assert out(ex) == ["first", "second"]
    assert len(completed) == 1, "on_execution_complete must fire exactly once"
    first_at = arrivals[0][1]
    finished_at = completed[0]
    assert finished_at - first_at >= 1.0, (
        f"'first' arrived only {finished_at - first_at:.2f}s before the command finished: "
        "output is buffered, not streamed"
    )
    assert arrivals[1][1] - first_at >= 1.0
    # And the stream is closed promptly after the last event (OpenSandbox #1661: ~1 s tail).
    assert returned - finished_at < 0.9, f"stream stayed open {returned - finished_at:.2f}s after completion"


def test_nonzero_exit_code_is_a_command_exec_error(sandbox):
    errors = []
    completes = []
    ex = sandbox.commands.run(
        "echo before; exit 3",
        handlers=ExecutionHandlersSync(on_error=errors.append, on_execution_complete=completes.append),
    )
    assert ex.exit_code == 3
    assert ex.error is not None
    assert ex.error.name == "CommandExecError"
    assert ex.error.value == "3"
    assert ex.complete is None, "error and execution_complete are mutually exclusive"
    assert out(ex) == ["before"]
    assert len(errors) == 1 and completes == []

    ex = sandbox.commands.run("nonexistent-command-e2e")
    assert ex.exit_code == 127
    assert ex.error is not None and ex.error.name == "CommandExecError"
    assert any("nonexistent-command-e2e" in line for line in err(ex)), err(ex)

    ex = sandbox.commands.run("true")
    assert ex.exit_code == 0 and ex.error is None and ex.complete is not None


def test_envs_and_working_directory(sandbox):
    ex = sandbox.commands.run(
        'echo "$E2E_A/$E2E_B"; pwd',
        opts=RunCommandOpts(envs={"E2E_A": "alpha", "E2E_B": "beta gamma"}, working_directory="/tmp"),
    )
    assert ex.exit_code == 0, ex
    assert out(ex) == ["alpha/beta gamma", "/tmp"]
    # Envs are per command.
    assert run_ok(sandbox, 'echo "[${E2E_A:-unset}]"') == ["[unset]"]


def test_command_timeout_kills_it(sandbox):
    start = time.monotonic()
    ex = sandbox.commands.run("echo started; sleep 20; echo not-reached", opts=RunCommandOpts(timeout=timedelta(seconds=1)))
    elapsed = time.monotonic() - start
    assert elapsed < 10, f"timeout=1s command ran {elapsed:.1f}s"
    assert "not-reached" not in out(ex)
    assert out(ex) == ["started"]
    assert ex.error is not None and ex.complete is None, f"a command killed by its timeout is not a success: {ex}"


def test_background_command_status_and_logs(sandbox):
    start = time.monotonic()
    ex = sandbox.commands.run(
        "echo bg-line-1; echo bg-err 1>&2; sleep 2; echo bg-line-2; exit 4",
        opts=RunCommandOpts(background=True),
    )
    assert time.monotonic() - start < 1.5, "a background command must return right away"
    assert ex.id, "background run must still report the execution id"
    assert ex.exit_code is None
    cid = ex.id

    status = sandbox.commands.get_command_status(cid)
    assert status.id == cid
    assert status.running is True, status
    assert status.exit_code is None
    assert status.started_at is not None

    def finished():
        s = sandbox.commands.get_command_status(cid)
        return s if s.running is False else None

    status = wait_until(finished, 10, "the background command to finish", interval=0.2)
    assert status.exit_code == 4, status
    assert status.finished_at is not None and status.finished_at >= status.started_at

    logs = sandbox.commands.get_background_command_logs(cid)
    assert "bg-line-1" in logs.content and "bg-line-2" in logs.content and "bg-err" in logs.content, logs
    assert logs.content.index("bg-line-1") < logs.content.index("bg-line-2")
    assert logs.cursor is not None, "EXECD-COMMANDS-TAIL-CURSOR header missing"

    # Reading again from the returned cursor gives nothing already seen.
    again = sandbox.commands.get_background_command_logs(cid, cursor=logs.cursor)
    assert "bg-line-1" not in again.content and "bg-line-2" not in again.content, again


def test_background_logs_are_incremental_with_cursor(sandbox):
    ex = sandbox.commands.run(
        "for i in 1 2 3 4 5 6; do echo tick-$i; sleep 0.3; done",
        opts=RunCommandOpts(background=True),
    )
    seen = ""
    cursor = None
    deadline = time.monotonic() + 10
    reads = 0
    while "tick-6" not in seen and time.monotonic() < deadline:
        logs = sandbox.commands.get_background_command_logs(ex.id, cursor=cursor)
        reads += 1
        seen += logs.content
        cursor = logs.cursor if logs.cursor is not None else cursor
        time.sleep(0.25)
    lines = [line for line in seen.splitlines() if line]
    assert lines == [f"tick-{i}" for i in range(1, 7)], (lines, reads)


def test_unknown_command_status_is_an_error(sandbox):
    with pytest.raises(SandboxApiException) as ei:
        sandbox.commands.get_command_status("no-such-command-" + uuid.uuid4().hex[:8])
    assert ei.value.status_code == 404, repr(ei.value)


def test_interrupt_a_running_command(sandbox):
    init_seen = threading.Event()
    inits = []

    def on_init(init):
        inits.append(init)
        init_seen.set()

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(
            sandbox.commands.run,
            "echo running; sleep 31.5; echo not-interrupted",
            handlers=ExecutionHandlersSync(on_init=on_init),
        )
        assert init_seen.wait(timeout=15), "no init event within 15 s"
        time.sleep(0.3)
        sandbox.commands.interrupt(inits[0].id)
        ex = future.result(timeout=20)
    elapsed = time.monotonic() - start

    assert elapsed < 15, f"interrupted command took {elapsed:.1f}s"
    assert ex.id == inits[0].id
    assert "not-interrupted" not in out(ex)
    assert ex.error is not None and ex.complete is None, f"an interrupted command is not a success: {ex}"
    status = sandbox.commands.get_command_status(ex.id)
    assert status.running is False

    # The whole process group is gone, not just the shell.
    procs = run_ok(
        sandbox,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'slee[p] 31.5' || true",
    )
    assert procs == ["0"], f"sleep survived the interrupt: {procs}"


def test_interrupt_a_background_command(sandbox):
    ex = sandbox.commands.run("sleep 32.5", opts=RunCommandOpts(background=True))
    assert sandbox.commands.get_command_status(ex.id).running is True
    sandbox.commands.interrupt(ex.id)
    wait_until(
        lambda: sandbox.commands.get_command_status(ex.id).running is False,
        10,
        "the interrupted background command to stop",
        interval=0.2,
    )



def test_large_output_arrives_complete_and_in_order(sandbox):
    ex = sandbox.commands.run("seq 1 20000; echo done 1>&2")
    lines = out(ex)
    assert len(lines) == 20000, len(lines)
    assert lines[0] == "1" and lines[-1] == "20000"
    assert lines == [str(i) for i in range(1, 20001)]
    assert err(ex) == ["done"]


def test_commands_run_concurrently(sandbox):
    def one(i: int):
        return sandbox.commands.run(f'sleep 1; echo "job-$N"', opts=RunCommandOpts(envs={"N": str(i)}))

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(8)))
    elapsed = time.monotonic() - start
    assert [out(r) for r in results] == [[f"job-{i}"] for i in range(8)]
    assert all(r.exit_code == 0 for r in results)
    assert elapsed < 5, f"8 one-second commands took {elapsed:.1f}s: they were serialized"
