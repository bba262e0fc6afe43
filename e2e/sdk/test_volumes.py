"""Volumes through the real SDK: `volumes=[Volume(host=...)]` below the server's
`--volume-root`, and named volumes (`pvc=PVC(claimName=...)`) that Paddock makes on first
use and keeps until `DELETE /v1/volumes/{name}`. The checks follow OpenSandbox's own e2e suite
(host mount read and write, read-only, named volume, read-only, subPath) plus what Paddock
adds: host root is never mapped, paths outside the roots and symlinks out of them are refused,
two sandboxes share a named volume, set-id bits are refused, and a mounted volume cannot be
deleted."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from opensandbox import SandboxSync
from opensandbox.models.sandboxes import PVC, Host, Volume

from conftest import EXTERNAL, IMAGE, PaddockServer, capabilities, run_ok, sandboxes_on


@pytest.fixture(scope="module")
def roots():
    if EXTERNAL or os.geteuid() != 0:
        pytest.skip("volumes need root and a server started here (host directories, cleanup)")
    base = Path(tempfile.mkdtemp(prefix="pvol-"))
    shared = base / "shared"
    shared.mkdir()
    (shared / "marker.txt").write_text("opensandbox-e2e-marker\n")
    # As OpenSandbox's harness leaves it: root's, 0755.
    for p in (base, shared, shared / "marker.txt"):
        os.chmod(p, 0o755)
    user = shared / "user"
    user.mkdir()
    os.chown(user, 1000, 1000)
    outside = Path(tempfile.mkdtemp(prefix="pvol-outside-"))
    (outside / "secret").write_text("outside\n")
    os.chmod(outside, 0o755)
    os.symlink(outside, shared / "link-out")
    try:
        yield {"base": base, "shared": shared, "user": user, "outside": outside}
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)


@pytest.fixture(scope="module")
def volume_server(roots):
    s = PaddockServer("volumes", ["--volume-root", str(roots["shared"])])
    try:
        s.start()
        if "named" not in capabilities(s).get("volumes", []):
            pytest.skip("this runtime keeps no named volumes")
        yield s
    finally:
        s.cleanup()


@pytest.fixture
def make(volume_server, mode):
    with sandboxes_on(volume_server, mode) as create:
        yield create


def api(server: PaddockServer, method: str, path: str) -> tuple[int, object]:
    req = urllib.request.Request(server.base_url + path, method=method, headers={"OPEN-SANDBOX-API-KEY": server.api_key})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def confined(sb: SandboxSync) -> None:
    """The sandbox runs as uid 1000 with no capabilities, or nothing else is tried."""
    assert run_ok(sb, "id -u") == ["1000"]
    assert run_ok(sb, "grep CapEff /proc/self/status") == ["CapEff:\t0000000000000000"]


def fails(sb: SandboxSync, command: str) -> str:
    ex = sb.commands.run(command)
    assert ex.error is not None, f"{command!r} should have failed"
    return "".join(m.text for m in ex.logs.stderr)


def needs_host_volumes(server: PaddockServer) -> None:
    if "host" not in capabilities(server).get("volumes", []):
        pytest.skip(f"the {capabilities(server).get('runtime')} runtime mounts no host directories")


def test_a_host_directory_is_read_write_as_its_owner_and_read_only_when_asked(make, roots, volume_server):
    needs_host_volumes(volume_server)
    sb = make(volumes=[
        Volume(name="shared", host=Host(path=str(roots["shared"])), mountPath="/mnt/host-data", readOnly=False),
        Volume(name="user", host=Host(path=str(roots["user"])), mountPath="/mnt/user", readOnly=False),
        Volume(name="ro", host=Host(path=str(roots["user"])), mountPath="/data/ro", readOnly=True),
    ])
    confined(sb)
    assert run_ok(sb, "cat /mnt/host-data/marker.txt") == ["opensandbox-e2e-marker"]
    assert run_ok(sb, "test -d /mnt/host-data && echo OK") == ["OK"]
    # A directory owned by uid 1000 on the host is the sandbox user's inside: written, and the
    # file is 1000's on the host, not the sandbox's own host identity.
    assert run_ok(sb, "stat -c %u /mnt/user") == ["1000"]
    run_ok(sb, "echo written-from-sandbox > /mnt/user/out.txt")
    assert run_ok(sb, "cat /mnt/user/out.txt") == ["written-from-sandbox"]
    st = (roots["user"] / "out.txt").stat()
    assert (st.st_uid, st.st_gid) == (1000, 1000)
    assert (roots["user"] / "out.txt").read_text() == "written-from-sandbox\n"
    # Root's directory is never mapped: readable, and mounted read-only whatever was asked.
    assert "Read-only file system" in fails(sb, "touch /mnt/host-data/should-fail.txt")
    assert not (roots["shared"] / "should-fail.txt").exists()
    # Read-only is the kernel's, and cannot be undone from inside.
    assert "Read-only file system" in fails(sb, "touch /data/ro/should-fail.txt")
    fails(sb, "mount -o remount,rw /data/ro")
    assert "ro," in run_ok(sb, "grep ' /data/ro ' /proc/self/mountinfo")[0].split(" /data/ro ")[1]
    # No set-id file is ever made, on a volume or anywhere else.
    assert "Operation not permitted" in fails(sb, "cp /bin/true /mnt/user/t && chmod u+s /mnt/user/t")
    assert not os.stat(roots["user"] / "t").st_mode & 0o6000
    fails(sb, "python3 -c \"import os; os.open('/tmp/s', os.O_CREAT | os.O_WRONLY, 0o4755)\"")


def test_a_host_volume_mounts_below_tmp_as_the_code_interpreter_suite_asks(make, roots, volume_server):
    """OpenSandbox's code-interpreter suite mounts its logs at /tmp/opensandbox-e2e/logs."""
    needs_host_volumes(volume_server)
    sb = make(volumes=[Volume(name="logs", host=Host(path=str(roots["user"])), mountPath="/tmp/opensandbox-e2e/logs")])
    confined(sb)
    run_ok(sb, "echo from-tmp > /tmp/opensandbox-e2e/logs/tmp.log && echo mine > /tmp/mine")
    assert (roots["user"] / "tmp.log").read_text() == "from-tmp\n"
    assert not (roots["user"] / "mine").exists()


def test_host_paths_outside_the_roots_or_through_symlinks_are_refused(make, roots, volume_server):
    needs_host_volumes(volume_server)
    for path, why in [(str(roots["outside"]), "outside the directories this server allows"),
                      (str(roots["shared"] / "link-out"), "outside the directories this server allows"),
                      ("/etc", "outside the directories this server allows"),
                      (str(roots["shared"] / "missing"), "does not exist")]:
        with pytest.raises(Exception) as e:
            make(volumes=[Volume(name="bad", host=Host(path=path), mountPath="/mnt/x")])
        assert "INVALID_ARGUMENT" in str(e.value) and why in str(e.value), (path, e.value)
    with pytest.raises(Exception) as e:
        make(volumes=[Volume(name="bad", host=Host(path=str(roots["shared"])), mountPath="/proc/x")])
    assert "/proc" in str(e.value)
    # A server without --volume-root refuses host paths and says which flag turns them on.
    status, body = 0, None
    plain = PaddockServer("novolroot")
    try:
        plain.start()
        req = urllib.request.Request(
            plain.base_url + "/v1/sandboxes", method="POST",
            data=json.dumps({"image": {"uri": IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"],
                             "volumes": [{"name": "h", "host": {"path": str(roots["shared"])}, "mountPath": "/mnt/h"}]}).encode(),
            headers={"OPEN-SANDBOX-API-KEY": plain.api_key, "Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=30)
        except urllib.error.HTTPError as err:
            status, body = err.code, json.loads(err.read())
    finally:
        plain.cleanup()
    assert status == 400 and "--volume-root" in body["message"], body


def test_a_named_volume_is_made_kept_shared_and_deleted(make, volume_server):
    local = capabilities(volume_server).get("runtime") == "local"
    name = f"pvc-{uuid.uuid4().hex[:8]}"
    seed = make(volumes=[Volume(name="seed", pvc=PVC(claimName=name), mountPath="/mnt/pvc-data")])
    confined(seed)
    run_ok(seed, "echo pvc-marker-data > /mnt/pvc-data/marker.txt && mkdir -p /mnt/pvc-data/datasets/train"
                 " && echo pvc-subpath-marker > /mnt/pvc-data/datasets/train/marker.txt")
    if local:
        # Its own size cap, not the host's disk (on Kubernetes that is the storage's business).
        size = run_ok(seed, "df -B1 --output=size /mnt/pvc-data | tail -1")[0].strip()
        assert int(size) < 3 << 30, size

    # Another sandbox, at the same time, with its own host identity: sees and writes the files.
    other = make(volumes=[Volume(name="again", pvc=PVC(claimName=name), mountPath="/mnt/pvc-data")])
    assert run_ok(other, "cat /mnt/pvc-data/marker.txt") == ["pvc-marker-data"]
    run_ok(other, "echo written-to-pvc > /mnt/pvc-data/pvc-output.txt")
    assert run_ok(seed, "cat /mnt/pvc-data/pvc-output.txt") == ["written-to-pvc"]

    ro = make(volumes=[Volume(name="ro", pvc=PVC(claimName=name), mountPath="/mnt/pvc-data-ro", readOnly=True)])
    assert run_ok(ro, "cat /mnt/pvc-data-ro/marker.txt") == ["pvc-marker-data"]
    assert "Read-only file system" in fails(ro, "touch /mnt/pvc-data-ro/should-fail.txt")

    sub = make(volumes=[Volume(name="sub", pvc=PVC(claimName=name), mountPath="/mnt/train", subPath="datasets/train")])
    assert run_ok(sub, "cat /mnt/train/marker.txt") == ["pvc-subpath-marker"]
    listing = run_ok(sub, "ls /mnt/train/")
    assert "marker.txt" in listing and "datasets" not in listing
    run_ok(sub, "echo subpath-write-test > /mnt/train/output.txt")
    assert run_ok(seed, "cat /mnt/pvc-data/datasets/train/output.txt") == ["subpath-write-test"]

    if local:
        # A subPath that a sandbox turned into a symlink is refused, never followed (on
        # Kubernetes the kubelet refuses it in its own way: the Pod never starts).
        run_ok(seed, "ln -s / /mnt/pvc-data/escape")
        with pytest.raises(Exception) as e:
            make(volumes=[Volume(name="esc", pvc=PVC(claimName=name), mountPath="/mnt/esc", subPath="escape/etc")])
        assert "symbolic link" in str(e.value), e.value

    # Missing and not to be made: a clear error.
    with pytest.raises(Exception) as e:
        make(volumes=[Volume(name="none", pvc=PVC(claimName=f"{name}-none", createIfNotExists=False), mountPath="/mnt/n")])
    assert "does not exist" in str(e.value), e.value

    status, listed = api(volume_server, "GET", "/v1/volumes")
    mine = [v for v in listed if v["name"] == name]
    assert status == 200 and len(mine) == 1 and len(mine[0]["usedBy"]) == 4, listed
    status, body = api(volume_server, "DELETE", f"/v1/volumes/{name}")
    assert status == 409 and "destroy" in body["message"], body
    for sb in (seed, other, ro, sub):
        sb.kill()
    # The files outlive the sandboxes ...
    again = make(volumes=[Volume(name="later", pvc=PVC(claimName=name), mountPath="/mnt/p")])
    assert run_ok(again, "cat /mnt/p/pvc-output.txt") == ["written-to-pvc"]
    again.kill()
    # ... until the volume is deleted (once no sandbox mounts it: a Pod takes a moment to go).
    for _ in range(120):
        status, body = api(volume_server, "DELETE", f"/v1/volumes/{name}")
        if status != 409:
            break
        time.sleep(0.5)
    assert status == 204, body
    status, listed = api(volume_server, "GET", "/v1/volumes")
    assert name not in [v["name"] for v in listed]
    status, body = api(volume_server, "DELETE", f"/v1/volumes/{name}")
    assert status == 404, body
