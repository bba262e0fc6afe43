"""Fixtures for the end-to-end suite: the real `paddock serve` driven by the real
`opensandbox==1.1.1` SDK.

Nothing is built here. The binary comes from env `PADDOCK_BIN`, default
`<repo>/target/debug/paddock`. Each server gets a fresh random port, a fresh short
data dir under /tmp and a random API key; it is stopped by its own pid and its temp
dir is removed afterwards (set PADDOCK_E2E_KEEP=1 to keep it for a post-mortem).

Every SDK test runs twice: `direct` (the SDK talks to the execd endpoint it was
given) and `proxy` (`use_server_proxy=True`, execd calls go through
`/v1/sandboxes/{id}/proxy/44772/...`). When a test fails, the server's log lines
written during that test are attached to the report.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from opensandbox import SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync

REPO_ROOT = Path(__file__).resolve().parents[2]
PADDOCK_BIN = Path(os.environ.get("PADDOCK_BIN") or REPO_ROOT / "target" / "debug" / "paddock")
# The image sandboxes run: the host's root on the local runtime; an image the cluster has on
# Kubernetes (PADDOCK_E2E_IMAGE=paddock.local/sandbox:1, see dev/k8s).
IMAGE = os.environ.get("PADDOCK_E2E_IMAGE", "host")
# Extra `paddock serve` arguments, e.g. "--runtime kubernetes --namespace paddock-e2e".
SERVE_ARGS = os.environ.get("PADDOCK_E2E_SERVE_ARGS", "").split()
# An already running server (e.g. the chart's Service through `kubectl port-forward`): the suite
# then starts no process and uses this HOST:PORT and PADDOCK_E2E_API_KEY; tests that restart the
# server are skipped.
EXTERNAL = os.environ.get("PADDOCK_E2E_URL", "").removeprefix("http://").rstrip("/")
MODES = ("direct", "proxy")
START_TIMEOUT_S = 30.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL the server if pytest itself dies, so nothing is left behind."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class PaddockServer:
    """One `paddock serve` process on a private port, data dir and API key."""

    registry: list["PaddockServer"] = []

    def __init__(self, name: str, extra_args: list[str] | None = None) -> None:
        if not EXTERNAL and not PADDOCK_BIN.is_file():
            pytest.exit(
                f"paddock binary not found at {PADDOCK_BIN}: build it with "
                f"`cargo build -p paddock` in {REPO_ROOT}, or set PADDOCK_BIN",
                returncode=2,
            )
        self.name = name
        self.root = Path(tempfile.mkdtemp(prefix="pe2e-", dir="/tmp"))
        # Sandboxes run as an unprivileged host uid that must be able to reach the data dir.
        self.root.chmod(0o711)
        self._data_dir = self.root / "d"
        self._data_dir.mkdir()
        self.log_path = self.root / "server.log"
        self.port = _free_port()
        self.api_key = secrets.token_hex(16)
        if EXTERNAL:
            self.api_key = os.environ.get("PADDOCK_E2E_API_KEY", "")
        self.proc: subprocess.Popen | None = None
        self.extra_args = list(extra_args or [])
        self.starts = 0
        PaddockServer.registry.append(self)

    @property
    def data_dir(self) -> Path:
        """The server's data directory; a test that uses it (the CLI beside the server, `paddock
        logs`) cannot run against an external server."""
        if EXTERNAL:
            pytest.skip("the server is external (PADDOCK_E2E_URL): its data directory is not here")
        return self._data_dir

    @property
    def domain(self) -> str:
        return EXTERNAL or f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.domain}"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "server already running"
        self.starts += 1
        if EXTERNAL:
            if self.starts > 1:
                pytest.skip("the server is external (PADDOCK_E2E_URL): it cannot be restarted from here")
            with urllib.request.urlopen(self.base_url + "/health", timeout=10) as r:
                assert r.status == 200, f"GET {self.base_url}/health: HTTP {r.status}"
            return
        log = open(self.log_path, "ab")
        log.write(f"\n===== e2e: start #{self.starts} of paddock serve ({self.name}) =====\n".encode())
        log.flush()
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        env.setdefault("NO_COLOR", "1")
        env.setdefault("RUST_BACKTRACE", "1")
        # In the environment, not on the command line, where every local user could read it.
        env["PADDOCK_API_KEY"] = self.api_key
        self.proc = subprocess.Popen(
            [
                str(PADDOCK_BIN),
                "serve",
                "--listen", self.domain,
                "--data-dir", str(self.data_dir),
                *SERVE_ARGS,
                *self.extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"paddock serve exited with {self.proc.returncode} before /health answered; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except OSError as e:
                last = repr(e)
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"GET /health did not return 200 within {START_TIMEOUT_S}s (last: {last}); "
            f"log tail:\n{self.log_tail()}"
        )

    def kill_hard(self) -> None:
        """SIGKILL the server process (only it: sandboxes are meant to outlive it)."""
        if EXTERNAL:
            pytest.skip("the server is external (PADDOCK_E2E_URL): it cannot be killed from here")
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if EXTERNAL:
            return
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def config(self, mode: str, **kw) -> ConnectionConfigSync:
        assert mode in MODES
        kw.setdefault("request_timeout", timedelta(seconds=60))
        return ConnectionConfigSync(
            domain=self.domain,
            api_key=self.api_key,
            use_server_proxy=(mode == "proxy"),
            **kw,
        )

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int, max_lines: int = 200) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = _ANSI.sub("", data).splitlines()
        if len(lines) > max_lines:
            lines = [f"... ({len(lines) - max_lines} earlier lines cut)"] + lines[-max_lines:]
        return "\n".join(lines)

    def log_tail(self, max_lines: int = 60) -> str:
        return self.log_since(0, max_lines)

    def kill_all_sandboxes(self) -> None:
        """Kill every sandbox through the API, then through the CLI as a fallback."""
        if EXTERNAL or (self.proc is not None and self.proc.poll() is None):
            cfg = self.config("direct", request_timeout=timedelta(seconds=15))
            try:
                manager = SandboxManagerSync.create(cfg)
                try:
                    infos = manager.list_sandbox_infos(SandboxFilter(page_size=200)).sandbox_infos
                    for info in infos:
                        try:
                            manager.kill_sandbox(info.id)
                        except Exception:
                            pass
                finally:
                    manager.close()
            except Exception:
                pass
        # Fallback when the server could not do it: the CLI on the same data dir.
        if EXTERNAL:
            return
        try:
            out = subprocess.run(
                [str(PADDOCK_BIN), "--data-dir", str(self.data_dir), "--json", "ls"],
                capture_output=True, timeout=30,
            )
            ids = [s["id"] for s in json.loads(out.stdout or b"[]")]
            if ids:
                subprocess.run(
                    [str(PADDOCK_BIN), "--data-dir", str(self.data_dir), "rm", *ids],
                    capture_output=True, timeout=60,
                )
        except Exception:
            pass

    def remove_volumes(self) -> None:
        """Deletes the named volumes the run made, so none stays mounted on the host."""
        if EXTERNAL or not PADDOCK_BIN.is_file():
            return
        base = [str(PADDOCK_BIN), "--data-dir", str(self._data_dir)]
        try:
            listed = subprocess.run([*base, "--json", "volume", "ls"], capture_output=True, text=True, timeout=60)
            for v in json.loads(listed.stdout or "[]"):
                subprocess.run([*base, "volume", "rm", v["name"]], capture_output=True, timeout=60)
        except (OSError, ValueError, subprocess.SubprocessError):
            pass

    def cleanup(self) -> None:
        try:
            self.kill_all_sandboxes()
        finally:
            self.stop()
            self.remove_volumes()
            if os.environ.get("PADDOCK_E2E_KEEP") != "1":
                shutil.rmtree(self.root, ignore_errors=True)
            if self in PaddockServer.registry:
                PaddockServer.registry.remove(self)


# ---------------------------------------------------------------- helpers for tests


@contextlib.contextmanager
def egress_world(tag: str, net: str):
    """A private outside world (e2e/egress_world.py) on NET: skipped without root or with an
    external server; torn down on exit. Yields its JSON description plus `ca_pem`."""
    if EXTERNAL or os.geteuid() != 0:
        pytest.skip("the test world is a network namespace on this host: needs root and a local server")
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "e2e" / "egress_world.py"), "--name", f"{tag}{os.getpid() % 10000}",
         "--net", net],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()
    assert line, "the egress test world did not start"
    info = json.loads(line)
    info["ca_pem"] = open(info["ca"]).read()
    try:
        yield info
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def capabilities(server: "PaddockServer") -> dict:
    """What the runtime behind `server` supports (GET /v1/capabilities)."""
    req = urllib.request.Request(server.base_url + "/v1/capabilities", headers={"OPEN-SANDBOX-API-KEY": server.api_key})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def require(server: "PaddockServer", capability: str) -> None:
    """Skips the test when the runtime says it cannot do `capability`: asked, not listed."""
    caps = capabilities(server)
    if not caps.get(capability):
        pytest.skip(f"the {caps.get('runtime')} runtime does not support {capability}")


def wait_until(pred, timeout: float, what: str, interval: float = 0.1):
    """Polls `pred` until it returns something truthy; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")
        time.sleep(interval)


def out(execution) -> list[str]:
    return [m.text for m in execution.logs.stdout]


def err(execution) -> list[str]:
    return [m.text for m in execution.logs.stderr]


def run_ok(sb: SandboxSync, command: str, **opts) -> list[str]:
    """Runs a command that must succeed; returns its stdout lines."""
    from opensandbox.models.execd import RunCommandOpts

    ex = sb.commands.run(command, opts=RunCommandOpts(**opts) if opts else None)
    assert ex.exit_code == 0 and ex.error is None, (
        f"command {command!r} failed: exit_code={ex.exit_code} error={ex.error} "
        f"stdout={out(ex)} stderr={err(ex)}"
    )
    return out(ex)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def server():
    """The shared server for every test except the restart test."""
    s = PaddockServer("shared")
    try:
        s.start()
        yield s
    finally:
        s.cleanup()


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture
def conn(server, mode) -> ConnectionConfigSync:
    """ConnectionConfig for the shared server, in direct or server-proxy mode."""
    return server.config(mode)


@contextlib.contextmanager
def sandboxes_on(server: "PaddockServer", mode: str):
    """A `create(**kw)` for sandboxes of the host image on `server` in `mode`; every one
    is killed on exit."""
    made: list[SandboxSync] = []

    def create(**kw) -> SandboxSync:
        kw.setdefault("timeout", timedelta(minutes=10))
        kw.setdefault("ready_timeout", timedelta(seconds=30))
        sb = SandboxSync.create(IMAGE, connection_config=server.config(mode), **kw)
        made.append(sb)
        return sb

    try:
        yield create
    finally:
        for sb in made:
            try:
                sb.kill()
            except Exception:
                pass
            sb.close()


@pytest.fixture
def make_sandbox(conn):
    """Creates sandboxes on the shared server; kills every one of them after the test."""
    created: list[SandboxSync] = []

    def make(connection_config: ConnectionConfigSync | None = None, **kw) -> SandboxSync:
        kw.setdefault("timeout", timedelta(minutes=10))
        kw.setdefault("ready_timeout", timedelta(seconds=30))
        sb = SandboxSync.create(IMAGE, connection_config=connection_config or conn, **kw)
        created.append(sb)
        return sb

    yield make
    for sb in created:
        try:
            sb.kill()
        except Exception:
            pass
        sb.close()


@pytest.fixture
def sandbox(make_sandbox) -> SandboxSync:
    return make_sandbox()


@pytest.fixture(scope="session")
def registry_image(server):
    """`127.0.0.1:PORT/paddock/python:3.11` in a docker-registry of its own: the Debian python
    root e2e/images/build makes, pushed with skopeo. Local runtime only."""
    if capabilities(server).get("runtime") != "local":
        pytest.skip("pulling from a loopback registry is tested on the local runtime")
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: apt-get install -y docker-registry skopeo (CI does)")
    archive = subprocess.run(
        [str(REPO_ROOT / "e2e" / "images" / "build")], check=True, capture_output=True, text=True, timeout=900
    ).stdout.strip()
    root = Path(tempfile.mkdtemp(prefix="pe2e-registry-"))
    port = _free_port()
    (root / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(root / "config.yml")],
        stdout=subprocess.DEVNULL, stderr=open(root / "log", "wb"),
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"docker-registry did not start: {(root / 'log').read_text()[-2000:]}")
                time.sleep(0.1)
        ref = f"127.0.0.1:{port}/paddock/python:3.11"
        subprocess.run(
            ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci-archive:{archive}", f"docker://{ref}"],
            check=True, timeout=300,
        )
        yield ref
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def restartable_server():
    """A private server the test may SIGKILL and start again on the same data dir
    (`server.kill_hard(); server.start()`, same port, same API key)."""
    s = PaddockServer("restartable")
    try:
        s.start()
        yield s
    finally:
        s.cleanup()


# ---------------------------------------------------------------- reporting


@pytest.fixture(autouse=True)
def _server_log_marks(request):
    request.node._paddock_log_marks = {id(s): s.log_size() for s in PaddockServer.registry}
    yield


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(120))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    marks = getattr(item, "_paddock_log_marks", {})
    for s in list(PaddockServer.registry):
        text = s.log_since(marks.get(id(s), 0))
        if text.strip():
            report.sections.append((f"paddock serve log ({s.name}, during this test)", text))
