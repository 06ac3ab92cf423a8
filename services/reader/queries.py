"""Answers to queries as of a workspace version, over the projection store.

Each function takes the workspace row, the version to answer at and the request, and
returns the result or raises ``QuillError``. Line slicing and formatting are pure helpers.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import msgspec

from contracts import ops
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import DEFAULT_EXCLUSIONS, Limits
from contracts.paths import ROOT_DIR, display, name, normalize
from contracts.replies import ChangeSummary
from services.common.blobs import Blobs
from services.common.content import split_lines
from services.common.plan import LIVE
from services.common.store import Node, Store, WorkspaceRow
from services.common.tree import etag_of
from services.reader.cache import RevisionCache, TextCache
from services.reader.readmodel import ReadModel, Scope

_summaries = msgspec.json.Decoder(list[ChangeSummary])
CAPABILITIES = sorted(ops.OPS)


# ---------------------------------------------------------------- pure helpers


def select_lines(lines: list[str], req: rq.ReadFile) -> tuple[int, list[str]]:
    """``(first line number, lines)`` picked by head/tail/offset/limit.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for combinations that do not make sense.
    """
    if req.head is not None and req.tail is not None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Give head or tail, not both")
    if (req.head is not None or req.tail is not None) and (
        req.offset is not None or req.limit is not None
    ):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, "head/tail cannot be combined with offset/limit"
        )
    if req.head is not None:
        return 1, lines[: req.head]
    if req.tail is not None:
        start = max(len(lines) - req.tail, 0) if req.tail else len(lines)
        return start + 1, lines[start:]
    start = (req.offset or 1) - 1
    end = len(lines) if req.limit is None else start + req.limit
    return start + 1, lines[start:end]


def cap(lines: list[str], limits: Limits) -> tuple[list[str], bool]:
    """Keep at most ``max_read_lines`` lines and ``max_read_bytes`` bytes."""
    out: list[str] = []
    used, cut = 0, False
    for line in lines[: limits.max_read_lines]:
        size = len(line.encode())
        if used + size > limits.max_read_bytes:
            if not out:  # a single huge line: return its start
                head = line.encode()[: limits.max_read_bytes].decode("utf-8", "ignore")
                out.append(head)
            cut = True
            break
        out.append(line)
        used += size
    return out, cut or len(lines) > limits.max_read_lines


def number(lines: list[str], first: int) -> str:
    return "".join(f"{first + i}: {line}" for i, line in enumerate(lines))


def entry(node: Node) -> rp.Entry:
    is_file = node.kind == "f"
    return rp.Entry(
        name=name(node.path),
        path=node.path,
        kind="file" if is_file else "directory",
        size=node.size,
        modified=node.modified,
        file_version=node.file_version if is_file else None,
        etag=etag_of(node.file_version) if is_file and node.file_version else None,
    )


def cursor_of(after: str) -> tuple[str, str]:
    """The ``(kind, path)`` a listing's ``next`` names.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for anything else.
    """
    kind, sep, path = after.partition(":")
    if not sep or kind not in ("d", "f"):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            "Invalid after: pass the next of the previous page",
            {"after": after[:100]},
        )
    return kind, path


def mime_type(path: str, binary: bool) -> str:
    guess, _ = mimetypes.guess_type(path)
    return guess or ("application/octet-stream" if binary else "text/plain")


# ---------------------------------------------------------------- queries


class Queries:
    def __init__(self, store: Store, blobs: Blobs, cache: RevisionCache) -> None:
        self.store = store
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
        }

    async def _lookup(
        self, ws: WorkspaceRow, path: str, version: int
    ) -> tuple[Node, bytes | None] | None:
        if path == "":
            root = Node("", "d", None, 0, None, False, False, ws.created, ws.updated, 1, LIVE, None)
            return root, None
        found = self.cache.get(ws.id, path, version)
        if found is not None:
            return found
        before = self.store.version_of(ws.tenant, ws.name)
        found = await self.model.node_with_data(ws.id, path, version)
        if found is None:
            return None
        node, data = found
        if node.kind == "f" and data is None:
            assert node.sha256 is not None
            data = await self.blobs.get(node.sha256)
        if self.store.version_of(ws.tenant, ws.name) == before:
            self.cache.put(ws.id, node, data)
        return node, data

    async def _node(self, ws: WorkspaceRow, path: str, version: int, what: str = "File") -> Node:
        found = await self._lookup(ws, path, version)
        if found is None:
            raise QuillError(ErrorCode.FILE_NOT_FOUND, f"{what} not found: {path}", {"path": path})
        return found[0]

    async def _content(self, ws: WorkspaceRow, path: str, version: int) -> tuple[Node, bytes]:
        found = await self._lookup(ws, path, version)
        if found is None:
            raise QuillError(ErrorCode.FILE_NOT_FOUND, f"File not found: {path}", {"path": path})
        return found[0], found[1] or b""

    async def read(self, ws: WorkspaceRow, version: int, req: rq.ReadFile) -> rp.FileContent:
        path = normalize(req.path)
        node, data = await self._content(ws, path, version)
        limits = ws.limits
        if node.kind == "d":
            children = await self.model.page(
                ws.id, version, Scope(path), None, limits.max_directory_entries
            )
            names = [name(c.path) + ("/" if c.kind == "d" else "") + "\n" for c in children]
            total = await self.model.count(ws.id, version, Scope(path))
            return rp.FileContent(
                path=display(path),
                kind="directory",
                content="".join(names),
                binary=False,
                total_lines=total,
                returned_lines=len(names),
                start_line=1 if names else 0,
                truncated=total > len(names),
                size=0,
                file_version=None,
                etag=None,
                modified=node.modified,
                mime_type=None,
            )
        meta = rp.FileContent(
            path=path,
            kind="file",
            content=None,
            binary=True,
            total_lines=0,
            returned_lines=0,
            start_line=0,
            truncated=False,
            size=node.size,
            file_version=node.file_version,
            etag=etag_of(node.file_version or 0),
            modified=node.modified,
            mime_type=mime_type(path, node.binary),
        )
        if node.binary:
            return meta
        lines = split_lines(data.decode("utf-8"))
        first, chosen = select_lines(lines, req)
        chosen, truncated = cap(chosen, limits)
        return msgspec.structs.replace(
            meta,
            content=number(chosen, first) if req.line_numbers else "".join(chosen),
            binary=False,
            total_lines=len(lines),
            returned_lines=len(chosen),
            start_line=first if chosen else 0,
            truncated=truncated,
        )

    async def read_bytes(self, ws: WorkspaceRow, version: int, req: rq.ReadBytes) -> rp.FileBytes:
        path = normalize(req.path)
        node, data = await self._content(ws, path, version)
        if node.kind != "f":
            raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {display(path)}", {"path": path})
        length = min(
            req.length if req.length is not None else ws.limits.max_read_bytes,
            ws.limits.max_read_bytes,
        )
        chunk = data[req.offset : req.offset + length]
        return rp.FileBytes(
            path=path,
            data=chunk,
            offset=req.offset,
            size=node.size,
            truncated=req.offset + len(chunk) < node.size,
            file_version=node.file_version or 0,
            etag=etag_of(node.file_version or 0),
        )

    async def list(self, ws: WorkspaceRow, version: int, req: rq.ListDirectory) -> rp.Listing:
        path = normalize(req.path)
        node = await self._node(ws, path, version, what="Directory")
        if node.kind != "d":
            raise QuillError(ErrorCode.NOT_A_DIRECTORY, f"Not a directory: {path}", {"path": path})
        limit = min(req.limit or ws.limits.max_directory_entries, ws.limits.max_directory_entries)
        kind = None if req.kind == "any" else req.kind[0]
        scope = Scope(path, req.recursive, kind, req.prefix)
        after = cursor_of(req.after) if req.after is not None else None
        nodes = await self.model.page(ws.id, version, scope, after, limit + 1)
        more = len(nodes) > limit
        nodes = nodes[:limit]
        if more or after is not None:
            total = await self.model.count(ws.id, version, scope)
        else:
            total = len(nodes)
        last = nodes[-1] if more else None
        return rp.Listing(
            path=display(path),
            entries=[entry(n) for n in nodes],
            total=total,
            truncated=more,
            next=f"{last.kind}:{last.path}" if last is not None else None,
        )

    async def stat(self, ws: WorkspaceRow, version: int, req: rq.StatPath) -> rp.FileInfo:
        path = normalize(req.path)
        node = await self._node(ws, path, version, what="Path")
        if node.kind == "d":
            count = await self.model.count(ws.id, version, Scope(path))
            return rp.FileInfo(
                path=display(path),
                kind="directory",
                size=0,
                file_version=None,
                etag=None,
                sha256=None,
                binary=False,
                mime_type=None,
                permissions="755",
                created=node.created,
                modified=node.modified,
                changed_version=node.version,
                entries=count,
            )
        return rp.FileInfo(
            path=path,
            kind="file",
            size=node.size,
            file_version=node.file_version,
            etag=etag_of(node.file_version or 0),
            sha256=node.sha256,
            binary=node.binary,
            mime_type=mime_type(path, node.binary),
            permissions="755" if node.executable else "644",
            created=node.created,
            modified=node.modified,
            changed_version=node.version,
            entries=None,
        )

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
                )
                for r in rows[: req.limit]
            ]
            return rp.HistoryPage(path=None, revisions=revisions, truncated=len(rows) > req.limit)
        path = normalize(req.path)
        rows = await self.model.path_history(ws.id, path, upto, req.limit + 1)
        out: list[rp.Revision] = []
        newer: Node | None = None
        for i, (node, made, ended) in enumerate(rows[: req.limit]):
            if node.until <= upto and ended and (newer is None or newer.version != node.until):
                out.append(
                    rp.Revision(
                        version=node.until,
                        at=datetime.fromisoformat(ended[0]),
                        op=ended[1],
                        actor=ended[2],
                        request_id=ended[3],
                        change="deleted",
                        kind=_kind(node),
                    )
                )
            older = rows[i + 1][0] if i + 1 < len(rows) else None
            if node.moved_from:
                change = "moved"
            elif older is not None and older.until == node.version and older.kind == node.kind:
                change = "modified"
            else:
                change = "created"
            is_file = node.kind == "f"
            out.append(
                rp.Revision(
                    version=node.version,
                    at=datetime.fromisoformat(made[0]),
                    op=made[1],
                    actor=made[2],
                    request_id=made[3],
                    change=change,
                    kind=_kind(node),
                    size=node.size if is_file else None,
                    sha256=node.sha256,
                    file_version=node.file_version,
                    etag=etag_of(node.file_version) if node.file_version else None,
                    moved_from=node.moved_from,
                )
            )
            newer = node
        return rp.HistoryPage(path=path, revisions=out, truncated=len(rows) > req.limit)

    async def info(
        self, ws: WorkspaceRow, version: int, req: rq.WorkspaceInfoQuery
    ) -> rp.WorkspaceInfo:
        files, dirs, size = await self.model.totals(ws.id, version)
        event = (await self.model.events(ws.id, version - 1, version, 1))[0]
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
            capabilities=CAPABILITIES,
            files=files,
            directories=dirs,
            total_bytes=size,
            tree_hash=event[11],
            last_hash=event[9],
        )

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
            )
            for r in rows[: req.limit]
        ]
        last = events[-1].version if events else req.after
        return rp.EventPage(events=events, next_after=last, has_more=len(rows) > req.limit)


def _kind(node: Node) -> rp.Kind:
    return "file" if node.kind == "f" else "directory"
