"""HTTP requests to a port of a shell, performed by the executor holding it (the gateway's
``/v1/workspaces/{t}/{w}/shells/{id}/ports/{port}/…``; the wire: ``contracts.ports``).

The gateway sends each request on ``<root>.exechold.<route>.<t>.<w>.port`` (services only).
The shell is looked up under that tenant and workspace only (another's, a made-up or a closed
one: ``not_found``); the port must be ``LOWEST_PORT``-65535. The executor connects to
``127.0.0.1:<port>`` in the shell's sandbox (``infra.exec.sandbox.ports``: through its agent
under bwrap, the host's loopback under local), sends the request as HTTP/1.1 (h11) with
``Host: 127.0.0.1:<port>``, ``Connection: close`` and its body's ``Content-Length``, reads
the response (its head within ``HEAD_MAX_BYTES``, its body within ``BODY_MAX_BYTES``, the
whole within ``TIMEOUT_S``) and answers with its status, headers (hop-by-hop ones dropped)
and body. Nothing listening is ``bad_gateway`` (502) with the reason; a response too large or
malformed is ``bad_gateway`` too; no whole answer in time is ``timeout`` (504). At most
``MAX_AT_ONCE`` requests are served at once (``busy`` past it). Each connection serves one
request: no keep-alive, no upgrade (websockets are not relayed).
"""

from __future__ import annotations

import asyncio
import logging

import h11
from nats.aio.msg import Msg

from contracts.ports import (
    BODY_MAX_BYTES,
    HEAD_MAX_BYTES,
    HOP_BY_HOP,
    LOWEST_PORT,
    TIMEOUT_S,
    PortError,
    PortRequest,
    PortResponse,
    frame,
    unframe,
)
from contracts.subjects import Address
from infra.bus import respond
from infra.exec.sandbox.ports import PortRefused
from services.executor.shells import Shells

log = logging.getLogger("quill.executor.ports")

MAX_AT_ONCE = 32
"""Port requests one executor serves at once."""


class Refusal(Exception):
    def __init__(self, error: PortError, message: str) -> None:
        super().__init__(message)
        self.error, self.message = error, message


class PortRelay:
    """The ports of the shells this executor holds, as HTTP (see the module docstring)."""

    def __init__(self, shells: Shells) -> None:
        self.shells = shells
        self.serving = 0
        self.timeout_s = TIMEOUT_S
        """The longest a request waits for the port's whole answer (504 past it)."""

    async def on_request(self, msg: Msg, tenant: str, workspace: str) -> None:
        """One request (``exechold.<route>.<t>.<w>.port``), answered to its inbox."""
        if self.serving >= MAX_AT_ONCE:
            await respond(msg, _refused("busy", "Too many requests to ports at once; retry"))
            return
        self.serving += 1
        try:
            try:
                head, body = await self.perform(msg.data, tenant, workspace)
                reply = frame(head, body)
            except Refusal as refusal:
                reply = _refused(refusal.error, refusal.message)
            except Exception as exc:
                log.exception("port request on %s failed", msg.subject)
                reply = _refused("bad_gateway", f"The request failed: {type(exc).__name__}")
            await respond(msg, reply)
        finally:
            self.serving -= 1

    async def perform(self, data: bytes, tenant: str, workspace: str) -> tuple[PortResponse, bytes]:
        """The port's response to the request framed in ``data``.

        Raises:
            Refusal: why there is none.
        """
        try:
            req, body = unframe(data, PortRequest)
        except ValueError as exc:
            raise Refusal("invalid", f"Not a port request: {exc}") from None
        shell = self.shells.find(Address("exec", tenant, workspace, "port"), req.shell)
        if shell is None or shell.closing or shell.ports is None:
            raise Refusal("not_found", f"No open shell {req.shell} in this workspace")
        if not LOWEST_PORT <= req.port <= 65535:
            raise Refusal("invalid", f"The port must be from {LOWEST_PORT} to 65535")
        if not req.target.startswith("/"):
            raise Refusal("invalid", "The target must be a path")
        where = f"port {req.port} of shell {shell.id}"
        try:
            async with asyncio.timeout(self.timeout_s):
                try:
                    reader, writer = await shell.ports.connect(req.port)
                except PortRefused as exc:
                    raise Refusal("bad_gateway", str(exc).capitalize()) from None
                try:
                    return await _exchange(reader, writer, req, body, where)
                finally:
                    writer.close()
        except TimeoutError:
            why = f"No whole answer from {where} in {self.timeout_s:g} s"
            raise Refusal("timeout", why) from None


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    req: PortRequest,
    body: bytes,
    where: str,
) -> tuple[PortResponse, bytes]:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_MAX_BYTES // 4)
    headers = [("Host", f"127.0.0.1:{req.port}")]
    headers += [(k, v) for k, v in req.headers if k.lower() not in HOP_BY_HOP]
    headers += [("Content-Length", str(len(body))), ("Connection", "close")]
    try:
        out = conn.send(h11.Request(method=req.method, target=req.target, headers=headers))
        out += conn.send(h11.Data(data=body)) if body else b""
        out += conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError as exc:
        raise Refusal("invalid", f"Not a request that can be sent: {exc}") from None
    try:
        writer.write(out or b"")
        await writer.drain()
    except OSError as exc:
        raise Refusal("bad_gateway", f"{where} closed the connection ({exc})") from None
    response: h11.Response | None = None
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise Refusal("bad_gateway", f"{where} answered malformed HTTP ({exc})") from None
        if event is h11.NEED_DATA:
            try:
                data = await reader.read(65536)
            except OSError as exc:
                raise Refusal("bad_gateway", f"{where} reset the connection ({exc})") from None
            conn.receive_data(data)
        elif isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > BODY_MAX_BYTES:
                raise Refusal(
                    "bad_gateway", f"The response of {where} is over {BODY_MAX_BYTES} bytes"
                )
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            break
        elif isinstance(event, h11.ConnectionClosed):
            raise Refusal("bad_gateway", f"{where} closed the connection without an answer")
    assert response is not None
    kept = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in response.headers
        if k.decode("latin-1").lower() not in HOP_BY_HOP
    ]
    return PortResponse(status=response.status_code, headers=kept), b"".join(chunks)


def _refused(error: PortError, message: str) -> bytes:
    return frame(PortResponse(error=error, message=message))
