"""Routes to a server inside a sandbox, as a browser or an agent framework reaches one: a
WebSocket echo server (and plain HTTP) in the sandbox, reached by path, by the
`OpenSandbox-Ingress-To` header and by Host (`--sandbox-domain`); a signed endpoint from the
SDK's `get_signed_endpoint` that works without any header until it expires, for its sandbox and
port only; a ticket that opens one WebSocket handshake once. The lifecycle API is never
reachable through a sandbox route."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import struct
import time
import urllib.request
from datetime import timedelta

import pytest
from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts

from conftest import EXTERNAL, IMAGE, PaddockServer, wait_until

DOMAIN = "sandboxes.test"
PORT = 8765
WS_PER_SANDBOX = 4

# A WebSocket echo server and plain HTTP, with nothing but the standard library.
SERVER = r'''
import base64, hashlib, socket, struct, threading
def recvn(c, n):
    b = b""
    while len(b) < n:
        x = c.recv(n - len(b))
        if not x: raise EOFError
        b += x
    return b
def handle(c):
    data = b""
    while b"\r\n\r\n" not in data:
        x = c.recv(4096)
        if not x: return
        data += x
    lines = data.split(b"\r\n\r\n")[0].decode().split("\r\n")
    path = lines[0].split(" ")[1]
    h = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    if h.get("upgrade", "").lower() != "websocket":
        body = f"plain from sandbox path={path}\n".encode()
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        c.close(); return
    acc = base64.b64encode(hashlib.sha1((h["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Accept: {acc}\r\n\r\n").encode())
    try:
        while True:
            b0, b1 = recvn(c, 2)
            n = b1 & 127
            if n == 126: n = struct.unpack("!H", recvn(c, 2))[0]
            mask = recvn(c, 4) if b1 & 128 else b"\0\0\0\0"
            payload = bytes(x ^ mask[i % 4] for i, x in enumerate(recvn(c, n)))
            if b0 & 15 == 8: return
            reply = b"echo:" + payload
            c.sendall(bytes([0x81, len(reply)]) + reply)
    except EOFError:
        return
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", PORT_NUMBER)); s.listen(16)
while True:
    c, _ = s.accept(); threading.Thread(target=handle, args=(c,), daemon=True).start()
'''.replace("PORT_NUMBER", str(PORT))


def ws_open(port: int, path: str, headers: dict[str, str]) -> tuple[int, socket.socket, str, bytes]:
    """A WebSocket handshake through the server, left open: (status, socket, key, what was read)."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {path} HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", *(f"{k}: {v}" for k, v in headers.items())]
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    return (int(head.split(b" ", 2)[1]) if head else 0), s, key, head


def ws_echo(host: str, port: int, path: str, headers: dict[str, str], message: str) -> tuple[int, str]:
    """One WebSocket handshake and one text message through the server; (status, echo)."""
    status, s, key, head = ws_open(port, path, headers)
    with s:
        if status != 101:
            return status, head.decode(errors="replace")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        assert accept in head, head
        mask = os.urandom(4)
        data = message.encode()
        s.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        frame = head.split(b"\r\n\r\n", 1)[1]
        while len(frame) < 2 or len(frame) < 2 + frame[1]:
            frame += s.recv(4096)
        return status, frame[2:2 + frame[1]].decode()


def http_get(port: int, path: str, headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def routed_server():
    if EXTERNAL:
        pytest.skip("needs a server started with --sandbox-domain")
    s = PaddockServer("routes", ["--sandbox-domain", DOMAIN, "--max-websockets-per-sandbox", str(WS_PER_SANDBOX),
                                 "--ws-idle-timeout", "3s"])
    try:
        s.start()
        yield s
    finally:
        s.cleanup()


@pytest.fixture(scope="module")
def app(routed_server):
    sb = SandboxSync.create(IMAGE, connection_config=routed_server.config("direct"), timeout=timedelta(minutes=10),
                            ready_timeout=timedelta(seconds=30))
    if sb.commands.run("command -v python3").exit_code != 0:
        sb.kill()
        pytest.skip(f"the test's WebSocket server is Python, which the image {IMAGE!r} lacks")
    sb.files.write_file("/tmp/ws.py", SERVER)
    sb.commands.run("python3 /tmp/ws.py", opts=RunCommandOpts(background=True))
    key = {"OPEN-SANDBOX-API-KEY": routed_server.api_key}
    wait_until(lambda: http_get(routed_server.port, f"/v1/sandboxes/{sb.id}/proxy/{PORT}/", key)[0] == 200,
               20, "the sandbox's server to answer")
    try:
        yield sb
    finally:
        sb.kill()
        sb.close()


def test_a_websocket_in_the_sandbox_is_reached_by_path_header_and_host(routed_server, app):
    key = {"OPEN-SANDBOX-API-KEY": routed_server.api_key}
    port = routed_server.port
    assert ws_echo("", port, f"/v1/sandboxes/{app.id}/proxy/{PORT}/ws", key, "by path") == (101, "echo:by path")
    assert ws_echo("", port, "/ws", {**key, "OpenSandbox-Ingress-To": f"{app.id}-{PORT}"}, "by header") == (101, "echo:by header")
    assert ws_echo("", port, "/ws", {**key, "Host": f"{app.id}-{PORT}.{DOMAIN}"}, "by host") == (101, "echo:by host")
    # Unsigned routes take the API key like the path form.
    status, _ = ws_echo("", port, "/ws", {"Host": f"{app.id}-{PORT}.{DOMAIN}"}, "x")
    assert status == 401
    # A routed request reaches the sandbox's server, whatever its path: never the lifecycle API.
    status, body = http_get(port, "/v1/sandboxes", {**key, "Host": f"{app.id}-{PORT}.{DOMAIN}"})
    assert (status, body) == (200, "plain from sandbox path=/v1/sandboxes\n")


def test_a_signed_endpoint_is_a_self_contained_url_for_one_port_until_it_expires(routed_server, app):
    port = routed_server.port
    endpoint = app.get_signed_endpoint(PORT, int(time.time()) + 120).endpoint
    assert endpoint.endswith(f".{DOMAIN}") and endpoint.startswith(f"{app.id}-{PORT}-"), endpoint
    host = endpoint
    assert http_get(port, "/page", {"Host": host}) == (200, "plain from sandbox path=/page\n")
    assert ws_echo("", port, "/ws", {"Host": host}, "signed") == (101, "echo:signed")
    # The same signature for another port, or altered, opens nothing.
    label = host.removesuffix(f".{DOMAIN}")
    other_port = label.replace(f"-{PORT}-", "-8766-", 1)
    assert http_get(port, "/", {"Host": f"{other_port}.{DOMAIN}"})[0] == 401
    tampered = label[:-1] + ("0" if label[-1] != "0" else "1")
    status, body = http_get(port, "/", {"Host": f"{tampered}.{DOMAIN}"})
    assert status == 401 and json.loads(body)["code"] == "INVALID_ROUTE_SIGNATURE", body
    # The path form of the same route works on any Host.
    assert http_get(port, f"/r/{label}/p", {}) == (200, "plain from sandbox path=/p\n")
    # ... and hands the query on untouched.
    assert http_get(port, f"/r/{label}/p?flag&x=a+b%2F", {}) == (200, "plain from sandbox path=/p?flag&x=a+b%2F\n")
    # Expired: refused with a code that says so.
    short = app.get_signed_endpoint(PORT, int(time.time()) + 1).endpoint
    time.sleep(2.2)
    status, body = http_get(port, "/", {"Host": short})
    assert status == 401 and json.loads(body)["code"] == "ROUTE_EXPIRED", body


def test_a_ticket_opens_one_websocket_handshake_once(routed_server, app):
    port = routed_server.port
    req = urllib.request.Request(
        f"{routed_server.base_url}/v1/sandboxes/{app.id}/tickets", data=json.dumps({"port": PORT}).encode(),
        headers={"OPEN-SANDBOX-API-KEY": routed_server.api_key, "Content-Type": "application/json"}, method="POST")
    ticket = json.load(urllib.request.urlopen(req, timeout=10))
    path = f"/r/{app.id}-{PORT}/ws?{ticket['query']}"
    assert ws_echo("", port, path, {}, "ticket") == (101, "echo:ticket")
    status, _ = ws_echo("", port, path, {}, "again")
    assert status == 401, "a ticket must work once"



def test_websockets_have_a_cap_per_sandbox_and_close_when_idle(routed_server, app):
    """Upgraded connections leave --max-connections, so they have caps of their own; a
    tunnel that carries nothing for --ws-idle-timeout is closed, both ways."""
    key = {"OPEN-SANDBOX-API-KEY": routed_server.api_key}
    path = f"/v1/sandboxes/{app.id}/proxy/{PORT}/ws"
    held = []
    try:
        # Earlier tests' tunnels end as their clients close: wait until all places are free.
        def fill():
            while len(held) < WS_PER_SANDBOX:
                status, s, _, _ = ws_open(routed_server.port, path, key)
                if status != 101:
                    s.close()
                    return False
                held.append(s)
            return True
        wait_until(fill, 10, f"{WS_PER_SANDBOX} WebSockets to open")
        status, s, _, _ = ws_open(routed_server.port, path, key)
        s.close()
        assert status == 503, status
        # Idle: after 3 s of silence the server ends each tunnel, which the client sees as EOF.
        started = time.monotonic()
        for s in held:
            s.settimeout(15)
            assert s.recv(4096) == b"", "an idle tunnel was not closed"
        assert time.monotonic() - started >= 2, "closed before the idle time"
        # Their places are free again.
        wait_until(lambda: ws_echo("", routed_server.port, path, key, "after")[0] == 101, 10,
                   "a WebSocket to open once the idle ones are closed")
    finally:
        for s in held:
            s.close()
