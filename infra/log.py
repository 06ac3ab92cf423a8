"""Reading the log (stream WS_EVENTS): a workspace's last sequence, catch-up, following."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, RawStreamMsg
from nats.js.errors import NotFoundError

from contracts import codec, hashing
from contracts.events import ChangesCommitted, WorkspaceEvent
from contracts.subjects import HEADER_EVENT_HASH, STREAM_EVENTS
from core.plan import Committed
from infra import direct

log = logging.getLogger("quill.log")

LINGER_S = 0.005
STOP_S = 10.0
"""The longest ``follow``'s stop waits for the follower to end."""
LINGER_IF_BUSY_S = 0.01


class CorruptEvent(Exception):
    """An event message whose payload does not hash to the hash it carries."""


def committed(msg: Msg, metadata: Msg.Metadata | None = None) -> Committed:
    """Decode an event message delivered by a consumer, verifying the hash it carries.

    Raises:
        CorruptEvent: the payload does not match its ``Ws-Event-Hash``.
    """
    meta = metadata or msg.metadata
    return _committed(msg.subject, msg.data, msg.headers, meta.sequence.stream)


def _committed(subject: str, data: bytes, headers: dict[str, str] | None, seq: int) -> Committed:
    digest = hashing.event_hash(data)
    carried = (headers or {}).get(HEADER_EVENT_HASH)
    if carried is not None and carried != digest:
        raise CorruptEvent(f"{subject} seq {seq}: hash mismatch")
    return Committed(event=codec.decode_event(data), hash=digest, seq=seq)


async def last_seq(js: JetStreamContext, subject: str, *, fresh: bool = False) -> int:
    """Stream sequence of the last event on ``subject`` (0 when it has none). ``fresh``: ask
    the stream leader (a direct get may be answered by a replica a little behind)."""
    raw = await last_message(js, subject, fresh=fresh)
    return int(raw.seq or 0) if raw is not None else 0


async def last_message(
    js: JetStreamContext, subject: str, *, fresh: bool = False
) -> RawStreamMsg | None:
    """The last event message on ``subject`` as stored (None when it has none; ``fresh``: as
    for ``last_seq``): its sequence, its ``Ws-Event-Hash``, and the event itself for
    ``stored`` to decode, at the cost of one round trip."""
    try:
        return await js.get_last_msg(STREAM_EVENTS, subject, direct=not fresh)
    except NotFoundError:
        return None


def stored(raw: RawStreamMsg) -> Committed:
    """An event message read by a get (``last_message``), verified as ``committed`` verifies
    a delivered one.

    Raises:
        CorruptEvent: the payload does not match its ``Ws-Event-Hash``.
    """
    return _committed(raw.subject or "", raw.data or b"", raw.headers, int(raw.seq or 0))


async def cut_paths(js: JetStreamContext, seqs: list[int]) -> set[str]:
    """The paths the events at log sequences ``seqs`` change: those whose summaries the
    projection cut (``Store.changed_in`` names them by sequence), read from the log (a get
    each)."""
    paths: set[str] = set()
    for seq in seqs:
        raw = await js.get_msg(STREAM_EVENTS, seq)
        event = codec.decode_event(raw.data or b"")
        if isinstance(event, ChangesCommitted):
            paths.update(c.path for c in event.changes)
    return paths


async def event_at(js: JetStreamContext, seq: int) -> WorkspaceEvent | None:
    """The event at log sequence ``seq`` (a get); None: no longer in the log."""
    try:
        raw = await js.get_msg(STREAM_EVENTS, seq)
    except NotFoundError:
        return None
    return codec.decode_event(raw.data or b"")


async def stream_last_seq(js: JetStreamContext) -> int:
    info = await js.stream_info(STREAM_EVENTS)
    return int(info.state.last_seq)


async def read(
    js: JetStreamContext, subject: str, after: int, upto: int, timeout: float = 30.0
) -> list[Committed]:
    """Every event on ``subject`` with ``after < seq <= upto``, in order (all in memory: for
    a log of any length, use ``chunks``).

    Raises:
        TimeoutError: the server did not answer within ``timeout``.
        CorruptEvent: an event does not match the hash it carries.
    """
    out: list[Committed] = []
    async for chunk in chunks(js, subject, after, upto, timeout=timeout):
        out.extend(chunk)
    return out


async def first(js: JetStreamContext, subject: str, upto: int) -> Committed | None:
    """The first event on ``subject`` (at most ``upto``), or None: one direct get."""
    found = await _read_direct(js, subject, 0, upto, 1)
    return found[0] if found else None


CHUNK = 4096
"""Events a chunk of ``chunks`` holds at most: a million-event log is read in bounded memory."""


async def chunks(
    js: JetStreamContext,
    subject: str,
    after: int,
    upto: int,
    *,
    size: int = CHUNK,
    timeout: float = 30.0,
) -> AsyncIterator[list[Committed]]:
    """The events on ``subject`` with ``after < seq <= upto``, in order, ``size`` at a time.

    By batched direct gets (no consumer: a consumer per read lingers on the server after it is
    done, and a busy executor or a writer loading many workspaces reached the server's limit
    of 1,000 within seconds: ``maximum consumers limit reached``); from the stream leader by
    an ordered consumer when a direct get, answered by a replica behind the leader, misses
    events ``upto`` says exist.

    ``timeout`` bounds each wait for the server (a long log takes as long as it takes while
    events keep coming: a million events is ~40 s here), and each of the leader's parts.

    Raises:
        TimeoutError: the server did not answer within ``timeout``.
        CorruptEvent: an event does not match the hash it carries.
    """
    while after < upto:
        found = await _read_direct(js, subject, after, upto, size, timeout)
        if not found:  # a replica behind the leader answered: ask the leader
            async with asyncio.timeout(timeout):
                found = await _read_consumer(js, subject, after, upto, size)
            if not found:
                return
        yield found
        after = found[-1].seq


DIRECT_BATCH = direct.BATCH


async def _read_direct(
    js: JetStreamContext, subject: str, after: int, upto: int, count: int, idle: float = 30.0
) -> list[Committed]:
    """At most ``count`` of the events after ``after`` up to ``upto`` that direct gets find,
    in order (fewer when the replica answering is behind)."""
    found = await direct.messages(
        js,
        STREAM_EVENTS,
        subject,
        after=after,
        upto=upto,
        count=count,
        batch=DIRECT_BATCH,
        idle=idle,
    )
    return [_committed(subject, data, headers, seq) for seq, headers, data in found]


HEARTBEAT_S = 1.0
"""An ordered consumer's idle heartbeat (``ordered``): a lost consumer is made again within
two to three of them."""


async def ordered(
    js: JetStreamContext,
    subject: str,
    cb: Callable[[Msg], Awaitable[None]],
    start: int | None = None,
    *,
    stream: str | None = None,
    pending_msgs_limit: int = 512 * 1024,
    pending_bytes_limit: int = 256 * 1024 * 1024,
) -> JetStreamContext.PushSubscription:
    """An ordered consumer of ``subject`` (in ``stream``, else the stream that holds it)
    calling ``cb`` with each message from sequence ``start`` (from the first without it);
    the pending limits are nats-py's defaults unless given.

    Its server sends a heartbeat every ``HEARTBEAT_S`` when there is nothing to deliver, and
    nats-py makes the consumer again from where it was once two are missed: an ordered
    consumer is one replica in memory, gone with the server it lived on, and with nats-py's
    5 s a follower whose server was killed stayed behind 10-20 s (reads waiting for a version
    timed out on that replica)."""
    config = (
        ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
        if start is None
        else ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
    )
    return await js.subscribe(
        subject,
        stream=stream,
        cb=cb,
        ordered_consumer=True,
        idle_heartbeat=HEARTBEAT_S,
        config=config,
        pending_msgs_limit=pending_msgs_limit,
        pending_bytes_limit=pending_bytes_limit,
    )


async def _read_consumer(
    js: JetStreamContext, subject: str, after: int, upto: int, count: int
) -> list[Committed]:
    out: list[Committed] = []
    done = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Msg) -> None:
        if done.done():
            return
        item = committed(msg)
        if item.seq <= upto:
            out.append(item)
        if (item.seq >= upto or len(out) >= count) and not done.done():
            done.set_result(None)

    sub = await ordered(js, subject, on_msg, after + 1)
    try:
        await done
    finally:
        await sub.unsubscribe()
    return out


async def follow(
    js: JetStreamContext,
    subject: str,
    after: int,
    on_batch: Callable[[list[Committed], int], Awaitable[None]],
    max_batch: int = 512,
) -> Callable[[], Awaitable[None]]:
    """Follow ``subject`` from ``after``: ``on_batch(events, pending)`` is called with what has
    arrived (in order, one call at a time; ``pending`` is how many more the stream holds).
    Returns a function that stops following.

    Far behind the log (a replica starting from nothing, or falling behind), it reads by
    batched direct gets, a batch at a time, as fast as ``on_batch`` takes them; near the end,
    an ordered consumer pushes what comes. Memory stays bounded either way (before: a replica
    catching up on a million events queued them all, 2.6 GiB; and a push consumer cannot be
    held: nats-py drops what overflows its pending limit, a gap the replica stops at). A batch
    that fails is retried from the last one applied, every second, saying so.
    """
    task = asyncio.create_task(
        _follow(_Follower(js, subject, on_batch, max_batch), after), name="log-follower"
    )

    async def stop() -> None:
        task.cancel()
        # bounded: a stop that waited on a task that would not end kept a replica from
        # exiting on SIGTERM (seen once, mid catch-up; not reproduced)
        done, _ = await asyncio.wait({task}, timeout=STOP_S)
        if not done:
            log.warning("the log follower did not stop within %.0f s; leaving it", STOP_S)
        elif not task.cancelled() and task.exception() is not None:
            log.debug("the log follower ended with %r", task.exception())

    return stop


BEHIND = 8
"""Batches behind the log past which the follower reads by direct gets rather than pushed."""


@dataclass(frozen=True)
class _Follower:
    """One subject followed: its two ways of reading the log, which ``_follow`` alternates
    (each returns the position it reached)."""

    js: JetStreamContext
    subject: str
    on_batch: Callable[[list[Committed], int], Awaitable[None]]
    max_batch: int

    async def catch_up(self, position: int) -> int:
        """Apply the log by direct gets until fewer than ``BEHIND`` batches are left (the next
        batch fetched while one is applied)."""

        async def fetch(after: int) -> tuple[int, list[Committed]]:
            last = await stream_last_seq(self.js)
            if last - after <= BEHIND * self.max_batch:
                return last, []
            found = await direct.messages(
                self.js, STREAM_EVENTS, self.subject, after=after, upto=last, count=self.max_batch
            )
            batch = [
                _committed(headers.get("Nats-Subject", self.subject), data, headers, seq)
                for seq, headers, data in found
            ]
            return last, batch

        ahead = asyncio.create_task(fetch(position))
        try:
            while True:
                last, batch = await ahead
                if not batch:
                    return position
                ahead = asyncio.create_task(fetch(batch[-1].seq))
                await self.on_batch(batch, last - batch[-1].seq)
                position = batch[-1].seq
        finally:
            ahead.cancel()
            if ahead.done() and not ahead.cancelled():
                ahead.exception()  # retrieved: the failure that matters is raised already

    async def pushed(self, position: int) -> int:
        """Apply what an ordered consumer pushes from ``position`` on; return (to catch up by
        direct gets) when the queue grows past ``BEHIND`` batches."""
        arrived: deque[tuple[Committed, int] | Exception] = deque()
        more = asyncio.Event()

        async def on_msg(msg: Msg) -> None:
            try:
                meta = msg.metadata
                arrived.append((committed(msg, meta), meta.num_pending))
            except Exception as exc:
                arrived.append(exc)
            more.set()

        sub = await ordered(
            self.js,
            self.subject,
            on_msg,
            position + 1,
            pending_msgs_limit=100_000,
            pending_bytes_limit=512 * 1024 * 1024,
        )
        loop = asyncio.get_running_loop()
        last_apply = 0.0
        try:
            while len(arrived) <= BEHIND * self.max_batch:
                if not arrived:
                    more.clear()
                    await more.wait()
                    continue
                if isinstance(arrived[0], Exception):
                    raise arrived[0]
                # Under sustained load, linger a moment so one transaction carries more events
                # (per-event cost falls ~3x from batches of 2 to 128); when idle, apply at once.
                if (
                    loop.time() - last_apply < LINGER_IF_BUSY_S
                    and len(arrived) < self.max_batch // 4
                ):
                    await asyncio.sleep(LINGER_S)
                batch: list[Committed] = []
                pending = 0
                # up to an event it could not read (raised next round, after those before it)
                while (
                    arrived
                    and len(batch) < self.max_batch
                    and not isinstance(arrived[0], Exception)
                ):
                    event, pending = arrived.popleft()  # type: ignore[misc]
                    batch.append(event)
                last_apply = loop.time()
                await self.on_batch(batch, pending)
                position = batch[-1].seq
            log.info("the log is %d events ahead: catching up by direct gets", len(arrived))
            return position
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass


async def _follow(follower: _Follower, position: int) -> None:
    while True:
        try:
            position = await follower.catch_up(position)
            position = await follower.pushed(position)
        except asyncio.CancelledError:
            raise
        except Exception:
            # An event this replica cannot read or apply (a newer writer's, or corrupt): it
            # stops at the gap, and says so every second, rather than skip an event.
            log.critical("cannot apply the events after seq %d; retrying", position)
            log.exception("follower")
            await asyncio.sleep(1)
