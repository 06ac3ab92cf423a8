"""Finding things in a workspace as of a version: glob, explore, grep, over the projection.

What they find among the entries is decided by the pure functions of ``finding`` (exclusions,
glob, explore, grep line matching); this module fetches the entries and contents.

``grep`` narrows the files to read with the reader's trigram index (SQLite FTS5: every text blob
is indexed when it is applied): the literals a pattern cannot match without become an AND of
trigrams; files whose content has them all are then searched line by line. A pattern with no
literal of three characters reads every file in scope.

The search itself (the client's regular expression over the texts) runs in a worker process
(``infra/offload.py``), as the tenant's, within the client's deadline: the texts go to it in
parts of up to ``PART_BYTES``, each with ``GREP_BUDGET_S`` of CPU (``WALL_FACTOR`` times as
long for the whole grep, at most), so the event loop only moves bytes.
"""

from __future__ import annotations

import re._parser as sre_parse  # the stdlib's own regex parser, to find required literals
import time
from collections.abc import AsyncIterator
from typing import Any

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.paths import normalize
from core.answers import not_a_directory
from core.finding import (
    GREP_BUDGET_S,
    MAX_COUNTED,
    Excluded,
    GrepPart,
    GrepPlan,
    exclusions,
    explore_result,
    glob_limit,
    glob_matcher,
    glob_matches,
    glob_result,
    grep_texts,
    without_excluded,
)
from core.globs import Globs, literal_directory, relative
from core.plan import subtree
from core.rows import Node, WorkspaceRow
from infra.offload import WALL_FACTOR
from services.reader.queries import OffloadedOps

MAX_TRIGRAMS = 24
GLOB_COUNTED = 1_000
"""Entries a glob of the whole workspace looks at before it may stop (once it has found more
than it returns): up to there its ``total`` is exact, past it a lower bound."""
PAGE_FIRST, PAGE_MOST = 64, 4096
"""Entries of a walk's first page, and of its largest (each next page twice the last)."""
KINDS = {"any": None, "file": "f", "directory": "d"}
PART_BYTES = 8 * 1024 * 1024
"""Text a grep hands its worker at once."""
OVERTIME = "Search took too long: narrow the pattern or path"


class Search(OffloadedOps):
    OPS = ("glob", "explore", "grep")

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
        return await self._walk(ws, version, scope, scope, exclusions(exclude))

    async def _walk(
        self, ws: WorkspaceRow, version: int, base: str, scope: str, patterns: Globs
    ) -> list[Node]:
        """Entries below ``base`` (path order), without those ``patterns`` (relative to
        ``scope``) exclude. At the newest version, in pages of the live rows: an excluded
        directory's range is skipped with a new seek, never read. At an older one, the tree
        below ``base`` as it was, the excluded entries dropped as they come."""
        lo, hi = subtree(base) if base else ("", None)
        out: list[Node] = []
        skipped: list[tuple[str, str]] = []  # ranges of excluded directories not passed yet
        start, size = lo, PAGE_FIRST
        while True:
            page = await self.q.model.entries_page(ws.id, version, start, hi, size)
            if page is None:  # no longer the newest version: the tree as it was
                nodes = await self.q.store.entries_at(ws.id, version, base)
                return without_excluded(nodes, scope, patterns)
            jump = None
            for node in page:
                if skipped:
                    skipped = [r for r in skipped if r[1] > node.path]
                    jump = next((end for first, end in skipped if first <= node.path), None)
                    if jump is not None:  # past the excluded directory, with a new seek
                        break
                rel = relative(node.path, scope)
                if node.kind == "d" and patterns.match_dir(rel):
                    skipped.append(subtree(node.path))
                elif node.kind == "d" or not patterns.match(rel):
                    out.append(node)
            if jump is not None:
                start = jump
                continue
            if len(page) < size:
                return out
            start = page[-1].path + "\0"  # the next path after it
            size = min(2 * size, PAGE_MOST)

    # ------------------------------------------------------------------ glob
    async def glob(self, ws: WorkspaceRow, version: int, req: rq.GlobQuery) -> rp.Matches:
        """Paths matching ``req.pattern``. What it costs is what it returns: a pattern that
        names directories before its first wildcard walks only their subtree; one that does
        not, at the newest version, walks the live entries newest first and stops once it has
        what it returns (``GLOB_COUNTED``)."""
        scope = await self._scope(ws, req.path, version)
        matcher = glob_matcher(req.pattern)
        patterns = exclusions(req.exclude)
        below = literal_directory(req.pattern)
        if below and not await self._reachable(ws, version, scope, below, patterns):
            return glob_matches(scope, req, [], glob_limit(req, ws.limits))
        base = f"{scope}/{below}" if scope and below else scope or below
        if not base:
            found = await self._newest_first(ws, version, req, matcher, patterns)
            if found is not None:
                return found
        nodes = await self._walk(ws, version, base, scope, patterns)
        return glob_result(scope, req, matcher, nodes, ws.limits)

    async def _reachable(
        self, ws: WorkspaceRow, version: int, scope: str, below: str, patterns: Globs
    ) -> bool:
        """Whether each directory of ``below`` (relative to ``scope``) exists, is one and is
        not excluded: else nothing below it is found."""
        path = scope
        for name in below.split("/"):
            path = f"{path}/{name}" if path else name
            node = await self.q.model.node(ws.id, path, version)
            if node is None or node.kind != "d" or patterns.match_dir(relative(path, scope)):
                return False
        return True

    async def _newest_first(
        self, ws: WorkspaceRow, version: int, req: rq.GlobQuery, matcher: Globs, patterns: Globs
    ) -> rp.Matches | None:
        """The glob of the whole workspace at its newest version, over its live entries
        newest first: it stops once it has looked at ``GLOB_COUNTED`` entries and found more
        than it returns. None: ``version`` is not the newest."""
        limit = glob_limit(req, ws.limits)
        excluded = Excluded("", patterns)
        found: list[Node] = []
        looked = 0
        after: tuple[str, str] | None = None
        size = min(PAGE_MOST, max(limit + 1, GLOB_COUNTED))
        while True:
            page = await self.q.model.recent(ws.id, version, KINDS[req.kind], after, size)
            if page is None:
                return None
            nodes, after = page
            for node in nodes:
                looked += 1
                if not excluded(node) and matcher.match(node.path):
                    found.append(node)
                if len(found) > limit and looked >= GLOB_COUNTED:
                    return glob_matches("", req, found, limit, exact=False)
            if len(nodes) < size:
                return glob_matches("", req, found, limit)
            size = min(2 * size, PAGE_MOST)

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
        parts: list[GrepPart] = []
        until = time.monotonic() + GREP_BUDGET_S * WALL_FACTOR
        async for batch in self._batches(ws, files):
            room = max(0, plan.limit - sum(len(p.matches) for p in parts))
            parts.append(
                await self.offload.run(
                    ws.tenant,
                    grep_texts,
                    plan.req,
                    room,
                    batch,
                    budget_s=GREP_BUDGET_S,
                    overtime=OVERTIME,
                    until=until,
                )
            )
            if sum(p.total for p in parts) >= MAX_COUNTED:
                break
        return plan.result(parts, len(files))

    async def _batches(
        self, ws: WorkspaceRow, files: list[tuple[str, str]]
    ) -> AsyncIterator[list[tuple[str, str | bytes]]]:
        """``(path, text)`` of ``files`` in parts of about ``PART_BYTES``; at least one (an
        empty one when there are no files: the pattern is still checked)."""
        batch: list[tuple[str, str | bytes]] = []
        size = 0
        for i in range(0, len(files), 256):
            chunk = files[i : i + 256]
            texts = await self.texts(ws, [sha for _, sha in chunk])
            for path, sha in chunk:
                batch.append((path, texts[sha]))
                size += len(texts[sha])
                if size >= PART_BYTES:
                    yield batch
                    batch, size = [], 0
        if batch or not files or size:
            yield batch

    async def texts(self, ws: WorkspaceRow, shas: list[str]) -> dict[str, bytes]:
        """Text contents (UTF-8) by sha256: from memory, else the projection, else WS_BLOBS."""
        cache = self.q.texts
        out = {sha: text for sha in shas if (text := cache.get(sha)) is not None}
        missing = [sha for sha in dict.fromkeys(shas) if sha not in out]
        found = await self.q.model.contents(missing) if missing else {}
        for sha in missing:
            data = found.get(sha)
            if data is None:
                data = await self.q.blobs.of(ws.tenant, ws.name, ws.lineage).get(sha)
            out[sha] = data
            cache.put(sha, data)
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
