"""Unified diffs of one file's text, as ``git diff`` prints them (``a/``/``b/`` names,
``/dev/null`` for a side that does not exist, the ``\\ No newline at end of file`` marker)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator


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
