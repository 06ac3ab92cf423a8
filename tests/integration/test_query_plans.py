"""Query plans are tested, not hoped for (issue 29): every statement of both projections
(``infra/sql/shapes.py: shapes``, each variant of the dynamic ones) is explained against a writer's
and a reader's projection holding many small workspaces and one of thousands of events,
with the statistics a projection can have: none, the seeded ones of a fresh projection,
gathered on the whole (one workspace holds most rows: the averages hide it), and gathered
while it was small. A plan that reads a workspace's history where a seek is meant fails
(tests/integration/plans.py says what may be read). Nothing else holds SQL for a projection."""

from __future__ import annotations

import ast
import asyncio
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts import requests as rq
from infra import sql
from infra.store import Store
from tests.core.build import LogBuilder
from tests.integration.plans import faults, plan

ROOT = Path(__file__).resolve().parents[2]
STATS = ("none", "seeded", "analysed", "analysed-small")


def small(name: str) -> LogBuilder:
    b = LogBuilder(workspace=name)
    b.run(rq.CreateWorkspace(), "create")
    for n in range(3):
        b.run(rq.WriteFile(path=f"d/f{n}.txt", content=f"{name} {n}"))
    return b


def large(events: int) -> LogBuilder:
    """One workspace: 300 paths written round robin, directories made, deleted and moved,
    runs started."""
    b = LogBuilder(workspace="large")
    b.run(rq.CreateWorkspace(), "create")
    n = 0
    while b.state.version < events:
        n += 1
        b.run(rq.WriteFile(path=f"p{n % 30:02}/f{n % 300:03}.txt", content=f"{n}"))
        if n % 97 == 0:
            b.run(rq.DeletePath(path=f"p{n % 30:02}", recursive=True), "delete")
        if n % 89 == 0:
            b.run(rq.RunStart(run=f"run{n}"), "run_start")
        if n % 131 == 0:
            b.run(rq.MovePath(path=f"p{(n + 1) % 30:02}", to=f"moved{n}"), "move")
    return b


async def _build(tmp: Path) -> dict[str, Path]:
    """A writer's and a reader's projection, each the same log: 150 small workspaces, one
    of 3,000 events; and each as it was after the first 20 workspaces (``*-small``)."""
    logs = [small(f"w{n:03}") for n in range(150)] + [large(3000)]
    out: dict[str, Path] = {}
    for role in ("writer", "reader"):
        for label, part in (("small", logs[:20]), ("", logs)):
            path = tmp / f"{role}{'-' + label if label else ''}.db"
            store = await Store.open(path, role=role)
            seq = 0
            for b in part:
                items = []
                for item in b.log:  # one log: each workspace's events after the others'
                    seq += 1
                    items.append(type(item)(item.event, item.hash, seq))
                for i in range(0, len(items), 500):
                    await store.apply(
                        items[i : i + 500], tracking="t" if role == "reader" else None
                    )
            await store.close()
            out[f"{role}-{label}" if label else role] = path
    return out


@pytest.fixture(scope="module")
def projections(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return asyncio.run(_build(tmp_path_factory.mktemp("plans")))


def with_stats(built: dict[str, Path], role: str, stats: str, into: Path) -> Path:
    """A copy of ``role``'s projection with ``stats`` in its ``sqlite_stat1``."""
    path = into / f"{role}-{stats}.db"
    shutil.copy(built[role], path)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("DELETE FROM sqlite_stat1")
        if stats == "seeded":
            db.executemany(sql.SEED_STAT, sql.SEEDED_STATS)
        elif stats == "analysed":
            db.execute("PRAGMA analysis_limit=0")
            db.execute("ANALYZE")
        elif stats == "analysed-small":
            young = sqlite3.connect(built[f"{role}-small"], isolation_level=None)
            young.execute("PRAGMA analysis_limit=0")
            young.execute("ANALYZE")
            rows = young.execute("SELECT tbl, idx, stat FROM sqlite_stat1").fetchall()
            young.close()
            db.executemany("INSERT INTO sqlite_stat1 VALUES(?, ?, ?)", rows)
    finally:
        db.close()
    return path


def cases() -> Iterator[tuple[str, str]]:
    for role in ("writer", "reader"):
        for stats in STATS:
            yield role, stats


@pytest.mark.parametrize(("role", "stats"), list(cases()))
def test_every_statement_seeks_what_it_means_to(
    projections: dict[str, Path], tmp_path: Path, role: str, stats: str
) -> None:
    db = sqlite3.connect(with_stats(projections, role, stats, tmp_path))
    try:
        found = {}
        for shape in sql.shapes():
            if role not in shape.roles:
                continue
            lines = plan(db, shape.sql, shape.args)
            wrong = faults(shape.sql, lines)
            if wrong:
                found[shape.name] = wrong
        assert not found, "\n".join(f"{name}: {wrong}" for name, wrong in found.items())
    finally:
        db.close()


def test_the_large_workspace_holds_most_rows(projections: dict[str, Path]) -> None:
    """The projections are what the plans are tested against: most revisions are one
    workspace's, so statistics averaged over workspaces understate it (the skew that made
    ``(ws=?)`` look like a seek)."""
    db = sqlite3.connect(projections["reader"])
    try:
        ws = db.execute("SELECT id FROM workspaces WHERE name='large'").fetchone()[0]
        (mine,) = db.execute("SELECT count(*) FROM revisions WHERE ws=?", (ws,)).fetchone()
        (total,) = db.execute("SELECT count(*) FROM revisions").fetchone()
        (workspaces,) = db.execute("SELECT count(*) FROM workspaces").fetchone()
    finally:
        db.close()
    assert workspaces == 151 and mine > total / 2 and mine > 3000


def test_plans_do_not_depend_on_the_arguments() -> None:
    """Shapes are explained with NULL arguments: SQLite plans on the values only with
    STAT4, which this build has not (were it on, the plan test would need real values)."""
    options = {r[0] for r in sqlite3.connect(":memory:").execute("PRAGMA compile_options")}
    assert "ENABLE_STAT4" not in options, options


def test_the_rules_catch_what_issue_29_found(projections: dict[str, Path], tmp_path: Path) -> None:
    """The checks themselves: the statements as they were before issue 29 (and a purge's
    before issue 33), planned as they were (no statistics), fail them."""
    writer = sqlite3.connect(with_stats(projections, "writer", "none", tmp_path))
    writer.execute("DROP INDEX revisions_live")  # a writer's indexes before issue 29
    reader = sqlite3.connect(with_stats(projections, "reader", "none", tmp_path))
    reader.execute(f"DROP INDEX {sql.SHA_INDEX}")  # and before issue 33's
    try:
        was = {
            "request id": (
                writer,
                "SELECT version, result FROM events WHERE ws=? AND request_id=? LIMIT 1",
            ),
            "tree at a version": (
                reader,
                "SELECT path FROM revisions WHERE ws=? AND version<=? AND until>? ORDER BY path",
            ),
            "writer's load": (
                writer,
                "SELECT path, max(file_version) FROM revisions WHERE ws=? GROUP BY path",
            ),
            "writer's live tree": (
                writer,
                "SELECT path FROM revisions WHERE ws=? AND until=1 ORDER BY path",
            ),
            "writer's close": (
                writer,
                "UPDATE revisions SET until=? WHERE ws=? AND until=1 AND path>=? AND path<?",
            ),
            # before issue 33's index: a purge's check of which contents others keep, a scan
            # of every revision of the projection (it said so: ``/* plan: table */``)
            "a purge's contents kept": (
                reader,
                "SELECT DISTINCT sha256 FROM revisions WHERE sha256 IN "
                "(SELECT value FROM json_each(?))",
            ),
        }
        for name, (db, text) in was.items():
            args = (None,) * text.count("?")
            assert faults(text, plan(db, text, args)), name
    finally:
        writer.close()
        reader.close()


STATEMENT = re.compile(
    r"^\s*(SELECT\s|INSERT\s+(OR\s+\w+\s+)?INTO\s|UPDATE\s+\w+\s|DELETE\s+FROM\s"
    r"|REPLACE\s+INTO\s|WITH\s+\w+\s+AS\b)"
)
"""The start of a statement SQLite plans."""


def _sql_literals(path: Path) -> list[tuple[int, str]]:
    """String constants in ``path`` that start a planned SQL statement."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if STATEMENT.match(node.value):
                found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and STATEMENT.match(str(first.value)):
                found.append((node.lineno, str(first.value)))
    return found


def test_no_projection_sql_outside_infra_sql() -> None:
    """Every statement run on a projection is in infra/sql/, where ``shapes`` lists it
    for the plan tests: a query written elsewhere would escape them."""
    outside = []
    for package in ("infra", "services", "core"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if (ROOT / "infra" / "sql") in path.parents:
                continue
            outside += [
                f"{path.relative_to(ROOT)}:{n}: {text!r}" for n, text in _sql_literals(path)
            ]
    assert not outside, "\n".join(outside)


def test_every_statement_of_infra_sql_is_explained() -> None:
    """Every statement constant of infra/sql/ is among ``shapes`` (or, a template, starts
    one): a new statement has to be listed to be used."""
    texts = [shape.sql for shape in sql.shapes()]
    missing = []
    for name, value in vars(sql).items():
        if not (name.isupper() and isinstance(value, str)):
            continue
        if not STATEMENT.match(value):
            continue
        head = value.split("{", 1)[0]
        if not any(value in text or ("{" in value and text.startswith(head)) for text in texts):
            missing.append(name)
    assert not missing, missing
