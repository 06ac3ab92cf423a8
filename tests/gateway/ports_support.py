"""What the tests of a shell's ports share (``tests/gateway/test_shell_ports.py``,
``tests/security/test_shell_ports.py``): a writer, a reader, an executor of one provider and a
gateway with two tenants' tokens (the ``st`` fixture, imported by both); the test server a
shell runs; a free port; raw HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from websockets.asyncio.client import connect

from quill.client import Quill
from services.executor.app import Executor, ExecutorConfig
from services.gateway.access import Principal, Tokens
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.helpers import eventually, start_executor

TOKEN_A, TOKEN_B = "token-of-acme-0123456789", "token-of-rival-0123456789"
A, B = "acme/w", "rival/w"
ACME, RIVAL = Principal("acme", "w", actor="ada"), Principal("rival", "w", actor="eve")
ECHO = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Echo(BaseHTTPRequestHandler):
    def answer(self):
        if self.path == "/slow":
            time.sleep(3600)
        if self.path == "/endless":
            self.send_response(200)
            self.end_headers()
            while True:
                self.wfile.write(b"x" * 65536)
        n = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({
            "method": self.command, "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": self.rfile.read(n).decode(), "tag": sys.argv[2],
        }).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "quill_token=planted; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_DELETE = answer
    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"""
"""A test server for a shell: ``python3 echo.py PORT TAG``; answers what it got as JSON
(``/slow`` never answers, ``/endless`` never ends)."""


def free_port() -> int:
    """A port free on the host's loopback now (the local provider shares the host's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    gateway: Gateway
    executor: Executor
    quill: Quill
    provider: str

    def url(self, workspace: str, shell: str, port: int, path: str = "/") -> str:
        return f"{self.gateway.url}/v1/workspaces/{workspace}/shells/{shell}/ports/{port}{path}"

    def port(self) -> int:
        """The port a shell's server listens on: 8000 in a bwrap sandbox (its own network),
        a free one of the host's under local."""
        return 8000 if self.provider == "bwrap" else free_port()


@asynccontextmanager
async def stack(
    start: StartGateway, nats_url: str, tmp_path: Path, provider: str
) -> AsyncIterator[Stack]:
    gateway = await start(tokens=Tokens({TOKEN_A: ACME, TOKEN_B: RIVAL}))
    async with AsyncExitStack() as es:
        config = ExecutorConfig(sandbox=provider)
        executor = await start_executor(es, nats_url, tmp_path / "executor", config)
        quill = await Quill.connect(nats_url, actor="tester", timeout=10)
        es.push_async_callback(quill.close)
        for name in (A, B):
            await quill.workspace(name).create(exist_ok=True)
        yield Stack(gateway, executor, quill, provider)


@pytest_asyncio.fixture
async def st(
    start: StartGateway, nats_url: str, tmp_path: Path, provider: str
) -> AsyncIterator[Stack]:
    async with stack(start, nats_url, tmp_path, provider) as s:
        yield s


def as_(token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)


async def in_a_shell(
    st: Stack,
    workspace: str,
    port: int,
    tag: str,
    script: str,
    ready: Callable[[httpx.Response], bool],
) -> str:
    """A shell of ``workspace`` running ``script`` (``python3 <it> PORT TAG``, in the
    background) on ``port``; its id, once a GET of ``/up`` through the gateway answers what
    ``ready`` takes (the shell is closed with the executor)."""
    ws = st.quill.workspace(workspace)
    await ws.write("server.py", script)
    sh = await ws.shell()
    r = await sh.run(f"python3 server.py {port} {tag} >/dev/null 2>&1 &")
    assert r.exit_code == 0, r
    token = TOKEN_A if workspace == A else TOKEN_B
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:

        async def up() -> bool:
            return ready(await http.get(st.url(workspace, sh.id, port, "/up")))

        await eventually(up, what="the shell's server answers through the gateway")
    return sh.id


async def serve(st: Stack, workspace: str, port: int, tag: str) -> str:
    """A shell of ``workspace`` running the echo server on ``port``, answering through the
    gateway; its id (closed with the executor)."""
    return await in_a_shell(st, workspace, port, tag, ECHO, lambda r: r.status_code == 200)


async def raw_http(url: str, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as it is to the gateway at ``url``; the status and the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 40)
    writer.close()
    return int(data.split(b" ", 2)[1]), data


WS_ECHO = r"""
import base64, hashlib, json, socket, struct, sys, threading

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def frame(opcode, data):
    n = len(data)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + struct.pack(">H", n)
    else:
        head += bytes([127]) + struct.pack(">Q", n)
    return head + data

def exact(f, n):
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data

def serve(conn):
    f = conn.makefile("rb")
    lines = []
    while True:
        line = f.readline(8192)
        if line in (b"\r\n", b""):
            break
        lines.append(line.decode("latin-1").rstrip("\r\n"))
    headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + GUID).digest())
    extra = ""
    if "sec-websocket-protocol" in headers:
        extra = "Sec-WebSocket-Protocol: %s\r\n" % headers["sec-websocket-protocol"].split(",")[0]
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n"
                 + extra.encode() + b"\r\n")
    while True:
        b1, b2 = exact(f, 2)
        opcode, n = b1 & 0x0F, b2 & 0x7F
        if n == 126:
            n = struct.unpack(">H", exact(f, 2))[0]
        elif n == 127:
            n = struct.unpack(">Q", exact(f, 8))[0]
        mask = exact(f, 4) if b2 & 0x80 else b"\0\0\0\0"
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(exact(f, n)))
        if opcode == 8:
            conn.sendall(frame(8, data[:2]))
            return
        if opcode == 9:
            conn.sendall(frame(10, data))
            continue
        text = data.decode(errors="replace") if opcode == 1 else ""
        if text == "headers":
            got = {"path": lines[0].split(" ")[1], "headers": headers, "tag": sys.argv[2]}
            conn.sendall(frame(1, json.dumps(got).encode()))
        elif text.startswith("close:"):
            conn.sendall(frame(8, struct.pack(">H", int(text[6:])) + b"bye"))
            return
        elif text.startswith("flood:"):
            chunk = b"x" * int(text[6:])
            while True:
                conn.sendall(frame(2, chunk))
        else:
            conn.sendall(frame(opcode, data))

def one(conn):
    try:
        serve(conn)
    except (EOFError, OSError):
        pass
    finally:
        conn.close()

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
while True:
    threading.Thread(target=one, args=(s.accept()[0],), daemon=True).start()
"""
"""A websocket server for a shell, by hand (the sandbox's python has no websockets library):
``python3 ws.py PORT TAG``; echoes each message; ``headers`` answers the request's path and
headers as JSON, ``close:CODE`` closes with that code, ``flood:N`` sends N-byte messages
without end."""


async def serve_ws(st: Stack, workspace: str, port: int, tag: str) -> str:
    """A shell of ``workspace`` running ``WS_ECHO`` on ``port``; its id (once it listens: a
    plain GET is closed by the server, not refused)."""
    return await in_a_shell(
        st, workspace, port, tag, WS_ECHO, lambda r: "Nothing listens" not in r.text
    )


def ws_url(st: Stack, workspace: str, shell: str, port: int, path: str = "/") -> str:
    return st.url(workspace, shell, port, path).replace("http://", "ws://", 1)


def ws_as(token: str | None, url: str, **options: Any) -> connect:
    """A websocket client to ``url`` with ``token`` (None: without), no proxy."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return connect(url, additional_headers=headers, proxy=None, open_timeout=30, **options)
