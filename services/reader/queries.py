"""Answers to queries as of a workspace version, over the projection store.

Each function takes the workspace row, the version to answer at and the request, and
returns the result or raises ``QuillError``. What the answer is, given the nodes and contents
found, is decided by the pure functions of ``answers``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec
from nats.js import JetStreamContext

from contracts import codec, ops
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_version
from contracts.limits import DEFAULT_EXCLUSIONS, TREE_PAGE_BYTES
from contracts.paths import ROOT_DIR, check_name, normalize, normalize_existing
from contracts.replies import ChangeSummary
from core.answers import (
    cursor_of,
    directory_content,
    file_bytes,
    file_content,
    file_info,
    listing,
    missing,
    not_a_directory,
    not_a_file,
    read_length,
)
from core.controls import approval_list, approval_status, attached_list, run_info
from core.evolve import Controls, WorkspaceState, evolve
from core.plan import LIVE
from core.rows import Node, WorkspaceRow
from infra.approvals import Approvals
from infra.blobs import Blobs
from infra.offload import Offload
from infra.store import Store
from services.reader import history
from services.reader.cache import RevisionCache, TextCache
from services.reader.changes import Changes
from services.reader.readmodel import ReadModel, Scope

_summaries = msgspec.json.Decoder(list[ChangeSummary])
CAPABILITIES = sorted(ops.OPS)
LOCK = ("lock_acquired", "lock_released")
ARCHIVE = ("workspace_archived", "workspace_unarchived")
TRUST = ("trust_changed", "workspace_forked")
"""Control events whose newest (of its group) decides that part of the controls alone."""


_normal = functools.lru_cache(maxsize=16_384)(normalize)


def existing(path: str) -> str:
    """``normalize_existing``, remembered for the paths read recently (up to 256 characters:
    what a cache of 16,384 holds stays small): ``normalize`` is a function of the path alone,
    and cost a read ~2-4 µs; a path it refuses is not remembered, and goes on to the rule
    for legacy names."""
    if len(path) > 256:
        return normalize_existing(path)
    try:
        return _normal(path)
    except QuillError:
        return normalize_existing(path)


class Queries:
    def __init__(
        self,
        store: Store,
        blobs: Blobs,
        cache: RevisionCache,
        approvals: Approvals | None = None,
        js: JetStreamContext | None = None,
    ) -> None:
        self.store = store
        self.changes = Changes(store, js)
        """What changed between two versions (``qry.tree``'s ``changed_from``); ``js`` reads
        the events whose summaries the projection cut."""
        self.kept = approvals
        """``WS_APPROVALS``: what approved requests gave (None: no outcome is known)."""
        self.model = ReadModel(store)
        self.blobs = blobs
        self.cache = cache
        self.texts = TextCache()

    def ops(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return {
            "read": self.read,
            "read_bytes": self.read_bytes,
            "list": self.list,
            "stat": self.stat,
            "history": self.history,
            "info": self.info,
            "events": self.events,
            "tree": self.tree,
            "run": self.run,
            "approvals": self.approvals,
            "approval": self.approval,
            "attached": self.attached,
            "workspaces": self.workspaces,
            "forks": self.forks,
        }

    async def _lookup(
        self, ws: WorkspaceRow, path: str, version: int
    ) -> tuple[Node, bytes | None] | None:
        if path == "":
            root = Node("", "d", None, 0, None, False, False, ws.created, ws.updated, 1, LIVE, None)
            return root, None
        fork = bool(ws.lineage)  # what it reads may be its layers': not cached as its own
        found = None if fork else self.cache.get(ws.id, path, version)
        if found is not None:
            return found
        before = self.store.version_of(ws.tenant, ws.name)
        found = await self.model.node_with_data(ws.id, path, version)
        if found is None:
            return None
        node, data = found
        if node.kind == "f" and data is None:
            assert node.sha256 is not None
            data = await self.blobs.of(ws.tenant, ws.name, ws.lineage).get(node.sha256)
        if not fork and self.store.version_of(ws.tenant, ws.name) == before:
            self.cache.put(ws.id, node, data)
        return node, data

    async def _node(self, ws: WorkspaceRow, path: str, version: int, what: str = "File") -> Node:
        found = await self._lookup(ws, path, version)
        if found is None:
            raise missing(path, what)
        return found[0]

    async def _content(self, ws: WorkspaceRow, path: str, version: int) -> tuple[Node, bytes]:
        found = await self._lookup(ws, path, version)
        if found is None:
            raise missing(path)
        return found[0], found[1] or b""

    async def read(self, ws: WorkspaceRow, version: int, req: rq.ReadFile) -> rp.FileContent:
        path = existing(req.path)
        node, data = await self._content(ws, path, version)
        limits = ws.limits
        if node.kind == "d":
            children = await self.model.page(
                ws.id, version, Scope(path), None, limits.max_directory_entries
            )
            total = await self.model.count(ws.id, version, Scope(path))
            return directory_content(path, node.modified, children, total)
        return file_content(path, node, data, req, limits)

    async def read_bytes(self, ws: WorkspaceRow, version: int, req: rq.ReadBytes) -> rp.FileBytes:
        path = existing(req.path)
        node, data = await self._content(ws, path, version)
        if node.kind != "f":
            raise not_a_file(path)
        length = read_length(req, ws.limits)
        return file_bytes(path, node, data[req.offset : req.offset + length], req.offset)

    async def list(self, ws: WorkspaceRow, version: int, req: rq.ListDirectory) -> rp.Listing:
        path = existing(req.path)
        node = await self._node(ws, path, version, what="Directory")
        if node.kind != "d":
            raise not_a_directory(path)
        limit = min(req.limit or ws.limits.max_directory_entries, ws.limits.max_directory_entries)
        kind = None if req.kind == "any" else req.kind[0]
        scope = Scope(path, req.recursive, kind, req.prefix)
        after = cursor_of(req.after) if req.after is not None else None
        nodes = await self.model.page(ws.id, version, scope, after, limit + 1)
        if len(nodes) > limit or after is not None:
            total = await self.model.count(ws.id, version, scope)
        else:
            total = len(nodes)
        return listing(path, nodes, limit, total)

    async def stat(self, ws: WorkspaceRow, version: int, req: rq.StatPath) -> rp.FileInfo:
        path = existing(req.path)
        node = await self._node(ws, path, version, what="Path")
        count = None
        if node.kind == "d":
            count = await self.model.count(ws.id, version, Scope(path))
        return file_info(path, node, count)

    async def history(self, ws: WorkspaceRow, version: int, req: rq.History) -> rp.HistoryPage:
        upto = min(version, req.before - 1) if req.before else version
        if req.path is None:
            rows = await self.model.events_desc(ws.id, upto + 1, req.limit + 1)
            revisions = [
                rp.Revision(
                    version=r[1],
                    at=datetime.fromisoformat(r[3]),
                    op=r[4],
                    actor=r[5],
                    request_id=r[8],
                    change=r[0],
                    paths=[c.path for c in _summaries.decode(r[12])][:100],
                    changes_total=r[13],
                )
                for r in rows[: req.limit]
            ]
            return rp.HistoryPage(path=None, revisions=revisions, truncated=len(rows) > req.limit)
        path = existing(req.path)
        if req.follow:
            page = await history.followed(self.model, ws.id, path, upto, req.limit)
            if not page.revisions and check_name(path) is not None:
                raise missing(path)
            return page
        rows = await self.model.path_history(ws.id, path, upto, req.limit + 1)
        if not rows and check_name(path) is not None:
            raise missing(path)  # no legacy name by that name: the rule's answer
        out = history.revisions(rows, upto, req.limit, None)
        return rp.HistoryPage(path=path, revisions=out, truncated=len(rows) > req.limit)

    async def info(
        self, ws: WorkspaceRow, version: int, req: rq.WorkspaceInfoQuery
    ) -> rp.WorkspaceInfo:
        files, dirs, size = await self.model.totals(ws.id, version)
        event = (await self.model.events(ws.id, version - 1, version, 1))[0]
        capabilities = CAPABILITIES
        if ws.trust == "restricted" and not await self._commands(ws):
            capabilities = [op for op in CAPABILITIES if not op.startswith("exec.")]
        return rp.WorkspaceInfo(
            tenant=ws.tenant,
            workspace=ws.name,
            root=ROOT_DIR,
            version=version,
            created=ws.created,
            updated=datetime.fromisoformat(event[3]),
            trust=ws.trust,
            limits=ws.limits,
            default_exclusions=list(DEFAULT_EXCLUSIONS),
            capabilities=capabilities,
            files=files,
            directories=dirs,
            total_bytes=size,
            tree_hash=event[11],
            last_hash=event[9],
            compaction=await self._compaction(ws),
        )

    async def _compaction(self, ws: WorkspaceRow) -> str | None:
        """Why ``max_versions`` does not compact ``ws`` now (``services/writer/compaction.py``):
        one seek of its forks, when it has a ``max_versions``."""
        if ws.limits.max_versions is None:
            return None
        if ws.lineage:
            return "fork"
        return "has_forks" if await self.store.forks_of(ws.tenant, ws.name, "", 1) else None

    async def events(self, ws: WorkspaceRow, version: int, req: rq.EventsQuery) -> rp.EventPage:
        rows = await self.model.events(ws.id, req.after, version, req.limit + 1)
        events = [
            rp.EventSummary(
                type=r[0],
                version=r[1],
                seq=r[2],
                at=datetime.fromisoformat(r[3]),
                op=r[4],
                actor=r[5],
                session=r[6],
                run=r[7],
                request_id=r[8],
                hash=r[9],
                prev_hash=r[10],
                tree_hash=r[11],
                changes=_summaries.decode(r[12]),
                changes_total=r[13],
                message=r[14],
            )
            for r in rows[: req.limit]
        ]
        last = events[-1].version if events else req.after
        return rp.EventPage(events=events, next_after=last, has_more=len(rows) > req.limit)

    async def tree(self, ws: WorkspaceRow, version: int, req: rq.TreeQuery) -> rp.TreePage:
        """A page of the whole tree by path, each content once, at most ``TREE_PAGE_BYTES``
        of them (the page ends before the content that would pass it); the workspace's head
        on the first page. With ``changed_from``: only what changed since (or until) that
        version, as of ``version`` (``Changes.entries``), each page told again (O(changes)).

        Raises:
            QuillError: ``INVALID_ARGUMENT`` for a ``changed_from`` past the replica's latest.
        """
        changed: list[str] | None = None
        if req.changed_from is not None:
            latest = self.store.version_of(ws.tenant, ws.name)
            if req.changed_from > latest:
                raise no_version(req.changed_from, latest)
            found = await self.changes.entries(ws, version, req.changed_from)
            if found is None:  # cannot tell in O(changes): no entries, the whole tree is asked
                head = await self._head(ws, version) if req.after is None else None
                return rp.TreePage(head=head, entries=[], contents={}, changed=None)
            changed, every = found
            if req.after is not None:
                changed, every = None, [n for n in every if n.path > req.after]
            nodes = every[: req.limit + 1]
        else:
            after = ("", req.after) if req.after is not None else None
            scope = Scope("", recursive=True)
            nodes = await self.model.page(ws.id, version, scope, after, req.limit + 1)
        more = len(nodes) > req.limit
        nodes = nodes[: req.limit]
        contents: dict[str, bytes] = {}
        if req.contents:
            wanted = sorted({n.sha256 for n in nodes if n.kind == "f" and n.size and n.sha256})
            held = await self.model.contents(wanted)
            used = 0
            for i, node in enumerate(nodes):
                data = held.get(node.sha256 or "") if node.kind == "f" and node.size else None
                if data is None or node.sha256 in contents:
                    continue
                if used + len(data) > TREE_PAGE_BYTES and i > 0:
                    nodes, more = nodes[:i], True
                    break
                contents[node.sha256 or ""] = data
                used += len(data)
        entries = [
            rp.TreeItem(
                path=n.path,
                kind=history.kind_of(n),
                sha256=n.sha256,
                size=n.size,
                executable=n.executable,
                file_version=n.file_version,
                blob=n.kind == "f" and n.size > 0 and n.sha256 not in contents,
            )
            for n in nodes
        ]
        head = await self._head(ws, version) if req.after is None else None
        return rp.TreePage(
            head=head,
            entries=entries,
            contents=contents,
            next=nodes[-1].path if more and nodes else None,
            changed=changed,
        )

    async def _head(self, ws: WorkspaceRow, version: int) -> rp.TreeHead:
        """The workspace as of ``version`` besides its files; its lock, archive and trust
        as its newest control events say (one seek each, however many it has)."""
        event = (await self.model.events(ws.id, version - 1, version, 1))[0]
        controls = await self._latest(ws.id, LOCK, ARCHIVE, TRUST)
        lock, archived = controls.lock, controls.archived
        return rp.TreeHead(
            version=version,
            seq=int(event[2]),
            tree_hash=str(event[11]),
            trust=ws.trust,
            commands=controls.commands,
            limits=ws.limits,
            floor=ws.floor,
            lock=None if lock is None else rp.TreeLock(holder=lock.holder, expires=lock.expires),
            archived=(
                None
                if archived is None
                else rp.TreeArchive(since=archived.at, by=archived.by, reason=archived.reason)
            ),
            uncommitted=[
                rp.TreeUncommitted(path=p, reason=r, by_command=c, version=v)
                for p, r, c, v in await self.model.uncommitted_all(ws.id)
                if v <= version
            ],
            forked_from=[name for name, _ in ws.lineage],
        )

    async def _latest(self, ws: int, *groups: tuple[str, ...]) -> Controls:
        """The controls the newest control event of each of ``groups`` makes (each group's
        newest decides it alone: a lock, the archive, trust), evolved; one seek a group."""
        state = WorkspaceState("", "")
        for kinds in groups:
            raw = await self.model.last_control(ws, kinds)
            if raw is not None:
                evolve(state, codec.decode_event(raw), tree=False)
        return state.controls

    async def _commands(self, ws: WorkspaceRow) -> bool:
        """Whether a restricted workspace offers commands (its last trust change says)."""
        return (await self._latest(ws.id, TRUST)).commands

    async def _controls(self, ws: WorkspaceRow, version: int, kinds: tuple[str, ...]) -> Controls:
        """The controls the control events of ``kinds`` up to ``version`` make, evolved."""
        state = WorkspaceState(ws.tenant, ws.name)
        for raw in await self.model.control_events(ws.id, kinds):
            event = codec.decode_event(raw)
            if event.version <= version:
                evolve(state, event, tree=False)
        return state.controls

    async def run(self, ws: WorkspaceRow, version: int, req: rq.RunQuery) -> rp.RunInfo:
        controls = await self._controls(ws, version, ("run_started", "run_ended"))
        run = controls.run(req.run)
        if run is None:
            raise QuillError(ErrorCode.FILE_NOT_FOUND, f"No run {req.run}", {"run": req.run})
        return run_info(req.run, run)

    async def attached(self, ws: WorkspaceRow, version: int, req: rq.AttachedQuery) -> rp.Attached:
        kinds = ("workspace_attached", "workspace_detached")
        controls = await self._controls(ws, version, kinds)
        return attached_list(f"{ws.tenant}/{ws.name}", controls)

    async def approvals(
        self, ws: WorkspaceRow, version: int, req: rq.ApprovalsQuery
    ) -> rp.ApprovalList:
        kinds = ("approval_requested", "approval_decided")
        controls = await self._controls(ws, version, kinds)
        return approval_list(controls, datetime.now(UTC))

    async def approval(
        self, ws: WorkspaceRow, version: int, req: rq.ApprovalQuery
    ) -> rp.ApprovalStatus:
        """One approval of the workspace, and what carrying it out gave once approved."""
        kinds = ("approval_requested", "approval_decided")
        controls = await self._controls(ws, version, kinds)
        approval = controls.approval(req.approval_id)
        if approval is None:
            raise QuillError(
                ErrorCode.FILE_NOT_FOUND,
                f"No approval {req.approval_id} on {ws.tenant}/{ws.name}",
                {"approval_id": req.approval_id},
            )
        outcome = None
        if approval.approved and self.kept is not None:
            try:
                outcome = await self.kept.outcome(ws.tenant, ws.name, req.approval_id)
            except Exception as exc:
                raise QuillError(
                    ErrorCode.UNAVAILABLE, f"The outcome could not be read ({exc!r}); retry"
                ) from None
        return approval_status(req.approval_id, approval, datetime.now(UTC), outcome)

    async def forks(self, ws: WorkspaceRow, version: int, req: rq.ForksQuery) -> rp.ForkList:
        """The workspaces forked from this one (their nearest layer), by name: the version
        each was forked at, and how far each side has moved on since."""
        found = await self.store.forks_of(ws.tenant, ws.name, "", req.limit + 1)
        forks = [
            rp.ForkSummary(
                workspace=name,
                version=lineage[0][1],
                ahead=max(0, latest - lineage[0][1]),
                behind=max(0, ws.version - lineage[0][1]),
            )
            for name, lineage, latest in found[: req.limit]
        ]
        return rp.ForkList(
            workspace=f"{ws.tenant}/{ws.name}", forks=forks, truncated=len(found) > req.limit
        )

    async def workspaces(self, tenant: str, req: rq.ListWorkspaces) -> rp.WorkspaceList:
        """A page of the tenant's workspaces (a tenant's op: no workspace, no version)."""
        rows = await self.model.workspaces(tenant, req.after or "", req.prefix or "", req.limit + 1)
        now = datetime.now(UTC)
        out = []
        for ws, name, version, trust, created, at, actor, op, files, size in rows[: req.limit]:
            controls = await self._latest(ws, LOCK, ARCHIVE)
            held = controls.lock
            out.append(
                rp.WorkspaceSummary(
                    workspace=name,
                    version=version,
                    files=files,
                    total_bytes=size,
                    created=datetime.fromisoformat(created),
                    updated=datetime.fromisoformat(at),
                    updated_by=actor,
                    last_op=op,
                    trust=trust,
                    lock_holder=held.holder if held is not None and held.expires > now else None,
                    archived=controls.archived is not None,
                )
            )
        more = len(rows) > req.limit
        return rp.WorkspaceList(
            tenant=tenant, workspaces=out, next=out[-1].workspace if more and out else None
        )


class OffloadedOps:
    """Ops that hand their heavy part to a worker process (``Search``'s grep, ``Differ``'s
    diff): over the replica's ``Queries``, named in ``OPS``."""

    OPS: ClassVar[tuple[str, ...]]

    def __init__(self, queries: Queries, offload: Offload) -> None:
        self.q = queries
        self.offload = offload

    def ops(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return {name: getattr(self, name) for name in self.OPS}
