"""Projection snapshots (``infra/snapshots.py``): a reader with no data starts from the newest
snapshot in WS_SNAPSHOTS and replays only the tail; one that does not verify is ignored (said
in the log) and the reader still answers right; readers make them, one at a time, keeping K."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio
import zstandard
from click.testing import CliRunner, Result
from nats.aio.client import Client as NATS
from nats.js.api import ObjectMeta
from nats.js.kv import KeyValue

from bench.bootstrap import append, synthesise
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from contracts.subjects import BUCKET_SNAPSHOTS, Subjects
from infra import bus, snapshot_install
from infra import snapshots as snaps
from infra.store import SCHEMA_VERSION, Store
from quill.client import Quill
from quill_cli.cli import main
from quill_cli.tools import replay as rpl
from services.reader.follower import TRACKING
from services.reader.snapshots import SnapshotConfig, Snapshotter
from services.writer.config import WriterConfig
from tests.helpers import LogBuilder, eventually, start_reader, start_writer
from tests.integration.test_compaction import KEEP, WRITES, compacted, rows

BOOT = SnapshotConfig(behind=1, every_events=0)
"""A replica that starts from any snapshot ahead of it, and makes none unless asked."""


async def clear(nc: NATS) -> None:
    """No snapshots (the server is shared by the module's tests)."""
    await snaps.ensure_bucket(nc.jetstream(), 1)
    await nc.jetstream().purge_stream(snaps.STREAM)


async def force(nc: NATS) -> dict[str, object]:
    """``quill snapshot``'s request: one replica snapshots now."""
    reply = await nc.request(Subjects().snapshot("reader"), b"", timeout=30)
    answer = json.loads(reply.data)
    assert answer["ok"], answer
    return dict(answer)


async def deployment(stack: AsyncExitStack, nats_url: str, tmp_path: Path) -> Quill:
    """A writer and a client (``stack`` stops them)."""
    await start_writer(stack, nats_url, tmp_path / "writer")
    quill = await Quill.connect(nats_url, timeout=5)
    stack.push_async_callback(quill.close)
    return quill


Deployment = tuple[AsyncExitStack, Quill]


@pytest_asyncio.fixture
async def deployed(nats_url: str, nc: NATS, tmp_path: Path) -> AsyncIterator[Deployment]:
    """No snapshots yet (``clear``), a writer and a client: the stack that stops them (the
    test's readers join it) and the client."""
    await clear(nc)
    async with AsyncExitStack() as stack:
        yield stack, await deployment(stack, nats_url, tmp_path)


@asynccontextmanager
async def filled_by_r1(
    quill: Quill, nats_url: str, root: Path, name: str, writes: int
) -> AsyncIterator[None]:
    """Reader ``r1`` (``BOOT``, data in ``root/r1``) up while ``name`` is filled with
    ``writes`` writes, and until the block ends: a replica that made the log, then left."""
    async with AsyncExitStack() as first:
        await start_reader(first, nats_url, root / "r1", "r1", BOOT)
        await fill(quill, name, writes)
        yield


async def fill(quill: Quill, name: str, writes: int) -> None:
    ws = quill.workspace(name)
    await ws.create()
    for i in range(writes):
        await ws.write("f.txt", f"needle {i}\n")
    await ws.read_text("f.txt")  # the reader has applied it all (read-your-writes)


async def test_a_reader_with_no_data_starts_from_the_snapshot_and_replays_the_tail(
    deployed: Deployment, nats_url: str, nc: NATS, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stack, quill = deployed
    async with filled_by_r1(quill, nats_url, tmp_path, "acme/snap", 30):
        made = await force(nc)
        assert made["by"] == "r1" and int(str(made["bytes"])) > 0
        ws = quill.workspace("acme/snap")
        for i in range(30, 35):  # the tail, after the snapshot
            await ws.write("f.txt", f"needle {i}\n")
    # r1 is gone: r2 (no data) answers alone
    with caplog.at_level(logging.INFO, "quill.reader"):
        r2 = await start_reader(stack, nats_url, tmp_path / "r2", "r2", BOOT)
    assert r2.started_from == made["name"]
    assert f"following the log from seq {made['position']} " in caplog.text  # the tail only
    assert r2.follower.position > int(str(made["position"]))
    fresh = await Quill.connect(nats_url, timeout=5)
    stack.push_async_callback(fresh.close)
    assert await fresh.workspace("acme/snap").read_text("f.txt") == "needle 34\n"
    assert await ws.read_text("f.txt", version=10) == "needle 8\n"  # from the snapshot
    found = await fresh.workspace("acme/snap").grep("needle 3[0-4]")  # the trigram index
    assert found.total == 1
    await ws.write("g.txt", "latest")  # read-your-writes on the new replica
    assert await ws.read_text("g.txt") == "latest"
    assert (await ws.info()).version == ws.last_version == 37


def _tampered(kind: str, data: bytes, snap: snaps.Snapshot) -> tuple[bytes, snaps.Snapshot]:
    """A snapshot's bytes and record, broken as ``kind`` says."""
    if kind == "bad checksum":
        return data[:100] + bytes([data[100] ^ 1]) + data[101:], snap
    if kind == "truncated":  # the record agrees with the bytes: only unpacking finds it
        cut = data[: len(data) // 2]
        return cut, replace(snap, sha256=hashlib.sha256(cut).hexdigest(), stored=len(cut))
    if kind == "wrong schema":
        return data, replace(snap, schema="0")
    if kind == "another encoding":
        return data, replace(snap, encoding="gzip")
    if kind == "another log":
        return data, replace(snap, log="1999-01-01T00:00:00+00:00")
    if kind == "a bomb":  # says it is small, decompresses to far more
        bomb = zstandard.ZstdCompressor().compress(b"\0" * (snap.size * 4))
        return bomb, replace(snap, sha256=hashlib.sha256(bomb).hexdigest(), stored=len(bomb))
    assert kind == "not a database"
    junk = zstandard.ZstdCompressor().compress(b"x" * snap.size)
    return junk, replace(snap, sha256=hashlib.sha256(junk).hexdigest(), stored=len(junk))


async def _replace(nc: NATS, snap: snaps.Snapshot, kind: str) -> None:
    """Store a broken copy of ``snap`` in its place."""
    stored = b"".join(
        [b"".join(c) async for c in snapshot_install.stored_chunks(nc.jetstream(), snap)]
    )
    data, record = _tampered(kind, stored, snap)
    obs = await nc.jetstream().object_store(BUCKET_SNAPSHOTS)
    meta = ObjectMeta(name=snap.name, headers=record.headers())
    await obs.put(snap.name, data, meta=meta)


@pytest.mark.parametrize(
    "kind",
    [
        "bad checksum",
        "truncated",
        "wrong schema",
        "another encoding",
        "another log",
        "not a database",
        "a bomb",
    ],
)
async def test_a_snapshot_that_does_not_verify_is_ignored_and_said(
    deployed: Deployment,
    nats_url: str,
    nc: NATS,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    name = "acme/" + kind.replace(" ", "-")
    stack, quill = deployed
    async with filled_by_r1(quill, nats_url, tmp_path, name, 5):
        older = await force(nc)
        ws = quill.workspace(name)
        for i in range(5, 10):
            await ws.write("f.txt", f"needle {i}\n")
        await ws.read_text("f.txt")  # applied: the next snapshot is of a later position
        newer = await force(nc)
    (broken, _) = await snaps.listing(nc.jetstream(), "reader")
    assert broken.name == newer["name"]
    await _replace(nc, broken, kind)

    with caplog.at_level(logging.WARNING, "quill.snapshots"):
        r2 = await start_reader(stack, nats_url, tmp_path / "r2", "r2", BOOT)
    assert f"snapshot {broken.name} ignored" in caplog.text
    assert r2.started_from == older["name"]  # the previous one, which verifies
    assert await ws.read_text("f.txt") == "needle 9\n"

    # with only the broken one left: a full replay, and the same answers
    await snaps.prune(nc.jetstream(), "reader", keep=1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "quill.snapshots"):
        r3 = await start_reader(stack, nats_url, tmp_path / "r3", "r3", BOOT)
    assert f"snapshot {broken.name} ignored" in caplog.text
    assert r3.started_from is None
    assert r3.store.version_of("acme", name.split("/")[1]) == 11
    assert not (tmp_path / "r3" / "snapshot-fetch").exists()


async def test_a_snapshot_older_than_a_compaction_and_a_purge_gives_the_same_projection(
    nats_url: str, nc: NATS, tmp_path: Path
) -> None:
    """The log before a compaction (and a purged workspace's) is gone once the snapshot is
    old: the tail still has the compaction and the purge, which replace what it held."""
    await clear(nc)
    async with AsyncExitStack() as stack:
        quill = await deployment(stack, nats_url, tmp_path)
        old = await start_reader(stack, nats_url, tmp_path / "r1", "r1", BOOT)
        ws = quill.workspace("acme/trimmed")
        await ws.create(limits=LimitsPatch(max_versions=KEEP))
        await ws.write("hot.md", "hot 0\n")
        gone = quill.workspace("acme/gone")
        await gone.create()
        await gone.write("a.txt", "old life")
        made = await force(nc)
        event = await compacted(ws, WRITES)  # purges the log before it, after the snapshot
        await gone.purge()
        await gone.create()
        await gone.write("b.txt", "new life")
        await gone.write("c.txt", "!")
        last = gone.last_version

        new = await start_reader(stack, nats_url, tmp_path / "r2", "r2", BOOT)
        assert new.started_from == made["name"]
        await eventually(
            lambda: (
                new.store.version_of("acme", "trimmed") >= event.version
                and new.store.version_of("acme", "gone") >= last
            )
        )
        for name in ("trimmed", "gone"):
            assert await rows(new.store, "acme", name) == await rows(old.store, "acme", name)


async def test_readers_make_snapshots_when_due_one_at_a_time_keeping_k(
    nats_url: str, nc: NATS, tmp_path: Path
) -> None:
    await clear(nc)
    js = nc.jetstream()
    often = SnapshotConfig(every_events=5, keep=2, check_s=0.05)
    async with AsyncExitStack() as stack:
        quill = await deployment(stack, nats_url, tmp_path)
        readers = [
            await start_reader(stack, nats_url, tmp_path / n, n, often) for n in ("m1", "m2")
        ]
        ws = quill.workspace("acme/often")
        await ws.create()
        seen: set[tuple[str, str]] = set()
        newest = 0

        async def made() -> list[snaps.Snapshot] | None:
            """A snapshot newer than the last round's, and the oldest pruned (keep 2)."""
            listed = await snaps.listing(js, "reader")
            return listed if listed and listed[0].position > newest and len(listed) <= 2 else None

        for round_ in range(3):
            for i in range(6):  # more than snapshot_events: one is due
                await ws.write("f.txt", f"{round_} {i}")
            found = await eventually(made)
            newest = found[0].position
            seen |= {(s.name, s.by) for s in found}
        assert len(seen) >= 3
        assert {by for _, by in seen} <= {"m1", "m2"}
        # a lease held by another replica: no snapshot, and said so
        await ws.write("f.txt", "one more")
        top = max(s.position for s in found)
        await eventually(lambda: readers[0].follower.position > top)  # a snapshot is due
        # the replica that made the last round's snapshot releases the lease after pruning
        # (what the loop above waited for): take it as soon as it is free
        other = snaps.Lease(js, "reader", "someone-else")
        await eventually(other.take, 10, "the lease, released")
        try:
            assert await readers[0].snapshots.make() is None
        finally:
            await other.release()
        assert await readers[0].snapshots.make() is not None


@pytest.mark.parametrize("lost", [TimeoutError, asyncio.CancelledError])
async def test_a_lease_taken_without_an_answer_is_not_left_held(
    nc: NATS, monkeypatch: pytest.MonkeyPatch, lost: type[BaseException]
) -> None:
    """The create is stored but its answer never comes (a timeout, or the replica stopping
    meanwhile): the lease is dropped, not left for ``LEASE_S`` with no snapshots made."""
    js = nc.jetstream()
    await snaps.ensure_bucket(js, 1)
    create = KeyValue.create

    async def stored_unanswered(kv: KeyValue, key: str, value: bytes) -> int:
        await create(kv, key, value)
        raise lost

    role = f"lost-{lost.__name__}"  # the key (a held one outlives a failed test)
    monkeypatch.setattr(KeyValue, "create", stored_unanswered)
    with pytest.raises(lost):
        await snaps.Lease(js, role, "r1").take()
    monkeypatch.undo()
    other = snaps.Lease(js, role, "r2")
    assert await other.take()  # before: False for LEASE_S (15 minutes)
    await other.release()


async def test_a_projection_close_behind_the_snapshot_keeps_its_data(
    deployed: Deployment, nats_url: str, nc: NATS, tmp_path: Path
) -> None:
    """Within ``snapshot_behind`` events of the newest snapshot, a replica keeps its own data
    (the tail is short); a newer schema's snapshot is never installed."""
    stack, quill = deployed
    async with filled_by_r1(quill, nats_url, tmp_path, "acme/near", 3):
        pass  # filled, and r1 gone
    async with AsyncExitStack() as maker:
        await start_reader(maker, nats_url, tmp_path / "m", "m", BOOT)
        await quill.workspace("acme/near").write("f.txt", "later")
        await force(nc)
    again = await start_reader(stack, nats_url, tmp_path / "r1", "r1", replace(BOOT, behind=1000))
    assert again.started_from is None
    assert await quill.workspace("acme/near").read_text("f.txt") == "later"


async def test_a_writer_with_no_projection_starts_from_a_reader_snapshot(
    nats_url: str, nc: NATS, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "quill.snapshots")
    await clear(nc)
    async with AsyncExitStack() as stack:
        quill = await Quill.connect(nats_url, timeout=5)
        stack.push_async_callback(quill.close)
        await start_reader(stack, nats_url, tmp_path / "r1", "r1", BOOT)
        async with AsyncExitStack() as first:
            await start_writer(first, nats_url, tmp_path / "w1")
            await fill(quill, "acme/writer", 20)
            made = await force(nc)
            ws = quill.workspace("acme/writer")
            await ws.write("f.txt", "after the snapshot\n")  # v22: the tail
        writer = await start_writer(
            stack, nats_url, tmp_path / "w2", WriterConfig(snapshot_behind=1)
        )
        # the snapshot (as of v21), then the tail, applied before it serves
        assert "installed snapshot" in caplog.text
        assert writer.store.version_of("acme", "writer") == 22 and writer.deps.projection.complete
        tables = {
            str(r[0])
            for r in await writer.store.reads.execute_fetchall(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'index')"
            )
        }
        assert "events_request" in tables and "content_index" not in tables
        assert "revisions_live" in tables and "revisions_children" not in tables
        # the statistics were gathered on the installed database, its new indexes included
        assert await writer.store.get_meta("stats_at") == str(made["position"])
        stats = await writer.store.reads.execute_fetchall("SELECT idx FROM sqlite_stat1")
        assert {"events_request", "revisions_live"} <= {str(r[0]) for r in stats}
        done = await ws.edit("f.txt", "after", "later")  # decided on the snapshot + the tail
        assert done.replacements == 1 and ws.last_version == 23
        assert await ws.read_text("f.txt") == "later the snapshot\n"
        folded = await rpl.replay(nc.jetstream(), Subjects(), "acme", "writer")  # the chain holds
        assert folded.version == 23
        assert made["position"]


def test_a_snapshot_is_due_after_n_events_or_m_seconds_with_events_since() -> None:
    config = SnapshotConfig(every_events=10, every_s=60)
    maker = Snapshotter(None, Path("x"), "reader", "r", config, lambda: 0)  # type: ignore[arg-type]
    now = datetime.now(UTC)
    assert not maker.due(9, now) and maker.due(10, now)
    assert maker.due(1, now + timedelta(seconds=61)) and not maker.due(0, now + timedelta(hours=1))


async def cli(nats_url: str, *argv: str) -> Result:
    """``quill ARGV`` run by the CLI in this process (in a thread: the services answer from
    this event loop)."""
    env = {"QUILL_NATS_URL": nats_url}
    return await asyncio.to_thread(CliRunner().invoke, main, list(argv), env=env)


async def test_quill_snapshot_makes_one_now_and_lists_them(
    deployed: Deployment, nats_url: str, nc: NATS, tmp_path: Path
) -> None:
    _, quill = deployed
    async with filled_by_r1(quill, nats_url, tmp_path, "acme/cli", 3):
        made = await cli(nats_url, "--json", "snapshot")
        assert made.exit_code == 0, made.output
        answer = json.loads(made.stdout)
        again = await cli(nats_url, "--json", "snapshot")  # nothing new: the same one
        assert json.loads(again.stdout)["name"] == answer["name"]
        listed = await cli(nats_url, "--json", "snapshot", "--list")
        assert [r["name"] for r in json.loads(listed.stdout)] == [answer["name"]]
        human = await cli(nats_url, "snapshot", "--list")
        assert f"log position {answer['position']:,}" in human.stdout
    # no reader replica: said, and a non-zero exit
    refused = await cli(nats_url, "snapshot", "--timeout", "1")
    assert refused.exit_code != 0 and "UNAVAILABLE" in refused.output


def _pages(db: Path) -> tuple[int, int]:
    """``(pages, bytes unused in them)`` of the database at ``db``."""
    conn = sqlite3.connect(db)
    try:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        unused = conn.execute("SELECT sum(unused) FROM dbstat").fetchone()[0]
        return int(pages), int(unused)
    finally:
        conn.close()


async def test_a_snapshot_keeps_the_projection_s_pages_as_they_are(
    nc: NATS, tmp_path: Path
) -> None:
    """A snapshot is the projection's pages, with the room applies left in them. ``VACUUM
    INTO`` packed them full, so a replica starting from one split a page at the first insert
    into each: at 1,000,000 workspaces it applied its tail at half the speed (issue 17)."""
    await clear(nc)
    await bus.ensure_streams(nc, Subjects())
    log = LogBuilder()
    log.run(rq.CreateWorkspace(), "create")
    for n in range(400):  # paths out of order: leaves split as they fill, room is left
        log.run(rq.WriteFile(path=f"d{n * 7919 % 53}/f{n}.txt", content=f"{n}\n" * 50))
    db = tmp_path / "reader.db"
    store = await Store.open(db, role="reader")
    await store.apply(log.log, tracking=TRACKING)
    await store.close()
    await snaps.make(nc.jetstream(), db, "reader", TRACKING, "test", keep=3)
    made = (await snaps.listing(nc.jetstream(), "reader"))[0]
    stored = b"".join(
        [b"".join(c) async for c in snapshot_install.stored_chunks(nc.jetstream(), made)]
    )
    copy = tmp_path / "copy.db"
    copy.write_bytes(zstandard.ZstdDecompressor().decompressobj().decompress(stored))
    pages, unused = _pages(db)
    assert unused > 20 * 4096  # the projection's pages have room (else this proves nothing)
    assert _pages(copy) == (pages, unused)
    assert snaps.tracked(copy, TRACKING) == (SCHEMA_VERSION, len(log.log))


async def test_a_replica_from_a_snapshot_answers_before_its_tail_is_applied(
    deployed: Deployment, nats_url: str, nc: NATS, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader with no data serves once the snapshot is installed: a workspace the tail
    changed is answered at its latest version by applying its events ahead of the catch-up
    (issue 17: the tail took 7 s at 1,000,000 workspaces), a workspace purged and made again
    in the tail waits for the catch-up (a purge is never applied ahead), and the workspace
    listing is never answered from part of the log."""
    stack, quill = deployed
    reborn = quill.workspace("boot/reborn")
    async with filled_by_r1(quill, nats_url, tmp_path, "boot/early", 3):
        await reborn.create()
        await reborn.write("old.txt", "the first life\n")
        await force(nc)
    # the tail: 20,000 events of other workspaces (the log's batches), then the two
    await append(nc, synthesise(0, 2_000, 20_000))
    await reborn.purge()
    await reborn.create()
    await reborn.write("new.txt", "the second life\n")
    early = quill.workspace("boot/early")
    await early.write("f.txt", "after the tail\n")

    with caplog.at_level(logging.DEBUG, "quill.reader"):
        r2 = await start_reader(stack, nats_url, tmp_path / "r2", "r2", BOOT, caught_up=False)
        fresh = await Quill.connect(nats_url, timeout=5)  # has seen no version
        stack.push_async_callback(fresh.close)
        assert await fresh.workspace("boot/early").read_text("f.txt") == "after the tail\n"
        assert not r2.follower.caught_up  # answered ahead of the tail's 20,000 events
        assert "boot/early: 1 events applied ahead" in caplog.text
        # a bare client's queries that would have a replica read the log for nothing: a
        # version the log does not have, a workspace it never held; one answer each
        for subject, body, code in [
            ("ws.qry.boot.early.read", {"path": "f.txt", "version": 10**9}, "INVALID_ARGUMENT"),
            ("ws.qry.boot.never-made.read", {"path": "f.txt"}, "WORKSPACE_NOT_FOUND"),
        ]:
            raw = await nc.request(subject, json.dumps(body).encode(), timeout=10)
            assert json.loads(raw.data)["error"]["code"] == code, raw.data
        assert "boot/never-made" not in caplog.text  # nothing read or applied ahead for it
        try:
            listed = [w.workspace for w in (await fresh.workspaces("boot")).workspaces]
        except QuillError as exc:  # while catching up: never a listing of part of the log
            assert exc.code == ErrorCode.UNAVAILABLE and "catching up" in exc.message, exc
            listed = ["early", "reborn"]
        assert listed == ["early", "reborn"]
        again = await fresh.workspace("boot/reborn").read_text("new.txt")
        assert again == "the second life\n"
        assert "boot/reborn: " not in caplog.text  # waited for the catch-up
    await asyncio.wait_for(r2.follower.ready.wait(), 60)
    # the catch-up skipped what was applied ahead: each change once, nothing after it
    history = await fresh.workspace("boot/early").history("f.txt")
    assert [r.version for r in history.revisions] == [5, 4, 3, 2]
    assert (await fresh.workspace("boot/early").info()).version == 5
    assert (await fresh.workspace("boot/reborn").info()).version == 2
    with pytest.raises(QuillError) as gone:
        await fresh.workspace("boot/reborn").read_text("old.txt")
    assert gone.value.code == ErrorCode.FILE_NOT_FOUND
    assert [w.workspace for w in (await fresh.workspaces("boot")).workspaces] == listed
