"""Every SQL statement run on a projection, by name, with the plan each is meant to have.

A statement's plan is part of what it means: ``SELECT ... WHERE ws=? AND request_id=?`` is a
lookup only if SQLite seeks an index on both columns; planned on the primary key ``(ws,
version)`` it read a workspace's whole history (90 ms at 100,000 events, issue 29). So the
plans are not left to the statistics of the day:

* **Forced where there is a choice.** Where another index could serve a statement, the
  statement names the one meant (``INDEXED BY``): SQLite then plans it on that index or
  refuses to prepare it, whatever ``sqlite_stat1`` holds: a fresh projection, one analysed
  while small, and one whose single workspace holds most of its rows plan it alike.
* **The newest version reads the live rows.** A tree as of a version is the rows valid over
  ``[version, until)``. At the workspace's newest version those are the rows with ``until =
  LIVE``: one seek on ``revisions_live (ws, until, path)``, in path order, as cheap at a
  million events as at a thousand (``*_LIVE``). Whether a version is the newest is decided by
  the statement itself (``AND (SELECT version FROM workspaces WHERE id = ?) = ?``, evaluated
  once before the loop), so a workspace moving on meanwhile makes it return nothing, and the
  caller asks the historical form. An older version ``v`` seeks the rows with ``until > v``
  on the same index: the live rows and the revisions ended since ``v``; what it costs is
  what changed since ``v`` (``*_AT``), never the history before it.
* **Statistics kept, and seeded.** ``sqlite_stat1`` is gathered again (``ANALYZE``, bounded
  by ``analysis_limit``) whenever the projection has doubled since the last time (and after
  a snapshot is installed); an index without statistics (a fresh projection, an empty table)
  gets the fixed, realistic row of ``SEEDED_STATS``, so the first query of a projection is
  planned as the millionth.
* **A whole workspace only where meant.** A statement meant to read every row of a workspace
  (compaction, a purge, the writer's load of control events) says so in a comment,
  ``/* plan: workspace */``; one meant to read a whole table ``/* plan: table */``; one that
  reads a workspace's rows in index order and stops at its ``LIMIT`` ``/* plan: first rows */``.
  tests/integration/test_query_plans.py explains every statement of ``shapes()`` (each
  variant of the dynamic ones) against projections with no statistics, seeded ones, and ones
  analysed small and large, and fails on a scan of a workspace's rows that no comment allows;
  the row-counting test explains every statement the services actually ran as well.

Nothing else in the code base holds SQL for a projection (a test checks).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from core.plan import LIVE, subtree

WHOLE_WORKSPACE = "/* plan: workspace */"
"""Reads every row a workspace has in a table: meant (compaction, purge, the writer's load
of the control events)."""
WHOLE_TABLE = "/* plan: table */"
"""Reads a whole table: meant (rare, and said why where used)."""
FIRST_ROWS = "/* plan: first rows */"
"""Reads a workspace's rows in index order and stops at its ``LIMIT``."""

SCHEMA_VERSION = "10"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tracking(name TEXT PRIMARY KEY, position INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS workspaces(
    id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL,
    trust TEXT NOT NULL, limits TEXT NOT NULL, created TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 0, last_seq INTEGER NOT NULL DEFAULT 0,
    last_hash TEXT NOT NULL DEFAULT '', tree_hash TEXT NOT NULL DEFAULT '',
    updated TEXT NOT NULL DEFAULT '', floor INTEGER NOT NULL DEFAULT 0,
    files INTEGER NOT NULL DEFAULT 0, total_bytes INTEGER NOT NULL DEFAULT 0,
    dirs INTEGER NOT NULL DEFAULT 0,
    UNIQUE(tenant, name));
CREATE TABLE IF NOT EXISTS events(
    ws INTEGER NOT NULL, version INTEGER NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
    op TEXT NOT NULL, at TEXT NOT NULL, actor TEXT, session TEXT, run TEXT, request_id TEXT,
    hash TEXT NOT NULL, prev_hash TEXT NOT NULL, tree_hash TEXT NOT NULL,
    changes TEXT NOT NULL, changes_total INTEGER NOT NULL, result TEXT, message TEXT,
    PRIMARY KEY(ws, version)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS revisions(
    ws INTEGER NOT NULL, path TEXT NOT NULL, version INTEGER NOT NULL,
    until INTEGER NOT NULL DEFAULT {LIVE}, parent TEXT NOT NULL, kind TEXT NOT NULL,
    sha256 TEXT, size INTEGER NOT NULL, file_version INTEGER, executable INTEGER NOT NULL,
    binary INTEGER NOT NULL, created TEXT NOT NULL, modified TEXT NOT NULL, moved_from TEXT,
    PRIMARY KEY(ws, path, version)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blobs(
    sha256 TEXT PRIMARY KEY, size INTEGER NOT NULL, data BLOB, indexed INTEGER NOT NULL DEFAULT 0,
    ws INTEGER, stash BLOB);
CREATE TABLE IF NOT EXISTS controls(
    ws INTEGER NOT NULL, version INTEGER NOT NULL, type TEXT NOT NULL, event TEXT NOT NULL,
    PRIMARY KEY(ws, version)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS uncommitted(
    ws INTEGER NOT NULL, path TEXT NOT NULL, reason TEXT NOT NULL, by_command TEXT NOT NULL,
    version INTEGER NOT NULL, PRIMARY KEY(ws, path)) WITHOUT ROWID;
"""
_LIVE_INDEX = "CREATE INDEX IF NOT EXISTS revisions_live ON revisions(ws, until, path);"
ROLE_INDEXES = {
    # The writer looks up request ids (idempotent retries), loads a workspace's live tree and
    # closes the live rows a change replaces (``revisions_live``: without it both read every
    # revision of the workspace, or of the path, ever made).
    "writer": "CREATE INDEX IF NOT EXISTS events_request ON events(ws, request_id);\n"
    + _LIVE_INDEX,
    # Readers answer as-of-version listings and whole-tree queries, and search contents: a
    # contentless trigram index of every text blob (keyed by the blob's rowid). They keep each
    # workspace's live files, directories and bytes in its row (triggers), find its last lock
    # or archive event by kind, and a run by its id, so a page of the workspace listing and
    # ``info`` cost the same whatever the workspaces hold (issues 17, 29). A glob walks the
    # live rows newest first and stops once it has what it returns (``revisions_recent``); a
    # grep finds the live files holding its few candidate contents (``revisions_content``):
    # both partial (live rows only), so neither grows with history (issue 29).
    "reader": _LIVE_INDEX
    + f"""
CREATE INDEX IF NOT EXISTS revisions_children ON revisions(ws, parent, until);
CREATE INDEX IF NOT EXISTS revisions_recent ON revisions(ws, modified DESC, path)
    WHERE until = {LIVE};
CREATE INDEX IF NOT EXISTS revisions_content ON revisions(ws, sha256) WHERE until = {LIVE};
CREATE INDEX IF NOT EXISTS controls_kind ON controls(ws, type, version);
CREATE INDEX IF NOT EXISTS controls_run ON controls(ws, json_extract(event, '$.run_id'))
    WHERE type = 'run_started';
CREATE VIRTUAL TABLE IF NOT EXISTS content_index
    USING fts5(content, tokenize='trigram', content='', detail=none);
CREATE INDEX IF NOT EXISTS blobs_unindexed ON blobs(indexed) WHERE indexed = 0;
CREATE TRIGGER IF NOT EXISTS files_born AFTER INSERT ON revisions
    WHEN NEW.until = {LIVE} BEGIN
    UPDATE workspaces SET files = files + (NEW.kind = 'f'), dirs = dirs + (NEW.kind = 'd'),
    total_bytes = total_bytes + NEW.size WHERE id = NEW.ws; END;
CREATE TRIGGER IF NOT EXISTS files_ended AFTER UPDATE OF until ON revisions
    WHEN OLD.until = {LIVE} AND NEW.until <> {LIVE} BEGIN
    UPDATE workspaces SET files = files - (OLD.kind = 'f'), dirs = dirs - (OLD.kind = 'd'),
    total_bytes = total_bytes - OLD.size WHERE id = OLD.ws; END;
CREATE TRIGGER IF NOT EXISTS files_deleted AFTER DELETE ON revisions
    WHEN OLD.until = {LIVE} BEGIN
    UPDATE workspaces SET files = files - (OLD.kind = 'f'), dirs = dirs - (OLD.kind = 'd'),
    total_bytes = total_bytes - OLD.size WHERE id = OLD.ws; END;
""",
}
"""Each role indexes only what it queries: every index costs on every applied event."""
ROLE_DROPS = {
    "writer": """
DROP INDEX IF EXISTS revisions_children;
DROP INDEX IF EXISTS revisions_recent;
DROP INDEX IF EXISTS revisions_content;
DROP INDEX IF EXISTS controls_run;
DROP INDEX IF EXISTS blobs_unindexed;
DROP TABLE IF EXISTS content_index;
DELETE FROM tracking;
""",
    "reader": "DROP INDEX IF EXISTS events_request;",
}
"""With ``ROLE_INDEXES``, what makes another role's projection this role's (a writer starting
from a reader's snapshot: the tables are the same, the indexes not; a writer tracks no
position, each workspace's row says how far it is)."""

# ---------------------------------------------------------------------- statistics
ANALYSIS_ROWS = 4_000
"""``PRAGMA analysis_limit``: rows of each index an ``ANALYZE`` reads (an estimate from a
sample: milliseconds at any size, and the plans do not hang on its precision)."""
STATS_EVERY = 10_000
"""Log positions after which statistics are gathered again, and at least as many as at the
last gathering (``Store``: every doubling, a few dozen times in a projection's life)."""
STATS_AT = "stats_at"
"""The meta key of the log position at which statistics were last gathered."""
SEEDED_STATS: tuple[tuple[str, str, str], ...] = (
    # (table, index, stat): a projection of 1,000 workspaces, 1,000,000 events and revisions
    # (1,000 a workspace, 10 a path), 100 live rows a workspace, 10 entries a directory.
    ("events", "events", "1000000 1000 1"),
    ("events", "events_request", "1000000 1000 1 1"),
    ("revisions", "revisions", "1000000 1000 10 1"),
    ("revisions", "revisions_live", "1000000 1000 10 1 1"),
    ("revisions", "revisions_children", "1000000 1000 100 10 1 1"),
    ("revisions", "revisions_recent", "100000 100 1 1"),
    ("revisions", "revisions_content", "100000 100 1"),
    ("controls", "controls", "100000 100 1"),
    ("controls", "controls_kind", "100000 100 20 1"),
    ("controls", "controls_run", "10000 10 1 1"),
    ("uncommitted", "uncommitted", "10000 10 1"),
    ("workspaces", "sqlite_autoindex_workspaces_1", "1000 100 1"),
    ("blobs", "sqlite_autoindex_blobs_1", "1000000 1"),
    ("blobs", "blobs_unindexed", "1000 1000"),
)
"""What an index without statistics is planned with: realistic for a projection that is
large, so a small one that grows never keeps a plan made for a handful of rows (the forced
plans above do not depend on them; these keep the others right until an ``ANALYZE``)."""
SEED_STAT = (
    f"INSERT INTO sqlite_stat1(tbl, idx, stat) SELECT {WHOLE_TABLE} ?1, ?2, ?3 "
    "WHERE EXISTS (SELECT 1 FROM sqlite_schema WHERE name = ?2) "
    "AND NOT EXISTS (SELECT 1 FROM sqlite_stat1 WHERE tbl = ?1 AND idx = ?2)"
)
"""A seeded row, for an index that exists and has none (the catalog's tables are small)."""
ANALYZE = (
    f"PRAGMA analysis_limit={ANALYSIS_ROWS}",
    "BEGIN IMMEDIATE",
    # dropped and made again by ANALYZE: a change of the schema, so that every other
    # connection loads the new statistics at its next statement (a later ANALYZE alone
    # leaves them planning with what they loaded when they opened)
    "DROP TABLE IF EXISTS sqlite_stat1",
    "ANALYZE",
)
"""Gathering statistics (``store.gather_statistics``), before the seeded rows (``SEED_STAT``)
and the commit."""
STATS_CREATE = "ANALYZE sqlite_schema"
"""Makes ``sqlite_stat1`` (none yet in a fresh projection: the seeded rows go into it), and
loads statistics on this connection."""

# ---------------------------------------------------------------------- meta, tracking
SCHEMA_OF = "SELECT value FROM meta WHERE key='schema_version'"
SET_SCHEMA = "INSERT OR IGNORE INTO meta VALUES('schema_version', ?)"
META = "SELECT value FROM meta WHERE key=?"
SET_META = "INSERT OR REPLACE INTO meta VALUES(?, ?)"
RAISE_META = (
    "INSERT INTO meta VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET "
    "value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))"
)
"""A numeric meta value that only grows (the writer's high water)."""
POSITION = "SELECT position FROM tracking WHERE name=?"
SET_POSITION = "INSERT OR REPLACE INTO tracking VALUES(?, ?)"
TOP_ID = "SELECT max(id) FROM workspaces"
NEWEST_SEQ = f"SELECT {WHOLE_TABLE} max(last_seq) FROM workspaces"
"""A reader's high water (it keeps none): a scan of the workspace rows, once at start."""
CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"

# ---------------------------------------------------------------------- workspaces
ROW_COLUMNS = (
    "id, tenant, name, trust, limits, created, version, last_seq, last_hash, tree_hash, "
    "updated, floor"
)
"""The columns ``store._workspace_row`` reads, in order."""
WORKSPACE_BY_NAME = f"SELECT {ROW_COLUMNS} FROM workspaces WHERE tenant=? AND name=?"
WORKSPACE_BY_ID = f"SELECT {ROW_COLUMNS} FROM workspaces WHERE id=?"
IS_NEWEST = "SELECT 1 FROM workspaces WHERE id=? AND version=?"
TOTALS_LIVE = "SELECT files, dirs, total_bytes FROM workspaces WHERE id=? AND version=?"
"""A workspace's live files, directories and bytes (a reader's triggers keep them), if
``version`` is its newest."""
WORKSPACE_PAGE = (
    "SELECT w.id, w.name, w.version, w.trust, w.created, e.at, e.actor, e.op, "
    "w.files, w.total_bytes "
    "FROM workspaces w JOIN events e ON e.ws = w.id AND e.version = w.version "
    "WHERE w.tenant=? AND w.name>? {prefix}ORDER BY w.name LIMIT ?"
)
WORKSPACE_PREFIX = "AND w.name>=? AND w.name<? "

# ---------------------------------------------------------------------- apply
NEW_WORKSPACE = (
    "INSERT INTO workspaces(id, tenant, name, trust, limits, created) VALUES(?, ?, ?, ?, ?, ?)"
)
CLOSE_LIVE = (
    "UPDATE revisions INDEXED BY revisions_live SET until=? "
    f"WHERE ws=? AND until={LIVE} AND path>=? AND path<?"
)
"""End the live rows of ``[lo, hi)``: a seek of the live rows, never a path's history."""
INSERT_REVISION = "INSERT INTO revisions VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
INSERT_EVENT = "INSERT INTO events VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
EVENT_ROW = 16
"""Values of an event row but its ``ws`` (a compaction manifest made before ``message`` was kept
holds one fewer: ``Store`` pads it)."""
UPSERT_BLOB = (
    "INSERT INTO blobs(sha256, size, data, ws) VALUES(?, ?, ?, ?) ON CONFLICT(sha256) "
    "DO UPDATE SET data=coalesce(blobs.data, excluded.data), ws=coalesce(excluded.ws, blobs.ws)"
)
"""A content an event carries (``data``), or one it names in WS_BLOBS (``data`` NULL, ``ws``
the workspace whose namespace holds it: where a reader's indexer fetches it from)."""
INSERT_CONTROL = "INSERT INTO controls VALUES(?, ?, ?, ?)"
SET_HEAD = (
    "UPDATE workspaces SET version=?, last_seq=?, last_hash=?, tree_hash=?, updated=?, trust=?, "
    "limits=?, floor=? WHERE id=?"
)
"""A workspace's row as a batch left it (its head, evolved by ``core.plan``)."""
CLEAR_UNCOMMITTED = "DELETE FROM uncommitted WHERE ws=? AND path>=? AND path<?"
DROP_UNCOMMITTED = f"DELETE FROM uncommitted {WHOLE_WORKSPACE} WHERE ws=?"
"""A workspace's uncommitted set is replaced whole (as long as one command's set: capped)."""
SET_UNCOMMITTED = "INSERT OR REPLACE INTO uncommitted VALUES(?, ?, ?, ?, ?)"

# ---------------------------------------------------------------------- purge, compaction
HISTORY_TABLES = ("revisions", "events", "controls", "uncommitted")
"""The tables of a workspace's rows (keyed by ``ws`` first)."""
DELETE_ROWS = {t: f"DELETE FROM {t} {WHOLE_WORKSPACE} WHERE ws=?" for t in HISTORY_TABLES}
DELETE_WORKSPACE = "DELETE FROM workspaces WHERE id=?"
CONTENTS_OF = (
    f"SELECT DISTINCT {WHOLE_WORKSPACE} sha256 FROM revisions WHERE ws=? AND sha256 IS NOT NULL"
)
CONTENTS_KEPT = (
    # which of a purged workspace's contents another workspace still has: there is no index on
    # sha256 (it would cost every apply), and a purge is rare
    f"SELECT DISTINCT {WHOLE_TABLE} sha256 FROM revisions WHERE sha256 IN "
    "(SELECT value FROM json_each(?))"
)
BY_SHA = "INDEXED BY sqlite_autoindex_blobs_1"
"""A blob by its sha256 (the primary key's index: ``IN (SELECT value FROM json_each(?))``
was planned as a scan of every blob when the statistics said there were few)."""
INDEXED_CONTENTS = (
    f"SELECT rowid, data, stash FROM blobs {BY_SHA} WHERE indexed = 1 AND "
    "(data IS NOT NULL OR stash IS NOT NULL) AND sha256 IN (SELECT value FROM json_each(?))"
)
UNINDEX = "INSERT INTO content_index(content_index, rowid, content) VALUES('delete', ?, ?)"
DELETE_BLOBS = f"DELETE FROM blobs {BY_SHA} WHERE sha256 IN (SELECT value FROM json_each(?))"
REPLACE_WORKSPACE = (
    "INSERT INTO workspaces(id, tenant, name, trust, limits, created) "
    "VALUES(?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET trust=excluded.trust, "
    "limits=excluded.limits, created=excluded.created"
)
INSERT_UNCOMMITTED = SET_UNCOMMITTED
SET_COMPACTED = (
    "UPDATE workspaces SET version=?, last_seq=?, last_hash=?, tree_hash=?, updated=?, "
    "floor=? WHERE id=?"
)
KNOWN_BLOB = "INSERT OR IGNORE INTO blobs(sha256, size, data, ws) VALUES(?, ?, NULL, ?)"
ALL_REVISIONS = (
    f"SELECT {WHOLE_WORKSPACE} path, version, until, parent, kind, sha256, size, file_version, "
    "executable, binary, created, modified, moved_from FROM revisions WHERE ws=? "
    "ORDER BY path, version DESC"
)
ALL_EVENTS = (
    f"SELECT {WHOLE_WORKSPACE} version, seq, type, op, at, actor, session, run, request_id, "
    "hash, prev_hash, tree_hash, changes, changes_total, result, message FROM events WHERE ws=? "
    "ORDER BY version"
)
COUNT_EVENTS = f"SELECT {WHOLE_WORKSPACE} count(*) FROM events WHERE ws=?"
ALL_CONTROLS = (
    f"SELECT {WHOLE_WORKSPACE} version, type, event FROM controls WHERE ws=? ORDER BY version"
)
ALL_UNCOMMITTED = (
    f"SELECT {WHOLE_WORKSPACE} path, reason, by_command, version FROM uncommitted WHERE ws=? "
    "ORDER BY path"
)
REVISION_COUNTS = f"SELECT {WHOLE_WORKSPACE} path, count(*) FROM revisions WHERE ws=? GROUP BY path"
"""Revisions kept per path: a workspace with ``max_versions`` (compaction bounds it)."""

# ---------------------------------------------------------------------- blobs, search index
PUT_BLOB = (
    "INSERT INTO blobs(sha256, size, data) VALUES(?, ?, ?) "
    "ON CONFLICT(sha256) DO UPDATE SET data=excluded.data, stash=NULL"
)
UNINDEXED = "SELECT rowid, data FROM blobs WHERE indexed = 0 AND data IS NOT NULL LIMIT 1000"
REMOTE_UNINDEXED = (
    "SELECT blobs.rowid, blobs.sha256, workspaces.tenant, workspaces.name "
    "FROM blobs INDEXED BY blobs_unindexed "
    "JOIN workspaces ON workspaces.id = blobs.ws WHERE blobs.indexed = 0 AND blobs.data IS NULL "
    "LIMIT ?"
)
"""Contents not indexed because they are only in WS_BLOBS, and the workspace to fetch each from
(the indexer fetches them, so that grep's candidates are what its index matches)."""
INDEXED_REMOTE = "UPDATE blobs SET indexed = 1, stash = ? WHERE rowid = ? AND indexed = 0"
"""A content fetched from WS_BLOBS and indexed: not kept (a read fetches it), only ``stash``,
its text compressed, with which a purge takes it out of the contentless index again."""
IS_UNINDEXED = "SELECT 1 FROM blobs WHERE rowid = ? AND indexed = 0"
UNREACHABLE = "UPDATE blobs SET ws = NULL WHERE sha256 = ?"
"""A content its workspace's namespace no longer has: left to grep to read when it is asked
(it stays a candidate), not fetched again by the indexer."""
INDEXED_WITHOUT_CONTENT = "UPDATE blobs SET indexed = 1, data = NULL WHERE sha256 = ?"
"""A binary content the indexer fetched: nothing to index, nothing to keep (grep reads text)."""
INDEX_CONTENT = "INSERT INTO content_index(rowid, content) VALUES(?, ?)"
MARK_INDEXED = "UPDATE blobs SET indexed = 1 WHERE rowid = ?"
BLOB = "SELECT data FROM blobs WHERE sha256=?"
CONTENTS = "SELECT sha256, data FROM blobs WHERE sha256 IN ({marks}) AND data IS NOT NULL"
CANDIDATES = (
    "SELECT blobs.sha256 FROM content_index CROSS JOIN blobs ON blobs.rowid = content_index.rowid "
    "WHERE content_index MATCH ? UNION ALL SELECT sha256 FROM blobs WHERE indexed = 0"
)
"""Contents that may match a trigram query: indexed ones that match (each looked up by rowid,
never a scan of the blobs), and those not indexed."""

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
"""The columns ``store.node_from_row`` reads, in order."""
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
NEWEST_OF_KIND = (
    "SELECT max(version) AS v FROM controls INDEXED BY controls_kind WHERE ws=? AND type=?"
)
LAST_CONTROL = "SELECT event FROM controls WHERE ws=? AND version=(SELECT max(v) FROM ({newest}))"
"""The last control event of some kinds: one seek of ``controls_kind`` a kind."""
PINNED = (
    "SELECT json_extract(event, '$.pinned_version') FROM controls INDEXED BY controls_run "
    "WHERE ws=? AND type='run_started' AND json_extract(event, '$.run_id')=?"
)
"""The version a run reads: one seek of ``controls_run``, however many runs there were."""
CONTROL_EVENTS = (
    f"SELECT {WHOLE_WORKSPACE} event FROM controls INDEXED BY controls_kind "
    "WHERE ws=? AND type IN ({marks}) ORDER BY version"
)
"""Every control event of some kinds (a run's, the attached workspaces', the approvals'
answers fold them all)."""


def marks(n: int) -> str:
    """``n`` placeholders."""
    return ",".join("?" * n)


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


def last_control(ws: int, kinds: tuple[str, ...]) -> tuple[str, list[Any]]:
    """``LAST_CONTROL`` of ``kinds``."""
    newest = " UNION ALL ".join([NEWEST_OF_KIND] * len(kinds))
    return LAST_CONTROL.format(newest=newest), [ws, *[x for kind in kinds for x in (ws, kind)]]


# ---------------------------------------------------------------------- every statement
class Shape(NamedTuple):
    """One statement as run: its text and its arguments."""

    name: str
    sql: str
    args: tuple[Any, ...]
    roles: tuple[str, ...]
    """The projections (``writer``, ``reader``) that run it."""


BOTH, WRITER, READER = ("writer", "reader"), ("writer",), ("reader",)
FIXED: dict[str, tuple[str, tuple[str, ...]]] = {
    "SCHEMA_OF": (SCHEMA_OF, BOTH),
    "SET_SCHEMA": (SET_SCHEMA, BOTH),
    "META": (META, BOTH),
    "SET_META": (SET_META, BOTH),
    "RAISE_META": (RAISE_META, WRITER),
    "POSITION": (POSITION, BOTH),
    "SET_POSITION": (SET_POSITION, READER),
    "TOP_ID": (TOP_ID, BOTH),
    "NEWEST_SEQ": (NEWEST_SEQ, BOTH),
    "WORKSPACE_BY_NAME": (WORKSPACE_BY_NAME, BOTH),
    "WORKSPACE_BY_ID": (WORKSPACE_BY_ID, WRITER),
    "IS_NEWEST": (IS_NEWEST, BOTH),
    "TOTALS_LIVE": (TOTALS_LIVE, READER),
    "NEW_WORKSPACE": (NEW_WORKSPACE, BOTH),
    "CLOSE_LIVE": (CLOSE_LIVE, BOTH),
    "INSERT_REVISION": (INSERT_REVISION, BOTH),
    "INSERT_EVENT": (INSERT_EVENT, BOTH),
    "UPSERT_BLOB": (UPSERT_BLOB, BOTH),
    "INSERT_CONTROL": (INSERT_CONTROL, BOTH),
    "SET_HEAD": (SET_HEAD, BOTH),
    "CLEAR_UNCOMMITTED": (CLEAR_UNCOMMITTED, BOTH),
    "DROP_UNCOMMITTED": (DROP_UNCOMMITTED, BOTH),
    "SET_UNCOMMITTED": (SET_UNCOMMITTED, BOTH),
    **{f"DELETE_ROWS {t}": (DELETE_ROWS[t], BOTH) for t in HISTORY_TABLES},
    "DELETE_WORKSPACE": (DELETE_WORKSPACE, BOTH),
    "CONTENTS_OF": (CONTENTS_OF, BOTH),
    "CONTENTS_KEPT": (CONTENTS_KEPT, BOTH),
    "INDEXED_CONTENTS": (INDEXED_CONTENTS, READER),
    "UNINDEX": (UNINDEX, READER),
    "DELETE_BLOBS": (DELETE_BLOBS, BOTH),
    "REPLACE_WORKSPACE": (REPLACE_WORKSPACE, BOTH),
    "SET_COMPACTED": (SET_COMPACTED, BOTH),
    "KNOWN_BLOB": (KNOWN_BLOB, BOTH),
    "ALL_REVISIONS": (ALL_REVISIONS, WRITER),
    "ALL_EVENTS": (ALL_EVENTS, WRITER),
    "COUNT_EVENTS": (COUNT_EVENTS, WRITER),
    "ALL_CONTROLS": (ALL_CONTROLS, WRITER),
    "ALL_UNCOMMITTED": (ALL_UNCOMMITTED, BOTH),
    "REVISION_COUNTS": (REVISION_COUNTS, WRITER),
    "PUT_BLOB": (PUT_BLOB, BOTH),
    "UNINDEXED": (UNINDEXED, READER),
    "REMOTE_UNINDEXED": (REMOTE_UNINDEXED, READER),
    "UNREACHABLE": (UNREACHABLE, READER),
    "INDEXED_WITHOUT_CONTENT": (INDEXED_WITHOUT_CONTENT, READER),
    "INDEXED_REMOTE": (INDEXED_REMOTE, READER),
    "IS_UNINDEXED": (IS_UNINDEXED, READER),
    "INDEX_CONTENT": (INDEX_CONTENT, READER),
    "MARK_INDEXED": (MARK_INDEXED, READER),
    "BLOB": (BLOB, BOTH),
    "CANDIDATES": (CANDIDATES, READER),
    "LIVE_TREE": (LIVE_TREE, WRITER),
    "PATH_HISTORIES": (PATH_HISTORIES, WRITER),
    "CHANGED_BELOW": (CHANGED_BELOW, WRITER),
    "SMALL_PROBE": (SMALL_PROBE, WRITER),
    "LIVE_CONTROLS": (LIVE_CONTROLS, WRITER),
    "UNCOMMITTED_OF": (UNCOMMITTED_OF, WRITER),
    "RECENT_RESULTS": (RECENT_RESULTS, WRITER),
    "RESULTS_OF": (RESULTS_OF, WRITER),
    "NODE": (NODE, READER),
    "NODE_WITH_DATA": (NODE_WITH_DATA, READER),
    "TOTALS_AT": (TOTALS_AT, READER),
    "PATH_HISTORY": (PATH_HISTORY, READER),
    "EVENTS": (EVENTS, READER),
    "EVENTS_DESC": (EVENTS_DESC, READER),
    "PINNED": (PINNED, READER),
    "SEED_STAT": (SEED_STAT, BOTH),
}
"""The statements without variants, by name, with the roles that run them."""


def shapes() -> Iterator[Shape]:
    """Every statement the projections run, each dynamic one in each of its forms (for
    tests/integration/test_query_plans.py: nothing planned goes unexplained)."""
    for name, (sql, roles) in FIXED.items():
        yield Shape(name, sql, _nulls(sql), roles)
    yield Shape("WORKSPACE_PAGE", WORKSPACE_PAGE.format(prefix=""), (None,) * 3, READER)
    text = WORKSPACE_PAGE.format(prefix=WORKSPACE_PREFIX)
    yield Shape("WORKSPACE_PAGE prefix", text, (None,) * 5, READER)
    for n in (1, 3):
        for name, sql, roles in (
            ("UNCOMMITTED_AT", UNCOMMITTED_AT, BOTH),
            ("CONTENTS", CONTENTS, READER),
            ("CONTROL_EVENTS", CONTROL_EVENTS, READER),
        ):
            text = sql.format(marks=marks(n))
            yield Shape(f"{name} x{n}", text, (None,) * (n + (name != "CONTENTS")), roles)
        text, args = last_control(1, ("a",) * n)
        yield Shape(f"LAST_CONTROL x{n}", text, tuple(args), READER)
    for kind in (None, "f"):
        for after, older in ((None, False), (("m", "p"), False), (("m", "p"), True)):
            text, args = recent(1, 1, kind, after, older, 10)
            yield Shape(f"RECENT {kind=} {after=} {older=}", text, tuple(args), READER)
    for upper in (None, "d0"):
        text, args = entries_page(1, 1, "d/", upper, 10)
        yield Shape(f"ENTRIES_PAGE {upper=}", text, tuple(args), READER)
    for scope in ("", "d"):
        for n in (1, 3):
            text, args = files_holding(1, 1, scope, ["a"] * n)
            yield Shape(f"FILES_HOLDING {scope=} x{n}", text, tuple(args), READER)
    for newest in (True, False):
        form = "live" if newest else "at"
        for scope in ("", "d"):
            for with_scope in (False, True):
                text, args = entries(1, 1, scope, with_scope, newest)
                label = f"ENTRIES {form} {scope=} {with_scope=}"
                yield Shape(label, text, tuple(args), BOTH)
            for shas in (None, ["a"] * 3, ["a"] * (FILES_LISTED_MAX + 1)):
                text, args = files(1, 1, scope, shas, newest)
                label = f"FILES {form} {scope=} {len(shas) if shas else None} shas"
                yield Shape(label, text, tuple(args), READER)
        for recursive in (False, True):
            for directory in ("", "d"):
                for kind in (None, "f"):
                    for prefix in ("", "p"):
                        index, where, args = listing(
                            1, 1, directory, recursive, kind, prefix, newest
                        )
                        label = f"{form} {recursive=} {directory=} {kind=} {prefix=}"
                        text = COUNT.format(index=index, where=where)
                        yield Shape(f"COUNT {label}", text, tuple(args), READER)
                        for after in (None, ("f", "x")):
                            text, more = page(index, where, args, recursive, after, 10)
                            yield Shape(f"PAGE {label} {after=}", text, tuple(more), READER)


def _nulls(sql: str) -> tuple[Any, ...]:
    """As many NULL arguments as ``sql`` takes (plans do not depend on the values: SQLite
    is built without STAT4 here, and a test says so)."""
    numbered = [int(n) for n in re.findall(r"\?(\d+)", sql)]
    return (None,) * (max(numbered) if numbered else sql.count("?"))
