"""A workspace's row, and the statements that apply a plan to a projection, purge a
workspace and compact its history (see ``infra.sql``)."""

from __future__ import annotations

from core.plan import LIVE
from infra.sql.schema import SHA_INDEX, SHA_KEY, WHOLE_WORKSPACE

# ---------------------------------------------------------------------- workspaces
ROW_COLUMNS = (
    "id, tenant, name, trust, limits, created, version, last_seq, last_hash, tree_hash, "
    "updated, floor, lineage"
)
"""The columns ``infra.store.base.workspace_row`` reads, in order."""
WORKSPACE_BY_NAME = f"SELECT {ROW_COLUMNS} FROM workspaces WHERE tenant=? AND name=?"
WORKSPACE_BY_ID = f"SELECT {ROW_COLUMNS} FROM workspaces WHERE id=?"
IS_NEWEST = "SELECT 1 FROM workspaces WHERE id=? AND version=?"
TOTALS_LIVE = "SELECT files, dirs, total_bytes FROM workspaces WHERE id=? AND version=?"
"""A workspace's live files, directories and bytes (a reader's triggers keep them), if
``version`` is its newest."""
_HEAD_OF = "(SELECT {} FROM workspaces WHERE id=?1)"
TOTALS_SINCE = (
    f"SELECT {_HEAD_OF.format('version')}, {_HEAD_OF.format('files')} - born_f + ended_f, "
    f"{_HEAD_OF.format('dirs')} - born_d + ended_d, "
    f"{_HEAD_OF.format('total_bytes')} - born_b + ended_b, unknown FROM "
    "(SELECT count(*) - count(born_files) unknown, total(born_files) born_f, "
    "total(born_dirs) born_d, total(born_bytes) born_b FROM events "
    f"WHERE ws=?1 AND version>?2 AND version<={_HEAD_OF.format('version')}), "
    "(SELECT total(kind='f') ended_f, total(kind='d') ended_d, total(size) ended_b "
    "FROM revisions INDEXED BY revisions_live "
    f"WHERE ws=?1 AND until>?2 AND until<={_HEAD_OF.format('version')})"
)
"""A workspace's files, directories and bytes at an older version ``?2``, from its live
totals (at its ``version``, one statement: one snapshot; the workspace's row read by
``rowid`` seeks, each a scalar subquery: joined, a planner given a small table's statistics
scanned it): less what the events since made
(``born_*``, counted per event by ``core.plan.plan``), plus the rows ended since (those made
since and ended too cancel out). What it reads is what changed since ``?2``, never the tree
(before: every live row, ``TOTALS_AT``). ``unknown``: events since with no counts (kept by a
compaction manifest made before they were counted): then ``TOTALS_AT``."""
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
INSERT_EVENT = f"INSERT INTO events VALUES({', '.join('?' * 20)})"
EVENT_ROW = 19
"""Values of an event row but its ``ws`` (a compaction manifest made before ``message`` was kept
holds one fewer, before the ``born_*`` counts four fewer: ``Store`` pads it with NULLs, and a
NULL count sends ``TOTALS_SINCE``'s caller to ``TOTALS_AT``)."""
UPSERT_BLOB = (
    "INSERT INTO blobs(sha256, size, data, ws) VALUES(?, ?, ?, ?) ON CONFLICT(sha256) "
    "DO UPDATE SET data=coalesce(blobs.data, excluded.data), ws=coalesce(excluded.ws, blobs.ws)"
)
"""A content an event carries (``data``), or one it names in WS_BLOBS (``data`` NULL, ``ws``
the workspace whose namespace holds it: where a reader's indexer fetches it from)."""
INSERT_CONTROL = "INSERT INTO controls VALUES(?, ?, ?, ?)"
SET_HEAD = (
    "UPDATE workspaces SET version=?, last_seq=?, last_hash=?, tree_hash=?, updated=?, trust=?, "
    "limits=?, floor=?, lineage=?, base=? WHERE id=?"
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
    f"SELECT value FROM json_each(?) WHERE EXISTS (SELECT 1 FROM revisions INDEXED BY {SHA_INDEX} "
    f"WHERE {SHA_KEY} = substr(value, 1, 8) AND sha256 = value)"
)
"""Which of a purged workspace's contents (a JSON list, distinct) another workspace still
has: a seek of ``revisions_sha`` each (its key, then the whole sha256 of the rows under it),
so a purge costs the purged workspace's rows, not the projection's (a fork of a large
source: issue 33)."""
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
    "hash, prev_hash, tree_hash, changes, changes_total, result, message, born_files, born_dirs, "
    "born_bytes FROM events WHERE ws=? ORDER BY version"
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
