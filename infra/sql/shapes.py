"""Every statement by name, with the roles that run it, and each dynamic one in each of its
forms: what tests/integration/test_query_plans.py explains (see ``infra.sql``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from infra.sql import blobs, controls, layers, merges, revisions, schema, workspaces


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
    "SCHEMA_OF": (schema.SCHEMA_OF, BOTH),
    "SET_SCHEMA": (schema.SET_SCHEMA, BOTH),
    "META": (schema.META, BOTH),
    "SET_META": (schema.SET_META, BOTH),
    "RAISE_META": (schema.RAISE_META, WRITER),
    "POSITION": (schema.POSITION, BOTH),
    "SET_POSITION": (schema.SET_POSITION, READER),
    "TOP_ID": (schema.TOP_ID, BOTH),
    "NEWEST_SEQ": (schema.NEWEST_SEQ, BOTH),
    "WORKSPACE_BY_NAME": (workspaces.WORKSPACE_BY_NAME, BOTH),
    "WORKSPACE_BY_ID": (workspaces.WORKSPACE_BY_ID, WRITER),
    "IS_NEWEST": (workspaces.IS_NEWEST, BOTH),
    "TOTALS_LIVE": (workspaces.TOTALS_LIVE, READER),
    "TOTALS_SINCE": (workspaces.TOTALS_SINCE, READER),
    "NEW_WORKSPACE": (workspaces.NEW_WORKSPACE, BOTH),
    "CLOSE_LIVE": (workspaces.CLOSE_LIVE, BOTH),
    "INSERT_REVISION": (workspaces.INSERT_REVISION, BOTH),
    "INSERT_EVENT": (workspaces.INSERT_EVENT, BOTH),
    "UPSERT_BLOB": (workspaces.UPSERT_BLOB, BOTH),
    "INSERT_CONTROL": (workspaces.INSERT_CONTROL, BOTH),
    "SET_HEAD": (workspaces.SET_HEAD, BOTH),
    "CLEAR_UNCOMMITTED": (workspaces.CLEAR_UNCOMMITTED, BOTH),
    "DROP_UNCOMMITTED": (workspaces.DROP_UNCOMMITTED, BOTH),
    "SET_UNCOMMITTED": (workspaces.SET_UNCOMMITTED, BOTH),
    **{f"DELETE_ROWS {t}": (workspaces.DELETE_ROWS[t], BOTH) for t in workspaces.HISTORY_TABLES},
    "DELETE_WORKSPACE": (workspaces.DELETE_WORKSPACE, BOTH),
    "CONTENTS_OF": (workspaces.CONTENTS_OF, BOTH),
    "CONTENTS_KEPT": (workspaces.CONTENTS_KEPT, BOTH),
    "INDEXED_CONTENTS": (workspaces.INDEXED_CONTENTS, READER),
    "UNINDEX": (workspaces.UNINDEX, READER),
    "DELETE_BLOBS": (workspaces.DELETE_BLOBS, BOTH),
    "REPLACE_WORKSPACE": (workspaces.REPLACE_WORKSPACE, BOTH),
    "SET_COMPACTED": (workspaces.SET_COMPACTED, BOTH),
    "KNOWN_BLOB": (workspaces.KNOWN_BLOB, BOTH),
    "ALL_REVISIONS": (workspaces.ALL_REVISIONS, WRITER),
    "ALL_EVENTS": (workspaces.ALL_EVENTS, WRITER),
    "COUNT_EVENTS": (workspaces.COUNT_EVENTS, WRITER),
    "ALL_CONTROLS": (workspaces.ALL_CONTROLS, WRITER),
    "ALL_UNCOMMITTED": (workspaces.ALL_UNCOMMITTED, BOTH),
    "REVISION_COUNTS": (workspaces.REVISION_COUNTS, WRITER),
    "PUT_BLOB": (blobs.PUT_BLOB, BOTH),
    "UNINDEXED": (blobs.UNINDEXED, READER),
    "REMOTE_UNINDEXED": (blobs.REMOTE_UNINDEXED, READER),
    "UNREACHABLE": (blobs.UNREACHABLE, READER),
    "INDEXED_WITHOUT_CONTENT": (blobs.INDEXED_WITHOUT_CONTENT, READER),
    "INDEXED_REMOTE": (blobs.INDEXED_REMOTE, READER),
    "IS_UNINDEXED": (blobs.IS_UNINDEXED, READER),
    "INDEX_CONTENT": (blobs.INDEX_CONTENT, READER),
    "MARK_INDEXED": (blobs.MARK_INDEXED, READER),
    "BLOB": (blobs.BLOB, BOTH),
    "CANDIDATES": (blobs.CANDIDATES, READER),
    "LIVE_TREE": (revisions.LIVE_TREE, WRITER),
    "PATH_HISTORIES": (revisions.PATH_HISTORIES, WRITER),
    "CHANGED_BELOW": (revisions.CHANGED_BELOW, WRITER),
    "SMALL_PROBE": (revisions.SMALL_PROBE, WRITER),
    "LIVE_CONTROLS": (revisions.LIVE_CONTROLS, WRITER),
    "UNCOMMITTED_OF": (revisions.UNCOMMITTED_OF, WRITER),
    "RECENT_RESULTS": (revisions.RECENT_RESULTS, WRITER),
    "RESULTS_OF": (revisions.RESULTS_OF, WRITER),
    "NODE": (revisions.NODE, READER),
    "NODE_WITH_DATA": (revisions.NODE_WITH_DATA, READER),
    "TOTALS_AT": (revisions.TOTALS_AT, READER),
    "PATH_HISTORY": (revisions.PATH_HISTORY, READER),
    "EVENTS": (revisions.EVENTS, READER),
    "EVENTS_DESC": (revisions.EVENTS_DESC, READER),
    "PINNED": (controls.PINNED, READER),
    "SEED_STAT": (schema.SEED_STAT, BOTH),
    "FORK_OF": (layers.FORK_OF, BOTH),
    "TOUCHED": (layers.TOUCHED, BOTH),
    "LAYER_ROWS": (layers.LAYER_ROWS, BOTH),
    "INSERT_WHITEOUT": (layers.INSERT_WHITEOUT, BOTH),
    "LAYER_HISTORIES": (layers.LAYER_HISTORIES, WRITER),
    "FORKS_OF": (layers.FORKS_OF, BOTH),
    "LAYER_LIVE_PAGE": (layers.LAYER_LIVE_PAGE, READER),
    "LAYER_ENDED": (layers.LAYER_ENDED, READER),
    "LAYER_CHILDREN": (layers.LAYER_CHILDREN, READER),
    "LAYER_HOLDING": (layers.LAYER_HOLDING, READER),
    "DECIDED": (layers.DECIDED, READER),
    "LAYER_OWN": (layers.LAYER_OWN, READER),
    "LAYER_SHOWN": (layers.LAYER_SHOWN, READER),
    "EVENT_AT": (layers.EVENT_AT, WRITER),
    "TRUST_NOW": (layers.TRUST_NOW, WRITER),
    "EVENTS_CHANGED": (merges.EVENTS_CHANGED, BOTH),
    "ENDED_IN": (merges.ENDED_IN, BOTH),
    "LAST_MERGE": (merges.LAST_MERGE, WRITER),
}
"""The statements without variants, by name, with the roles that run them."""


def shapes() -> Iterator[Shape]:
    """Every statement the projections run, each dynamic one in each of its forms (for
    tests/integration/test_query_plans.py: nothing planned goes unexplained)."""
    for name, (sql, roles) in FIXED.items():
        yield Shape(name, sql, _nulls(sql), roles)
    yield Shape("WORKSPACE_PAGE", workspaces.WORKSPACE_PAGE.format(prefix=""), (None,) * 3, READER)
    text = workspaces.WORKSPACE_PAGE.format(prefix=workspaces.WORKSPACE_PREFIX)
    yield Shape("WORKSPACE_PAGE prefix", text, (None,) * 5, READER)
    for n in (1, 3):
        for name, sql, roles in (
            ("UNCOMMITTED_AT", revisions.UNCOMMITTED_AT, BOTH),
            ("CONTENTS", blobs.CONTENTS, READER),
            ("CONTROL_EVENTS", controls.CONTROL_EVENTS, READER),
        ):
            text = sql.format(marks=schema.marks(n))
            yield Shape(f"{name} x{n}", text, (None,) * (n + (name != "CONTENTS")), roles)
        text, args = controls.last_control(1, ("a",) * n)
        yield Shape(f"LAST_CONTROL x{n}", text, tuple(args), READER)
    for kind in (None, "f"):
        for after, older in ((None, False), (("m", "p"), False), (("m", "p"), True)):
            text, args = revisions.recent(1, 1, kind, after, older, 10)
            yield Shape(f"RECENT {kind=} {after=} {older=}", text, tuple(args), READER)
            if kind is None:
                text, args = layers.layer_recent(1, 1, after, older, 10)
                yield Shape(f"LAYER_RECENT {after=} {older=}", text, tuple(args), READER)
    for kind in (None, "f"):
        text, args = layers.layer_count(1, 1, "d/", "d0", kind)
        yield Shape(f"LAYER_COUNT {kind=}", text, tuple(args), READER)
    for upper in (None, "d0"):
        text, args = revisions.entries_page(1, 1, "d/", upper, 10)
        yield Shape(f"ENTRIES_PAGE {upper=}", text, tuple(args), READER)
    for scope in ("", "d"):
        for n in (1, 3):
            text, args = revisions.files_holding(1, 1, scope, ["a"] * n)
            yield Shape(f"FILES_HOLDING {scope=} x{n}", text, tuple(args), READER)
    for newest in (True, False):
        form = "live" if newest else "at"
        for scope in ("", "d"):
            for with_scope in (False, True):
                text, args = revisions.entries(1, 1, scope, with_scope, newest)
                label = f"ENTRIES {form} {scope=} {with_scope=}"
                yield Shape(label, text, tuple(args), BOTH)
            for shas in (None, ["a"] * 3, ["a"] * (revisions.FILES_LISTED_MAX + 1)):
                text, args = revisions.files(1, 1, scope, shas, newest)
                label = f"FILES {form} {scope=} {len(shas) if shas else None} shas"
                yield Shape(label, text, tuple(args), READER)
        for recursive in (False, True):
            for directory in ("", "d"):
                for kind in (None, "f"):
                    for prefix in ("", "p"):
                        index, where, args = revisions.listing(
                            1, 1, directory, recursive, kind, prefix, newest
                        )
                        label = f"{form} {recursive=} {directory=} {kind=} {prefix=}"
                        text = revisions.COUNT.format(index=index, where=where)
                        yield Shape(f"COUNT {label}", text, tuple(args), READER)
                        for after in (None, ("f", "x")):
                            text, more = revisions.page(index, where, args, recursive, after, 10)
                            yield Shape(f"PAGE {label} {after=}", text, tuple(more), READER)


def _nulls(sql: str) -> tuple[Any, ...]:
    """As many NULL arguments as ``sql`` takes (plans do not depend on the values: SQLite
    is built without STAT4 here, and a test says so)."""
    numbered = [int(n) for n in re.findall(r"\?(\d+)", sql)]
    return (None,) * (max(numbered) if numbered else sql.count("?"))
