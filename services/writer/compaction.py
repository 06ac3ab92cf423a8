"""The writer's compaction of a workspace with ``max_versions`` (``infra/compaction.py``).

:class:`Compaction` counts the revisions each commit adds per path and, once a path has
gathered too many (``compaction.due``), the actor runs it when nothing is in flight: a
snapshot of the revisions kept (its manifest, in WS_BLOBS), a ``history_compacted`` event
appended on the state it was decided on, and the log purged before it.

Forks (issue 33). A source is not compacted while it has forks: they read its rows up to
their fork points, which a compaction would drop (``quill_writer_compactions_held_total``
with ``has_forks``, logged; ``qry.info``'s ``compaction`` says why). Those this writer's
projection does not know (made through another writer) are on the fork record: a compaction
marks its workspace ``compacting`` there, only while no fork stands on it, so that none is
made while it runs (``infra/fork_registry.py``). A fork is never
compacted: its log's first event, ``workspace_forked``, is what ties its history to its
source's, and a compaction purges the log before it (and its manifest holds the fork's own
rows, not what it inherited). A fork's history is its own writes: forks are meant to be
merged, then purged.
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import UTC, datetime

from contracts import codec, hashing
from contracts.errors import QuillError
from contracts.events import ChangesCommitted, HistoryCompacted, Remove, WorkspaceEvent
from contracts.subjects import STREAM_EVENTS
from core.evolve import WorkspaceState, evolve
from infra import compaction
from infra.concurrent import bounded_gather
from infra.metrics import WRITER_COMPACTIONS_HELD
from services.writer.append import AppendError, Group
from services.writer.partitions import Fence
from services.writer.pending import Site
from services.writer.results import notify

log = logging.getLogger("quill.writer")


class Compaction:
    """One workspace's revision counts, and its compaction when they call for one."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.counts: dict[str, int] | None = None
        """Revisions kept per path, when the workspace has ``max_versions``."""
        self.due = False
        """A path has gathered too many: compact once nothing is in flight."""

    async def count(self, state: WorkspaceState, events: list[WorkspaceEvent]) -> None:
        """Count the revisions the committed ``events`` add; flag compaction when a path has
        gathered too many (``compaction.due``)."""
        limit = state.limits.max_versions
        if limit is None or state.lineage:  # a fork is never compacted (``held``)
            return
        deps = self.site.deps
        if self.counts is None:
            await deps.appender.applied()
            ws = deps.store.workspace_id(self.site.tenant, self.site.workspace)
            self.counts = await deps.store.revision_counts(ws) if ws is not None else {}
            self.due = any(compaction.due(n, limit) for n in self.counts.values())
            return  # the store counted these events already
        counts = self.counts
        for event in events:
            if not isinstance(event, ChangesCommitted):
                continue
            for change in event.changes:
                if not isinstance(change, Remove):
                    counts[change.path] = n = counts.get(change.path, 0) + 1
                    self.due = self.due or compaction.due(n, limit)

    async def run(self, state: WorkspaceState, fence: Fence | None) -> bool:
        """Snapshot and trim (``infra/compaction.py``): keep the last ``max_versions``
        revisions of each path, purge the log before the snapshot. False when its append
        failed (the state is to be dropped)."""
        limit = state.limits.max_versions
        if limit is None:
            return True
        site, deps = self.site, self.site.deps
        tenant, workspace = site.tenant, site.workspace
        await deps.appender.applied()
        ws = deps.store.workspace_id(tenant, workspace)
        assert ws is not None
        if await deps.store.forks_of(tenant, workspace, "", 1):
            # forks read this history up to their fork points: it is kept whole meanwhile
            log.info("%s/%s: not compacted while it has forks (qry.forks)", tenant, workspace)
            WRITER_COMPACTIONS_HELD.labels("has_forks").inc()
            return True  # asked again when a path over the limit changes again
        try:  # and those another writer made (WS_FORKS): none made while it runs
            await deps.registry.mark(tenant, workspace, "compacting")
        except QuillError as exc:
            why = "has_forks" if "forks" in exc.details else "marked"
            log.info("%s/%s: not compacted now: %s", tenant, workspace, exc.message)
            WRITER_COMPACTIONS_HELD.labels(why).inc()
            return True
        try:
            return await self._compact(state, fence, ws, limit)
        finally:
            with contextlib.suppress(QuillError):  # a mark left runs out (fork_registry)
                await deps.registry.release(tenant, workspace, "compacting")

    async def _compact(
        self, state: WorkspaceState, fence: Fence | None, ws: int, limit: int
    ) -> bool:
        site, deps = self.site, self.site.deps
        tenant, workspace = site.tenant, site.workspace
        started = time.perf_counter()
        manifest, dropped, events_dropped = await deps.store.compaction(ws, limit)
        contents = {r[5] for r in manifest.revisions if r[4] == "f"}

        async def keep(sha: str) -> None:
            data = await deps.store.blob(sha)
            if data is not None:  # None: stored in WS_BLOBS when it was written
                await site.blobs.put(sha, data)

        await bounded_gather([keep(sha) for sha in contents], 32)
        body = compaction.encode_manifest(manifest)
        digest_m = hashing.content_sha256(body)
        await site.blobs.put(digest_m, body)
        event = HistoryCompacted(
            tenant=tenant,
            workspace=workspace,
            version=state.version + 1,
            at=datetime.now(UTC),
            op="compact",
            request_id=f"compact-{state.version + 1}-{digest_m[:16]}",
            actor="quill",
            prev_hash=state.last_hash,
            tree_hash=hashing.tree_hex(state.tree.hash),
            manifest=digest_m,
            manifest_size=len(body),
            floor=manifest.floor,
            max_versions=limit,
            revisions_kept=len(manifest.revisions),
            revisions_dropped=dropped,
            events_dropped=events_dropped,
        )
        payload = codec.encode(event)
        digest = hashing.event_hash(payload)
        deps.manifests[digest_m] = manifest
        group = Group(
            subject=site.subject,
            expected_seq=state.last_seq,
            payloads=[payload],
            msg_ids=[deps.subjects.msg_id(tenant, workspace, event.request_id)],
            hashes=[digest],
            context=[(event, digest)],
            fence=fence,
        )
        try:
            (seq,) = await deps.appender.submit(group)
        except AppendError as exc:
            deps.manifests.pop(digest_m, None)
            log.warning("%s/%s: compaction not appended (%s)", tenant, workspace, exc)
            return False
        evolve(state, event, digest, seq)
        await deps.appender.applied()
        try:
            await deps.js.purge_stream(STREAM_EVENTS, subject=site.subject, seq=seq)
        except Exception as exc:  # the next compaction purges what this one could not
            log.warning("%s/%s: purging the log failed: %s", tenant, workspace, exc)
        self.counts = {path: min(n, limit) for path, n in (self.counts or {}).items()}
        log.info(
            "%s/%s: compacted at v%d: %d revisions kept, %d dropped, floor v%d (%.0f ms)",
            tenant,
            workspace,
            event.version,
            len(manifest.revisions),
            dropped,
            manifest.floor,
            (time.perf_counter() - started) * 1000,
        )
        await notify(deps, event, [], seq)
        return True
