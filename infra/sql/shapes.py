"""Every statement by name, with the roles that run it, and each dynamic one in each of its
forms: what tests/integration/test_query_plans.py explains (see ``infra.sql``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from infra.sql.blobs import (
    BLOB,
    CANDIDATES,
    CONTENTS,
    INDEX_CONTENT,
    INDEXED_REMOTE,
    INDEXED_WITHOUT_CONTENT,
    IS_UNINDEXED,
    MARK_INDEXED,
    PUT_BLOB,
    REMOTE_UNINDEXED,
    UNINDEXED,
    UNREACHABLE,
)
from infra.sql.controls import CONTROL_EVENTS, PINNED, last_control
from infra.sql.revisions import (
    CHANGED_BELOW,
    COUNT,
    EVENTS,
    EVENTS_DESC,
    FILES_LISTED_MAX,
    LIVE_CONTROLS,
    LIVE_TREE,
    NODE,
    NODE_WITH_DATA,
    PATH_HISTORIES,
    PATH_HISTORY,
    RECENT_RESULTS,
    RESULTS_OF,
    SMALL_PROBE,
    TOTALS_AT,
    UNCOMMITTED_AT,
    UNCOMMITTED_OF,
    entries,
    entries_page,
    files,
    files_holding,
    listing,
    page,
    recent,
)
from infra.sql.schema import (
    META,
    NEWEST_SEQ,
    POSITION,
    RAISE_META,
    SCHEMA_OF,
    SEED_STAT,
    SET_META,
    SET_POSITION,
    SET_SCHEMA,
    TOP_ID,
    marks,
)
from infra.sql.workspaces import (
    ALL_CONTROLS,
    ALL_EVENTS,
    ALL_REVISIONS,
    ALL_UNCOMMITTED,
    CLEAR_UNCOMMITTED,
    CLOSE_LIVE,
    CONTENTS_KEPT,
    CONTENTS_OF,
    COUNT_EVENTS,
    DELETE_BLOBS,
    DELETE_ROWS,
    DELETE_WORKSPACE,
    DROP_UNCOMMITTED,
    HISTORY_TABLES,
    INDEXED_CONTENTS,
    INSERT_CONTROL,
    INSERT_EVENT,
    INSERT_REVISION,
    IS_NEWEST,
    KNOWN_BLOB,
    NEW_WORKSPACE,
    REPLACE_WORKSPACE,
    REVISION_COUNTS,
    SET_COMPACTED,
    SET_HEAD,
    SET_UNCOMMITTED,
    TOTALS_LIVE,
    UNINDEX,
    UPSERT_BLOB,
    WORKSPACE_BY_ID,
    WORKSPACE_BY_NAME,
    WORKSPACE_PAGE,
    WORKSPACE_PREFIX,
)


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
