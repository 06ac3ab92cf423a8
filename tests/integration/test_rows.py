"""The projection's workspace rows are a bounded cache (issue 17): opening reads none of them,
at most ``max_rows`` are held, and a row not held is read from SQLite when asked for, so every
workspace answers as it would with all of them in memory (real SQLite; real services)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from core.plan import Committed
from infra.store import ProjectionGap, Store
from quill.client import Quill
from services.writer.config import WriterConfig
from tests.core.build import LogBuilder
from tests.helpers import eventually, start_reader, start_writer

NAMES = [f"w{n:02d}" for n in range(12)]


def logs() -> list[LogBuilder]:
    """A log per workspace of ``NAMES``: workspace ``n`` has ``n + 2`` versions, its own
    ``max_files`` limit, and every third restricted."""
    out = []
    for n, name in enumerate(NAMES):
        b = LogBuilder("acme", name)
        b.run(
            rq.CreateWorkspace(
                trust="restricted" if n % 3 == 0 else "full",
                limits=LimitsPatch(max_files=100 + n),
            ),
            "create",
        )
        for k in range(n + 1):
            b.run(rq.WriteFile(path="f.txt", content=f"{name} {k}"))
        out.append(b)
    return out


def interleaved(builders: list[LogBuilder]) -> list[Committed]:
    """Every workspace's events, round robin, numbered as one log."""
    out: list[Committed] = []
    for step in range(max(len(b.log) for b in builders)):
        for b in builders:
            if step < len(b.log):
                item = b.log[step]
                out.append(Committed(item.event, item.hash, len(out) + 1))
    return out


async def test_open_loads_no_row_and_a_small_budget_answers_every_workspace(
    tmp_path: Path,
) -> None:
    builders = logs()
    log = interleaved(builders)
    store = await Store.open(tmp_path / "p.db", role="writer", max_rows=3)
    try:
        # one batch over more workspaces than the budget: each one's row before it is read
        # from SQLite or held, and what it leaves is right
        await store.apply(log[:30])
        assert store.rows_held <= 3
        await store.apply(log[30:])
        assert store.rows_held <= 3
        for n, name in enumerate(NAMES):
            row = store.workspace("acme", name)
            assert row is not None and row.version == n + 2, name
            assert row.limits.max_files == 100 + n
            assert row.trust == ("restricted" if n % 3 == 0 else "full")
            assert row.last_hash == builders[n].log[-1].hash
            assert store.version_of("acme", name) == n + 2
            assert store.rows_held <= 3
        ids = {store.workspace_id("acme", name) for name in NAMES}
        assert len(ids) == len(NAMES) and None not in ids
        assert store.workspace("acme", "nobody") is None and store.version_of("acme", "x") == 0
    finally:
        await store.close()

    again = await Store.open(tmp_path / "p.db", role="writer", max_rows=3)
    try:
        assert (again.rows_loaded, again.rows_held) == (0, 0)  # opening reads no row
        assert again.version_of("acme", NAMES[5]) == 7
        assert (again.rows_loaded, again.rows_held) == (1, 1)
        # a workspace not held: its writer state, its compaction, applying again (idempotent)
        state = await again.load_state("acme", NAMES[7])
        assert state.version == 9 and state.limits.max_files == 107
        ws = again.workspace_id("acme", NAMES[7])
        assert ws is not None
        for name in NAMES:
            again.workspace("acme", name)  # NAMES[7] out of memory
        manifest, dropped, _ = await again.compaction(ws, 1)
        assert manifest.limits.max_files == 107 and dropped == 7  # 8 writes of f.txt
        assert await again.apply(log) is None  # every event known: nothing done
        # the next workspace's id follows the largest, though no row was read at open
        assert await again.apply([_created("acme", "new", seq=len(log) + 1)]) is not None
        assert again.workspace_id("acme", "new") == max(i for i in ids if i is not None) + 1
    finally:
        await again.close()


def _created(tenant: str, name: str, seq: int) -> Committed:
    b = LogBuilder(tenant, name)
    b.run(rq.CreateWorkspace(), "create")
    return Committed(b.log[0].event, b.log[0].hash, seq)


async def test_unknown_names_hold_nothing(tmp_path: Path) -> None:
    """A client asking for workspaces that do not exist (hostile names included) costs a
    lookup each and fills no memory."""
    store = await Store.open(tmp_path / "p.db", max_rows=2)
    try:
        await store.apply(logs()[0].log)
        for n in range(1000):
            name = f"nope-{n}" if n % 3 else f"x' OR 1=1; --{n}\u0000{'z' * 300}"
            assert store.workspace("acme", name) is None
            assert store.version_of(name, "w00") == 0
        assert store.rows_held == 1 and store.rows_loaded == 0  # w00, from its apply
    finally:
        await store.close()


async def test_budget_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_rows"):
        await Store.open(tmp_path / "p.db", max_rows=0)


async def test_a_gap_is_found_for_a_workspace_not_held(tmp_path: Path) -> None:
    """The version an event follows is the projection's, held or not."""
    builders = logs()
    store = await Store.open(tmp_path / "p.db", max_rows=1)
    try:
        await store.apply(interleaved(builders), tracking="t")
        store.workspace("acme", NAMES[0])  # NAMES[3] not held
        skipped = builders[3].log[-1]
        b = builders[3]
        b.run(rq.WriteFile(path="g.txt", content="one"))
        b.run(rq.WriteFile(path="g.txt", content="two"))
        with pytest.raises(ProjectionGap):
            await store.apply([Committed(b.log[-1].event, b.log[-1].hash, 999)], tracking="t")
        assert store.version_of("acme", NAMES[3]) == skipped.event.version
    finally:
        await store.close()


async def test_services_with_a_budget_smaller_than_the_workspaces(
    nats_url: str, tmp_path: Path
) -> None:
    """A writer and a reader holding 3 rows (and the writer 2 workspaces) serve 12: versions,
    limits, trust, archive and lock state, listing, writes, purge and create again."""
    async with AsyncExitStack() as stack:
        writer = await start_writer(
            stack, nats_url, tmp_path / "writer", WriterConfig(max_workspaces=2), projection_rows=3
        )
        reader = await start_reader(stack, nats_url, tmp_path / "reader", "r", projection_rows=3)
        client = await Quill.connect(nats_url, actor="tester", timeout=10)
        stack.push_async_callback(client.close)
        spaces = {name: client.workspace(f"rows/{name}") for name in NAMES}
        for n, name in enumerate(NAMES):
            await spaces[name].create(limits=LimitsPatch(max_files=100 + n))
            for k in range(n % 4 + 1):
                await spaces[name].write("f.txt", f"{name} {k}\n")
        await spaces[NAMES[1]].archive()
        await client.as_actor("ann", session="s-1").workspace(f"rows/{NAMES[2]}").lock()
        versions = [n % 4 + 2 + (1 if n in (1, 2) else 0) for n in range(len(NAMES))]
        # every workspace again, in another order: each row read again on both sides
        for n, name in reversed(list(enumerate(NAMES))):
            assert await reader.follower.wait_for("rows", name, versions[n], 10)
            info = await spaces[name].info()
            assert (info.version, info.limits.max_files) == (versions[n], 100 + n), name
            assert (await spaces[name].read_text("f.txt")).endswith(f"{name} {n % 4}\n")
        with pytest.raises(QuillError) as refused:
            await spaces[NAMES[1]].write("g.txt", "no\n")
        assert refused.value.code == ErrorCode.WORKSPACE_ARCHIVED
        listed = {s.workspace: s async for s in client.all_workspaces("rows", page=5)}
        assert sorted(listed) == NAMES
        assert [listed[name].version for name in NAMES] == versions
        assert listed[NAMES[1]].archived and not listed[NAMES[0]].archived
        assert listed[NAMES[2]].lock_holder == "s-1" and listed[NAMES[3]].lock_holder is None
        # a write to a workspace neither its actor nor its row is held for
        cold = spaces[NAMES[4]]
        await cold.write("f.txt", "again\n")
        assert cold.last_version == versions[4] + 1
        assert (await cold.info()).version == versions[4] + 1
        # purged and created again while not held: a new workspace at version 1
        gone = spaces[NAMES[6]]
        await gone.purge()
        for name in NAMES:
            if name != NAMES[6]:
                await spaces[name].info()
        await eventually(lambda: reader.store.workspace("rows", NAMES[6]) is None)  # applied
        again = client.workspace(f"rows/{NAMES[6]}")
        with pytest.raises(QuillError) as missing:
            await again.info()
        assert missing.value.code == ErrorCode.WORKSPACE_NOT_FOUND
        await again.create()
        info = await again.info()
        assert info.version == 1 and info.limits.max_files != 106
        assert writer.store.rows_held <= 3 and writer.store.rows_loaded >= 3  # cold ones read
        assert reader.store.rows_held <= 3 and reader.store.rows_loaded > len(NAMES)
