"""Recently read revisions (with their content) in memory, so hot reads skip SQLite.

A revision is valid over ``[version, until)``. A closed revision never changes, and the live
one changes only when an apply closes it; the follower passes every close of every applied
plan to ``close``, so an entry is never stale. A revision read from SQLite is cached only if
no apply touched the workspace while the read was in flight.

Bounded (docs/operations.md, Sizing): ``RevisionCache`` holds at most ``max_entries`` paths and
``max_bytes`` of contents, least recently used first, and keeps an index entry per workspace
only while one of its paths is held; ``TextCache`` holds ``max_bytes`` of texts.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

from core.lru import SizedLRU
from core.plan import LIVE
from core.rows import Node

Key = tuple[int, str]


class RevisionCache:
    def __init__(self, max_bytes: int = 64 * 1024 * 1024, max_entries: int = 100_000) -> None:
        """At most ``max_entries`` paths and ``max_bytes`` of contents (200 more per
        revision), least recently read first."""
        self._entries: OrderedDict[Key, list[tuple[Node, bytes | None]]] = OrderedDict()
        self._by_ws: dict[int, set[str]] = {}
        self._bytes = 0
        self._max_bytes, self._max_entries = max_bytes, max_entries

    def get(self, ws: int, path: str, version: int) -> tuple[Node, bytes | None] | None:
        revisions = self._entries.get((ws, path))
        if revisions is None:
            return None
        for node, data in revisions:
            if node.version <= version < node.until:
                self._entries.move_to_end((ws, path))
                return node, data
        return None

    def put(self, ws: int, node: Node, data: bytes | None) -> None:
        key = (ws, node.path)
        revisions = self._entries.setdefault(key, [])
        if any(n.version == node.version for n, _ in revisions):
            return
        revisions.append((node, data))
        self._by_ws.setdefault(ws, set()).add(node.path)
        self._bytes += len(data or b"") + 200
        self._entries.move_to_end(key)
        while self._bytes > self._max_bytes or len(self._entries) > self._max_entries:
            (old_ws, old_path), dropped = self._entries.popitem(last=False)
            self._bytes -= sum(len(d or b"") + 200 for _, d in dropped)
            paths = self._by_ws[old_ws]
            paths.discard(old_path)
            if not paths:  # no trace of a workspace whose last revision went
                del self._by_ws[old_ws]

    def forget(self, ws: int) -> None:
        """Drop every revision of ``ws`` (a compaction replaced its history)."""
        for path in self._by_ws.pop(ws, set()):
            dropped = self._entries.pop((ws, path), [])
            self._bytes -= sum(len(d or b"") + 200 for _, d in dropped)

    def close(self, until: int, ws: int, lo: str, hi: str) -> None:
        """Apply a plan's close: live revisions of ``ws`` with ``lo <= path < hi`` end at
        ``until``."""
        paths = self._by_ws.get(ws)
        if not paths:
            return
        hits = [lo] if hi == lo + "\0" else [p for p in paths if lo <= p < hi]
        for path in hits:
            revisions = self._entries.get((ws, path))
            if not revisions:
                continue
            revisions[:] = [
                (dataclasses.replace(n, until=until) if n.until == LIVE else n, d)
                for n, d in revisions
            ]


class TextCache(SizedLRU[bytes]):
    """Text contents (UTF-8) by sha256 (contents never change), bounded in bytes (LRU): grep
    reads them from memory instead of the projection once they are hot."""

    def __init__(self, max_bytes: int = 256 * 1024 * 1024) -> None:
        super().__init__(max_bytes, largest_share=8)
