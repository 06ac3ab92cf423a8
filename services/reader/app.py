"""A reader replica: wiring only. Run it with ``quill reader --nats-url URL --data DIR``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from contracts import ops as registry
from contracts.limits import READER_MAX_INFLIGHT
from contracts.subjects import QUEUE_READER
from infra import bus, metrics
from infra.blobs import Blobs
from infra.bridges import Bridges
from infra.runtime import Auditor, Settings
from infra.store import Store
from services.reader.cache import RevisionCache
from services.reader.diff import Differ
from services.reader.follower import Follower
from services.reader.handlers import query_handler
from services.reader.indexer import Indexer
from services.reader.queries import Queries
from services.reader.search import Search


class Reader:
    """Follows the log into its own projection and answers queries as of any version."""

    log = logging.getLogger("quill.reader")

    def __init__(self, settings: Settings, nc: NATS, store: Store, *, max_wait_s: float = 5.0):
        self.settings = settings
        self.subjects = settings.subjects
        self.instance = settings.instance or bus.instance_id("reader")
        self.nc, self.js, self.store = nc, nc.jetstream(), store
        cache = RevisionCache()
        self.indexer = Indexer(store)
        self.follower = Follower(self.js, store, self.subjects.all_evt, cache, self.indexer.poke)
        self.queries = Queries(store, Blobs(self.js, store, on_fetched=self.indexer.poke), cache)
        by_name = {**self.queries.ops(), **Search(self.queries).ops(), **Differ(self.queries).ops()}
        self.ops = registry.table("qry", by_name)
        """Every query op, by name (``contracts/ops.py`` checks that none is missing)."""
        self.auditor = Auditor(nc, self.subjects, "reader", self.instance)
        self.bridges = Bridges(self.js)
        self.max_wait_s = max_wait_s
        self.max_inflight = READER_MAX_INFLIGHT
        self.tasks: set[asyncio.Task[None]] = set()
        self._subs: list[Subscription] = []
        self._joining: asyncio.Task[None] | None = None
        self._gauges = metrics.Sources()
        self.serving = asyncio.Event()
        """Set once it answers queries in the replicas' queue group (caught up)."""

    def info(self) -> dict[str, Any]:
        return {
            "position": self.follower.position,
            "indexing": self.indexer.busy,
            "caught_up": self.follower.caught_up,
            "inflight": len(self.tasks),
            "version_waiters": self.follower.waiting,
            "local_workspaces": len(self.bridges),
            **self.follower.disk.info(),
        }

    async def start(self) -> None:
        await self.bridges.start()
        self.indexer.start()
        await self.follower.start()
        follower = self.follower
        self._gauges.add(metrics.READER_LAG_VERSIONS, follower.lag_versions)
        self._gauges.add(metrics.READER_LAG_SECONDS, follower.lag_seconds)
        self._gauges.add(metrics.READER_VERSION_WAITERS, lambda: follower.waiting)
        handler = query_handler(self)
        self._subs += [
            await bus.serve(self.nc, self.subjects.all_replica(self.instance), None, handler),
            *await bus.serve_ping(self.nc, self.subjects, "reader", self.instance, self.info),
        ]
        # It joins the replicas' queue group once it has caught up with the log, so a
        # replica that starts late (or rebuilds) never answers for the others meanwhile.
        if self.follower.caught_up:
            await self._join(handler)
        else:
            self.log.info("reader %s catching up before it serves queries", self.instance)
            self._joining = asyncio.create_task(self._join_when_ready(handler))
        await self.nc.flush()

    async def _join_when_ready(self, handler: bus.Handler) -> None:
        await self.follower.ready.wait()
        await self._join(handler)

    async def _join(self, handler: bus.Handler) -> None:
        self._subs.append(await bus.serve(self.nc, self.subjects.all_qry, QUEUE_READER, handler))
        await self.nc.flush()
        self.serving.set()
        self.log.info("reader %s serving %s", self.instance, self.subjects.all_qry)

    async def stop(self) -> None:
        if self._joining is not None:
            self._joining.cancel()
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=10)
        await self.follower.stop()
        await self.indexer.stop()
        await self.bridges.stop()
        self._gauges.remove()
