"""The gateway's in-flight bound: at most ``max_inflight`` HTTP requests served at once.

Past it a request is answered at once, before its body is read or anything is asked of NATS:

* REST and the console: ``503`` with ``Retry-After`` (seconds) and the busy error
  ``{"error": "unavailable", "message", "details": {"reason": "busy", "queue": "http",
  "retry_after_ms"}}``;
* MCP (``/mcp``, ``/mcp/wap``, a ``POST`` of JSON-RPC): ``200`` with, for a ``tools/call``, a
  tool error result (``isError``) saying when to retry, and for another method a JSON-RPC
  error (``-32000``) with the busy details as ``data``. Reading the JSON-RPC id needs the
  body: at most ``MCP_PEEK_BYTES`` of it are read, a larger one is answered ``503``.

``/health`` and ``/metrics`` are never counted nor refused (an operator still sees a flooded
gateway, and ``/health`` says ``busy``, 503, while every slot is taken: ``Slots.health``).
``quill_gateway_inflight_requests`` is the number served now; each refusal counts in
``quill_busy_rejections_total{service="gateway",queue="http"}``.

A response of server-sent events (a stream, ``streams.py``) gives its slot back when it
starts and holds one of its principal's streams instead, or is refused (``429``, or ``503``
past the gateway's total) if its principal has none left: streams left open never take the
slots requests need.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import prometheus_client as prom
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.errors import QuillError
from contracts.limits import GATEWAY_MAX_INFLIGHT, GATEWAY_RETRY_AFTER_MS
from infra.busy import refused
from infra.http.streams import Streams, is_stream, owner

INFLIGHT = prom.Gauge(
    "quill_gateway_inflight_requests",
    "HTTP requests this gateway process is serving now (/health and /metrics not counted).",
)

UNCOUNTED = frozenset({"/health", "/metrics"})
MCP_PATHS = frozenset({"/mcp", "/mcp/wap"})
MCP_PEEK_BYTES = 64 * 1024
"""The most of a refused MCP request's body read to find its JSON-RPC id."""
PEEK_TIMEOUT_S = 5.0
"""The most time that body has to arrive (then the answer is ``503``)."""
BUSY_RPC_CODE = -32000
"""JSON-RPC's "server error" range: the gateway is busy."""


class Slots:
    """What ``Inflight`` counts: the requests served now (at most ``max_inflight``) and the
    streams open (``streams``); ``/health`` reads it too."""

    def __init__(self, max_inflight: int = GATEWAY_MAX_INFLIGHT, streams: Streams | None = None):
        self.max_inflight = max_inflight
        self.serving = 0
        self.streams = streams or Streams()

    @property
    def full(self) -> bool:
        return self.serving >= self.max_inflight

    def health(self) -> dict[str, Any]:
        """``/health``'s ``http``: the slots taken and the streams open, with their bounds."""
        return {
            "inflight": self.serving,
            "max_inflight": self.max_inflight,
            "streams": self.streams.open,
            "max_streams": self.streams.total,
            "max_streams_per_principal": self.streams.per_principal,
        }


class _StreamRefused(Exception):
    """Raised into the app once its stream was refused (the refusal is sent): it ends it."""


class Inflight:
    """ASGI middleware bounding the requests served at once (``max_inflight``, or ``slots``'s)
    and the streams open."""

    def __init__(
        self,
        app: ASGIApp,
        max_inflight: int = GATEWAY_MAX_INFLIGHT,
        retry_after_ms: int = GATEWAY_RETRY_AFTER_MS,
        slots: Slots | None = None,
    ) -> None:
        self.app, self.retry_after_ms = app, retry_after_ms
        self.slots = slots or Slots(max_inflight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED:
            await self.app(scope, receive, send)
            return
        slots = self.slots
        if slots.full:
            error = refused(
                "gateway",
                "http",
                "The gateway",
                self.retry_after_ms,
                limit=slots.max_inflight,
            )
            await self._refuse(scope, receive, send, error)
            return
        slots.serving += 1
        INFLIGHT.inc()
        scope.setdefault("state", {})  # shared: where PrincipalMiddleware names the caller
        held, stream, refusal = True, None, False

        async def sending(message: Message) -> None:
            nonlocal held, stream, refusal
            if refusal:
                raise _StreamRefused
            if message["type"] == "http.response.start" and is_stream(message):
                who = owner(scope)
                refused_as = slots.streams.admit(who, self.retry_after_ms)
                if refused_as is not None:
                    refusal = True
                    await self._busy(send, *refused_as)
                    raise _StreamRefused
                stream, held = who, False
                slots.serving -= 1
                INFLIGHT.dec()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if not refusal:  # else: the app unwinding from its refused stream
                raise
        finally:
            if held:
                slots.serving -= 1
                INFLIGHT.dec()
            if stream is not None:
                slots.streams.release(stream)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, error: QuillError) -> None:
        if scope["path"] in MCP_PATHS and scope["method"] == "POST":
            try:
                async with asyncio.timeout(PEEK_TIMEOUT_S):
                    rpc = await _peek(receive)
            except TimeoutError:
                rpc = None
            if rpc is not None:
                await _send(send, 200, json.dumps(mcp_busy(rpc, error)).encode(), [])
                return
        await self._busy(send, 503, error)

    async def _busy(self, send: Send, status: int, error: QuillError) -> None:
        """The REST answer of a refusal: ``status``, ``Retry-After`` and the error."""
        name = "too_many_streams" if status == 429 else "unavailable"
        body = {"error": name, "message": error.message, "details": error.details}
        seconds = str(math.ceil(self.retry_after_ms / 1000))
        await _send(send, status, json.dumps(body).encode(), [(b"retry-after", seconds.encode())])


def mcp_busy(rpc: dict[str, Any], error: QuillError) -> dict[str, Any]:
    """The JSON-RPC answer of a refused MCP request: a tool error result for a tool call,
    else a JSON-RPC error."""
    text = f"Error: {error.message}"
    if rpc.get("method") == "tools/call":
        content = [{"type": "text", "text": text}]
        return {"jsonrpc": "2.0", "id": rpc["id"], "result": {"content": content, "isError": True}}
    failure = {"code": BUSY_RPC_CODE, "message": error.message, "data": error.details}
    return {"jsonrpc": "2.0", "id": rpc["id"], "error": failure}


async def _peek(receive: Receive) -> dict[str, Any] | None:
    """The JSON-RPC request in the body, if it is one request with an id within
    ``MCP_PEEK_BYTES`` (None otherwise: a notification, a batch, too large, not JSON)."""
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        if len(body) > MCP_PEEK_BYTES:
            return None
        if not message.get("more_body", False):
            break
    try:
        rpc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(rpc, dict) or not isinstance(rpc.get("id"), str | int):
        return None
    return rpc


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
