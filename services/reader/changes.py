"""What changed between two versions of one workspace, in O(changes), not O(tree): the
paths ``qry.diff`` compares (``services.reader.diff``) and the entries ``qry.tree`` with
``changed_from`` answers (an executor links the rest from the checkout it holds: a fork's
first checkout, ``infra.exec.links``). One place for both (issue 33).

The paths changed in versions ``(lo, hi]`` are its events' summaries and the rows ended in
the range, through a fork's layers (``Store.changed_in``: two range seeks a layer); events
whose summaries were cut are read from the log (``infra.log.cut_paths``). A directory
removed, moved or added is named alone in a summary: what was below it is its subtree's
range of each layer at the version asked (``below``). Part of the range below the floor of a
layer that holds it (compaction dropped the events and rows that name what changed there)
cannot be told: None, and the caller reads the whole tree instead.
"""

from __future__ import annotations

from nats.js import JetStreamContext

from contracts.limits import TREE_CHANGED_ENTRIES, TREE_CHANGED_MOST
from contracts.paths import ancestors
from core.rows import Node, WorkspaceRow
from infra import log as eventlog
from infra.store import TOP, Layers, Store
from services.reader import forked
from services.reader.readmodel import ReadModel, Scope


class Changes:
    """What changed between two versions of a workspace, over the replica's store; ``js``
    reads the events whose summaries the projection cut (None: such a range cannot be told)."""

    def __init__(self, store: Store, js: JetStreamContext | None) -> None:
        self.store, self.js = store, js
        self.model = ReadModel(store)

    def layers(self, ws: WorkspaceRow) -> Layers:
        """Its layers, nearest first (a workspace that is no fork: its one layer)."""
        return self.store.layers(ws.id) or [(ws.id, TOP)]

    async def paths(
        self, ws: WorkspaceRow, layers: Layers, lo: int, hi: int, scope: str = ""
    ) -> set[str] | None:
        """The paths of ``scope`` changed in versions ``(lo, hi]`` (the scope itself when a
        directory above it changed); None when part of the range is below the floor of a
        layer that holds it."""
        if lo == hi:
            return set()
        if not self.above_floors(ws, layers, lo, hi):
            return None
        paths, cut = await self.store.changed_in(layers, lo, hi)
        if cut:
            if self.js is None:
                return None
            paths |= await eventlog.cut_paths(self.js, cut)
        paths.discard("")
        if not scope:
            return paths
        inside = {p for p in paths if p == scope or p.startswith(scope + "/")}
        if any(scope.startswith(p + "/") for p in paths):
            inside.add(scope)
        return inside

    def above_floors(self, ws: WorkspaceRow, layers: Layers, lo: int, hi: int) -> bool:
        """Whether each layer's part of ``(lo, hi]`` starts at or above its floor (what
        compaction dropped below it no longer names what changed)."""
        rows: list[WorkspaceRow | None] = [ws]
        rows += [self.store.workspace(ws.tenant, name) for name, _ in ws.lineage]
        for i, (_, cap) in enumerate(layers):
            below = layers[i + 1][1] if i + 1 < len(layers) else 0
            if min(cap, hi) <= max(lo, below):
                continue  # none of the range is this layer's
            row = rows[i] if i < len(rows) else None
            if row is None or max(lo, below) < row.floor:
                return False
        return True

    async def below(
        self, layers: Layers, version: int, directory: str, kind: str | None = "f"
    ) -> dict[str, Node]:
        """The entries (of ``kind``; None: files and directories) below ``directory`` as of
        ``version``: each layer's live rows in the subtree's range and its rows there valid
        then and ended since (``infra/store/merged.py``). Not ``entries_at``: below a
        directory at an older version it reads the whole workspace's live rows."""
        scope = Scope(directory, recursive=True, kind=kind)
        nodes = await forked.scoped(self.store.reads, layers, version, scope, None, None)
        return {n.path: n for n in nodes}

    async def entries(
        self, ws: WorkspaceRow, version: int, since: int
    ) -> tuple[list[str], list[Node]] | None:
        """The paths changed between ``version`` and ``since`` (either order), sorted, and the
        entries as of ``version`` at and below them, by path (parents first). Every path made
        or removed in between is named (the writer commits each parent it makes as its own
        ``MakeDir``; a directory removed is named alone). None when that
        cannot be told in O(changes): part of the range compacted away, more than
        ``TREE_CHANGED_MOST`` paths or ``TREE_CHANGED_ENTRIES`` entries."""
        layers = self.layers(ws)
        found = await self.paths(ws, layers, min(version, since), max(version, since))
        if found is None or len(found) > TREE_CHANGED_MOST:
            return None
        changed = found
        nodes: dict[str, Node] = {}
        for root in sorted(changed):
            if any(a in changed for a in ancestors(root)):
                continue  # below another changed path: its subtree is read whole
            node = await self.model.node(ws.id, root, version)
            if node is None:
                continue  # absent as of ``version``
            nodes[root] = node
            if node.kind == "d":
                nodes.update(await self.below(layers, version, root, None))
            if len(nodes) > TREE_CHANGED_ENTRIES:
                return None
        return sorted(changed), [nodes[p] for p in sorted(nodes)]
