"""Unified diffs between two versions of a path or of the whole workspace.

**What changed, not the tree** (issue 33: an operation costs what it returns). Between two
versions of one workspace the files compared are those under the paths changed in between
(``services.reader.changes``: its events' summaries and the rows ended in the range, through
a fork's layers), kept to the diff's scope (a changed parent of the scope stands
for the scope). Each is looked up at both versions (a seek a layer); one that is a directory
at either contributes its files there (its subtree's range of each layer): a directory removed,
moved or added is named alone in a summary, and a fork's delete of an inherited directory
leaves whiteouts of what was below it. A directory that is the same revision at both
versions contributes nothing: what changed below it is named on its own. So a diff of one
change costs the same in a tree of 1,000 files as of 100,000.

**Between two workspaces** (``from_workspace``) the same holds where their histories meet
(a fork and its source, a fork's fork and its grandparent, two forks of one source): as of
the older of their two versions of the nearest workspace both stand on
(``core.lineage.common``, the writer's merge base before any merge), the two sides were one
tree; what can differ since is what each changed after that version, through its own layers
(``Changes.paths`` on each side), each path looked up on both sides as above. A directory is
skipped only where both sides show the revision they shared then: versions after the
meeting point are numbered on each side alike, so an equal number there says nothing. A diff
of a fork against its source where one path changed costs that path, whatever the tree.
A diff within one workspace is the case where the two sides are one history up to the older
of the two versions.

The whole scope is read at both versions (``_files``), as before, only where that cannot
answer: two workspaces that share no history (neither forked from the other, nor both from
one workspace), or part of a range below the floor of a layer it reads (compaction dropped
the events and rows that name what changed there; the workspace's own floor is refused
before, ``handlers.answer_at``). Versions may come in either order: what changed between
them is the same range.

The texts are read here; ``difflib`` runs in a worker process (``infra/offload.py``), as the
tenant's, in parts of up to ``PART_BYTES`` of text, each with ``DIFF_BUDGET_S`` of CPU: a file
it cannot diff in that time is "too large to diff here" (``SIZE_LIMIT_EXCEEDED`` with both
sizes, ``core/diffs.py``). The answer is cut at ``max_read_bytes``.
"""

from __future__ import annotations

import time

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import no_version, no_workspace
from contracts.paths import normalize
from core.diffs import DIFF_BUDGET_S, Pair, unified_many
from core.lineage import chain, common
from core.rows import Node, WorkspaceRow
from infra import compaction
from infra.offload import WALL_FACTOR
from services.reader.changes import Changes
from services.reader.queries import OffloadedOps

PART_BYTES = 4 * 1024 * 1024
"""Text a diff hands its worker at once."""
OVERTIME = "Diff took too long: diff a smaller change, or read both versions"


class Differ(OffloadedOps):
    OPS = ("diff",)

    @property
    def changes(self) -> Changes:
        """What changed between two versions (``services.reader.changes``), the replica's."""
        return self.q.changes

    async def _files(self, ws: WorkspaceRow, version: int, scope: str) -> dict[str, Node]:
        """The files at ``scope`` (a file, or everything below a directory) as of ``version``."""
        if scope:
            node = await self.q.model.node(ws.id, scope, version)
            if node is None:
                return {}
            if node.kind == "f":
                return {scope: node}
        entries = await self.q.store.entries_at(ws.id, version, scope)
        return {n.path: n for n in entries if n.kind == "f"}

    async def _sides(
        self, old_ws: WorkspaceRow, a: int, new_ws: WorkspaceRow, b: int, scope: str
    ) -> tuple[dict[str, Node], dict[str, Node]]:
        """The files of ``scope`` in ``old_ws`` as of ``a`` and in ``new_ws`` as of ``b``
        that may differ: those under the paths either side changed since the two share
        history (``Changes.paths``); every file of ``scope`` at each where that cannot tell."""
        old_layers, new_layers = self.changes.layers(old_ws), self.changes.layers(new_ws)
        if old_ws.id == new_ws.id:
            shared: int | None = min(a, b)  # one history up to the older version
        else:
            shared = common(
                chain(old_ws.name, a, old_ws.lineage), chain(new_ws.name, b, new_ws.lineage)
            )
        paths = None
        if shared is not None:
            olds = await self.changes.paths(old_ws, old_layers, shared, a, scope)
            news = await self.changes.paths(new_ws, new_layers, shared, b, scope)
            paths = None if olds is None or news is None else olds | news
        if shared is None or paths is None:
            return await self._files(old_ws, a, scope), await self._files(new_ws, b, scope)
        old: dict[str, Node] = {}
        new: dict[str, Node] = {}
        for path in sorted(paths):
            before = await self.q.model.node(old_ws.id, path, a)
            after = await self.q.model.node(new_ws.id, path, b)
            if before is not None and after is not None and before.kind == after.kind == "d":
                if before.version == after.version <= shared:
                    continue  # one directory on both sides: what changed below is named itself
            for side, version, node, files in (
                (old_layers, a, before, old),
                (new_layers, b, after, new),
            ):
                if node is None:
                    continue
                if node.kind == "f":
                    files[path] = node
                else:
                    files.update(await self.changes.below(side, version, path))
        return old, new

    def _other(self, ws: WorkspaceRow, name: str, version: int) -> WorkspaceRow:
        """The workspace a diff compares with (``from_workspace``): of the same tenant, and
        as this replica holds it.

        Raises:
            QuillError: ``WORKSPACE_NOT_FOUND``; ``INVALID_ARGUMENT`` for a version it has not,
                ``VERSION_TRIMMED`` for one below its floor (its own, not the diff's
                workspace's, which ``handlers.answer_at`` holds its ``to_version`` to).
        """
        other = self.q.store.workspace(ws.tenant, name)
        if other is None:
            raise no_workspace(ws.tenant, name)
        if version > other.version:
            raise no_version(version, other.version, f"{ws.tenant}/{name}")
        if version < other.floor:
            raise compaction.trimmed(f"{ws.tenant}/{name}", version, other.floor)
        return other

    async def _text(self, ws: WorkspaceRow, node: Node | None) -> tuple[bytes | None, bool]:
        """The file's content (None: no file; decoded by the worker), and whether it is
        binary."""
        if node is None:
            return None, False
        if node.binary:
            return b"", True
        assert node.sha256 is not None
        data = await self.q.blobs.of(ws.tenant, ws.name, ws.lineage).get(node.sha256)
        return (b"" if b"\0" in data else data), False

    async def diff(
        self, ws: WorkspaceRow, version: int, req: rq.DiffQuery, *, whole: bool = False
    ) -> rp.Diff:
        """The diff ``req`` asks for, as of ``version``. ``whole``: read the scope's every
        file at both versions, whatever changed (the tests' reference answer)."""
        to_version = req.to_version or version
        latest = self.q.store.version_of(ws.tenant, ws.name)
        elsewhere = req.from_workspace not in (None, ws.name)
        for v in (to_version,) if elsewhere else (req.from_version, to_version):
            if v > latest:
                raise no_version(v, latest)
        other = ws
        if elsewhere:
            assert req.from_workspace is not None
            other = self._other(ws, req.from_workspace, req.from_version)
        scope = normalize(req.path) if req.path is not None else ""
        if whole:
            old = await self._files(other, req.from_version, scope)
            new = await self._files(ws, to_version, scope)
        else:
            old, new = await self._sides(other, req.from_version, ws, to_version, scope)
        answer = _Answer(ws.limits.max_read_bytes)
        until = time.monotonic() + DIFF_BUDGET_S * WALL_FACTOR
        pending: list[tuple[str, str, Pair | None]] = []  # (path, change, texts or binary)
        size = 0
        for path in sorted(old.keys() | new.keys()):
            before, after = old.get(path), new.get(path)
            if before is not None and after is not None and before.sha256 == after.sha256:
                continue
            change = "added" if before is None else "deleted" if after is None else "modified"
            (a, a_bin), (b, b_bin) = await self._text(other, before), await self._text(ws, after)
            if a_bin or b_bin:
                pending.append((path, change, None))  # named, not diffed
            else:
                pending.append((path, change, (path, a, b)))
                size += len(a or "") + len(b or "")
            if size >= PART_BYTES:
                if not await self._flush(ws, req, pending, answer, until):
                    break
                pending, size = [], 0
        else:
            await self._flush(ws, req, pending, answer, until)
        return rp.Diff(
            path=scope if req.path is not None else None,
            from_version=req.from_version,
            to_version=to_version,
            files=answer.files,
            diff="".join(answer.chunks),
            truncated=answer.truncated,
        )

    async def _flush(
        self,
        ws: WorkspaceRow,
        req: rq.DiffQuery,
        pending: list[tuple[str, str, Pair | None]],
        answer: _Answer,
        until: float,
    ) -> bool:
        """Diff ``pending`` in a worker and add it to ``answer``; False once it is cut."""
        texts = [pair for _, _, pair in pending if pair is not None]
        diffs = iter(
            await self.offload.run(
                ws.tenant,
                unified_many,
                texts,
                req.context_lines,
                budget_s=DIFF_BUDGET_S,
                overtime=OVERTIME,
                until=until,
            )
            if texts
            else []
        )
        for path, change, pair in pending:
            if pair is None:
                shown, diff, binary = f"Binary files a/{path} and b/{path} differ\n", "", True
            else:
                shown = diff = next(diffs)
                binary = False
            found = rp.FileDiff(path=path, change=change, binary=binary, diff=diff)
            if not answer.add(found, shown):
                return False
        return True


class _Answer:
    """What a diff answers so far, cut at ``max_read_bytes``."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used, self.truncated = budget, 0, False
        self.files: list[rp.FileDiff] = []
        self.chunks: list[str] = []

    def add(self, diff: rp.FileDiff, shown: str) -> bool:
        if self.used + len(shown) > self.budget:
            self.truncated = True
            return False
        self.used += len(shown)
        self.chunks.append(shown)
        self.files.append(diff)
        return True
