"""A path's revisions, newest first, and with ``follow`` across the moves that brought the file
to it (``qry.history``).

A revision row of ``path`` made by a move carries ``moved_from``: the path it had before.
Following is the walk git's ``log --follow`` makes: the revisions of ``path`` down to the one
that moved the file there, then the revisions of ``moved_from`` below that version, and so on.
Rows of ``path`` older than the move belong to another file that once had the name (``mv a b``
over an earlier, deleted ``b``): they are not this file's history, and the walk never shows them.

Each step of the walk is a seek of ``PATH_HISTORY`` (``(ws, path, version)``, the primary key,
newest first, ``LIMIT``): never a scan of a path's history, nor of the workspace's. A step
reads its rows in batches that start at ``FIRST_BATCH`` and double, so a path holding an older
file's long history behind the move costs at most a batch beyond what the page shows; and
since every step shows at least the row of its move, and the version it reads below strictly
falls, a page makes at most ``limit`` steps, however the moves go (``a → b → a`` included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from contracts import replies as rp
from core.rows import Node
from core.tree import etag_of

Row = tuple[Node, tuple[Any, ...], tuple[Any, ...] | None]
"""A revision row, the event that made it and (ended by a delete) the one that ended it."""
FIRST_BATCH = 16
"""Rows a step of a followed history reads first (then twice as many each time)."""


def kind_of(node: Node) -> rp.Kind:
    return "directory" if node.kind == "d" else "file"


def revisions(rows: list[Row], upto: int, limit: int, shown_as: str | None) -> list[rp.Revision]:
    """The revisions of ``rows[:limit]`` (newest first; ``rows[limit]``, if there, only tells
    whether the last was a change or a creation), with a ``deleted`` one for each delete
    between them; ``shown_as``: the path they are of, when not the asked one."""
    out: list[rp.Revision] = []
    newer: Node | None = None
    for i, (node, made, ended) in enumerate(rows[:limit]):
        if node.until <= upto and ended and (newer is None or newer.version != node.until):
            out.append(_revision(node, node.until, ended, "deleted", shown_as))
        older = rows[i + 1][0] if i + 1 < len(rows) else None
        if node.moved_from:
            change = "moved"
        elif older is not None and older.until == node.version and older.kind == node.kind:
            change = "modified"
        else:
            change = "created"
        out.append(_revision(node, node.version, made, change, shown_as, made=True))
        newer = node
    return out


def _revision(
    node: Node,
    version: int,
    event: tuple[Any, ...],
    change: str,
    shown_as: str | None,
    *,
    made: bool = False,
) -> rp.Revision:
    """The revision of ``node`` at ``version``, by ``event`` (its row: ``at, op, actor,
    request_id``); with ``made`` (not its deletion) it says what the node holds."""
    return rp.Revision(
        version=version,
        at=datetime.fromisoformat(event[0]),
        op=event[1],
        actor=event[2],
        request_id=event[3],
        change=change,
        kind=kind_of(node),
        size=node.size if made and node.kind == "f" else None,
        sha256=node.sha256 if made else None,
        file_version=node.file_version if made else None,
        etag=etag_of(node.file_version) if made and node.file_version else None,
        moved_from=node.moved_from if made else None,
        path=shown_as,
    )


class Reads(Protocol):
    """What the walk reads (``ReadModel``)."""

    async def path_history(self, ws: int, path: str, upto: int, limit: int) -> list[Row]: ...


@dataclass
class Step:
    """One name of the file: its rows down to the move that brought it there (included), or
    down to ``want`` rows and one more (the next page's first, or the start of its history)."""

    rows: list[Row] = field(default_factory=list)
    moved: bool = False
    """Ended at the row of a move."""


async def step(model: Reads, ws: int, path: str, upto: int, want: int) -> Step:
    """The rows of ``path`` at or below ``upto`` for one step of the walk."""
    found = Step()
    batch = min(want + 1, FIRST_BATCH)
    while True:
        rows = await model.path_history(ws, path, upto, batch)
        for row in rows:
            found.rows.append(row)
            if row[0].moved_from:
                found.moved = True
                return found
            if len(found.rows) > want:
                return found
        if len(rows) < batch:
            return found
        upto = rows[-1][0].version - 1
        batch = min(batch * 2, want + 1 - len(found.rows))


async def followed(model: Reads, ws: int, path: str, upto: int, limit: int) -> rp.HistoryPage:
    """Up to ``limit`` revision rows of the file now at ``path`` (as of ``upto``), across its
    moves (see the module docstring)."""
    out: list[rp.Revision] = []
    name, below, shown = path, upto, 0
    while shown < limit:
        found = await step(model, ws, name, below, limit - shown)
        if not found.rows:
            return rp.HistoryPage(path=path, revisions=out, truncated=False)
        want = limit - shown
        as_name = None if name == path else name
        out += revisions(found.rows, below, want, as_name)
        shown += min(len(found.rows), want)
        last = found.rows[min(len(found.rows), want) - 1][0]
        if len(found.rows) > want:  # the page is full, and this name has more
            return rp.HistoryPage(path=path, revisions=out, truncated=True, next_path=name)
        if not found.moved:
            return rp.HistoryPage(path=path, revisions=out, truncated=False)
        assert last.moved_from is not None
        name, below = last.moved_from, last.version - 1
    # full, and the last row was a move: its file's earlier name goes on on the next page
    return rp.HistoryPage(path=path, revisions=out, truncated=True, next_path=name)
