"""Server crash: SIGKILL `paddock serve`, start it again on the same data dir, and the
sandbox is still there — listed Running, its processes still running, its files kept,
commands still run in it, both through the old client and a fresh connect."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from conftest import IMAGE, run_ok, wait_until
from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync

COUNTER = "/tmp/e2e-restart-counter"
LOOP = (
    f"i=0; while :; do i=$((i+1)); echo $i > {COUNTER}.tmp && mv {COUNTER}.tmp {COUNTER}; "
    "sleep 0.2; done"
)


@pytest.mark.timeout(150)
def test_sandbox_survives_server_sigkill(restartable_server, mode):
    server = restartable_server
    conn = server.config(mode)
    tag = uuid.uuid4().hex[:12]
    sb = SandboxSync.create(IMAGE, connection_config=conn, metadata={"restart": tag},
                            timeout=timedelta(minutes=10))
    fresh = None
    try:
        sb.files.write_file("/workspace/before-crash.txt", f"written before the crash {tag}")
        run_ok(sb, "echo from-a-command > /tmp/also-before.txt")
        assert sb.commands.run(LOOP, opts=RunCommandOpts(background=True)).id
        wait_until(lambda: int(run_ok(sb, f"cat {COUNTER} 2>/dev/null || echo 0")[0]) >= 5, 10, "the loop to count")
        before = int(sb.files.read_file(COUNTER))
        expires_before = sb.get_info().expires_at

        server.kill_hard()
        time.sleep(0.5)
        server.start()

        manager = SandboxManagerSync.create(server.config(mode))
        try:
            infos = manager.list_sandbox_infos(SandboxFilter(metadata={"restart": tag})).sandbox_infos
            assert [i.id for i in infos] == [sb.id], infos
            assert infos[0].status.state == "Running", infos[0].status
            assert infos[0].metadata == {"restart": tag}
            running = manager.list_sandbox_infos(SandboxFilter(states=["Running"])).sandbox_infos
            assert sb.id in {i.id for i in running}
        finally:
            manager.close()

        info = sb.get_info()
        assert info.status.state == "Running"
        assert info.expires_at == expires_before, "the expiry must survive the restart"

        # The background loop kept running (the sandbox outlived the server) and was
        # not restarted (its count continues from before the crash).
        a = int(sb.files.read_file(COUNTER))
        time.sleep(1.0)
        b = int(sb.files.read_file(COUNTER))
        assert b > a, f"the loop stopped across the restart ({a} -> {b})"
        assert a >= before, f"the loop restarted from scratch ({before} before the crash, {a} after)"

        # The old client (cached endpoint and token) still works...
        assert run_ok(sb, "cat /tmp/also-before.txt") == ["from-a-command"]
        assert sb.files.read_file("/workspace/before-crash.txt") == f"written before the crash {tag}"

        # ...and so does a fresh connect.
        fresh = SandboxSync.connect(sb.id, connection_config=server.config(mode))
        assert run_ok(fresh, "cat /workspace/before-crash.txt") == [f"written before the crash {tag}"]
        ex = fresh.commands.run("echo after-restart; exit 6")
        assert ex.exit_code == 6 and [m.text for m in ex.logs.stdout] == ["after-restart"]

        # New sandboxes can be created after the restart.
        other = SandboxSync.create(IMAGE, connection_config=server.config(mode), timeout=timedelta(minutes=5))
        try:
            assert run_ok(other, "echo new-after-restart") == ["new-after-restart"]
        finally:
            other.kill()
            other.close()
    finally:
        if fresh is not None:
            fresh.close()
        try:
            sb.kill()
        except Exception:
            pass
        sb.close()

