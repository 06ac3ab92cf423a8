"""The HTTP request id (``X-Request-Id``), followed into the services.

Every HTTP response carries ``X-Request-Id``: the client's own when it sent a valid one
(1-64 of ``A-Z a-z 0-9 . _ : -``, holding no registered secret), else one the gateway made
(32 hex digits). An id holding a secret is not kept: every command named after it would be
refused (``core.secrets.refuse_names``), and the log and the response would have to carry it
redacted, which greps for nothing. While the request
is served, the gateway's log lines carry it (``request_id``, ``infra.logfields``) and each
command the gateway sends for it is named ``<id>_<unique>`` (its ``Ws-Request-Id``), so the
writer's log line, the audit record and the event of that command start with the HTTP id:
``grep <id>`` finds them all. The suffix keeps two commands apart: a request id is the
writer's idempotency key, and a client reusing an ``X-Request-Id`` must not get an earlier
write's answer for a new one.

A command's id is what a model copies (``read_command_output(command_id=...)``): ``_`` joins
the two, not ``.``, which in ``Command 3f2a.Xk9`` reads as the end of a sentence and was cut
off by models (issue 30). Ids made before with ``.`` still read: a command's kept and live
output are under its id with ``.`` as ``_`` (``Subjects.cmdout``), and ``exec.output`` takes
either spelling.

A request answered with a 5xx status gets one log line (warning) naming its id, but for a busy
503 (``Retry-After``: ``infra.busy`` summarises those).
"""

from __future__ import annotations

import logging
import re
from contextvars import ContextVar

from nats.nuid import NUID
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.subjects import new_request_id
from infra import logfields, tracing
from infra.secret_registry import secrets_from_env

HEADER = b"x-request-id"
CLIENT_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}\Z")
"""A client's ``X-Request-Id`` the gateway keeps (else it makes one): short enough that
``<id>_<unique>`` (and the executor's ``:changes`` after it) is a valid ``Ws-Request-Id``."""

_http_id: ContextVar[str | None] = ContextVar("quill_http_request_id", default=None)

log = logging.getLogger("quill.gateway")


def of(scope: Scope) -> str:
    """The request id of an HTTP request: the client's valid ``X-Request-Id``, or a new one."""
    for name, value in scope.get("headers", ()):
        if name == HEADER and CLIENT_ID.match(value):
            kept = str(value.decode("ascii"))
            if not secrets_from_env().find(kept):
                return kept
    return new_request_id()


class RequestIds:
    """Middleware: name each HTTP request (``of``), answer with ``X-Request-Id``, bind the id
    for the log lines and the commands sent while serving it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = of(scope)
        raw = request_id.encode()
        status, busy = 0, False

        async def sending(message: Message) -> None:
            nonlocal status, busy
            if message["type"] == "http.response.start":
                status = message["status"]
                # busy (a Retry-After): counted and summarised (infra.busy), not a line each
                busy = any(k.lower() == b"retry-after" for k, _ in message.get("headers", ()))
                headers = [(k, v) for k, v in message.get("headers", ()) if k != HEADER]
                message["headers"] = [*headers, (HEADER, raw)]
            await send(message)

        token, bound = _http_id.set(request_id), logfields.bind_id(request_id)
        try:
            if tracing.ON:
                with tracing.http_span(scope["method"], scope["path"]) as span:
                    span.set_attribute("quill.request_id", request_id)
                    await self.app(scope, receive, sending)
                    span.set_attribute("http.status_code", status)
            else:
                await self.app(scope, receive, sending)
        finally:
            if status >= 500 and not busy:
                path = logfields.one_line(scope["path"])  # a decoded %0A cannot forge a line
                log.warning("%s %s answered %d", scope["method"], path, status)
            _http_id.reset(token)
            logfields.reset(bound)


SEPARATOR = b"_"
"""Between the HTTP request's id and a command's own part (never ``.``: see above)."""


class TaggedIds(NUID):
    """The gateway's request ids for commands: ``<HTTP request id>_<unique>`` while an HTTP
    request is served, else a plain unique id (``NUID``)."""

    def next(self) -> bytearray:
        unique = super().next()
        request_id = _http_id.get()
        if request_id is None:
            return unique
        return bytearray(request_id.encode() + SEPARATOR + unique)
