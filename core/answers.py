"""What a query answers, given the nodes and contents it found: pure functions, no I/O.

The reader calls them over its projection (``queries``), a bridge over a local folder
(``services/bridge``), so that both answer ``read``, ``read_bytes``, ``list`` and ``stat`` alike,
errors included.
"""

from __future__ import annotations

import functools
import mimetypes
from datetime import datetime

import msgspec

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import Limits
from contracts.paths import display, name, not_found
from core.content import split_lines
from core.rows import Node
from core.tree import etag_of
from core.window import cap, window


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


@functools.lru_cache(maxsize=4096)
def mime_type(path: str, binary: bool) -> str:
    """The media type of ``path`` by its name (cached: ``guess_type`` parses the name as a URL
    first, a noticeable part of a small read)."""
    guess, _ = mimetypes.guess_type(path)
    return guess or ("application/octet-stream" if binary else "text/plain")


def missing(path: str, what: str = "File") -> QuillError:
    """``FILE_NOT_FOUND`` for ``path`` (``paths.not_found``: ``INVALID_ARGUMENT`` for a name
    the rule refuses); ``what`` is ``File``, ``Directory`` or ``Path``."""
    return not_found(path, what)


def not_a_directory(path: str) -> QuillError:
    return QuillError(ErrorCode.NOT_A_DIRECTORY, f"Not a directory: {path}", {"path": path})


def not_a_file(path: str) -> QuillError:
    return QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {display(path)}", {"path": path})


def directory_content(
    path: str, modified: datetime, children: list[Node], total: int
) -> rp.FileContent:
    """What ``read`` answers for a directory: the first page of its children, one a line."""
    names = [name(c.path) + ("/" if c.kind == "d" else "") + "\n" for c in children]
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
        modified=modified,
        mime_type=None,
    )


def file_content(
    path: str, node: Node, data: bytes, req: rq.ReadFile, limits: Limits
) -> rp.FileContent:
    """What ``read`` answers for the file ``node`` holding ``data``.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a bad combination of head/tail/offset/limit.
    """
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
    shown = cap(window(lines, req), limits)
    chosen = shown.lines
    return msgspec.structs.replace(
        meta,
        content=number(chosen, shown.first) if req.line_numbers else "".join(chosen),
        binary=False,
        total_lines=len(lines),
        returned_lines=len(chosen),
        start_line=shown.first if chosen else 0,
        truncated=shown.cut is not None,
        start_char=shown.start_char,
        end_char=shown.end_char,
        cut=shown.cut,
    )


def read_length(req: rq.ReadBytes, limits: Limits) -> int:
    """Bytes a ``read_bytes`` returns at most."""
    wanted = req.length if req.length is not None else limits.max_read_bytes
    return min(wanted, limits.max_read_bytes)


def file_bytes(path: str, node: Node, chunk: bytes, offset: int) -> rp.FileBytes:
    """What ``read_bytes`` answers: ``chunk``, the bytes of ``node`` from ``offset``."""
    return rp.FileBytes(
        path=path,
        data=chunk,
        offset=offset,
        size=node.size,
        truncated=offset + len(chunk) < node.size,
        file_version=node.file_version or 0,
        etag=etag_of(node.file_version or 0),
    )


def listing(path: str, nodes: list[Node], limit: int, total: int) -> rp.Listing:
    """A page of ``list`` from the entries found for it: up to ``limit + 1`` (one more than
    the page holds when another page follows)."""
    more = len(nodes) > limit
    page = nodes[:limit]
    last = page[-1] if more else None
    return rp.Listing(
        path=display(path),
        entries=[entry(n) for n in page],
        total=total,
        truncated=more,
        next=f"{last.kind}:{last.path}" if last is not None else None,
    )


def file_info(path: str, node: Node, entries: int | None) -> rp.FileInfo:
    """What ``stat`` answers for ``node`` (``entries``: a directory's direct entries)."""
    if node.kind == "d":
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
            entries=entries,
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
