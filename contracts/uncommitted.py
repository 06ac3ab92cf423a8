"""Paths a command left in its sandbox that Quill did not commit, as the file tools tell them.

An executor records the set in the log (``ChangesCommitted.uncommitted``); the projections
keep, per workspace, ``path → (reason, by_command, version)``. A path the file tools do not
find but that set names is answered ``FILE_NOT_FOUND`` with why (``not_committed``), and
``details.uncommitted = {"reason", "by_command", "version"}``. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from contracts.errors import ErrorCode, QuillError
from contracts.events import AnyChange, ChangesCommitted, Remove, UncommittedPath
from contracts.paths import ancestors
from contracts.subjects import CHANGES_SUFFIX

MAX_PATHS = 1000
"""Paths recorded per command (a command making a million bad names records the first)."""
MAX_BYTES = 64 * 1024
"""Bytes of paths and reasons recorded per command."""


class Recorded(NamedTuple):
    """Why a path is not committed, the command that left it, the version that recorded it."""

    reason: str
    by_command: str
    version: int


def capped(paths: list[UncommittedPath]) -> list[UncommittedPath]:
    """``paths`` sorted by path, cut to ``MAX_PATHS`` and ``MAX_BYTES``."""
    out: list[UncommittedPath] = []
    used = 0
    for p in sorted(paths, key=lambda p: p.path):
        used += len(p.path.encode()) + len(p.reason.encode())
        if len(out) >= MAX_PATHS or used > MAX_BYTES:
            break
        out.append(p)
    return out


def clear(recorded: dict[str, Recorded], changes: list[AnyChange]) -> None:
    """The paths ``changes`` commit or remove (and what is below a removed one) are no longer
    left uncommitted."""
    for change in changes:
        recorded.pop(change.path, None)
        if isinstance(change, Remove) and recorded:
            below = change.path + "/"
            for path in [p for p in recorded if p.startswith(below)]:
                del recorded[path]


def fold_uncommitted(recorded: dict[str, Recorded], event: ChangesCommitted) -> None:
    """Fold ``event`` into ``recorded``: ``clear`` its changes; its set, if any, replaces the
    rest."""
    clear(recorded, event.changes)
    if event.uncommitted is not None:
        by = command_of(event.request_id)
        recorded.clear()
        recorded.update((u.path, Recorded(u.reason, by, event.version)) for u in event.uncommitted)


def command_of(request_id: str) -> str:
    """The command whose changes an executor's ``apply`` (``request_id``) committed."""
    head, suffix, tail = request_id.rpartition(CHANGES_SUFFIX)
    return head if suffix and not tail else request_id


def lookup(recorded: dict[str, Recorded], path: str) -> tuple[str, Recorded] | None:
    """The entry for ``path``, or for the nearest of its parents (a symlink to a directory, an
    uncommitted directory): ``(the path recorded, entry)``."""
    for candidate in [path, *reversed(ancestors(path))]:
        found = recorded.get(candidate)
        if found is not None:
            return candidate, found
    return None


def asked_path(error: QuillError) -> str | None:
    """The path an error says is not there: a path not found, or a name the path rule refuses
    (as the invalid names a command made are); None for any other error."""
    path = error.details.get("path") if error.details else None
    if not isinstance(path, str):
        return None
    if error.code == ErrorCode.FILE_NOT_FOUND:
        return path
    if error.code == ErrorCode.INVALID_ARGUMENT and error.message.startswith("Invalid path"):
        return path
    return None


def why(asked: str, shown: str, reason: str) -> str:
    """What follows a not-found message for ``asked`` (after ``": "``): ``shown`` (it, or a
    parent of it) is in the sandbox, uncommitted for ``reason``."""
    what = "it" if shown == asked else f"its parent {shown}"
    return (
        f"{what} exists in the sandbox but was not committed: {reason}. Only committed files "
        "are visible to the file tools; use execute_command to work with it there"
    )


def said(details: dict[str, Any], asked: str) -> str | None:
    """``why`` from an error's ``details``, or None when it names nothing uncommitted."""
    found = details.get("uncommitted")
    if not isinstance(found, dict):
        return None
    return why(asked, str(found.get("path", asked)), str(found.get("reason", "")))


def not_committed(error: QuillError, asked: str, shown: str, entry: Recorded) -> QuillError:
    """``error`` (a ``FILE_NOT_FOUND`` or a refused name for ``asked``) saying why: the
    command ``entry.by_command`` left ``shown`` in its sandbox uncommitted."""
    details = dict(error.details or {})
    details["uncommitted"] = {
        "path": shown,
        "reason": entry.reason,
        "by_command": entry.by_command,
        "version": entry.version,
    }
    return QuillError(error.code, f"{error.message}: {why(asked, shown, entry.reason)}", details)
