"""What the reader asks its projection: nodes, listings, history and contents as of a version.

Over the store's read-only connection (a WAL snapshot per statement); the statements, and the
plan each is meant to have, are in ``infra/sql/``.

A fork's totals and recursive counts are those of the layers below it as of its fork point,
moved by what it changed (``forked.changed``). The layers' part is computed once and held
(``HELD_MOST`` of them, least recently used dropped): a workspace's tree as of a version
never changes while it has forks (its rows up to a fork point are neither compacted nor
purged: ``services/writer/compaction.py``, ``lifecycle.py``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from core.plan import LIVE
from core.rows import Node
from infra import sql
from infra.store import Layers, Store, node_from_row
from infra.store.layers import ALL
from services.reader import forked
from services.reader.forked import Totals

HELD_MOST = 1024
"""Aggregates of a fork's layers below it (totals, counts of a scope) the reader holds."""
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Scope:
    """Which entries a listing covers: the children of ``directory`` (or, ``recursive``,
    everything beneath it), of ``kind`` (``f``, ``d`` or None for both), whose path relative
    to ``directory`` starts with ``prefix``."""

    directory: str
    recursive: bool = False
    kind: str | None = None
    prefix: str = ""

    def where(self, ws: int, version: int, newest: bool) -> tuple[str, str, list[Any]]:
        """The index, ``WHERE`` and arguments of its entries as of ``version`` (``newest``:
        the live form, ``infra/sql/``)."""
        return sql.listing(
            ws, version, self.directory, self.recursive, self.kind, self.prefix, newest
        )


class ReadModel:
    """The reader's SQL (``infra/sql/``) over the store's read-only connection. What is
    asked as of a version seeks the live rows at the workspace's newest version
    (``Store.as_of``), else the rows ended since that version: never the history before it."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = store.reads
        self._held: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

    async def _hold(self, key: tuple[Any, ...], compute: Callable[[], Awaitable[T]]) -> T:
        """``compute()``'s answer, held under ``key`` (what never changes: a workspace's
        aggregate as of a version a fork of it reads)."""
        if key in self._held:
            self._held.move_to_end(key)
            value: T = self._held[key]
            return value
        value = await compute()
        self._held[key] = value
        while len(self._held) > HELD_MOST:
            self._held.popitem(last=False)
        return value

    async def node(self, ws: int, path: str, version: int) -> Node | None:
        layers = self._store.layers(ws)
        if layers is not None:
            found = await self._store.layered_node(layers, path, version)
            return found[0] if found is not None else None
        rows = list(await self._db.execute_fetchall(sql.NODE, (ws, path, version)))
        if not rows or rows[0][10] <= version:
            return None
        return node_from_row(rows[0])

    async def node_with_data(
        self, ws: int, path: str, version: int
    ) -> tuple[Node, bytes | None] | None:
        layers = self._store.layers(ws)
        if layers is not None:
            return await self._store.layered_node(layers, path, version, data=True)
        rows = list(await self._db.execute_fetchall(sql.NODE_WITH_DATA, (ws, path, version)))
        if not rows or rows[0][10] <= version:
            return None
        return node_from_row(rows[0]), rows[0][12]

    async def page(
        self, ws: int, version: int, scope: Scope, after: tuple[str, str] | None, limit: int
    ) -> list[Node]:
        """Up to ``limit`` entries of ``scope`` as of ``version``, after the ``(kind, path)``
        of the previous page's last entry: directories first, then by name; or, recursive,
        by path."""
        layers = self._store.layers(ws)
        if layers is not None:
            return await forked.scoped(self._db, layers, version, scope, after, limit)

        def statement(newest: bool) -> tuple[str, list[Any]]:
            index, where, args = scope.where(ws, version, newest)
            return sql.page(index, where, args, scope.recursive, after, limit)

        rows = await self._store.as_of(ws, version, statement)
        return [node_from_row(r) for r in rows]

    async def count(self, ws: int, version: int, scope: Scope) -> int:
        """The entries of ``scope`` as of ``version``. Everything (recursive from the root,
        no prefix): the workspace's totals (``totals``: its row's counters, or what changed
        since ``version``), not a count of the tree. A fork's: one directory's, its layers'
        children merged; recursive, the layers' below as of its fork point (held) and what it
        changed in the scope's range."""
        if scope.recursive and not scope.directory and not scope.prefix:
            files, dirs, _ = await self.totals(ws, version)
            return {"f": files, "d": dirs}.get(scope.kind or "", files + dirs)
        layers = self._store.layers(ws)
        if layers is None:
            return await self._count(ws, version, scope)
        if not scope.recursive:
            return len(await forked.scoped(self._db, layers, version, scope, None, None))
        return await self._layered_count(layers, version, scope)

    async def _layered_count(self, layers: Layers, version: int, scope: Scope) -> int:
        (below, cap), deeper = layers[1], layers[2:]
        at = min(version, cap)
        lo, hi = forked.span(scope)

        async def base() -> int:
            if not deeper:  # its live rows in the range, and those ended since ``at``
                text, args = sql.layer_count(below, at, lo, hi, scope.kind)
                return int(list(await self._db.execute_fetchall(text, args))[0][0])
            return await self._layered_count(layers[1:], at, scope)

        held = await self._hold(("count", below, at, scope), base)
        changes = await forked.changed(self._db, layers, version, lo, hi)
        return held + forked.counted(changes, scope.kind)

    async def _count(self, ws: int, version: int, scope: Scope) -> int:
        """A workspace's (no fork) entries of ``scope`` as of ``version``: an indexed count."""

        def statement(newest: bool) -> tuple[str, list[Any]]:
            index, where, args = scope.where(ws, version, newest)
            return sql.COUNT.format(index=index, where=where), args

        rows = await self._store.as_of(ws, version, statement, lambda rows: rows[0][0] > 0)
        return int(rows[0][0])

    async def totals(self, ws: int, version: int) -> tuple[int, int, int]:
        """``(files, directories, total file bytes)`` as of ``version``: at the newest, the
        workspace row's counters (a reader's triggers keep them); at an older version, those
        less what the events since made plus the rows ended since (``sql.TOTALS_SINCE``)."""
        layers = self._store.layers(ws)
        if layers is not None:
            return await self._layered_totals(layers, version)
        return await self._totals(ws, version)

    async def _layered_totals(self, layers: Layers, version: int) -> Totals:
        """A fork's totals: the layers' below as of its fork point (held: they never change),
        moved by what its own rows change (``forked.changed``: its cost is what it changed)."""
        (below, cap), deeper = layers[1], layers[2:]
        at = min(version, cap)

        async def base() -> Totals:
            if not deeper:
                return await self._totals(below, at)
            return await self._layered_totals(layers[1:], at)

        held = await self._hold(("totals", below, at), base)
        return forked.moved(held, await forked.changed(self._db, layers, version, *ALL))

    async def _totals(self, ws: int, version: int) -> Totals:
        """A workspace's (no fork) totals as of ``version``."""
        rows = list(await self._db.execute_fetchall(sql.TOTALS_LIVE, (ws, version)))
        if rows:
            files, dirs, size = rows[0]
            return int(files), int(dirs), int(size)
        rows = list(await self._db.execute_fetchall(sql.TOTALS_SINCE, (ws, version)))
        newest, files, dirs, size, unknown = rows[0]
        if newest is not None and newest >= version and not unknown:  # O(changes since)
            return int(files), int(dirs), int(size)
        rows = list(await self._db.execute_fetchall(sql.TOTALS_AT, sql.at_args(ws, version)))
        by_kind = {kind: (count, size) for kind, count, size in rows}
        files, size = by_kind.get("f", (0, 0))
        return files, by_kind.get("d", (0, 0))[0], size

    async def path_history(
        self, ws: int, path: str, upto: int, limit: int
    ) -> list[tuple[Node, tuple[Any, ...], tuple[Any, ...] | None]]:
        """Revisions of ``path`` with version <= ``upto``, newest first, each with the event
        that made it and (if it ended by a delete) the event that ended it."""
        layers = self._store.layers(ws)
        if layers is not None:
            return await forked.path_history(self._db, layers, path, upto, limit)
        rows = await self._db.execute_fetchall(sql.PATH_HISTORY, (ws, path, upto, limit))
        return [
            (node_from_row(r), tuple(r[12:16]), tuple(r[16:20]) if r[16] else None) for r in rows
        ]

    async def events(self, ws: int, after: int, upto: int, limit: int) -> list[tuple[Any, ...]]:
        layers = self._store.layers(ws)
        if layers is not None:
            return await forked.events(self._db, layers, after, upto, limit)
        rows = await self._db.execute_fetchall(sql.EVENTS, (ws, after, upto, limit))
        return [tuple(r) for r in rows]

    async def events_desc(self, ws: int, before: int, limit: int) -> list[tuple[Any, ...]]:
        layers = self._store.layers(ws)
        if layers is not None:
            return await forked.events_desc(self._db, layers, before, limit)
        rows = await self._db.execute_fetchall(sql.EVENTS_DESC, (ws, before, limit))
        return [tuple(r) for r in rows]

    async def files(
        self, ws: int, version: int, scope: str, candidates: str | None = None
    ) -> list[tuple[str, str]]:
        """``(path, sha256)`` of every text file below ``scope`` as of ``version``; with
        ``candidates`` (an FTS5 query), only files whose content may match it: indexed
        contents that match, and contents not indexed yet. At the newest version, a few
        candidates are looked up by content (``revisions_content``: what it costs is what
        matches, not the tree); many, or an older version, filter the tree below ``scope``."""
        shas: list[str] | None = None
        if candidates is not None:
            shas = [r[0] for r in await self._db.execute_fetchall(sql.CANDIDATES, (candidates,))]
            if not shas:
                return []
            shas = list(dict.fromkeys(shas))
        layers = self._store.layers(ws)
        if layers is not None:
            return await forked.files(self._db, layers, version, scope, shas)
        if shas is not None:
            if len(shas) <= sql.FILES_LISTED_MAX:  # few: the files holding them, by content
                text, args = sql.files_holding(ws, version, scope, shas)
                rows = list(await self._db.execute_fetchall(text, args))
                if rows or self._store.is_newest(ws, version):
                    return [(r[0], r[1]) for r in rows]
        rows = await self._store.as_of(
            ws, version, lambda newest: sql.files(ws, version, scope, shas, newest)
        )
        return [(r[0], r[1]) for r in rows]

    async def recent(
        self,
        ws: int,
        version: int,
        kind: str | None,
        after: tuple[str, str] | None,
        limit: int,
    ) -> tuple[list[Node], tuple[str, str] | None] | None:
        """Up to ``limit`` live entries (of ``kind``) newest first, then by path, after the
        ``(modified, path)`` of the last one taken (``sql.RECENT``: two seeks at most), and
        the ``(modified, path)`` of the last of these. None: ``version`` is no longer the
        workspace's newest (ask ``entries_at``). A fork's, at any version: its layers' merged
        (``forked.recent``)."""
        layers = self._store.layers(ws)
        if layers is not None:
            return await forked.recent(self._db, layers, version, kind, after, limit)
        text, args = sql.recent(ws, version, kind, after, False, limit)
        rows = list(await self._db.execute_fetchall(text, args))
        if after is not None and len(rows) < limit:
            text, args = sql.recent(ws, version, kind, after, True, limit - len(rows))
            rows += await self._db.execute_fetchall(text, args)
        if len(rows) < limit and not self._store.is_newest(ws, version):
            return None  # (the workspace may have moved on between the two statements)
        last = (str(rows[-1][8]), str(rows[-1][0])) if rows else None
        return [node_from_row(r) for r in rows], last

    async def entries_page(
        self, ws: int, version: int, start: str, upper: str | None, limit: int
    ) -> list[Node] | None:
        """Up to ``limit`` live entries in path order from ``start`` on, below ``upper``
        (``sql.ENTRIES_PAGE``: one seek). None: ``version`` is no longer the newest. A
        fork's, at any version: its layers' ranges merged (``infra/store/merged.py``)."""
        layers = self._store.layers(ws)
        if layers is not None:
            return await forked.entries_page(self._db, layers, version, start, upper, limit)
        text, args = sql.entries_page(ws, version, start, upper, limit)
        rows = list(await self._db.execute_fetchall(text, args))
        if not rows and not self._store.is_newest(ws, version):
            return None
        return [node_from_row(r) for r in rows]

    async def workspaces(
        self, tenant: str, after: str, prefix: str, limit: int
    ) -> list[tuple[Any, ...]]:
        """A page of ``tenant``'s workspaces by name, after ``after`` (keyset on the unique
        ``(tenant, name)`` index: a page costs the same wherever it starts, and whatever the
        workspaces hold: their files and bytes are kept in their rows): ``(id, name, version,
        trust, created, at, actor, op, files, total_bytes)`` of each and of its last event."""
        args: list[Any] = [tenant, after]
        if prefix:
            args += [prefix, prefix + "\U0010ffff"]
        text = sql.WORKSPACE_PAGE.format(prefix=sql.WORKSPACE_PREFIX if prefix else "")
        rows = await self._db.execute_fetchall(text, (*args, limit))
        return [tuple(r) for r in rows]

    async def last_control(self, ws: int, kinds: tuple[str, ...]) -> bytes | None:
        """The workspace's last control event of ``kinds`` (JSON), if any: one seek on the
        ``(ws, type, version)`` index per kind, however many control events (of other kinds:
        runs, approvals) the workspace has."""
        text, args = sql.last_control(ws, kinds)
        rows = list(await self._db.execute_fetchall(text, args))
        return str(rows[0][0]).encode() if rows else None

    async def pinned(self, ws: int, run: str) -> int | None:
        """The version ``run`` reads, if it is a run of this workspace: one seek, however
        many runs the workspace had."""
        rows = list(await self._db.execute_fetchall(sql.PINNED, (ws, run)))
        return int(rows[0][0]) if rows else None

    async def control_events(self, ws: int, kinds: tuple[str, ...]) -> list[bytes]:
        """The workspace's control events of ``kinds``, oldest first, as stored (JSON)."""
        text = sql.CONTROL_EVENTS.format(marks=sql.marks(len(kinds)))
        rows = await self._db.execute_fetchall(text, (ws, *kinds))
        return [str(r[0]).encode() for r in rows]

    async def uncommitted_all(self, ws: int) -> list[tuple[str, str, str, int]]:
        """Every path a command left uncommitted, as last recorded: (path, reason,
        by_command, version), by path (a seek on the table's key)."""
        rows = await self._db.execute_fetchall(sql.ALL_UNCOMMITTED, (ws,))
        return [(str(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]

    async def contents(self, shas: list[str]) -> dict[str, bytes]:
        """Contents held in the projection, by sha256 (large ones may not be fetched yet)."""
        out: dict[str, bytes] = {}
        for i in range(0, len(shas), 500):
            chunk = shas[i : i + 500]
            text = sql.CONTENTS.format(marks=sql.marks(len(chunk)))
            rows = await self._db.execute_fetchall(text, chunk)
            out.update((r[0], bytes(r[1])) for r in rows)
        return out


__all__ = ["LIVE", "Node", "ReadModel"]
