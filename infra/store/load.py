"""Loading the writer's state of a workspace from its projection: its head, live tree,
controls, uncommitted files and recent results, in one read transaction (``infra.store``)."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any, NamedTuple

from contracts import codec
from contracts.uncommitted import Recorded
from core.evolve import WorkspaceState, evolve
from core.plan import head_of
from core.rows import Node, WorkspaceRow
from core.tree import Tree, place
from infra import sql
from infra.store.base import instrument, node_from_row
from infra.store.layers import ALL, TOP, Layering, Layers, entries_on

SMALL_LOAD = 64
"""A workspace of at most this many events and revision rows is loaded on the event loop's
thread (``Store.load``)."""


def _results(rows: list[Any]) -> list[tuple[str, int, bytes]]:
    """``sql.RECENT_RESULTS``'s rows, oldest first, those of events with a request id."""
    return [(r[0], int(r[1]), str(r[2]).encode()) for r in reversed(rows) if r[0]]


class Loaded(NamedTuple):
    """What ``Store.load`` read of a workspace: the writer's state and its recent results."""

    state: WorkspaceState
    recent: list[tuple[str, int, bytes]]
    """``(request_id, version, result)`` of its last events, oldest first."""


class Loading(Layering):
    """The writer's state of a workspace, read from the projection."""

    async def load_state(self, tenant: str, name: str) -> WorkspaceState:
        """The writer's in-memory state of a workspace, as projected here."""
        return (await self.load(tenant, name)).state

    async def load(self, tenant: str, name: str, recent: int = 0) -> Loaded:
        """The writer's in-memory state of a workspace, as projected here, and the request
        id, version and result of its last ``recent`` events, every query in one read
        transaction: on the event loop's thread for a small workspace (``SMALL_LOAD``: a few
        dozen microseconds of SQLite, less than a hop to another thread), else on the loading
        thread, so that the loop never waits on a large one. Before, five queries on
        aiosqlite's connection were five hops, queued behind the applier's transactions:
        what a write to a workspace the writer no longer holds paid (issue 17). A fork's tree
        is its layers' (``_inherit``): it is small only when they are too."""
        row = self.workspace(tenant, name)
        if row is None:
            return Loaded(WorkspaceState(tenant, name), [])
        state = head_of(row)
        layers = self.layers(row.id) if row.lineage else None
        below = layers[1:] if layers else None
        if row.version <= SMALL_LOAD and all(
            self._small(ws) for ws in [row.id, *(w for w, _ in below or [])]
        ):
            results = self._fill(self._lookup, state, row.id, recent, below)
        else:
            loop = asyncio.get_running_loop()
            results = await loop.run_in_executor(
                self._loading, self._fill_apart, state, row, recent, below
            )
        return Loaded(state, results)

    def _small(self, ws: int) -> bool:
        """Whether the workspace has at most ``SMALL_LOAD`` revision rows (counting stops
        there: the question costs the same for any workspace)."""
        probe = self._lookup.execute(sql.SMALL_PROBE, (ws, SMALL_LOAD + 1))
        return int(probe.fetchone()[0]) <= SMALL_LOAD

    def _fill_apart(
        self, state: WorkspaceState, row: WorkspaceRow, recent: int, below: Layers | None
    ) -> list[tuple[str, int, bytes]]:
        """``_fill`` on the loading thread, on its own connection."""
        if self._loader is None:
            self._loader = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._loader.execute("PRAGMA query_only=1")
            if self.steps is not None:
                instrument(self._loader, self.steps, "loader")
        return self._fill(self._loader, state, row.id, recent, below)

    @staticmethod
    def _fill(
        db: sqlite3.Connection,
        state: WorkspaceState,
        ws: int,
        recent: int,
        below: Layers | None = None,
    ) -> list[tuple[str, int, bytes]]:
        """``state``'s tree, controls and uncommitted files, and the last ``recent`` results,
        from one read transaction on ``db``.

        The tree is the live rows (one seek of ``revisions_live``), each path's last file
        version and last change those of its live row: O(files of the tree). The history of
        the paths that are not live (deleted, moved away) stays in the projection until a
        decision reads it (``Tree.partial``, ``core.decide.needs``): grouping every revision
        of the workspace for it cost a restarted writer 1.2 s at 100,000 events (issue 29),
        and a table kept per path ever made would still grow with every deleted build output
        or temporary file; these lookups cost two seeks a path a command names."""
        db.execute("BEGIN")
        try:
            tree = state.tree
            tree.partial, tree.loaded_at = True, state.version
            for r in db.execute(sql.LIVE_TREE, (ws,)):
                _held(tree, node_from_row(r))
            if below:
                _inherit(db, tree, ws, below)
            for (event,) in db.execute(sql.LIVE_CONTROLS, (ws,)):  # their effect: evolved
                evolve(state, codec.decode_event(str(event).encode()), tree=False)
            for path, reason, by, version in db.execute(sql.UNCOMMITTED_OF, (ws,)):
                state.uncommitted[str(path)] = Recorded(str(reason), str(by), int(version))
            results = (
                _results(db.execute(sql.RECENT_RESULTS, (ws, recent)).fetchall()) if recent else []
            )
        finally:
            db.execute("COMMIT")
        return results

    async def recent_results(
        self, tenant: str, name: str, limit: int
    ) -> list[tuple[str, int, bytes]]:
        """``(request_id, version, result)`` of the workspace's last ``limit`` events, oldest
        first (what ``load`` reads with the state, alone)."""
        ws = self.workspace_id(tenant, name)
        if ws is None:
            return []
        return _results(list(await self._w.execute_fetchall(sql.RECENT_RESULTS, (ws, limit))))


def _inherit(db: sqlite3.Connection, tree: Tree, ws: int, below: Layers) -> None:
    """A fork's tree: what it inherited from the layers ``below`` it at the fork point and has
    not changed since (``infra/store/layers.py``), beside its own live rows (``Loading._fill``),
    in the same read transaction. A fork's tree is as large as its source's: read, like the
    source's, on the loading thread (on the event loop it held up every other workspace of
    the writer for the second 100,000 files take)."""
    own = {str(r[0]) for r in db.execute(sql.TOUCHED, (ws, *ALL, TOP))}
    for node in entries_on(db, below, below[0][1]):
        if node.path not in own and node.path:
            _held(tree, node)


def _held(tree: Tree, node: Node) -> None:
    """``node`` in the loaded tree, with its last file version and last change."""
    place(tree, node)
    if node.file_version:
        tree.last_fv[node.path] = node.file_version
    tree.changed[node.path] = node.version
