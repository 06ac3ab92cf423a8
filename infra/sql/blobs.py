"""Contents (blobs) and the trigram index that search reads (see ``infra.sql``)."""

from __future__ import annotations

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
