"""Unified diffs between two versions of a path or of the whole workspace.

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
from core.rows import Node, WorkspaceRow
from infra.offload import WALL_FACTOR
from services.reader.queries import OffloadedOps

PART_BYTES = 4 * 1024 * 1024
"""Text a diff hands its worker at once."""
OVERTIME = "Diff took too long: diff a smaller change, or read both versions"


class Differ(OffloadedOps):
    OPS = ("diff",)

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

    def _other(self, ws: WorkspaceRow, name: str, version: int) -> WorkspaceRow:
        """The workspace a diff compares with (``from_workspace``): of the same tenant, and
        as this replica holds it.

        Raises:
            QuillError: ``WORKSPACE_NOT_FOUND``; ``INVALID_ARGUMENT`` for a version it has not.
        """
        other = self.q.store.workspace(ws.tenant, name)
        if other is None:
            raise no_workspace(ws.tenant, name)
        if version > other.version:
            raise no_version(version, other.version, f"{ws.tenant}/{name}")
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

    async def diff(self, ws: WorkspaceRow, version: int, req: rq.DiffQuery) -> rp.Diff:
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
        old = await self._files(other, req.from_version, scope)
        new = await self._files(ws, to_version, scope)
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
