"""A fork's history through its layers (issue 33): nothing of the source is copied.

A fork's row names its lineage, ``[(source, N), (source's source, M), ...]``: its history up
to ``N`` is the source's (up to ``M``, the source's source's...). Its own revision rows start
after ``N``. Layer 0 is the fork itself (capped at nothing), layer ``i`` workspace ``w_i``
capped at ``N_i``; a read as of version ``v`` asks layer ``i`` as of ``min(v, N_i)``.

**Who decides a path**: the nearest layer holding a row of it at or before its version
(live, ended or a whiteout). So a fork's change of an inherited file hides the source's, and a
delete of an inherited path leaves a *whiteout* (``core.plan.WHITEOUT``: a row valid over no
version, ``until = version``) of it and of everything it inherited below it; like an overlay
filesystem's. A path no layer decides does not exist.

* one path: a seek of the primary key per layer, nearest first, until one has a row;
* a tree (a listing, glob, grep, diff, the writer's load): each layer's entries as of its
  version (its live rows, or those valid then: what changed since, as for any workspace),
  less the paths a nearer layer decides (``TOUCHED``: the nearer layers' own paths, a range
  of their primary key). A fork's tree costs its source's tree at the fork point plus what
  the fork changed.

Rows of a lower layer are shown valid from their version on (``until`` LIVE) when they were
valid at the layer's cap: when a nearer layer takes the path over is that layer's row.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Generator
from typing import Any

import aiosqlite

from contracts.paths import parent
from core.plan import LIVE, WHITEOUT, exact, subtree
from core.rows import Node
from infra import sql
from infra.store.base import StoreBase, lineage_of, node_from_row

TOP = 2**62
"""The cap of a fork's own layer (no cap)."""
ALL = ("", "\U0010ffff")
"""The range of every path."""
Layers = list[tuple[int, int]]
"""``(ws, cap)`` of each layer, the fork itself first."""


def _range(scope: str, with_scope: bool) -> list[tuple[str, str]]:
    """The path ranges of everything below ``scope`` (and ``scope`` itself)."""
    if not scope:
        return [ALL]
    below = [subtree(scope)]
    return [exact(scope), *below] if with_scope else below


def shown(row: Any, cap: int, nearest: bool) -> Node:
    """A layer's row as the fork shows it (valid from its version on when it was at the cap)."""
    return node_from_row(row, LIVE if not nearest and row[10] > cap else None)


class Layering(StoreBase):
    """A fork's reads through its layers, and the whiteouts its deletes leave."""

    def layers(self, ws: int) -> Layers | None:
        """Workspace ``ws``'s layers, itself first; None when it is no fork (one seek, then
        held: a lineage never changes for a workspace's id)."""
        held = self._layers.get(ws, False)
        if held is not False:
            return held  # type: ignore[return-value]
        found = self._lookup.execute(sql.FORK_OF, (ws,)).fetchall()
        layers: Layers | None = None
        if found and found[0][1]:
            tenant, lineage = str(found[0][0]), lineage_of(found[0][1])
            layers = [(ws, TOP)]
            for name, version in lineage:
                row = self.workspace(tenant, name)
                if row is None:  # the base is gone (it cannot be purged while forked)
                    break
                layers.append((row.id, version))
        if len(self._layers) > 4096:
            self._layers.clear()
        self._layers[ws] = layers
        return layers

    async def layered_node(
        self, layers: Layers, path: str, version: int, *, data: bool = False
    ) -> tuple[Node, bytes | None] | None:
        """``path`` as of ``version`` through ``layers``: the nearest layer with a row of it
        decides (one seek a layer)."""
        statement = sql.NODE_WITH_DATA if data else sql.NODE
        for i, (ws, cap) in enumerate(layers):
            at = min(version, cap)
            rows = list(await self._r.execute_fetchall(statement, (ws, path, at)))
            if not rows:
                continue
            row = rows[0]
            if row[10] <= at or row[1] == WHITEOUT:
                return None
            return shown(row, cap, i == 0), (row[12] if data else None)
        return None

    async def layered_entries(
        self,
        layers: Layers,
        version: int,
        scope: str = "",
        *,
        with_scope: bool = False,
        db: aiosqlite.Connection | None = None,
    ) -> list[Node]:
        """Every entry below ``scope`` (and ``scope``, ``with_scope``) as of ``version``
        through ``layers``, in path order."""
        db = db or self._r
        walk = _entries(layers, version, _range(scope, with_scope))
        try:
            query = next(walk)
            while True:
                query = walk.send(list(await db.execute_fetchall(*query)))
        except StopIteration as done:
            nodes: list[Node] = done.value
            return nodes

    async def whiteouts(self, db: aiosqlite.Connection, items: list[Any]) -> int:
        """Insert the whiteouts of a fork's deletes (``core.plan.Plan.whiteouts``): of each
        deleted path and of everything the fork inherited below it. Inside an apply, on its
        connection (the layers below were applied before the fork's events)."""
        made = 0
        for ws, path, version, lineage, at in items:
            tenant_rows = list(await db.execute_fetchall(sql.FORK_OF, (ws,)))
            if not tenant_rows:
                continue
            tenant = str(tenant_rows[0][0])
            below: Layers = []
            for name, cap in lineage:
                ids = list(await db.execute_fetchall(sql.WORKSPACE_BY_NAME, (tenant, name)))
                if not ids:
                    break
                below.append((int(ids[0][0]), int(cap)))
            inherited = [path]
            if below:
                nodes = await self.layered_entries(below, below[0][1], path, with_scope=True, db=db)
                inherited += [n.path for n in nodes if n.path != path]
            rows = [(ws, p, version, parent(p), at) for p in inherited]
            await db.executemany(sql.INSERT_WHITEOUT, rows)
            made += len(rows)
        return made

    async def layered_histories(
        self, layers: Layers, paths: list[str]
    ) -> dict[str, tuple[int | None, int | None]]:
        """``Store.histories`` through ``layers``: a path's last file version (the greatest
        of its layers': file versions only grow) and its last change (the nearest layer
        with a row of it)."""
        out: dict[str, tuple[int | None, int | None]] = {}
        left = list(paths)
        for ws, cap in layers:
            if not left:
                break
            rows = await self._r.execute_fetchall(sql.LAYER_HISTORIES, (ws, json.dumps(left), cap))
            more = []
            for path, fv, changed in rows:
                was = out.get(str(path), (None, None))
                fv_best = max((x for x in (was[0], fv) if x is not None), default=None)
                if changed is not None and was[1] is None:
                    out[str(path)] = (fv_best, int(changed))
                else:
                    out[str(path)] = (fv_best, was[1])
                    more.append(str(path))
            left = more
        return out

    async def fork_point(self, ws: int, version: int) -> tuple[str, str] | None:
        """The chain hash and tree hash of workspace ``ws``'s event at ``version`` (None: not
        held, compacted away)."""
        rows = list(await self._r.execute_fetchall(sql.EVENT_AT, (ws, version)))
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    async def trust_event(self, ws: int) -> bytes | None:
        """The newest event that set workspace ``ws``'s trust (JSON), if any."""
        rows = list(await self._r.execute_fetchall(sql.TRUST_NOW, (ws,)))
        return str(rows[0][0]).encode() if rows else None

    async def forks_of(
        self, tenant: str, name: str, after: str = "", limit: int = 100
    ) -> list[tuple[str, tuple[tuple[str, int], ...], int]]:
        """The workspaces forked from ``tenant/name`` (their nearest layer), by name:
        ``(name, lineage, version)``."""
        rows = await self._r.execute_fetchall(sql.FORKS_OF, (tenant, name, after, limit))
        return [(str(r[0]), lineage_of(r[1]), int(r[2])) for r in rows]


Query = tuple[str, tuple[Any, ...]]


def _entries(
    layers: Layers, version: int, ranges: list[tuple[str, str]]
) -> Generator[Query, list[Any], list[Node]]:
    """``layered_entries``'s walk: it yields each statement and is sent its rows, so that a
    connection of any kind runs it (aiosqlite's on the event loop, a thread's own sqlite3
    connection: ``entries_on``). One layer over one range (a fork's source, as the writer
    loads it) is its rows as they come, in path order: nothing to hide, nothing to sort."""
    if len(layers) == 1 and len(ranges) == 1:
        (ws, cap), (lo, hi) = layers[0], ranges[0]
        at = min(version, cap)
        rows = yield sql.LAYER_ROWS, (ws, at, at, lo, hi)
        return [shown(row, cap, True) for row in rows if row[1] != WHITEOUT]
    found: dict[str, Node] = {}
    decided: set[str] = set()
    for i, (ws, cap) in enumerate(layers):
        at = min(version, cap)
        last = i == len(layers) - 1
        for lo, hi in ranges:
            for row in (yield sql.LAYER_ROWS, (ws, at, at, lo, hi)):
                path = str(row[0])
                if path not in decided and path not in found and row[1] != WHITEOUT:
                    found[path] = shown(row, cap, i == 0)
            if not last:
                for (path,) in (yield sql.TOUCHED, (ws, lo, hi, at)):
                    decided.add(str(path))
    return [found[p] for p in sorted(found)]


def entries_on(db: sqlite3.Connection, layers: Layers, version: int) -> list[Node]:
    """``Layering.layered_entries`` of the whole tree on ``db``, a connection of the calling
    thread (the writer's loading thread: a fork's tree is as large as its source's)."""
    walk = _entries(layers, version, [ALL])
    try:
        query = next(walk)
        while True:
            query = walk.send(db.execute(*query).fetchall())
    except StopIteration as done:
        nodes: list[Node] = done.value
        return nodes
