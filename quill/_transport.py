"""The SDK's wire: one request out and its reply back, over NATS, as ``Quill`` sends them.

What a request carries (``request_headers``: request id, actor, session, run, lock wait,
deadline; ``encode``: the body, refused with a clear error when a string in it is not text),
how long it waits and how often it is sent again (``request``: ``retries`` times with
``backoff``, and while a writer fails over until ``failover_s``; ``exec_request``: only while
it cannot have run, and a lost executor is an error), and how NATS's failures become
``QuillError`` codes (no responders: ``UNAVAILABLE``; no reply: ``TIMEOUT``; a subject the
server refused these credentials: ``ACCESS_DENIED``; too big: ``SIZE_LIMIT_EXCEEDED``).
Also the subscriptions a workspace reads from: a command's live output (``ExecOutput``),
confirmed subscriptions (``subscribe_confirmed``) and the audit stream (``audit_records``).

Why apart from ``quill/client.py``: the public classes say what a call sends; this module is
how it travels, and none of it is public (``Quill.request``/``exec_request`` are the seams
a subclass such as the CLI's ``CliQuill`` overrides).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from contracts import codec
from contracts.errors import ErrorCode, QuillError, retry_after_ms
from contracts.events import AuditRecord
from contracts.limits import CEILINGS
from contracts.paths import normalize, printable
from contracts.subjects import (
    COSTLY_QUERIES,
    HEADER_REQUEST_ID,
    HEADER_STREAM,
    MAX_WAIT_MS,
    STREAM_AUDIT,
    Origin,
)
from quill import connection, inboxes

R = TypeVar("R")

SILENCE_S = 15.0
"""An executor announces a request it holds every 2 s; this long without a word, it is lost."""
FAILOVER_S = 15.0
"""Default of ``Quill.failover_s``: longer than a writer lease (5 s) plus its takeover."""
CONFLICT_BASE_S = 0.005
CONFLICT_CAP_S = 1.0
"""The backoff before a ``CONFLICT``'s retry ``n`` is drawn from ``[0, min(CAP, BASE * 2**n)]``
(full jitter: clients that conflicted together come back spread out, not together)."""
MAX_RETRY_AFTER_S = 30.0
"""The longest a busy answer's ``retry_after_ms`` makes a retry wait."""

OnOutput = Callable[[str, bytes], Awaitable[None] | None]
"""Called with ``("stdout" | "stderr", chunk)`` for each piece of a command's live output."""


def _not_text(value: Any, key: str = "request") -> QuillError:
    """The refusal of a request holding a string that is not text (a lone surrogate, as Python
    shows a byte that is not UTF-8 in a name from argv or the disk): for a path, the server's
    own (``contracts.paths``); else ``INVALID_ARGUMENT`` naming the field."""
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
    for k, v in items:
        name = k if isinstance(k, str) else key
        for text in (k, v) if isinstance(k, str) else (v,):
            if isinstance(text, str) and not _encodable(text):
                if name in ("path", "to", "workdir") and text is v:
                    normalize(v)  # raises the rule's INVALID_ARGUMENT
                label, shown = name if text is v else key, printable(text)[:100]
                return QuillError(ErrorCode.INVALID_ARGUMENT, f"{label} is not UTF-8: '{shown}'")
        if isinstance(v, dict | list):
            found = _not_text(v, name)
            if found.details.get("field") != "?":
                return found
    return QuillError(ErrorCode.INVALID_ARGUMENT, f"{key} is not UTF-8", {"field": "?"})


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_size(content: str | bytes) -> None:
    """Refuse content no workspace takes before encoding it (a character is at least a byte).

    Raises:
        QuillError: ``SIZE_LIMIT_EXCEEDED`` over ``CEILINGS.max_file_bytes``.
    """
    most = CEILINGS.max_file_bytes
    if len(content) > most:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Content is over {most} bytes, the largest file a workspace may take",
            {"max_file_bytes": most},
        )


def refused(subject: str) -> QuillError:
    """The NATS server refused a request: these credentials are another tenant's."""
    return QuillError(
        ErrorCode.ACCESS_DENIED,
        f"NATS refused {subject} to these credentials (a tenant reaches only its own workspaces)",
        {"subject": subject},
    )


def encode(body: msgspec.Struct) -> bytes:
    """``body`` on the wire.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` naming the field holding a string that is not text.
    """
    try:
        return codec.encode(body)
    except UnicodeEncodeError:  # a lone surrogate: a byte of an argv name not UTF-8
        raise _not_text(msgspec.to_builtins(body)) from None


def request_headers(kind: str, op: str, origin: Origin, timeout: float) -> dict[str, str] | None:
    """The headers of a request (``origin``: its request id, who sends it, its lock wait):
    none at all for a query with no one to name. Commands and costly queries carry the
    deadline (``timeout``), so that expensive work is not started (or is stopped) once the
    client stops waiting."""
    waits = round(timeout * 1000) if kind == "cmd" or op in COSTLY_QUERIES else 0
    o = origin
    if not (o.request_id or o.wait_ms or waits or o.actor or o.session or o.run):
        return None
    # built anew: dataclasses.replace costs ~18 us, a tenth of a write's client CPU
    timeout_ms = min(waits, MAX_WAIT_MS)
    named = Origin(o.request_id, o.actor, o.session, o.run, o.wait_ms, timeout_ms=timeout_ms)
    named_headers = named.headers()
    if not origin.request_id:
        del named_headers[HEADER_REQUEST_ID]
    return named_headers


def again(attempt: int, last: QuillError | None, failover_until: float, retries: int) -> bool:
    """Whether to send (again): the first time; then up to ``retries`` times; and while a
    service is missing or handing over (``UNAVAILABLE``: a writer failing over, a
    partition moving), until ``failover_until`` has passed, unless retries are off."""
    if attempt == 0 or attempt <= retries:
        return True
    return (
        retries > 0
        and last is not None
        and last.code == ErrorCode.UNAVAILABLE
        and time.monotonic() < failover_until
    )


async def request(
    nc: NATS,
    subject: str,
    data: bytes,
    result_type: type[R],
    *,
    kind: str,
    op: str,
    tenant: str,
    headers: dict[str, str] | None,
    timeout: float,
    retries: int,
    failover_s: float,
) -> tuple[int | None, R]:
    """Send one request (retrying retriable failures as ``again`` says, the same bytes with
    the same request id) and decode its reply to ``result_type``.

    Raises:
        QuillError: the reply's error, ``TIMEOUT`` or ``UNAVAILABLE``.
    """
    last: QuillError | None = None
    failover_until = time.monotonic() + failover_s
    attempt = -1
    while again(attempt := attempt + 1, last, failover_until, retries):
        if attempt:
            await asyncio.sleep(backoff(attempt, last, 1.0))
        try:
            msg = await inboxes.request(
                nc, subject, data, timeout=timeout, headers=headers, tenant=tenant
            )
        except nats.errors.TimeoutError:
            if connection.refused(nc, subject):
                raise refused(subject) from None
            last = QuillError(ErrorCode.TIMEOUT, f"No reply to {kind}.{op} in {timeout}s")
            continue
        except nats.errors.MaxPayloadError:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"Request of {len(data)} bytes exceeds the server's message size",
                {"bytes": len(data)},
            ) from None
        except nats.errors.NoRespondersError:
            service = {"cmd": "writer", "qry": "reader", "exec": "executor"}.get(kind, kind)
            last = QuillError(ErrorCode.UNAVAILABLE, f"No Quill {service} is running")
            continue
        except nats.errors.Error as exc:
            last = QuillError(ErrorCode.UNAVAILABLE, f"NATS: {exc}")
            continue
        try:
            return codec.decode_reply(msg.data, result_type)
        except QuillError as exc:
            if not exc.retriable:
                raise
            last = exc
    assert last is not None
    raise last


async def exec_request(
    nc: NATS,
    subject: str,
    data: bytes,
    result_type: type[R],
    *,
    op: str,
    tenant: str,
    headers: dict[str, str],
    retries: int,
    deadline_s: float,
    silence_s: float,
    heard: Callable[[], float],
) -> tuple[int | None, R]:
    """Send an exec request and wait for its reply while the executor keeps announcing it
    alive (``heard()``: when it last did; silent for ``silence_s``, it is lost). Sent again
    only when it cannot have run (no executor, or one too busy to take it).

    Raises:
        QuillError: the reply's error; ``UNAVAILABLE`` when no executor answers or the one
            running it stopped answering; ``TIMEOUT`` past ``deadline_s``.
    """
    last: QuillError | None = None
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff(attempt, last, 2.0))
        sent = time.monotonic()
        pending = asyncio.ensure_future(
            inboxes.request(nc, subject, data, timeout=deadline_s, headers=headers, tenant=tenant)
        )
        try:
            while not (await asyncio.wait({pending}, timeout=silence_s / 3))[0]:
                if connection.refused(nc, subject):
                    raise refused(subject)
                if time.monotonic() - max(heard(), sent) > silence_s:
                    raise QuillError(
                        ErrorCode.UNAVAILABLE,
                        f"The executor running {op} stopped answering (nothing heard for "
                        f"{silence_s:.0f}s); what it changed, if anything, is in the "
                        "workspace's history",
                    )
            msg = pending.result()
        except nats.errors.NoRespondersError:
            last = QuillError(ErrorCode.UNAVAILABLE, "No Quill executor is running")
            continue
        except nats.errors.TimeoutError:
            raise QuillError(
                ErrorCode.TIMEOUT, f"No reply to exec.{op} in {deadline_s:.0f}s"
            ) from None
        except nats.errors.MaxPayloadError:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"Request of {len(data)} bytes exceeds the server's message size",
            ) from None
        except nats.errors.Error as exc:
            raise QuillError(ErrorCode.UNAVAILABLE, f"NATS: {exc}") from None
        finally:
            if not pending.done():
                pending.cancel()
        try:
            return codec.decode_reply(msg.data, result_type)
        except QuillError as exc:
            if exc.code != ErrorCode.UNAVAILABLE:
                raise
            last = exc  # refused before running (busy, log unreachable): try again
    assert last is not None
    raise last


def backoff(attempt: int, last: QuillError | None, cap: float) -> float:
    """Seconds to wait before retry ``attempt``: ``0.1 * 2**attempt`` (at most ``cap``), or,
    after a busy answer, its ``retry_after_ms`` if longer (at most ``MAX_RETRY_AFTER_S``),
    spread by up to a quarter more so that the clients a flood refused do not all come back
    at the same moment."""
    pause: float = min(0.1 * 2**attempt, cap)
    hint = retry_after_ms(last) if last is not None else None
    if hint is None:
        return pause
    return max(pause, min(hint / 1000, MAX_RETRY_AFTER_S)) * random.uniform(1.0, 1.25)


def conflict_backoff(retry: int) -> float:
    """Seconds to wait before a ``CONFLICT``'s retry ``retry`` (0-based): uniform in
    ``[0, min(CONFLICT_CAP_S, CONFLICT_BASE_S * 2**retry)]``."""
    return random.uniform(0.0, min(CONFLICT_CAP_S, CONFLICT_BASE_S * 2 ** min(retry, 30)))


class ExecOutput:
    """A command's live output subject, listened to while its request is out: when the
    executor was last heard from (output or heartbeat), each chunk handed to ``on_output``,
    and the end of the output (which the reply may overtake)."""

    def __init__(self, on_output: OnOutput | None) -> None:
        self.on_output = on_output
        self.last_heard = time.monotonic()
        self.eof = asyncio.Event()

    def heard(self) -> float:
        return self.last_heard

    async def on_msg(self, msg: Msg) -> None:
        self.last_heard = time.monotonic()
        stream = (msg.headers or {}).get(HEADER_STREAM)
        if stream == "eof":
            self.eof.set()
        elif self.on_output is not None and stream in ("stdout", "stderr"):
            done = self.on_output(stream, msg.data)
            if inspect.isawaitable(done):
                await done

    async def finished(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for the last of the output, if anyone reads it."""
        if self.on_output is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.eof.wait(), timeout)

    @classmethod
    @contextlib.asynccontextmanager
    async def listening(
        cls, nc: NATS, subject: str, on_output: OnOutput | None
    ) -> AsyncIterator[ExecOutput]:
        output = cls(on_output)
        sub = await nc.subscribe(subject, cb=output.on_msg)
        try:
            yield output
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def subscribe_confirmed(nc: NATS, subject: str, timeout: float) -> Subscription:
    """A subscription the server has taken.

    Raises:
        QuillError: ``ACCESS_DENIED`` when the server refused it (another tenant's subject),
            ``UNAVAILABLE`` if it cannot be confirmed.
    """
    sub = await nc.subscribe(subject)
    try:
        # The server answers a refused SUB with -ERR, and the client records it
        # (connection.refused) as it reads it: nothing would ever arrive. The -ERR may come
        # after the PONG of the first round trip (seen with nats-server 2.15), never after the
        # second's.
        for _ in range(2):
            await nc.flush(timeout=max(1, int(timeout)))
    except (nats.errors.Error, TimeoutError) as exc:
        await sub.unsubscribe()
        raise QuillError(ErrorCode.UNAVAILABLE, f"NATS: {exc}") from None
    if connection.refused(nc, subject):
        await sub.unsubscribe()
        raise refused(subject)
    return sub


async def audit_records(
    nc: NATS, subject: str, *, since: datetime | None, follow: bool
) -> AsyncGenerator[AuditRecord, None]:
    """The audit records on ``subject`` in WS_AUDIT, oldest first (from ``since``); with
    ``follow``, keep waiting for more.

    Raises:
        QuillError: ``UNAVAILABLE`` when JetStream does not answer about the stream.
    """
    js = nc.jetstream()
    try:
        info = await js.stream_info(STREAM_AUDIT, subjects_filter=subject)
    except nats.errors.TimeoutError:
        raise QuillError(
            ErrorCode.UNAVAILABLE,
            f"JetStream did not answer about {STREAM_AUDIT} (a tenant's credentials may "
            "not read audit history: see docs/operations.md, Tenants)",
        ) from None
    if not follow and not (info.state.subjects or {}).get(subject):
        return
    config = (
        ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=since)
        if since
        else ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    sub = await js.subscribe(subject, ordered_consumer=True, config=config)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=None if follow else 2.0)
            except nats.errors.TimeoutError:
                return
            yield codec.decode(msg.data, AuditRecord)
            if not follow and msg.metadata.num_pending == 0:
                return
    finally:
        await sub.unsubscribe()
