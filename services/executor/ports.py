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
request: no keep-alive, no upgrade (websockets: ``portws.py``).

Each request, answered or refused, is audited once (``exec.port`` on the workspace, as
``exec.egress`` audits each connection: not counted as a request): who asked (the record's
``actor``/``session``: the gateway's principal, from the ``Ws-*`` headers it sends), and in
``details`` the shell, port, method, path, status, bytes each way (the bodies) and, for a
refusal, its reason. The path is the target's path as sent (percent-encoded), cut at
``AUDIT_PATH_MAX`` characters; the query is never kept, only its length (``query_bytes``): a
query's values are where a URL carries tokens and keys. No header is kept (the client's
``Authorization`` never reaches the executor anyway).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import h11
from nats.aio.msg import Msg

from contracts.errors import ErrorCode, QuillError
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
from contracts.subjects import Address, Origin, new_request_id
from infra.bus import respond
from infra.exec.sandbox.ports import PortRefused, Ports
from infra.runtime import Auditor
from services.executor.shell_state import Shell
from services.executor.shells import Shells

log = logging.getLogger("quill.executor.ports")

MAX_AT_ONCE = 32
"""Port requests one executor serves at once."""
AUDIT_PATH_MAX = 256
"""The most of a request's path an audit record keeps (a longer one is cut, ``…`` added)."""
CODES: dict[PortError, ErrorCode] = {
    "not_found": ErrorCode.SHELL_NOT_FOUND,
    "bad_gateway": ErrorCode.UNAVAILABLE,
    "timeout": ErrorCode.TIMEOUT,
    "invalid": ErrorCode.INVALID_ARGUMENT,
    "busy": ErrorCode.BUSY,
}
"""A refusal's code in its audit record."""


class Refusal(Exception):
    def __init__(self, error: PortError, message: str) -> None:
        super().__init__(message)
        self.error, self.message = error, message


class PortRelay:
    """The ports of the shells this executor holds, as HTTP (see the module docstring)."""

    def __init__(self, shells: Shells, auditor: Auditor) -> None:
        self.shells, self.auditor = shells, auditor
        self.serving = 0
        self.timeout_s = TIMEOUT_S
        """The longest a request waits for the port's whole answer (504 past it)."""

    async def on_request(self, msg: Msg, tenant: str, workspace: str) -> None:
        """One request (``exechold.<route>.<t>.<w>.port``), answered to its inbox, audited."""
        started = time.perf_counter()
        if self.serving >= MAX_AT_ONCE:
            busy = Refusal("busy", "Too many requests to ports at once; retry")
            await respond(msg, _refused(busy.error, busy.message))
            await audit_port(self.auditor, msg, tenant, workspace, started, None, refusal=busy)
            return
        self.serving += 1
        try:
            req: PortRequest | None = None
            head: PortResponse | None = None
            sent = body = b""
            refusal: Refusal | None = None
            try:
                req, sent = _request_of(msg.data)
                head, body = await self.perform(req, sent, tenant, workspace)
                reply = frame(head, body)
            except Refusal as exc:
                refusal = exc
                reply = _refused(exc.error, exc.message)
            except Exception as exc:
                log.exception("port request on %s failed", msg.subject)
                refusal = Refusal("bad_gateway", f"The request failed: {type(exc).__name__}")
                reply = _refused(refusal.error, refusal.message)
            await respond(msg, reply)
            sizes = (len(sent), len(body))
            status = head.status if head else 0
            await audit_port(
                self.auditor, msg, tenant, workspace, started, req, status, sizes, refusal
            )
        finally:
            self.serving -= 1

    async def perform(
        self, req: PortRequest, body: bytes, tenant: str, workspace: str
    ) -> tuple[PortResponse, bytes]:
        """The port's response to ``req``.

        Raises:
            Refusal: why there is none.
        """
        shell, ports = port_of(self.shells, tenant, workspace, req.shell, req.port, req.target)
        where = f"port {req.port} of shell {shell.id}"
        try:
            async with asyncio.timeout(self.timeout_s):
                try:
                    reader, writer = await ports.connect(req.port)
                except PortRefused as exc:
                    raise Refusal("bad_gateway", str(exc).capitalize()) from None
                try:
                    return await _exchange(reader, writer, req, body, where)
                finally:
                    writer.close()
        except TimeoutError:
            why = f"No whole answer from {where} in {self.timeout_s:g} s"
            raise Refusal("timeout", why) from None


def port_of(
    shells: Shells, tenant: str, workspace: str, name: str, port: int, target: str
) -> tuple[Shell, Ports]:
    """The open shell ``name`` of the workspace and its ports, for a request to ``port`` at
    ``target`` (HTTP or a websocket).

    Raises:
        Refusal: no such open shell, or not such a port or target.
    """
    shell = shells.find(Address("exec", tenant, workspace, "port"), name)
    if shell is None or shell.closing or shell.ports is None:
        raise Refusal("not_found", f"No open shell {name} in this workspace")
    if not LOWEST_PORT <= port <= 65535:
        raise Refusal("invalid", f"The port must be from {LOWEST_PORT} to 65535")
    if not target.startswith("/"):
        raise Refusal("invalid", "The target must be a path")
    return shell, shell.ports


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


async def audit_port(
    auditor: Auditor,
    msg: Msg,
    tenant: str,
    workspace: str,
    started: float,
    req: PortRequest | None,
    status: int = 0,
    sizes: tuple[int, int] = (0, 0),
    refusal: Refusal | None = None,
    more: Mapping[str, object] | None = None,
) -> None:
    """The one audit record of a request to a port, or of a websocket once closed (see the
    module docstring; ``more``: more details)."""
    try:
        origin = Origin.from_headers(msg.headers, new_request_id)
    except QuillError:
        origin = Origin(new_request_id())
    details = {**audited(req, status, sizes), **(more or {})}
    error = None
    if refusal is not None:
        details["reason"] = refusal.message
        error = QuillError(CODES[refusal.error], refusal.message)
    what = f"{req.method} port {req.port}" if req else "port"
    summary = f"{what}: {status or (refusal.error if refusal else '?')}"
    address = Address("exec", tenant, workspace, "port")
    await auditor.record(
        address, origin, started, error=error, summary=summary, details=details, counted=False
    )


def _request_of(data: bytes) -> tuple[PortRequest, bytes]:
    """The request framed in ``data`` and its body.

    Raises:
        Refusal: not a port request.
    """
    try:
        return unframe(data, PortRequest)
    except ValueError as exc:
        raise Refusal("invalid", f"Not a port request: {exc}") from None


def audited(req: PortRequest | None, status: int, sizes: tuple[int, int]) -> dict[str, object]:
    """What an audit record keeps of a request to a port (see the module docstring)."""
    path, _, query = (req.target if req else "").partition("?")
    if len(path) > AUDIT_PATH_MAX:
        path = path[:AUDIT_PATH_MAX] + "…"
    return {
        "shell": req.shell[:64] if req else None,
        "port": req.port if req else None,
        "method": req.method[:16] if req else None,
        "path": path,
        "query_bytes": len(query),
        "status": status,
        "request_bytes": sizes[0],
        "response_bytes": sizes[1],
    }


def _refused(error: PortError, message: str) -> bytes:
    return frame(PortResponse(error=error, message=message))
