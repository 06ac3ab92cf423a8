"""Finding things in a workspace as of a version: glob, explore, grep.

Recursive operations leave out the workspace's default exclusions (``**/node_modules/**``…)
unless the request gives its own ``exclude`` list (``[]`` for none); an excluded directory
takes everything below it along. Patterns are relative to the searched directory.

``grep`` narrows the files to read with the reader's trigram index (SQLite FTS5: every text blob
is indexed when it is applied): the literals a pattern cannot match without become an AND of
trigrams; files whose content has them all are then searched line by line with ``regex``
(Python ``re`` syntax, with a time budget so no pattern can hang a replica). A pattern with no
literal of three characters reads every file in scope.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re._parser as sre_parse  # the stdlib's own regex parser, to find required literals
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import regex

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import DEFAULT_EXCLUSIONS
from contracts.paths import display, normalize
from services.common.globs import Globs, relative
from services.common.store import Node, WorkspaceRow
from services.reader.queries import Queries, entry

GREP_BUDGET_S = 10.0
"""Longest a grep may search before it answers ``TIMEOUT``."""
MAX_COUNTED = 1_000_000
"""Matching lines counted at most (``total`` stops there)."""
MAX_TRIGRAMS = 24


class Search:
    def __init__(self, queries: Queries) -> None:
        self.q = queries

    def ops(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return {"glob": self.glob, "explore": self.explore, "grep": self.grep}

    async def _scope(self, ws: WorkspaceRow, path: str, version: int) -> str:
        scope = normalize(path)
        node = await self.q._node(ws, scope, version, what="Directory")
        if node.kind != "d":
            raise QuillError(
                ErrorCode.NOT_A_DIRECTORY, f"Not a directory: {scope}", {"path": scope}
            )
        return scope

    async def _entries(
        self, ws: WorkspaceRow, version: int, scope: str, exclude: list[str] | None
    ) -> list[Node]:
        """Entries below ``scope`` (path order), without excluded ones and their contents."""
        patterns = Globs(DEFAULT_EXCLUSIONS if exclude is None else exclude)
        out: list[Node] = []
        pruned: str | None = None
        for node in await self.q.store.entries_at(ws.id, version, scope):
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

    # ------------------------------------------------------------------ glob
    async def glob(self, ws: WorkspaceRow, version: int, req: rq.GlobQuery) -> rp.Matches:
        scope = await self._scope(ws, req.path, version)
        if req.pattern.startswith("/") or ".." in req.pattern.split("/"):
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                "The pattern must be relative to path (no leading / or ..)",
                {"pattern": req.pattern},
            )
        matcher = Globs([req.pattern])
        limit = min(req.max_results or 100, ws.limits.max_search_results)
        found = [
            node
            for node in await self._entries(ws, version, scope, req.exclude)
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

    # ------------------------------------------------------------------ explore
    async def explore(self, ws: WorkspaceRow, version: int, req: rq.ExploreQuery) -> rp.Tree:
        scope = await self._scope(ws, req.path, version)
        depth_limit = req.max_depth if req.recursive else 1
        limit = min(req.max_results or ws.limits.max_directory_entries, 10_000)
        children: dict[str, list[Node]] = {}
        for node in await self._entries(ws, version, scope, req.exclude):
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

    # ------------------------------------------------------------------ grep
    async def grep(self, ws: WorkspaceRow, version: int, req: rq.GrepQuery) -> rp.GrepResult:
        scope = await self._scope(ws, req.path, version)
        compiled = compile_pattern(req.pattern, req.literal, req.ignore_case)
        plain = req.pattern if req.literal and not req.ignore_case else None
        include = Globs.names(req.include) if req.include else None
        exclude = Globs(DEFAULT_EXCLUSIONS if req.exclude is None else req.exclude)
        limit = min(req.max_results or 100, ws.limits.max_search_results)
        index_query = trigram_query(req.pattern, req.literal)
        files = [
            (path, sha)
            for path, sha in await self.q.model.files(ws.id, version, scope, index_query)
            if not exclude.match(rel := relative(path, scope))
            and (include is None or include.match(rel))
        ]
        texts = await self.texts([sha for _, sha in files])
        deadline = time.monotonic() + GREP_BUDGET_S
        matches: list[rp.GrepMatch] = []
        total = matched_files = 0
        for path, sha in files:
            text = texts[sha]
            if len(matches) < limit:  # where lines are returned: find each one
                hits = matching_lines(compiled, text, deadline)
                matches += with_context(path, text, hits[: limit - len(matches)], req.context_lines)
                count = len(hits)
            else:  # beyond the returned ones, only count
                count = count_lines(compiled, plain, text, deadline)
            total += count
            matched_files += count > 0
            if total >= MAX_COUNTED:
                break
        return rp.GrepResult(
            pattern=req.pattern,
            matches=matches,
            total=total,
            truncated=total > len(matches),
            files_searched=len(files),
            files_matched=matched_files,
        )

    async def texts(self, shas: list[str]) -> dict[str, str]:
        """Text contents by sha256: from memory, else the projection, else WS_BLOBS."""
        cache = self.q.texts
        out = {sha: text for sha in shas if (text := cache.get(sha)) is not None}
        missing = [sha for sha in dict.fromkeys(shas) if sha not in out]
        found = await self.q.model.contents(missing) if missing else {}
        for sha in missing:
            data = found.get(sha)
            if data is None:
                data = await self.q.blobs.get(sha)
            out[sha] = text = data.decode("utf-8")
            cache.put(sha, text)
        return out


# ---------------------------------------------------------------- pure helpers


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


def matching_lines(compiled: Any, text: str, deadline: float) -> list[tuple[int, int, int]]:
    """``(line number, start, end)`` of every line of ``text`` that ``compiled`` matches.

    Raises:
        QuillError: ``TIMEOUT`` once ``deadline`` (``time.monotonic()``) has passed.
    """
    out: list[tuple[int, int, int]] = []
    pos = line_no = counted_to = 0
    while True:
        remaining = deadline - time.monotonic()
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


def count_lines(compiled: Any, plain: str | None, text: str, deadline: float) -> int:
    """How many lines of ``text`` match (``plain``: the pattern is this exact text), at C speed.

    Raises:
        QuillError: ``TIMEOUT`` once ``deadline`` has passed.
    """
    remaining = deadline - time.monotonic()
    try:
        if remaining <= 0 or compiled.search(text, timeout=remaining) is None:
            if remaining <= 0:
                raise TimeoutError
            return 0
        lines = text.removesuffix("\n").split("\n")
        if plain is not None:
            return sum(map(operator.contains, lines, itertools.repeat(plain)))
        search = functools.partial(compiled.search, timeout=deadline - time.monotonic())
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


def required_literals(pattern: str) -> list[list[str]] | None:
    """Alternatives of literal strings a match must contain: ``[[a, b], [c]]`` means (a and b)
    or c. None when some alternative has no literal of three characters (read every file)."""
    try:
        parsed = sre_parse.parse(pattern)
    except Exception:
        return None
    items = list(parsed)
    if len(items) == 1 and items[0][0] == sre_parse.BRANCH:
        options = [_literal_runs(list(branch)) for branch in items[0][1][1]]
    else:
        options = [_literal_runs(items)]
    return None if any(not option for option in options) else options


def _literal_runs(items: list[Any]) -> list[str]:
    runs, current = [], []
    for op, arg in items:
        if op == sre_parse.LITERAL:
            current.append(chr(arg))
            continue
        if current:
            runs.append("".join(current))
        current = []
    if current:
        runs.append("".join(current))
    return [r for r in runs if len(r) >= 3 and "\n" not in r]


def trigram_query(pattern: str, literal: bool) -> str | None:
    """An FTS5 query over the trigram index for files that may match, or None (read all)."""
    options = [[pattern]] if literal else required_literals(pattern)
    if options is None:
        return None
    clauses = []
    for option in options:
        grams = list(dict.fromkeys(g for lit in option for g in _trigrams(lit)))[:MAX_TRIGRAMS]
        if not grams:
            return None
        clauses.append(" AND ".join('"' + g.replace('"', '""') + '"' for g in grams))
    return " OR ".join(f"({c})" for c in clauses)


def _trigrams(text: str) -> list[str]:
    return [text[i : i + 3] for i in range(len(text) - 2) if "\n" not in text[i : i + 3]]
