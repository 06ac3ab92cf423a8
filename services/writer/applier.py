"""The writer's projection, kept up with the log: what the appender got acknowledged, applied
in commit order (``apply``: the appender hands over whatever committed meanwhile, a few
milliseconds of commits at a time, after the replies went out), and at start what it missed
(``complete``).

If an apply fails, the projection is not trusted any more (``deps.Completeness``: each load
asks the log) and the actors of the workspaces concerned let their state go
(``Actors.stale``): they load it again from the projection and the log, which applies what
the projection missed.
"""

from __future__ import annotations

import logging

from contracts.events import HistoryCompacted
from core.plan import Committed
from infra import log as eventlog
from infra.compaction import with_manifests
from services.writer.actors import Actors
from services.writer.append import Group
from services.writer.deps import Deps

log = logging.getLogger("quill.writer")

CATCH_UP_EVENTS = 100_000
"""The most events a writer applies at start to trust its projection (``complete``): a few
seconds at most; a projection further behind is not trusted (each load asks the log)."""


class Applier:
    """Applies what committed to the writer's projection (see the module docstring)."""

    def __init__(self, deps: Deps, actors: Actors) -> None:
        self.deps, self.actors = deps, actors

    async def apply(self, committed: list[tuple[Group, list[int]]]) -> None:
        """Bring the projection up to what the log acknowledged (``Appender``'s groups and
        their sequences)."""
        manifests = self.deps.manifests
        batch = [
            Committed(event, digest, seq, manifests.pop(event.manifest, None))
            if isinstance(event, HistoryCompacted)
            else Committed(event, digest, seq)
            for group, seqs in committed
            for (event, digest), seq in zip(group.context, seqs, strict=True)
        ]
        try:
            await self.deps.store.apply(batch)
        except Exception:
            self.deps.projection.complete = False  # loads ask the log again
            self.actors.stale((item.event.tenant, item.event.workspace) for item in batch)
            raise

    async def complete(self) -> None:
        """A writer that serves every workspace (no partitions) makes sure, once, before it
        serves, that its projection holds the whole log of each workspace it has a row of:
        it applies the events after the newest it holds (what a crash kept it from applying,
        or a tool appended), at most ``CATCH_UP_EVENTS`` of them. Then its loads trust the
        projection (``deps.Completeness``). A projection further behind (new, or from an old
        snapshot), or one this fails for, is not trusted: each load asks the log, as a
        writer of a cluster's partitions always does."""
        store, js = self.deps.store, self.deps.js
        try:
            high = await store.high_water()
            # no rows (high 0): nothing to check, every load asks the log anyway
            last = await eventlog.stream_last_seq(js) if high else 0
            if last - high > CATCH_UP_EVENTS:
                log.info("projection %d events behind the log: each load asks the log", last - high)
                return
            applied = 0
            every = self.deps.subjects.evt("*", "*")
            await store.bulk(True)
            try:
                async for chunk in eventlog.chunks(js, every, high, last):
                    held = [
                        item
                        for item in chunk
                        if store.workspace(item.event.tenant, item.event.workspace) is not None
                    ]
                    if held:
                        held = await with_manifests(held, self.deps.manifest_blobs)
                        await store.apply(held)
                        applied += len(held)
            finally:
                await store.bulk(False)
        except Exception as exc:
            log.warning("projection not checked against the log (%r): each load asks it", exc)
            return
        self.deps.projection.complete = True
        if applied:
            log.info("projection: applied %d events it missed", applied)
