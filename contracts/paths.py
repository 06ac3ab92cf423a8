"""Workspace path rules, applied before any work is done.

A path on the wire is a POSIX path relative to the workspace root. ``/workspace`` names the
root, so ``/workspace/a.txt``, ``a.txt`` and ``./x/../a.txt`` are the same file. Normal form:
no leading or trailing ``/``, no empty, ``.`` or ``..`` segments, Unicode NFC; the root is
``""``. Rejected:

* a path that would leave the workspace (``..`` above the root, or an absolute path outside
  ``/workspace`` such as ``/etc/passwd``): ``ACCESS_DENIED``, message
  ``Access denied. Path must be within /workspace``;
* a NUL or other control character, a segment over ``MAX_NAME_BYTES`` or a path over
  ``MAX_PATH_BYTES`` (UTF-8 bytes): ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import unicodedata

from contracts.errors import ErrorCode, QuillError

ROOT_DIR = "/workspace"
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
ACCESS_DENIED_MESSAGE = "Access denied. Path must be within /workspace"


def normalize(path: str) -> str:
    """Return the normal form of a workspace path (``""`` for the root).

    Raises:
        QuillError: ``ACCESS_DENIED`` for an escape, ``INVALID_ARGUMENT`` for a malformed path.
    """
    for ch in path:
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Invalid path {path!r}: contains a control character",
                {"path": path},
            )
    text = unicodedata.normalize("NFC", path)
    if text == ROOT_DIR or text.startswith(ROOT_DIR + "/"):
        text = text[len(ROOT_DIR) :]
    elif text.startswith("/"):
        raise QuillError(ErrorCode.ACCESS_DENIED, ACCESS_DENIED_MESSAGE, {"path": path})
    parts: list[str] = []
    for segment in text.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not parts:
                raise QuillError(ErrorCode.ACCESS_DENIED, ACCESS_DENIED_MESSAGE, {"path": path})
            parts.pop()
            continue
        if len(segment.encode()) > MAX_NAME_BYTES:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Invalid path: a name is longer than {MAX_NAME_BYTES} bytes",
                {"path": path[:200]},
            )
        parts.append(segment)
    result = "/".join(parts)
    if len(result.encode()) > MAX_PATH_BYTES:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Invalid path: longer than {MAX_PATH_BYTES} bytes",
            {"path": path[:200]},
        )
    return result


def parent(path: str) -> str:
    """Parent of a normalised path (the root's parent is the root)."""
    head, _, _ = path.rpartition("/")
    return head


def name(path: str) -> str:
    return path.rpartition("/")[2]


def ancestors(path: str) -> list[str]:
    """Proper ancestors of ``path``, outermost first, without the root: ``a/b/c`` → a, a/b."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def is_within(path: str, directory: str) -> bool:
    """True when ``path`` is ``directory`` itself or lies below it."""
    if directory == "":
        return True
    return path == directory or path.startswith(directory + "/")


def rebase(path: str, old: str, new: str) -> str:
    """Move ``path`` from under ``old`` to under ``new`` (``path`` must be within ``old``)."""
    if path == old:
        return new
    rest = path[len(old) + 1 :]
    return f"{new}/{rest}" if new else rest


def display(path: str) -> str:
    """How a normalised path is shown in messages: the root is ``.``."""
    return path or "."
