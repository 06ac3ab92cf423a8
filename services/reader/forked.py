"""A fork's answers through its layers (issue 33; ``infra/store/layers.py``): listings,
counts and totals over its tree as of a version, a path's history and the events across the
fork point.

A fork's tree as of a version is its layers' (what it inherited at the fork point, less what
it changed, plus its own rows), in path order; a page or a count of a listing filters it here.
Its events are the source's below the fork point ``N``, then its own: its version ``N`` is
its ``workspace_forked`` event (the source's tree at ``N``, its chain continuing the source's
event ``N``), its next ``N + 1``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import aiosqlite

from core.plan import LIVE, WHITEOUT
from core.rows import Node
from infra import sql
from infra.store import Layers, node_from_row


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


class Layered(Protocol):
    async def layered_entries(
        self, layers: Layers, version: int, scope: str = "", *, with_scope: bool = False
    ) -> list[Node]: ...


async def scoped(
    store: Layered, layers: Layers, version: int, scope: Scoped, after: tuple[str, str] | None
) -> list[Node]:
    """The entries of a listing's ``scope`` as of ``version``, in its order (directories
    first, then by name; recursive: by path), after the ``(kind, path)`` of a page's last."""
    directory = scope.directory
    nodes = await store.layered_entries(layers, version, directory)
    start = f"{directory}/{scope.prefix}" if directory else scope.prefix
    out = [
        n
        for n in nodes
        if n.path
        and (scope.recursive or _parent(n.path) == directory)
        and (scope.kind is None or n.kind == scope.kind)
        and n.path.startswith(start)
    ]
    if scope.recursive:
        if after is not None:
            out = [n for n in out if n.path > after[1]]
        return out
    out.sort(key=lambda n: (n.kind == "f", n.path))
    if after is not None:
        mark = (after[0] == "f", after[1])
        out = [n for n in out if (n.kind == "f", n.path) > mark]
    return out


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def totals(nodes: list[Node]) -> tuple[int, int, int]:
    """``(files, directories, total file bytes)`` of a tree."""
    files = [n for n in nodes if n.kind == "f"]
    return len(files), sum(1 for n in nodes if n.kind == "d"), sum(n.size for n in files)


def text_files(nodes: list[Node], shas: list[str] | None) -> list[tuple[str, str]]:
    """``(path, sha256)`` of the text files of a tree (holding one of ``shas``, if given)."""
    wanted = set(shas) if shas is not None else None
    return [
        (n.path, n.sha256 or "")
        for n in nodes
        if n.kind == "f" and not n.binary and (wanted is None or n.sha256 in wanted)
    ]


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
