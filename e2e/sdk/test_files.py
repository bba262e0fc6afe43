"""execd file API through the real SDK: write, read, list, search, info, move, delete;
text, binary and multi-megabyte files; the file API and commands see the same files."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest
from conftest import run_ok
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.models.filesystem import (
    DirectoryListEntry,
    MoveEntry,
    SearchEntry,
    WriteEntry,
)


def _dir(base: str = "/tmp") -> str:
    return f"{base}/e2e-{uuid.uuid4().hex[:10]}"


def test_text_file_round_trip_and_shared_with_commands(sandbox):
    d = _dir("/workspace")
    path = f"{d}/sub/hello.txt"  # parent directories are created
    text = "héllo wörld\nsecond line\n"
    sandbox.files.write_file(path, text)
    assert sandbox.files.read_file(path) == text
    assert sandbox.files.read_bytes(path) == text.encode()

    # Commands see what the file API wrote, and the other way round.
    assert run_ok(sandbox, f"cat {path}") == ["héllo wörld", "second line"]
    run_ok(sandbox, f"printf 'from-a-command' > {d}/cmd.txt")
    assert sandbox.files.read_file(f"{d}/cmd.txt") == "from-a-command"

    # Overwrite replaces the whole content.
    sandbox.files.write_file(path, "short")
    assert sandbox.files.read_file(path) == "short"


def test_write_file_mode_and_info(sandbox):
    d = _dir()
    sandbox.files.write_files(
        [
            WriteEntry(path=f"{d}/a.sh", data="#!/bin/sh\necho executed\n", mode=755),
            WriteEntry(path=f"{d}/b.txt", data=b"12345", mode=644),
        ]
    )
    assert run_ok(sandbox, f"{d}/a.sh") == ["executed"]
    assert run_ok(sandbox, f"stat -c %a {d}/a.sh {d}/b.txt") == ["755", "644"]

    info = sandbox.files.get_file_info([f"{d}/a.sh", f"{d}/b.txt"])
    assert set(info) == {f"{d}/a.sh", f"{d}/b.txt"}, info
    assert info[f"{d}/b.txt"].path == f"{d}/b.txt"
    assert info[f"{d}/b.txt"].size == 5
    assert info[f"{d}/b.txt"].mode == 644
    assert info[f"{d}/a.sh"].mode == 755
    assert info[f"{d}/b.txt"].entry_type == "file"


def test_binary_file_round_trip_is_byte_exact(sandbox):
    path = f"{_dir()}/blob.bin"
    data = bytes(range(256)) * 64 + os.urandom(64 * 1024) + b"\r\n\x00\xff\xfe"
    sandbox.files.write_file(path, data)
    got = sandbox.files.read_bytes(path)
    assert len(got) == len(data)
    assert got == data
    assert run_ok(sandbox, f"sha256sum {path} | cut -d' ' -f1") == [hashlib.sha256(data).hexdigest()]

    # A binary file made inside the sandbox downloads byte-exact too.
    run_ok(sandbox, f"head -c 100000 /dev/urandom > {path}.2")
    digest = run_ok(sandbox, f"sha256sum {path}.2 | cut -d' ' -f1")[0]
    assert hashlib.sha256(sandbox.files.read_bytes(f"{path}.2")).hexdigest() == digest


@pytest.mark.timeout(180)
def test_multi_megabyte_file_round_trip(sandbox):
    path = f"{_dir('/workspace')}/big.bin"
    data = os.urandom(5 * 1024 * 1024 + 123)
    sandbox.files.write_file(path, data)
    assert sandbox.files.get_file_info([path])[path].size == len(data)
    assert run_ok(sandbox, f"sha256sum {path} | cut -d' ' -f1") == [hashlib.sha256(data).hexdigest()]
    got = sandbox.files.read_bytes(path)
    assert len(got) == len(data)
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()
    streamed = b"".join(sandbox.files.read_bytes_stream(path, chunk_size=256 * 1024))
    assert streamed == data


def test_list_directory(sandbox):
    d = _dir()
    sandbox.files.write_files(
        [
            WriteEntry(path=f"{d}/one.txt", data="1"),
            WriteEntry(path=f"{d}/two.txt", data="22"),
            WriteEntry(path=f"{d}/nested/three.txt", data="333"),
        ]
    )
    entries = sandbox.files.list_directory(DirectoryListEntry(path=d, depth=1))
    by_path = {e.path: e for e in entries}
    assert {f"{d}/one.txt", f"{d}/two.txt", f"{d}/nested"} <= set(by_path), sorted(by_path)
    assert f"{d}/nested/three.txt" not in by_path, "depth=1 must not descend"
    assert by_path[f"{d}/two.txt"].size == 2
    assert by_path[f"{d}/two.txt"].entry_type == "file"
    assert by_path[f"{d}/nested"].entry_type == "directory"

    deep = {e.path for e in sandbox.files.list_directory(DirectoryListEntry(path=d, depth=2))}
    assert f"{d}/nested/three.txt" in deep, sorted(deep)


def test_search(sandbox):
    d = _dir()
    sandbox.files.write_files(
        [
            WriteEntry(path=f"{d}/a.txt", data="a"),
            WriteEntry(path=f"{d}/b.txt", data="bb"),
            WriteEntry(path=f"{d}/c.bin", data=b"\x00"),
        ]
    )
    found = sandbox.files.search(SearchEntry(path=d, pattern="*.txt"))
    assert {e.path for e in found} == {f"{d}/a.txt", f"{d}/b.txt"}, [e.path for e in found]
    sizes = {e.path: e.size for e in found}
    assert sizes[f"{d}/b.txt"] == 2

    everything = sandbox.files.search(SearchEntry(path=d, pattern="*"))
    assert {e.path for e in everything} == {f"{d}/a.txt", f"{d}/b.txt", f"{d}/c.bin"}


def test_move_and_delete(sandbox):
    d = _dir()
    src, dest = f"{d}/src.txt", f"{d}/moved/dest.txt"
    sandbox.files.write_file(src, "payload")
    sandbox.files.create_directories([WriteEntry(path=f"{d}/moved", mode=755)])
    sandbox.files.move_files([MoveEntry(src=src, dest=dest)])
    assert sandbox.files.read_file(dest) == "payload"
    with pytest.raises(SandboxException):
        sandbox.files.read_file(src)
    assert run_ok(sandbox, f"test ! -e {src} && cat {dest}") == ["payload"]

    sandbox.files.delete_files([dest])
    with pytest.raises(SandboxApiException) as ei:
        sandbox.files.read_bytes(dest)
    assert ei.value.status_code == 404, repr(ei.value)
    assert run_ok(sandbox, f"test ! -e {dest} && echo gone") == ["gone"]

    sandbox.files.write_file(f"{d}/tree/x/y.txt", "y")
    sandbox.files.delete_directories([f"{d}/tree"])
    assert run_ok(sandbox, f"test ! -e {d}/tree && echo gone") == ["gone"]


def test_read_missing_file_is_404(sandbox):
    with pytest.raises(SandboxApiException) as ei:
        sandbox.files.read_file(f"{_dir()}/missing.txt")
    assert ei.value.status_code == 404, repr(ei.value)


def test_root_filesystem_is_read_only(sandbox):
    # The host image is mounted read-only: writing outside /workspace and /tmp fails.
    name = f"/etc/e2e-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxException):
        sandbox.files.write_file(name, "nope")
    assert not os.path.exists(name), "the write reached the host's /etc"
    assert run_ok(sandbox, f"test ! -e {name} && echo absent") == ["absent"]


def _write_owned(sandbox, path, data, mode, owner, group):
    """Writes a file with owners through the API; the API and the sandbox both show them."""
    sandbox.files.write_file(path, data, mode=mode, owner=owner, group=group)
    info = sandbox.files.get_file_info([path])[path]
    assert (info.owner, info.group) == (owner, group), info
    assert run_ok(sandbox, f"stat -c '%U:%G %a' {path}") == [f"{owner}:{group} {mode}"]


def test_files_can_be_given_to_nobody_to_other_users_and_back_but_never_to_root(sandbox, server):
    """The SDK's own examples write files owned by nobody:nogroup. Inside, nobody and every other
    user but root are real owners no process runs as: the sandbox user can no longer write such a
    file, nor take it back; only the API can. Root does not exist in a sandbox: refused, with a
    reason, as is a name the sandbox does not know."""
    from opensandbox.models.filesystem import SetPermissionEntry

    from conftest import capabilities

    if capabilities(server).get("runtime") != "local":
        pytest.skip("a Pod's files belong to its one user: nobody is not an owner there")

    assert run_ok(sandbox, "id -u") == ["1000"]
    for base in ("/workspace", "/tmp"):
        d = _dir(base)
        path = f"{d}/owned.txt"
        _write_owned(sandbox, path, "data\n", 644, "nobody", "nogroup")
        ex = sandbox.commands.run(f"echo more >> {path}; chown cloudsdk {path}; chmod 666 {path}")
        stderr = "".join(m.text for m in ex.logs.stderr)
        assert "Permission denied" in stderr and "Operation not permitted" in stderr, stderr
        assert sandbox.files.read_file(path) == "data\n"
        # Given back to the sandbox user through the API, it is writable again.
        sandbox.files.set_permissions([SetPermissionEntry(path=path, owner="1000", group="1000", mode=644)])
        run_ok(sandbox, f"echo more >> {path}")
        assert sandbox.files.read_file(path) == "data\nmore\n"
        sandbox.files.create_directories([WriteEntry(path=f"{d}/nobodys", mode=755, owner="nobody", group="nogroup")])
        assert run_ok(sandbox, f"stat -c %U {d}/nobodys") == ["nobody"]
        # Any user the sandbox's /etc/passwd names, or any id, but root.
        web = f"{d}/web.txt"
        _write_owned(sandbox, web, "page\n", 640, "www-data", "www-data")
        assert run_ok(sandbox, f"stat -c '%u:%g' {web}") == ["33:33"]
        ex = sandbox.commands.run(f"cat {web}")
        assert "Permission denied" in "".join(m.text for m in ex.logs.stderr)
        sandbox.files.set_permissions([SetPermissionEntry(path=web, owner="4242", group="nogroup", mode=644)])
        assert run_ok(sandbox, f"stat -c '%u:%g' {web}") == ["4242:65534"]
        assert sandbox.files.read_file(web) == "page\n"
    for owner in ("root", "0"):
        with pytest.raises(SandboxException) as e:
            sandbox.files.write_file(f"{_dir('/workspace')}/r.txt", "x", owner=owner)
        assert "root" in str(e.value) and "does not exist inside a sandbox" in str(e.value), e.value
    with pytest.raises(SandboxException) as e:
        sandbox.files.write_file(f"{_dir('/workspace')}/u.txt", "x", owner="no-such-user")
    assert "no-such-user" in str(e.value) and "/etc/passwd" in str(e.value), e.value
    # A file the sandbox does not own stays out of reach (the root filesystem is the host's).
    with pytest.raises(SandboxException):
        sandbox.files.set_permissions([SetPermissionEntry(path="/etc/hostname", owner="nobody", mode=644)])
    # Set-id bits are refused, not dropped in silence: no file in a sandbox may have them.
    tool = f"{_dir('/workspace')}/tool"
    sandbox.files.write_file(tool, "#!/bin/sh\n", mode=755)
    for mode in (4755, 2755):
        with pytest.raises(SandboxException) as e:
            sandbox.files.set_permissions([SetPermissionEntry(path=tool, mode=mode)])
        assert "set-user-id or set-group-id" in str(e.value), e.value
    assert run_ok(sandbox, f"stat -c %a {tool}") == ["755"]
