"""Glob patterns: one implementation of their meaning for every use in Quill.

``glob``'s pattern, grep's ``include``, the ``exclude`` lists of glob/grep/explore and the
executor's ignore patterns all mean the same thing, that of ``wcmatch``'s ``glob`` with
globstar, braces and dotfiles on: ``*`` and ``?`` stay within a path segment, ``**`` crosses
any number of them, ``[abc]`` is a set (``[!a]``, ``[^a]``, ranges, ``[[:alpha:]]``), ``{a,b}``
alternatives and ``{1..3}`` sequences (``bracex``), ``\\`` escapes. Paths are
workspace-relative (or relative to the searched directory), with ``/`` separators.

Two ways to anchor a pattern:

* ``Globs(patterns)`` matches whole relative paths (``src/*.py``, ``**/*.ts``);
* ``Globs.names(patterns)`` also lets a pattern without ``/`` match a file name at any depth
  (``*.ts`` finds ``a/b/c.ts``), as ripgrep's ``--glob`` and ``.gitignore`` do.

A directory matches if the directory or anything inside it does (``**/node_modules/**``
excludes ``node_modules`` itself too).

**Linear time.** A client writes these patterns, and every listed path is matched against
them, so matching must not backtrack: ``wcmatch``'s regular expressions need lookaround and
took 10 s for one 200-character path against ``**/a*/**/a*/**/a*/**/a*/**/b`` (16 ms for the
default exclusions against a path 500 directories deep). Here a pattern is parsed as
``wcmatch`` parses it (the same rules, ported for the flags above) and written as an RE2
expression, which an automaton runs in time linear in the path. Where ``wcmatch`` asserts
what comes next (a segment a ``*`` starts is not empty; a ``**`` follows a ``/``), the RE2
form says the same without lookaround; its ``.``/``..`` checks are dropped, as no path Quill
matches has such a segment. tests/core/test_globs.py checks both agree on generated patterns
and paths.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

import bracex
import re2

from contracts.errors import ErrorCode, QuillError
from core.regexes import NOTHING, Untranslatable, literal, set_without

PATTERN_LIMIT = 1000
"""Patterns a set may expand to (braces), all together: past it the set is refused."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_MATCH = re2._re2.RE2.Anchor.ANCHOR_BOTH

_POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7f",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t-\\r ",
    "upper": "A-Z",
    "word": "0-9A-Z_a-z",
    "xdigit": "0-9A-Fa-f",
}
_POSIX_RE = re.compile(r"\[:(" + "|".join(_POSIX) + r"):\]")


class Globs:
    """A compiled set of patterns; ``match`` is true if any pattern matches."""

    def __init__(self, patterns: Iterable[str]) -> None:
        """Raises:
        QuillError: ``INVALID_ARGUMENT`` for a set that expands past ``PATTERN_LIMIT``."""
        self.patterns = tuple(patterns)
        self._regex = None
        if not self.patterns:
            return
        try:
            parts = [_Translator(p).translate() for p in _expanded(self.patterns)]
            self._regex = re2.compile("|".join(f"(?:{p})" for p in parts), _OPTIONS)._regexp
        except (bracex.ExpansionLimitException, _LimitError, re2.error, Untranslatable) as exc:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Invalid glob pattern: {exc}",
                {"patterns": list(self.patterns)},
            ) from None

    @classmethod
    def names(cls, patterns: Sequence[str]) -> Globs:
        """Patterns where one without ``/`` matches a name at any depth."""
        return cls(p if "/" in p else f"**/{p}" for p in patterns)

    def __bool__(self) -> bool:
        return self._regex is not None

    def match(self, path: str) -> bool:
        if self._regex is None:
            return False
        data = path.encode("utf-8", "surrogateescape")
        return bool(self._regex.Match(_MATCH, data, 0, len(data))[0][0] >= 0)

    def match_dir(self, path: str) -> bool:
        """True if the directory ``path`` or what it contains matches."""
        return self.match(path) or self.match(path + "/")


def relative(path: str, scope: str) -> str:
    """``path`` relative to the directory ``scope`` (``""`` is the root)."""
    return path[len(scope) + 1 :] if scope else path


_SPECIAL = frozenset("*?[]{}\\")
"""Characters that make a pattern's segment more than a name (conservatively: ``]``, ``}``
and ``\\`` too)."""


def literal_directory(pattern: str) -> str:
    """The directories a pattern names literally before its first wildcard (``pkg/sub`` of
    ``pkg/sub/*.py``, ``""`` of ``**/*.py`` or ``*.py``): everything it matches is below
    them, so a search need only walk that subtree. The last segment is never one of them
    (``pkg/sub`` matches the entry ``pkg/sub``, found below ``pkg``)."""
    segments = pattern.split("/")[:-1]
    taken: list[str] = []
    for segment in segments:
        if not segment or segment in (".", "..") or _SPECIAL.intersection(segment):
            break
        taken.append(segment)
    return "/".join(taken)


class _LimitError(Exception):
    pass


def _expanded(patterns: Sequence[str]) -> Iterator[str]:
    """Each pattern's brace expansions, once each; all of them count toward one limit."""
    total = 0
    seen: set[str] = set()
    for pattern in patterns:
        limit = max(1, PATTERN_LIMIT - total)
        for one in bracex.iexpand(pattern, keep_escapes=True, limit=limit, return_empty=True):
            total += 1
            if total > PATTERN_LIMIT:
                raise _LimitError(f"Pattern limit exceeded the limit of {PATTERN_LIMIT}")
            if one not in seen:
                seen.add(one)
                yield one


# Tokens of a translated pattern, in the order wcmatch emits its parts.
_SEP = "SEP"  # one or more /
_NEED_SEP = "NEED_SEP"  # what follows starts with / (before a globstar)
_GSTAR = "GSTAR"  # a globstar: anything, separators included
_DIV = "DIV"  # after a globstar: the start, the end or separators
_DIV_DIR = "DIV_DIR"  # after a globstar followed by /: the start or separators
_NEED_DIR = "NEED_DIR"  # what came before ends with /
_STAR = "STAR"  # * within a segment
_LEAD_STAR = "LEAD_STAR"  # * starting a segment (which then is not empty)


class _Translator:
    """One brace-free pattern → an RE2 expression (``wcmatch``'s ``WcParse.root`` for
    pathname, globstar, dotglob, no extglob, on POSIX)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern if pattern != "\\" else ""
        self.i = 0
        self.parts: list[str] = [""]
        self.bad_sequence = -1
        self.segment_start = True

    def _next(self) -> str:
        if self.i >= len(self.pattern):
            raise StopIteration
        c = self.pattern[self.i]
        self.i += 1
        return c

    def translate(self) -> str:
        while self.i < len(self.pattern):
            c = self._next()
            at_start = self.segment_start
            self.segment_start = False
            if c == "*":
                self._star(at_start)
            elif c == "?":
                self.parts.append("[^/]")
            elif c == "/":
                self._separator()
            elif c == "\\":
                self._escape(at_start)
            elif c == "[" and (self.bad_sequence == -1 or self.i > self.bad_sequence):
                start = self.i
                try:
                    self.parts.append(self._sequence())
                except StopIteration:
                    self.bad_sequence = self.i
                    self.i = start
                    self.parts.append(literal("["))
            else:
                self.parts.append(literal(c))
        if self.parts[-1] not in (_DIV, _SEP):
            self.parts.append("/*")
        return _render(self.parts)

    def _separator(self) -> None:
        self.parts.append(_SEP)
        self._skip_separators()
        self.segment_start = True

    def _skip_separators(self) -> None:
        while self.i < len(self.pattern) and self.pattern[self.i] == "/":
            self.i += 1

    def _escape(self, at_start: bool) -> None:
        """``\\x``: ``x`` literally; ``\\/`` a separator; a last ``\\`` escapes nothing."""
        if self.i >= len(self.pattern):
            self.segment_start = at_start
            return
        c = self._next()
        if c == "/":
            self._separator()
        elif c == ".":
            self.parts.append(literal("."))
        else:
            self.parts.append(literal(c))

    def _star(self, at_start: bool) -> None:
        globstar = False
        directory = False
        if at_start and self.pattern.startswith("*", self.i):
            self.i += 1  # a second star
            rest = self.pattern[self.i :]
            if rest == "" or rest == "\\":
                globstar = True
            elif rest.startswith("/"):
                self.i += 1
                globstar = directory = True
            elif rest.startswith("\\/"):
                self.i += 2
                globstar = directory = True
            elif rest.startswith("\\") and not rest.startswith("\\."):
                pass  # an escaped character follows: two single stars
        if not globstar:
            while self.pattern.startswith("*", self.i):
                self.i += 1  # consecutive stars are one
            self.parts.append(_LEAD_STAR if at_start else _STAR)
            return
        parts = self.parts
        if parts[-1] != _DIV_DIR:
            if parts[-1] == "":
                parts[-1] = _GSTAR
            else:
                parts[-1] = _NEED_SEP
                parts.append(_GSTAR)
            self._skip_separators()
            parts.append(_DIV)
        else:
            self._skip_separators()
        at_end = self.pattern[self.i :] in ("", "\\")
        parts[-1] = _DIV_DIR if directory and not at_end else _DIV
        if directory and at_end:
            parts.append(_NEED_DIR)
        self.segment_start = True

    def _sequence(self) -> str:
        """A ``[...]`` set, as an RE2 class that never matches ``/``.

        Raises:
            StopIteration: not a set (unclosed, or holding a ``/``): ``[`` is literal.
        """
        items: list[str] = []
        negate = False
        removed = False
        end_range = 0
        escape_hyphen = -1
        last_posix = False
        c = self._next()
        if c in ("!", "^"):
            negate = True
            c = self._next()
        if c == "[":
            last_posix = self._posix(items, 0)
            if not last_posix:
                items.append(re.escape(c))
            c = self._next()
        elif c in ("-", "]"):
            items.append(re.escape(c))
            c = self._next()
        while c != "]":
            if c == "-":
                if last_posix:
                    items.append("\\-")
                    last_posix = False
                elif self.i - 1 > escape_hyphen:
                    items.append("-")
                    escape_hyphen = self.i + 1
                    end_range = self.i
                elif end_range and self.i - 1 >= end_range:
                    removed = _range_end(items, "\\-") or removed
                    end_range = 0
                else:
                    items.append("\\-")
                c = self._next()
                continue
            last_posix = False
            if c == "[":
                last_posix = self._posix(items, end_range)
                if last_posix:
                    c = self._next()
                    continue
            if c == "\\":
                c = self._next()
                if c == "/":
                    raise StopIteration
                value = re.escape(c)
            elif c == "/":
                raise StopIteration
            else:
                value = re.escape(c)
            if end_range and self.i - 1 >= end_range:
                removed = _range_end(items, value) or removed
                end_range = 0
            else:
                items.append(value)
            c = self._next()
        body = "".join(items)
        if removed and not body:  # every range backwards: nothing, or (negated) anything
            return "[^/]" if negate else NOTHING
        return set_without(body, negate, "/")

    def _posix(self, items: list[str], end_range: int) -> bool:
        found = _POSIX_RE.match(self.pattern, self.i - 1)
        if found is None:
            return False
        self.i = found.end()
        if end_range and self.i - 1 >= end_range:
            items[-1] = "\\" + items[-1]  # no range ends with a class: the - is literal
        items.append(_POSIX[found.group(1)])
        return True


def _range_end(items: list[str], last: str) -> bool:
    """Close the range ``items[-2]-last``; a backwards one is dropped (True)."""
    first = items[-2]
    low = first[1:2] if len(first) > 1 else first
    high = last[1:2] if len(last) > 1 else last
    if ord(high) < ord(low):
        items.pop()
        items.pop()
        return True
    items.append(last)
    return False


_GLOBSTARS: dict[str, dict[str, str]] = {
    _NEED_SEP: {
        _NEED_DIR: r"/(?:(?s:.*)/)?",
        _DIV_DIR: r"(?:/+|/(?s:.*)/+)",
        _DIV: r"(?:/+|/(?s:.*)(?:$|/+))",
    },
    _GSTAR: {
        _NEED_DIR: r"(?s:.*)/",
        _DIV_DIR: r"(?:(?s:.*)/+)?",
        _DIV: r"(?:(?s:.*)(?:$|/+))?",
    },
}
"""What ``**`` between separators (``NEED_SEP``), or at the start (``GSTAR``), matches, by
what ends it: a directory needed after it, a divider before a directory, or a divider."""


def _render(parts: list[str]) -> str:
    """The tokens as one RE2 expression for the whole path (what wcmatch asserts with
    lookaround, said without it)."""
    out: list[str] = []
    n = len(parts)
    k = 0
    while k < n:
        part = parts[k]
        if part in (_NEED_SEP, _GSTAR):
            # always NEED_SEP GSTAR DIV|DIV_DIR [NEED_DIR], or at the start GSTAR DIV|DIV_DIR
            # [NEED_DIR]: the ending DIV, DIV_DIR or NEED_DIR picks the expression
            skip = 2 if part == _NEED_SEP else 1
            div, k = parts[k + skip], k + skip + 1
            if k < n and parts[k] == _NEED_DIR:
                div, k = _NEED_DIR, k + 1
            out.append(_GLOBSTARS[part][div])
            continue
        if part == _SEP:
            out.append("/+")
        elif part == _LEAD_STAR:
            alone = k + 1 == n or parts[k + 1] in (_SEP, _NEED_SEP, "/*")
            out.append("[^/]+" if alone else "[^/]*")
        elif part == _STAR:
            out.append("[^/]*")
        else:
            out.append(part)
        k += 1
    return "".join(out)
