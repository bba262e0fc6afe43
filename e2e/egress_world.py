#!/usr/bin/env python3
"""A private "outside world" for egress tests: never a real outside host.

    python3 e2e/egress_world.py --name NAME --net 10.77.5

As root, makes a network namespace `pdkw-NAME` joined to the host by a veth pair (host end
NET.1/24; the namespace has NET.2 and NET.3, and the link-local LINK = 169.254.<third octet of
NET>.4, routed to it from the host, which stands in for the cloud metadata address: no test
aims at the real one), a test CA and a certificate for the test names, and serves inside the
namespace:

- DNS (UDP and TCP 53 on NET.2): allowed.test, other.test, denied.test and any name under
  wild.test are NET.2; rebind.test is 127.0.0.1; hostaddr.test is NET.1 (the host's own end);
  metadata.test is LINK; every other name is NXDOMAIN; AAAA answers are empty.
- HTTP on port 80 and HTTPS (the test CA) on 443, on both addresses: `GET /` answers
  "hello from outside host=<Host> sni=<server name>", `GET /bytes/N` answers N bytes, and
  `GET` or `POST /echo...` answers what it received as JSON (method, path, headers and their
  sha256, body, sni; gzip when the request accepts it or `?force=gzip` says so, a body labelled brotli for `?force=br`), `GET /redirect?to=URL` answers 302 to URL.
- A forward proxy on NET.2:3128: `CONNECT ip:port` with `Proxy-Authorization` for
  paddock:proxy-pass opens a tunnel (anything else: 407, or 502 for a name); each request is
  logged as "authority credential" to connects.log beside the CA.

Prints one JSON line ({"ns", "ca", "dns", "ip", "raw_ip", "host_ip", "link_local_ip"}) once everything answers,
then runs until its stdin closes or it gets SIGTERM, and removes all of it.
"""

import argparse
import gzip
import hashlib
import json
import os
import signal
import socket
import socketserver
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAMES_ON_SERVER = ("allowed.test", "other.test", "denied.test")


def link_local(net: str) -> str:
    """The world's link-local address: stands in for the cloud metadata address."""
    return f"169.254.{net.split('.')[2]}.4"


def sh(*args: str, check: bool = True) -> None:
    subprocess.run(args, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


# ------------------------------------------------------------------------ served in the netns

def dns_answer(query: bytes, net: str) -> bytes | None:
    if len(query) < 12:
        return None
    qid, flags, qd = struct.unpack("!HHH", query[:6])
    if qd != 1:
        return None
    labels, i = [], 12
    while i < len(query) and query[i]:
        n = query[i]
        labels.append(query[i + 1:i + 1 + n].decode("ascii", "replace").lower())
        i += 1 + n
    qtype = struct.unpack("!H", query[i + 1:i + 3])[0]
    question = query[12:i + 5]
    name = ".".join(labels)
    table = {n: f"{net}.2" for n in NAMES_ON_SERVER}
    table.update({"rebind.test": "127.0.0.1", "hostaddr.test": f"{net}.1", "metadata.test": link_local(net)})
    addr = table.get(name) or (f"{net}.2" if name.endswith(".wild.test") else None)
    rd = flags & 0x0100
    if addr is None:
        return struct.pack("!HHHHHH", qid, 0x8083 | rd, 1, 0, 0, 0) + question
    if qtype != 1:
        return struct.pack("!HHHHHH", qid, 0x8080 | rd, 1, 0, 0, 0) + question
    answer = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton(addr)
    return struct.pack("!HHHHHH", qid, 0x8080 | rd, 1, 1, 0, 0) + question + answer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A head and a body written apart must not wait for a delayed ACK (40 ms a response).
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:
        pass

    def echo(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        sni = getattr(self.connection, "paddock_sni", None)
        # Digests too: a credential proxy may overwrite values it injected when they come back.
        doc = {"method": self.command, "path": self.path, "sni": sni, "body": body.decode("utf-8", "replace"),
               "headers": {k.lower(): v for k, v in self.headers.items()},
               "digests": {k.lower(): hashlib.sha256(v.encode()).hexdigest() for k, v in self.headers.items()}}
        out = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        # Compressed when asked for, as real servers answer: what echoes a value back then
        # carries it in gzip, where a byte search cannot see it. `?force=gzip` compresses
        # whatever was asked, as a server that ignores `Accept-Encoding: identity` does;
        # `?force=br` labels the body brotli, a coding a credential proxy cannot undo here.
        force = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("force", [""])[0]
        if force == "br":
            self.send_header("Content-Encoding", "br")
        elif force == "gzip" or "gzip" in (self.headers.get("Accept-Encoding") or ""):
            out = gzip.compress(out)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_POST(self) -> None:
        self.echo()

    def do_GET(self) -> None:
        if self.path.startswith("/echo"):
            return self.echo()
        if self.path.startswith("/redirect?to="):
            self.send_response(302)
            self.send_header("Location", urllib.parse.unquote(self.path.split("=", 1)[1]))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/bytes/"):
            n = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"x" * (1 << 16)
            while n > 0:
                self.wfile.write(chunk[: min(n, len(chunk))])
                n -= min(n, len(chunk))
            return
        sni = getattr(self.connection, "paddock_sni", None) or "-"
        body = f"hello from outside host={self.headers.get('Host')} sni={sni}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


# What the world's forward proxy (NET.2:3128) takes: user "paddock", password "proxy-pass".
PROXY_AUTH = "Basic cGFkZG9jazpwcm94eS1wYXNz"


def serve(args) -> None:
    net = args.net
    for bind in (f"{net}.2", f"{net}.3"):
        http = ThreadingHTTPServer((bind, 80), Handler)
        threading.Thread(target=http.serve_forever, daemon=True).start()
        https = ThreadingHTTPServer((bind, 443), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(args.dir, "server.pem"), os.path.join(args.dir, "server.key"))

        def remember(sslsock, name, _ctx):
            sslsock.paddock_sni = name

        ctx.sni_callback = remember
        https.socket = ctx.wrap_socket(https.socket, server_side=True)
        threading.Thread(target=https.serve_forever, daemon=True).start()

    class Udp(socketserver.BaseRequestHandler):
        def handle(self):
            data, sock = self.request
            reply = dns_answer(data, net)
            if reply:
                sock.sendto(reply, self.client_address)

    class Tcp(socketserver.StreamRequestHandler):
        def handle(self):
            hdr = self.rfile.read(2)
            if len(hdr) == 2:
                reply = dns_answer(self.rfile.read(struct.unpack("!H", hdr)[0]), net)
                if reply:
                    self.wfile.write(struct.pack("!H", len(reply)) + reply)

    class Connect(socketserver.StreamRequestHandler):
        """A forward proxy: CONNECT to an address (never a name) with the right credential."""

        def handle(self):
            head = b""
            while not head.endswith(b"\r\n\r\n") and len(head) < 16384:
                b = self.rfile.read(1)
                if not b:
                    return
                head += b
            lines = head.decode(errors="replace").split("\r\n")
            verb, authority = (lines[0].split() + ["", ""])[:2]
            auth = [v.split(":", 1)[1].strip() for v in lines[1:] if v.lower().startswith("proxy-authorization:")]
            with open(os.path.join(args.dir, "connects.log"), "a") as log:
                log.write(f"{authority} {auth[0] if auth else '-'}\n")
            host, _, port = authority.rpartition(":")
            if auth != [PROXY_AUTH]:
                self.wfile.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
                return
            try:
                socket.inet_aton(host)
                up = socket.create_connection((host, int(port)), timeout=5)
            except (OSError, ValueError):
                self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                return
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()

            def pump(a, b):
                try:
                    while data := a.recv(65536):
                        b.sendall(data)
                except OSError:
                    pass
                finally:
                    try:
                        b.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass

            t = threading.Thread(target=pump, args=(up, self.connection), daemon=True)
            t.start()
            pump(self.connection, up)
            t.join()
            up.close()

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    proxy = socketserver.ThreadingTCPServer((f"{net}.2", 3128), Connect)
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True).start()

    socketserver.ThreadingUDPServer.allow_reuse_address = True
    udp = socketserver.ThreadingUDPServer((f"{net}.2", 53), Udp)
    tcp = socketserver.ThreadingTCPServer((f"{net}.2", 53), Tcp)
    threading.Thread(target=udp.serve_forever, daemon=True).start()
    threading.Thread(target=tcp.serve_forever, daemon=True).start()
    print("serving", flush=True)
    while True:
        time.sleep(3600)


# ------------------------------------------------------------------------ setup on the host

def make_certs(d: str) -> None:
    def ossl(*a):
        sh("openssl", *a)
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=Paddock egress test CA",
         "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem")
    san = ",".join(f"DNS:{n}" for n in (*NAMES_ON_SERVER, "*.wild.test"))
    with open(f"{d}/ext.cnf", "w") as f:
        f.write(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=allowed.test", "-keyout", f"{d}/server.key",
         "-out", f"{d}/server.csr")
    ossl("x509", "-req", "-in", f"{d}/server.csr", "-CA", f"{d}/ca.pem", "-CAkey", f"{d}/ca.key",
         "-CAcreateserial", "-days", "2", "-extfile", f"{d}/ext.cnf", "-out", f"{d}/server.pem")
    os.chmod(f"{d}/ca.pem", 0o644)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--net", required=True, help="the first three octets, e.g. 10.77.5")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args)
        return 0
    if os.geteuid() != 0:
        print("egress_world: needs root (network namespaces)", file=sys.stderr)
        return 2
    ns, net = f"pdkw-{args.name}", args.net
    host_if, ns_if = f"pdkw{args.name}h"[:15], f"pdkw{args.name}o"[:15]
    d = tempfile.mkdtemp(prefix="pdkw-")
    os.chmod(d, 0o755)
    server = None

    def teardown(*_):
        if server and server.poll() is None:
            server.kill()
            server.wait()
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", host_if, check=False)
        sh("rm", "-rf", d, check=False)
        sys.exit(0)

    signal.signal(signal.SIGTERM, teardown)
    signal.signal(signal.SIGINT, teardown)
    try:
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", host_if, check=False)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        sh("ip", "addr", "add", f"{net}.1/24", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        for cmd in (["link", "set", "lo", "up"], ["addr", "add", f"{net}.2/24", "dev", ns_if],
                    ["addr", "add", f"{net}.3/24", "dev", ns_if], ["addr", "add", f"{link_local(net)}/32", "dev", ns_if],
                    ["link", "set", ns_if, "up"]):
            sh("ip", "-n", ns, *cmd)
        sh("ip", "route", "add", f"{link_local(net)}/32", "dev", host_if)
        make_certs(d)
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, os.path.abspath(__file__), "--serve", "--name", args.name,
             "--net", net, "--dir", d],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        if server.stdout.readline().strip() != b"serving":
            raise RuntimeError("the servers did not start")
        # The host reaches them: the world is up.
        deadline = time.time() + 10
        while True:
            try:
                socket.create_connection((f"{net}.2", 80), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
    except Exception as e:  # noqa: BLE001 - report and clean up whatever failed
        print(f"egress_world: setup failed: {e}", file=sys.stderr)
        teardown()
        return 1
    print(json.dumps({"ns": ns, "ca": f"{d}/ca.pem", "dns": f"{net}.2", "ip": f"{net}.2",
                      "raw_ip": f"{net}.3", "host_ip": f"{net}.1",
                      "link_local_ip": link_local(net)}), flush=True)
    try:
        sys.stdin.read()
    finally:
        teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
