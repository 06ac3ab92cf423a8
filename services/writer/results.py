"""What a workspace actor keeps and tells of what it committed.

:class:`Results` answers a retried request with what it was first answered (idempotent
replies): the last ``WRITER_RECENT_RESULTS`` results in memory, those dropped from it whose
events the projection does not have yet, else the projection (``Store.results_of``).
``record`` keeps an approved request's outcome under its approval id; ``notify`` says a
workspace changed (``workspace.updated``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from contracts import codec
from contracts.errors import QuillError
from contracts.events import AnyChange, WorkspaceEvent, WorkspaceUpdated
from contracts.limits import WRITER_RECENT_RESULTS
from contracts.subjects import Origin
from infra.metrics import publish_failed
from infra.store import Store
from services.writer.deps import Deps
from services.writer.pending import Pending

log = logging.getLogger("quill.writer")


class Results:
    """One workspace's results by request id (idempotent retries)."""

    def __init__(self, store: Store, tenant: str, workspace: str) -> None:
        self.store = store
        self.tenant, self.workspace = tenant, workspace
        self.recent: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        """The last ``WRITER_RECENT_RESULTS`` results by request id (idempotent retries)."""
        self.all = True
        """``recent`` holds every result the projection has of the workspace (else a
        request id not in it is looked up in the projection)."""
        self.unprojected: dict[str, tuple[int, bytes]] = {}
        """Results dropped from ``recent`` whose events the projection does not have yet
        (bounded by what commits in one linger of the applier)."""

    def reload(self, recent: Iterable[tuple[str, int, bytes]], version: int) -> None:
        """Start again from the projection's ``recent`` results of a workspace at
        ``version`` (on a load)."""
        self.recent.clear()
        self.unprojected = {}
        for request_id, result_version, result in recent:
            self.remember(request_id, result_version, result)
        self.all = version <= WRITER_RECENT_RESULTS

    def clear(self) -> None:
        """Forget every result (an old request id is not answered from a purged log)."""
        self.recent.clear()
        self.all, self.unprojected = True, {}

    def remember(self, request_id: str, version: int, result: bytes) -> None:
        self.recent[request_id] = (version, result)
        self.recent.move_to_end(request_id)
        projected = self.store.version_of(self.tenant, self.workspace)
        if len(self.recent) > WRITER_RECENT_RESULTS:
            old_id, (old_version, old_result) = self.recent.popitem(last=False)
            self.all = False
            if old_version > projected:  # kept until the projection has it
                self.unprojected[old_id] = (old_version, old_result)
        if self.unprojected:
            self.unprojected = {k: v for k, v in self.unprojected.items() if v[0] > projected}

    def committed(
        self, origins: Iterable[Origin], *, look: bool, loaded: bool
    ) -> dict[str, tuple[int, bytes]]:
        """The version and result each command (by its ``origins``) was answered with, if it
        committed, by request id: from memory, else (``look``: an append of it may have
        committed; or when memory does not hold every result and a client named the request,
        so it may be a retry) the projection, every such id of the group in one statement
        (``Store.results_of``; only when the state is ``loaded``). An id the writer made is no
        client's retry: the projection is not asked for it."""
        found: dict[str, tuple[int, bytes]] = {}
        asked: list[str] = []
        for origin in origins:
            request_id = origin.request_id
            held = self.recent.get(request_id) or self.unprojected.get(request_id)
            if held is not None:
                found[request_id] = held
            elif look or not (self.all or origin.generated):
                asked.append(request_id)
        if asked and loaded:
            ws = self.store.workspace_id(self.tenant, self.workspace)
            if ws is not None:
                found.update(self.store.results_of(ws, asked))
        return found


async def record(
    deps: Deps,
    tenant: str,
    workspace: str,
    p: Pending,
    reply: bytes,
    error: QuillError | None,
    version: int | None,
) -> None:
    """Keep what an approved request gave, under its approval id (``WS_APPROVALS``)."""
    result: dict[str, Any] | None = None
    if error is None:
        result = codec.decode_reply(reply, dict[str, Any])[1]
    await deps.approvals.record(
        tenant, workspace, p.origin.request_id,
        version=version, result=result, error=error,
    )  # fmt: skip


async def notify(deps: Deps, event: WorkspaceEvent, changes: Iterable[AnyChange], seq: int) -> None:
    """Say on ``workspace.updated`` that ``event`` (at log sequence ``seq``) committed."""
    paths = list(dict.fromkeys(c.path for c in changes))
    update = WorkspaceUpdated(
        tenant=event.tenant,
        workspace=event.workspace,
        version=event.version,
        op=event.op,
        actor=event.actor,
        request_id=event.request_id,
        at=event.at,
        paths=paths[:100],
        paths_total=len(paths),
        tree_hash=event.tree_hash,
    )
    try:
        await deps.nc.publish(
            deps.subjects.updated(event.tenant, event.workspace), codec.encode(update)
        )
    except Exception as exc:
        publish_failed("writer", "updated")
        log.warning("could not publish workspace.updated: %s", exc)
