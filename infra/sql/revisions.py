"""Revisions and events: the writer's loads, the reader's as-of reads, and the statements
built per call (``entries``, ``files``, ``listing``, ...), each in its forms (see
``infra.sql``)."""

from __future__ import annotations

import json
from typing import Any

from core.plan import LIVE, subtree
from infra.sql.schema import FIRST_ROWS, WHOLE_WORKSPACE, marks

# ---------------------------------------------------------------------- revisions
_COLUMNS = (
    "path",
    "kind",
    "sha256",
    "size",
    "file_version",
    "executable",
    "binary",
    "created",
    "modified",
    "version",
    "until",
    "moved_from",
)
REVISION_COLUMNS = ", ".join(_COLUMNS)
"""The columns ``infra.store.queries.node_from_row`` reads, in order."""
R_REVISION_COLUMNS = ", ".join("r." + c for c in _COLUMNS)

NEWEST = "(SELECT version FROM workspaces WHERE id = ?) = ?"
"""``version`` is the workspace's newest (arguments: ``ws, version``): a ``*_LIVE`` form's
guard, evaluated once before its loop."""
_LIVE_ROWS = f"ws=? AND until={LIVE} AND {NEWEST}"
_ROWS_AT = "ws=? AND until>? AND version<=?"


def live_args(ws: int, version: int) -> list[Any]:
    """The arguments of ``_LIVE_ROWS``."""
    return [ws, ws, version]


def at_args(ws: int, version: int) -> list[Any]:
    """The arguments of ``_ROWS_AT``."""
    return [ws, version, version]


ENTRIES_LIVE = (
    f"SELECT {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_live "
    f"WHERE {_LIVE_ROWS}{{scope}} ORDER BY path"
)
"""Every entry (below a scope) at the workspace's newest version, in path order: one seek."""
ENTRIES_AT = (
    f"SELECT {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_live "
    f"WHERE {_ROWS_AT}{{scope}} ORDER BY path"
)
"""The same at an older version: the live rows and those ended since it, sorted."""
ENTRIES_SCOPE = " AND path>=? AND path<? AND (path>=? OR path=?)"
"""Below a directory (and the directory itself, when the range starts at it): a range of the
index, its siblings that sort inside it (``d-x`` between ``d`` and ``d/``) left out."""
LIVE_TREE = (
    f"SELECT {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_live "
    f"WHERE ws=? AND until={LIVE} ORDER BY path"
)
"""The writer's load: the live rows, in path order (the caller knows it is the newest)."""
PATH_HISTORIES = (
    "SELECT j.value, "
    "(SELECT file_version FROM revisions WHERE ws=?1 AND path=j.value "
    "AND file_version IS NOT NULL ORDER BY version DESC LIMIT 1), "
    f"(SELECT max(version, CASE WHEN until < {LIVE} THEN until ELSE 0 END) FROM revisions "
    "WHERE ws=?1 AND path=j.value ORDER BY version DESC LIMIT 1) "
    "FROM json_each(?2) j"
)
"""For each of a JSON list of paths: its last file version (NULL: it never was a file) and
the version at which it last changed (NULL: it never existed), two seeks a path (its last
revision says when it ended; file versions only grow)."""
CHANGED_BELOW = (
    "SELECT path, max(until) FROM revisions INDEXED BY revisions_live "
    f"WHERE ws=? AND until>? AND until<{LIVE} AND path>=? AND path<? GROUP BY path"
)
"""Paths below a directory that ended after a version, and when they last did: the
revisions ended since that version."""
SMALL_PROBE = f"SELECT count(*) FROM (SELECT {FIRST_ROWS} 1 FROM revisions WHERE ws=? LIMIT ?)"
LIVE_CONTROLS = f"SELECT {WHOLE_WORKSPACE} event FROM controls WHERE ws=? ORDER BY version"
"""The writer's load folds every control event (runs, locks, approvals, trust)."""
UNCOMMITTED_OF = (
    f"SELECT {WHOLE_WORKSPACE} path, reason, by_command, version FROM uncommitted WHERE ws=?"
)
UNCOMMITTED_AT = (
    "SELECT path, reason, by_command, version FROM uncommitted WHERE ws=? AND path IN ({marks})"
)
RECENT_RESULTS = (
    f"SELECT {FIRST_ROWS} request_id, version, result FROM events WHERE ws=? "
    "ORDER BY version DESC LIMIT ?"
)
RESULTS_OF = (
    "SELECT request_id, version, result FROM events INDEXED BY events_request "
    "WHERE ws=?1 AND request_id IN (SELECT value FROM json_each(?2))"
)
"""The results of a JSON list of request ids: one seek of ``events_request`` (a writer's) an
id, never the workspace's history."""

# ---------------------------------------------------------------------- reader
NODE = (
    f"SELECT {REVISION_COLUMNS} FROM revisions WHERE ws=? AND path=? AND version<=? "
    "ORDER BY version DESC LIMIT 1"
)
NODE_WITH_DATA = (
    f"SELECT {R_REVISION_COLUMNS}, b.data "
    "FROM revisions r LEFT JOIN blobs b ON b.sha256 = r.sha256 "
    "WHERE r.ws=? AND r.path=? AND r.version<=? ORDER BY r.version DESC LIMIT 1"
)
PAGE = "SELECT {columns} FROM revisions INDEXED BY {index} WHERE {where} ORDER BY {order} LIMIT ?"
COUNT = "SELECT count(*) FROM revisions INDEXED BY {index} WHERE {where}"
TOTALS_AT = (
    "SELECT kind, count(*), coalesce(sum(size), 0) FROM revisions INDEXED BY revisions_live "
    f"WHERE {_ROWS_AT} GROUP BY kind"
)
"""``(files, directories, bytes)`` at an older version (the newest is ``TOTALS_LIVE``)."""
PATH_HISTORY = (
    f"SELECT {R_REVISION_COLUMNS}, "
    "e.at, e.op, e.actor, e.request_id, d.at, d.op, d.actor, d.request_id "
    "FROM revisions r JOIN events e ON e.ws = r.ws AND e.version = r.version "
    "LEFT JOIN events d ON d.ws = r.ws AND d.version = r.until "
    "WHERE r.ws=? AND r.path=? AND r.version<=? ORDER BY r.version DESC LIMIT ?"
)
_EVENT_COLUMNS = (
    "type, version, seq, at, op, actor, session, run, request_id, hash, "
    "prev_hash, tree_hash, changes, changes_total, message"
)
EVENTS = (
    f"SELECT {_EVENT_COLUMNS} FROM events "
    "WHERE ws=? AND version>? AND version<=? ORDER BY version LIMIT ?"
)
EVENTS_DESC = (
    f"SELECT {_EVENT_COLUMNS} FROM events WHERE ws=? AND version<? ORDER BY version DESC LIMIT ?"
)
FILES = (
    "SELECT path, sha256 FROM revisions INDEXED BY revisions_live "
    "WHERE {where} AND kind='f' AND binary=0{scope}{candidates} ORDER BY path"
)
FILES_SCOPE = " AND path>=? AND path<?"
FILES_LISTED = " AND sha256 IN ({marks})"
FILES_JSON = " AND sha256 IN (SELECT value FROM json_each(?))"
RECENT = (
    f"SELECT {FIRST_ROWS} {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_recent "
    f"WHERE ws=? AND until={LIVE} AND {NEWEST}{{after}}{{kind}} "
    "ORDER BY modified DESC, path LIMIT ?"
)
"""The live entries newest first (``modified`` descending, then by path), as ``glob``
answers: a walk of ``revisions_recent`` that stops at its ``LIMIT`` (``recent``)."""
RECENT_TIE = " AND modified=? AND path>?"
"""After an entry: the rest of its ``modified`` (one seek)."""
RECENT_OLDER = " AND modified<?"
"""After an entry: those modified before it (one seek)."""
ENTRIES_PAGE = (
    f"SELECT {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_live "
    f"WHERE {_LIVE_ROWS} AND path>=?{{upper}} ORDER BY path LIMIT ?"
)
"""A page of the live entries in path order from a path on (below a bound): a walk of a
subtree that skips an excluded directory's range with a new seek (``entries_page``)."""
FILES_HOLDING = (
    "SELECT path, sha256 FROM revisions INDEXED BY revisions_content "
    f"WHERE ws=? AND until={LIVE} AND {NEWEST} AND sha256 IN ({{marks}}) "
    "AND kind='f' AND binary=0{scope} ORDER BY path"
)
"""The live text files (below a scope) holding one of a few contents: one seek of
``revisions_content`` a content, whatever the tree around them."""


# ---------------------------------------------------------------------- dynamic statements
def entries(
    ws: int, version: int, scope: str, with_scope: bool, newest: bool
) -> tuple[str, list[Any]]:
    """Every entry below directory ``scope`` at ``version`` (and ``scope`` itself, when
    ``with_scope``), in path order: ``ENTRIES_LIVE`` or ``ENTRIES_AT``. Below a scope, the
    live form seeks the subtree's range of the index; the other reads the rows ended since
    ``version`` in the whole workspace, and keeps the subtree's."""
    args = live_args(ws, version) if newest else at_args(ws, version)
    scoped = ""
    if scope:
        lo, hi = subtree(scope)
        scoped = ENTRIES_SCOPE
        args += [scope if with_scope else lo, hi, lo, scope]
    return (ENTRIES_LIVE if newest else ENTRIES_AT).format(scope=scoped), args


def files(
    ws: int, version: int, scope: str, shas: list[str] | None, newest: bool
) -> tuple[str, list[Any]]:
    """``FILES``: the text files below ``scope`` at ``version``; with ``shas``, only those
    holding one of them (listed, or as JSON past ``FILES_LISTED_MAX``)."""
    args = live_args(ws, version) if newest else at_args(ws, version)
    scoped = candidates = ""
    if scope:
        scoped = FILES_SCOPE
        args += list(subtree(scope))
    if shas is not None:
        if len(shas) <= FILES_LISTED_MAX:  # selective: look the few contents up
            candidates = FILES_LISTED.format(marks=marks(len(shas)))
            args += shas
        else:
            candidates = FILES_JSON
            args.append(json.dumps(shas))
    where = _LIVE_ROWS if newest else _ROWS_AT
    return FILES.format(where=where, scope=scoped, candidates=candidates), args


def recent(
    ws: int, version: int, kind: str | None, after: tuple[str, str] | None, older: bool, limit: int
) -> tuple[str, list[Any]]:
    """``RECENT``: up to ``limit`` live entries (of ``kind``) newest first; after the
    ``(modified, path)`` of an entry, those of the same time after its path or (``older``)
    those modified before it."""
    args: list[Any] = live_args(ws, version)
    more = ""
    if after is not None:
        more = RECENT_OLDER if older else RECENT_TIE
        args += [after[0]] if older else list(after)
    kinds = ""
    if kind is not None:
        kinds = " AND kind=?"
        args.append(kind)
    return RECENT.format(after=more, kind=kinds), [*args, limit]


def entries_page(
    ws: int, version: int, start: str, upper: str | None, limit: int
) -> tuple[str, list[Any]]:
    """``ENTRIES_PAGE``: up to ``limit`` live entries from ``start`` on, below ``upper``."""
    args: list[Any] = [*live_args(ws, version), start]
    bound = ""
    if upper is not None:
        bound = " AND path<?"
        args.append(upper)
    return ENTRIES_PAGE.format(upper=bound), [*args, limit]


def files_holding(ws: int, version: int, scope: str, shas: list[str]) -> tuple[str, list[Any]]:
    """``FILES_HOLDING``: the live text files below ``scope`` holding one of ``shas`` (at
    most ``FILES_LISTED_MAX``)."""
    args: list[Any] = [*live_args(ws, version), *shas]
    scoped = ""
    if scope:
        scoped = FILES_SCOPE
        args += list(subtree(scope))
    return FILES_HOLDING.format(marks=marks(len(shas)), scope=scoped), args


FILES_LISTED_MAX = 5000
"""Candidate contents listed in the statement (more go as one JSON argument)."""


def listing(
    ws: int,
    version: int,
    directory: str,
    recursive: bool,
    kind: str | None,
    prefix: str,
    newest: bool,
) -> tuple[str, str, list[Any]]:
    """The index, ``WHERE`` and arguments of a listing's entries (``PAGE``, ``COUNT``): the
    children of ``directory`` (or, ``recursive``, everything beneath it) of ``kind`` whose
    path relative to it starts with ``prefix``. The children of one directory seek
    ``revisions_children (ws, parent, until)``, a subtree ``revisions_live``."""
    args = live_args(ws, version) if newest else at_args(ws, version)
    where = (_LIVE_ROWS if newest else _ROWS_AT) + " AND path != ''"
    index = "revisions_live"
    if not recursive:
        where += " AND parent=?"
        args.append(directory)
        index = "revisions_children"
    elif directory:
        where += " AND path>=? AND path<?"
        args += list(subtree(directory))
    if prefix:
        start = f"{directory}/{prefix}" if directory else prefix
        where += " AND path>=?"
        args.append(start)
        if ord(start[-1]) < 0x10FFFF:  # paths starting with `start` sort below its successor
            where += " AND path<?"
            args.append(start[:-1] + chr(ord(start[-1]) + 1))
    if kind is not None:
        where += " AND kind=?"
        args.append(kind)
    return index, where, args


def page(
    index: str,
    where: str,
    args: list[Any],
    recursive: bool,
    after: tuple[str, str] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """``PAGE``: up to ``limit`` entries of a listing after the ``(kind, path)`` of the
    previous page's last: directories first, then by name; or, recursive, by path."""
    args = list(args)
    if after is not None:
        if recursive:
            where += " AND path>?"
            args.append(after[1])
        else:
            where += " AND (kind='f', path) > (?, ?)"
            args += [after[0] == "f", after[1]]
    order = "path" if recursive else "kind='f', path"
    sql = PAGE.format(columns=REVISION_COLUMNS, index=index, where=where, order=order)
    return sql, [*args, limit]
