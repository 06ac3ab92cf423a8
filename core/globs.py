"""Glob patterns: one implementation of their meaning for every use in Quill.

``glob``'s pattern, grep's ``include``, the ``exclude`` lists of glob/grep/explore and the
executor's ignore patterns all mean the same thing, defined by ``wcmatch`` with globstar,
braces and dotfiles on: ``*`` and ``?`` stay within a path segment, ``**`` crosses any number of
them, ``[abc]`` is a set, ``{a,b}`` alternatives. Paths are workspace-relative (or relative to
the searched directory), with ``/`` separators.

Two ways to anchor a pattern:

* ``Globs(patterns)`` matches whole relative paths (``src/*.py``, ``**/*.ts``);
* ``Globs.names(patterns)`` also lets a pattern without ``/`` match a file name at any depth
  (``*.ts`` finds ``a/b/c.ts``), as ripgrep's ``--glob`` and ``.gitignore`` do.

A directory matches if the directory or anything inside it does (``**/node_modules/**``
excludes ``node_modules`` itself too).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from wcmatch import glob as wc

from contracts.errors import ErrorCode, QuillError

FLAGS = wc.GLOBSTAR | wc.BRACE | wc.DOTGLOB


class Globs:
    """A compiled set of patterns; ``match`` is true if any pattern matches."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        if not self.patterns:
            self._regex: re.Pattern[str] | None = None
            return
        try:
            include, _ = wc.translate(list(self.patterns), flags=FLAGS)
        except Exception as exc:  # wcmatch raises several types for malformed patterns
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Invalid glob pattern: {exc}",
                {"patterns": list(self.patterns)},
            ) from None
        self._regex = re.compile("|".join(f"(?:{p})" for p in include))

    @classmethod
    def names(cls, patterns: Sequence[str]) -> Globs:
        """Patterns where one without ``/`` matches a name at any depth."""
        return cls(p if "/" in p else f"**/{p}" for p in patterns)

    def __bool__(self) -> bool:
        return self._regex is not None

    def match(self, path: str) -> bool:
        return self._regex is not None and self._regex.match(path) is not None

    def match_dir(self, path: str) -> bool:
        """True if the directory ``path`` or what it contains matches."""
        return self.match(path) or self.match(path + "/")


def relative(path: str, scope: str) -> str:
    """``path`` relative to the directory ``scope`` (``""`` is the root)."""
    return path[len(scope) + 1 :] if scope else path
