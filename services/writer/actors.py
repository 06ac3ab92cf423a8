"""The writer's workspace actors: one per workspace it holds, made by a command's first use,
evicted least recently used past ``max_workspaces`` (but busy ones), let go of when the
projection missed their events or their partition moved.

It is the entry's way to a workspace's queue (``take``: the writer's and the workspace's
bounds, ``deps.Backlog``), what the applier tells when an apply failed (``stale``), and what
the partitions tell as they come and go (their ``Holder``). ``app.py`` builds one and hands it
to each of them: none climbs back to ``app.py``, and none reaches into an actor
(``WorkspaceActor.forget`` lets a state go).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterable

from contracts.limits import RETRY_AFTER_MS
from contracts.subjects import Subjects
from infra.busy import refused
from services.writer.deps import Deps
from services.writer.workspace import Pending, WorkspaceActor

log = logging.getLogger("quill.writer")

Key = tuple[str, str]
"""(tenant, workspace)."""


class Actors:
    """The workspaces this writer holds in memory (see the module docstring)."""

    def __init__(self, deps: Deps, max_workspaces: int) -> None:
        self.deps = deps
        self.max_workspaces = max_workspaces
        """Workspaces held in memory at most (``--max-workspaces``), but busy ones."""
        self._held: OrderedDict[Key, WorkspaceActor] = OrderedDict()
        """Least recently used first."""
        self._tasks: set[asyncio.Task[None]] = set()
        """Background work (``resume``)."""

    def __len__(self) -> int:
        return len(self._held)

    @property
    def waiting(self) -> int:
        """Commands parked until a lock goes (or an approval comes), all workspaces."""
        return sum(a.waiting for a in self._held.values())

    def deepest(self) -> int:
        """The most commands one workspace has waiting (read on scrape, from another thread:
        the actors are copied first)."""
        return max((a.depth for a in tuple(self._held.values())), default=0)

    # ------------------------------------------------------------------ the entry's
    def take(self, pending: Pending, partition: int | None = None) -> None:
        """Queue ``pending`` on its workspace's actor, counted in the backlog (a copy of a
        request already queued joins it, uncounted). The entry's one call per command, in
        the subscription's task: no more than that (``get``'s lookup is inline).

        Raises:
            QuillError: busy (``UNAVAILABLE``): the writer holds as many commands or bytes as
                it may (queue ``commands``, ``command_bytes``), the workspace as many commands
                (``workspace_commands``), or the request as many copies.
        """
        backlog, size = self.deps.backlog, len(pending.msg.data)
        if backlog.queued >= backlog.limit:
            raise refused("writer", "commands", "The writer", RETRY_AFTER_MS, limit=backlog.limit)
        if backlog.queued and backlog.bytes + size > backlog.max_bytes:  # one always fits
            what, limit = "The writer", backlog.max_bytes
            raise refused("writer", "command_bytes", what, RETRY_AFTER_MS, limit=limit)
        address = pending.address
        key = (address.tenant, address.workspace)
        actor = self._held.get(key)
        if actor is None:
            actor = self._new(key, partition)
        else:
            self._held.move_to_end(key)
        if actor.queued - actor.waiting >= backlog.per_workspace:  # waiters: apart
            what = f"Workspace {address.tenant}/{address.workspace}"
            limit = backlog.per_workspace
            raise refused("writer", "workspace_commands", what, RETRY_AFTER_MS, limit=limit)
        if actor.submit(pending):
            backlog.queued += 1
            backlog.bytes += size

    def get(self, tenant: str, workspace: str, partition: int | None = None) -> WorkspaceActor:
        """The workspace's actor, made (and the least recently used idle ones evicted) if
        the writer holds none."""
        key = (tenant, workspace)
        actor = self._held.get(key)
        if actor is None:
            return self._new(key, partition)
        self._held.move_to_end(key)
        return actor

    def _new(self, key: Key, partition: int | None) -> WorkspaceActor:
        actor = self._held[key] = WorkspaceActor(self.deps, *key, partition)
        self._evict(key)
        return actor

    def _evict(self, keep: Key) -> None:
        """Drop the least recently used idle workspaces past ``max_workspaces`` (their state
        and results are in the projection: a later command loads them again). One with
        commands queued, parked or in flight stays, over the budget if it must, and so does
        ``keep`` (the one being used). Oldest first, stopping as soon as enough are found:
        before, each new workspace copied the whole map (a third of the writer's CPU when
        every command was a cold one)."""
        excess = len(self._held) - self.max_workspaces
        if excess <= 0:
            return
        victims = []
        for old_key, old in self._held.items():
            if old.idle and old_key != keep:
                victims.append(old_key)
                if len(victims) == excess:
                    break
        for old_key in victims:
            del self._held[old_key]

    # ------------------------------------------------------------------ the applier's
    def stale(self, keys: Iterable[Key]) -> None:
        """The projection missed these workspaces' events: their actors let their state go
        and catch up from the log when next used."""
        for key in set(keys):
            actor = self._held.get(key)
            if actor is not None:
                actor.forget()

    # ------------------------------------------------------------------ the partitions'
    def _of(self, partition: int) -> list[tuple[Key, WorkspaceActor]]:
        return [(k, a) for k, a in self._held.items() if a.partition == partition]

    def forget_partition(self, partition: int) -> None:
        """The partition was just taken: whatever was known of its workspaces is stale."""
        for key, actor in self._of(partition):
            actor.forget()
            if actor.idle:
                del self._held[key]

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
            actor.forget()
            await actor.abandon()
            if actor.idle:
                del self._held[key]

    # ------------------------------------------------------------------ approvals
    def resume(self, partition: int | None = None) -> None:
        """In the background: load each workspace (of ``partition``, or all) with a request
        kept in ``WS_APPROVALS`` and no outcome; the load carries out those approved (the
        writer that decided them stopped first: ``WorkspaceActor._resume_approved``). One at
        a time: a writer serves while it looks."""
        task = asyncio.create_task(self._resume(partition))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resume(self, partition: int | None) -> None:
        try:
            unfinished = await self.deps.approvals.unfinished()
        except Exception as exc:
            log.warning("approvals left unfinished not looked for: %r", exc)
            return
        partitions = self.deps.partitions
        count = partitions.count if partitions is not None else 0
        for tenant, workspace in sorted(unfinished):
            mine = partition is None or Subjects.partition_of(tenant, workspace, count) == partition
            if not mine:
                continue
            try:
                actor = self.get(tenant, workspace, partition)
                actor.resume()
                await actor.wait_idle()
            except Exception as exc:  # its next load looks again
                log.warning("%s/%s: approvals not resumed: %r", tenant, workspace, exc)

    # ------------------------------------------------------------------ stopping
    async def quiet(self) -> None:
        """Stop looking for approvals to resume."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self, grace_s: float) -> None:
        """Answer what is parked (retriable), and let the commands in flight finish."""
        for actor in self._held.values():
            await actor.abandon()
        busy = [a.wait_idle() for a in self._held.values() if not a.idle]
        if busy:
            try:
                await asyncio.wait_for(asyncio.gather(*busy), grace_s)
            except TimeoutError:
                log.warning("stopping with commands still in flight")
