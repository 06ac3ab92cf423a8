"""What the reader asks its projection: nodes, listings, history and contents as of a version.

The SQL of the read side, over the store's read-only connection (a WAL snapshot per statement).
"""

from __future__ import annotations

from typing import Any

from services.common.plan import LIVE, subtree
from services.common.store import (
    R_REVISION_COLUMNS,
    REVISION_COLUMNS,
    Node,
    Store,
    node_from_row,
)


class ReadModel:
    def __init__(self, store: Store) -> None:
        self._db = store.reads

    async def node(self, ws: int, path: str, version: int) -> Node | None:
        rows = list(
            await self._db.execute_fetchall(
                f"SELECT {REVISION_COLUMNS} FROM revisions WHERE ws=? AND path=? AND version<=? "
                "ORDER BY version DESC LIMIT 1",
                (ws, path, version),
            )
        )
        if not rows or rows[0][10] <= version:
            return None
        return node_from_row(rows[0])

    async def node_with_data(
        self, ws: int, path: str, version: int
    ) -> tuple[Node, bytes | None] | None:
        rows = list(
            await self._db.execute_fetchall(
                f"SELECT {R_REVISION_COLUMNS}, b.data "
                "FROM revisions r LEFT JOIN blobs b ON b.sha256 = r.sha256 "
                "WHERE r.ws=? AND r.path=? AND r.version<=? ORDER BY r.version DESC LIMIT 1",
                (ws, path, version),
            )
        )
        if not rows or rows[0][10] <= version:
            return None
        return node_from_row(rows[0]), rows[0][12]

    async def children(self, ws: int, directory: str, version: int, limit: int) -> list[Node]:
        rows = await self._db.execute_fetchall(
            f"SELECT {REVISION_COLUMNS} FROM revisions WHERE ws=? AND parent=? AND version<=? "
            "AND until>? AND path != '' ORDER BY kind='f', path LIMIT ?",
            (ws, directory, version, version, limit),
        )
        return [node_from_row(r) for r in rows]

    async def count_children(self, ws: int, directory: str, version: int) -> int:
        rows = list(
            await self._db.execute_fetchall(
                "SELECT count(*) FROM revisions WHERE ws=? AND parent=? AND version<=? "
                "AND until>? AND path != ''",
                (ws, directory, version, version),
            )
        )
        return int(rows[0][0])

    async def totals(self, ws: int, version: int) -> tuple[int, int, int]:
        """``(files, directories, total file bytes)`` as of ``version``."""
        rows = await self._db.execute_fetchall(
            "SELECT kind, count(*), coalesce(sum(size), 0) FROM revisions "
            "WHERE ws=? AND until>? AND version<=? GROUP BY kind",
            (ws, version, version),
        )
        by_kind = {kind: (count, size) for kind, count, size in rows}
        files, size = by_kind.get("f", (0, 0))
        return files, by_kind.get("d", (0, 0))[0], size

    async def path_history(
        self, ws: int, path: str, upto: int, limit: int
    ) -> list[tuple[Node, tuple[Any, ...], tuple[Any, ...] | None]]:
        """Revisions of ``path`` with version <= ``upto``, newest first, each with the event
        that made it and (if it ended by a delete) the event that ended it."""
        rows = await self._db.execute_fetchall(
            f"SELECT {R_REVISION_COLUMNS}, "
            "e.at, e.op, e.actor, e.request_id, d.at, d.op, d.actor, d.request_id "
            "FROM revisions r JOIN events e ON e.ws = r.ws AND e.version = r.version "
            "LEFT JOIN events d ON d.ws = r.ws AND d.version = r.until "
            "WHERE r.ws=? AND r.path=? AND r.version<=? ORDER BY r.version DESC LIMIT ?",
            (ws, path, upto, limit),
        )
        return [
            (node_from_row(r), tuple(r[12:16]), tuple(r[16:20]) if r[16] else None) for r in rows
        ]

    async def events(self, ws: int, after: int, upto: int, limit: int) -> list[tuple[Any, ...]]:
        rows = await self._db.execute_fetchall(
            "SELECT type, version, seq, at, op, actor, session, run, request_id, hash, "
            "prev_hash, tree_hash, changes, changes_total FROM events "
            "WHERE ws=? AND version>? AND version<=? ORDER BY version LIMIT ?",
            (ws, after, upto, limit),
        )
        return [tuple(r) for r in rows]

    async def events_desc(self, ws: int, before: int, limit: int) -> list[tuple[Any, ...]]:
        rows = await self._db.execute_fetchall(
            "SELECT type, version, seq, at, op, actor, session, run, request_id, hash, "
            "prev_hash, tree_hash, changes, changes_total FROM events "
            "WHERE ws=? AND version<? ORDER BY version DESC LIMIT ?",
            (ws, before, limit),
        )
        return [tuple(r) for r in rows]

    async def files(
        self, ws: int, version: int, scope: str, candidates: str | None = None
    ) -> list[tuple[str, str, int, bytes | None]]:
        """``(path, sha256, size, content or None)`` of every text file below ``scope`` as of
        ``version``; with ``candidates`` (an FTS5 query), only files whose content may match it
        (content not indexed yet always may)."""
        where = "r.ws=? AND r.version<=? AND r.until>? AND r.kind='f' AND r.binary=0"
        args: list[Any] = [ws, version, version]
        if scope:
            where += " AND r.path>=? AND r.path<?"
            args += list(subtree(scope))
        if candidates is not None:  # contents not fetched yet (large blobs) are not indexed yet
            where += (
                " AND (b.indexed = 0 OR b.rowid IN "
                "(SELECT rowid FROM content_index WHERE content_index MATCH ?))"
            )
            args.append(candidates)
        rows = await self._db.execute_fetchall(
            "SELECT r.path, r.sha256, r.size, b.data FROM revisions r "
            f"LEFT JOIN blobs b ON b.sha256 = r.sha256 WHERE {where} ORDER BY r.path",
            args,
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]


__all__ = ["LIVE", "Node", "ReadModel"]
