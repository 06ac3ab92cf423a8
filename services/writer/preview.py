"""What an approver sees of a change before deciding it: a unified diff of the change set a
command on a restricted workspace would commit, decided against the state it was asked at.

The diff is built from the change set (new contents as decided: already redacted by the
decider) and the files it replaces (as committed, read through the writer's contents), then
passed through the secrets registry again (an old file may hold a secret registered since it
was written), and cut at ``PREVIEW_MAX_BYTES``. A binary or large file is named, not shown.
A file's diff runs where ``diff`` says (the writer's: a worker process, ``infra/offload.py``)
unless it is small enough to cost nothing (``INLINE_LINES``); one that takes longer than
``PREVIEW_BUDGET_S`` is named, not shown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from contracts.errors import QuillError
from contracts.events import AnyChange, MakeDir, PutFile, Remove
from contracts.limits import PREVIEW_MAX_BYTES
from core.content import as_text
from core.diffs import Pair, unified
from core.secrets import Secrets
from core.tree import FileNode, Tree

SHOWN_MAX_BYTES = 256 * 1024
"""A file larger than this (on either side) is named in the preview, not diffed."""

Fetch = Callable[[str], Awaitable[bytes | None]]
"""A committed content by sha256 (None: not available)."""
Diff = Callable[[list[Pair]], Awaitable[list[str]]]
"""Diffs files (``core.diffs.unified_many``), where the caller runs it."""
PREVIEW_BUDGET_S = 2.0
"""How long one file's diff may take in a preview."""
INLINE_LINES = 10_000
"""A file whose lines before times lines after are at most this is diffed in place (no more
than ``difflib``'s quadratic worst case on that)."""


async def preview(
    changes: list[AnyChange], tree: Tree, fetch: Fetch, secrets: Secrets, diff: Diff
) -> str:
    """The diff ``changes`` would make to ``tree`` (the state before them)."""
    moved = {c.moved_from for c in changes if isinstance(c, PutFile) and c.moved_from}
    out: list[str] = []
    used = 0
    async for part in _parts(changes, tree, fetch, moved, diff):
        if used + len(part) > PREVIEW_MAX_BYTES:
            out.append("... the rest is not shown (the preview is cut at 32 KiB)\n")
            break
        out.append(part)
        used += len(part)
    text, _ = secrets.redact("".join(out))
    return text


async def _parts(
    changes: list[AnyChange], tree: Tree, fetch: Fetch, moved: set[str], diff: Diff
) -> AsyncIterator[str]:
    for change in changes:
        path = change.path
        if isinstance(change, MakeDir):
            yield f"new directory {path}/\n"
        elif isinstance(change, Remove):
            if path in moved or any(m.startswith(f"{path}/") for m in moved):
                continue  # the source of a move: its files are shown as renamed
            if path in tree.files:
                yield await _file(path, tree.files[path], None, fetch, diff)
                continue
            yield f"deleted directory {path}/\n"
            for below in tree.walk(path):
                if below in tree.files:
                    yield await _file(below, tree.files[below], None, fetch, diff)
        elif isinstance(change, PutFile):
            old = tree.files.get(path)
            if change.moved_from:
                yield f"renamed {change.moved_from} -> {path}\n"
                if old is None:
                    continue  # the same content under a new name
            yield await _file(path, old, change, fetch, diff)


async def _file(
    path: str, old: FileNode | None, new: PutFile | None, fetch: Fetch, diff: Diff
) -> str:
    """One file's part: its diff, or a line naming it when it cannot be shown."""
    if old is not None and new is not None and old.sha256 == new.sha256:
        return "" if old.executable == new.executable else f"mode changed {path}\n"
    before = None if old is None else await _text(old.sha256, old.size, old.binary, fetch)
    if new is None:
        after = None
    elif new.text is not None and len(new.text) <= SHOWN_MAX_BYTES:
        after = new.text
    else:
        after = await _text(new.sha256, new.size, new.binary or new.text is not None, fetch)
    if (old is not None and before is None) or (new is not None and after is None):
        verb = "deleted" if new is None else "new file" if old is None else "modified"
        sizes = [f"{n.size} bytes" for n in (old, new) if n is not None]
        binary = any(n is not None and n.binary for n in (old, new))
        return f"{verb} {path} ({' -> '.join(sizes)}, {'binary' if binary else 'not shown'})\n"
    if (before or "").count("\n") * (after or "").count("\n") <= INLINE_LINES:
        return unified(path, before, after)
    try:
        return (await diff([(path, before, after)]))[0]
    except QuillError as exc:  # too large to diff in time, or the tenant busy
        return f"{path}: not shown ({exc.message})\n"


async def _text(sha256: str, size: int, unshown: bool, fetch: Fetch) -> str | None:
    """A committed file's text; None when it is not shown (binary, too large, missing)."""
    if unshown or size > SHOWN_MAX_BYTES:
        return None
    data = await fetch(sha256)
    return None if data is None else as_text(data)
