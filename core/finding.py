"""Finding things among a directory's entries: glob, explore and grep, pure (no I/O).

The reader calls them over its projection (``search``), a bridge over a local folder
(``services/bridge``), so that both find the same things and answer alike.

Recursive operations leave out the workspace's default exclusions (``**/node_modules/**``…)
unless the request gives its own ``exclude`` list (``[]`` for none); an excluded directory
takes everything below it along. Patterns are relative to the searched directory. grep runs
its pattern with ``regex`` (Python ``re`` syntax), per line, with a time budget, so that no
pattern can hang a replica.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import regex

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import DEFAULT_EXCLUSIONS, Limits
from contracts.paths import display
from core.answers import entry
from core.globs import Globs, relative
from core.rows import Node

Clock = Callable[[], float]
"""A monotonic clock in seconds (the services pass ``time.monotonic``: core reads no time)."""

GREP_BUDGET_S = 10.0
"""Longest a grep may search before it answers ``TIMEOUT``."""
MAX_COUNTED = 1_000_000
"""Matching lines counted at most (``total`` stops there)."""


def exclusions(exclude: list[str] | None) -> Globs:
    """The patterns a recursive query leaves out: the request's, else the default ones.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a malformed pattern.
    """
    return Globs(DEFAULT_EXCLUSIONS if exclude is None else exclude)


def without_excluded(nodes: Iterable[Node], scope: str, patterns: Globs) -> list[Node]:
    """``nodes`` (entries below ``scope``, in path order) without those ``patterns`` exclude;
    an excluded directory takes everything below it along."""
    out: list[Node] = []
    pruned: str | None = None
    for node in nodes:
        if pruned is not None and node.path.startswith(pruned):
            continue
        rel = relative(node.path, scope)
        if node.kind == "d" and patterns.match_dir(rel):
            pruned = node.path + "/"
            continue
        if node.kind == "f" and patterns.match(rel):
            continue
        out.append(node)
    return out


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


def glob_result(
    scope: str, req: rq.GlobQuery, matcher: Globs, nodes: list[Node], limits: Limits
) -> rp.Matches:
    """What ``glob`` answers from the entries below ``scope`` (exclusions left out)."""
    limit = min(req.max_results or 100, limits.max_search_results)
    found = [
        node
        for node in nodes
        if (req.kind == "any" or (node.kind == "f") == (req.kind == "file"))
        and matcher.match(relative(node.path, scope))
    ]
    found.sort(key=lambda n: (-n.modified.timestamp(), n.path))
    return rp.Matches(
        path=display(scope),
        pattern=req.pattern,
        entries=[entry(n) for n in found[:limit]],
        total=len(found),
        truncated=len(found) > limit,
    )


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
    """What a grep looks for and in which files; ``search`` runs it over their texts."""

    req: rq.GrepQuery
    compiled: Any
    plain: str | None
    """The pattern when it is plain text matched case-sensitively (counted at C speed)."""
    include: Globs | None
    exclude: Globs
    limit: int

    @classmethod
    def of(cls, req: rq.GrepQuery, limits: Limits) -> GrepPlan:
        """The plan of ``req``.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` for a bad regular expression or glob.
        """
        compiled = compile_pattern(req.pattern, req.literal, req.ignore_case)
        return cls(
            req=req,
            compiled=compiled,
            plain=req.pattern if req.literal and not req.ignore_case else None,
            include=Globs.names(req.include) if req.include else None,
            exclude=exclusions(req.exclude),
            limit=min(req.max_results or 100, limits.max_search_results),
        )

    def selects(self, rel: str) -> bool:
        """Whether the file at ``rel`` (relative to the searched directory) is searched."""
        return not self.exclude.match(rel) and (self.include is None or self.include.match(rel))

    def search(
        self,
        files: Iterable[tuple[str, str]],
        files_searched: int | None = None,
        *,
        clock: Clock,
    ) -> rp.GrepResult:
        """Search ``files`` (``(path, text)`` in path order); ``files_searched`` defaults to
        the number of files taken from ``files``. ``clock``: the caller's monotonic clock
        (``time.monotonic``), which the budget is measured on.

        Raises:
            QuillError: ``TIMEOUT`` past ``GREP_BUDGET_S``.
        """
        deadline = clock() + GREP_BUDGET_S
        matches: list[rp.GrepMatch] = []
        total = matched_files = taken = 0
        for path, text in files:
            taken += 1
            if len(matches) < self.limit:  # where lines are returned: find each one
                hits = matching_lines(self.compiled, text, deadline, clock)
                room = self.limit - len(matches)
                matches += with_context(path, text, hits[:room], self.req.context_lines)
                count = len(hits)
            else:  # beyond the returned ones, only count
                count = count_lines(self.compiled, self.plain, text, deadline, clock)
            total += count
            matched_files += count > 0
            if total >= MAX_COUNTED:
                break
        return rp.GrepResult(
            pattern=self.req.pattern,
            matches=matches,
            total=total,
            truncated=total > len(matches),
            files_searched=taken if files_searched is None else files_searched,
            files_matched=matched_files,
        )


def compile_pattern(pattern: str, literal: bool, ignore_case: bool) -> Any:
    """The pattern compiled with ``regex`` (``re`` syntax).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` naming the problem for an invalid regular expression.
    """
    # Matching is per line: ^ and $ match at the start and end of every line.
    flags = regex.V0 | regex.MULTILINE | (regex.IGNORECASE if ignore_case else 0)
    try:
        return regex.compile(regex.escape(pattern) if literal else pattern, flags)
    except regex.error as exc:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, f"Invalid regex {pattern!r}: {exc}", {"pattern": pattern}
        ) from None


def matching_lines(
    compiled: Any, text: str, deadline: float, clock: Clock
) -> list[tuple[int, int, int]]:
    """``(line number, start, end)`` of every line of ``text`` that ``compiled`` matches.

    Raises:
        QuillError: ``TIMEOUT`` once ``deadline`` (on ``clock``) has passed.
    """
    out: list[tuple[int, int, int]] = []
    pos = line_no = counted_to = 0
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            raise QuillError(ErrorCode.TIMEOUT, "Search took too long: narrow the pattern or path")
        try:
            found = compiled.search(text, pos, timeout=remaining)
        except TimeoutError:
            raise QuillError(
                ErrorCode.TIMEOUT, "Search took too long: narrow the pattern or path"
            ) from None
        if found is None:
            return out
        start = text.rfind("\n", 0, found.start()) + 1
        end = text.find("\n", found.start())
        end = len(text) if end < 0 else end
        line_no += text.count("\n", counted_to, start)
        counted_to = start
        if found.end() <= end or compiled.search(text[start:end]) is not None:
            out.append((line_no + 1, start, end))
        pos = end + 1
        if pos > len(text):
            return out


def count_lines(compiled: Any, plain: str | None, text: str, deadline: float, clock: Clock) -> int:
    """How many lines of ``text`` match (``plain``: the pattern is this exact text), at C speed.

    Raises:
        QuillError: ``TIMEOUT`` once ``deadline`` has passed.
    """
    remaining = deadline - clock()
    try:
        if remaining <= 0 or compiled.search(text, timeout=remaining) is None:
            if remaining <= 0:
                raise TimeoutError
            return 0
        lines = text.removesuffix("\n").split("\n")
        if plain is not None:
            return sum(map(operator.contains, lines, itertools.repeat(plain)))
        search = functools.partial(compiled.search, timeout=deadline - clock())
        return sum(map(bool, map(search, lines)))
    except TimeoutError:
        raise QuillError(
            ErrorCode.TIMEOUT, "Search took too long: narrow the pattern or path"
        ) from None


def with_context(
    path: str, text: str, hits: list[tuple[int, int, int]], context: int
) -> list[rp.GrepMatch]:
    lines = text.removesuffix("\n").split("\n") if context else []
    out = []
    for line_no, start, end in hits:
        before = lines[max(0, line_no - 1 - context) : line_no - 1] if context else []
        after = lines[line_no : line_no + context] if context else []
        out.append(
            rp.GrepMatch(path=path, line=line_no, text=text[start:end], before=before, after=after)
        )
    return out
