"""What the writer reads for a fork (issue 33): the source at the version asked, and, before a
purge, the workspaces forked from it; and the record of forks every writer shares (WS_FORKS,
``infra/fork_registry.py``): a fork registers on its source before its event is appended, a
purge marks its workspace only while no fork stands on it.

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

import logging
from collections.abc import Sequence

import nats.errors

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import TrustChanged, WorkspaceEvent, WorkspaceForked, WorkspacePurged
from core.decision import ForkSource
from infra import log as eventlog
from infra.compaction import with_manifests
from infra.fork_registry import unreachable
from services.writer.pending import Site

log = logging.getLogger("quill.writer")


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


async def register(site: Site, event: WorkspaceForked) -> None:
    """Register the fork ``event`` makes on its source's record (before it is appended), then
    check the source's log still holds what the fork read: a purge of the source that
    committed before the registration (its mark cleared already) is seen there.

    Raises:
        QuillError: ``CONFLICT`` (the source is being purged or scrubbed: retry),
            ``WORKSPACE_NOT_FOUND`` (it was purged meanwhile), ``UNAVAILABLE``.
    """
    deps, tenant, source = site.deps, site.tenant, event.source
    await deps.registry.add_fork(tenant, source, site.workspace)
    try:
        gone = await _source_gone(site, source)
    except (TimeoutError, nats.errors.Error, eventlog.CorruptEvent) as exc:
        await unregister(site, event)
        raise unreachable(exc) from None
    if gone:
        await unregister(site, event)
        raise QuillError(
            ErrorCode.WORKSPACE_NOT_FOUND,
            f"Workspace {tenant}/{source} was purged while it was being forked",
            {"source": source},
        )


async def _source_gone(site: Site, source: str) -> bool:
    """Whether the source's log lost what this writer's projection read of it (a purge, a
    purge and a creation again): its last event is a purge, or its first is past the last
    the projection holds."""
    deps = site.deps
    row = deps.store.workspace(site.tenant, source)
    if row is None:
        return True
    subject = deps.subjects.evt(site.tenant, source)
    raw = await eventlog.last_message(deps.js, subject, fresh=True)
    if raw is None or isinstance(eventlog.stored(raw).event, WorkspacePurged):
        return True
    first = await eventlog.first(deps.js, subject, int(raw.seq or 0))
    return first is None or first.seq > row.last_seq


async def unregister(site: Site, event: WorkspaceForked, *, unless_appended: bool = False) -> None:
    """Take the fork back off its source's record (best effort: a stale entry is dropped by
    the next purge, ``fork_registry``). ``unless_appended``: after a failed append, only when
    the fork's log does not hold its event (an append that failed uncertainly may be in)."""
    deps = site.deps
    try:
        if unless_appended and await eventlog.last_seq(deps.js, site.subject, fresh=True):
            return
        await deps.registry.drop_fork(site.tenant, event.source, site.workspace)
    except (QuillError, TimeoutError, nats.errors.Error) as exc:
        log.warning("%s/%s: could not unregister the fork: %r", site.tenant, site.workspace, exc)


async def mark_purge(site: Site) -> None:
    """Mark the workspace as being purged on the shared record, when no fork stands on it
    (whichever writer forked it).

    Raises:
        QuillError: ``CONFLICT`` naming the forks, or while it is being scrubbed.
    """
    await site.deps.registry.mark(site.tenant, site.workspace, "purging")


async def purge_over(site: Site, fork_of: str | None, committed: bool) -> None:
    """After a purge: clear its mark (committed or refused for good); a fork's purge, once
    committed, also takes the fork off its source's record (best effort: a stale mark runs
    out, a stale entry is dropped by the next purge of the source)."""
    registry, tenant = site.deps.registry, site.tenant
    try:
        await registry.release(tenant, site.workspace, "purging")
        if committed and fork_of is not None:
            await registry.drop_fork(tenant, fork_of, site.workspace)
    except (QuillError, TimeoutError, nats.errors.Error) as exc:
        log.warning("%s/%s: fork record after the purge: %r", tenant, site.workspace, exc)


async def recorded(
    site: Site, event: WorkspaceEvent, lineage: Sequence[tuple[str, int]]
) -> str | None:
    """Before ``event`` is appended: a fork goes on its source's record, a purge marks the
    workspace (refused while a fork stands on it). The source of the workspace purged, if it
    is a fork (``lineage``: the workspace's layers); else None."""
    if isinstance(event, WorkspaceForked):
        await register(site, event)
    elif isinstance(event, WorkspacePurged):
        await mark_purge(site)
        return lineage[0][0] if lineage else None
    return None


async def not_appended(site: Site, events: list[WorkspaceEvent]) -> None:
    """A fork or a purge whose append failed comes off the record (WS_FORKS); decided again,
    it registers or marks again."""
    for event in events:
        if isinstance(event, WorkspaceForked):
            await unregister(site, event, unless_appended=True)
        elif isinstance(event, WorkspacePurged):
            await purge_over(site, None, committed=False)


async def landed(site: Site, events: list[WorkspaceEvent], fork_of: str | None) -> None:
    """After an append: a purge committed clears its mark (and a fork's, its entry)."""
    if any(isinstance(event, WorkspacePurged) for event in events):
        await purge_over(site, fork_of, committed=True)
