"""What a projection's query plan may do (issue 29): the rules the plan tests apply to every
statement ``infra/sql/`` lists (test_query_plans.py) and to every statement the services
ran (test_rows_touched.py).

A plan reads a workspace's history only where the statement says it means to
(``sql.WHOLE_WORKSPACE``, ``sql.FIRST_ROWS``) and a whole table only where it says so
(``sql.WHOLE_TABLE``). Otherwise:

* no ``SCAN`` of a table (a virtual table's, a subquery's or ``json_each``'s is no table);
* no ``SEARCH`` of a workspace's rows on ``ws`` alone: ``(ws=?)`` is every row it ever had;
* no ``SEARCH`` of ``revisions`` on its primary key without ``path=?``: a range of paths on
  the primary key is every revision of the subtree ever made (the live rows have their own
  index).
"""

from __future__ import annotations

import re
import sqlite3

from infra import sql

_SEARCH = re.compile(r"^SEARCH (\S+) USING (.*?)(?: \((.*)\))?$")
_SCAN = re.compile(r"^SCAN (\S+)(.*)$")


def plan(db: sqlite3.Connection, text: str, args: tuple[object, ...] = ()) -> list[str]:
    """The plan's lines (their detail column)."""
    return [str(r[3]) for r in db.execute("EXPLAIN QUERY PLAN " + text, args).fetchall()]


def faults(text: str, lines: list[str]) -> list[str]:
    """What in ``lines`` (the plan of ``text``) reads more than the statement means to."""
    meant_workspace = sql.WHOLE_WORKSPACE in text or sql.FIRST_ROWS in text
    meant_table = sql.WHOLE_TABLE in text
    found = []
    for line in lines:
        scan = _SCAN.match(line)
        if scan is not None:
            name, rest = scan.groups()
            table = "VIRTUAL TABLE" not in rest and not name.startswith("(")
            if table and not meant_table and name != "CONSTANT":
                found.append(f"{line}: a scan of a whole table")
            continue
        search = _SEARCH.match(line)
        if search is None or meant_workspace or meant_table:
            continue
        name, how, on = search.groups()
        if on == "ws=?":
            found.append(f"{line}: every row of a workspace")
        elif name in ("revisions", "r") and how.endswith("PRIMARY KEY") and "path=?" not in on:
            found.append(f"{line}: every revision of the paths in a range")
    return found


def statements(recorded: list[str]) -> dict[str, str]:
    """The distinct statements of a trace (``Store.count_steps``), one example each, by their
    shape (literals made ``?``): those that are planned (not DDL, pragmas or transaction
    control, nor the trace's notes on triggers, nor what FTS5 runs on its own shadow tables,
    ``'main'.'content_index_config'``: its reads of the index's few configuration rows)."""
    out: dict[str, str] = {}
    for text in recorded:
        head = text.lstrip().split(None, 1)[0].upper() if text.strip() else ""
        if head not in ("SELECT", "INSERT", "UPDATE", "DELETE", "REPLACE", "WITH"):
            continue
        if "'main'.'content_index_" in text:
            continue
        shape = re.sub(r"X?'(?:[^']|'')*'|\b\d+\b", "?", text)
        out.setdefault(shape, text)
    return out
