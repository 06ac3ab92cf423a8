"""Workspace path rules, applied before any work is done: one rule for every front door (the
bus, the SDK, MCP, REST, the CLI, what a command creates in its checkout, a bridged folder).

A path on the wire is a POSIX path relative to the workspace root. ``/workspace`` names the
root, so ``/workspace/a.txt``, ``a.txt`` and ``./x/../a.txt`` are the same file. Normal form:
no leading or trailing ``/``, no empty, ``.`` or ``..`` segments; the root is ``""``.

Names are compared as the exact sequence of code points they are written with, so a name must
be one that cannot look like another. Refused with ``INVALID_ARGUMENT``, naming the character
by code point (``check_name`` gives the reason):

* a character that is not a valid Unicode scalar value: a lone surrogate, which is also how
  Python shows a byte of a name on disk that is not UTF-8 (``os.scandir``'s
  ``surrogateescape``);
* a control character (``Cc``: C0, DEL and C1), a line or paragraph separator (``Zl``,
  ``Zp``), a format character (``Cf``: bidi embeddings, overrides, isolates and marks,
  zero-width space, joiners, word joiner, BOM, soft hyphen, tags...), a Hangul filler (a
  letter that renders as nothing), a noncharacter (``U+FDD0``-``U+FDEF``, ``U+xFFFE``,
  ``U+xFFFF``);
* a path that is not in Unicode NFC: refused, not normalised, so that ``café`` written
  precomposed and decomposed can never be two files nor silently one (the message gives the
  NFC spelling to use);
* a name over ``MAX_NAME_BYTES`` or a path over ``MAX_PATH_BYTES`` (UTF-8 bytes);
* a Windows path: a backslash anywhere (it is no separator here, and a name holding one
  cannot be checked out on Windows), or a name that is a drive (``C:``, as in ``C:\\foo`` or
  ``C:/foo``). The message gives the POSIX spelling to use. ``C:\\foo`` is never a file
  named so: a model that writes Windows paths is told at once, at every front door.

A path that would leave the workspace (``..`` above the root, or an absolute path outside
``/workspace`` such as ``/etc/passwd``) is ``ACCESS_DENIED``, message
``Access denied. Path must be within /workspace``.

``normalize_file`` is the rule for a path a file is written at: one ending in ``/`` (or ``/.``)
names a directory, and is refused rather than made a file of that name.

``printable`` shows any name (one found on disk included) escaped, for messages and reports.
"""

from __future__ import annotations

import re
import unicodedata

from contracts.errors import ErrorCode, QuillError

ROOT_DIR = "/workspace"
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
ACCESS_DENIED_MESSAGE = "Access denied. Path must be within /workspace"
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""General categories no name may hold (see the module docstring)."""
INVISIBLE_LETTERS = frozenset({0x115F, 0x1160, 0x3164, 0xFFA0})
"""Hangul fillers: letters (``Lo``) that render as nothing."""
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ASCII_CONTROL = re.compile("[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"(?:^|/)([A-Za-z]:)(?:[/\\]|$)")
"""A Windows drive (``C:``) as a name: ``C:\\foo``, ``C:/foo``, ``C:``."""


def _refused(ch: str) -> str | None:
    """Why the character ``ch`` may not be in a name, or None."""
    cp = ord(ch)
    category = unicodedata.category(ch)
    if 0xDC80 <= cp <= 0xDCFF:
        return f"not valid UTF-8 (byte 0x{cp - 0xDC00:02X})"
    if category == "Cs":
        return f"U+{cp:04X} is a lone surrogate, not a character"
    if category in REFUSED_CATEGORIES or cp in INVISIBLE_LETTERS:
        what = {
            "Cc": "a control character",
            "Cf": "an invisible format character (bidi or zero-width)",
            "Zl": "a line separator",
            "Zp": "a paragraph separator",
        }.get(category, "an invisible character")
        return f"U+{cp:04X} {unicodedata.name(ch, '')} is {what}".replace("  ", " ")
    if 0xFDD0 <= cp <= 0xFDEF or cp & 0xFFFE == 0xFFFE:
        return f"U+{cp:04X} is a noncharacter"
    return None


def _first_refused(text: str) -> str | None:
    """Why the first character of ``text`` that no name may hold is refused, or None."""
    if text.isascii():  # the common case, fast: only C0 controls and DEL can be wrong
        found = _ASCII_CONTROL.search(text)
        return None if found is None else _refused(found.group())
    for ch in text:
        why = _refused(ch)
        if why is not None:
            return why
    return None


def printable(text: str) -> str:
    """``text`` with every character a name may not hold escaped (``\\xff`` for a byte that is
    not UTF-8, ``\\n``, ``\\u202e``...): safe to show and to encode. A valid name is returned
    unchanged."""
    if _first_refused(text) is None:
        return text
    out = []
    for ch in text:
        cp = ord(ch)
        if _refused(ch) is None:
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0xDC80 <= cp <= 0xDCFF:
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif cp < 0x100:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    return "".join(out)


def _windows(path: str) -> str | None:
    """Why ``path`` reads as a Windows path (a backslash, a drive such as ``C:``), or None."""
    drive = _DRIVE.search(path)
    if drive is not None and drive.start() == 0:
        rest = path[drive.end() :].replace("\\", "/").strip("/")
        return (
            f"{drive.group(1)!r} is a Windows drive, not a name: paths are POSIX paths relative "
            f"to /workspace, with / between names (e.g. {rest or '.'!r})"
        )
    if drive is not None:
        return f"{drive.group(1)!r} cannot be a name: it reads as a Windows drive"
    if "\\" in path:
        return (
            "a backslash is not a path separator here and no name may hold one: write "
            f"{path.replace(chr(92), '/')!r} (paths are POSIX paths relative to /workspace)"
        )
    return None


def check_name(path: str) -> str | None:
    """Why ``path`` (a name, or a path of names) breaks the character rules, or None: the
    first refused character, a Windows form (a backslash, a drive name such as ``C:``), else
    not NFC."""
    why = _first_refused(path) or _windows(path)
    if why is not None:
        return why
    if not path.isascii() and not unicodedata.is_normalized("NFC", path):
        at = next(
            i for i in range(len(path)) if not unicodedata.is_normalized("NFC", path[: i + 1])
        )
        ch = path[at]
        nfc = unicodedata.normalize("NFC", path)
        return (
            f"not in Unicode NFC (U+{ord(ch):04X} {unicodedata.name(ch, '')} composes with the "
            f"character before it): write it as {nfc!r}"
        )
    return None


def _invalid(path: str, why: str) -> QuillError:
    shown = printable(path)[:200]
    return QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid path '{shown}': {why}", {"path": shown})


def normalize(path: str) -> str:
    """Return the normal form of a workspace path (``""`` for the root).

    Raises:
        QuillError: ``ACCESS_DENIED`` for an escape, ``INVALID_ARGUMENT`` for a malformed path
            (a refused character, not NFC, too long).
    """
    why = check_name(path)
    if why is not None:
        raise _invalid(path, why)
    text = path
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
            raise _invalid(path, f"a name is longer than {MAX_NAME_BYTES} bytes")
        parts.append(segment)
    result = "/".join(parts)
    if len(result.encode()) > MAX_PATH_BYTES:
        raise _invalid(path, f"longer than {MAX_PATH_BYTES} bytes")
    return result


def normalize_existing(path: str) -> str:
    """``normalize`` for a path that only names what already exists (read, stat, list,
    history, delete, the source of a move): a path the log holds from before the name rule
    (``in_log``: a bidi or zero-width character was accepted then) is taken as given, so such a
    name stays readable, and can be removed or renamed to a valid one. Nothing new can be
    named this way: writes, directories made and the destination of a move use ``normalize``.

    Raises:
        QuillError: as ``normalize``, for a path that is not such a legacy name either.
    """
    try:
        return normalize(path)
    except QuillError as exc:
        if exc.code == ErrorCode.INVALID_ARGUMENT and check_name(path) and in_log(path):
            return path
        raise


def not_found(path: str, what: str = "File") -> QuillError:
    """The answer for a path ``normalize_existing`` let through that names nothing:
    ``FILE_NOT_FOUND``, or, for a name that breaks the rule (no legacy name by that name
    exists), the rule's ``INVALID_ARGUMENT``, as for any new name."""
    why = check_name(path)
    if why is not None:
        return _invalid(path, why)
    return QuillError(ErrorCode.FILE_NOT_FOUND, f"{what} not found: {path}", {"path": path})


def normalize_file(path: str) -> str:
    """``normalize`` for a path a file is written at: a path ending in ``/``, ``/.`` or ``/..``
    names a directory and is refused (never a file of that name).

    Raises:
        QuillError: as ``normalize``; ``INVALID_ARGUMENT`` for a directory form.
    """
    normal = normalize(path)
    ending = next((e for e in ("/", "/.", "/..") if path.endswith(e)), None)
    if normal and ending is not None:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Not a file path: {path!r} ends with {ending!r}, which names a directory",
            {"path": normal},
        )
    return normal


def problem(path: str) -> str | None:
    """Why ``path``, a relative path found on disk (``a/b``, possibly holding bytes that are
    not UTF-8), is not a valid normalised workspace path, or None."""
    why = check_name(path)
    if why is not None:
        return why
    if len(path.encode()) > MAX_PATH_BYTES:
        return f"path longer than {MAX_PATH_BYTES} bytes"
    if any(len(s.encode()) > MAX_NAME_BYTES for s in path.split("/")):
        return f"a name is longer than {MAX_NAME_BYTES} bytes"
    return None


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


def in_log(path: str) -> bool:
    """Whether ``path``, read from a workspace's log, is a safe normalised path to materialise:
    the structure of the normal form (not the root, no ``.``, ``..`` or empty name, no leading
    ``/``), text, no C0 control or DEL, within the lengths. Looser than ``normalize``: a name a
    log holds from before the name rule (a bidi or zero-width character was accepted) stays
    readable, exportable and replayable."""
    if not path or _ASCII_CONTROL.search(path) is not None:
        return False
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        return False
    parts = path.split("/")
    return size <= MAX_PATH_BYTES and all(
        p not in ("", ".", "..") and len(p.encode()) <= MAX_NAME_BYTES for p in parts
    )
