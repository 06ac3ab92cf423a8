"""The projection's tables and indexes (each role's), the markers of a statement's meant
plan, the statistics gathered and seeded, and the meta and tracking rows (see ``infra.sql``)."""

from __future__ import annotations

from core.plan import LIVE

WHOLE_WORKSPACE = "/* plan: workspace */"
"""Reads every row a workspace has in a table: meant (compaction, purge, the writer's load
of the control events)."""
WHOLE_TABLE = "/* plan: table */"
"""Reads a whole table: meant (rare, and said why where used)."""
FIRST_ROWS = "/* plan: first rows */"
"""Reads a workspace's rows in index order and stops at its ``LIMIT``."""

SCHEMA_VERSION = "12"
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
    lineage TEXT NOT NULL DEFAULT '', base TEXT,
    UNIQUE(tenant, name));
CREATE INDEX IF NOT EXISTS workspaces_base ON workspaces(tenant, base) WHERE base IS NOT NULL;
CREATE TABLE IF NOT EXISTS events(
    ws INTEGER NOT NULL, version INTEGER NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
    op TEXT NOT NULL, at TEXT NOT NULL, actor TEXT, session TEXT, run TEXT, request_id TEXT,
    hash TEXT NOT NULL, prev_hash TEXT NOT NULL, tree_hash TEXT NOT NULL,
    changes TEXT NOT NULL, changes_total INTEGER NOT NULL, result TEXT, message TEXT,
    born_files INTEGER, born_dirs INTEGER, born_bytes INTEGER,
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
SHA_INDEX = "revisions_sha"
SHA_KEY = "substr(sha256, 1, 8)"
"""What ``revisions_sha`` is keyed by: a content's first 8 hex digits (32 bits: a key shared
by chance is a rare extra row, checked against the whole ``sha256``). Half the size of the
whole sha256 in each entry, and what every applied file revision pays for it is about half
as much (``python -m bench purge``)."""
_SHA_INDEX = (
    f"CREATE INDEX IF NOT EXISTS {SHA_INDEX} ON revisions({SHA_KEY}) WHERE sha256 IS NOT NULL;"
)
"""Which workspaces' revisions hold a content, any workspace's: what a purge asks of each
content of the purged workspace (``CONTENTS_KEPT``), so that purging a fork of 3 files costs
3 seeks, not a scan of every revision of the projection (issue 33). Both roles purge. Files
only (a directory's row has no content). Made by opening an existing projection (``CREATE
INDEX IF NOT EXISTS``), like every index: the tables are the same, so the schema version is
too. Its price on each applied file revision: ``python -m bench purge``."""
MERGE_SOURCE = "json_extract(result, '$.source')"
"""What ``events_merges`` is keyed by after the workspace: the workspace a merge took in
(``tenant/name``, from its result). A statement must say it the same way to use the index."""
_MERGES_INDEX = (
    "CREATE INDEX IF NOT EXISTS events_merges "
    f"ON events(ws, {MERGE_SOURCE}, version) WHERE op = 'merge';"
)
"""A workspace's merges by the workspace each took in (issue 33): what a merge asks for its
base, in both directions (``LAST_MERGE``), without reading either history since the fork
point. Partial: merges only, so other events pay nothing for it. The writer's only."""
ROLE_INDEXES = {
    # The writer looks up request ids (idempotent retries), loads a workspace's live tree and
    # closes the live rows a change replaces (``revisions_live``: without it both read every
    # revision of the workspace, or of the path, ever made). Both roles find a purged
    # workspace's contents another still holds (``revisions_sha``).
    "writer": "CREATE INDEX IF NOT EXISTS events_request ON events(ws, request_id);\n"
    + _MERGES_INDEX
    + "\n"
    + _LIVE_INDEX
    + "\n"
    + _SHA_INDEX,
    # Readers answer as-of-version listings and whole-tree queries, and search contents: a
    # contentless trigram index of every text blob (keyed by the blob's rowid). They keep each
    # workspace's live files, directories and bytes in its row (triggers), find its last lock
    # or archive event by kind, and a run by its id, so a page of the workspace listing and
    # ``info`` cost the same whatever the workspaces hold (issues 17, 29). A glob walks the
    # live rows newest first and stops once it has what it returns (``revisions_recent``); a
    # grep finds the live files holding its few candidate contents (``revisions_content``):
    # both partial (live rows only), so neither grows with history (issue 29).
    "reader": _LIVE_INDEX
    + "\n"
    + _SHA_INDEX
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
    "reader": "DROP INDEX IF EXISTS events_request;\nDROP INDEX IF EXISTS events_merges;",
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
    ("events", "events_merges", "1000 100 10 1"),
    ("revisions", "revisions", "1000000 1000 10 1"),
    ("revisions", "revisions_live", "1000000 1000 10 1 1"),
    ("revisions", "revisions_children", "1000000 1000 100 10 1 1"),
    ("revisions", "revisions_recent", "100000 100 1 1"),
    ("revisions", "revisions_content", "100000 100 1"),
    ("revisions", SHA_INDEX, "1000000 2"),
    ("controls", "controls", "100000 100 1"),
    ("controls", "controls_kind", "100000 100 20 1"),
    ("controls", "controls_run", "10000 10 1 1"),
    ("uncommitted", "uncommitted", "10000 10 1"),
    ("workspaces", "sqlite_autoindex_workspaces_1", "1000 100 1"),
    ("workspaces", "workspaces_base", "100 10 2"),
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
"""Gathering statistics (``infra.store.gather_statistics``), before the seeded rows (``SEED_STAT``)
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


def marks(n: int) -> str:
    """``n`` placeholders."""
    return ",".join("?" * n)
