"""``.gitignore`` files as git reads them: which paths of a tree they leave out.

A command's tool caches (``.hypothesis/``, ``.pytest_cache/``, a build's output) carry their
own ``.gitignore`` (``*``), and a project's says what is not source. The executor honours them
when it captures what a command changed (``infra.exec.capture``), so that what git would not
commit is not committed either.

The meaning is gitignore(5)'s, in two parts:

* **one line**: ``pathspec``'s ``GitIgnoreSpecPattern`` parses it (``#`` comments, ``\\``
  escapes, trailing spaces, ``!`` negation, a ``/`` anchoring it to the file's directory, a
  trailing ``/`` for directories only, ``*``, ``?``, ``[...]``, ``**``) into a regular
  expression; a line it refuses (``a\\``, a bad range) is skipped, as git skips it;
* **how lines, files and directories combine** (here): the lines of ``d/.gitignore`` apply to
  the paths below ``d``, relative to ``d``; for a path, the deepest file with a line matching
  the path decides, and in that file the last matching line (``!`` un-ignores); a path below an
  ignored directory is ignored whatever any line says, as git never looks inside an ignored
  directory (nothing there is re-included).

So a path's parents are decided first, each on its own, and a line is matched against the path
itself only: ``pathspec``'s expressions also match what is below a matching directory (its
*directory marker*); that part is cut off here, as the parents are already decided.

**Linear time.** A ``.gitignore`` is written by the command, so by whoever controls it: its
lines are compiled into one RE2 set (``google-re2``, an automaton: no backtracking, time linear
in the path however the patterns nest), and a file over ``MAX_FILE_BYTES`` is not honoured at
all (the caller says so). Pure: no I/O (the caller reads the files).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import re2
from pathspec.patterns.gitignore.spec import _DIR_MARK_CG, _DIR_MARK_OPT, GitIgnoreSpecPattern

from contracts.paths import ancestors

NAME = ".gitignore"
MAX_FILE_BYTES = 64 * 1024
"""A ``.gitignore`` larger than this is not honoured (none of its lines): its patterns are
compiled once per change of it, at a cost that grows with its size."""
MAX_MEM = 32 * 1024 * 1024
"""Memory RE2 may use for one file's compiled set (past it, the file is not honoured)."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.max_mem = MAX_MEM


class Unusable(Exception):
    """A ``.gitignore`` that is not honoured (too large, patterns RE2 cannot hold)."""


@dataclass(frozen=True)
class _Line:
    ignore: bool
    """False for a ``!`` line (it un-ignores)."""
    dirs_only: bool
    """A line ending with ``/``: it matches directories only."""


def _own(line: str, regex: str) -> tuple[str, bool]:
    """(``regex`` of ``line`` matching a path itself only, whether only a directory):
    ``pathspec``'s expression ends with its directory marker when the line also matches what
    is below a match (optional: file or directory; required: a directory); that part is cut
    off. ``a/**/`` is ``a/`` to ``pathspec`` (both ignore everything below ``a``), but to git
    it is the directories below ``a``, not ``a`` (a ``.gitignore`` in ``a`` is read)."""
    if regex.endswith(_DIR_MARK_OPT):
        return regex[: -len(_DIR_MARK_OPT)] + "$", False
    if regex.endswith(_DIR_MARK_CG):
        base = regex[: -len(_DIR_MARK_CG)]
        if line.rstrip().endswith("/**/") and base:
            return base + "/.+$", True
        return base + "$", True
    return regex, False


class IgnoreFile:
    """The compiled lines of one ``.gitignore``."""

    def __init__(self, data: bytes) -> None:
        """Raises:
        Unusable: over ``MAX_FILE_BYTES``, or more than RE2 can compile in ``MAX_MEM``."""
        if len(data) > MAX_FILE_BYTES:
            raise Unusable(f"over {MAX_FILE_BYTES // 1024} KiB")
        text = data.decode("utf-8", "replace").removeprefix("\ufeff")
        self._lines: list[_Line] = []
        self._set = re2.Set.SearchSet(_OPTIONS)
        last: dict[tuple[str, bool], tuple[int, bool]] = {}
        for number, raw in enumerate(text.split("\n")):
            try:  # the expression only (pathspec would compile it with ``re`` too)
                translated, include = GitIgnoreSpecPattern.pattern_to_regex(raw)
            except ValueError:  # git skips a line it cannot parse
                continue
            if include is None or translated is None:  # blank, a comment
                continue
            regex, dirs_only = _own(raw, translated)
            last[regex, dirs_only] = (number, include)
        # Of lines that match the same paths, only the last can decide: one set entry each.
        for (regex, dirs_only), (_, include) in sorted(last.items(), key=lambda kv: kv[1][0]):
            try:
                self._set.Add(regex)
            except re2.error:
                continue
            self._lines.append(_Line(include, dirs_only))
        if self._lines:
            try:
                self._set.Compile()
            except re2.error as exc:
                raise Unusable(f"its patterns are too large to compile ({exc})") from exc

    def __len__(self) -> int:
        return len(self._lines)

    def decide(self, rel: str, is_dir: bool) -> bool | None:
        """Whether the last line matching ``rel`` (a path below this file's directory,
        relative to it) ignores it (True) or un-ignores it (False); None if none matches."""
        if not self._lines:
            return None
        try:
            found = self._set.Match(rel)
        except UnicodeEncodeError:  # a name that is not UTF-8 is never a valid path
            return None
        last = -1
        for index in found or ():
            line = self._lines[index]
            if index > last and (is_dir or not line.dirs_only):
                last = index
        return None if last < 0 else self._lines[last].ignore


Load = Callable[[str], "IgnoreFile | None"]
"""The ``.gitignore`` of a directory (``""``: the root), or None if it has none (or none
honoured)."""


class Gitignores:
    """Which paths of a tree its ``.gitignore`` files leave out; each file loaded (``load``)
    only when a path below its directory is asked about, once."""

    def __init__(self, load: Load) -> None:
        self._load = load
        self._files: dict[str, IgnoreFile | None] = {}
        self._dirs: dict[str, bool] = {}

    def _file(self, directory: str) -> IgnoreFile | None:
        if directory not in self._files:
            self._files[directory] = self._load(directory)
        return self._files[directory]

    def ignored(self, path: str, is_dir: bool) -> bool:
        """Whether git would leave ``path`` out (untracked, it is not listed)."""
        above = ancestors(path)
        if any(self._dir_ignored(a) for a in above):
            return True
        return self._own(path, above, is_dir)

    def _dir_ignored(self, directory: str) -> bool:
        """Whether the directory itself is ignored (its parents asked before it)."""
        known = self._dirs.get(directory)
        if known is None:
            known = self._dirs[directory] = self._own(directory, ancestors(directory), True)
        return known

    def _own(self, path: str, above: list[str], is_dir: bool) -> bool:
        """What the ``.gitignore`` files above ``path`` say of it, the deepest first."""
        for directory in reversed(["", *above]):
            found = self._file(directory)
            if found is None:
                continue
            rel = path[len(directory) + 1 :] if directory else path
            decided = found.decide(rel, is_dir)
            if decided is not None:
                return decided
        return False
