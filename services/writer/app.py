"""The writer service: wiring only. Run it with ``quill writer --nats-url URL --data DIR``."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from contracts.events import HistoryCompacted
from contracts.subjects import QUEUE_WRITER, Subjects
from core.plan import Committed
from infra import assets, bus, claims, metrics, snapshot_install, storage
from infra import log as eventlog
from infra.approvals import Approvals, ensure_stream
from infra.blobs import Blobs
from infra.bridges import Bridges
from infra.compaction import with_manifests
from infra.offload import Offload
from infra.runtime import Auditor, Running, Settings, start_service
from infra.secret_registry import secrets_from_env
from infra.store import Store
from services.writer.append import Appender, Group
from services.writer.config import WriterConfig
from services.writer.deps import Backlog, Deps
from services.writer.handlers import command_handler
from services.writer.partitions import Partitions
from services.writer.workspace import WorkspaceActor

log = logging.getLogger("quill.writer")

CATCH_UP_EVENTS = 100_000
"""The most events a writer applies at start to trust its projection (``_complete_projection``):
a few seconds at most; a projection further behind is not trusted (each load asks the log)."""


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
        self.appender = Appender(nc, self._on_commit)
        self.bridges = Bridges(self.js)
        self.max_workspaces = config.max_workspaces
        """Workspaces held in memory at most (``--max-workspaces``), but busy ones."""
        self._actors: OrderedDict[tuple[str, str], WorkspaceActor] = OrderedDict()
        self._subs: list[Subscription] = []
        self._usage: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        """Background work (``_resume_approvals``)."""
        partitions = config.partitions
        self.partitions: Partitions | None = (
            Partitions(
                self.js,
                self.subjects,
                self.instance,
                settings.replicas,
                partitions,
                config.lease_ttl,
                self._serve_partition,
                self,
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
        )
        """What every workspace actor and the command entry are given."""
        self._gauges = metrics.Sources()

    @property
    def queued(self) -> int:
        """Commands accepted and not yet answered (bounded by ``deps.backlog.limit``)."""
        return self.deps.backlog.queued

    def actor(self, tenant: str, workspace: str, partition: int | None = None) -> WorkspaceActor:
        key = (tenant, workspace)
        actor = self._actors.get(key)
        if actor is None:
            actor = self._actors[key] = WorkspaceActor(self.deps, tenant, workspace, partition)
            self._evict(key)
        else:
            self._actors.move_to_end(key)
        return actor

    def _evict(self, keep: tuple[str, str]) -> None:
        """Drop the least recently used idle workspaces past ``max_workspaces`` (their state
        and results are in the projection: a later command loads them again). One with
        commands queued, parked or in flight stays, over the budget if it must, and so does
        ``keep`` (the one being used). Oldest first, stopping as soon as enough are found:
        before, each new workspace copied the whole map (a third of the writer's CPU when
        every command was a cold one)."""
        excess = len(self._actors) - self.max_workspaces
        if excess <= 0:
            return
        victims = []
        for old_key, old in self._actors.items():
            if old.idle and old_key != keep:
                victims.append(old_key)
                if len(victims) == excess:
                    break
        for old_key in victims:
            del self._actors[old_key]

    async def _on_commit(self, committed: list[tuple[Group, list[int]]]) -> None:
        """Bring the projection up to what the log acknowledged. If that fails, the actors
        concerned drop their state and catch up from the log when next used."""
        batch = [
            Committed(event, digest, seq, self.deps.manifests.pop(event.manifest, None))
            if isinstance(event, HistoryCompacted)
            else Committed(event, digest, seq)
            for group, seqs in committed
            for (event, digest), seq in zip(group.context, seqs, strict=True)
        ]
        try:
            await self.store.apply(batch)
        except Exception:
            self.deps.projection.complete = False  # loads ask the log again
            for item in batch:
                actor = self._actors.get((item.event.tenant, item.event.workspace))
                if actor is not None:
                    actor.state = None
            raise

    def _deepest(self) -> int:
        """The most commands one workspace has waiting (read on scrape, from another thread:
        the actors are copied first)."""
        return max((a.depth for a in tuple(self._actors.values())), default=0)

    def info(self) -> dict[str, Any]:
        return {
            "workspaces": len(self._actors),
            "budget": self.max_workspaces,
            "queued": self.queued,
            "queued_bytes": self.deps.backlog.bytes,
            "waiting": sum(a.waiting for a in self._actors.values()),
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

    # ------------------------------------------------------------------ partitions
    async def _serve_partition(self, partition: int) -> Subscription:
        subject = self.subjects.cmd_partition(partition)
        handler = command_handler(self.deps, self.actor, partition)
        sub = await bus.serve(self.nc, subject, QUEUE_WRITER, handler)
        self._background(self._resume_approvals(partition))  # a takeover: what was left
        return sub

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resume_approvals(self, partition: int | None = None) -> None:
        """Load each workspace (of ``partition``, or all) with a request kept in
        ``WS_APPROVALS`` and no outcome: the load carries out those approved (the writer that
        decided them stopped first: ``WorkspaceActor._resume_approved``). One at a time, in
        the background: a writer serves while it looks."""
        try:
            unfinished = await self.deps.approvals.unfinished()
        except Exception as exc:
            log.warning("approvals left unfinished not looked for: %r", exc)
            return
        count = self.partitions.count if self.partitions is not None else 0
        for tenant, workspace in sorted(unfinished):
            mine = partition is None or Subjects.partition_of(tenant, workspace, count) == partition
            if not mine:
                continue
            try:
                actor = self.actor(tenant, workspace, partition)
                actor.resume()
                await actor.wait_idle()
            except Exception as exc:  # its next load looks again
                log.warning("%s/%s: approvals not resumed: %r", tenant, workspace, exc)

    def _of(self, partition: int) -> list[tuple[tuple[str, str], WorkspaceActor]]:
        return [(k, a) for k, a in self._actors.items() if a.partition == partition]

    def forget_partition(self, partition: int) -> None:
        """The partition was just taken: whatever was known of its workspaces is stale."""
        for key, actor in self._of(partition):
            actor.state = None
            if actor.idle:
                del self._actors[key]

    async def drain_partition(self, partition: int, grace_s: float) -> None:
        """Let the partition's commands in flight finish (the lease still holds)."""
        busy = [a.wait_idle() for _, a in self._of(partition) if not a.idle]
        if busy:
            try:
                await asyncio.wait_for(asyncio.gather(*busy), grace_s)
            except TimeoutError:
                log.warning("partition %d: commands in flight after %.1fs", partition, grace_s)

    async def drop_partition(self, partition: int) -> None:
        """The partition is another writer's now: answer what waits here (retriable)."""
        for key, actor in self._of(partition):
            actor.state = None
            await actor.abandon()
            if actor.idle:
                del self._actors[key]

    async def start(self) -> None:
        self.deps.offload.warm()
        await self.bridges.start()
        self.appender.start()
        replicas = self.settings.replicas
        await assets.patiently(
            "creating WS_APPROVALS", lambda: ensure_stream(self.js, self.subjects, replicas)
        )
        self._usage = asyncio.create_task(storage.poll_log_usage(self.js))
        self._gauges.add(metrics.WRITER_QUEUE_DEPTH, lambda: self.queued)
        self._gauges.add(metrics.WRITER_QUEUE_DEPTH_MAX, self._deepest)
        self._gauges.add(metrics.WRITER_WORKSPACES, lambda: len(self._actors))
        if self.partitions is not None:
            await self.partitions.start()
            serving = f"{self.partitions.count} partitions ({len(self.partitions.held)} held)"
        else:
            await self._complete_projection()
            handler = command_handler(self.deps, self.actor)
            self._subs.append(
                await bus.serve(self.nc, self.subjects.all_cmd, QUEUE_WRITER, handler)
            )
            serving = self.subjects.all_cmd
            self._background(self._resume_approvals())
        self._subs += await bus.serve_ping(
            self.nc, self.subjects, "writer", self.instance, self.info
        )
        self._subs += await claims.serve(
            self.nc, self.subjects, self.bridges, "writer", self.instance, registrar=True
        )
        await self.nc.flush()
        log.info("writer %s serving %s", self.instance, serving)

    async def _complete_projection(self) -> None:
        """A writer that serves every workspace (no partitions) makes sure, once, before it
        serves, that its projection holds the whole log of each workspace it has a row of:
        it applies the events after the newest it holds (what a crash kept it from applying,
        or a tool appended), at most ``CATCH_UP_EVENTS`` of them. Then its loads trust the
        projection (``deps.Completeness``). A projection further behind (new, or from an old
        snapshot), or one this fails for, is not trusted: each load asks the log, as a
        writer of a cluster's partitions always does."""
        try:
            high = await self.store.high_water()
            # no rows (high 0): nothing to check, every load asks the log anyway
            last = await eventlog.stream_last_seq(self.js) if high else 0
            if last - high > CATCH_UP_EVENTS:
                log.info("projection %d events behind the log: each load asks the log", last - high)
                return
            applied = 0
            every = self.subjects.evt("*", "*")
            await self.store.bulk(True)
            try:
                async for chunk in eventlog.chunks(self.js, every, high, last):
                    held = [
                        item
                        for item in chunk
                        if self.store.workspace(item.event.tenant, item.event.workspace) is not None
                    ]
                    if held:
                        held = await with_manifests(held, self.deps.manifest_blobs)
                        await self.store.apply(held)
                        applied += len(held)
            finally:
                await self.store.bulk(False)
        except Exception as exc:
            log.warning("projection not checked against the log (%r): each load asks it", exc)
            return
        self.deps.projection.complete = True
        if applied:
            log.info("projection: applied %d events it missed", applied)

    async def stop(self, grace_s: float = 10.0) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.partitions is not None:
            await self.partitions.stop(grace_s)
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        for actor in self._actors.values():
            await actor.abandon()
        busy = [a.wait_idle() for a in self._actors.values() if not a.idle]
        if busy:
            try:
                await asyncio.wait_for(asyncio.gather(*busy), grace_s)
            except TimeoutError:
                log.warning("stopping with commands still in flight")
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
