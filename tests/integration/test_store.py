"""The SQLite projection: apply a log, answer as of any version, load the writer's state."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from contracts import hashing
from contracts import requests as rq
from core.evolve import WorkspaceState
from infra import sql
from infra.store import SMALL_LOAD, WAL_KEPT_BYTES, WAL_PAGES, Store
from services.reader.readmodel import ReadModel, Scope
from tests.helpers import LogBuilder


def build() -> LogBuilder:
    b = LogBuilder()
    b.run(rq.CreateWorkspace(), "create")  # v1
    b.run(rq.WriteFile(path="a/b.txt", content="one"))  # v2
    b.run(rq.WriteFile(path="a/b.txt", content="two"))  # v3
    b.run(rq.WriteFile(path="a/c/d.bin", data=b"\x00\x01"))  # v4
    b.run(rq.MovePath(path="a/c", to="z"), "move")  # v5
    b.run(rq.DeletePath(path="a", recursive=True), "delete")  # v6
    b.run(rq.WriteFile(path="a/b.txt", content="three"))  # v7
    return b


async def test_apply_and_read_as_of_versions(tmp_path: Path) -> None:
    b = build()
    store = await Store.open(tmp_path / "p.db")
    try:
        # apply in two batches, the second overlapping the first (idempotent)
        await store.apply(b.log[:4], tracking="t")
        await store.apply(b.log[2:], tracking="t")
        assert await store.position("t") == 7
        ws = store.workspace_id("acme", "demo")
        model = ReadModel(store)
        assert ws is not None and store.version_of("acme", "demo") == 7

        async def text(path: str, version: int) -> str | None:
            found = await model.node_with_data(ws, path, version)
            return None if found is None else (found[1] or b"").decode()

        assert await text("a/b.txt", 1) is None
        assert await text("a/b.txt", 2) == "one"
        assert await text("a/b.txt", 5) == "two"
        assert await text("a/b.txt", 6) is None  # deleted with its directory
        assert await text("a/b.txt", 7) == "three"
        assert await text("z/d.bin", 4) is None and await text("z/d.bin", 5) == "\x00\x01"
        node = await model.node(ws, "a/b.txt", 7)
        assert node is not None and node.file_version == 3  # survives delete/recreate
        moved = await model.node(ws, "z/d.bin", 7)
        assert moved is not None and moved.moved_from == "a/c/d.bin" and moved.binary

        assert [n.path for n in await model.page(ws, 4, Scope(""), None, 100)] == ["a"]
        assert [n.path for n in await model.page(ws, 4, Scope("a"), None, 100)] == [
            "a/c",
            "a/b.txt",
        ]
        assert [n.path for n in await model.page(ws, 5, Scope(""), None, 100)] == ["a", "z"]
        assert await model.count(ws, 6, Scope("a")) == 0
        assert await model.totals(ws, 4) == (2, 2, 5)
        assert await model.totals(ws, 7) == (2, 2, 7)

        history = await model.path_history(ws, "a/b.txt", 7, 10)
        assert [h[0].version for h in history] == [7, 3, 2]
        assert history[1][2] is not None and history[1][2][1] == "delete"
    finally:
        await store.close()
    writer = await Store.open(tmp_path / "w.db", role="writer")  # a writer's looks ids up
    try:
        await writer.apply(b.log)
        ws = writer.workspace_id("acme", "demo")
        assert ws is not None
        found = writer.results_of(ws, ["req-7", "req-8"])
        assert list(found) == ["req-7"] and found["req-7"][0] == 7
        held = writer.results_of(ws, [f"req-{n}" for n in range(40)])
        assert {k: v[0] for k, v in held.items()} == {f"req-{n}": n for n in range(1, 8)}
    finally:
        await writer.close()


async def knows_as_the_fold(store: Store, state: WorkspaceState, folded: WorkspaceState) -> bool:
    """Whether ``state`` (loaded: its live paths' history) and what the store says of every
    other path (``histories``, as the writer looks it up) make what the fold of the log
    knows of every path's history."""
    tree = state.tree
    live = {p: tree.last_fv[p] for p in tree.files}
    if live != {p: v for p, v in folded.tree.last_fv.items() if p in tree.files}:
        return False
    ws = store.workspace_id(state.tenant, state.workspace)
    assert ws is not None
    every = set(folded.tree.last_fv) | set(folded.tree.changed)
    unknown = sorted(p for p in every if not tree.knows(p))
    for path, (fv, changed) in (await store.histories(ws, unknown)).items():
        tree.learn(path, fv, changed)
    return tree.last_fv == folded.tree.last_fv and tree.changed == folded.tree.changed


async def test_writer_state_loads_identical_to_the_fold(tmp_path: Path) -> None:
    """The writer's load: the live tree (``Tree.partial``), the rest of every path's
    history looked up as a decision needs it; together what the fold of the log makes."""
    b = build()
    store = await Store.open(tmp_path / "p.db", role="writer")
    try:
        await store.apply(b.log)
        loaded = await store.load_state("acme", "demo")
        folded = b.replay()
        assert loaded.version == folded.version == 7
        assert loaded.tree.hash == folded.tree.hash == b.state.tree.hash
        assert hashing.tree_hex(loaded.tree.hash) == b.log[-1].event.tree_hash
        assert loaded.tree.files == folded.tree.files
        assert loaded.tree.partial and not loaded.tree.knows("a/c/d.bin")  # moved away
        assert await knows_as_the_fold(store, loaded, folded)
        assert loaded.last_hash == b.log[-1].hash and loaded.last_seq == 7
    finally:
        await store.close()


async def test_small_and_large_workspaces_load_alike_with_their_recent_results(
    tmp_path: Path,
) -> None:
    """A workspace over ``SMALL_LOAD`` is read on the loading thread, a small one on the
    event loop's: both load what the fold of their log makes, and their last results."""
    small, large = build(), LogBuilder(workspace="large")
    large.run(rq.CreateWorkspace(), "create")
    for n in range(SMALL_LOAD + 6):
        large.run(rq.WriteFile(path=f"d{n % 7}/f{n}.txt", content=f"{n}"))
    large.run(rq.DeletePath(path="d3", recursive=True), "delete")
    store = await Store.open(tmp_path / "p.db", role="writer")
    try:
        await store.apply(small.log + [*large.log])
        loaded = {name: await store.load("acme", name, recent=5) for name in ("demo", "large")}
        for name, b in (("demo", small), ("large", large)):
            state, recent = loaded[name]
            folded = b.replay()
            assert state.version == folded.version == b.log[-1].event.version
            assert state.tree.hash == folded.tree.hash
            assert state.tree.files == folded.tree.files
            assert await knows_as_the_fold(store, state, folded)
            assert [v for _, v, _ in recent] == [item.event.version for item in b.log[-5:]]
    finally:
        await store.close()
    assert loaded["large"].state.version > SMALL_LOAD >= loaded["demo"].state.version


async def test_the_newest_event_held_is_kept_by_a_writer_and_scanned_otherwise(
    tmp_path: Path,
) -> None:
    """``high_water`` (what a writer's start compares with the log): a writer keeps it as it
    applies (its start reads one row at any number of workspaces), a projection without it
    (a reader's, or one made before) finds it among its workspaces' rows."""
    b = build()
    writer = await Store.open(tmp_path / "w.db", role="writer")
    reader = await Store.open(tmp_path / "r.db", role="reader")
    try:
        assert await writer.high_water() == 0 == await reader.high_water()
        await writer.apply(b.log[:5])
        await reader.apply(b.log[:5], tracking="t")
        await writer.apply(b.log[2:4])  # applied already: it stays at 5
        assert await writer.get_meta("high_water") == "5" and await writer.high_water() == 5
        assert await reader.get_meta("high_water") is None and await reader.high_water() == 5
        await writer.apply(b.log[5:])
        assert await writer.high_water() == 7
    finally:
        await writer.close()
        await reader.close()


async def test_reopen_resumes(tmp_path: Path) -> None:
    b = build()
    store = await Store.open(tmp_path / "p.db")
    await store.apply(b.log[:3], tracking="t")
    await store.close()
    store = await Store.open(tmp_path / "p.db")
    try:
        assert await store.position("t") == 3 and store.version_of("acme", "demo") == 3
        await store.apply(b.log, tracking="t")
        assert store.version_of("acme", "demo") == 7
    finally:
        await store.close()


def _wal_bytes(store: Store) -> int:
    wal = Path(f"{store.path}-wal")
    return wal.stat().st_size if wal.exists() else 0


async def test_a_bulk_of_applies_checkpoints_once_at_its_end(tmp_path: Path) -> None:
    """A replica catching up applies in bulk: its commits leave the WAL to grow past the
    ordinary checkpoint (a third of a catch-up's time, issue 17), and the end of the bulk
    moves it into the database once, giving back what the WAL took beyond WAL_KEPT_BYTES."""
    b = LogBuilder()
    b.run(rq.CreateWorkspace(), "create")
    for n in range(2000):  # 80 MB of contents: twice the pages the WAL holds before a checkpoint
        b.run(rq.WriteFile(path=f"f{n % 7}.txt", content=f"{n:08d}" * 5000))
    ordinary = WAL_PAGES * 4096
    plain = await Store.open(tmp_path / "plain.db")
    bulk = await Store.open(tmp_path / "bulk.db")
    try:
        await bulk.bulk(True)
        for start in range(0, len(b.log), 100):
            await plain.apply(b.log[start : start + 100], tracking="t")
            await bulk.apply(b.log[start : start + 100], tracking="t")
        assert _wal_bytes(plain) < ordinary + 10 * 2**20  # checkpointed as it went
        assert _wal_bytes(bulk) > ordinary + 10 * 2**20  # not: the WAL holds it all
        await bulk.bulk(False)
        await bulk.checkpointed()
        await bulk.apply(b.log, tracking="t")  # the next transaction starts the WAL over
        assert _wal_bytes(bulk) <= WAL_KEPT_BYTES
        assert bulk.version_of("acme", "demo") == plain.version_of("acme", "demo") == 2001
        model = ReadModel(bulk)
        ws = bulk.workspace_id("acme", "demo")
        assert ws is not None
        found = await model.node_with_data(ws, "f1.txt", 2001)
        assert found is not None and found[1] == (f"{1996:08d}" * 5000).encode()
    finally:
        await plain.close()
        await bulk.close()


def _stats(path: Path) -> dict[str, str]:
    db = sqlite3.connect(path)
    try:
        return {str(idx): str(stat) for _, idx, stat in db.execute("SELECT * FROM sqlite_stat1")}
    finally:
        db.close()


async def test_statistics_are_seeded_then_gathered_as_the_projection_doubles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh projection plans with the seeded statistics of a large one; it gathers its
    own (``ANALYZE``) once it has applied ``STATS_EVERY`` events, then each time it doubles,
    and remembers where (``stats_at``) across a restart."""
    monkeypatch.setattr(sql, "STATS_EVERY", 40)
    b = LogBuilder()
    b.run(rq.CreateWorkspace(), "create")
    for n in range(199):
        b.run(rq.WriteFile(path=f"d{n % 5}/f{n % 20}.txt", content=f"{n}"))
    path = tmp_path / "w.db"
    store = await Store.open(path, role="writer")
    try:
        seeded = dict((idx, stat) for _, idx, stat in sql.SEEDED_STATS)
        assert _stats(path)["revisions_live"] == seeded["revisions_live"]
        assert "controls_run" not in _stats(path)  # a reader's index: none here
        await store.apply(b.log[:39])
        assert await store.get_meta(sql.STATS_AT) is None
        await store.apply(b.log[39:45])  # position 45: 40 since none
        assert await store.get_meta(sql.STATS_AT) == "45"
        gathered = _stats(path)
        assert gathered["events"] != seeded["events"]  # this projection's own
        assert gathered["controls"] == seeded["controls"]  # empty: seeded again
        await store.apply(b.log[45:85])  # 85 < 2 x 45
        assert await store.get_meta(sql.STATS_AT) == "45"
    finally:
        await store.close()
    store = await Store.open(path, role="writer")
    try:
        await store.apply(b.log[85:95])  # 95 >= 2 x 45 and 45 + 40
        assert await store.get_meta(sql.STATS_AT) == "95"
    finally:
        await store.close()


def _contents_kept_plan(path: Path) -> list[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("EXPLAIN QUERY PLAN " + sql.CONTENTS_KEPT, ('["x"]',)).fetchall()
        return [str(r[3]) for r in rows]
    finally:
        db.close()


@pytest.mark.parametrize("role", ["writer", "reader"])
async def test_a_purge_seeks_the_contents_it_may_keep(tmp_path: Path, role: str) -> None:
    """Which of a purged workspace's contents another workspace still holds is a seek per
    content (``revisions_sha``), not a scan of every revision of the projection (issue 33: a
    fork of 3 files cost a scan of its 100,000-file source); a projection made before the
    index gets it when opened; and the answer is right."""
    b = build()
    other = LogBuilder(workspace="other")
    other.run(rq.CreateWorkspace(), "create")
    other.run(rq.WriteFile(path="same.txt", content="three"))
    path = tmp_path / f"{role}.db"
    store = await Store.open(path, role=role)
    try:
        await store.apply(b.log)
        await store.apply([type(i)(i.event, i.hash, i.seq + len(b.log)) for i in other.log])
    finally:
        await store.close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"DROP INDEX {sql.SHA_INDEX}")  # as a projection made before issue 33's
    db.close()
    store = await Store.open(path, role=role)
    try:
        lines = _contents_kept_plan(path)
        assert any(f"INDEX {sql.SHA_INDEX} (<expr>=?)" in line for line in lines), lines
        assert not any(line.startswith("SCAN revisions") for line in lines), lines
        shas = [hashing.content_sha256(c) for c in (b"one", b"three", b"nowhere")]
        kept = await store.reads.execute_fetchall(sql.CONTENTS_KEPT, (json.dumps(shas),))
        assert sorted(str(r[0]) for r in kept) == sorted(shas[:2])
    finally:
        await store.close()
