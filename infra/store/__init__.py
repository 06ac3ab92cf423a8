"""The SQLite projection of the log, shared by the writer and the readers.

One database file per service instance holds every workspace it follows. It is a cache of
WS_EVENTS: delete it and it is rebuilt from the log. Each batch of events is applied in one
transaction together with the tracking position, so a crash never leaves half a change set
or a position that disagrees with the data. Reads use a second connection (WAL), so queries
never wait behind an apply.

Every path's history is kept as revision rows valid over ``[version, until)``: a read of a
path as of any version is one index seek, as fast at version 1 as at the latest. A whole tree
at the newest version is the live rows (one seek); at an older version, the live rows and
those ended since (``as_of``): an operation costs what it returns, not the history behind it
(issue 29). The writer loads a workspace's live tree only, and looks up the history of the
other paths a decision names (``look_up``).

Workspace rows are held in a bounded cache (``PROJECTION_ROWS``, least recently used first
out), loaded on a miss by one indexed lookup: opening costs the same at any number of
workspaces, and memory grows with the budget, not with the workspaces (issue 17).

The planner's statistics are seeded when the projection is made and gathered again as it
grows (``gather_statistics``); the statements themselves, the schema and the plan each is meant
to have are in ``infra/sql/``, so a schema change is one module's change; the plan of what to
write is pure (``core.plan``). ``count_steps`` counts what the statements touch, for tests.

The parts: ``base`` (opening, statistics, meta, the rows held), ``apply`` (a batch, a purge,
a compaction), ``blobs`` (contents and the trigram index), ``queries`` (as-of reads), ``load``
(the writer's state).
"""

from __future__ import annotations

from infra.store.apply import Applying, ProjectionGap
from infra.store.base import (
    BULK_WAL_PAGES,
    HIGH_WATER,
    R_REVISION_COLUMNS,
    REVISION_COLUMNS,
    ROLE_DROPS,
    ROLE_INDEXES,
    ROWS_ENV,
    SCHEMA_VERSION,
    WAL_KEPT_BYTES,
    WAL_PAGES,
    Steps,
    gather_statistics,
    node_from_row,
)
from infra.store.blobs import STASH_LEVEL, Indexing
from infra.store.layers import TOP, Layering, Layers
from infra.store.load import SMALL_LOAD, Loaded, Loading
from infra.store.merges import Merging
from infra.store.queries import HISTORIES_INLINE, Queries


class Store(Applying, Indexing, Queries, Loading, Layering, Merging):
    """A projection database. Open with ``await Store.open(path)``."""


__all__ = [
    "BULK_WAL_PAGES",
    "HIGH_WATER",
    "HISTORIES_INLINE",
    "R_REVISION_COLUMNS",
    "REVISION_COLUMNS",
    "ROLE_DROPS",
    "ROLE_INDEXES",
    "ROWS_ENV",
    "SCHEMA_VERSION",
    "SMALL_LOAD",
    "STASH_LEVEL",
    "WAL_KEPT_BYTES",
    "WAL_PAGES",
    "TOP",
    "Layering",
    "Layers",
    "Loaded",
    "ProjectionGap",
    "Steps",
    "Store",
    "gather_statistics",
    "node_from_row",
]
