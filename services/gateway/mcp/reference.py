"""MCP at ``/mcp``: what the reference filesystem server (modelcontextprotocol/servers,
``src/filesystem``) offers and the workspace tool did not, as rows of ``table`` served by
existing ops: ``read_multiple_files`` (reads), ``read_media_file`` (a stat and the bytes, as
MCP image or audio content), ``directory_tree`` (an explore, as nested JSON),
``list_directory_with_sizes`` (a listing page) and ``edit_file``'s several edits and dry run
(``edits``: a stat, the bytes, the edits applied here, one conditional write).

Several edits are one write with ``if_match`` the etag the file had when read: all of them or
none, one event, and a file changed in between is a ``CONFLICT`` rather than a lost update.
A single edit without ``dry_run`` stays the ``cmd.edit`` op it always was.

Size: four tools and an edit mode, each a few small functions and its row; they are one
module because they are one thing (the reference server's set, read against it together),
and each part is short enough that splitting would only scatter the rows from their bodies.
"""

from __future__ import annotations

import base64
import json
import mimetypes
from typing import Annotated, Any, Literal

from mcp.types import AudioContent, ImageContent
from pydantic import Field, WithJsonSchema

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from core.content import as_text
from core.diffs import unified
from core.matches import multiple_matches, no_match
from core.words import plural
from quill.client import Workspace
from services.gateway.mcp import texts
from services.gateway.mcp.engine import Done, text_read
from services.gateway.mcp.schemas import obj, shape
from services.gateway.mcp.table import READ_ONLY, Arg, Args, Tool, described, workspace_arg

MAX_FILES = 50
"""Most paths one ``read_multiple_files`` call takes."""
MAX_READ_TOTAL = 1024 * 1024
"""Most characters of file text one ``read_multiple_files`` answer holds."""
MAX_MEDIA_BYTES = 4 * 1024 * 1024
"""Largest file ``read_media_file`` returns (its base64 is a third larger)."""
MAX_TREE_ENTRIES = 2000
"""Most entries one ``directory_tree`` answer holds."""
PER_FILE = (
    ErrorCode.FILE_NOT_FOUND,
    ErrorCode.NOT_A_FILE,
    ErrorCode.INVALID_ENCODING,
    ErrorCode.ACCESS_DENIED,  # a path outside /workspace
    ErrorCode.INVALID_ARGUMENT,  # a malformed path
)
"""Errors ``read_multiple_files`` reports for one file and goes on."""

WS = workspace_arg()
DIR = Arg("path", described(str, "Directory path relative to /workspace; . is the root"), ".")
Excluded = Annotated[
    list[str] | None, Field(description="Glob patterns to skip (default: .git...)")
]


# ---------------------------------------------------------------- read_multiple_files


async def read_many(ws: Workspace, a: Args) -> dict[str, Any]:
    """Each of ``a.paths`` read as ``read_file`` reads it; a file that cannot be read is
    reported and the others read."""
    files: list[dict[str, Any]] = []
    left = MAX_READ_TOTAL
    for path in a.paths:
        if left <= 0:
            message = "Not read: this answer holds 1 MiB of text; read it with read_file"
            files.append({"path": path, "error": message, "code": ErrorCode.SIZE_LIMIT_EXCEEDED})
            continue
        try:
            r = text_read(await ws.read(path), path)
        except QuillError as exc:
            if exc.code not in PER_FILE:
                raise
            text = texts.error_text("read_file", exc, path, "")
            files.append({"path": path, "error": text.removeprefix("Error: "), "code": exc.code})
            continue
        shown = texts.read_text(r)
        left -= len(shown)
        files.append({"path": path, "content": shown, "truncated": r.truncated, "etag": r.etag})
    return {"files": files}


def many_text(a: Args, data: dict[str, Any]) -> str:
    """The reference server's form: ``path:`` and the text, or ``path: Error - ...``, each
    file apart by ``---``."""
    parts = [
        f"{f['path']}:\n{f['content']}" if "content" in f else f"{f['path']}: Error - {f['error']}"
        for f in data["files"]
    ]
    return "\n---\n".join(parts)


# ---------------------------------------------------------------- read_media_file


def media_type(path: str, info: rp.FileInfo) -> str:
    """The MIME type of an image or audio file.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for any other file.
    """
    guessed = mimetypes.guess_type(path)[0]
    mime = guessed or info.mime_type or "application/octet-stream"
    if not mime.startswith(("image/", "audio/")):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Not an image or audio file: {path} ({mime}); read_file reads text",
            {"path": path, "mime_type": mime},
        )
    return mime


def too_large(path: str, size: int) -> QuillError:
    return QuillError(
        ErrorCode.SIZE_LIMIT_EXCEEDED,
        f"{path} has {size} bytes: read_media_file returns at most {MAX_MEDIA_BYTES}",
        {"path": path, "size": size, "limit": MAX_MEDIA_BYTES},
    )


async def read_media(ws: Workspace, a: Args) -> Done:
    """The file as MCP image or audio content, with its metadata as structured content.

    Raises:
        QuillError: ``NOT_A_FILE``, ``INVALID_ARGUMENT`` (not an image or audio file),
            ``SIZE_LIMIT_EXCEEDED``; what reading raises.
    """
    info = await ws.stat(a.path)
    if info.kind == "directory":
        raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {a.path}", {"path": a.path})
    mime = media_type(a.path, info)
    if info.size > MAX_MEDIA_BYTES:
        raise too_large(a.path, info.size)
    data = await ws.read_bytes(a.path)
    if len(data) > MAX_MEDIA_BYTES:  # replaced by a larger one since the stat
        raise too_large(a.path, len(data))
    encoded = base64.b64encode(data).decode()
    block: ImageContent | AudioContent
    if mime.startswith("image/"):
        block = ImageContent(type="image", data=encoded, mime_type=mime)
    else:
        block = AudioContent(type="audio", data=encoded, mime_type=mime)
    meta = {"path": info.path, "mime_type": mime, "size": len(data), "etag": info.etag}
    return Done(f"{info.path} ({mime}, {len(data)} bytes)", meta, (block,))


# ---------------------------------------------------------------- directory_tree


def nested(r: rp.Tree) -> list[dict[str, Any]]:
    """An explore's entries (depth-first, directories first) as ``[{name, type, children}]``."""
    top: list[dict[str, Any]] = []
    open_dirs: dict[str, list[dict[str, Any]]] = {}
    for e in r.entries:
        parent, _, name = e.path.rpartition("/")
        node: dict[str, Any] = {"name": name, "type": e.kind}
        if e.kind == "directory":
            node["children"] = open_dirs[e.path] = []
        open_dirs.get(parent, top).append(node)
    return top


def tree_data(a: Args, r: rp.Tree) -> dict[str, Any]:
    return {"path": r.path, "tree": nested(r), "total": r.total, "truncated": r.truncated}


def tree_text(a: Args, r: rp.Tree) -> Done:
    data = tree_data(a, r)
    text = json.dumps(data["tree"], separators=(",", ":"))
    if r.truncated:
        text += (
            f"\n(showing {len(r.entries)} of {r.total} entries: lower max_depth or show a "
            "subdirectory)"
        )
    return Done(text, data)


# ---------------------------------------------------------------- list_directory_with_sizes


def sized_text(a: Args, r: rp.Listing) -> str:
    """``[DIR]``/``[FILE]`` lines with file sizes, sorted by name or size, and the totals."""
    if not r.entries:
        return f"Directory is empty: {a.path}"
    entries = sorted(
        r.entries, key=lambda e: (-e.size, e.name) if a.sort_by == "size" else (e.name, 0)
    )
    width = max(len(e.name) for e in entries)
    lines = [
        f"[DIR]  {e.name}"
        if e.kind == "directory"
        else f"[FILE] {e.name.ljust(width)}  {texts.size_text(e.size).rjust(10)}"
        for e in entries
    ]
    files = [e for e in r.entries if e.kind == "file"]
    dirs = len(r.entries) - len(files)
    lines += [
        "",
        f"Total: {plural(len(files), 'file')}, {plural(dirs, 'directory')}",
        f"Combined size: {texts.size_text(sum(e.size for e in files))}",
    ]
    if r.truncated:
        lines.append(
            f"(this page shows {len(r.entries)} of the {r.total} entries, sorted within it: "
            f'call again with after="{r.next}" for the next page)'
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- edit_file: several edits


def one_edit(path: str, text: str, edit: dict[str, Any], n: int, of: int) -> tuple[str, int]:
    """``text`` with one edit applied, and how many replacements it made.

    Raises:
        QuillError: ``INVALID_ARGUMENT``, ``NO_MATCH`` or ``MULTIPLE_MATCHES``, saying which
            edit (when there are several).
    """
    old, new = edit.get("old_string"), edit.get("new_string")
    every = bool(edit.get("replace_all", False))
    which = f"Edit {n} of {of}: " if of > 1 else ""
    if not isinstance(old, str) or not old or not isinstance(new, str):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, f"{which}old_string and new_string are required"
        )
    if old == new:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, f"{which}oldString and newString must be different"
        )
    first = text.find(old)
    if first < 0 or (not every and text.find(old, first + 1) >= 0):
        error = no_match(path, text, old) if first < 0 else multiple_matches(path, text, old)
        raise QuillError(error.code, which + error.message, {**error.details, "edit": n})
    count = text.count(old) if every else 1
    return text.replace(old, new, -1 if every else 1), count


async def edit_many(ws: Workspace, a: Args) -> Any:
    """``edit_file``: one edit through ``cmd.edit``; several, or a dry run, applied to the
    text read here and written back as one conditional write.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for edits given both ways (or neither); what the
            edits (``one_edit``), reading or writing raise.
    """
    single = a.old_string is not None and a.new_string is not None
    partial = (a.old_string is None) != (a.new_string is None)
    if partial or single == bool(a.edits):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, "Give old_string and new_string, or edits (not both)"
        )
    if single and not a.dry_run:
        return await ws.edit(a.path, a.old_string, a.new_string, replace_all=a.replace_all)
    edits = a.edits or [
        {"old_string": a.old_string, "new_string": a.new_string, "replace_all": a.replace_all}
    ]
    info = await ws.stat(a.path)
    if info.kind == "directory":
        raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {a.path}", {"path": a.path})
    before = as_text(await ws.read_bytes(a.path))
    if before is None:
        raise QuillError(ErrorCode.INVALID_ENCODING, "File contains invalid UTF-8 encoding")
    after, replacements = before, 0
    for n, edit in enumerate(edits, 1):
        after, count = one_edit(info.path, after, edit, n, len(edits))
        replacements += count
    diff = unified(info.path, before, after)
    data: dict[str, Any] = {
        "path": info.path,
        "edits": len(edits),
        "replacements": replacements,
        "dry_run": bool(a.dry_run),
        "diff": diff,
        "committed": False,
        "file_version": info.file_version,
        "etag": info.etag,
        "size": info.size,
    }
    if not a.dry_run and after != before:
        written = await ws.write(a.path, after, if_match=info.etag)
        data.update(
            committed=written.committed,
            file_version=written.file_version,
            etag=written.etag,
            size=written.size,
        )
    return data


def edit_text(a: Args, r: Any) -> str:
    """One edit: as ``edit_file`` always said; several or a dry run: what changed, and the
    unified diff."""
    if isinstance(r, rp.FileEdited):
        return texts.edited_text(a.path, r)
    what = f"{plural(r['edits'], 'edit')}, {plural(r['replacements'], 'replacement')}"
    if r["dry_run"]:
        head = f"Dry run: {what} would change {r['path']} as follows (nothing written):"
    elif not r["committed"]:
        return texts.unchanged_text(r["path"], "the edits", r["file_version"])
    else:
        head = f"Edited {r['path']}: {what} (file version {r['file_version']}):"
    return f"{head}\n{r['diff']}"


EDIT_OUTPUT = obj(
    {
        **shape(rp.FileEdited)["properties"],
        "edits": "integer",
        "dry_run": "boolean",
        "diff": "string",
    }
)
"""``edit_file``'s structured content: a ``FileEdited``, or (several edits, a dry run) the
same fields with the edits, the dry run and the diff."""
EDIT_ITEM = {
    "type": "object",
    "properties": {
        "old_string": {"type": "string", "minLength": 1},
        "new_string": {"type": "string"},
        "replace_all": {"type": "boolean", "default": False},
    },
    "required": ["old_string", "new_string"],
}
Edits = Annotated[
    list[dict[str, Any]] | None,
    WithJsonSchema({"type": "array", "items": EDIT_ITEM}),
    Field(
        max_length=100,
        description=(
            "Several edits, applied in order, all or none: [{old_string, new_string, replace_all}]"
        ),
    ),
]
EDIT_ARGS = (
    Arg("edits", Edits, None),
    Arg("dry_run", described(bool, "Answer the unified diff; change nothing"), False),
)


TOOLS = (
    Tool(
        "read_multiple_files",
        "qry.read",
        "Read several text files at once, each as read_file reads it: 'path:' and its text, "
        "files apart by ---. A file that cannot be read says why; the others are read.",
        (
            Arg("paths", Annotated[list[str], Field(min_length=1, max_length=MAX_FILES)]),
            WS,
        ),
        many_text,
        READ_ONLY,
        path=None,
        call=read_many,
        output=obj({"files": "array"}),
    ),
    Tool(
        "read_media_file",
        "qry.read_bytes",
        "Read an image or audio file (up to 4 MiB) as MCP image or audio content.",
        (Arg("path", described(str, "File path relative to /workspace")), WS),
        lambda a, done: done,
        READ_ONLY,
        call=read_media,
        output=obj({"path": "string", "mime_type": "string", "size": "integer", "etag": "string"}),
    ),
    Tool(
        "directory_tree",
        "qry.explore",
        "The tree under a directory as JSON [{name, type, children}], to max_depth (at most "
        f"{MAX_TREE_ENTRIES} entries; node_modules, .git... skipped unless exclude is []).",
        (
            DIR,
            Arg("max_depth", Annotated[int, Field(ge=1, le=20)], 3),
            Arg("exclude", Excluded, None),
            WS,
        ),
        tree_text,
        READ_ONLY,
        call=lambda ws, a: ws.explore(
            a.path,
            recursive=True,
            max_depth=a.max_depth,
            exclude=a.exclude,
            max_results=MAX_TREE_ENTRIES,
        ),
        output=obj({"path": "string", "tree": "array", "total": "integer", "truncated": "boolean"}),
    ),
    Tool(
        "list_directory_with_sizes",
        "qry.list",
        "List a directory with file sizes, sorted by name or size, and the totals.",
        (
            DIR,
            Arg("sort_by", Literal["name", "size"], "name"),
            Arg("after", Annotated[str | None, Field(min_length=1)], None),
            WS,
        ),
        sized_text,
        READ_ONLY,
        call=lambda ws, a: ws.list(a.path, after=a.after),
    ),
)
"""read_multiple_files, read_media_file, directory_tree, list_directory_with_sizes."""
