"""Server-sent events: a workspace's new events as timeline rows, as they are committed, and
its new audit records as audit rows (``audit``).

The stream subscribes to the workspace's ``ws.updated`` subject (what ``Workspace.watch``
reads), confirms the subscription, then catches up on the events committed since the
version the page showed (``?after=``), says ``ready``, and from then on sends each new
event's row (``event``), read with the ``events`` query, so a row shows what the timeline
shows; or, with ``?approvals=1``, the approvals queue as the page shows it (``approvals``)
after each change. Every ``KEEPALIVE_S`` without news it sends a comment, which also ends
the stream of a client that went away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from contracts import codec
from contracts import replies as rp
from contracts import requests as rq
from contracts.events import AuditRecord, WorkspaceUpdated
from services.gateway.console.gate import PREFIX
from services.gateway.console.history import number
from services.gateway.console.operate import AuditQuery

if TYPE_CHECKING:
    from services.gateway.console import Console

KEEPALIVE_S = 15.0
BATCH = 100


def message(event: str, html: str) -> str:
    data = "\n".join(f"data: {line}" for line in html.splitlines() or [""])
    return f"event: {event}\n{data}\n\n"


READY = "on"
"""What a page's live state says once it listens (``Live updates: on``)."""
FAILED = message("failed", "NATS did not confirm the subscription")
KEEPALIVE = ": keepalive\n\n"
QUEUE_MAX = 1000
"""Messages a stream keeps waiting at most (a flood past it is dropped: every stream reads
what it shows from a query, or sends the whole at the end)."""


class Heard:
    """What the subscriptions of ``listening`` receive: each message, or None after
    ``KEEPALIVE_S`` without one (send ``KEEPALIVE``: it also ends the stream of a client that
    went away)."""

    def __init__(self, queue: asyncio.Queue[Msg]) -> None:
        self.queue = queue

    async def __aiter__(self) -> AsyncIterator[Msg | None]:
        while True:
            try:
                yield await asyncio.wait_for(self.queue.get(), KEEPALIVE_S)
            except TimeoutError:
                yield None


@contextlib.asynccontextmanager
async def listening(nc: NATS, *subjects: str) -> AsyncIterator[Heard | None]:
    """Subscribed to ``subjects`` (None: NATS did not confirm the subscriptions: send
    ``FAILED``), unsubscribed after."""
    queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=QUEUE_MAX)

    async def put(msg: Msg) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(msg)

    subs = [await nc.subscribe(subject, cb=put) for subject in subjects]
    try:
        try:
            await nc.flush(timeout=5)
        except (nats.errors.Error, TimeoutError):
            yield None
        else:
            yield Heard(queue)
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def follow(
    nc: NATS,
    subjects: list[str],
    each: Callable[[Msg, Heard], AsyncIterator[str]],
    before: Callable[[], AsyncIterator[str]] | None = None,
) -> AsyncIterator[str]:
    """A live stream: subscribed to ``subjects`` (else ``FAILED``), what ``before`` sends
    (what changed between the page and the subscription), ``ready``, then what ``each``
    makes of every message, and ``KEEPALIVE`` after ``KEEPALIVE_S`` without one."""
    async with listening(nc, *subjects) as heard:
        if heard is None:
            yield FAILED
            return
        if before is not None:
            async for chunk in before():
                yield chunk
        yield message("ready", READY)
        async for msg in heard:
            if msg is None:
                yield KEEPALIVE
                continue
            async for chunk in each(msg, heard):
                yield chunk


def sse(stream: AsyncIterator[str]) -> Response:
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


async def events(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    after = number(request, "after", 0) or 0
    nc = ws.client.nc
    subject = ws.client.subjects.updated(ws.tenant, ws.name)
    rows = c.templates.get_template("timeline_rows.html")
    ws_name = request.path_params["ws"]

    queue = request.query_params.get("approvals") == "1"
    csrf = c.csrf.token(request)

    async def approvals(seen: int) -> str:
        """The queue as of at least version ``seen`` (the replica may lag the log)."""
        answer = await ws.call(rq.ApprovalsQuery(min_version=seen or None))
        pending = answer.pending
        html = c.templates.get_template("approvals_list.html").render(
            pending=pending, prefix=PREFIX, ws=ws_name, csrf=csrf
        )
        return message("approvals", html)

    def render(batch: list[rp.EventSummary]) -> str:
        return rows.render(rows=list(reversed(batch)), prefix=PREFIX, ws=ws_name, live=True)

    last = after

    async def catch_up(upto: int | None = None) -> AsyncIterator[str]:
        """The events after ``last`` (at least up to ``upto``: the replica answering may not
        have applied what the notification announced yet)."""
        nonlocal last
        while True:
            body = rq.EventsQuery(after=last, limit=BATCH, min_version=upto)
            page: rp.EventPage = await ws.call(body)
            if not page.events:
                return  # nothing new
            last = page.events[-1].version
            if not queue:
                yield message("event", render(page.events))
            if not page.has_more:
                break
        if queue:
            yield await approvals(last)

    async def each(msg: Msg, _: Heard) -> AsyncIterator[str]:
        async for chunk in catch_up(codec.decode(msg.data, WorkspaceUpdated).version):
            yield chunk

    return sse(follow(nc, [subject], each, catch_up))


async def audit(c: Console, request: Request) -> Response:
    """The workspace's new audit records that match the page's search (``AuditQuery``), each
    as a row (``record``), from when the stream listens (``ws.audit.<t>.<w>``, the subject
    WS_AUDIT keeps)."""
    ws = await c.workspace(request)
    query = AuditQuery.of(request)
    nc = ws.client.nc
    rows = c.templates.get_template("audit_rows.html")

    async def each(msg: Msg, _: Heard) -> AsyncIterator[str]:
        record = codec.decode(msg.data, AuditRecord)
        if query.match(record):
            yield message("record", rows.render(records=[record], live=True))

    return sse(follow(nc, [ws.client.subjects.audit(ws.tenant, ws.name)], each))
