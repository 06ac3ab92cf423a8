"""``/mcp`` and ``/mcp/wap`` over HTTP: the MCP SDK's stateless JSON exchange, answered in the
request's own task.

The SDK's stateless streamable-HTTP path (``StreamableHTTPSessionManager``) builds, for every
POST, a transport, two pairs of memory streams, a message-router task, a ``JSONRPCDispatcher``
and a handler task in the manager's task group, and tears them down again: ~0.6 ms of CPU a
call on this machine, more than the rest of the request, and the scheduling behind the
gateway's tail latency (docs/performance.md, "Gateway"). None of it carries anything in
stateless JSON mode: the client's POST gets exactly one JSON body back, notifications the
handler sends have no wire (the SDK drops them), and the handler cannot ask the client
anything (``can_send_request`` is False). ``Exchange`` answers such a request the way the
SDK's own 2026-07-28 single-exchange entry does: the SDK's kernel (``serve_one``: the
server's middleware, method table, validation and result serialization) runs in the ASGI
task, and the reply is framed as the stateless transport frames it (the same status, headers
and JSON, errors mapped by the same rungs).

Only the plain case takes this path: a POST of one JSON-RPC request (not ``initialize``)
with a handshake-era or absent ``MCP-Protocol-Version``, accepted as JSON, within the body
limit, past the SDK's Host/Origin/Content-Type checks. Everything else POSTed
(notifications, batches, malformed bodies, ``initialize``, 2026-07-28 requests, refusals) goes
to the SDK unchanged, with the body read here handed on.

**Progress.** A JSON answer has no room for notifications, but a tool call that waits (a
command, output still to come: ``engine.with_progress``) must be able to tell a client that
asked for progress (``_meta.progressToken``) that it still waits, or the client times the call
out (Claude Code does). The transport lets a server answer any request with an SSE stream
instead of JSON, when the client accepts both (as every client must). So such a call is
answered as JSON unless it sends a notification: at the first one the answer becomes
``text/event-stream`` (``_Sse``), the notifications are its events, the response its last.
A 2026-07-28 request asking for progress goes to the SDK's own single-exchange entry in its SSE
mode (``handle_modern_request``: it defers SSE the same way); without a progress token, to the
JSON mode as before.

Any other method is answered ``405 Method Not Allowed`` (``Allow: POST``). The transport's words
(streamable HTTP, "Listening for Messages from the Server"): "The server MUST either return
Content-Type: text/event-stream in response to this HTTP GET, or else return HTTP 405 Method Not
Allowed, indicating that the server does not offer an SSE stream at this endpoint." A stateless
server has nothing to send on such a stream (no session, no request to the client), yet the
SDK's stateless path opened one for every ``GET`` and held it open for good: a request slot
each, until 1,100 of them from one tenant left none for the others (``infra/http/inflight.py``).
``DELETE`` ends a session ("The server MAY respond to this request with HTTP 405"): with an
``Mcp-Session-Id`` this gateway made (``clients``) and an ``ended`` hook (``/mcp``: the
session's shells are closed, ``terminal``), it is answered ``200``; otherwise ``405`` as
before (there is nothing else a session holds).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import pydantic_core
from mcp.server._streamable_http_modern import handle_modern_request
from mcp.server.connection import Connection
from mcp.server.runner import serve_one
from mcp.server.streamable_http import check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import (
    handler_exception_to_error_data,
    progress_token_from_params,
)
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    ProgressToken,
    RequestId,
    jsonrpc_message_adapter,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from services.gateway.access import Principal, principal_of
from services.gateway.mcp import clients

log = logging.getLogger("quill.gateway")

_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode("latin-1")
_TRANSPORT = TransportContext(kind="streamable-http", can_send_request=False)
"""What the SDK's stateless path tells a handler of its transport."""
_JSON = [(b"content-type", b"application/json")]
_NOT_ALLOWED_BODY = (
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Method Not Allowed: '
    b"this MCP endpoint is stateless: it offers no SSE stream (GET) and no session to end "
    b'(DELETE); POST each JSON-RPC message"}}'
)
_SSE = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]
"""An answer streamed as events (the SDK's SSE answer's headers, but for the connection's)."""
_EMPTY = [(b"content-length", b"0")]
_NOT_ALLOWED = [
    *_JSON,
    (b"allow", b"POST"),
    (b"content-length", str(len(_NOT_ALLOWED_BODY)).encode()),
]


def _event(message: JSONRPCResponse | JSONRPCError | JSONRPCNotification) -> bytes:
    """``message`` as one SSE ``message`` event."""
    data = message.model_dump_json(by_alias=True, exclude_none=True)
    return f"event: message\r\ndata: {data}\r\n\r\n".encode()


class _Sse:
    """The answer of a request that asked for progress: JSON until a notification is sent,
    then an event stream (see the module's docstring)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def notify(self, message: JSONRPCNotification) -> None:
        if not self.started:
            self.started = True
            await self.send({"type": "http.response.start", "status": 200, "headers": _SSE})
        await self.send({"type": "http.response.body", "body": _event(message), "more_body": True})

    async def finish(self, reply: JSONRPCResponse | JSONRPCError) -> bool:
        """Send ``reply`` as the stream's last event; False when no stream was started."""
        if not self.started:
            return False
        await self.send({"type": "http.response.body", "body": _event(reply), "more_body": False})
        return True


@dataclass
class _Dispatch:
    """The ``DispatchContext`` of one stateless JSON exchange: no back channel; progress sent
    on ``stream`` when the client asked for it and accepts events, any other notification
    (logs) dropped, as the SDK drops them in JSON mode."""

    request_id: RequestId
    message_metadata: ServerMessageMetadata
    cancel_requested: anyio.Event
    """Never set: a stateless exchange has no way for the client to cancel it but to go away."""
    progress_token: ProgressToken | None = None
    transport: TransportContext = _TRANSPORT
    can_send_request: bool = False
    stream: _Sse | None = None

    async def send_raw_request(
        self, method: str, params: Any, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        raise NoBackChannelError(method)

    async def notify(self, method: str, params: Any, opts: CallOptions | None = None) -> None:
        return None

    async def progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        if self.stream is None or self.progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self.progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        notification = JSONRPCNotification(
            jsonrpc="2.0", method="notifications/progress", params=params
        )
        await self.stream.notify(notification)


class Exchange:
    """The ASGI app of one MCP endpoint (``manager``: its SDK session manager, stateless and
    JSON); ``fast`` False sends every request to the SDK (tests compare the two)."""

    def __init__(
        self,
        manager: StreamableHTTPSessionManager,
        *,
        fast: bool = True,
        ended: Callable[[Principal, str], Awaitable[object]] | None = None,
    ) -> None:
        if not (manager.stateless and manager.json_response):
            raise ValueError("Exchange serves a stateless, JSON-response session manager")
        self.manager = manager
        self.fast = fast
        self.ended = ended
        """Told of a session's end (its ``DELETE``): the caller and the session."""
        self.security = TransportSecurityMiddleware(manager.security_settings)
        self._never: anyio.Event | None = None
        """``cancel_requested`` of every exchange (one: making one costs ~2% of a call)."""
        self.answered = 0
        """Requests answered here rather than by the SDK (tests check the path is taken)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self.manager
        if scope["method"] == "DELETE" and await self._end(scope, send):
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 405, "headers": _NOT_ALLOWED})
            await send({"type": "http.response.body", "body": _NOT_ALLOWED_BODY})
            return
        if not self.fast or scope["method"] != "POST" or manager._task_group is None:  # noqa: SLF001
            await manager.handle_request(scope, receive, send)
            return
        version = next((v for k, v in scope["headers"] if k == _VERSION_HEADER), None)
        body, trailing = await _body(receive)
        if version is not None and version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS:
            replayed = _replay(body, trailing, receive)  # 2026-07-28: the SDK's own
            if trailing is None and b"progressToken" in body:  # events, if it sends progress
                app, security = manager.app, manager.security_settings
                state = manager._lifespan_state  # noqa: SLF001 (entered by run())
                await handle_modern_request(app, security, False, state, scope, replayed, send)
                return
            await manager.handle_request(scope, replayed, send)
            return
        message = None
        if trailing is None and len(body) <= manager.max_request_body_size:
            request = Request(scope, _replay(body, trailing, receive))
            message = await self._plain(request, body)
        if message is None:
            session = _session_for(body) if trailing is None else None
            answering = send if session is None else _with_session(send, session)
            await manager.handle_request(scope, _replay(body, trailing, receive), answering)
            return
        self.answered += 1
        await request.body()  # as the SDK's transport did: a handler may ask for it again
        await self._answer(request, message, version, send)

    async def _end(self, scope: Scope, send: Send) -> bool:
        """A ``DELETE`` of a session this gateway made: ``ended`` told, ``200``; False (not
        answered) for any other."""
        header = clients.SESSION_HEADER.encode()
        value = next((v for k, v in scope["headers"] if k == header), b"")
        session = clients.from_session(value.decode("latin-1"))
        if self.ended is None or session is None:
            return False
        await self.ended(principal_of(scope), session[0])
        await send({"type": "http.response.start", "status": 200, "headers": _EMPTY})
        await send({"type": "http.response.body", "body": b""})
        return True

    async def _plain(self, request: Request, body: bytes) -> JSONRPCRequest | None:
        """The request's JSON-RPC request when it is the plain case (see the module's
        docstring)."""
        if await self.security.validate_request(request, is_post=True) is not None:
            return None
        if not check_accept_headers(request)[0]:
            return None
        content_type = request.headers.get("content-type", "")
        if "application/json" not in (p.strip() for p in content_type.split(";")[0].split(",")):
            return None
        try:
            message = jsonrpc_message_adapter.validate_python(
                pydantic_core.from_json(body), by_name=False
            )
        except (ValueError, ValidationError):
            return None
        if not isinstance(message, JSONRPCRequest) or message.method == "initialize":
            return None
        return message

    async def _answer(
        self, request: Request, message: JSONRPCRequest, version: bytes | None, send: Send
    ) -> None:
        if self._never is None:
            self._never = anyio.Event()
        token = progress_token_from_params(message.params)
        stream = _Sse(send) if token is not None and check_accept_headers(request)[1] else None
        dispatch = _Dispatch(
            message.id,
            ServerMessageMetadata(request_context=request, can_send_request=False),
            self._never,
            token,
            stream=stream,
        )
        connection = Connection.from_envelope(
            version.decode("latin-1") if version is not None else DEFAULT_NEGOTIATED_VERSION,
            None,
            None,
        )
        reply: JSONRPCResponse | JSONRPCError
        try:
            result = await serve_one(
                self.manager.app,
                dispatch,
                message.method,
                message.params,
                connection=connection,
                lifespan_state=self.manager._lifespan_state,  # noqa: SLF001 (entered by run())
            )
        except Exception as exc:  # the SDK dispatcher's rungs, its code 0 for the rest
            error = handler_exception_to_error_data(exc)
            if error is None:
                log.exception("handler for %r raised", message.method)
                error = ErrorData(code=0, message=str(exc))
            reply = JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
        else:
            reply = JSONRPCResponse(jsonrpc="2.0", id=message.id, result=result)
        if stream is not None and await stream.finish(reply):
            return
        payload = reply.model_dump_json(by_alias=True, exclude_unset=True).encode()
        headers = [*_JSON, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _session_for(body: bytes) -> str | None:
    """For an ``initialize`` naming its client: the ``Mcp-Session-Id`` that carries the name
    (``clients``: a handshake-era client sends it back with each request after)."""
    if b'"initialize"' not in body:
        return None
    try:
        data = pydantic_core.from_json(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("method") != "initialize":
        return None
    params = data.get("params")
    info = params.get("clientInfo") if isinstance(params, dict) else None
    return clients.session_id(info.get("name") if isinstance(info, dict) else None)


def _with_session(send: Send, session: str) -> Send:
    """``send``, a successful answer given ``Mcp-Session-Id: session``."""
    header = (clients.SESSION_HEADER.encode(), session.encode("ascii"))

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] == 200:
            headers = [(k, v) for k, v in message.get("headers", ()) if k != header[0]]
            message = {**message, "headers": [*headers, header]}
        await send(message)

    return sending


async def _body(receive: Receive) -> tuple[bytes, Message | None]:
    """The body, and the message that ended it early (a disconnect) if one did."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, trailing: Message | None, receive: Receive) -> Receive:
    """``receive`` as if nothing had been read: the body (then what ended it) first."""
    pending: list[Message] = [] if trailing is None else [trailing]
    pending.append({"type": "http.request", "body": body, "more_body": trailing is not None})

    async def again() -> Message:
        return pending.pop() if pending else await receive()

    return again
