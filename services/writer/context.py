"""What deciding a command of a workspace needs, gathered before and while it is decided.

The contents it reads (from the writer's cache, else the workspace's own namespace of
WS_BLOBS), the history and past it restores from (the projection), the expensive steps it asks
for (computed in a worker, as its tenant's: ``infra/offload.py``), and, once decided, its
large contents moved out of the event into WS_BLOBS. The deciding itself is
``WorkspaceActor._decide`` (``core.decide``), which ``with_work`` is handed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import AnyChange, PutFile
from core.decide import needs
from core.decision import Context, Expensive, Needs
from core.diffs import Pair, unified_many
from core.evolve import WorkspaceState
from core.tree import Tree, place
from infra import compaction
from infra.blobs import INLINE_BUDGET, INLINE_MAX
from infra.concurrent import bounded_gather
from infra.offload import CLIENT_DEADLINE, client_deadline
from services.writer import forks, merges
from services.writer.pending import Pending, Site
from services.writer.preview import PREVIEW_BUDGET_S

_T = TypeVar("_T")

MAX_STEPS = 8
"""Expensive steps one decision may ask for (``with_work``; an edit or a modify asks one)."""


async def context(site: Site, state: WorkspaceState, p: Pending) -> Context:
    """What deciding ``p`` needs: the contents it reads, the past it restores from."""
    deps = site.deps
    wanted = needs(state, p.request)
    if wanted.history or wanted.changes_below:
        await history(site, state, wanted)
    foreign = None
    if isinstance(p.request, rq.ApplyChanges):  # contents named by sha256
        foreign = await resolve_blobs(site, p.request, wanted.contents)
    for sha in wanted.contents if foreign is None else []:
        if sha not in deps.contents:
            await deps.appender.applied()  # inline contents reach the store on apply
            try:
                deps.contents.put(sha, await site.blobs.get(sha))
            except QuillError as exc:
                if exc.code != ErrorCode.UNAVAILABLE:
                    raise
                # decide says what is missing (a blob an apply names, a file's content)
    fork = await forks.source(site, p.request) if isinstance(p.request, rq.ForkWorkspace) else None
    named = await forks.forks(site) if isinstance(p.request, rq.PurgeWorkspace) else None
    merge = None
    if isinstance(p.request, rq.MergeWorkspace):
        merge = await merges.source(site, state, p.request)
    was = await past(site, *wanted.past) if wanted.past is not None else None
    if was is not None:  # the history of the files it brings back
        more = needs(state, p.request, was)
        if more.history or more.changes_below:
            await history(site, state, more)
    return Context(
        version=state.version + 1,
        at=datetime.now(UTC),
        content=_without(deps.contents.get, foreign) if foreign else deps.contents.get,
        past=was,
        origin=p.origin,
        locate=deps.bridges.find,
        secrets=deps.secrets,
        computed=[],
        fork=fork,
        forks=named,
        merge=merge,
    )


async def history(site: Site, state: WorkspaceState, wanted: Needs) -> None:
    """The history ``wanted`` names (it names some), from the projection
    (``Store.look_up``)."""
    ws = site.deps.store.workspace_id(site.tenant, site.workspace)
    await site.deps.store.look_up(state.tree, ws, wanted)


async def resolve_blobs(site: Site, request: rq.ApplyChanges, wanted: list[str]) -> set[str]:
    """Bring the contents an ``apply`` names by sha256 (``blob``) into ``deps.contents``
    from this workspace's own namespace of WS_BLOBS (32 at once); return those it does
    not hold: they resolve to nothing, whoever else holds them (what the writer has
    cached or projected of other workspaces included)."""
    contents, shas = site.deps.contents, list(dict.fromkeys(wanted))
    if any(sha not in contents for sha in shas):
        await site.deps.appender.applied()  # inline contents reach the store on apply

    async def held(sha: str) -> bool:
        if sha in contents:
            return await site.blobs.has(sha)
        data = await site.blobs.own(sha)
        if data is not None:
            contents.put(sha, data)
        return data is not None

    found = await bounded_gather([held(sha) for sha in shas], 32)
    return {sha for sha, ok in zip(shas, found, strict=True) if not ok}


async def past(site: Site, version: int, scope: str) -> Tree:
    """The workspace (``scope`` and below) as it was at ``version``, from the projection."""
    store = site.deps.store
    await site.deps.appender.applied()
    tree = Tree()
    ws = store.workspace_id(site.tenant, site.workspace)
    if ws is None:
        return tree
    nodes = await store.entries_at(ws, version, scope, with_scope=True)
    row = store.workspace(site.tenant, site.workspace)
    floor = row.floor if row is not None else 0
    if version < floor and not (scope and [n.kind for n in nodes] == ["f"]):
        # below the floor only a file whose revision was kept is known
        raise compaction.trimmed(scope or f"{site.tenant}/{site.workspace}", version, floor)
    for node in nodes:
        place(tree, node)
    return tree


async def with_work(
    site: Site, state: WorkspaceState, p: Pending, attempt: Callable[[Context], Awaitable[_T]]
) -> _T:
    """``attempt(ctx)`` (which decides ``p`` against ``state`` with ``ctx``, its
    ``context``), again after each expensive step it asks for (``core.decision.Expensive``)
    is computed in a worker, as ``p``'s tenant's, until the client's deadline at most; a
    step's failure (its error, busy, its budget run out) is its result, which the decision
    then raises."""
    ctx = await context(site, state, p)
    assert ctx.computed is not None
    for _ in range(MAX_STEPS):
        try:
            return await attempt(ctx)
        except Expensive as step:
            token = CLIENT_DEADLINE.set(client_deadline(p.received, p.origin.timeout_ms))
            try:
                result: Any = await site.deps.offload.run(
                    p.address.tenant,
                    step.fn,
                    *step.args,
                    budget_s=step.budget_s,
                    overtime=f"{p.spec.key} took too long",
                )
            except QuillError as exc:
                result = exc
            finally:
                CLIENT_DEADLINE.reset(token)
            ctx.computed.append((step.fn, step.args, result))
    raise QuillError(ErrorCode.INTERNAL, f"Internal error: {p.spec.key} asked too many steps")


async def content(site: Site, sha256: str) -> bytes | None:
    """A content by sha256: the writer's cache, else the workspace's own in WS_BLOBS."""
    data = site.deps.contents.get(sha256)
    if data is None:
        try:
            data = await site.blobs.get(sha256)
        except QuillError:
            return None
    return data


def diff_for(site: Site, p: Pending) -> Callable[[list[Pair]], Awaitable[list[str]]]:
    """How the preview of ``p`` diffs files: in a worker, as ``p``'s tenant's
    (``infra/offload.py``)."""

    async def diff(pairs: list[Pair]) -> list[str]:
        token = CLIENT_DEADLINE.set(client_deadline(p.received, p.origin.timeout_ms))
        try:
            return await site.deps.offload.run(
                p.address.tenant,
                unified_many,
                pairs,
                3,
                budget_s=PREVIEW_BUDGET_S,
                overtime="The preview's diff took too long",
            )
        finally:
            CLIENT_DEADLINE.reset(token)

    return diff


async def externalize(site: Site, changes: list[AnyChange]) -> list[AnyChange]:
    """Move contents out of the event into WS_BLOBS (stored before the append): every one
    over ``INLINE_MAX``, then the largest others until the event's inline contents fit in
    ``INLINE_BUDGET``."""
    contents: dict[int, bytes] = {}
    for i, change in enumerate(changes):
        if isinstance(change, PutFile) and (change.text is not None or change.data):
            data = change.text.encode() if change.text is not None else change.data or b""
            site.deps.contents.put(change.sha256, data)
            contents[i] = data
    inline = sum(len(d) for d in contents.values())
    out = list(changes)
    moved: list[tuple[str, bytes]] = []
    for i in sorted(contents, key=lambda i: len(contents[i]), reverse=True):
        data = contents[i]
        if len(data) <= INLINE_MAX and inline <= INLINE_BUDGET:
            break
        change = out[i]
        assert isinstance(change, PutFile)
        out[i] = msgspec.structs.replace(change, text=None, data=None, blob=True)
        moved.append((change.sha256, data))
        inline -= len(data)
    await bounded_gather([site.blobs.put(sha, data) for sha, data in moved], 32)
    return out


def _without(
    content: Callable[[str], bytes | None], foreign: set[str]
) -> Callable[[str], bytes | None]:
    """``content`` that knows nothing of the ``foreign`` contents."""
    return lambda sha: None if sha in foreign else content(sha)
