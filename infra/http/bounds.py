"""Every HTTP request bounded in time and size, whoever sends it.

uvicorn bounds an idle keep-alive connection in time (``timeout_keep_alive``), but not the
size of a request's head (its httptools parser buffers any amount) nor the time headers or a
body take to arrive: a client that sends half a request holds a connection, and a task,
forever. Two pieces close that:

* ``HeaderDeadline``, the HTTP protocol (uvicorn's httptools protocol; its h11 one cost ~25%
  more CPU a request, docs/performance.md): a connection that has not sent a whole request
  head within ``header_timeout`` seconds (from its opening, or from the first byte after a
  keep-alive pause) is answered ``408`` and closed; a head over ``MAX_HEAD_BYTES`` (16 KiB,
  h11's bound) is answered ``400`` and closed, and at most one read (``MAX_HEAD_BYTES`` plus
  what one ``recv`` returns) is held while a head is incomplete.
* ``BodyBounds``, ASGI middleware: reads a request's body before the app runs, at most
  ``max_body`` bytes (``413`` past it, at once for a ``Content-Length`` over it) within
  ``body_timeout`` seconds of the head (``408`` otherwise), then hands the app the whole body.
  A client that disconnects mid-body is one log line; the app never sees it. REST and MCP read
  whole bodies anyway, so the memory held stays ``max_body`` per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("quill.gateway")

HEADER_TIMEOUT_S = 10.0
"""Default time for a request's head (request line and headers) to arrive."""
BODY_TIMEOUT_S = 60.0
"""Default time for a request's whole body to arrive once its head has."""
MAX_HEAD_BYTES = 16 * 1024
"""The most a request's head (request line and headers) may hold."""


def _answer(status: int, reason: str, body: dict[str, str]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + data


REQUEST_TIMEOUT = _answer(
    408, "Request Timeout", {"error": "request_timeout", "message": "Request head too slow"}
)
HEAD_TOO_LARGE = _answer(
    400, "Bad Request", {"error": "bad_request", "message": "Request head too large"}
)


class HeaderDeadline(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request head is late (408) or
    too large (400)."""

    header_timeout: float = HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None
    _in_head = True
    """Between requests or inside a head: what arrives is a head's."""
    _too_large = False
    _begun = False
    """The next request's head has begun arriving."""
    _heads = 0
    """Heads parsed so far on this connection."""
    _upgraded = False
    """Handed to a websocket protocol (``handle_websocket_upgrade``)."""
    _head_bytes = 0
    """Bytes of the reads that arrived inside the current head."""
    _head_size = 0
    """The current head's request line and headers, as parsed."""

    @classmethod
    def with_timeout(cls, seconds: float) -> type[HeaderDeadline]:
        """This protocol with another ``header_timeout``."""
        return type("HeaderDeadline", (cls,), {"header_timeout": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        heads, began_in_head = self._heads, self._in_head
        super().data_received(data)
        if self.transport.is_closing():
            return
        if not self._in_head:
            self._disarm()
            return
        if began_in_head and heads == self._heads:  # the read began and ended in one head
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(HEAD_TOO_LARGE, f"request head over {MAX_HEAD_BYTES} bytes")
                return
        if self._header_timer is None and not self._answering():
            self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._begun, self._head_size = True, True, 0

    def on_url(self, url: bytes) -> None:
        self._grow(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head, self._begun, self._head_bytes = False, False, 0
        self._heads += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._begun and not self.transport.is_closing():
            self._unset_keepalive_if_required()  # the next head has begun: it has a deadline
            if self._header_timer is None:
                self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _grow(self, size: int) -> None:
        """Count ``size`` bytes of the head being parsed.

        Raises:
            ValueError: past ``MAX_HEAD_BYTES`` (the parser stops, ``send_400_response``)."""
        self._head_size += size
        if self._head_size > MAX_HEAD_BYTES:
            self._too_large = True
            raise ValueError("request head too large")

    def send_400_response(self, msg: str) -> None:
        if self._too_large:
            self._refuse(HEAD_TOO_LARGE, f"request head over {MAX_HEAD_BYTES} bytes")
        else:
            super().send_400_response(msg)

    def handle_websocket_upgrade(self) -> None:
        """The connection is a websocket's from now on: no more heads, no deadline (an armed
        one would write its 408 into the websocket's stream)."""
        self._upgraded = True
        self._disarm()
        super().handle_websocket_upgrade()

    def _arm(self) -> None:
        if not self._upgraded:
            self._header_timer = self.loop.call_later(self.header_timeout, self._late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _answering(self) -> bool:
        """Whether a request is being answered (its time is the app's, not the head's)."""
        return self.cycle is not None and not self.cycle.response_complete

    def _late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._in_head or self._answering():
            return
        if self.timeout_keep_alive_task is not None:
            return  # between requests: the keep-alive timeout closes it
        self._refuse(REQUEST_TIMEOUT, f"no request head in {self.header_timeout}s")

    def _refuse(self, answer: bytes, why: str) -> None:
        log.info("closed a connection from %s: %s", self.client, why)
        self._disarm()
        self.transport.write(answer)
        self.transport.close()


class BodyRefused(Exception):
    """A body over the size bound, late, or cut off by the client."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


class BodyBounds:
    """Read each request body whole before the app runs: bounded in size and in time."""

    def __init__(self, app: ASGIApp, max_body: int, body_timeout: float) -> None:
        self.app, self.max_body, self.body_timeout = app, max_body, body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self.read(scope, receive)
        except BodyRefused as refused:
            if refused.status:
                await self.refuse(send, refused)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def read(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body.

        Raises:
            BodyRefused: 413 over ``max_body``, 408 past ``body_timeout``; status 0 for a client
                that went away (nothing to answer).
        """
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            raise BodyRefused(413, "payload_too_large", f"Body over {self.max_body} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        log.info("%s %s: client went away mid-body", scope["method"], scope["path"])
                        raise BodyRefused(0, "", "client went away")
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body:
                        raise BodyRefused(
                            413, "payload_too_large", f"Body over {self.max_body} bytes"
                        )
                    if chunk:
                        chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            log.info(
                "%s %s: body not in within %ss", scope["method"], scope["path"], self.body_timeout
            )
            raise BodyRefused(
                408, "request_timeout", f"Body not received within {self.body_timeout}s"
            ) from None

    @staticmethod
    async def refuse(send: Send, refused: BodyRefused) -> None:
        data = json.dumps({"error": refused.error, "message": refused.message}).encode()
        headers: list[tuple[bytes, bytes]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
            (b"connection", b"close"),  # the rest of the body is not read: the connection ends
        ]
        await send({"type": "http.response.start", "status": refused.status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            text: Any = value.decode("latin-1").strip()
            return int(text) if text.isdecimal() else None
    return None
