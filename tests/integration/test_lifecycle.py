"""Workspace lifecycle through the real path (nats-server, writer, two reader replicas, an
executor): listing a tenant's workspaces a page at a time, archiving (commands refused, reads
kept) and purging (nothing of the workspace left in the log, on any replica or executor; its
name created again fresh)."""

from __future__ import annotations

import asyncio
import base64
import os
import sqlite3
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from contracts import codec, hashing
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import WorkspacePurged
from contracts.limits import LimitsPatch
from contracts.subjects import STREAM_EVENTS, STREAM_OUTPUT, TENANT_SCOPE, Subjects
from infra import blobs, direct
from infra.blobs import STREAM_BLOBS, Blobs
from infra.exec import commit
from quill.client import Quill, Workspace
from services.executor.app import Executor, ExecutorConfig
from services.reader.app import Reader
from tests.helpers import eventually, start_executor, start_reader, start_writer
from tests.integration.test_compaction import KEEP, WRITES, compacted

BIG = "x" * 70_000 + "\n"
"""Over ``INLINE_MAX``: stored in WS_BLOBS, not in the event."""


async def caught_up(readers: list[Reader], ws: Workspace) -> None:
    """Each replica has applied ``ws`` as far as the client has seen it (and, the log being
    applied in order, everything before it)."""
    for reader in readers:
        assert await reader.follower.wait_for(ws.tenant, ws.name, ws.last_version, 10)


async def writer_and_two_readers(stack: AsyncExitStack, nats_url: str, root: Path) -> list[Reader]:
    """A writer and reader replicas ``r1`` and ``r2`` (data below ``root``): a purge must
    leave nothing on either."""
    await start_writer(stack, nats_url, root / "w")
    return [
        await start_reader(stack, nats_url, root / name, instance=name) for name in ("r1", "r2")
    ]


async def writer_reader_executor(stack: AsyncExitStack, nats_url: str, root: Path) -> Reader:
    """A writer, reader ``r1`` and an executor (local provider), data below ``root``."""
    await start_writer(stack, nats_url, root / "w")
    reader = await start_reader(stack, nats_url, root / "r", instance="r1")
    await start_executor(stack, nats_url, root / "x", ExecutorConfig(sandbox="local"))
    return reader


def rows(reader: Reader, sql: str, *args: object) -> list[tuple[object, ...]]:
    db = sqlite3.connect(reader.store.path)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


async def subject_count(quill: Quill, stream: str, subject: str) -> int:
    js = quill.nc.jetstream()
    try:
        info = await js.stream_info(stream, subjects_filter=subject)
    except Exception:
        return 0
    return sum((info.state.subjects or {}).values())


async def test_list_pages_by_name_with_each_workspace_state(
    nats_url: str, tmp_path: Path, quill: Quill
) -> None:
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "w")
        reader = await start_reader(stack, nats_url, tmp_path / "r", instance="r1")
        names = ["e-five", "a-one", "c-three", "b-two", "d-four"]
        for name in names:
            await quill.workspace(f"listing/{name}").create()
        await quill.workspace("other-tenant/a-one").create()
        one = quill.workspace("listing/a-one")
        await one.write("a.txt", "hello\n")
        await one.write("dir/b.txt", "bye\n")
        await quill.as_actor("ann", session="s-1").workspace("listing/b-two").lock()
        three = quill.workspace("listing/c-three")
        await three.archive("done")
        await caught_up([reader], three)
        await caught_up([reader], one)

        first = await quill.workspaces("listing", limit=2)
        assert [w.workspace for w in first.workspaces] == ["a-one", "b-two"]
        assert first.next == "b-two" and first.tenant == "listing"
        a = first.workspaces[0]
        assert (a.version, a.files, a.total_bytes, a.last_op, a.updated_by) == (
            3, 2, 10, "write", "tester"
        )  # fmt: skip
        assert (a.trust, a.lock_holder, a.archived) == ("full", None, False)
        assert first.workspaces[1].lock_holder == "s-1"
        second = await quill.workspaces("listing", after=first.next, limit=2)
        assert [w.workspace for w in second.workspaces] == ["c-three", "d-four"]
        assert second.workspaces[0].archived and second.workspaces[0].last_op == "archive"
        last = await quill.workspaces("listing", after=second.next, limit=2)
        assert [w.workspace for w in last.workspaces] == ["e-five"] and last.next is None
        every = [w.workspace async for w in quill.all_workspaces("listing", page=1)]
        assert every == sorted(names)
        prefixed = await quill.workspaces("listing", prefix="c")
        assert [w.workspace for w in prefixed.workspaces] == ["c-three"]
        assert (await quill.workspaces("nobody")).workspaces == []

        # hostile requests: a bad tenant, limits, a tenant op sent to a workspace and back
        with pytest.raises(QuillError) as bad:
            await quill.workspaces("Bad.Tenant")
        assert bad.value.code == ErrorCode.INVALID_ARGUMENT
        for limit in (0, 1001):
            with pytest.raises(QuillError) as bad:
                await quill.workspaces("listing", limit=limit)
            assert bad.value.code == ErrorCode.INVALID_ARGUMENT
        with pytest.raises(QuillError) as bad:
            await quill.request(
                "qry", "listing", "a-one", "workspaces", rq.ListWorkspaces(), rp.WorkspaceList
            )
        assert bad.value.code == ErrorCode.INVALID_ARGUMENT
        for kind, op, body in (("qry", "info", rq.WorkspaceInfoQuery()),
                               ("cmd", "create", rq.CreateWorkspace())):  # fmt: skip
            with pytest.raises(QuillError) as bad:
                await quill.request(kind, "listing", TENANT_SCOPE, op, body, rp.WorkspaceInfo)
            assert bad.value.code == ErrorCode.INVALID_ARGUMENT, op


async def test_archive_refuses_commands_and_keeps_reads(
    nats_url: str, tmp_path: Path, quill: Quill
) -> None:
    async with AsyncExitStack() as stack:
        await writer_reader_executor(stack, nats_url, tmp_path)
        ws = quill.workspace("arch/box")
        await ws.create()
        await ws.write("keep.txt", "kept\n")
        await ws.exec("true")  # the executor's checkout exists before the archive
        assert (await ws.archive("finished")).changed
        assert not (await ws.archive()).changed  # archived already: nothing recorded
        for attempt in (
            ws.write("keep.txt", "changed\n"),
            ws.delete("keep.txt"),
            ws.lock(),
            ws.set_trust("restricted"),
            ws.exec("echo hi > new.txt"),
        ):
            with pytest.raises(QuillError) as refused:
                await attempt
            assert refused.value.code == ErrorCode.WORKSPACE_ARCHIVED
            assert refused.value.details["reason"] == "finished"
        assert await ws.read_text("keep.txt") == "kept\n"
        assert (await ws.events()).events[-1].op == "archive"  # history still reads
        assert (await ws.unarchive()).changed
        await ws.write("keep.txt", "changed\n")
        assert (await ws.exec("cat keep.txt")).stdout == "changed\n"


async def test_purge_leaves_nothing_on_any_replica_or_executor(
    nats_url: str, tmp_path: Path, quill: Quill
) -> None:
    async with AsyncExitStack() as stack:
        readers = await writer_and_two_readers(stack, nats_url, tmp_path)
        executor = await start_executor(
            stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local")
        )
        ws, neighbour = quill.workspace("gone/doomed"), quill.workspace("gone/neighbour")
        for each in (ws, neighbour):
            await each.create()
            await each.write("shared.txt", "the same in both\n")
        await ws.write("secret.txt", "only in doomed: zebra-quokka\n")
        await ws.write("big.txt", BIG)
        ran = await ws.exec("cat secret.txt > copy.txt && echo ran")
        assert ran.stdout == "ran\n"
        checkout = tmp_path / "x" / "checkouts" / "gone" / "doomed"
        assert (checkout / "tree" / "copy.txt").exists()
        await caught_up(readers, ws)
        assert (await ws.grep("zebra")).matches  # in the trigram index of a replica
        subjects = Subjects()
        assert await subject_count(quill, STREAM_OUTPUT, subjects.workspace_cmdout(*KEY)) > 0

        with pytest.raises(QuillError) as unconfirmed:  # a purge names what it destroys
            await ws.call(rq.PurgeWorkspace(confirm="gone/neighbour"))
        assert unconfirmed.value.code == ErrorCode.INVALID_ARGUMENT
        with pytest.raises(QuillError) as stale:  # changed since it was looked at
            await ws.purge(expected_version=2)
        assert stale.value.code == ErrorCode.CONFLICT

        version = (await ws.info()).version
        purged = await ws.purge()
        assert (purged.workspace, purged.version) == ("gone/doomed", version)
        await neighbour.write("after.txt", "a marker after the purge\n")
        await caught_up(readers, neighbour)  # so every replica has applied the purge

        # the log holds the purge event alone; kept command output is gone
        js = quill.nc.jetstream()
        assert await subject_count(quill, STREAM_EVENTS, subjects.evt(*KEY)) == 1
        last = await js.get_last_msg(STREAM_EVENTS, subjects.evt(*KEY))
        assert isinstance(codec.decode_event(last.data), WorkspacePurged)
        assert await subject_count(quill, STREAM_OUTPUT, subjects.workspace_cmdout(*KEY)) == 0
        for reader in readers:
            assert reader.store.workspace(*KEY) is None
            assert rows(reader, "SELECT id FROM workspaces WHERE name='doomed'") == []
            for table in ("revisions", "events", "controls", "uncommitted"):
                assert rows(reader, f"SELECT count(*) FROM {table} WHERE ws NOT IN "
                            "(SELECT id FROM workspaces)") == [(0,)], table  # fmt: skip
            texts = [bytes(r[0]) for r in rows(reader, "SELECT data FROM blobs WHERE data "
                                               "IS NOT NULL")]  # fmt: skip
            assert not any(b"zebra" in t or t == BIG.encode() for t in texts)
            assert b"the same in both\n" in texts  # the neighbour's is kept
            assert rows(reader, "SELECT count(*) FROM content_index WHERE content_index "
                        "MATCH 'zeb'") == [(0,)]  # fmt: skip
        await eventually(lambda: not checkout.exists())
        assert KEY not in executor.checkouts.live
        for attempt in (ws.read_text("secret.txt"), ws.info(), ws.write("x", "y")):
            with pytest.raises(QuillError) as missing:
                await attempt
            assert missing.value.code == ErrorCode.WORKSPACE_NOT_FOUND
        assert [w.workspace for w in (await quill.workspaces("gone")).workspaces] == ["neighbour"]

        # the name is created again fresh: version 1, nothing of the old one
        assert (await ws.create()).created and ws.last_version == 1
        assert (await ws.list()).entries == []
        assert [e.version for e in (await ws.events()).events] == [1]
        assert (await ws.exec("ls")).stdout == ""
        assert await subject_count(quill, STREAM_EVENTS, subjects.evt(*KEY)) == 1  # no purge
        # a replica started now, from the log alone, agrees
        late = await start_reader(stack, nats_url, tmp_path / "r3", instance="r3")
        await caught_up([late, *readers], ws)
        for reader in (late, *readers):
            row = reader.store.workspace(*KEY)
            assert row is not None and row.version == 1


KEY = ("gone", "doomed")


async def test_an_executor_away_during_a_purge_drops_the_checkout_when_it_starts(
    nats_url: str, tmp_path: Path, quill: Quill
) -> None:
    checkout = tmp_path / "x" / "checkouts" / "away" / "doomed"
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "w")
        await start_reader(stack, nats_url, tmp_path / "r", instance="r1")
        ws = quill.workspace("away/doomed")
        await ws.create()
        await ws.write("a.txt", "a\n")
        async with AsyncExitStack() as away:
            await start_executor(away, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
            await ws.exec("true")
        assert checkout.exists()
        await ws.purge()
        executor: Executor = await start_executor(
            stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local")
        )
        assert not checkout.exists() and ("away", "doomed") not in executor.checkouts.live


async def test_a_purge_amid_writes_leaves_no_half_state(
    nats_url: str, tmp_path: Path, quill: Quill
) -> None:
    async with AsyncExitStack() as stack:
        readers = await writer_and_two_readers(stack, nats_url, tmp_path)
        ws = quill.workspace("busy/hot")
        await ws.create()
        writes = [ws.write(f"f{i}.txt", f"{i}\n") for i in range(40)]
        outcomes = await asyncio.gather(*writes[:20], ws.purge(), *writes[20:],
                                        return_exceptions=True)  # fmt: skip
        purge = outcomes[20]
        assert isinstance(purge, rp.Purged), purge
        for outcome in outcomes[:20] + outcomes[21:]:
            # committed before the purge (then purged with it), or refused after it
            assert isinstance(outcome, rp.FileWritten) or (
                isinstance(outcome, QuillError) and outcome.code == ErrorCode.WORKSPACE_NOT_FOUND
            ), outcome
        written = sum(isinstance(o, rp.FileWritten) for o in outcomes)
        assert purge.version == 1 + written
        assert await subject_count(quill, STREAM_EVENTS, Subjects().evt("busy", "hot")) == 1
        marker = quill.workspace("busy/marker")
        await marker.create()
        await caught_up(readers, marker)
        for reader in readers:
            assert reader.store.workspace("busy", "hot") is None
        await ws.create()
        assert (await ws.list()).entries == []


async def object_names(quill: Quill) -> list[str]:
    """The name of every object WS_BLOBS records (a deleted one's tombstone included)."""
    meta, names, after = "$O.WS_BLOBS.M.", [], 0
    while page := await direct.messages(
        quill.nc.jetstream(), STREAM_BLOBS, meta + ">", after=after, count=256
    ):
        after = page[-1][0]
        for _, headers, _ in page:
            token = headers["Nats-Subject"].removeprefix(meta)
            names.append(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode())
    return names


def under(names: list[str], tenant: str, workspace: str) -> list[str]:
    return [n for n in names if n.startswith(f"{tenant}/{workspace}/")]


async def test_purge_deletes_the_workspace_contents_from_ws_blobs(
    nats_url: str, tmp_path: Path, quill: Quill
) -> None:
    """Every object of the purged workspace goes, whoever else holds the same bytes: the
    writer's, the executor's, a compaction manifest, and an upload no event ever named."""
    async with AsyncExitStack() as stack:
        reader = await writer_reader_executor(stack, nats_url, tmp_path)
        ws = quill.workspace("blobby/doomed")
        keeper = quill.workspace("other-tenant/keeper")
        await ws.create(limits=LimitsPatch(max_versions=KEEP))
        await keeper.create()
        shared = os.urandom(100_000)
        for each in (ws, keeper):
            await each.write("shared.bin", shared)
        await ws.write("big.txt", BIG)
        ran = await ws.exec("head -c 300000 /dev/urandom > made.bin && echo ran")
        assert ran.stdout == "ran\n"
        made = await ws.read_bytes("made.bin")
        assert len(made) == 300_000
        event = await compacted(ws, WRITES)  # its manifest is an object of the workspace
        js = quill.nc.jetstream()
        orphan = b"an upload whose apply never came\n" * 3000
        await Blobs(js).of(*KEY_B).put(hashing.content_sha256(orphan), orphan)

        mine = under(await object_names(quill), *KEY_B)
        for content in (shared, BIG.encode(), made, orphan):
            assert f"blobby/doomed/{hashing.content_sha256(content)}" in mine
        assert f"blobby/doomed/{event.manifest}" in mine
        assert f"other-tenant/keeper/{hashing.content_sha256(shared)}" in await object_names(quill)

        await ws.purge()
        assert under(await object_names(quill), *KEY_B) == []  # not even a tombstone
        # the other tenant's copy of the same bytes is its own, and still reads
        fresh = Blobs(js).of("other-tenant", "keeper")
        assert await fresh.get(hashing.content_sha256(shared)) == shared
        await caught_up([reader], keeper)
        assert await keeper.read_bytes("shared.bin") == shared
        assert [w.workspace for w in (await quill.workspaces("blobby")).workspaces] == []


KEY_B = ("blobby", "doomed")


async def test_a_purge_that_fails_midway_is_finished_by_the_next_load(
    nats_url: str, tmp_path: Path, quill: Quill, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer fails deleting the contents (as if it crashed there): the old events stay in
    the log, saying the purge is unfinished; the next command loads the workspace again and
    finishes it before it is decided."""
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "w")
        await start_reader(stack, nats_url, tmp_path / "r", instance="r1")
        ws = quill.workspace("halfway/doomed")
        await ws.create()
        await ws.write("big.txt", BIG)
        sha = hashing.content_sha256(BIG.encode())
        real, failures = blobs.purge, []

        async def failing(*args: object) -> int:
            failures.append(args)
            raise TimeoutError("nats did not answer")

        monkeypatch.setattr(blobs, "purge", failing)
        await ws.purge()
        assert len(failures) == 1
        subject = Subjects().evt("halfway", "doomed")
        assert await subject_count(quill, STREAM_EVENTS, subject) == 3  # not finished
        assert under(await object_names(quill), "halfway", "doomed") == [f"halfway/doomed/{sha}"]

        monkeypatch.setattr(blobs, "purge", real)
        assert (await ws.create()).created and ws.last_version == 1
        assert under(await object_names(quill), "halfway", "doomed") == []
        assert await subject_count(quill, STREAM_EVENTS, subject) == 1  # the new create
        assert (await ws.list()).entries == []


async def test_what_a_command_uploaded_as_its_workspace_was_purged_is_removed(
    nats_url: str, tmp_path: Path, quill: Quill, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command still running when its workspace is purged uploads its large files after
    the purge swept WS_BLOBS; its ``apply`` finds no workspace, and the executor deletes what
    it uploaded."""
    async with AsyncExitStack() as stack:
        await writer_reader_executor(stack, nats_url, tmp_path)
        ws = quill.workspace("racing/doomed")
        await ws.create()
        real = commit.pack

        async def then_purged(*args: Any, **kwargs: Any) -> list[rq.ApplyItem]:
            items = await real(*args, **kwargs)  # uploaded: now the purge comes
            assert under(await object_names(quill), "racing", "doomed")
            await ws.purge()
            return items

        monkeypatch.setattr(commit, "pack", then_purged)
        ran = await ws.exec("head -c 200000 /dev/urandom > made.bin")
        assert not ran.changes.committed
        assert (ran.changes.error or "").startswith("WORKSPACE_NOT_FOUND")
        assert under(await object_names(quill), "racing", "doomed") == []
