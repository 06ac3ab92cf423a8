"""Reads of a projection as of any version (the live form first), and the writer's
lookups of results and path histories (``infra.store``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from contracts.uncommitted import Recorded
from core.decision import Needs
from core.plan import subtree
from core.rows import Node
from core.tree import Tree
from infra import sql
from infra.store.base import node_from_row
from infra.store.layers import Layering

HISTORIES_INLINE = 16
"""Paths whose history ``Store.histories`` looks up on the event loop's thread (more: on
aiosqlite's)."""


class Queries(Layering):
    """Reads as of a version, and the writer's lookups of history and results."""

    async def as_of(
        self,
        ws: int,
        version: int,
        statement: Callable[[bool], tuple[str, list[Any]]],
        found: Callable[[list[Any]], bool] = bool,
    ) -> list[Any]:
        """The rows of a statement as of ``version``: its live form first (``statement(True)``:
        one seek of the live rows, which answers nothing unless ``version`` is the workspace's
        newest when it runs); if that finds nothing (``found``) and ``version`` is not the
        newest, its historical form (``statement(False)``: the live rows and those ended
        since ``version``). An empty answer at the newest version is checked with one lookup
        of the workspace's row, never by the historical form (which reads the whole tree)."""
        text, args = statement(True)
        rows = list(await self._r.execute_fetchall(text, args))
        if found(rows) or self.is_newest(ws, version):
            return rows
        text, args = statement(False)
        return list(await self._r.execute_fetchall(text, args))

    def is_newest(self, ws: int, version: int) -> bool:
        """Whether ``version`` is workspace ``ws``'s newest (committed) version."""
        return self._lookup.execute(sql.IS_NEWEST, (ws, version)).fetchone() is not None

    async def entries_at(
        self, ws: int, version: int, scope: str = "", *, with_scope: bool = False
    ) -> list[Node]:
        """Every entry below directory ``scope`` as of ``version`` (and ``scope`` itself, when
        ``with_scope`` and it exists), in path order. At the newest version, one seek of the
        live rows (of the subtree); at an older one, the workspace's live rows and those
        ended since ``version``: what changed since, never the history before it."""
        layers = self.layers(ws)
        if layers is not None:  # a fork: through its layers
            return await self.layered_entries(layers, version, scope, with_scope=with_scope)
        rows = await self.as_of(
            ws, version, lambda newest: sql.entries(ws, version, scope, with_scope, newest)
        )
        return [node_from_row(r) for r in rows]

    async def uncommitted(self, ws: int, paths: list[str]) -> dict[str, Recorded]:
        """Which of ``paths`` a command left in its sandbox uncommitted, as last recorded."""
        rows = await self._r.execute_fetchall(
            sql.UNCOMMITTED_AT.format(marks=sql.marks(len(paths))), (ws, *paths)
        )
        return {str(r[0]): Recorded(str(r[1]), str(r[2]), int(r[3])) for r in rows}

    def results_of(self, ws: int, request_ids: list[str]) -> dict[str, tuple[int, bytes]]:
        """The version and result of the event of each of ``request_ids`` the workspace has,
        by request id: one seek of the writer's ``events_request`` index an id, all in one
        statement, on the event loop's thread (a writer asks for a group's ids at once, at
        most ``MAX_GROUP``: ~20 us for one id, ~0.2 ms for 256). It was a hop to aiosqlite's
        writing thread for each command, queued behind the projection's apply: 40% of a hot
        workspace's time."""
        rows = self._lookup.execute(sql.RESULTS_OF, (ws, json.dumps(request_ids))).fetchall()
        found: dict[str, tuple[int, bytes]] = {}
        for request_id, version, result in rows:  # index order: the first event of an id
            found.setdefault(str(request_id), (int(version), str(result).encode()))
        return found

    async def histories(
        self, ws: int, paths: list[str]
    ) -> dict[str, tuple[int | None, int | None]]:
        """Of each of ``paths``: its last file version and the version it last changed at
        (None: never a file; never existed), two seeks a path. A few on the event loop's
        thread (less than a hop to aiosqlite's), more on aiosqlite's."""
        args = (ws, json.dumps(paths))
        if len(paths) <= HISTORIES_INLINE:
            rows = self._lookup.execute(sql.PATH_HISTORIES, args).fetchall()
        else:
            rows = list(await self._r.execute_fetchall(sql.PATH_HISTORIES, args))
        return {str(r[0]): (r[1], r[2]) for r in rows}

    async def look_up(self, tree: Tree, ws: int | None, wanted: Needs) -> None:
        """Put into ``tree`` (loaded from this projection: ``Tree.partial``) the history of
        workspace ``ws`` that ``wanted`` names. Those paths did not change since the tree was
        loaded (else it has them), so this projection holds what they are."""
        if ws is None:  # not projected yet: no history before this tree
            tree.looked.update(wanted.history)
            return
        layers = self.layers(ws)
        if layers is not None and wanted.history:  # a fork: through its layers
            found = await self.layered_histories(layers, wanted.history)
        else:
            found = await self.histories(ws, wanted.history) if wanted.history else {}
        for path in wanted.history:
            tree.learn(path, *found.get(path, (None, None)))
        for directory, after in wanted.changes_below:
            for path, until in await self.changed_below(ws, directory, after):
                tree.changed.setdefault(path, until)

    async def changed_below(self, ws: int, directory: str, after: int) -> list[tuple[str, int]]:
        """The paths below ``directory`` that ended after version ``after``, and when they
        last did (the revisions ended since ``after``)."""
        lo, hi = subtree(directory)
        rows = await self._r.execute_fetchall(sql.CHANGED_BELOW, (ws, after, lo, hi))
        return [(str(r[0]), int(r[1])) for r in rows]
