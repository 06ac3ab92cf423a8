"""The reader's log follower: WS_EVENTS → the replica's projection, and version waits.

The follower resumes from the tracking position stored with the data (0 for a new or
deleted database: a full rebuild), applies what arrives in batches, one transaction each,
and wakes the queries waiting for a version of a workspace. A batch its disk cannot take
(``ENOSPC``, SQLite's "database or disk is full") is retried every second by the log
follower, the reader marked ``storage_full`` meanwhile (its ping, ``/health``,
``quill_storage_full{service="reader"}``) until it has caught up with the log again.

How far behind it is (``lag``: ``quill_reader_lag_versions`` and ``_seconds``) is asked of
the log every ``LAG_POLL_S``: its last sequence, and when the first event not applied was
appended. Between two asks, what was applied meanwhile counts at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext

from contracts.limits import READER_MAX_VERSION_WAITERS, RETRY_AFTER_MS
from contracts.subjects import STREAM_EVENTS
from core.plan import Committed
from infra import log as eventlog
from infra import storage
from infra.blobs import Blobs
from infra.busy import refused
from infra.compaction import with_manifests
from infra.metrics import READER_APPLY_SECONDS
from infra.storage import FullState
from infra.store import Store
from services.reader.cache import RevisionCache

log = logging.getLogger("quill.reader")

TRACKING = "reader"
LAG_POLL_S = 1.0


class Follower:
    def __init__(
        self,
        js: JetStreamContext,
        store: Store,
        subject: str,
        cache: RevisionCache,
        on_applied: Callable[[], None] = lambda: None,
    ) -> None:
        self._js, self._store, self._subject, self._cache = js, store, subject, cache
        self._manifests = Blobs(js)  # compaction manifests: not kept in the projection
        self._on_applied = on_applied
        self._waiters: defaultdict[tuple[str, str], list[tuple[int, asyncio.Future[None]]]] = (
            defaultdict(list)
        )
        self._stop: Callable[[], Awaitable[None]] | None = None
        self.caught_up = False
        self.ready = asyncio.Event()
        """Set once the projection has every event the log held when following began."""
        self.position = 0
        self._target = 0
        self.max_waiters = READER_MAX_VERSION_WAITERS
        self._waiting = 0
        self.disk = FullState("reader")
        """Whether its own disk is full (``infra/storage.py``): set when the projection
        cannot take a batch, or a query cannot store a content; cleared once it has caught
        up with the log."""
        self.log_last = 0
        """The log's last sequence when last asked."""
        self._behind: tuple[int, float] | None = None
        """The first event not applied when last asked: (its sequence, when it was appended,
        as ``time.time()``)."""
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        self.position = await self._store.position(TRACKING)
        self._target = await eventlog.last_seq(self._js, self._subject, fresh=True)
        if self.position >= self._target:
            self._caught_up()
        else:  # nothing is served before it has caught up: apply in bulk until then
            await self._store.bulk(True)
        log.info("following the log from seq %d (last event at %d)", self.position, self._target)
        self._stop = await eventlog.follow(self._js, self._subject, self.position, self._on_batch)
        self.log_last = self._target
        self._watch = asyncio.create_task(self._watch_lag())

    def _caught_up(self) -> None:
        self.caught_up = True
        self.ready.set()

    async def stop(self) -> None:
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()  # nats-py may turn it into a TimeoutError: the flag ends it
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._stop is not None:
            await self._stop()

    def lag_versions(self) -> int:
        return max(0, self.log_last - self.position)

    def lag_seconds(self) -> float:
        """How long the first event not applied has been in the log; 0 when caught up with
        the log as last asked."""
        behind = self._behind
        if self.position >= self.log_last or behind is None:
            return 0.0
        return max(0.0, time.time() - behind[1])

    async def _watch_lag(self) -> None:
        while not self._stopping:
            try:
                await self._ask_lag()
            except Exception as exc:  # the log unreachable: the last answer stands
                log.debug("asking the log how far behind: %r", exc)
            await asyncio.sleep(LAG_POLL_S)  # a poll: nothing tells when the log grows

    async def _ask_lag(self) -> None:
        last = await eventlog.last_seq(self._js, self._subject, fresh=True)
        position = self.position
        behind = None
        if last > position:
            first = await self._js.get_msg(
                STREAM_EVENTS, seq=position + 1, subject=self._subject, next=True
            )
            if first.time is not None:
                behind = (int(first.seq or 0), first.time.timestamp())
        self.log_last, self._behind = last, behind

    async def _on_batch(self, batch: list[Committed], pending: int) -> None:
        batch = await with_manifests(batch, self._manifests)
        started = time.perf_counter()
        try:
            executed = await self._store.apply(batch, tracking=TRACKING)
        except Exception as exc:  # the log follower retries the batch every second
            if storage.is_disk_full(exc):
                self.disk.mark(f"cannot apply the log to the projection: {exc}")
                await self._store.bulk(False)  # what the WAL holds goes into the database
            raise
        READER_APPLY_SECONDS.observe(time.perf_counter() - started)
        if pending == 0:  # caught up: a batch that fit between two that did not proves little
            self.disk.clear()
        if executed is not None:
            for ws in executed.replaced:
                self._cache.forget(ws)
            for close in executed.closes:
                self._cache.close(*close)
            if executed.blobs:
                self._on_applied()
        self.position = batch[-1].seq
        if not self.caught_up and (pending == 0 or self.position >= self._target):
            self._caught_up()
            await self._store.bulk(False)
            log.info("caught up with the log at seq %d", self.position)
        for key in {(c.event.tenant, c.event.workspace) for c in batch}:
            waiters = self._waiters.get(key)
            if not waiters:
                continue
            version = self._store.version_of(*key)
            keep = []
            for wanted, future in waiters:
                if wanted <= version:
                    if not future.done():
                        future.set_result(None)
                else:
                    keep.append((wanted, future))
            if keep:
                self._waiters[key] = keep
            else:
                del self._waiters[key]

    @property
    def waiting(self) -> int:
        """Queries waiting for a version (bounded by ``max_waiters``)."""
        return self._waiting

    async def wait_for(self, tenant: str, workspace: str, version: int, timeout: float) -> bool:
        """Wait until the projection has ``version`` of the workspace; False on timeout.

        Raises:
            QuillError: busy (``UNAVAILABLE``, queue ``version_waiters``) when
                ``max_waiters`` queries wait already.
        """
        if self._store.version_of(tenant, workspace) >= version:
            return True
        if self._waiting >= self.max_waiters:
            raise refused(
                "reader",
                "version_waiters",
                "The reader",
                RETRY_AFTER_MS,
                limit=self.max_waiters,
            )
        key = (tenant, workspace)
        entry: tuple[int, asyncio.Future[None]] = (
            version,
            asyncio.get_running_loop().create_future(),
        )
        self._waiters[key].append(entry)
        self._waiting += 1
        try:
            await asyncio.wait_for(entry[1], timeout)
            return True
        except TimeoutError:
            return self._store.version_of(tenant, workspace) >= version
        finally:
            self._waiting -= 1
            self._forget(key, entry)

    def _forget(self, key: tuple[str, str], entry: tuple[int, asyncio.Future[None]]) -> None:
        """A waiter that gave up (timed out, cancelled) leaves no trace."""
        waiters = self._waiters.get(key)
        if waiters is None:
            return
        try:
            waiters.remove(entry)
        except ValueError:  # woken: already gone
            return
        if not waiters:
            del self._waiters[key]
