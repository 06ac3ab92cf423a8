"""What a merge reads of the two workspaces (issue 33): the paths each changed in a range of
versions (a reader's diff of two versions of one workspace too), and the last merge of one
into the other (see ``infra.sql``)."""

from __future__ import annotations

from core.plan import LIVE
from infra.sql.schema import MERGE_SOURCE

EVENTS_CHANGED = (
    "SELECT version, seq, changes, changes_total FROM events "
    "WHERE ws=? AND version>? AND version<=? ORDER BY version"
)
"""A workspace's events in a range of versions with their changes' summaries (a range of the
primary key: what it changed then, never its history before)."""
ENDED_IN = (
    "SELECT DISTINCT path FROM revisions INDEXED BY revisions_live "
    f"WHERE ws=? AND until>? AND until<=? AND until<{LIVE}"
)
"""The paths whose revisions ended in a range of versions (changed, removed: a removed
directory's contents too; a fork's whiteouts): a range of ``revisions_live``."""
LAST_MERGE = (
    "SELECT version, seq, result FROM events INDEXED BY events_merges "
    f"WHERE ws=? AND {MERGE_SOURCE}=? AND version>? AND op='merge' "
    "ORDER BY version DESC LIMIT 1"
)
"""A workspace's last merge of another (its result names it) after a version, with its log
sequence: one seek of ``events_merges`` (its merges of that workspace, newest first), so
looking up both directions costs the same however long either history is."""
