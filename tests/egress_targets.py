"""What the egress tests reach: HTTP servers on loopback that the proxy is made to see as
public hosts (a test resolver names them, a test dial connects a checked public address to
the server), a PEP 503 index with one tiny wheel, and a redirecting server.

The machine has no internet and no public address: ``PUBLIC`` is an address the proxy checks
as public and never connects to (``dial`` sends it to the loopback server). Names:
``pkgs.example.com`` (the index, public), ``loop.example.com`` (127.0.0.1),
``private.example.com`` (10.0.0.1), ``meta.example.com`` (169.254.169.254),
``mixed.example.com`` (127.0.0.1 then the public one: only the public one is used)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import io
import threading
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from infra.exec.addresses import IPAddress
from infra.exec.egress import Policy, ProxyLimits

PUBLIC = "93.184.216.34"
NAMES = {
    "pkgs.example.com": [PUBLIC],
    "redirect.example.com": [PUBLIC],
    "loop.example.com": ["127.0.0.1"],
    "private.example.com": ["10.0.0.1"],
    "meta.example.com": ["169.254.169.254"],
    "mixed.example.com": ["127.0.0.1", PUBLIC],
}
WHEEL = "tinypkg-1.0-py3-none-any.whl"


def wheel() -> bytes:
    """A wheel of ``tinypkg`` 1.0: ``import tinypkg; tinypkg.HELLO``."""
    files = {
        "tinypkg/__init__.py": b"HELLO = 'hello from tinypkg'\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinypkg-1.0.dist-info/RECORD,,")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("tinypkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return buf.getvalue()


@dataclass
class Target:
    """The loopback server behind ``PUBLIC``: the index, ``/redirect?to=URL``, ``/private``
    (what a redirect must never reach), ``/big`` (``big`` bytes)."""

    port: int = 0
    seen: list[str] = field(default_factory=list)
    """Request paths it was asked for (with the Host header)."""
    big: int = 1024 * 1024


@contextmanager
def target() -> Iterator[Target]:
    state = Target()
    data = wheel()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.seen.append(f"{self.headers.get('Host')}{self.path}")
            if self.path.startswith("/redirect?to="):
                self.send_response(302)
                self.send_header("Location", self.path.split("=", 1)[1])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body, kind = b"", "text/html"
            if self.path in ("/simple/", "/simple"):
                body = b'<html><body><a href="/simple/tinypkg/">tinypkg</a></body></html>'
            elif self.path.rstrip("/") == "/simple/tinypkg":
                body = f'<html><body><a href="/files/{WHEEL}">{WHEEL}</a></body></html>'.encode()
            elif self.path == f"/files/{WHEEL}":
                body, kind = data, "application/octet-stream"
            elif self.path == "/big":
                body, kind = b"x" * state.big, "application/octet-stream"
            elif self.path == "/private":
                body = b"SECRET of the internal network"
            else:
                body = f"hello from {self.headers.get('Host')}".encode()
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


async def resolver(name: str, port: int) -> Sequence[str]:
    if name not in NAMES:
        raise OSError(f"{name}: no such name (the test resolver)")
    return NAMES[name]


def policy(server: Target, limits: ProxyLimits | None = None) -> Policy:
    """The proxy's policy in a test: ``resolver``, and a dial sending ``PUBLIC`` to
    ``server`` (any other address is a test failure: the proxy connected where it must not)."""

    async def dial(
        address: IPAddress, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert str(address) == PUBLIC, f"the proxy connected to {address}"
        return await asyncio.open_connection("127.0.0.1", server.port)

    return Policy(limits=limits or ProxyLimits(), resolver=resolver, dial=dial)
