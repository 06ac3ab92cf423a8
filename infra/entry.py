"""The edge of every service: a request message → its address, op, origin and request.

Both services parse requests the same way and answer a bad one the same way: with the error
reply, and an audit record when the subject named a workspace. A request that names something
with a registered secret (its workspace, a ``Ws-*`` header, a path, a message, a branch...) is
refused here (``secrets.refuse_names``), and what a refusal says is redacted.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from contracts import codec, ops
from contracts.errors import ErrorCode, QuillError
from contracts.ops import OpKind, OpSpec
from contracts.requests import Request
from contracts.subjects import (
    HEADER_REQUEST_ID,
    TENANT_SCOPE,
    Address,
    Origin,
    Subjects,
    new_request_id,
)
from core.secrets import refuse_names
from infra import logfields
from infra.bus import reply_allowed, respond
from infra.runtime import Auditor
from infra.secret_registry import secrets_from_env
from quill.inboxes import own_inbox

log = logging.getLogger("quill.entry")

_NO_HEADERS = Origin.from_headers(None)
"""The origin of a request without headers (most queries): the same every time."""

_NOUNS = {"cmd": ("command", "commands"), "qry": ("query", "queries"), "exec": ("op", "ops")}


@dataclass
class Incoming:
    """A request as far as it has been understood (for replying and auditing on failure)."""

    msg: Msg
    started: float = field(default_factory=time.perf_counter)
    received: float = field(default_factory=time.monotonic)
    """When it was taken in, on ``time.monotonic`` (deadlines: ``infra/offload.py``)."""
    address: Address | None = None
    spec: OpSpec | None = None
    origin: Origin | None = None
    request: Request | None = None


def parse(
    incoming: Incoming,
    subjects: Subjects,
    kind: OpKind,
    new_id: Callable[[], object] | None = None,
    *,
    address: Address | None = None,
) -> tuple[Address, OpSpec, Origin, Request]:
    """Understand ``incoming.msg`` as a request of ``kind``, filling ``incoming`` as it goes.
    ``address``: its subject, when the caller parsed it already (``subjects.parse_request``:
    a subject is parsed once).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a bad subject, unknown op, header or body, or
            one naming something with a registered secret;
            ``ACCESS_DENIED`` for a reply subject that is another tenant's inbox (refused
            and audited, never answered there: ``bus.reply_allowed``);
            ``INTERNAL`` (logged) for anything unexpected: whatever a request holds, the
            caller gets its one answer.
    """
    msg = incoming.msg
    try:
        logfields.bind(None)  # what the subscription's task served before is not this request
        address = incoming.address = address or subjects.parse_request(msg.subject)
        if msg.reply and not reply_allowed(msg.subject, msg.reply, own_inbox(msg._client)):
            raise QuillError(
                ErrorCode.ACCESS_DENIED, "The reply subject is another tenant's inbox: refused"
            )
        spec = ops.find(kind, address.op)
        if spec is None:
            one, many = _NOUNS[kind]
            names = ", ".join(s.name for s in ops.of_kind(kind))
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT, f"Unknown {one} {address.op!r} ({many}: {names})"
            )
        if (address.workspace == TENANT_SCOPE) != (spec.scope == "tenant"):
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"{spec.key} is an op of a tenant: send it to workspace {TENANT_SCOPE}"
                if spec.scope == "tenant"
                else f"{spec.key} is an op of a workspace, not of the tenant ({TENANT_SCOPE})",
            )
        incoming.spec = spec
        secrets = secrets_from_env()
        headers = msg.headers
        origin = incoming.origin = (
            Origin.from_headers(headers, new_id) if headers or new_id else _NO_HEADERS
        )
        logfields.bind(address, origin)
        refuse_names(secrets, address, origin)
        request = incoming.request = codec.decode_request(spec, msg.data)
        refuse_names(secrets, request=request)
        return address, spec, origin, request
    except QuillError:
        raise
    except Exception as exc:  # a bug: still one answer, never an exception past the edge
        log.exception(
            "request on %s (Ws-Request-Id %s): could not be understood",
            msg.subject,
            (msg.headers or {}).get(HEADER_REQUEST_ID),
        )
        raise QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}") from None


def reply_headers(origin: Origin) -> dict[str, str] | None:
    """The headers of a reply to a request from ``origin``: ``Ws-Request-Id``, the request's
    own or the one the service gave it (none for a query that came without one)."""
    return {HEADER_REQUEST_ID: origin.request_id} if origin.request_id else None


async def reject(incoming: Incoming, error: QuillError, auditor: Auditor) -> None:
    """Answer ``incoming`` with ``error`` and audit it (when it named a workspace), both with
    every registered secret redacted (not audited when the workspace's name holds one), and
    log it (``logfields.failed``). A request without a request id is given one: its reply
    (header ``Ws-Request-Id``), audit record and log line name it."""
    secrets = secrets_from_env()
    if incoming.origin is None or not incoming.origin.request_id:  # named, for its log line
        incoming.origin = dataclasses.replace(
            incoming.origin or _NO_HEADERS, request_id=new_request_id()
        )
    origin = secrets.redact_origin(incoming.origin)
    assert origin is not None
    reply = codec.error_reply(secrets.redact_error(error))
    await respond(incoming.msg, reply, reply_headers(origin))
    address = incoming.address
    if address is not None and not secrets.find(f"{address.tenant}/{address.workspace}"):
        await auditor.record(address, origin, incoming.started, error=error)
    else:  # not audited: the log line alone (the filter redacts what it names), still counted
        logfields.failed(address, origin, error)
        auditor.unaddressed(incoming.msg.subject, error, incoming.started)
