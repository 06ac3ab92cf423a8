"""A workspace's reads: files (``read``, ``read_text``, ``list``...), search (``glob``,
``grep``, ``explore``), ``diff``, history and the workspace's own state, and what streams
from it (``watch``, ``audit``). Each query reads the workspace as of the highest version its
client has seen, or later (read-your-writes: ``quill/_handle.py``).

Why apart from ``quill/workspace.py``: ``Workspace`` is one public class, written in two
modules (its reads here, its commands there) to keep each one readable.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Literal

from contracts import codec
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import AuditRecord, WorkspaceUpdated
from quill import _transport
from quill._handle import Handle


class Reads(Handle):
    """The queries of a workspace (``Workspace`` has them all)."""

    # ------------------------------------------------------------------ queries
    async def read(
        self,
        path: str,
        *,
        offset: int | None = None,
        limit: int | None = None,
        head: int | None = None,
        tail: int | None = None,
        line_numbers: bool = False,
        char_offset: int = 0,
        version: int | None = None,
    ) -> rp.FileContent:
        """One read of ``path``: the lines asked for (all, ``head``, ``tail``, or ``offset``/
        ``limit``), up to the read limits. A read limit may return less than asked: then
        ``truncated`` is true and ``cut`` names what is left out and the read that returns it
        (``read_text`` reads a whole file)."""
        body = rq.ReadFile(
            path=path,
            offset=offset,
            limit=limit,
            head=head,
            tail=tail,
            line_numbers=line_numbers,
            char_offset=char_offset,
            version=version,
        )
        return await self._qry(body)

    async def read_text(self, path: str, *, version: int | None = None) -> str:
        """The whole text of a file, however long (files are at most ``max_file_bytes``):
        past the read limits, the rest is fetched chunk by chunk at the same version.

        Raises:
            QuillError: ``NOT_A_FILE`` for a directory, ``INVALID_ENCODING`` for a binary
                file, or the read's error.
        """
        body = rq.ReadFile(path=path, version=version)
        at, result = await self._qry_at(body)
        if result.kind != "file":
            raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {path}", {"path": path})
        if result.content is None:
            raise QuillError(
                ErrorCode.INVALID_ENCODING, "File contains invalid UTF-8 encoding", {"path": path}
            )
        if not result.truncated:
            return result.content
        shown = result.content.encode()  # the file's first bytes: the rest follows them
        rest = await self._bytes_from(path, len(shown), version or at)
        try:
            return (shown + rest).decode("utf-8")
        except UnicodeDecodeError:  # not the same file: it changed between the two reads
            raise QuillError(
                ErrorCode.INVALID_ENCODING, "File contains invalid UTF-8 encoding", {"path": path}
            ) from None

    async def read_bytes(self, path: str, *, version: int | None = None) -> bytes:
        """The whole content of any file, fetched chunk by chunk at one version."""
        return await self._bytes_from(path, 0, version)

    async def _bytes_from(self, path: str, offset: int, version: int | None) -> bytes:
        """The bytes of ``path`` from ``offset`` to its end, chunk by chunk at one version
        (``version``, or the first chunk's)."""
        chunks: list[bytes] = []
        pinned = version
        while True:
            body = rq.ReadBytes(path=path, offset=offset, version=pinned)
            at, chunk = await self._qry_at(body)
            pinned = pinned or at
            chunks.append(chunk.data)
            offset += len(chunk.data)
            if not chunk.truncated or not chunk.data:
                return b"".join(chunks)

    async def list(
        self,
        path: str = ".",
        *,
        recursive: bool = False,
        kind: Literal["file", "directory", "any"] = "any",
        prefix: str = "",
        after: str | None = None,
        limit: int | None = None,
        version: int | None = None,
    ) -> rp.Listing:
        """One page of a directory's entries (``recursive``: everything beneath it, by path);
        pass the result's ``next`` as ``after`` for the next page, or use ``list_all``."""
        return (await self._list(path, recursive, kind, prefix, after, limit, version))[1]

    async def list_all(
        self,
        path: str = ".",
        *,
        recursive: bool = False,
        kind: Literal["file", "directory", "any"] = "any",
        prefix: str = "",
        after: str | None = None,
        version: int | None = None,
    ) -> AsyncIterator[rp.Entry]:
        """Every entry (after ``after``), page after page, all as of one version (the first
        page's, unless ``version`` is given), so that writes meanwhile do not shift pages."""
        while True:
            at, page = await self._list(path, recursive, kind, prefix, after, None, version)
            for e in page.entries:
                yield e
            if page.next is None:
                return
            after, version = page.next, version or at

    async def _list(
        self,
        path: str,
        recursive: bool,
        kind: Literal["file", "directory", "any"],
        prefix: str,
        after: str | None,
        limit: int | None,
        version: int | None,
    ) -> tuple[int, rp.Listing]:
        body = rq.ListDirectory(
            path=path,
            recursive=recursive,
            kind=kind,
            prefix=prefix,
            after=after,
            limit=limit,
            version=version,
        )
        return await self._qry_at(body)

    async def stat(self, path: str = ".", *, version: int | None = None) -> rp.FileInfo:
        return await self._qry(rq.StatPath(path=path, version=version))

    async def glob(
        self,
        pattern: str,
        path: str = ".",
        *,
        kind: Literal["file", "directory", "any"] = "any",
        max_results: int | None = None,
        exclude: Sequence[str] | None = None,
        version: int | None = None,
    ) -> rp.Matches:
        body = rq.GlobQuery(
            pattern=pattern,
            path=path,
            kind=kind,
            max_results=max_results,
            exclude=None if exclude is None else list(exclude),
            version=version,
        )
        return await self._qry(body)

    async def grep(
        self,
        pattern: str,
        path: str = ".",
        *,
        literal: bool = False,
        ignore_case: bool = False,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        context_lines: int = 0,
        max_results: int | None = None,
        version: int | None = None,
    ) -> rp.GrepResult:
        body = rq.GrepQuery(
            pattern=pattern,
            path=path,
            literal=literal,
            ignore_case=ignore_case,
            include=None if include is None else list(include),
            exclude=None if exclude is None else list(exclude),
            context_lines=context_lines,
            max_results=max_results,
            version=version,
        )
        return await self._qry(body)

    async def explore(
        self,
        path: str = ".",
        *,
        recursive: bool = False,
        max_depth: int = 3,
        exclude: Sequence[str] | None = None,
        metadata: bool = False,
        max_results: int | None = None,
        version: int | None = None,
    ) -> rp.Tree:
        body = rq.ExploreQuery(
            path=path,
            recursive=recursive,
            max_depth=max_depth,
            exclude=None if exclude is None else list(exclude),
            metadata=metadata,
            max_results=max_results,
            version=version,
        )
        return await self._qry(body)

    async def diff(
        self,
        from_version: int,
        to_version: int | None = None,
        path: str | None = None,
        *,
        context_lines: int = 3,
        from_workspace: str | None = None,
    ) -> rp.Diff:
        """Unified diff between two versions; ``from_workspace`` (a workspace of the same
        tenant, by name): from its ``from_version`` to this one's ``to_version``."""
        body = rq.DiffQuery(
            from_version=from_version,
            to_version=to_version,
            path=path,
            context_lines=context_lines,
            from_workspace=from_workspace,
        )
        return await self._qry(body)

    async def forks(self, *, limit: int = 100) -> rp.ForkList:
        """The workspaces forked from this one: the version each was forked at, and how many
        versions each side has moved on since."""
        return await self._qry(rq.ForksQuery(limit=limit))

    async def history(
        self,
        path: str | None = None,
        *,
        limit: int = 100,
        before: int | None = None,
        follow: bool = False,
    ) -> rp.HistoryPage:
        """Revisions of ``path`` (or the workspace's events), newest first; ``follow``: across
        the moves that brought the file to ``path`` (page on with ``before`` and the page's
        ``next_path``)."""
        body = rq.History(path=path, limit=limit, before=before, follow=follow)
        return await self._qry(body)

    async def info(self, *, version: int | None = None) -> rp.WorkspaceInfo:
        body = rq.WorkspaceInfoQuery(version=version)
        return await self._qry(body)

    async def events(self, *, after: int = 0, limit: int = 100) -> rp.EventPage:
        body = rq.EventsQuery(after=after, limit=limit)
        return await self._qry(body)

    async def tree(
        self,
        *,
        after: str | None = None,
        limit: int = 1000,
        contents: bool = True,
        version: int | None = None,
        changed_from: int | None = None,
    ) -> rp.TreePage:
        """One page of the whole tree as of ``version`` (default: the replica's latest, which
        the first page's ``head`` names: pass it as ``version`` with ``after`` for the rest).
        ``changed_from``: only the entries of the paths changed between that version and
        ``version`` (``TreePage.changed``), the replica having applied both."""
        body = rq.TreeQuery(
            after=after,
            limit=limit,
            contents=contents,
            version=version,
            changed_from=changed_from,
            min_version=changed_from,
        )
        return await self._qry(body)

    # ------------------------------------------------------------------ streams
    async def watch(self, *, wait: bool = False) -> AsyncIterator[WorkspaceUpdated]:
        """``workspace.updated`` notifications, as they are published.

        A workspace that does not exist fails like every other call on it, once the
        subscription is confirmed (nothing created meanwhile is missed); with ``wait``, the
        watch waits for it instead: its creation is the first notification.

        Raises:
            QuillError: ``WORKSPACE_NOT_FOUND`` (without ``wait``), ``ACCESS_DENIED`` when the
                server refuses the subscription (another tenant's workspace), ``UNAVAILABLE``
                if it cannot be confirmed.
        """
        subject = self.client.subjects.updated(self.tenant, self.name)
        sub = await _transport.subscribe_confirmed(self.client.nc, subject, self.client.timeout)
        try:
            if not wait:
                await self.stat(".")  # WORKSPACE_NOT_FOUND, as any call on it answers
            async for msg in sub.messages:
                yield codec.decode(msg.data, WorkspaceUpdated)
        finally:
            await sub.unsubscribe()

    async def audit(
        self, *, since: datetime | None = None, follow: bool = False
    ) -> AsyncIterator[AuditRecord]:
        """Audit records from WS_AUDIT (oldest first); with ``follow``, keep waiting."""
        subject = self.client.subjects.audit(self.tenant, self.name)
        records = _transport.audit_records(self.client.nc, subject, since=since, follow=follow)
        async with contextlib.aclosing(records):
            async for record in records:
                yield record
