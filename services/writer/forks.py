"""What the writer reads for a fork (issue 33): the source at the version asked, and, before a
purge, the workspaces forked from it.

Both come from the writer's projection. With ``quill up`` it holds every workspace this
writer committed; on a cluster a writer serves a partition of the workspaces, and its
projection holds another partition's only as far as it once loaded it, and a log appended
by a tool (``quill import``) is in no writer's projection: so the source's last sequence is
asked of the log (one direct get), and the events the projection lacks are applied to it
first (as a takeover's catch-up does): the fork's writer reads the same source as its owner. The
fork then reads its layers from that projection for good: the rows up to the fork point
never change (a source with forks is neither purged nor compacted).
"""

from __future__ import annotations

import nats.errors

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import TrustChanged, WorkspaceForked
from core.decision import ForkSource
from infra import log as eventlog
from infra.compaction import with_manifests
from services.writer.pending import Site


async def source(site: Site, cmd: rq.ForkWorkspace) -> ForkSource:
    """``cmd.source`` as the projection holds it, caught up with the log first on a cluster."""
    deps, tenant = site.deps, site.tenant
    await deps.appender.applied()  # what this writer committed is projected
    # and what others appended (another writer's partition, ``quill import``): one look
    try:
        await _caught_up(site, cmd.source)
    except (TimeoutError, nats.errors.Error, eventlog.CorruptEvent) as exc:
        raise QuillError(ErrorCode.UNAVAILABLE, f"The log is not reachable: {exc!r}") from None
    store = deps.store
    row = store.workspace(tenant, cmd.source)
    if row is None:
        return ForkSource(cmd.source, False, 0, 0, 0, None, None)
    at = cmd.version or row.version
    point = await store.fork_point(row.id, at) if at <= row.version else None
    commands = False
    raw = await store.trust_event(row.id)
    if raw is not None:
        event = codec.decode_event(raw)
        if isinstance(event, TrustChanged | WorkspaceForked):
            commands = event.commands
    return ForkSource(
        name=cmd.source,
        exists=True,
        version=row.version,
        floor=row.floor,
        at=at,
        hash_at=point[0] if point else None,
        tree_hash_at=point[1] if point else None,
        lineage=row.lineage,
        trust=row.trust,
        limits=row.limits,
        commands=commands,
    )


async def _caught_up(site: Site, name: str) -> None:
    """Apply to the projection the source's events it lacks (another writer's workspace)."""
    deps = site.deps
    subject = deps.subjects.evt(site.tenant, name)
    row = deps.store.workspace(site.tenant, name)
    have = row.last_seq if row is not None else 0
    last = await eventlog.last_seq(deps.js, subject, fresh=True)
    if last <= have:
        return
    async for chunk in eventlog.chunks(deps.js, subject, have, last):
        await deps.store.apply(await with_manifests(chunk, deps.manifest_blobs))


caught_up = _caught_up
"""Bring another workspace of the tenant up to the log here (a merge's other side too)."""


async def forks(site: Site) -> list[str]:
    """The workspaces forked from this one, as the projection holds them."""
    await site.deps.appender.applied()
    found = await site.deps.store.forks_of(site.tenant, site.workspace, "", 101)
    return [name for name, _, _ in found]
