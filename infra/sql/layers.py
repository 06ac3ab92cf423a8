"""A fork's reads through its layers (``infra/store/layers.py``): what each layer decides,
the whiteouts a delete in a fork leaves, and the forks of a workspace (see ``infra.sql``)."""

from __future__ import annotations

from typing import Any

from core.plan import LIVE, WHITEOUT
from infra.sql.revisions import RECENT_OLDER, RECENT_TIE, REVISION_COLUMNS
from infra.sql.schema import FIRST_ROWS, WHOLE_WORKSPACE

FORK_OF = "SELECT tenant, lineage FROM workspaces WHERE id=?"
"""A workspace's tenant and lineage (``''``: no fork), by id."""
TOUCHED = (
    f"SELECT DISTINCT {WHOLE_WORKSPACE} path FROM revisions "
    "WHERE ws=? AND path>=? AND path<? AND version<=?"
)
"""The paths a fork's layer has a row of (any: live, ended or a whiteout) at or before a
version, in a range: the paths it decides, hiding the layers below. Meant to read every row
of the layer's own in the range (a range of the primary key): a fork's own rows are what it
changed since its fork point, never its source's history."""
LAYER_ROWS = (
    "SELECT path, kind, sha256, size, file_version, executable, binary, created, modified, "
    "version, until, moved_from FROM revisions INDEXED BY revisions_live "
    "WHERE ws=? AND until>? AND version<=? AND path>=? AND path<? ORDER BY path"
)
"""A layer's entries in a range as of a version (the live rows and those ended since it),
on the writer's connection (inside an apply: what the batch wrote so far included)."""
INSERT_WHITEOUT = (
    "INSERT OR IGNORE INTO revisions "
    f"VALUES(?1, ?2, ?3, ?3, ?4, '{WHITEOUT}', NULL, 0, NULL, 0, 0, ?5, ?5, NULL)"
)
"""A fork's whiteout of ``path`` from a version (valid over no version: ``until = version``)."""
LAYER_HISTORIES = (
    "SELECT j.value, "
    "(SELECT file_version FROM revisions WHERE ws=?1 AND path=j.value AND version<=?3 "
    "AND file_version IS NOT NULL ORDER BY version DESC LIMIT 1), "
    f"(SELECT max(version, CASE WHEN until < {LIVE} AND until <= ?3 THEN until ELSE 0 END) "
    "FROM revisions WHERE ws=?1 AND path=j.value AND version<=?3 ORDER BY version DESC LIMIT 1) "
    "FROM json_each(?2) j"
)
"""``PATH_HISTORIES`` of a layer as of its version (two seeks a path)."""
FORKS_OF = (
    "SELECT name, lineage, version FROM workspaces INDEXED BY workspaces_base "
    "WHERE tenant=? AND base=? AND name>? ORDER BY name LIMIT ?"
)
"""A workspace's forks (those whose nearest layer it is), by name: one seek of
``workspaces_base``."""
EVENT_AT = "SELECT hash, tree_hash FROM events WHERE ws=? AND version=?"
"""The chain hash and tree hash of a workspace's event at a version (where a fork starts)."""
TRUST_NOW = (
    f"SELECT {FIRST_ROWS} event FROM controls WHERE ws=? "
    "AND type IN ('trust_changed', 'workspace_forked') ORDER BY version DESC LIMIT 1"
)
"""The newest event that set a workspace's trust (whether a restricted one offers commands),
newest first: a fork inherits it."""

# ---------------------------------------------------------------------- a fork's pages
# A page of a fork merges its layers' own pages (``infra/store/merged.py``): each layer's
# entries valid at its version are its live rows made by then (a page of an index, in its
# order) and the rows ended since (what changed since: read whole, sorted in memory); a
# nearer layer's row of a path hides it (``DECIDED``, one seek a path).
LAYER_LIVE_PAGE = (
    f"SELECT {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_live "
    f"WHERE ws=? AND until={LIVE} AND version<=? AND path>=? AND path<? ORDER BY path LIMIT ?"
)
"""A page of a layer's live rows made by its version, in path order from a path on."""
LAYER_ENDED = (
    f"SELECT {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_live "
    f"WHERE ws=? AND until>? AND until<{LIVE} AND version<=? AND path>=? AND path<?"
)
"""A layer's rows valid at its version that ended since (in a range of paths): what the
layer changed since that version (none at its newest)."""
LAYER_CHILDREN = (
    f"SELECT {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_children "
    "WHERE ws=? AND parent=? AND until>? AND version<=?"
)
"""A layer's children of one directory valid at its version (those live, and those ended
since it): one seek of ``revisions_children``."""
LAYER_RECENT = (
    f"SELECT {FIRST_ROWS} {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_recent "
    f"WHERE ws=? AND until={LIVE} AND version<=?{{after}} ORDER BY modified DESC, path LIMIT ?"
)
"""A page of a layer's live rows made by its version, newest first (``sql.RECENT``'s order,
after an entry with ``RECENT_TIE`` or ``RECENT_OLDER``)."""
LAYER_HOLDING = (
    f"SELECT {REVISION_COLUMNS} FROM revisions INDEXED BY revisions_content "
    f"WHERE ws=? AND until={LIVE} AND version<=? "
    "AND sha256 IN (SELECT value FROM json_each(?)) AND kind='f' AND binary=0 "
    "AND path>=? AND path<?"
)
"""A layer's live text files made by its version holding one of a JSON list of contents, in
a range of paths: one seek of ``revisions_content`` a content."""
DECIDED = (
    "SELECT j.value FROM json_each(?1) j WHERE EXISTS (SELECT 1 FROM revisions "
    "WHERE ws=?2 AND path=j.value AND version<=?3)"
)
"""Which of a JSON list of paths a layer has a row of at or before its version (live, ended
or a whiteout: it decides them, hiding the layers below): one seek a path."""

# ---------------------------------------------------------------------- a fork's totals
# A fork's totals (``qry.info``) and a listing's ``total`` are its source's as of the fork
# point (one aggregate, held by the reader) plus what the fork's own rows change: what each
# of its paths shows less what the layers below showed there (``services/reader/forked.py``).
LAYER_OWN = (
    f"SELECT {WHOLE_WORKSPACE} path, kind, size, until, max(version) FROM revisions "
    "WHERE ws=? AND path>=? AND path<? AND version<=? GROUP BY path"
)
"""A layer's newest row of each path it has a row of at or before a version (live, ended or
a whiteout), in a range: meant to read every row of the layer's own in the range (a range of
the primary key), as ``TOUCHED`` does: a fork's own rows are what it changed since its fork
point, never its source's history."""
LAYER_SHOWN = (
    "SELECT j.value, r.kind, r.size, r.until FROM json_each(?1) j CROSS JOIN revisions r "
    "ON r.ws=?2 AND r.path=j.value AND r.version=(SELECT max(version) FROM revisions "
    "WHERE ws=?2 AND path=j.value AND version<=?3)"
)
"""The newest row at or before a version of each of a JSON list of paths a layer has one of
(it decides them; valid then, or ended, or a whiteout): two seeks a path."""

_COUNTED = (
    "SELECT count(*) FROM revisions INDEXED BY revisions_live WHERE ws=?1 AND {until} "
    "AND version<=?2 AND path>=?3 AND path<?4 AND path != ''{kind}"
)
LAYER_COUNT = (
    "SELECT ("
    + _COUNTED.replace("{until}", f"until={LIVE}")
    + ") + ("
    + _COUNTED.replace("{until}", f"until>?2 AND until<{LIVE}")
    + ")"
)
"""A layer's entries (of a kind) valid at its version in a range of paths: its live rows
made by then (a range of ``revisions_live``: the range's) and its rows ended since (what it
changed since that version), counted. A recursive listing's ``total`` on a fork starts from
its source's as of the fork point."""


def layer_count(ws: int, at: int, lo: str, hi: str, kind: str | None) -> tuple[str, list[Any]]:
    """``LAYER_COUNT``: workspace ``ws``'s entries (of ``kind``) in ``lo <= path < hi`` as of
    ``at``."""
    more = "" if kind is None else " AND kind=?5"
    args: list[Any] = [ws, at, lo, hi] + ([] if kind is None else [kind])
    return LAYER_COUNT.format(kind=more), args


def layer_recent(
    ws: int, at: int, after: tuple[str, str] | None, older: bool, limit: int
) -> tuple[str, list[Any]]:
    """``LAYER_RECENT``: up to ``limit`` of a layer's live rows made by ``at``, newest first;
    after the ``(modified, path)`` of a row, those of its time after its path or (``older``)
    those modified before it."""
    args: list[Any] = [ws, at]
    more = ""
    if after is not None:
        more = RECENT_OLDER if older else RECENT_TIE
        args += [after[0]] if older else list(after)
    return LAYER_RECENT.format(after=more), [*args, limit]
