"""What the reader asks its projection: nodes, listings, history and contents as of a version.

The SQL of the read side, over the store's read-only connection (a WAL snapshot per statement).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from core.plan import LIVE, subtree
from core.rows import Node
from infra.store import R_REVISION_COLUMNS, REVISION_COLUMNS, Store, node_from_row


@dataclass(frozen=True, slots=True)
class Scope:
    """Which entries a listing covers: the children of ``directory`` (or, ``recursive``,
    everything beneath it), of ``kind`` (``f``, ``d`` or None for both), whose path relative
    to ``directory`` starts with ``prefix``."""

    directory: str
    recursive: bool = False
    kind: str | None = None
    prefix: str = ""

    def where(self, ws: int, version: int) -> tuple[str, list[Any]]:
        where = "ws=? AND version<=? AND until>? AND path != ''"
        args: list[Any] = [ws, version, version]
        if not self.recursive:
            where += " AND parent=?"
            args.append(self.directory)
        elif self.directory:
            where += " AND path>=? AND path<?"
            args += list(subtree(self.directory))
        if self.prefix:
            start = f"{self.directory}/{self.prefix}" if self.directory else self.prefix
            where += " AND path>=?"
            args.append(start)
            if ord(start[-1]) < 0x10FFFF:  # paths starting with `start` sort below its successor
                where += " AND path<?"
                args.append(start[:-1] + chr(ord(start[-1]) + 1))
        if self.kind is not None:
            where += " AND kind=?"
            args.append(self.kind)
        return where, args


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

    async def page(
        self, ws: int, version: int, scope: Scope, after: tuple[str, str] | None, limit: int
    ) -> list[Node]:
        """Up to ``limit`` entries of ``scope`` as of ``version``, after the ``(kind, path)``
        of the previous page's last entry: directories first, then by name; or, recursive,
        by path."""
        where, args = scope.where(ws, version)
        if after is not None:
            if scope.recursive:
                where += " AND path>?"
                args.append(after[1])
            else:
                where += " AND (kind='f', path) > (?, ?)"
                args += [after[0] == "f", after[1]]
        order = "path" if scope.recursive else "kind='f', path"
        rows = await self._db.execute_fetchall(
            f"SELECT {REVISION_COLUMNS} FROM revisions WHERE {where} ORDER BY {order} LIMIT ?",
            (*args, limit),
        )
        return [node_from_row(r) for r in rows]

    async def count(self, ws: int, version: int, scope: Scope) -> int:
        where, args = scope.where(ws, version)
        rows = list(
            await self._db.execute_fetchall(f"SELECT count(*) FROM revisions WHERE {where}", args)
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
    ) -> list[tuple[str, str]]:
        """``(path, sha256)`` of every text file below ``scope`` as of ``version``; with
        ``candidates`` (an FTS5 query), only files whose content may match it: indexed
        contents that match, and contents not indexed yet."""
        where = "ws=? AND version<=? AND until>? AND kind='f' AND binary=0"
        args: list[Any] = [ws, version, version]
        if scope:
            where += " AND path>=? AND path<?"
            args += list(subtree(scope))
        if candidates is not None:
            shas = [
                r[0]
                for r in await self._db.execute_fetchall(
                    "SELECT sha256 FROM blobs WHERE rowid IN "
                    "(SELECT rowid FROM content_index WHERE content_index MATCH ?) "
                    "UNION ALL SELECT sha256 FROM blobs WHERE indexed = 0",
                    (candidates,),
                )
            ]
            if not shas:
                return []
            if len(shas) <= 5000:  # selective: look the few contents up
                where += f" AND sha256 IN ({','.join('?' * len(shas))})"
                args += shas
            else:
                where += " AND sha256 IN (SELECT value FROM json_each(?))"
                args.append(json.dumps(shas))
        rows = await self._db.execute_fetchall(
            f"SELECT path, sha256 FROM revisions WHERE {where} ORDER BY path", args
        )
        return [(r[0], r[1]) for r in rows]

    async def workspaces(
        self, tenant: str, after: str, prefix: str, limit: int
    ) -> list[tuple[Any, ...]]:
        """A page of ``tenant``'s workspaces by name, after ``after`` (keyset on the unique
        ``(tenant, name)`` index: a page costs the same wherever it starts, and whatever the
        workspaces hold: their files and bytes are kept in their rows): ``(id, name, version,
        trust, created, at, actor, op, files, total_bytes)`` of each and of its last event."""
        where, args = "w.tenant=? AND w.name>?", [tenant, after]
        if prefix:
            where += " AND w.name>=? AND w.name<?"
            args += [prefix, prefix + "\U0010ffff"]
        rows = await self._db.execute_fetchall(
            "SELECT w.id, w.name, w.version, w.trust, w.created, e.at, e.actor, e.op, "
            "w.files, w.total_bytes "
            "FROM workspaces w JOIN events e ON e.ws = w.id AND e.version = w.version "
            f"WHERE {where} ORDER BY w.name LIMIT ?",
            (*args, limit),
        )
        return [tuple(r) for r in rows]

    async def last_control(self, ws: int, kinds: tuple[str, ...]) -> bytes | None:
        """The workspace's last control event of ``kinds`` (JSON), if any: one seek on the
        ``(ws, type, version)`` index per kind, however many control events (of other kinds:
        runs, approvals) the workspace has."""
        newest = " UNION ALL ".join(
            "SELECT max(version) AS v FROM controls WHERE ws=? AND type=?" for _ in kinds
        )
        rows = list(
            await self._db.execute_fetchall(
                "SELECT event FROM controls WHERE ws=? AND version="
                f"(SELECT max(v) FROM ({newest}))",
                (ws, *[x for kind in kinds for x in (ws, kind)]),
            )
        )
        return str(rows[0][0]).encode() if rows else None

    async def pinned(self, ws: int, run: str) -> int | None:
        """The version ``run`` reads, if it is a run of this workspace."""
        rows = list(
            await self._db.execute_fetchall(
                "SELECT json_extract(event, '$.pinned_version') FROM controls "
                "WHERE ws=? AND type='run_started' AND json_extract(event, '$.run_id')=?",
                (ws, run),
            )
        )
        return int(rows[0][0]) if rows else None

    async def control_events(self, ws: int, kinds: tuple[str, ...]) -> list[bytes]:
        """The workspace's control events of ``kinds``, oldest first, as stored (JSON)."""
        marks = ",".join("?" * len(kinds))
        rows = await self._db.execute_fetchall(
            f"SELECT event FROM controls WHERE ws=? AND type IN ({marks}) ORDER BY version",
            (ws, *kinds),
        )
        return [str(r[0]).encode() for r in rows]

    async def uncommitted_all(self, ws: int) -> list[tuple[str, str, str, int]]:
        """Every path a command left uncommitted, as last recorded: (path, reason,
        by_command, version), by path (a seek on the table's key)."""
        rows = await self._db.execute_fetchall(
            "SELECT path, reason, by_command, version FROM uncommitted WHERE ws=? ORDER BY path",
            (ws,),
        )
        return [(str(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]

    async def contents(self, shas: list[str]) -> dict[str, bytes]:
        """Contents held in the projection, by sha256 (large ones may not be fetched yet)."""
        out: dict[str, bytes] = {}
        for i in range(0, len(shas), 500):
            chunk = shas[i : i + 500]
            rows = await self._db.execute_fetchall(
                f"SELECT sha256, data FROM blobs WHERE sha256 IN ({','.join('?' * len(chunk))}) "
                "AND data IS NOT NULL",
                chunk,
            )
            out.update((r[0], bytes(r[1])) for r in rows)
        return out


__all__ = ["LIVE", "Node", "ReadModel"]
