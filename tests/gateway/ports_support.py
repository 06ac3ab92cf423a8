"""What the tests of a shell's ports share (``tests/gateway/test_shell_ports.py``,
``tests/security/test_shell_ports.py``): a writer, a reader, an executor of one provider and a
gateway with two tenants' tokens (the ``st`` fixture, imported by both); the test server a
shell runs; a free port; raw HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest_asyncio

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


async def serve(st: Stack, workspace: str, port: int, tag: str) -> str:
    """A shell of ``workspace`` running the echo server on ``port``, answering through the
    gateway; its id (closed with the executor)."""
    ws = st.quill.workspace(workspace)
    await ws.write("echo.py", ECHO)
    sh = await ws.shell()
    r = await sh.run(f"python3 echo.py {port} {tag} >/dev/null 2>&1 &")
    assert r.exit_code == 0, r
    token = TOKEN_A if workspace == A else TOKEN_B
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:

        async def up() -> bool:
            return (await http.get(st.url(workspace, sh.id, port, "/up"))).status_code == 200

        await eventually(up, what="the shell's server answers through the gateway")
    return sh.id


async def raw_http(url: str, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as it is to the gateway at ``url``; the status and the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 40)
    writer.close()
    return int(data.split(b" ", 2)[1]), data
