"""The model route with the real `openai` client inside a sandbox: `paddock serve --llm-base`
points every sandbox's `OPENAI_BASE_URL` (here by `--llm-env`) and `PADDOCK_LLM_BASE` at the
gateway, which reaches only the upstream and adds the provider key on the way out. The upstream
is a small OpenAI-compatible fake on loopback that records what reaches it; the client is the
`openai` package from PyPI, unmodified, mounted read-only from this suite's virtualenv."""

from __future__ import annotations

import json
import os
import shutil
import site
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opensandbox.models.sandboxes import Host, Volume

from conftest import EXTERNAL, PaddockServer, capabilities, run_ok, sandboxes_on

KEY = "sk-e2e-never-inside-0123456789"
# Tenant acme's own upstream and key (`--llm-tenant-base`, `--llm-tenant-key-file`).
ACME_KEY = "sk-e2e-acme-own-9876543210"


class Upstream(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        size = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(size) or b"{}")
        type(self).seen.append((self.path, self.headers.get("authorization")))
        if body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for word in ("stre", "amed"):
                chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            return
        answer = json.dumps({
            "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass


class AcmeUpstream(Upstream):
    seen: list[tuple[str, str | None]] = []


@pytest.fixture(scope="module")
def model_server():
    if EXTERNAL or os.geteuid() != 0:
        pytest.skip("the model route test starts its own server and mounts a host directory (root)")
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    acme = ThreadingHTTPServer(("127.0.0.1", 0), AcmeUpstream)
    threading.Thread(target=acme.serve_forever, daemon=True).start()
    keys = Path(tempfile.mkdtemp(prefix="pllm-"))
    key_file, acme_key_file = keys / "key", keys / "acme-key"
    for path, value in ((key_file, KEY), (acme_key_file, ACME_KEY)):
        path.write_text(value + "\n")
        path.chmod(0o600)
    packages = Path(site.getsitepackages()[0])
    s = PaddockServer("model", [
        "--llm-base", f"http://127.0.0.1:{upstream.server_port}/v1/",
        "--llm-key-file", str(key_file),
        "--llm-env", "OPENAI_BASE_URL",
        "--llm-tenant-base", f"acme=http://127.0.0.1:{acme.server_port}",
        "--llm-tenant-key-file", f"acme={acme_key_file}",
        "--volume-root", str(packages),
    ])
    try:
        s.start()
        if not capabilities(s).get("gateway"):
            pytest.skip("this runtime gives sandboxes no gateway")
        yield s, packages
    finally:
        s.cleanup()
        upstream.shutdown()
        acme.shutdown()
        shutil.rmtree(keys, ignore_errors=True)


CLIENT = """
import os
from openai import OpenAI
client = OpenAI(api_key="unused-inside")
r = client.chat.completions.create(model="m-1", messages=[{"role": "user", "content": "ping"}])
print("answer", r.choices[0].message.content, r.usage.total_tokens)
parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model="m-1", messages=[{"role": "user", "content": "ping"}], stream=True)]
print("stream", "".join(parts))
print("base", os.environ["OPENAI_BASE_URL"], os.environ["PADDOCK_LLM_BASE"])
"""


def test_the_openai_client_calls_its_model_and_the_key_stays_outside(model_server, mode):
    server, packages = model_server
    Upstream.seen.clear()
    with sandboxes_on(server, mode) as create:
        sb = create(volumes=[Volume(name="site", host=Host(path=str(packages)), mountPath="/site", readOnly=True)])
        sb.files.write_file("/workspace/client.py", CLIENT)
        lines = run_ok(sb, "PYTHONPATH=/site python3 /workspace/client.py")
        assert "answer pong 2" in lines, lines
        assert "stream streamed" in lines, lines
        assert any(line.startswith("base http://") and line.endswith("/llm/v1 " + line.split()[1]) for line in lines), lines
        # Nowhere inside: not the environment of any process, not a file the sandbox can read.
        found = run_ok(sb, f"(cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; env) | grep -c {KEY} || true")
        assert found == ["0"], found
    assert [p for p, _ in Upstream.seen] == ["/v1/chat/completions", "/v1/chat/completions"], Upstream.seen
    assert all(auth == f"Bearer {KEY}" for _, auth in Upstream.seen), Upstream.seen


CALLS = """
import json, os, sys, time, urllib.error, urllib.request
for i in range(3):
    req = urllib.request.Request(os.environ["PADDOCK_LLM_BASE"] + "/chat/completions",
        data=json.dumps({"model": "m-1", "messages": [{"role": "user", "content": "ping"}]}).encode(),
        headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            print("call", i, r.status, json.load(r)["usage"]["total_tokens"])
    except urllib.error.HTTPError as e:
        body = json.load(e)
        print("call", i, e.code, body["code"], "modelTokens" in body["message"])
    time.sleep(1)
"""


def test_a_tenants_model_tokens_are_counted_and_its_quota_refuses_with_429(model_server):
    server, _ = model_server
    lines = three_calls(tenant_sandbox(server, "tokens", "--max-model-tokens", "3"))
    # 2 tokens a call: the first two fit under 3, the third finds 4 spent.
    assert lines == ["call 0 200 2", "call 1 200 2", "call 2 429 QUOTA_EXCEEDED True"], lines


def three_calls(sb, secrets: tuple[str, ...] = ()) -> list[str]:
    """CALLS' lines from `sb`, after which no process's environment holds any of `secrets`;
    the sandbox is removed either way."""
    try:
        sb.files.write_file("/workspace/calls.py", CALLS)
        lines = run_ok(sb, "python3 /workspace/calls.py")
        for key in secrets:
            found = run_ok(sb, f"(cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; env) | grep -c {key} || true")
            assert found == ["0"], (key, found)
        return lines
    finally:
        sb.kill()
        sb.close()


def tenant_sandbox(server, name: str, *quota: str):
    """A new tenant's key and a sandbox made with it."""
    import subprocess
    from datetime import timedelta

    from opensandbox import SandboxSync
    from opensandbox.config import ConnectionConfigSync

    from conftest import IMAGE, PADDOCK_BIN

    done = subprocess.run(
        [str(PADDOCK_BIN), "--data-dir", str(server.data_dir), "tenant", "add", name, *quota],
        capture_output=True, text=True, timeout=60, check=True,
    )
    key = done.stdout.strip().splitlines()[-1]
    cfg = ConnectionConfigSync(domain=server.domain, api_key=key, request_timeout=timedelta(seconds=60))
    return SandboxSync.create(IMAGE, connection_config=cfg, timeout=timedelta(minutes=10))


def test_a_tenant_with_its_own_upstream_reaches_it_with_its_own_key(model_server):
    server, _ = model_server
    Upstream.seen.clear()
    AcmeUpstream.seen.clear()
    lines = three_calls(tenant_sandbox(server, "acme"), (KEY, ACME_KEY))
    assert lines == ["call 0 200 2", "call 1 200 2", "call 2 200 2"], lines
    assert [p for p, _ in AcmeUpstream.seen] == ["/v1/chat/completions"] * 3, AcmeUpstream.seen
    assert all(auth == f"Bearer {ACME_KEY}" for _, auth in AcmeUpstream.seen), AcmeUpstream.seen
    assert Upstream.seen == [], "the server's upstream saw acme's calls"


class OwnUpstream(Upstream):
    seen: list[tuple[str, str | None]] = []


def test_a_tenant_given_its_own_route_by_the_cli_reaches_it_at_once(model_server):
    """`paddock tenant add NAME --llm-base URL --llm-key-file PATH` on the running server's data
    directory: the new tenant's first sandbox already calls its own upstream, with the key read
    from the file; the database keeps the file's path, never the key."""
    server, _ = model_server
    own = ThreadingHTTPServer(("127.0.0.1", 0), OwnUpstream)
    threading.Thread(target=own.serve_forever, daemon=True).start()
    keys = Path(tempfile.mkdtemp(prefix="pllm-own-"))
    key_file = keys / "key"
    key_file.write_text("sk-e2e-own-route-55555\n")
    key_file.chmod(0o600)
    Upstream.seen.clear()
    try:
        sb = tenant_sandbox(server, "ownroute", "--llm-base", f"http://127.0.0.1:{own.server_port}",
                            "--llm-key-file", str(key_file))
        lines = three_calls(sb, ("sk-e2e-own-route-55555",))
        assert lines == ["call 0 200 2", "call 1 200 2", "call 2 200 2"], lines
    finally:
        own.shutdown()
        shutil.rmtree(keys, ignore_errors=True)
    assert [p for p, _ in OwnUpstream.seen] == ["/v1/chat/completions"] * 3, OwnUpstream.seen
    assert all(auth == "Bearer sk-e2e-own-route-55555" for _, auth in OwnUpstream.seen), OwnUpstream.seen
    assert Upstream.seen == [], "the server's upstream saw the tenant's calls"
    for f in server.data_dir.glob("server.db*"):
        assert b"sk-e2e-own-route-55555" not in f.read_bytes(), f
