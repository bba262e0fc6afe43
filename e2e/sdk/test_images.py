"""OCI images through the real SDK: a sandbox from an image in a real registry on loopback
(Debian's docker-registry, the image pushed with skopeo), pulled by Paddock on first use. The
image is a Debian root with python3 and pip built by e2e/images/build from Debian packages.

What an agent expects of `python:3.11`: the image's environment and working directory, a
writable root where `pip install` works (a wheel uploaded through the files API, since the
sandbox has no network), every write private to the sandbox, and the sandbox still confined."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from datetime import timedelta

import pytest
from opensandbox import SandboxSync

from conftest import run_ok


def _wheel() -> tuple[str, bytes]:
    """A pure-Python wheel, built here: pip installs it from a file, no index needed."""
    name = "paddock_probe-1.0-py3-none-any.whl"
    files = {
        "paddock_probe/__init__.py": b'VALUE = "installed from a wheel"\n',
        "paddock_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: paddock-probe\nVersion: 1.0\n",
        "paddock_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("paddock_probe-1.0.dist-info/RECORD,,")
    files["paddock_probe-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return name, buf.getvalue()


def _create(conn, ref) -> SandboxSync:
    return SandboxSync.create(
        ref, connection_config=conn, timeout=timedelta(minutes=10), ready_timeout=timedelta(seconds=120)
    )


def test_a_registry_image_runs_with_its_config_and_a_writable_root(conn, registry_image):
    sb = _create(conn, registry_image)
    try:
        assert run_ok(sb, "python3 -c 'import sys; print(sys.version_info[:2])'") == ["(3, 11)"]
        # The image's Env and WorkingDir apply; the sandbox user is still uid 1000.
        assert run_ok(sb, 'echo "$PADDOCK_TEST_IMAGE $LANG"; pwd; id -u') == ["python-bookworm C.UTF-8", "/srv", "1000"]
        # The whiteout layer removed Debian's EXTERNALLY-MANAGED marker.
        assert run_ok(sb, "test ! -e /usr/lib/python3.11/EXTERNALLY-MANAGED && echo gone") == ["gone"]
        # pip installs into the image's own site-packages, from a wheel uploaded as a file.
        name, data = _wheel()
        sb.files.write_file(f"/workspace/{name}", data)
        run_ok(sb, f"python3 -m pip install --no-index --no-cache-dir --disable-pip-version-check -q /workspace/{name}")
        assert run_ok(sb, "cd / && python3 -c 'import paddock_probe; print(paddock_probe.VALUE, paddock_probe.__file__)'") == [
            "installed from a wheel /usr/local/lib/python3.11/dist-packages/paddock_probe/__init__.py"
        ]
        run_ok(sb, "echo tool > /usr/local/bin/made-here && chmod +x /usr/local/bin/made-here")
        # Still confined: no route out, no privilege.
        ex = sb.commands.run("python3 -c \"import socket; socket.create_connection(('192.0.2.1', 80), timeout=2)\"")
        assert ex.exit_code != 0
        assert run_ok(sb, "grep -E '^Cap(Eff|Prm)' /proc/self/status | awk '{print $2}'") == [
            "0000000000000000", "0000000000000000"
        ]
    finally:
        sb.kill()
        sb.close()

    # Another sandbox of the same image starts from the image, not from the last one's writes.
    other = _create(conn, registry_image)
    try:
        assert run_ok(other, "test ! -e /usr/local/bin/made-here && echo clean") == ["clean"]
        ex = other.commands.run("python3 -c 'import paddock_probe'")
        assert ex.exit_code != 0
    finally:
        other.kill()
        other.close()


def test_an_unknown_image_is_a_clear_error(conn, registry_image):
    missing = registry_image.rsplit(":", 1)[0] + ":no-such-tag"
    with pytest.raises(Exception) as info:
        _create(conn, missing)
    assert "no-such-tag" in str(info.value), info.value


def test_a_create_without_entrypoint_runs_the_images_command(server, registry_image):
    import json
    import urllib.request

    def call(method, path, body=None):
        req = urllib.request.Request(
            server.base_url + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"OPEN-SANDBOX-API-KEY": server.api_key, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read() or b"null")

    created = call("POST", "/v1/sandboxes", {"image": {"uri": registry_image}, "timeout": 600})
    try:
        got = call("GET", f"/v1/sandboxes/{created['id']}")
        # The image's Cmd is python3: it starts (and, with no stdin, ends) as a container's would.
        assert got["entrypoint"] == ["python3"], got
    finally:
        call("DELETE", f"/v1/sandboxes/{created['id']}")
