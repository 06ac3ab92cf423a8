"""Finding things in a workspace as of a version: glob, explore, grep, over the projection.

What they find among the entries is decided by the pure functions of ``finding`` (exclusions,
glob, explore, grep line matching); this module fetches the entries and contents.

``grep`` narrows the files to read with the reader's trigram index (SQLite FTS5: every text blob
is indexed when it is applied): the literals a pattern cannot match without become an AND of
trigrams; files whose content has them all are then searched line by line. A pattern with no
literal of three characters reads every file in scope.
"""

from __future__ import annotations

import re._parser as sre_parse  # the stdlib's own regex parser, to find required literals
import time
from collections.abc import Awaitable, Callable
from typing import Any

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.paths import normalize
from core.answers import not_a_directory
from core.finding import (
    GrepPlan,
    exclusions,
    explore_result,
    glob_matcher,
    glob_result,
    without_excluded,
)
from core.globs import relative
from core.rows import Node, WorkspaceRow
from services.reader.queries import Queries

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
            raise not_a_directory(scope)
        return scope

    async def _entries(
        self, ws: WorkspaceRow, version: int, scope: str, exclude: list[str] | None
    ) -> list[Node]:
        """Entries below ``scope`` (path order), without excluded ones and their contents."""
        patterns = exclusions(exclude)
        return without_excluded(
            await self.q.store.entries_at(ws.id, version, scope), scope, patterns
        )

    # ------------------------------------------------------------------ glob
    async def glob(self, ws: WorkspaceRow, version: int, req: rq.GlobQuery) -> rp.Matches:
        scope = await self._scope(ws, req.path, version)
        matcher = glob_matcher(req.pattern)
        nodes = await self._entries(ws, version, scope, req.exclude)
        return glob_result(scope, req, matcher, nodes, ws.limits)

    # ------------------------------------------------------------------ explore
    async def explore(self, ws: WorkspaceRow, version: int, req: rq.ExploreQuery) -> rp.Tree:
        scope = await self._scope(ws, req.path, version)
        nodes = await self._entries(ws, version, scope, req.exclude)
        return explore_result(scope, req, nodes, ws.limits)

    # ------------------------------------------------------------------ grep
    async def grep(self, ws: WorkspaceRow, version: int, req: rq.GrepQuery) -> rp.GrepResult:
        if "\0" in req.pattern:  # it could match nothing, and the index cannot take it
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                "The pattern holds a NUL character: no text file does (one with NUL is "
                "binary, and grep searches text files only)",
                {"pattern": req.pattern},
            )
        scope = normalize(req.path)
        node = await self.q._node(ws, scope, version, what="Path")
        plan = GrepPlan.of(req, ws.limits)
        if node.kind == "f":  # the file named, as grep FILE: include/exclude choose in a tree
            files = [(scope, node.sha256)] if node.sha256 and not node.binary else []
        else:
            index_query = trigram_query(req.pattern, req.literal)
            files = [
                (path, sha)
                for path, sha in await self.q.model.files(ws.id, version, scope, index_query)
                if plan.selects(relative(path, scope))
            ]
        texts = await self.texts(ws, [sha for _, sha in files])
        return plan.search(
            ((path, texts[sha]) for path, sha in files), len(files), clock=time.monotonic
        )

    async def texts(self, ws: WorkspaceRow, shas: list[str]) -> dict[str, str]:
        """Text contents by sha256: from memory, else the projection, else WS_BLOBS."""
        cache = self.q.texts
        out = {sha: text for sha in shas if (text := cache.get(sha)) is not None}
        missing = [sha for sha in dict.fromkeys(shas) if sha not in out]
        found = await self.q.model.contents(missing) if missing else {}
        for sha in missing:
            data = found.get(sha)
            if data is None:
                data = await self.q.blobs.of(ws.tenant, ws.name).get(sha)
            out[sha] = text = data.decode("utf-8")
            cache.put(sha, text)
        return out


# ---------------------------------------------------------------- the trigram index


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
    """Its trigrams the index holds (none spans a line; none holds a NUL, which FTS5 refuses
    and no text file contains)."""
    return [
        gram
        for i in range(len(text) - 2)
        if "\n" not in (gram := text[i : i + 3]) and "\0" not in gram
    ]
