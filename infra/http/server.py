"""Serving an ASGI app on a port: the listening socket (``listen``), uvicorn run inside the
process's event loop and telling when it is up (``serve``), and the heap settled once it is
(``settle_heap``).

uvicorn runs with its httptools protocol bounded by ``bounds.HeaderDeadline`` (a request head
late or large closes the connection), without its own logging configuration or signal
handlers: the process has its own (``infra/runtime.py``: ``run_until_stopped``). Websockets
(a shell's ports only) use the ``websockets`` library's sans-I/O protocol: no compression (no
deflate bombs), ``WS_MESSAGE_MAX`` per message, four messages read ahead of the app, a refused
upgrade no error (``_Websockets``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from contracts.ports import WS_MESSAGE_MAX
from infra.http.bounds import HEADER_TIMEOUT_S, HeaderDeadline

GRACE_S = 5
"""Seconds a stopping server gives the requests in flight."""
KEEP_ALIVE_S = 5
"""Seconds an idle keep-alive connection stays open."""


def listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket whose protocol is named: asyncio sets ``TCP_NODELAY`` only on
    sockets with ``proto == IPPROTO_TCP``, and ``socket.create_server`` leaves it 0, which put
    a 40 ms Nagle/delayed-ACK stall on every keep-alive request after the first.
    ``reuse_port``: other sockets (the gateway's other workers) may listen on the port too,
    the kernel spreading connections across them."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


class _Websockets(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O websockets, whose upgrade refused by an HTTP answer (the websocket
    denial response: a bad token, another tenant's shell) counts as a completed handshake.
    uvicorn leaves it incomplete (as its wsproto protocol does not), so every refusal logged
    ``ERROR ASGI callable returned without completing handshake.``: an operator's alert on
    errors fired on every bad token (uvicorn pull request 3138, open)."""

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True


class Server(uvicorn.Server):
    """uvicorn, leaving signals to the process (``run_until_stopped``) and telling when up."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.up.set()


async def serve(
    app: ASGIApp, sock: socket.socket, header_timeout: float = HEADER_TIMEOUT_S
) -> tuple[Server, asyncio.Task[None]]:
    """Serve ``app`` on ``sock`` (its lifespan run first); serving when it returns. Stop it
    with ``server.should_exit = True`` and await the task.

    Raises:
        RuntimeError: the app did not start (its lifespan failed: the log says why).
    """
    config = uvicorn.Config(
        app,
        http=HeaderDeadline.with_timeout(header_timeout),
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACE_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        ws=_Websockets,
        ws_max_size=WS_MESSAGE_MAX,
        ws_max_queue=4,
        ws_per_message_deflate=False,
    )
    server = Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await server.up.wait()
    if not server.started:
        await task
        raise RuntimeError("the app did not start (see the log)")
    return server, task


def settle_heap() -> None:
    """Exempt what startup built (the MCP SDK, pydantic's schemas, the tool tables: ~110,000
    objects) from the garbage collector. Every call leaves a few objects to the oldest
    generation, so under load a full collection ran every ~0.4 s and walked them all: ~60 ms
    of CPU during which every request in flight waited, which was the gateway's p99
    (docs/performance.md, "Gateway")."""
    gc.collect()
    gc.freeze()
