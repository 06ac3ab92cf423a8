"""Unified diffs between two versions of a path or of the whole workspace."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.paths import normalize
from core.content import as_text
from core.diffs import unified
from core.rows import Node, WorkspaceRow
from services.reader.queries import Queries


class Differ:
    def __init__(self, queries: Queries) -> None:
        self.q = queries

    def ops(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return {"diff": self.diff}

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

    async def _text(self, ws: WorkspaceRow, node: Node | None) -> tuple[str | None, bool]:
        """The file's text (None: no file), and whether it is binary."""
        if node is None:
            return None, False
        if node.binary:
            return "", True
        assert node.sha256 is not None
        return as_text(await self.q.blobs.of(ws.tenant, ws.name).get(node.sha256)) or "", False

    async def diff(self, ws: WorkspaceRow, version: int, req: rq.DiffQuery) -> rp.Diff:
        to_version = req.to_version or version
        latest = self.q.store.version_of(ws.tenant, ws.name)
        for v in (req.from_version, to_version):
            if v > latest:
                raise QuillError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"Version {v} does not exist (the latest is {latest})",
                    {"version": v, "latest_version": latest},
                )
        scope = normalize(req.path) if req.path is not None else ""
        old = await self._files(ws, req.from_version, scope)
        new = await self._files(ws, to_version, scope)
        budget = ws.limits.max_read_bytes
        files: list[rp.FileDiff] = []
        chunks: list[str] = []
        used, truncated = 0, False
        for path in sorted(old.keys() | new.keys()):
            before, after = old.get(path), new.get(path)
            if before is not None and after is not None and before.sha256 == after.sha256:
                continue
            change = "added" if before is None else "deleted" if after is None else "modified"
            (a, a_bin), (b, b_bin) = await self._text(ws, before), await self._text(ws, after)
            if a_bin or b_bin:
                text = f"Binary files a/{path} and b/{path} differ\n"
                diff = ""
            else:
                diff = unified(path, a, b, req.context_lines)
                text = diff
            if used + len(text) > budget:
                truncated = True
                break
            used += len(text)
            chunks.append(text)
            files.append(rp.FileDiff(path=path, change=change, binary=a_bin or b_bin, diff=diff))
        return rp.Diff(
            path=scope if req.path is not None else None,
            from_version=req.from_version,
            to_version=to_version,
            files=files,
            diff="".join(chunks),
            truncated=truncated,
        )
