"""Websockets to a port of a shell, opened and relayed by the executor holding it (the
gateway's websocket route of ``/v1/workspaces/{t}/{w}/shells/{id}/ports/{port}/…``; the wire:
``contracts.ports``, the stream: ``infra.wsstream``).

The gateway asks on ``<root>.exechold.<route>.<t>.<w>.portws`` (services only) with a
``WsOpen``. The shell is looked up under that tenant and workspace only, as for HTTP; at most
``WS_PER_SHELL`` websockets per shell and ``WS_PER_TENANT`` per tenant are open at once
(``busy`` past them). The executor connects to ``127.0.0.1:<port>`` in the shell's sandbox
(``Ports.dial``) and opens the websocket there itself (the ``websockets`` library: no proxy,
no compression, ``WS_MESSAGE_MAX`` per message, within ``WS_OPEN_S``), passing the client's
subprotocols and its headers but credentials, hop-by-hop and handshake ones; it answers
``WsOpened`` with its own inbox, or why not (nothing listening, not a websocket: ``bad_gateway``).
Then it relays messages both ways until either side closes (its code passed on), a message is
lost (1011), or nothing moved for ``WS_IDLE_S`` (1001). The port's messages wait for the
gateway's credit (``WS_WINDOW_BYTES``), and the library reads no more than four messages
ahead of them: a flood from the sandbox meets TCP's backpressure. At the end, one ``exec.port``
audit record: ``method`` ``WEBSOCKET``, status 101, bytes and messages each way, the close code
and which side closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import websockets
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from websockets.asyncio.client import ClientConnection, connect

from contracts.ports import (
    HOP_BY_HOP,
    WS_IDLE_S,
    WS_MESSAGE_MAX,
    WS_OPEN_S,
    WS_PER_SHELL,
    WS_PER_TENANT,
    PortRequest,
    WsOpen,
    WsOpened,
    frame,
    unframe,
)
from infra.bus import respond
from infra.exec.sandbox.ports import PortRefused
from infra.runtime import Auditor
from infra.wsstream import Stream, StreamBroken, close_of, close_payload, until_one_ends
from services.executor.ports import Refusal, audit_port, port_of
from services.executor.shells import Shells

log = logging.getLogger("quill.executor.ports")

NOT_PASSED = HOP_BY_HOP | {"origin", "authorization", "cookie", "proxy-authorization"}
"""Request headers never passed to the port's websocket (``sec-websocket-*`` neither)."""


CLOSE_S = 2.0
"""How long a close the executor sent may wait for the port's."""


class Bounded(ClientConnection):
    """The library's client, closing the TCP connection once a close it sent (a message
    over the bound: 1009) is not answered within ``close_timeout``: the library checks that
    deadline only when it next writes, so a port that floods and never reads would hold the
    connection, and the relay, forever."""

    _abort: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._abort is None and self.protocol.close_expected():
            self._abort = self.loop.call_later(CLOSE_S, self.transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abort is not None:
            self._abort.cancel()
        super().connection_lost(exc)


class Socket:
    """One relayed websocket's counts, for its audit record and the tests."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.close_code: int | None = None
        self.closed_by = ""


class SocketRelay:
    """The websockets to the ports of the shells held here (see the module docstring)."""

    def __init__(self, nc: NATS, shells: Shells, auditor: Auditor) -> None:
        self.nc, self.shells, self.auditor = nc, shells, auditor
        self.per_shell: Counter[str] = Counter()
        self.per_tenant: Counter[str] = Counter()
        self.open: set[Socket] = set()
        self.idle_s = WS_IDLE_S

    async def on_open(self, msg: Msg, tenant: str, workspace: str) -> None:
        """``exechold.<route>.<t>.<w>.portws``: open, answer, relay until closed, audit."""
        started = time.perf_counter()
        req: WsOpen | None = None
        try:
            req = _open_of(msg.data)
            await self._serve(msg, req, tenant, workspace, started)
        except Refusal as refusal:
            await respond(msg, frame(WsOpened(error=refusal.error, message=refusal.message)))
            head = _as_request(req)
            await audit_port(self.auditor, msg, tenant, workspace, started, head, refusal=refusal)

    async def _serve(
        self, msg: Msg, req: WsOpen, tenant: str, workspace: str, started: float
    ) -> None:
        shell, ports = port_of(self.shells, tenant, workspace, req.shell, req.port, req.target)
        if self.per_shell[shell.id] >= WS_PER_SHELL or self.per_tenant[tenant] >= WS_PER_TENANT:
            raise Refusal("busy", "Too many websockets open to this shell's or tenant's ports")
        self.per_shell[shell.id] += 1
        self.per_tenant[tenant] += 1
        try:
            ws = await self._connect(ports.dial, req)
            stream = Stream(self.nc, self.nc.new_inbox())
            stream.peer = req.inbox
            await stream.start()
            relayed = Socket(stream)
            self.open.add(relayed)
            try:
                opened = WsOpened(inbox=stream.inbox, subprotocol=ws.subprotocol)
                await respond(msg, frame(opened))
                await self._relay(ws, relayed)
            finally:
                self.open.discard(relayed)
                await stream.stop()
                await ws.close()
            details = {
                "messages_in": stream.received_messages,
                "messages_out": stream.sent_messages,
                "close_code": relayed.close_code,
                "closed_by": relayed.closed_by,
            }
            sizes = (stream.received, stream.sent)
            await audit_port(
                self.auditor, msg, tenant, workspace, started, _as_request(req), 101, sizes,
                more=details,
            )  # fmt: skip
        finally:
            for counts, key in ((self.per_shell, shell.id), (self.per_tenant, tenant)):
                counts[key] -= 1
                if counts[key] <= 0:
                    del counts[key]

    async def _connect(
        self, dial: Callable[[int], Awaitable[socket.socket]], req: WsOpen
    ) -> ClientConnection:
        headers = [
            (k, v)
            for k, v in req.headers
            if k.lower() not in NOT_PASSED and not k.lower().startswith("sec-websocket-")
        ]
        try:
            async with asyncio.timeout(WS_OPEN_S):
                sock = await dial(req.port)
                return await connect(
                    f"ws://127.0.0.1:{req.port}{req.target}",
                    sock=sock,
                    proxy=None,
                    compression=None,
                    additional_headers=headers,
                    subprotocols=[websockets.Subprotocol(p) for p in req.subprotocols] or None,
                    user_agent_header=None,
                    max_size=WS_MESSAGE_MAX,
                    max_queue=4,
                    open_timeout=None,
                    ping_interval=None,
                    close_timeout=CLOSE_S,
                    create_connection=Bounded,
                )
        except PortRefused as exc:
            raise Refusal("bad_gateway", str(exc).capitalize()) from None
        except TimeoutError:
            why = f"Port {req.port} of shell {req.shell} opened no websocket in {WS_OPEN_S:g} s"
            raise Refusal("timeout", why) from None
        except (OSError, websockets.InvalidHandshake) as exc:
            why = f"Port {req.port} of shell {req.shell} is no websocket ({exc})"
            raise Refusal("bad_gateway", why) from None

    async def _relay(self, ws: ClientConnection, relayed: Socket) -> None:
        stream = relayed.stream
        moved = asyncio.Event()

        async def from_port() -> None:
            try:
                async for message in ws:
                    text = isinstance(message, str)
                    data = message.encode() if isinstance(message, str) else message
                    await stream.send("text" if text else "binary", data)
                    moved.set()
            except websockets.ConnectionClosed:
                pass
            # the port's close, or the library's own (a message over the bound: 1009)
            close = ws.protocol.close_rcvd or ws.protocol.close_sent
            code, reason = (close.code, close.reason) if close else (1006, "")
            relayed.close_code, relayed.closed_by = code, relayed.closed_by or "port"
            await stream.send("close", close_payload(code, reason))

        async def from_client() -> None:
            while True:
                try:
                    kind, payload = await stream.receive()
                except StreamBroken as exc:
                    relayed.close_code, relayed.closed_by = 1011, "stream"
                    await stream.send("close", close_payload(1011, str(exc)))
                    await ws.close(1011, "relay lost a message")
                    return
                if kind == "close":
                    code, reason = close_of(payload)
                    relayed.close_code, relayed.closed_by = code, "client"
                    await ws.close(code if _sendable(code) else 1000, reason)
                    return
                with contextlib.suppress(websockets.ConnectionClosed):
                    await ws.send(payload.decode(errors="replace") if kind == "text" else payload)
                await stream.delivered()
                moved.set()

        async def idle() -> None:
            while True:
                moved.clear()
                try:
                    await asyncio.wait_for(moved.wait(), self.idle_s)
                except TimeoutError:
                    relayed.close_code, relayed.closed_by = 1001, "idle"
                    await stream.send("close", close_payload(1001, "idle"))
                    await ws.close(1001, "idle")
                    return

        async def beat() -> None:  # the gateway's side gone silent: killed, or cut off
            await stream.heartbeat()
            relayed.close_code, relayed.closed_by = 1001, "silent"
            await ws.close(1001, "the client's relay is gone")

        try:
            await until_one_ends(from_port, from_client, idle, beat)
        finally:
            if relayed.closed_by == "":  # ended otherwise (a failure): the gateway hears of it
                relayed.close_code, relayed.closed_by = 1011, "relay"
                await stream.send("close", close_payload(1011, "the relay failed"))


def _sendable(code: int) -> bool:
    """A code a close frame may carry (RFC 6455 7.4: not 1005, 1006, 1015)."""
    return code in (1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011) or 3000 <= code < 5000


def _open_of(data: bytes) -> WsOpen:
    try:
        return unframe(data, WsOpen)[0]
    except ValueError as exc:
        raise Refusal("invalid", f"Not a websocket request: {exc}") from None


def _as_request(req: WsOpen | None) -> PortRequest | None:
    """What the audit record names of a websocket's request."""
    if req is None:
        return None
    return PortRequest(shell=req.shell, port=req.port, method="WEBSOCKET", target=req.target)
