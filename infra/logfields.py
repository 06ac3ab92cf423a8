"""The request a log line was written for: ``request_id``, ``tenant``, ``workspace``, ``op``
(and ``code``, on a failure) as fields of every log record written while serving it.

The edge of each service (``infra.entry.parse``; the writer's workspace actor for the command
it decides) sets them in a context variable (``bind``); tasks started while serving a request
inherit them. ``RequestFields``, a filter on every service's log handler
(``runtime.setup_logging``), copies them onto each record, unless the call passed its own
(``extra=``); the formatters write them as JSON keys or as ``key=value`` after the message.

``failed`` writes the one line of a failed request, at the level ``failure_level`` gives:

- ``error``: ``INTERNAL`` (a bug),
- ``warning``: what the service could not do though the request was fine: the retriable codes
  (``UNAVAILABLE``, ``TIMEOUT``), ``STORAGE_FULL`` and ``EXECUTION_FAILED``,
- ``info``: the caller's request answered by the rules (``INVALID_ARGUMENT``, ``CONFLICT``,
  ``FILE_NOT_FOUND``, ``LOCKED``, ``ACCESS_DENIED``...),
- ``debug``: a busy answer (``UNAVAILABLE`` with ``details.reason == "busy"``): a flood would
  otherwise write a line per refused request; ``infra.busy`` writes one warning per queue every
  10 s instead, and ``quill_busy_rejections_total`` counts each.
"""

from __future__ import annotations

import contextvars
import logging
from contextvars import ContextVar
from typing import Any

from contracts.errors import RETRIABLE, ErrorCode, QuillError
from contracts.subjects import Address, Origin

FIELDS = ("request_id", "tenant", "workspace", "op", "code")
"""The record attributes this module sets, in the order the text format writes them."""

_current: ContextVar[tuple[str, str, str, str] | None] = ContextVar("quill_request", default=None)

log = logging.getLogger("quill.requests")

_ONE_LINE = {i: f"\\x{i:02x}" for i in (*range(32), 127)}
"""Control characters (a newline...) as escapes: what a request named stays on its line."""
_SERVER_SIDE = frozenset({*RETRIABLE, ErrorCode.EXECUTION_FAILED, "STORAGE_FULL"})


Token = contextvars.Token[tuple[str, str, str, str] | None]


def bind(address: Address | None, origin: Origin | None = None) -> Token:
    """The request now being served (None: none); its fields go on every record from here on
    in this task (and tasks it starts)."""
    if address is None:
        return _current.set(None)
    request_id = origin.request_id if origin is not None else ""
    op = f"{address.kind}.{address.op}"
    return _current.set((request_id, address.tenant, address.workspace, op))


def bind_id(request_id: str) -> Token:
    """A request known by its id alone (the gateway's HTTP request)."""
    return _current.set((request_id, "", "", ""))


def reset(token: Token) -> None:
    """Back to what was bound before ``token``'s ``bind``."""
    _current.reset(token)


def current() -> dict[str, str]:
    """The fields of the request now being served (empty: none)."""
    value = _current.get()
    if value is None:
        return {}
    return {k: v for k, v in zip(FIELDS, value, strict=False) if v}


def failure_level(code: ErrorCode | str) -> int:
    """The level of a failed request's line (the module docstring gives the rule)."""
    if code == ErrorCode.INTERNAL:
        return logging.ERROR
    if code in _SERVER_SIDE:
        return logging.WARNING
    return logging.INFO


def one_line(text: str) -> str:
    """``text`` with its control characters (a newline...) escaped: it stays on its line."""
    return text.translate(_ONE_LINE)


def failed(address: Address | None, origin: Origin | None, error: QuillError) -> None:
    """The one log line of a request answered with ``error``."""
    busy = error.details.get("reason") == "busy"
    level = logging.DEBUG if busy else failure_level(error.code)
    if not log.isEnabledFor(level):
        return
    extra: dict[str, Any] = {"code": str(error.code)}
    if address is not None:
        extra.update(
            tenant=address.tenant, workspace=address.workspace, op=f"{address.kind}.{address.op}"
        )
    if origin is not None and origin.request_id:
        extra["request_id"] = origin.request_id
    message = one_line(error.message)  # a hostile path cannot forge a log line
    log.log(level, "request failed: %s: %s", error.code, message, extra=extra)


class RequestFields(logging.Filter):
    """Puts the request's fields (``bind``) on every record that has none of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        value = _current.get()
        if value is not None:
            for name, field in zip(FIELDS, value, strict=False):
                if field and not hasattr(record, name):
                    setattr(record, name, field)
        return True


def fields_of(record: logging.LogRecord) -> dict[str, str]:
    """The request fields a record carries (for the formatters)."""
    out: dict[str, str] = {}
    for name in FIELDS:
        value = getattr(record, name, None)
        if value:
            out[name] = str(value)
    return out


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> request_id=… tenant=… workspace=… op=… code=…``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = fields_of(record)
        if not fields:
            return line
        head, sep, tail = line.partition("\n")  # a traceback stays below the fields
        pairs = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"{head} {pairs}{sep}{tail}"
