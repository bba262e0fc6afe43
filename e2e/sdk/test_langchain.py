"""An unmodified agent-framework backend built on the SDK: `langchain-opensandbox`'s
`OpenSandboxSandbox`, the backend LangChain deep agents use for shell and file tools, driven
through the deepagents `BaseSandbox` contract against Paddock, in both connection modes. No
model is involved: the test calls what an agent's tools call (execute, ls, read, write, edit,
grep, glob, upload, download). Its file tools run python3 inside the sandbox, so the image
must have it: the host root, and on the local runtime a registry image too (the Debian python
root of e2e/images/build, pulled from a loopback registry), as an agent's `python:3.11`."""

from __future__ import annotations

from datetime import timedelta

import pytest
from opensandbox import SandboxSync

from conftest import run_ok

lc = pytest.importorskip("langchain_opensandbox")


def test_the_langchain_deep_agent_backend_works_unmodified(make_sandbox):
    sb = make_sandbox()
    if sb.commands.run("command -v python3").exit_code != 0:
        pytest.skip("the sandbox image has no python3, which the deep-agent file tools run")
    _drive(sb)


def test_the_langchain_deep_agent_backend_works_unmodified_on_a_registry_image(conn, registry_image):
    sb = SandboxSync.create(
        registry_image, connection_config=conn, timeout=timedelta(minutes=10), ready_timeout=timedelta(seconds=120)
    )
    try:
        assert run_ok(sb, 'echo "$PADDOCK_TEST_IMAGE"') == ["python-bookworm"], "not the registry image"
        _drive(sb)
    finally:
        sb.kill()
        sb.close()


def _drive(sb: SandboxSync) -> None:
    """What a deep agent's tools do, through the backend, each checked."""
    assert run_ok(sb, "id -u") == ["1000"]
    backend = lc.OpenSandboxSandbox(sandbox=sb)
    assert backend.id == sb.id

    r = backend.execute("echo out; echo err >&2; exit 3")
    assert r.exit_code == 3, r
    assert r.output.splitlines() == ["out", "err"], r

    path = "/workspace/proj/app.py"
    w = backend.write(path, "def answer():\n    return 41\n")
    assert w.error is None and w.path == path, w
    assert backend.write(path, "again").error, "write refuses an existing file"
    rd = backend.read(path)
    assert rd.error is None and "return 41" in rd.file_data["content"], rd
    e = backend.edit(path, "return 41", "return 42")
    assert e.error is None and e.occurrences == 1, e
    assert backend.edit(path, "not there", "x").error, "an edit that matches nothing says so"
    assert run_ok(sb, "python3 -B -c 'import sys; sys.path.insert(0, \"/workspace/proj\"); import app; print(app.answer())'") == ["42"]

    backend.write("/workspace/proj/notes.md", "TODO: ship\n")
    ls = backend.ls("/workspace/proj")
    assert ls.error is None, ls
    assert sorted(x["path"] for x in ls.entries) == ["/workspace/proj/app.py", "/workspace/proj/notes.md"], ls
    g = backend.grep("return 42", path="/workspace")
    assert g.error is None and [(m["path"], m["line"]) for m in g.matches] == [(path, 2)], g
    gl = backend.glob("**/*.py", path="/workspace")
    # deepagents reports glob matches relative to the searched directory.
    assert gl.error is None and [m["path"] for m in gl.matches] == ["proj/app.py"], gl

    blob = bytes(range(256)) * 64
    up = backend.upload_files([("/workspace/data/blob.bin", blob)])
    assert [u.error for u in up] == [None], up
    down = backend.download_files(["/workspace/data/blob.bin", "/workspace/missing.txt"])
    assert down[0].error is None and down[0].content == blob
    assert down[1].error is not None and down[1].content is None
