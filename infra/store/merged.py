"""A fork's pages: its layers' index ranges merged, so a page costs what it returns (issue 33).

A fork's tree is its layers' (``infra/store/layers.py``): the nearest layer with a row of a
path at or before its version decides the path. Reading the whole tree of each layer to
answer a page of it made a listing, a glob or a grep of a fork of a 10,000-file workspace cost
its 10,000 rows. Here each layer is read as a workspace is (``infra/sql/layers.py``):

* **a layer's entries valid at its version** ``at`` are its live rows made by then, a page of
  an index in the order asked (``revisions_live`` for path order, ``revisions_recent`` for
  newest first, ``revisions_children`` for one directory, ``revisions_content`` for a few
  contents), and its rows valid at ``at`` that ended since (``LAYER_ENDED``: what the layer
  changed since its fork point, read whole and sorted here; none at the fork's newest);
* **a nearer layer hides** a lower layer's entry if it has any row of that path at or before
  its own version (a change, a delete, a whiteout): one seek a path and nearer layer, asked
  for a page's paths at once (``DECIDED``);
* **the layers are merged** in the order asked, a k-way merge of one cursor a layer, each
  fetching pages (64 rows, then twice as many up to 4,096) only when the merge reaches its
  end, so a caller that stops at its page stops the reads.

What a page costs: its entries, the nearer layers' seeks of them, and what each layer changed
since the version it is read at; never the layers' trees.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from datetime import datetime
from typing import Any

import aiosqlite

from core.plan import WHITEOUT
from core.rows import Node
from infra import sql
from infra.store.layers import Layers, shown

PAGE_FIRST, PAGE_MOST = 64, 4096
"""Rows of a layer's first page, and of its largest (each next page twice the last)."""
Row = Any
Key = Callable[[Row], Any]


def by_path(row: Row) -> Any:
    """Path order (a row's ``path``)."""
    return row[0]


def newest_first(row: Row) -> Any:
    """``glob``'s order: modified, newest first, then by path (``sql.RECENT``'s)."""
    return _recent(str(row[8]), str(row[0]))


def _recent(modified: str, path: str) -> tuple[float, str]:
    return (-datetime.fromisoformat(modified).timestamp(), path)


async def _rows(db: aiosqlite.Connection, text: str, args: Any) -> list[Row]:
    return list(await db.execute_fetchall(text, args))


async def undecided(db: aiosqlite.Connection, nearer: Layers, rows: list[Row]) -> list[Row]:
    """``rows`` (of a lower layer) whose paths none of the ``nearer`` layers decides."""
    for ws, cap in nearer:
        if not rows:
            break
        paths = json.dumps([r[0] for r in rows])
        decided = {str(r[0]) for r in await _rows(db, sql.DECIDED, (paths, ws, cap))}
        rows = [r for r in rows if r[0] not in decided]
    return rows


def _capped(layers: Layers, version: int) -> Layers:
    """Each layer with the version it is read at."""
    return [(ws, min(version, cap)) for ws, cap in layers]


LivePage = Callable[[Row | None, int], Awaitable[list[Row]]]
"""A layer's next page of live rows after a row (None: the first), at most so many."""


async def _layer(
    db: aiosqlite.Connection,
    layers: Layers,
    at: Layers,
    i: int,
    key: Key,
    live: LivePage,
    ended: list[Row],
    first: int,
) -> AsyncGenerator[Node, None]:
    """Layer ``i``'s entries in ``key``'s order, those a nearer layer decides left out:
    its live pages merged with its ``ended`` rows (valid at its version, ended since)."""
    ended = sorted(ended, key=key)
    last: Row | None = None
    size = first
    while True:
        page = await live(last, size)
        full = len(page) == size
        if full:
            bound = key(page[-1])
            take = [r for r in ended if key(r) <= bound]
            ended = ended[len(take) :]
        else:
            take, ended = ended, []
        rows = sorted(page + take, key=key) if take else page
        for row in await undecided(db, at[:i], rows):
            if row[1] != WHITEOUT:
                yield shown(row, layers[i][1], i == 0)
        if not full:
            return
        last, size = page[-1], min(2 * size, PAGE_MOST)


async def _merge(
    streams: list[AsyncGenerator[Node, None]], key: Callable[[Node], Any]
) -> AsyncGenerator[Node, None]:
    """The k-way merge of ``streams`` (each in ``key``'s order, no path in two), each
    closed when the merge is (a caller stopping at its page stops their reads)."""
    try:
        heads: list[tuple[Any, int, Node]] = []
        for n, stream in enumerate(streams):
            node = await anext(stream, None)
            if node is not None:
                heads.append((key(node), n, node))
        while heads:
            best = min(heads)
            heads.remove(best)
            yield best[2]
            node = await anext(streams[best[1]], None)
            if node is not None:
                heads.append((key(node), best[1], node))
    finally:
        for stream in streams:
            await stream.aclose()


def _node_path(node: Node) -> Any:
    return node.path


def _node_recent(node: Node) -> Any:
    return (-node.modified.timestamp(), node.path)


async def in_path_order(
    db: aiosqlite.Connection,
    layers: Layers,
    version: int,
    lo: str,
    hi: str,
    first: int = PAGE_FIRST,
) -> AsyncGenerator[Node, None]:
    """A fork's entries with ``lo <= path < hi`` as of ``version``, in path order, read as
    they are taken (``first``: rows of each layer's first page)."""
    at = _capped(layers, version)
    streams = []
    for i, (ws, cap) in enumerate(at):

        async def live(last: Row | None, size: int, ws: int = ws, cap: int = cap) -> list[Row]:
            start = lo if last is None else str(last[0]) + "\0"
            return await _rows(db, sql.LAYER_LIVE_PAGE, (ws, cap, start, hi, size))

        ended = await _rows(db, sql.LAYER_ENDED, (ws, cap, cap, lo, hi))
        streams.append(_layer(db, layers, at, i, by_path, live, ended, first))
    async with aclosing(_merge(streams, _node_path)) as nodes:
        async for node in nodes:
            yield node


async def in_recent_order(
    db: aiosqlite.Connection,
    layers: Layers,
    version: int,
    after: tuple[str, str] | None,
    first: int = PAGE_FIRST,
) -> AsyncGenerator[Node, None]:
    """A fork's entries as of ``version``, newest first (``glob``'s order), after the
    ``(modified, path)`` of one, read as they are taken."""
    at = _capped(layers, version)
    mark = _recent(*after) if after is not None else None
    streams = []
    for i, (ws, cap) in enumerate(at):

        async def live(last: Row | None, size: int, ws: int = ws, cap: int = cap) -> list[Row]:
            since = (str(last[8]), str(last[0])) if last is not None else after
            if since is None:
                return await _rows(db, *sql.layer_recent(ws, cap, None, False, size))
            rows = await _rows(db, *sql.layer_recent(ws, cap, since, False, size))
            if len(rows) < size:
                rows += await _rows(db, *sql.layer_recent(ws, cap, since, True, size - len(rows)))
            return rows

        ended = await _rows(db, sql.LAYER_ENDED, (ws, cap, cap, "", "\U0010ffff"))
        if mark is not None:
            ended = [r for r in ended if newest_first(r) > mark]
        streams.append(_layer(db, layers, at, i, newest_first, live, ended, first))
    async with aclosing(_merge(streams, _node_recent)) as nodes:
        async for node in nodes:
            yield node


async def children(
    db: aiosqlite.Connection, layers: Layers, version: int, directory: str
) -> list[Node]:
    """A fork's entries in ``directory`` as of ``version``, by path: each layer's children of
    it (one seek of ``revisions_children``) less those a nearer layer decides."""
    at = _capped(layers, version)
    out: list[Node] = []
    for i, (ws, cap) in enumerate(at):
        rows = await _rows(db, sql.LAYER_CHILDREN, (ws, directory, cap, cap))
        rows = [r for r in rows if r[0] != directory]
        out += [
            shown(r, layers[i][1], i == 0)
            for r in await undecided(db, at[:i], rows)
            if r[1] != WHITEOUT
        ]
    return sorted(out, key=_node_path)


async def holding(
    db: aiosqlite.Connection, layers: Layers, version: int, lo: str, hi: str, shas: list[str]
) -> list[Node]:
    """A fork's text files with ``lo <= path < hi`` as of ``version`` holding one of
    ``shas``, by path: each layer's (one seek of ``revisions_content`` a content, and its
    rows ended since its version) less those a nearer layer decides."""
    at = _capped(layers, version)
    wanted = set(shas)
    listed = json.dumps(shas)
    out: list[Node] = []
    for i, (ws, cap) in enumerate(at):
        rows = await _rows(db, sql.LAYER_HOLDING, (ws, cap, listed, lo, hi))
        rows += [
            r
            for r in await _rows(db, sql.LAYER_ENDED, (ws, cap, cap, lo, hi))
            if r[1] == "f" and not r[6] and r[2] in wanted
        ]
        out += [shown(r, layers[i][1], i == 0) for r in await undecided(db, at[:i], rows)]
    return sorted(out, key=_node_path)
