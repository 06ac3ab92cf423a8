"""One file of a workspace as RFC 0059's WorkspaceFile, read whole and at a file version,
and the workspace's files as the list's metadata (a WorkspaceFile without ``content``).

Everything here goes through the SDK; a read past the read limits fetches the bytes chunk by
chunk at one pinned workspace version, so content and metadata always agree.
"""

from __future__ import annotations

import logging
import mimetypes
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.responses import JSONResponse

from contracts import replies as rp
from contracts.errors import ErrorCode as E
from contracts.errors import QuillError
from quill.client import Workspace

log = logging.getLogger("quill.gateway")


def content_type(path: str) -> str:
    guess, _ = mimetypes.guess_type(path)
    return guess or "text/plain"


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Snapshot:
    """One version of a file, as a WorkspaceFile shows it."""

    path: str
    content: str
    mime: str
    file_version: int
    etag: str
    modified: datetime

    def response(self, status: int = 200) -> JSONResponse:
        body = {
            "path": self.path,
            "content": self.content,
            "contentType": self.mime,
            "version": self.file_version,
            "etag": self.etag,
            "updatedAt": iso(self.modified),
        }
        return JSONResponse(body, status_code=status, headers={"ETag": f'"{self.etag}"'})


async def read_whole(ws: Workspace, path: str, version: int | None) -> Snapshot:
    """The whole text of ``path`` as of workspace ``version`` (default: latest), past the read
    limits, with metadata of that same version.

    Raises:
        QuillError: ``FILE_NOT_FOUND``, ``NOT_A_FILE``, ``INVALID_ENCODING`` (binary).
    """
    r = await ws.read(path, version=version)
    if r.kind != "file" or r.file_version is None or r.etag is None:
        raise QuillError(E.NOT_A_FILE, f"Not a file: {path}", {"path": path})
    if r.content is None:
        raise QuillError(E.INVALID_ENCODING, "File contains invalid UTF-8 encoding")
    if not r.truncated:
        return Snapshot(
            path, r.content, r.mime_type or content_type(path), r.file_version, r.etag, r.modified
        )
    if version is None:  # pin one version for the metadata and every chunk
        info = await ws.stat(path)
        if info.file_version is None or info.etag is None:
            raise QuillError(E.NOT_A_FILE, f"Not a file: {path}", {"path": path})
        version = info.changed_version
        meta = (info.mime_type, info.file_version, info.etag, info.modified)
    else:
        meta = (r.mime_type, r.file_version, r.etag, r.modified)
    data = await ws.read_bytes(path, version=version)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise QuillError(E.INVALID_ENCODING, "File contains invalid UTF-8 encoding") from None
    mime, file_version, etag, modified = meta
    return Snapshot(path, text, mime or content_type(path), file_version, etag, modified)


async def version_of(ws: Workspace, path: str, file_version: int) -> int:
    """The workspace version at which ``path`` got ``file_version``.

    Raises:
        QuillError: ``FILE_NOT_FOUND`` if the file never had that version.
    """
    before: int | None = None
    while True:
        page = await ws.history(path, limit=1000, before=before)
        for rev in page.revisions:
            if rev.file_version == file_version:
                return rev.version
            if rev.file_version is not None and rev.file_version < file_version:
                break  # newest first: it is behind us
        else:
            if page.truncated and page.revisions:
                before = page.revisions[-1].version
                continue
        raise QuillError(E.FILE_NOT_FOUND, f"No version {file_version} of {path}", {"path": path})


def metadata(e: rp.Entry) -> dict[str, Any]:
    """A listed file as the list shows it: the WorkspaceFile's fields but ``content``."""
    return {
        "path": e.path,
        "contentType": content_type(e.path),
        "version": e.file_version,
        "etag": e.etag,
        "updatedAt": iso(e.modified),
    }


async def entries(
    ws: Workspace, prefix: str = "", *, after: str | None = None, version: int | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The metadata of the files whose path starts with ``prefix``, by path, after the path
    ``after``, all as of one workspace version (``version``, or the latest when it starts),
    fetched a page at a time: none when the prefix names no directory."""
    directory, _, rest = prefix.rpartition("/")
    try:
        async for e in ws.list_all(
            directory or ".",
            recursive=True,
            kind="file",
            prefix=rest,
            after=None if after is None else f"f:{after}",
            version=version,
        ):
            yield metadata(e)
    except QuillError as error:
        if error.code not in (E.FILE_NOT_FOUND, E.NOT_A_DIRECTORY):
            raise


async def listing(
    ws: Workspace,
    prefix: str = "",
    *,
    after: str | None = None,
    limit: int,
    version: int | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """At most ``limit`` of ``entries``, and whether more follow."""
    files: list[dict[str, Any]] = []
    async for file in entries(ws, prefix, after=after, version=version):
        if len(files) == limit:
            return files, True
        files.append(file)
    return files, False
