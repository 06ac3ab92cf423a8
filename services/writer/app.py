"""The writer service: wiring only. Run it with ``quill writer --nats-url URL --data DIR``.

Built once, here, each given what it needs: ``Deps`` (the collaborators), the ``Actors``
(``actors.py``), the ``Entry`` (``handlers.py``: subscriptions → ``Actors.take``), the
``Applier`` (``applier.py``: what committed → the projection; a failed apply →
``Actors.stale``), handed to the ``Appender`` as it starts, and the ``Partitions`` (told the
entry and the actors as they start). Nothing calls back into this module.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from contracts.subjects import Subjects
from infra import assets, bus, claims, metrics, snapshot_install, storage
from infra.approvals import Approvals, ensure_stream
from infra.blobs import Blobs
from infra.bridges import Bridges
from infra.fork_registry import Registry
from infra.offload import Offload
from infra.runtime import Auditor, Running, Settings, start_service
from infra.secret_registry import secrets_from_env
from infra.store import Store
from services.writer.actors import Actors
from services.writer.append import Appender
from services.writer.applier import Applier
from services.writer.config import WriterConfig
from services.writer.deps import Backlog, Deps
from services.writer.handlers import Entry
from services.writer.partitions import Partitions

log = logging.getLogger("quill.writer")


def _backlog(config: WriterConfig) -> Backlog:
    """The bounds on commands held, as ``quill writer``'s options set them."""
    return Backlog(
        limit=config.max_queued,
        max_bytes=config.max_queued_bytes,
        per_workspace=config.max_queued_per_workspace,
        parked_per_workspace=config.max_waiting_per_workspace,
    )


class Writer:
    """Owns the mutations of the workspaces whose commands reach it."""

    @staticmethod
    async def prepare(settings: Settings, nc: NATS, path: Path, behind: int = 0) -> None:
        """Before its projection opens: a writer with none starts from the newest reader
        snapshot if it covers more than ``behind`` events (``--snapshot-behind``; 0, the
        default: never; ``infra/snapshot_install.py``)."""
        await snapshot_install.bootstrap(
            nc.jetstream(), path, "reader", "reader", behind=behind, into="writer"
        )

    def __init__(
        self,
        settings: Settings,
        nc: NATS,
        store: Store,
        config: WriterConfig | None = None,
    ) -> None:
        """``config``: ``quill writer``'s options (default: ``contracts/limits.py``'s)."""
        config = config or WriterConfig()
        self.settings = settings
        self.subjects: Subjects = settings.subjects
        self.instance = settings.instance or bus.instance_id("writer")
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.store = store
        self.appender = Appender(nc)
        self.bridges = Bridges(self.js)
        self._subs: list[Subscription] = []
        self._usage: asyncio.Task[None] | None = None
        partitions = config.partitions
        self.partitions: Partitions | None = (
            Partitions(
                self.js,
                self.subjects,
                self.instance,
                settings.replicas,
                partitions,
                config.lease_ttl,
            )
            if partitions
            else None
        )
        """On a cluster: the command partitions this writer leases (None: it serves all)."""
        self.deps = Deps(
            subjects=self.subjects,
            nc=nc,
            js=self.js,
            store=store,
            appender=self.appender,
            blobs=Blobs(self.js, store),
            manifest_blobs=Blobs(self.js),
            bridges=self.bridges,
            secrets=secrets_from_env(),
            auditor=Auditor(nc, self.subjects, "writer", self.instance),
            partitions=self.partitions,
            backlog=_backlog(config),
            offload=Offload("writer"),
            approvals=Approvals(self.js, self.subjects),
            registry=Registry(self.js, self.subjects, f"writer:{self.instance}"),
        )
        """What every workspace actor and the command entry are given."""
        self.actors = Actors(self.deps, config.max_workspaces)
        """The workspaces held in memory, at most ``--max-workspaces`` but busy ones."""
        self.applier = Applier(self.deps, self.actors)
        self.entry = Entry(self.deps, self.actors)
        self._gauges = metrics.Sources()

    @property
    def queued(self) -> int:
        """Commands accepted and not yet answered (bounded by ``deps.backlog.limit``)."""
        return self.deps.backlog.queued

    def info(self) -> dict[str, Any]:
        return {
            "workspaces": len(self.actors),
            "budget": self.actors.max_workspaces,
            "queued": self.queued,
            "queued_bytes": self.deps.backlog.bytes,
            "waiting": self.actors.waiting,
            "local_workspaces": len(self.bridges),
            "appends": {
                "sends": self.appender.sends,
                "events": self.appender.events,
                "chained": self.appender.chained,
            },
            "offload": self.deps.offload.info(),
            **({"partitions": self.partitions.info()} if self.partitions else {}),
            **self.deps.log_storage.info(),
        }

    async def start(self) -> None:
        self.deps.offload.warm()
        await self.bridges.start()
        self.appender.start(self.applier.apply)
        replicas = self.settings.replicas
        await assets.patiently(
            "creating WS_APPROVALS", lambda: ensure_stream(self.js, self.subjects, replicas)
        )
        self._usage = asyncio.create_task(storage.poll_log_usage(self.js))
        self._gauges.add(metrics.WRITER_QUEUE_DEPTH, lambda: self.queued)
        self._gauges.add(metrics.WRITER_QUEUE_DEPTH_MAX, self.actors.deepest)
        self._gauges.add(metrics.WRITER_WORKSPACES, lambda: len(self.actors))
        if self.partitions is not None:
            await self.partitions.start(self.entry.serve_partition, self.actors)
            serving = f"{self.partitions.count} partitions ({len(self.partitions.held)} held)"
        else:
            await self.applier.complete()
            self._subs.append(await self.entry.serve())
            serving = self.subjects.all_cmd
            self.actors.resume()
        self._subs += await bus.serve_ping(
            self.nc, self.subjects, "writer", self.instance, self.info
        )
        self._subs += await claims.serve(
            self.nc, self.subjects, self.bridges, "writer", self.instance, registrar=True
        )
        await self.nc.flush()
        log.info("writer %s serving %s", self.instance, serving)

    async def stop(self, grace_s: float = 10.0) -> None:
        await self.actors.quiet()
        if self.partitions is not None:
            await self.partitions.stop(grace_s)
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        await self.actors.stop(grace_s)
        await self.appender.stop()
        await self.deps.offload.close()
        await self.bridges.stop()
        if self._usage is not None:
            self._usage.cancel()
            await asyncio.gather(self._usage, return_exceptions=True)
        self._gauges.remove()


async def start_writer(settings: Settings, config: WriterConfig | None = None) -> Running[Writer]:
    """Connect, open the projection (``<data>/writer.db``, from a reader's snapshot first if
    ``config.snapshot_behind`` says so) and start a writer; the result's ``stop`` undoes it."""
    config = config or WriterConfig()

    def writer(settings: Settings, nc: NATS, store: Store) -> Writer:
        return Writer(settings, nc, store, config)

    async def prepare(settings: Settings, nc: NATS, path: Path) -> None:
        await Writer.prepare(settings, nc, path, config.snapshot_behind)

    return await start_service(settings, "writer", writer, prepare)
