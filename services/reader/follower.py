"""The reader's log follower: WS_EVENTS → the replica's projection, and version waits.

The follower resumes from the tracking position stored with the data (0 for a new or
deleted database: a full rebuild), applies what arrives in batches, one transaction each,
and wakes the queries waiting for a version of a workspace. A batch its disk cannot take
(``ENOSPC``, SQLite's "database or disk is full") is retried every second by the log
follower, the reader marked ``storage_full`` meanwhile (its ping, ``/health``,
``quill_storage_full{service="reader"}``) until it has caught up with the log again.

A replica at most ``SERVE_BEHIND`` events behind the log serves (``near``) before it has
caught up: a query for a workspace whose events it has not reached yet has them read from the
log and applied at once, ahead of the log's order (``Store.apply(ahead=True)``), rather than
waiting for the catch-up to get there; the catch-up skips them when it does. So a replica
that starts from a snapshot answers any workspace once the snapshot is installed, not once
the tail after it is applied (at 1,000,000 workspaces, 20,000 events at random took 7 s
here, issue 17). What only the whole log answers (the workspace listing) waits for the
catch-up. A purge or a compaction is never applied ahead: its workspace waits for the
catch-up too (a purge applied twice would wipe what came after it).

How far behind it is (``lag``: ``quill_reader_lag_versions`` and ``_seconds``) is asked of
the log every ``LAG_POLL_S``: its last sequence, and when the first event not applied was
appended. Between two asks, what was applied meanwhile counts at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext

from contracts.events import HistoryCompacted, WorkspacePurged
from contracts.limits import READER_MAX_VERSION_WAITERS, RETRY_AFTER_MS
from contracts.subjects import STREAM_EVENTS, Subjects
from core.plan import Committed, Plan
from infra import log as eventlog
from infra import storage
from infra.blobs import Blobs
from infra.busy import refused
from infra.compaction import with_manifests
from infra.loops import Loop
from infra.metrics import READER_APPLY_SECONDS
from infra.storage import FullState
from infra.store import Store
from services.reader.cache import RevisionCache

log = logging.getLogger("quill.reader")

TRACKING = "reader"
LAG_POLL_S = 1.0
SERVE_BEHIND = 50_000
"""Events behind the log up to which a replica catching up serves (``near``): what a snapshot
leaves to replay (``--snapshot-events``, 20,000) with room; further behind (replaying the
log from nothing), it serves once it is this close."""
AHEAD_MAX = 4_096
"""The most events of one workspace applied ahead of the log's order for a query; a
workspace further behind waits for the catch-up."""


def _unreachable(exc: Exception) -> None:  # the last answer stands
    log.debug("asking the log how far behind: %r", exc)


class Follower:
    def __init__(
        self,
        js: JetStreamContext,
        store: Store,
        subjects: Subjects,
        cache: RevisionCache,
        on_applied: Callable[[], None] = lambda: None,
    ) -> None:
        self._js, self._store, self._cache = js, store, cache
        self._subjects, self._subject = subjects, subjects.all_evt
        self._manifests = Blobs(js)  # compaction manifests: not kept in the projection
        self._on_applied = on_applied
        self._waiters: defaultdict[tuple[str, str], list[tuple[int, asyncio.Future[None]]]] = (
            defaultdict(list)
        )
        self._stop: Callable[[], Awaitable[None]] | None = None
        self.caught_up = False
        self.ready = asyncio.Event()
        """Set once the projection has every event the log held when following began."""
        self.near = asyncio.Event()
        """Set once it is at most ``SERVE_BEHIND`` events behind the log: it may serve."""
        self._ahead: dict[tuple[str, str], asyncio.Future[None]] = {}
        """Workspaces whose events are being applied ahead of the log's order, for a query."""
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
        self._watch = Loop("lag watch", self._ask_lag, every=LAG_POLL_S, failed=_unreachable)
        """Asks the log how far behind (a poll: nothing tells when the log grows)."""

    async def start(self) -> None:
        self.position = await self._store.position(TRACKING)
        self._target = await eventlog.last_seq(self._js, self._subject, fresh=True)
        if self.position >= self._target:
            self._caught_up()
        else:  # apply in bulk until caught up (no checkpoint in its commits)
            await self._store.bulk(True)
            if self._target - self.position <= SERVE_BEHIND:
                self.near.set()
        log.info("following the log from seq %d (last event at %d)", self.position, self._target)
        self._stop = await eventlog.follow(self._js, self._subject, self.position, self._on_batch)
        self.log_last = self._target
        self._watch.start()

    def _caught_up(self) -> None:
        self.caught_up = True
        self.ready.set()
        self.near.set()

    async def stop(self) -> None:
        for ahead in list(self._ahead.values()):
            ahead.cancel()
        await self._watch.stop()
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
            self._applied(executed)
        self.position = batch[-1].seq
        if not self.caught_up and (pending == 0 or self.position >= self._target):
            self._caught_up()
            await self._store.bulk(False)
            log.info("caught up with the log at seq %d", self.position)
        elif pending <= SERVE_BEHIND:
            self.near.set()
        self._wake({(c.event.tenant, c.event.workspace) for c in batch})

    def _applied(self, executed: Plan) -> None:
        """Keep the revision cache true to what an apply changed; have the index take in
        its contents."""
        for ws in executed.replaced:
            self._cache.forget(ws)
        for close in executed.closes:
            self._cache.close(*close)
        if executed.blobs:
            self._on_applied()

    def _wake(self, keys: set[tuple[str, str]]) -> None:
        """Answer the queries waiting for a version of ``keys`` that is applied now."""
        for key in keys:
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
        if not self.caught_up and key not in self._ahead:
            ahead = asyncio.ensure_future(self._apply_ahead(tenant, workspace, version))
            self._ahead[key] = ahead
            ahead.add_done_callback(lambda _: self._ahead.pop(key, None))
        try:
            await asyncio.wait_for(entry[1], timeout)
            return True
        except TimeoutError:
            return self._store.version_of(tenant, workspace) >= version
        finally:
            self._waiting -= 1
            self._forget(key, entry)

    async def wait_caught_up(self, timeout: float) -> bool:
        """Wait until it has caught up with the log (as when following began); False on
        timeout."""
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError:
            return self.caught_up
        return True

    async def _apply_ahead(self, tenant: str, workspace: str, version: int) -> None:
        """Apply the workspace's events the catch-up has not reached yet, up to its last in
        the log, ahead of the log's order (the module docstring); nothing when that would be
        a purge or a compaction, or more than ``AHEAD_MAX`` events: the query waits for the
        catch-up then. Never raises: the query's wait decides."""
        try:
            row = self._store.workspace(tenant, workspace)
            have = row.version if row is not None else 0
            if version - have > AHEAD_MAX:
                return
            subject = self._subjects.evt(tenant, workspace)
            last = await eventlog.last_seq(self._js, subject, fresh=True)
            events = await eventlog.read(self._js, subject, row.last_seq if row else 0, last)
            if (
                not events
                or len(events) > AHEAD_MAX
                or any(isinstance(c.event, WorkspacePurged | HistoryCompacted) for c in events)
            ):
                return
            executed = await self._store.apply(events, ahead=True)
            if executed is not None:
                self._applied(executed)
                log.debug("%s/%s: %d events applied ahead", tenant, workspace, len(events))
            self._wake({(tenant, workspace)})
        except Exception as exc:  # the catch-up gets there all the same
            log.warning("%s/%s: not applied ahead of the catch-up: %r", tenant, workspace, exc)

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
