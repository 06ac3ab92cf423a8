"""Unified diffs of one file's text, as ``git diff`` prints them (``a/``/``b/`` names,
``/dev/null`` for a side that does not exist, the ``\\ No newline at end of file`` marker).

``difflib`` takes time quadratic in the lines of a file in the worst case (12 s for a 1 MB
file of repeated lines in another order). The services run ``unified_many`` in a worker
process (``infra/offload.py``) that interrupts it at its budget (``DIFF_BUDGET_S``): the file
it was on is then "too large to diff here" (``SIZE_LIMIT_EXCEEDED``, with both sizes).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator

from contracts.errors import ErrorCode, QuillError

DIFF_BUDGET_S = 5.0
"""CPU seconds a diff may take per part of the files it compares (``services/reader/diff.py``)."""

Remaining = Callable[[], float]
"""Seconds left of a budget (core reads no clock: the caller hands this in)."""

Pair = tuple[str, str | bytes | None, str | bytes | None]
"""A file's path and its text before and after, as a str or UTF-8 bytes (None: no file on
that side)."""


def unified(path: str, before: str | None, after: str | None, context: int = 3) -> str:
    """The diff from ``before`` to ``after`` of ``path`` (None: the file is absent on that
    side); empty when they are the same."""
    return "".join(
        _ended(
            difflib.unified_diff(
                (before or "").splitlines(keepends=True),
                (after or "").splitlines(keepends=True),
                "/dev/null" if before is None else f"a/{path}",
                "/dev/null" if after is None else f"b/{path}",
                n=context,
            )
        )
    )


def unified_many(pairs: list[Pair], context: int, *, remaining: Remaining) -> list[str]:
    """``unified`` of each pair, within ``remaining()`` seconds (the texts may come as UTF-8
    bytes: decoded here, in the worker, not by the service that read them).

    Raises:
        QuillError: ``SIZE_LIMIT_EXCEEDED`` ("too large to diff here", with both sides'
            sizes) for the file the budget ran out on.
    """
    out: list[str] = []
    for path, before, after in pairs:
        old, new = _text(before), _text(after)
        try:
            if remaining() <= 0:
                raise TimeoutError
            out.append(unified(path, old, new, context))
        except TimeoutError:
            raise too_large(path, old, new) from None
    return out


def _text(side: str | bytes | None) -> str | None:
    """A side's text (bytes not UTF-8: as an empty text, which a binary file is not shown as)."""
    if not isinstance(side, bytes):
        return side
    try:
        return side.decode("utf-8")
    except UnicodeDecodeError:
        return ""


def too_large(path: str, before: str | None, after: str | None) -> QuillError:
    """``SIZE_LIMIT_EXCEEDED`` for a file whose diff took longer than ``DIFF_BUDGET_S``."""
    sizes = {
        "from_bytes": len((before or "").encode()),
        "to_bytes": len((after or "").encode()),
        "from_lines": (before or "").count("\n"),
        "to_lines": (after or "").count("\n"),
    }
    return QuillError(
        ErrorCode.SIZE_LIMIT_EXCEEDED,
        f"Too large to diff here: {path} ({sizes['from_bytes']} bytes, {sizes['from_lines']} "
        f"lines -> {sizes['to_bytes']} bytes, {sizes['to_lines']} lines) did not diff within "
        f"{DIFF_BUDGET_S:g} s; diff a smaller change, or read both versions",
        {"path": path, **sizes, "budget_s": DIFF_BUDGET_S, "reason": "diff_budget"},
    )


def _ended(lines: Iterable[str]) -> Iterator[str]:
    """difflib lines, each ending with a newline (a last line without one gets the usual
    ``\\ No newline at end of file`` marker)."""
    for line in lines:
        if line.endswith("\n"):
            yield line
        else:
            yield line + "\n"
            if not line.startswith(("---", "+++", "@@")):
                yield "\\ No newline at end of file\n"
