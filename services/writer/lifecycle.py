"""A workspace's state loaded into its actor, and what follows a purge or a re-creation.

``load`` reads the state from the projection and catches it up from the log (a writer that
crashed, or one taking over a workspace, starts from the truth), under the fence of the
workspace's partition (``current_fence``); a purge that was not finished is finished then.
``after_lifecycle`` carries out a purge once it is in the log (contents, events before it,
kept output) and, after a workspace is created again, purges the purge event before it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

from contracts.errors import ErrorCode, QuillError
from contracts.events import WorkspaceCreated, WorkspaceEvent, WorkspaceForked, WorkspacePurged
from contracts.limits import WRITER_RECENT_RESULTS
from contracts.subjects import STREAM_EVENTS, STREAM_OUTPUT
from core.evolve import WorkspaceState, evolve
from infra import blobs
from infra import log as eventlog
from infra.compaction import with_manifests
from services.writer.partitions import Fence
from services.writer.pending import Site

log = logging.getLogger("quill.writer")
_T = TypeVar("_T")


async def load(
    site: Site, fence: Fence | None, trust: bool
) -> tuple[WorkspaceState, list[tuple[str, int, bytes]], bool]:
    """The state, loaded from the projection and caught up from the log if needed, its
    recent results, and whether it is usable (False: a purge could not be finished; the
    next load tries again). ``trust``: unless False (after an append refused on a stale
    state), a projection that holds the whole log (``deps.Completeness``) is not checked
    against it."""
    deps, tenant, workspace = site.deps, site.tenant, site.workspace
    await deps.appender.applied(site.subject)  # the projection holds all we committed
    store, js = deps.store, deps.js
    if (
        trust
        and deps.projection.complete
        and fence is None
        and store.workspace(tenant, workspace) is not None
    ):  # the projection has all of it (deps.Completeness): the log is not asked
        state, recent = await store.load(tenant, workspace, WRITER_RECENT_RESULTS)
        last = state.last_seq
    else:  # the projection's state and results and the log's last sequence, at once
        (state, recent), last = await asyncio.gather(
            store.load(tenant, workspace, WRITER_RECENT_RESULTS),
            unavailable_if_failing(eventlog.last_seq(js, site.subject, fresh=fence is not None)),
        )
    if last > state.last_seq:
        state = await unavailable_if_failing(catch_up(site, state, last))
        recent = await store.recent_results(tenant, workspace, WRITER_RECENT_RESULTS)
    finished = True
    if not state.exists and state.last_seq and await unfinished_purge(site, state.last_seq):
        log.info("%s/%s: finishing its purge", tenant, workspace)
        finished = await finish_purge(site, state.last_seq)
    return state, recent, finished


async def unavailable_if_failing(reading: Awaitable[_T]) -> _T:
    """``reading`` (of the log), its failure as ``UNAVAILABLE``."""
    try:
        return await reading
    except QuillError:
        raise
    except (TimeoutError, nats.errors.Error, eventlog.CorruptEvent) as exc:
        raise QuillError(ErrorCode.UNAVAILABLE, f"The log is not reachable: {exc!r}") from None


async def catch_up(site: Site, state: WorkspaceState, last: int) -> WorkspaceState:
    """``state`` with the log's events after it up to ``last``, applied to the projection
    and folded a chunk at a time (a workspace of a million events loads in bounded
    memory; a compaction's manifest, when it rebuilds the state, is in its item)."""
    store, js = site.deps.store, site.deps.js
    caught = 0
    async for chunk in eventlog.chunks(js, site.subject, state.last_seq, last):
        chunk = await with_manifests(chunk, site.deps.manifest_blobs)
        await store.apply(chunk)
        caught += len(chunk)
        for item in chunk:
            evolve(state, item.event, item.hash, item.seq, manifest=item.manifest)
    if caught:
        log.info("%s/%s: caught up %d events", site.tenant, site.workspace, caught)
    return state


def current_fence(site: Site, partition: int | None) -> Fence | None:
    """The epoch of the workspace's ``partition`` while this writer holds it.

    Raises:
        QuillError: ``UNAVAILABLE`` when the partition is (now) another writer's.
    """
    partitions = site.deps.partitions
    if partitions is None or partition is None:
        return None
    fence = partitions.fence(partition)
    if fence is None:
        raise QuillError(
            ErrorCode.UNAVAILABLE,
            f"Partition {partition} moved to another writer; retry",
            {"partition": partition},
        )
    return fence


async def fenced_out(site: Site, partition: int | None, fence: Fence | None) -> bool:
    """After a refused append: whether the partition's epoch moved on (lost to another
    writer, which now owns the workspace)."""
    partitions = site.deps.partitions
    if partitions is None or partition is None or fence is None:
        return False
    return not await partitions.still_holds(partition, fence)


async def after_lifecycle(
    site: Site,
    committed: list[tuple[WorkspaceEvent, int]],
    *,
    had_log: bool,
    purged: Callable[[], None],
) -> bool:
    """After a purge is in the log (``purged`` is called first: the actor forgets what it
    knew of the workspace): delete the workspace's contents from WS_BLOBS, then its events
    before the purge (which stays, to tell every replica and executor), and its kept command
    output; say so on ``ws.purged``. After a workspace is created again: purge the purge
    event before it. Both idempotent: the events before a purge say it is not finished, and
    a writer that fails here (False: the state is to be dropped) or crashed finishes it when
    it next loads the workspace (``load``)."""
    finished = True
    for event, seq in committed:
        if isinstance(event, WorkspacePurged):
            purged()
            if await finish_purge(site, seq):
                log.info("%s/%s purged (was at v%d)", site.tenant, site.workspace,
                         event.version - 1)  # fmt: skip
            else:
                finished = False
        elif isinstance(event, WorkspaceCreated | WorkspaceForked) and had_log:
            try:
                await site.deps.js.purge_stream(STREAM_EVENTS, subject=site.subject, seq=seq)
            except Exception as exc:
                log.warning("%s/%s: purging the log failed: %s", site.tenant,
                            site.workspace, exc)  # fmt: skip
    return finished


async def finish_purge(site: Site, seq: int) -> bool:
    """Carry out the purge at log sequence ``seq``; False if something failed (the next
    load of the workspace tries again)."""
    deps, tenant, workspace = site.deps, site.tenant, site.workspace
    try:
        gone = await blobs.purge(deps.js, tenant, workspace)
        await deps.js.purge_stream(STREAM_EVENTS, subject=site.subject, seq=seq)
        await purge_output(site)
        await deps.approvals.purge(tenant, workspace)
        await deps.nc.publish(deps.subjects.purged(tenant, workspace))
    except Exception as exc:
        log.warning("%s/%s: purging failed: %s", tenant, workspace, exc)
        return False
    if gone:
        log.info("%s/%s: %d contents deleted from WS_BLOBS", tenant, workspace,
                 gone)  # fmt: skip
    return True


async def unfinished_purge(site: Site, last_seq: int) -> bool:
    """Whether the log still holds events before the purge at ``last_seq`` (the last
    event of a workspace that does not exist is its purge): a purge not finished."""
    try:
        first = await site.deps.js.get_msg(STREAM_EVENTS, seq=1, next=True, subject=site.subject)
    except (TimeoutError, nats.errors.Error) as exc:  # NotFoundError: an empty log
        if not isinstance(exc, nats.js.errors.NotFoundError):
            log.warning("%s/%s: reading the log: %r", site.tenant, site.workspace, exc)
        return False
    return int(first.seq or last_seq) < last_seq


async def purge_output(site: Site) -> None:
    """Delete the workspace's kept command output (``STREAM_OUTPUT``)."""
    subject = site.deps.subjects.workspace_cmdout(site.tenant, site.workspace)
    try:
        await site.deps.js.purge_stream(STREAM_OUTPUT, subject=subject)
    except nats.js.errors.NotFoundError:
        pass  # no executor ever kept output here
