"""A fork's answers through its layers (issue 33; ``infra/store/layers.py``): listings,
counts and totals over its tree as of a version, a path's history and the events across the
fork point.

A fork's tree as of a version is its layers' (what it inherited at the fork point, less what
it changed, plus its own rows); a page of a listing merges its layers' pages
(``infra/store/merged.py``): it costs the page, not the tree.
Its events are the source's below the fork point ``N``, then its own: its version ``N`` is
its ``workspace_forked`` event (the source's tree at ``N``, its chain continuing the source's
event ``N``), its next ``N + 1``.

Its totals (``qry.info``: files, directories, bytes) and a recursive listing's ``total`` are
its source's as of ``N`` (an aggregate that never changes: the reader holds it,
``readmodel.py``) moved by what the fork's own rows change (``changed``): what each path it
has a row of shows, less what the layers below showed there. They cost what the fork changed,
never its source's tree.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, Protocol

import aiosqlite

from core.plan import LIVE, WHITEOUT, subtree
from core.rows import Node
from infra import sql
from infra.store import Layers, merged, node_from_row
from infra.store.layers import ALL


class Scoped(Protocol):
    """A listing's scope (``readmodel.Scope``)."""

    @property
    def directory(self) -> str: ...
    @property
    def recursive(self) -> bool: ...
    @property
    def kind(self) -> str | None: ...
    @property
    def prefix(self) -> str: ...


def _successor(start: str) -> str:
    """The least string above every one starting with ``start`` (not empty)."""
    last = ord(start[-1])
    return start[:-1] + chr(last + 1) if last < 0x10FFFF else "\U0010ffff"


def span(scope: Scoped) -> tuple[str, str]:
    """The range of paths a recursive listing's ``scope`` covers (its root's row left out by
    its caller: a path is never empty)."""
    directory = scope.directory
    start = f"{directory}/{scope.prefix}" if directory else scope.prefix
    lo, hi = subtree(directory) if directory else ALL
    if start:
        lo, hi = max(lo, start), min(hi, _successor(start))
    return lo, hi


async def scoped(
    db: aiosqlite.Connection,
    layers: Layers,
    version: int,
    scope: Scoped,
    after: tuple[str, str] | None,
    limit: int | None,
) -> list[Node]:
    """Up to ``limit`` (None: every) entries of a listing's ``scope`` as of ``version``, in
    its order (directories first, then by name; recursive: by path), after the ``(kind,
    path)`` of a page's last. One directory: its children in each layer; recursive: the
    layers' ranges merged in path order, read up to the page (``infra/store/merged.py``)."""
    directory = scope.directory
    start = f"{directory}/{scope.prefix}" if directory else scope.prefix

    def wanted(n: Node) -> bool:
        return bool(n.path) and (scope.kind is None or n.kind == scope.kind)

    if not scope.recursive:
        found = await merged.children(db, layers, version, directory)
        out = [n for n in found if wanted(n) and n.path.startswith(start)]
        out.sort(key=lambda n: (n.kind == "f", n.path))
        if after is not None:
            mark = (after[0] == "f", after[1])
            out = [n for n in out if (n.kind == "f", n.path) > mark]
        return out if limit is None else out[:limit]
    lo, hi = span(scope)
    if after is not None:
        lo = max(lo, after[1] + "\0")
    first = merged.PAGE_FIRST if limit is None else min(merged.PAGE_MOST, limit + 1)
    return await _take(merged.in_path_order(db, layers, version, lo, hi, first), wanted, limit)


async def _take(
    walk: AsyncGenerator[Node, None], wanted: Callable[[Node], bool], limit: int | None
) -> list[Node]:
    """Up to ``limit`` (None: every) of ``walk``'s nodes that are ``wanted``, in its order;
    the walk closed however it ends (it reads its layers as it is taken)."""
    page: list[Node] = []
    async with aclosing(walk) as nodes:
        async for node in nodes:
            if wanted(node):
                page.append(node)
                if limit is not None and len(page) >= limit:
                    break
    return page


Totals = tuple[int, int, int]
"""``(files, directories, total file bytes)`` of a tree."""
Shown = tuple[str, int] | None
"""What a layer shows at a path as of a version: ``(kind, size)`` of its row, or nothing."""
Change = tuple[str, Shown, Shown]
"""A path a layer has a row of: what it shows there, and what the layers below showed."""
ASKED_MOST = 4096
"""Paths asked of a layer below in one statement (``sql.LAYER_SHOWN``)."""


def _shown(kind: str, size: int, until: int, at: int) -> Shown:
    """A layer's newest row of a path as of ``at``: valid then (and no whiteout), or nothing."""
    return (kind, int(size)) if until > at and kind != WHITEOUT else None


async def changed(
    db: aiosqlite.Connection, layers: Layers, version: int, lo: str, hi: str
) -> list[Change]:
    """What the nearest layer changed of the tree below it, as of ``version``, in ``lo <=
    path < hi``: each path it has a row of then (its adds, replacements, deletes and
    whiteouts: a range of its own rows, ``sql.LAYER_OWN``), what it shows there and what the
    layers below showed (the nearest with a row of it: two seeks a path and layer,
    ``sql.LAYER_SHOWN``). Its cost is what the layer changed, never the layers' trees."""
    (ws, cap), below = layers[0], _capped(layers[1:], version)
    at = min(version, cap)
    mine = {
        str(path): _shown(kind, size, until, at)
        for path, kind, size, until, _ in await db.execute_fetchall(sql.LAYER_OWN, (ws, lo, hi, at))
    }
    theirs: dict[str, Shown] = {}
    left = list(mine)
    for lower, lower_at in below:
        more: list[str] = []
        for i in range(0, len(left), ASKED_MOST):
            asked = left[i : i + ASKED_MOST]
            args = (json.dumps(asked), lower, lower_at)
            for path, kind, size, until in await db.execute_fetchall(sql.LAYER_SHOWN, args):
                theirs[str(path)] = _shown(kind, size, until, lower_at)
            more += [p for p in asked if p not in theirs]
        left = more
        if not left:
            break
    return [(path, shown, theirs.get(path)) for path, shown in mine.items()]


def _capped(layers: Layers, version: int) -> Layers:
    """Each layer with the version it is read at."""
    return [(ws, min(version, cap)) for ws, cap in layers]


def moved(totals: Totals, changes: list[Change]) -> Totals:
    """``totals`` of the layers below, moved by what the nearest layer ``changes``."""
    files, dirs, size = totals
    for _, mine, theirs in changes:
        for shown, sign in ((mine, 1), (theirs, -1)):
            if shown is not None:
                kind, n = shown
                files += sign * (kind == "f")
                dirs += sign * (kind == "d")
                size += sign * n * (kind == "f")
    return files, dirs, size


def counted(changes: list[Change], kind: str | None) -> int:
    """What ``changes`` add to a count of the entries (of ``kind``) in their range."""

    def one(path: str, shown: Shown) -> int:
        return int(shown is not None and bool(path) and (kind is None or shown[0] == kind))

    return sum(one(path, mine) - one(path, theirs) for path, mine, theirs in changes)


async def files(
    db: aiosqlite.Connection, layers: Layers, version: int, scope: str, shas: list[str] | None
) -> list[tuple[str, str]]:
    """``(path, sha256)`` of the text files below ``scope`` as of ``version`` (holding one
    of ``shas``, if given), by path: a few contents looked up in each layer by content;
    else the layers' ranges of ``scope`` merged."""
    lo, hi = subtree(scope) if scope else ALL
    if shas is not None and len(shas) <= sql.FILES_LISTED_MAX:
        nodes = await merged.holding(db, layers, version, lo, hi, shas)
        return [(n.path, n.sha256 or "") for n in nodes]
    wanted = set(shas) if shas is not None else None
    out: list[tuple[str, str]] = []
    async with aclosing(merged.in_path_order(db, layers, version, lo, hi)) as walk:
        async for n in walk:
            if n.kind == "f" and not n.binary and (wanted is None or n.sha256 in wanted):
                out.append((n.path, n.sha256 or ""))
    return out


async def entries_page(
    db: aiosqlite.Connection,
    layers: Layers,
    version: int,
    start: str,
    upper: str | None,
    limit: int,
) -> list[Node]:
    """Up to ``limit`` entries in path order from ``start`` on, below ``upper``."""
    hi = upper if upper is not None else ALL[1]
    walk = merged.in_path_order(db, layers, version, start, hi, min(merged.PAGE_MOST, limit))
    return await _take(walk, lambda _: True, limit)


async def recent(
    db: aiosqlite.Connection,
    layers: Layers,
    version: int,
    kind: str | None,
    after: tuple[str, str] | None,
    limit: int,
) -> tuple[list[Node], tuple[str, str] | None]:
    """Up to ``limit`` entries (of ``kind``) newest first, after the ``(modified, path)`` of
    the last one taken, and the ``(modified, path)`` of the last of these."""
    walk = merged.in_recent_order(db, layers, version, after, min(merged.PAGE_MOST, limit))
    page = await _take(walk, lambda n: kind is None or n.kind == kind, limit)
    last = (page[-1].modified.isoformat(), page[-1].path) if page else None
    return page, last


def _ranges(layers: Layers) -> list[tuple[int, int, int]]:
    """``(ws, above, upto)``: the versions each layer's own events are, ``(above, upto]``:
    a fork's from its fork point on (its ``workspace_forked`` event is its version ``N``,
    continuing the chain of the source's event ``N``), the source's below it."""
    out = []
    for i, (ws, cap) in enumerate(layers):
        above = layers[i + 1][1] - 1 if i + 1 < len(layers) else 0
        upto = cap - 1 if i else cap
        out.append((ws, above, upto))
    return out


async def events(
    db: aiosqlite.Connection, layers: Layers, after: int, upto: int, limit: int
) -> list[tuple[Any, ...]]:
    """The events with version in ``(after, upto]``, oldest first, across the layers."""
    out: list[tuple[Any, ...]] = []
    for ws, above, cap in reversed(_ranges(layers)):
        lo, hi = max(after, above), min(upto, cap)
        if lo >= hi or len(out) >= limit:
            continue
        rows = await db.execute_fetchall(sql.EVENTS, (ws, lo, hi, limit - len(out)))
        out += [tuple(r) for r in rows]
    return out


async def events_desc(
    db: aiosqlite.Connection, layers: Layers, before: int, limit: int
) -> list[tuple[Any, ...]]:
    """The events with version below ``before``, newest first, across the layers."""
    out: list[tuple[Any, ...]] = []
    for ws, above, cap in _ranges(layers):
        hi = min(before, cap + 1)
        if hi <= above + 1 or len(out) >= limit:
            continue
        rows = await db.execute_fetchall(sql.EVENTS_DESC, (ws, hi, limit - len(out)))
        out += [tuple(r) for r in rows if int(r[1]) > above]
    return out


Row = tuple[Node, tuple[Any, ...], tuple[Any, ...] | None]


async def path_history(
    db: aiosqlite.Connection, layers: Layers, path: str, upto: int, limit: int
) -> list[Row]:
    """The revisions of ``path`` at or below ``upto``, newest first, across the layers: the
    fork's own, then its source's up to the fork point. A whiteout is the delete of the
    revision before it; a source's revision the fork replaced ends where the fork's began."""
    rows: list[tuple[Row, int]] = []
    for i, (ws, cap) in enumerate(layers):
        at = min(upto, cap)
        found = await db.execute_fetchall(sql.PATH_HISTORY, (ws, path, at, limit + 1))
        for r in found:
            made, ended = tuple(r[12:16]), tuple(r[16:20]) if r[16] else None
            rows.append(((node_from_row(r), made, ended), cap if i else LIVE))
        if len(rows) > limit:
            break
    out: list[Row] = []
    newer: Row | None = None
    for (node, made, ended), cap in rows:
        if node.until > cap:  # valid at its layer's cap: until the nearer layer took over
            if newer is None:
                node = dataclasses.replace(node, until=LIVE)
            else:
                node = dataclasses.replace(node, until=newer[0].version)
                ended = newer[1] if newer[0].kind == WHITEOUT else None
        newer = (node, made, ended)
        if node.kind != WHITEOUT:
            out.append((node, made, ended))
    return out
