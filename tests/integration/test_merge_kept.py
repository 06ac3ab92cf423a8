"""Merging back and forth reads what changed since the last merge, not since the fork point
(issue 33: "merging again later takes only what changed since the last merge ... the cost of
a merge is O(paths changed on either side)"), through the real path (nats-server, a writer,
a reader, the SDK).

A merge records where the target differs from the version it took (``MergedFrom.kept``:
kept its own, merged line by line, markers, a conflict decided for ours); a merge the other
way reads those paths instead of every path either side changed since the fork point. Each
merge here is checked three ways: its dry run with that record ignored (what the writer read
before it existed, and still reads for a merge recorded without it) answers the same; the
merge answers the same as its dry run; and the target after it is the three-way merge of the
two whole trees against the last merge's base (the version of the other side it took),
computed here by walking them (``core.merge.plan`` over every path, ``tests.core.merging``).
The cost: ``quill_writer_merge_paths`` counts the paths a merge reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import msgspec
import prometheus_client
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from contracts.errors import ErrorCode, QuillError
from contracts.events import ChangesCommitted, WorkspaceEvent
from contracts.merging import Strategy
from contracts.replies import Merged
from contracts.requests import PutChange
from core import decide_merge
from core.diff3 import Labels
from core.merge import plan
from core.merge_types import MergePlan
from infra import log as eventlog
from quill.client import Quill, Workspace
from quill_cli.natsserver import NatsServer
from services.reader.app import Reader
from services.writer import merges
from tests.conftest import StartReader
from tests.core.merging import DIR, Case, Tree, apply
from tests.helpers import start_reader, start_writer, tree_items
from tests.integration.real_writer import REAL_WRITER, log_of
from tests.integration.test_merge import TEXT, edited

PATHS_READ = "quill_writer_merge_paths"


def paths_read() -> float:
    """Paths the in-process writer's merges and dry runs have read so far."""
    return prometheus_client.REGISTRY.get_sample_value(f"{PATHS_READ}_sum") or 0.0


async def never_recorded(js: JetStreamContext, seq: int) -> WorkspaceEvent | None:
    """The log as if no merge had recorded ``kept``: the writer reads the ranges instead."""
    return None


@contextmanager
def as_before(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Merges decided without the record (as before it existed)."""
    with monkeypatch.context() as m:
        m.setattr(eventlog, "event_at", never_recorded, raising=False)
        yield


def shown(m: Merged) -> Any:
    """What a merge answers, but whether it committed (a dry run's answer equals it)."""
    out = msgspec.to_builtins(m)
    del out["dry_run"], out["committed"]
    return out


async def snapshot(reader: Reader, ws: Workspace, version: int) -> Tree:
    """Every file and directory of ``ws`` as of ``version`` (a whole walk, through qry.tree)."""
    assert await reader.follower.wait_for(ws.tenant, ws.name, version, 10)
    out: Tree = {}
    async for item, page in tree_items(ws, version, contents=True):
        if item.kind == "directory":
            out[item.path] = DIR
            continue
        assert item.sha256 is not None and not item.blob
        data = page.contents[item.sha256]
        out[item.path] = ("x", data) if item.executable else data
    return out


class Sync:
    """A source and its fork merged back and forth, each merge checked (module docstring)."""

    def __init__(
        self, reader: Reader, monkeypatch: pytest.MonkeyPatch, ws: dict[str, Workspace]
    ) -> None:
        self.reader, self.monkeypatch, self.ws = reader, monkeypatch, ws
        self.base: Tree = {}
        self.read = {"before": 0.0, "now": 0.0}
        """Paths read by the merges checked, as before (the ranges) and now (``kept``)."""
        self.kept_own = 0
        """Merges that kept a path of the target's own where theirs differed."""

    @classmethod
    async def forked(
        cls, reader: Reader, monkeypatch: pytest.MonkeyPatch, quill: Quill, tenant: str
    ) -> Sync:
        src = quill.workspace(f"{tenant}/main")
        await src.create()
        await src.write("t.txt", TEXT)
        await src.write("keep.txt", "keep\n")
        await src.write("d/x.txt", "x\n")
        forked = await quill.fork(f"{tenant}/main", "try")
        fork = quill.workspace(f"{tenant}/try")
        fork.last_version = forked.version
        sync = cls(reader, monkeypatch, {"main": src, "try": fork})
        sync.base = await snapshot(reader, src, forked.version)
        return sync

    async def text(self, side: str, path: str) -> str:
        ws = self.ws[side]
        tree = await snapshot(self.reader, ws, ws.last_version)
        data = tree.get(path)
        return data.decode() if isinstance(data, bytes) else TEXT

    async def play(self, op: tuple[Any, ...]) -> None:
        match op:
            case ("write", side, path, content):
                await self.ws[side].write(path, content)
            case ("edit", side, path, line, words):
                text = await self.text(side, path)
                lines = text.splitlines(keepends=True) or ["\n"]
                await self.ws[side].write(path, edited(text, 1 + line % len(lines), words))
            case ("delete", side, path):
                try:
                    await self.ws[side].delete(path, recursive=True)
                except QuillError as exc:
                    assert exc.code == ErrorCode.FILE_NOT_FOUND, exc
            case ("merge", side, strategy):
                await self.merge(side, strategy)
            case _:
                raise AssertionError(op)

    async def merge(self, into: str, strategy: Strategy) -> Merged | None:
        """Merge the other workspace into ``into``, checked; its answer (None: refused)."""
        target, other = self.ws[into], self.ws["try" if into == "main" else "main"]
        ours_version = target.last_version
        with as_before(self.monkeypatch):
            start = paths_read()
            before = await target.merge(other.name, strategy=strategy, dry_run=True)
            self.read["before"] += paths_read() - start
        start = paths_read()
        dry = await target.merge(other.name, strategy=strategy, dry_run=True)
        self.read["now"] += paths_read() - start
        assert shown(dry) == shown(before)
        reference, case = await self.reference(target, other, ours_version, dry, strategy)
        assert sorted((c.path, c.kind, c.resolution) for c in dry.conflicts) == sorted(
            (c.path, c.kind, c.resolution) for c in reference.conflicts
        )
        assert (dry.refused is None) == (reference.refused is None), (dry, reference)
        if dry.refused is not None:
            with pytest.raises(QuillError) as refused:
                await target.merge(other.name, strategy=strategy)
            assert refused.value.code == ErrorCode.MERGE_CONFLICT
            return None
        done = await target.merge(other.name, strategy=strategy)
        assert shown(done) == shown(dry)
        if not done.committed:
            assert done.changes == [] and reference.changes == []
            return done  # no event: the base stays where it was
        assert target.last_version == ours_version + 1
        want = apply(case.ours, reference, case.store)
        assert await snapshot(self.reader, target, target.last_version) == want
        self.base = case.theirs  # the version the merge took: the next merge's base
        if any(c.resolution == "ours" for c in done.conflicts):
            self.kept_own += 1
        return done

    async def reference(
        self, target: Workspace, other: Workspace, ours: int, dry: Merged, strategy: Strategy
    ) -> tuple[MergePlan, Case]:
        """The merge of the two whole trees against the last merge's base, and the trees."""
        theirs_tree = await snapshot(self.reader, other, dry.from_version)
        ours_tree = await snapshot(self.reader, target, ours)
        case = Case(self.base, ours_tree, theirs_tree)
        labels = Labels(
            ours=f"{target.name}@{ours}",
            base=f"base@{dry.base_version}",
            theirs=f"{other.name}@{dry.from_version}",
        )
        out = plan(case.sides(), strategy, case.content, labels=labels, max_file_bytes=1 << 20)
        return out, case


SCRIPT: list[tuple[Any, ...]] = [
    # both change; the fork takes the source's, keeping its own c.txt (add/add, ours) and
    # merging t.txt line by line
    ("write", "main", "a.txt", "a by main\n"),
    ("edit", "main", "t.txt", 2, "main 3\n"),
    ("write", "main", "c.txt", "c by main\n"),
    ("write", "try", "b.txt", "b by the fork\n"),
    ("edit", "try", "t.txt", 14, "fork 15\n"),
    ("write", "try", "c.txt", "c by the fork\n"),
    ("merge", "try", "ours"),
    # the fork takes the source's again: its own c.txt is still apart from the source's
    ("write", "main", "g.txt", "g\n"),
    ("merge", "try", "fail"),
    # the source takes the fork's back: c.txt is the fork's (its merges kept its own there)
    ("edit", "main", "t.txt", 9, "main 10\n"),
    ("edit", "try", "t.txt", 19, "fork 20\n"),
    ("merge", "main", "fail"),
    # both change line 5: markers on the fork, which then resolves them
    ("edit", "main", "t.txt", 4, "main 5\n"),
    ("edit", "try", "t.txt", 4, "fork 5\n"),
    ("merge", "try", "markers"),
    ("write", "try", "t.txt", edited(TEXT, 5, "both 5\n")),
    ("merge", "main", "fail"),
    # a delete on one side, an edit on the other
    ("delete", "main", "d/x.txt"),
    ("write", "try", "keep.txt", "keep, by the fork\n"),
    ("merge", "try", "fail"),
    ("merge", "main", "fail"),
    # delete against modify, decided for ours on the source; then the fork takes it
    ("delete", "try", "keep.txt"),
    ("write", "try", "e/f.txt", "f\n"),
    ("write", "main", "keep.txt", "keep, by main\n"),
    ("merge", "main", "ours"),
    ("merge", "try", "fail"),  # takes keep.txt: the source's merge kept it
    ("merge", "main", "fail"),
    # a conflict refused, then decided for theirs
    ("write", "main", "bin", "\x00main"),
    ("write", "try", "bin", "\x00fork"),
    ("merge", "try", "fail"),
    ("merge", "try", "theirs"),
    ("merge", "main", "fail"),
    ("merge", "try", "fail"),  # nothing new either way
]


async def test_merges_back_and_forth_read_what_changed_since_the_last(
    services: StartReader, quill: Quill, monkeypatch: pytest.MonkeyPatch, nats_url: str
) -> None:
    reader = await services("r1")
    sync = await Sync.forked(reader, monkeypatch, quill, "mk1")
    for op in SCRIPT:
        await sync.play(op)
    assert sync.kept_own == 2  # c.txt on the fork, keep.txt on the source
    assert 0 < sync.read["now"] < sync.read["before"], sync.read
    event = await first_merge(nats_url, "mk1", "try")
    assert event.merged_from is not None
    assert event.merged_from.kept == ["b.txt", "c.txt", "t.txt"]  # own, own (ours), merged
    for ws in sync.ws.values():  # both converged
        assert await snapshot(reader, ws, ws.last_version) == await snapshot(
            reader, sync.ws["main"], sync.ws["main"].last_version
        )


async def first_merge(url: str, tenant: str, name: str) -> ChangesCommitted:
    """The first merge event in ``tenant/name``'s log."""
    nc = NATS()
    await nc.connect(url)
    try:
        log = await log_of(nc, tenant, name)
    finally:
        await nc.close()
    event = next(c.event for c in log if c.event.op == "merge")
    assert isinstance(event, ChangesCommitted)
    return event


async def test_a_record_over_its_bound_is_left_out(
    services: StartReader, quill: Quill, monkeypatch: pytest.MonkeyPatch, nats_url: str
) -> None:
    """Paths kept over ``MERGE_KEPT_MAX_BYTES`` are not recorded (the event stays bounded):
    the merge back reads the ranges, as a merge recorded before the field, and merges the
    same."""
    reader = await services("r1")
    monkeypatch.setattr(decide_merge, "MERGE_KEPT_MAX_BYTES", 8)
    sync = await Sync.forked(reader, monkeypatch, quill, "mk3")
    first_back = SCRIPT.index(("merge", "main", "fail"))
    for op in SCRIPT[: first_back + 1]:
        await sync.play(op)
    assert sync.read["now"] == sync.read["before"] > 0
    event = await first_merge(nats_url, "mk3", "try")
    assert event.merged_from is not None and event.merged_from.kept is None


SIDES = st.sampled_from(["main", "try"])
FILES = st.sampled_from(["t.txt", "a.txt", "d/x.txt", "d/e/y.txt"])
OPS = st.one_of(
    st.tuples(st.just("write"), SIDES, FILES, st.sampled_from(["1\n", "2\n", TEXT])),
    st.tuples(st.just("edit"), SIDES, FILES, st.integers(0, 19), st.sampled_from(["p\n", "q\n"])),
    st.tuples(st.just("delete"), SIDES, st.sampled_from(["t.txt", "a.txt", "d", "d/x.txt"])),
    st.tuples(st.just("merge"), SIDES, st.sampled_from(["fail", "ours", "theirs", "markers"])),
)


_names = iter(range(1_000_000))


async def random_run(
    url: str, data: Path, monkeypatch: pytest.MonkeyPatch, script: list[tuple[Any, ...]]
) -> None:
    async with AsyncExitStack() as stack:
        await start_writer(stack, url, data / "writer")
        reader = await start_reader(stack, url, data / "reader")
        quill = await Quill.connect(url, actor="tester", timeout=10)
        stack.push_async_callback(quill.close)
        sync = await Sync.forked(reader, monkeypatch, quill, data.name)
        for op in [*script, ("merge", "main", "theirs"), ("merge", "try", "theirs")]:
            await sync.play(op)
        assert sync.read["now"] <= sync.read["before"]


SCRIPTS = st.lists(OPS, min_size=4, max_size=16)


def _random_merges(
    nats_server: NatsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: list[tuple[Any, ...]],
) -> None:
    """Random edits on both sides and merges either way, each checked (``Sync.merge``)."""
    data = tmp_path / f"kept{next(_names)}"
    asyncio.run(random_run(nats_server.url, data, monkeypatch, script))


test_random_merges_are_the_whole_trees_merge = settings(REAL_WRITER, max_examples=8)(
    given(script=SCRIPTS)(_random_merges)
)
test_many_random_merges_are_the_whole_trees_merge = pytest.mark.slow(
    pytest.mark.timeout(600)(  # the same, longer and more
        settings(REAL_WRITER, max_examples=60)(
            given(script=st.lists(OPS, min_size=4, max_size=30))(_random_merges)
        )
    )
)


# ---------------------------------------------------------------- the cost

CHANGED = 2_000
"""Paths each side changes before their first sync."""


async def test_a_merge_back_after_syncs_reads_what_changed_since(
    services: StartReader, quill: Quill, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork and its source each change 2,000 paths, sync both ways a few times, then the
    fork changes 3: merging it back reads 3 paths, where reading since the fork point read
    every one (4,000 and more), and over a lowered ``MAX_MERGE_PATHS`` was refused."""
    await services("r1")
    src = quill.workspace("mk2/main")
    await src.create()
    await src.write("readme", "hello\n")
    forked = await quill.fork("mk2/main", "try")
    fork = quill.workspace("mk2/try")
    fork.last_version = forked.version
    await src.apply([PutChange(path=f"m/{i}", content=f"{i}\n") for i in range(CHANGED)])
    await fork.apply([PutChange(path=f"f/{i}", content=f"{i}\n") for i in range(CHANGED)])
    assert (await fork.merge("main")).changes_total == CHANGED + 1  # m and m/*
    assert (await src.merge("try")).changes_total == CHANGED + 1
    for round_ in range(3):  # syncs, each way
        await src.write("m/0", f"round {round_}\n")
        await fork.write("f/0", f"round {round_}\n")
        assert (await fork.merge("main")).changes_total == 1
        assert (await src.merge("try")).changes_total == 1
    await src.write("m/1", "last\n")
    assert (await fork.merge("main")).changes_total == 1  # the last merge: the fork's
    await fork.write("f/1", "the fork's\n")
    await fork.write("f/2", "the fork's\n")
    await fork.write("new.txt", "new\n")
    monkeypatch.setattr(merges, "MAX_MERGE_PATHS", 100)
    start = paths_read()
    merged = await src.merge("try")
    assert merged.committed and sorted(c.path for c in merged.changes) == [
        "f/1",
        "f/2",
        "new.txt",
    ]
    assert paths_read() - start == 3
    with as_before(monkeypatch), pytest.raises(QuillError) as refused:
        await fork.merge("main", dry_run=True)  # the source's merge back: against it
    assert refused.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    assert refused.value.details["paths"] >= 2 * CHANGED
    assert (await fork.merge("main", dry_run=True)).changes_total == 0  # read: 3, the merge's
