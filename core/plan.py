"""Turn a batch of committed events into the row operations of the SQLite projection.

Pure: no I/O. The fold is ``core.evolve``'s: each workspace's head (its row: version, log
position, trust, limits...) is evolved through the batch, and its row is written from it;
every event gets its row, a control event its ``controls`` row too (to be evolved again when
the writer loads the workspace), and a change set's changes become revision rows, the tree's
form in SQL. Each path's history is a list of revision rows valid over ``[version, until)``;
a change closes the live row(s) it replaces (``until = version``) and inserts new ones. Rows
inserted earlier in the same batch are closed here, in Python; rows already in the database
are closed by range updates run in event order. The result is a handful of ``executemany``
calls per batch, whatever its size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import msgspec

from contracts.events import (
    CONTROL_EVENTS,
    AnyChange,
    ChangesCommitted,
    CompactionManifest,
    MakeDir,
    PutFile,
    Remove,
)
from contracts.events import WorkspaceEvent as Event
from contracts.paths import parent
from contracts.replies import ChangeSummary
from contracts.uncommitted import command_of
from core.evolve import WorkspaceState, evolve
from core.rows import WorkspaceRow

LIVE = 2**63 - 1
"""``until`` of a revision that is still current."""
WHITEOUT = "w"
"""``kind`` of a fork's revision row that hides what it inherited at its path: valid over
``[version, version)``, so no tree ever holds it, yet the fork has a row of the path at or
before any version from then on (a fork's path is read from its own rows when it has one,
else from the layers below: ``infra/store/layers.py``)."""
SUMMARY_CHANGES = 1000
"""Changes kept in an event's summary row (``changes_total`` counts them all)."""
MESSAGE_KEPT = 1000
"""Characters of an event's ``message`` (a command's ``$ <command line>``) its row keeps."""

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class Committed:
    """A committed event with what the log said about it."""

    event: Event
    hash: str
    seq: int
    manifest: CompactionManifest | None = None
    """For ``history_compacted``: the manifest it names (fetched from WS_BLOBS)."""


@dataclass
class Plan:
    new_workspaces: list[tuple[object, ...]] = field(default_factory=list)
    closes: list[tuple[int, int, str, str]] = field(default_factory=list)
    """``(until, ws, lo, hi)``: close live rows of ``ws`` with ``lo <= path < hi``."""
    rows: list[list[object]] = field(default_factory=list)
    events: list[tuple[object, ...]] = field(default_factory=list)
    blobs: list[tuple[str, int, bytes | None, int | None]] = field(default_factory=list)
    """``(sha256, size, data, ws)``: content an event carries, or (``data`` None) one it names
    in WS_BLOBS, in the namespace of workspace ``ws``."""
    controls: list[tuple[int, int, str, str]] = field(default_factory=list)
    """``(ws, version, type, event JSON)`` of the control events (runs, locks, approvals)."""
    workspace_updates: dict[int, tuple[object, ...]] = field(default_factory=dict)
    """Per workspace, its head after the batch: ``(version, last_seq, last_hash, tree_hash,
    updated, trust, limits, floor, lineage, base, ws)`` (``infra.sql.SET_HEAD``)."""
    replaced: list[int] = field(default_factory=list)
    """Workspaces a compaction replaced (caches of them are stale)."""
    uncommitted_clears: list[tuple[int, str, str]] = field(default_factory=list)
    """``(ws, lo, hi)``: paths a change committed or removed, no longer left uncommitted."""
    uncommitted_sets: dict[int, list[tuple[str, str, str, int]]] = field(default_factory=dict)
    """Per workspace whose set an event replaced: its rows ``(path, reason, by_command,
    version)`` after the batch (written after the clears)."""
    whiteouts: list[tuple[int, str, int, tuple[tuple[str, int], ...], str]] = field(
        default_factory=list
    )
    """``(ws, path, version, lineage, at)``: a delete in a fork, of ``path`` and everything below
    it; what the fork inherited there gets a whiteout row (``WHITEOUT``: valid over no
    version, it hides the layers below from ``version`` on), found by the store, which
    holds the layers."""


# Column order of a revision row (see store.SCHEMA).
_UNTIL = 3


def exact(path: str) -> tuple[str, str]:
    """The ``[lo, hi)`` range holding exactly ``path`` (paths never contain NUL)."""
    return path, path + "\0"


def subtree(path: str) -> tuple[str, str]:
    """The range of every path strictly below directory ``path`` (``'0'`` follows ``'/'``)."""
    return path + "/", path + "0"


def _uncommitted(out: Plan, ws: int, ev: ChangesCommitted) -> None:
    """The paths ``ev`` commits or removes are no longer left uncommitted; its set (if any)
    replaces the workspace's."""
    rows = out.uncommitted_sets.get(ws)
    for change in ev.changes:
        ranges = [exact(change.path)]
        if isinstance(change, Remove):
            ranges.append(subtree(change.path))
        for lo, hi in ranges:
            if rows is None:
                out.uncommitted_clears.append((ws, lo, hi))
            else:
                rows[:] = [r for r in rows if not lo <= r[0] < hi]
    if ev.uncommitted is not None:
        by = command_of(ev.request_id)
        out.uncommitted_sets[ws] = [(u.path, u.reason, by, ev.version) for u in ev.uncommitted]


def plan(
    batch: list[Committed],
    ws_ids: dict[tuple[str, str], int],
    heads: dict[int, WorkspaceState] | None = None,
) -> Plan:
    """Plan the application of ``batch`` (in log order).

    ``ws_ids`` maps ``(tenant, workspace)`` to the projection's integer id; a workspace
    created in this batch must already have an id allocated in it. ``heads``: by id, the
    workspaces' heads before the batch (``head_of`` their rows), evolved in place through it
    (the rows after it: ``row_of``); one not given starts as no workspace.
    """
    out = Plan()
    heads = {} if heads is None else heads
    live: dict[int, dict[str, int]] = {}  # per workspace: rows this batch inserted, still live

    def close(ws: int, path: str, version: int, below: bool) -> None:
        lo, hi = subtree(path) if below else exact(path)
        out.closes.append((version, ws, lo, hi))
        rows = live.get(ws)
        if not rows:
            return
        hits = [p for p in rows if lo <= p < hi] if below else [path] if path in rows else []
        for hit in hits:
            out.rows[rows.pop(hit)][_UNTIL] = version

    for item in batch:
        ev = item.event
        ws = ws_ids[(ev.tenant, ev.workspace)]
        at = ev.at.isoformat()
        head = heads.get(ws)
        if head is None:
            head = heads[ws] = WorkspaceState(ev.tenant, ev.workspace)
        existed = head.exists
        fresh = evolve(head, ev, item.hash, item.seq, tree=False, manifest=item.manifest)
        if (fresh or not existed) and head.exists:
            created = head.created.isoformat() if head.created is not None else at
            out.new_workspaces.append(
                (ws, ev.tenant, ev.workspace, head.trust, _limits(head), created)
            )
        if isinstance(ev, CONTROL_EVENTS):
            tag = type(ev).__struct_config__.tag
            out.controls.append((ws, ev.version, str(tag), _encoder.encode(ev).decode()))
        changes: list[AnyChange] = []
        message = None
        match ev:  # its changes: the tree's part of the fold, as revision rows
            case ChangesCommitted():
                changes, message = ev.changes, ev.message
                _uncommitted(out, ws, ev)
        summary: list[ChangeSummary] = []
        files = dirs = size = 0  # what its rows make, live or not: its event row's born_*
        for change in changes:
            path = change.path
            if isinstance(change, Remove):
                close(ws, path, ev.version, below=False)
                close(ws, path, ev.version, below=True)
                if head.lineage:
                    out.whiteouts.append((ws, path, ev.version, head.lineage, at))
                summary.append(ChangeSummary(kind="delete", path=path, change="deleted"))
                continue
            close(ws, path, ev.version, below=False)
            live.setdefault(ws, {})[path] = len(out.rows)
            row = [ws, path, ev.version, LIVE, parent(path)]
            if isinstance(change, MakeDir):
                dirs += 1
                out.rows.append([*row, "d", None, 0, None, 0, 0, at, at, None])
                summary.append(ChangeSummary(kind="mkdir", path=path, change="added"))
                continue
            assert isinstance(change, PutFile)
            files, size = files + 1, size + change.size
            out.rows.append(
                [
                    *row,
                    "f",
                    change.sha256,
                    change.size,
                    change.file_version,
                    int(change.executable),
                    int(change.binary),
                    change.created.isoformat(),
                    at,
                    change.moved_from,
                ]
            )
            if change.text is not None:
                out.blobs.append((change.sha256, change.size, change.text.encode(), None))
            elif change.data is not None:
                out.blobs.append((change.sha256, change.size, change.data, None))
            elif change.blob:
                out.blobs.append((change.sha256, change.size, None, ws))
            summary.append(
                ChangeSummary(
                    kind="put",
                    path=path,
                    size=change.size,
                    sha256=change.sha256,
                    moved_from=change.moved_from,
                    change=put_change(change, ev.at),
                )
            )
        out.events.append(
            (
                ws,
                ev.version,
                item.seq,
                type(ev).__struct_config__.tag,
                ev.op,
                at,
                ev.actor,
                ev.session,
                ev.run,
                ev.request_id,
                item.hash,
                ev.prev_hash,
                ev.tree_hash,
                _encoder.encode(summary[:SUMMARY_CHANGES]).decode(),
                len(summary),
                bytes(ev.result).decode(),
                message[:MESSAGE_KEPT] if message else None,
                files,  # born_*: what it made, so that the totals at an older version are
                dirs,  # the live ones less what the events since made, plus the rows ended
                size,  # since (``infra.sql.TOTALS_SINCE``): what changed since, not the tree
            )
        )
        out.workspace_updates[ws] = (
            head.version, head.last_seq, head.last_hash, head.tree_hash, at, head.trust,
            _limits(head), head.floor, lineage_text(head.lineage),
            head.lineage[0][0] if head.lineage else None, ws,
        )  # fmt: skip
    return out


def lineage_text(lineage: tuple[tuple[str, int], ...]) -> str:
    """A fork's lineage as its row keeps it (JSON; empty for a workspace that is no fork)."""
    return _encoder.encode([list(b) for b in lineage]).decode() if lineage else ""


def _limits(head: WorkspaceState) -> str:
    return _encoder.encode(head.limits).decode()


def put_change(change: PutFile, at: datetime) -> str:
    """What a put did to its path, as git says it: ``moved`` there, ``added`` (the path held
    no file before: a new file's ``created`` is its event's time) or ``modified``."""
    if change.moved_from:
        return "moved"
    return "added" if change.created == at else "modified"


def head_of(row: WorkspaceRow) -> WorkspaceState:
    """A workspace's head as its projection's row holds it (its tree, controls and
    uncommitted paths are in the other tables: not loaded here)."""
    return WorkspaceState(
        row.tenant, row.name, exists=True, version=row.version, last_seq=row.last_seq,
        last_hash=row.last_hash, trust=row.trust, limits=row.limits, created=row.created,
        updated=row.updated, tree_hash=row.tree_hash, floor=row.floor, lineage=row.lineage,
    )  # fmt: skip


def row_of(ws: int, head: WorkspaceState) -> WorkspaceRow:
    """The projection's row of workspace ``ws`` (its id) with head ``head`` (it exists)."""
    assert head.created is not None and head.updated is not None
    return WorkspaceRow(
        ws, head.tenant, head.workspace, head.trust, head.limits, head.created, head.version,
        head.last_seq, head.last_hash, head.tree_hash, head.updated, head.floor, head.lineage,
    )  # fmt: skip
