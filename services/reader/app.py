"""A reader replica: wiring only. Run it with ``quill reader --nats-url URL --data DIR``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts import ops as registry
from contracts.limits import READER_MAX_INFLIGHT
from contracts.subjects import QUEUE_READER
from infra import bus, claims, metrics
from infra.approvals import Approvals
from infra.blobs import Blobs
from infra.bridges import Bridges
from infra.offload import Offload
from infra.runtime import Auditor, Running, Settings, start_service
from infra.snapshots import STARTED_FROM
from infra.store import Store
from services.reader.cache import RevisionCache
from services.reader.diff import Differ
from services.reader.follower import TRACKING, Follower
from services.reader.handlers import query_handler
from services.reader.indexer import Indexer
from services.reader.queries import Queries
from services.reader.search import Search
from services.reader.snapshots import SnapshotConfig, Snapshotter
from services.reader.snapshots import prepare as prepare_snapshot


class Reader:
    """Follows the log into its own projection and answers queries as of any version."""

    log = logging.getLogger("quill.reader")

    def __init__(
        self,
        settings: Settings,
        nc: NATS,
        store: Store,
        snapshots: SnapshotConfig | None = None,
        *,
        max_wait_s: float = 5.0,
    ):
        """``snapshots``: ``quill reader``'s options (default: ``SnapshotConfig()``'s)."""
        self.settings = settings
        self.subjects = settings.subjects
        self.instance = settings.instance or bus.instance_id("reader")
        self.nc, self.js, self.store = nc, nc.jetstream(), store
        cache = RevisionCache()
        self.indexer = Indexer(store)
        self.follower = Follower(self.js, store, self.subjects, cache, self.indexer.poke)
        self.blobs = Blobs(self.js, store, on_fetched=self.indexer.poke)
        self.queries = Queries(
            store,
            self.blobs,
            cache,
            Approvals(self.js, settings.subjects),
            self.js,
        )
        self.offload = Offload("reader")
        """Worker processes for greps and diffs (``infra/offload.py``)."""
        by_name = {
            **self.queries.ops(),
            **Search(self.queries, self.offload).ops(),
            **Differ(self.queries, self.offload).ops(),
        }
        self.ops = registry.table("qry", by_name)
        """Every query op, by name (``contracts/ops.py`` checks that none is missing)."""
        self.snapshots = Snapshotter(
            self.js, store.path, TRACKING, self.instance, snapshots or SnapshotConfig(),
            lambda: self.follower.position if self.follower.caught_up else None,
        )  # fmt: skip
        self.auditor = Auditor(nc, self.subjects, "reader", self.instance)
        self.bridges = Bridges(self.js)
        self.max_wait_s = max_wait_s
        self.max_inflight = READER_MAX_INFLIGHT
        self.tasks: set[asyncio.Task[None]] = set()
        self._subs: list[Subscription] = []
        self._joining: asyncio.Task[None] | None = None
        self._caught_up: asyncio.Task[None] | None = None
        self._gauges = metrics.Sources()
        self.started_from: str | None = None
        """The snapshot the projection was installed from, if it was."""
        self.serving = asyncio.Event()
        """Set once it answers queries in the replicas' queue group (caught up)."""

    @staticmethod
    async def prepare(
        settings: Settings, nc: NATS, path: Path, snapshots: SnapshotConfig | None = None
    ) -> None:
        """Before its projection opens: start from the newest snapshot if the projection is
        missing or far behind it (``services/reader/snapshots.py``)."""
        config = snapshots or SnapshotConfig()
        await prepare_snapshot(nc.jetstream(), path, TRACKING, config)

    def info(self) -> dict[str, Any]:
        return {
            "position": self.follower.position,
            "indexing": self.indexer.busy,
            "caught_up": self.follower.caught_up,
            "serving": self.serving.is_set(),
            "inflight": len(self.tasks),
            "version_waiters": self.follower.waiting,
            "local_workspaces": len(self.bridges),
            **self.follower.disk.info(),
            "started_from": self.started_from,
            "snapshot": self.snapshots.newest.position if self.snapshots.newest else None,
            "offload": self.offload.info(),
        }

    async def start(self) -> None:
        self.offload.warm()
        self.started_from = await self.store.get_meta(STARTED_FROM)
        await self.bridges.start()
        await self.follower.start()
        follower = self.follower
        self._gauges.add(metrics.READER_LAG_VERSIONS, follower.lag_versions)
        self._gauges.add(metrics.READER_LAG_SECONDS, follower.lag_seconds)
        self._gauges.add(metrics.READER_VERSION_WAITERS, lambda: follower.waiting)
        self.snapshots.start()
        handler = query_handler(self)
        self._subs += [
            await bus.serve(self.nc, self.subjects.all_replica(self.instance), None, handler),
            *await bus.serve_ping(self.nc, self.subjects, "reader", self.instance, self.info),
            *await claims.serve(self.nc, self.subjects, self.bridges, "reader", self.instance),
        ]
        # It joins the replicas' queue group once it is near the log (``follower.near``): a
        # replica that starts from a snapshot joins at once, and answers a workspace whose
        # events it has not reached yet by applying them first (``follower.py``); one that
        # replays a long log joins when it is close to the end. Nothing it answers is older
        # than the log when asked.
        if self.follower.near.is_set():
            await self._join(handler)
        else:
            self.log.info("reader %s catching up before it serves queries", self.instance)
            self._joining = asyncio.create_task(self._join_when_near(handler))
        await self.nc.flush()

    async def _join_when_near(self, handler: bus.Handler) -> None:
        await self.follower.near.wait()
        await self._join(handler)

    async def _join(self, handler: bus.Handler) -> None:
        self._subs.append(await bus.serve(self.nc, self.subjects.all_qry, QUEUE_READER, handler))
        await self.nc.flush()
        self.serving.set()
        self.log.info("reader %s serving %s", self.instance, self.subjects.all_qry)
        if not self.follower.caught_up:
            self._caught_up = asyncio.create_task(self._when_caught_up())
        else:
            await self._when_caught_up()

    async def _when_caught_up(self) -> None:
        await self.follower.ready.wait()
        # The trigram index takes in what was applied once the replica has caught up, not
        # during: catching up goes faster without it (grep reads a content not indexed yet:
        # the same answers). It makes snapshots only then: before, some workspaces may be
        # applied ahead of its position.
        self.indexer.start(self.blobs)
        snapshot = self.subjects.snapshot("reader")
        self._subs.append(await bus.serve(self.nc, snapshot, QUEUE_READER, self._snapshot))

    async def _snapshot(self, msg: Msg) -> None:
        task = asyncio.create_task(self.snapshots.on_request(msg))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        await self.snapshots.stop()
        for task in (self._joining, self._caught_up):
            if task is not None:
                task.cancel()
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=10)
        await self.offload.close()
        await self.follower.stop()
        await self.indexer.stop()
        await self.bridges.stop()
        self._gauges.remove()


async def start_reader(
    settings: Settings, snapshots: SnapshotConfig | None = None
) -> Running[Reader]:
    """Connect, open the projection (``<data>/reader.db``, from the newest snapshot first if
    it is missing or far behind) and start a reader replica; the result's ``stop`` undoes it."""

    def reader(settings: Settings, nc: NATS, store: Store) -> Reader:
        return Reader(settings, nc, store, snapshots)

    async def prepare(settings: Settings, nc: NATS, path: Path) -> None:
        await Reader.prepare(settings, nc, path, snapshots)

    return await start_service(settings, "reader", reader, prepare)
