"""Finding things among a directory's entries: glob, explore and grep, pure (no I/O).

The reader calls them over its projection (``search``), a bridge over a local folder
(``services/bridge``), so that both find the same things and answer alike.

Recursive operations leave out the workspace's default exclusions (``**/node_modules/**``…)
unless the request gives its own ``exclude`` list (``[]`` for none); an excluded directory
takes everything below it along. Patterns are relative to the searched directory. grep runs
its pattern (Python ``re`` syntax) per line, on RE2 in linear time where it can say the same
(``core/regexes.py``), else on ``regex``; within a time budget, in a worker process of the
reader (``infra/offload.py``), so that no pattern holds a replica.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import DEFAULT_EXCLUSIONS, Limits
from contracts.paths import display
from core.answers import entry
from core.globs import Globs, relative
from core.regexes import Spans, Subject, UserPattern
from core.rows import Node

Remaining = Callable[[], float]
"""Seconds left of a budget (core reads no clock: the caller hands this in)."""

GREP_BUDGET_S = 10.0
"""CPU seconds a grep may search (per part of the texts it reads) before it answers
``TIMEOUT``."""
MAX_COUNTED = 1_000_000
"""Matching lines counted at most (``total`` stops there)."""


def exclusions(exclude: list[str] | None) -> Globs:
    """The patterns a recursive query leaves out: the request's, else the default ones.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a malformed pattern.
    """
    return Globs(DEFAULT_EXCLUSIONS if exclude is None else exclude)


def without_excluded(nodes: Iterable[Node], scope: str, patterns: Globs) -> list[Node]:
    """``nodes`` (entries below ``scope``) without those ``patterns`` exclude; an excluded
    directory takes everything below it along (``Excluded``: each directory tested once,
    whatever sorts between it and what it holds, ``b-x`` between ``b`` and ``b/``)."""
    excluded = Excluded(scope, patterns)
    return [node for node in nodes if not excluded(node)]


def glob_matcher(pattern: str) -> Globs:
    """``glob``'s pattern, compiled.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a pattern that leaves the directory or is malformed.
    """
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            "The pattern must be relative to path (no leading / or ..)",
            {"pattern": pattern},
        )
    return Globs([pattern])


def glob_limit(req: rq.GlobQuery, limits: Limits) -> int:
    """Entries a glob returns at most."""
    return min(req.max_results or 100, limits.max_search_results)


def glob_result(
    scope: str, req: rq.GlobQuery, matcher: Globs, nodes: list[Node], limits: Limits
) -> rp.Matches:
    """What ``glob`` answers from the entries below ``scope`` (exclusions left out)."""
    found = [
        node
        for node in nodes
        if (req.kind == "any" or (node.kind == "f") == (req.kind == "file"))
        and matcher.match(relative(node.path, scope))
    ]
    return glob_matches(scope, req, found, glob_limit(req, limits))


def glob_matches(
    scope: str, req: rq.GlobQuery, found: list[Node], limit: int, exact: bool = True
) -> rp.Matches:
    """``glob``'s answer from the entries it found: the newest ``limit`` of them; ``exact``:
    every match was found (else ``total`` is a lower bound)."""
    found = sorted(found, key=lambda n: (-n.modified.timestamp(), n.path))
    return rp.Matches(
        path=display(scope),
        pattern=req.pattern,
        entries=[entry(n) for n in found[:limit]],
        total=len(found),
        truncated=len(found) > limit,
        total_exact=exact,
    )


class Excluded:
    """Whether an entry is left out by ``patterns`` (relative to ``scope``), entries coming
    in any order: a directory is if it or one of its directories matches (``match_dir``), a
    file if one of its directories does or it matches; each directory is tested once."""

    def __init__(self, scope: str, patterns: Globs) -> None:
        self.scope = scope
        self.patterns = patterns
        self._dirs: dict[str, bool] = {scope: False}

    def directory(self, path: str) -> bool:
        """Whether the directory ``path`` (below ``scope``) is left out with what it holds."""
        todo = []
        while path and path not in self._dirs:  # up to the nearest directory known
            todo.append(path)
            path = path.rpartition("/")[0]
        known = self._dirs.get(path, False)
        for below in reversed(todo):
            known = known or self.patterns.match_dir(relative(below, self.scope))
            self._dirs[below] = known
        return known

    def __call__(self, node: Node) -> bool:
        if node.kind == "d":
            return self.directory(node.path)
        parent = node.path.rpartition("/")[0]
        return self.directory(parent) or self.patterns.match(relative(node.path, self.scope))


def explore_result(scope: str, req: rq.ExploreQuery, nodes: list[Node], limits: Limits) -> rp.Tree:
    """What ``explore`` answers from the entries below ``scope`` (exclusions left out)."""
    depth_limit = req.max_depth if req.recursive else 1
    limit = min(req.max_results or limits.max_directory_entries, 10_000)
    children: dict[str, list[Node]] = {}
    for node in nodes:
        if relative(node.path, scope).count("/") < depth_limit:
            children.setdefault(node.path.rpartition("/")[0], []).append(node)

    def walk(directory: str, depth: int) -> Iterator[tuple[Node, int]]:
        for node in sorted(children.get(directory, ()), key=lambda n: (n.kind != "d", n.path)):
            yield node, depth
            if node.kind == "d":
                yield from walk(node.path, depth + 1)

    entries: list[rp.TreeEntry] = []
    total = 0
    for node, depth in walk(scope, 1):
        total += 1
        if len(entries) < limit:
            entries.append(
                rp.TreeEntry(
                    path=node.path,
                    kind="file" if node.kind == "f" else "directory",
                    depth=depth,
                    size=node.size if req.metadata else None,
                    modified=node.modified if req.metadata else None,
                )
            )
    return rp.Tree(path=display(scope), entries=entries, total=total, truncated=total > limit)


@dataclass(frozen=True)
class GrepPlan:
    """Which files a grep searches (``selects``); ``search`` runs it over their texts."""

    req: rq.GrepQuery
    include: Globs | None
    exclude: Globs
    limit: int

    @classmethod
    def of(cls, req: rq.GrepQuery, limits: Limits) -> GrepPlan:
        """The plan of ``req`` (its pattern is compiled where it runs: ``grep_texts``).

        Raises:
            QuillError: ``INVALID_ARGUMENT`` for a bad glob.
        """
        return cls(
            req=req,
            include=Globs.names(req.include) if req.include else None,
            exclude=exclusions(req.exclude),
            limit=min(req.max_results or 100, limits.max_search_results),
        )

    def selects(self, rel: str) -> bool:
        """Whether the file at ``rel`` (relative to the searched directory) is searched."""
        return not self.exclude.match(rel) and (self.include is None or self.include.match(rel))

    def search(
        self,
        files: Iterable[tuple[str, str | bytes]],
        files_searched: int | None = None,
        *,
        remaining: Remaining,
    ) -> rp.GrepResult:
        """Search ``files`` (``(path, text)`` in path order) here, in one part;
        ``files_searched`` defaults to the number of files taken from ``files``.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` for a bad pattern; ``TIMEOUT`` when
                ``remaining()`` (seconds left of ``GREP_BUDGET_S``) runs out.
        """
        listed = list(files)
        part = grep_texts(self.req, self.limit, listed, remaining=remaining)
        return self.result([part], len(listed) if files_searched is None else files_searched)

    def result(self, parts: list[GrepPart], files_searched: int) -> rp.GrepResult:
        """The answer from the parts ``grep_texts`` found, in file order."""
        matches = [m for part in parts for m in part.matches][: self.limit]
        total = sum(part.total for part in parts)
        return rp.GrepResult(
            pattern=self.req.pattern,
            matches=matches,
            total=total,
            truncated=total > len(matches),
            files_searched=files_searched,
            files_matched=sum(part.files_matched for part in parts),
        )


@dataclass(frozen=True)
class GrepPart:
    """What a grep found in some of its files: up to the room left of matches, and how many
    lines matched in all."""

    matches: list[rp.GrepMatch]
    total: int
    files_matched: int


@functools.lru_cache(maxsize=64)
def compiled(pattern: str, literal: bool, ignore_case: bool) -> UserPattern:
    """A grep's pattern, matching per line (``^``/``$`` at every line's edges).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` naming the problem for an invalid regular expression.
    """
    return UserPattern(pattern, "mi" if ignore_case else "m", literal=literal)


def grep_texts(
    req: rq.GrepQuery, room: int, files: list[tuple[str, str | bytes]], *, remaining: Remaining
) -> GrepPart:
    """Search ``files`` (``(path, text)``, a text as a str or its UTF-8 bytes) for ``req``'s
    pattern: the first ``room`` matching lines (with their context), and every matching line
    counted (up to ``MAX_COUNTED``). Linear in the texts when RE2 can run the pattern
    (``core/regexes.py``). A worker process runs it for the reader (``infra/offload.py``).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a bad pattern; ``TIMEOUT`` once ``remaining()``
            is no more.
    """
    pattern = compiled(req.pattern, req.literal, req.ignore_case)
    plain = req.pattern if req.literal and not req.ignore_case else None
    matches: list[rp.GrepMatch] = []
    total = matched_files = 0
    for path, text in files:
        subject = pattern.over(text)
        if len(matches) < room:  # where lines are returned: find each one
            hits = matching_lines(subject, remaining)
            matches += with_context(path, subject, hits[: room - len(matches)], req.context_lines)
            count = len(hits)
        else:  # beyond the returned ones, only count
            count = count_lines(subject, plain, remaining)
        total += count
        matched_files += count > 0
        if total >= MAX_COUNTED:
            break
    return GrepPart(matches, total, matched_files)


def _too_long() -> QuillError:
    return QuillError(ErrorCode.TIMEOUT, "Search took too long: narrow the pattern or path")


def matching_lines(subject: Subject, remaining: Remaining) -> list[tuple[int, int, int]]:
    """``(line number, start, end)`` of every line of ``subject``'s text that its pattern
    matches in.

    Raises:
        QuillError: ``TIMEOUT`` once ``remaining()`` is no more.
    """
    text, newline = subject.text, subject.newline
    out: list[tuple[int, int, int]] = []
    pos = line_no = counted_to = 0
    while True:
        left = remaining()
        try:
            found = subject.search(pos, left) if left > 0 else _timeout()
        except TimeoutError:
            raise _too_long() from None
        if found is None:
            return out
        first, last = found[0]
        start = text.rfind(newline, 0, first) + 1
        end = text.find(newline, first)
        end = len(text) if end < 0 else end
        line_no += text.count(newline, counted_to, start)
        counted_to = start
        try:
            if last <= end or subject.part(start, end).search(0, remaining()) is not None:
                out.append((line_no + 1, start, end))
        except TimeoutError:
            raise _too_long() from None
        pos = end + 1
        if pos > len(text):
            return out


def _timeout() -> Spans | None:
    raise TimeoutError


def count_lines(subject: Subject, plain: str | None, remaining: Remaining) -> int:
    """How many lines of ``subject``'s text match (``plain``: the pattern is this exact
    text), at C speed.

    Raises:
        QuillError: ``TIMEOUT`` once ``remaining()`` is no more.
    """
    text, newline = subject.text, subject.newline
    try:
        left = remaining()
        if left <= 0 or subject.search(0, left) is None:
            if left <= 0:
                raise TimeoutError
            return 0
        lines = text.removesuffix(newline).split(newline)
        if plain is not None:
            return sum(map(operator.contains, lines, itertools.repeat(subject.encode(plain))))
        return subject.count(lines, remaining())
    except TimeoutError:
        raise _too_long() from None


def with_context(
    path: str, subject: Subject, hits: list[tuple[int, int, int]], context: int
) -> list[rp.GrepMatch]:
    text, newline = subject.text, subject.newline
    lines = text.removesuffix(newline).split(newline) if context else []
    out = []
    for line_no, start, end in hits:
        before = lines[max(0, line_no - 1 - context) : line_no - 1] if context else []
        after = lines[line_no : line_no + context] if context else []
        out.append(
            rp.GrepMatch(
                path=path,
                line=line_no,
                text=subject.decode(text[start:end]),
                before=[subject.decode(b) for b in before],
                after=[subject.decode(a) for a in after],
            )
        )
    return out
