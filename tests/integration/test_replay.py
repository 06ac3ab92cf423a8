"""Replay and audit tooling (``quill_cli/tools/replay/``, ``quill replay/verify/runs/export/
import``): a workspace rebuilt from its log alone is what the readers answer at that version,
byte for byte and identically every time; compacted logs replay from their manifest; replicas
that disagree with the log are named; a workspace moves between deployments with its history,
and a tampered export is refused."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from nats.aio.client import Client as NATS

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import WorkspaceUpdated
from contracts.limits import LimitsPatch
from contracts.subjects import Subjects
from infra import bus
from infra.blobs import Blobs
from infra.compaction import slack
from quill.client import Quill, Workspace
from quill_cli.cli import main
from quill_cli.natsserver import NatsServer
from quill_cli.tools import replay as rpl
from tests.conftest import StartReader
from tests.helpers import LogBuilder, new_workspace

ROOT = Path(__file__).resolve().parents[2]
SUBJECTS = Subjects()
BIG = os.urandom(100_000)  # beyond what an event carries inline: stored in WS_BLOBS


async def cli(nats_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``quill ARGS`` as a process against ``nats_url`` (in a thread: the services of the test
    answer from this event loop)."""
    env = {**os.environ, "QUILL_NATS_URL": nats_url}
    argv = [sys.executable, "-m", "quill", *args]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, env=env, timeout=60
    )
    assert "Traceback" not in done.stderr, done.stderr
    if check:
        assert done.returncode == 0, (args, done.stderr)
    return done


async def replayed(nc: NATS, name: str, out: Path, version: int | None = None) -> rpl.Fold:
    """Replay ``name`` (tenant/workspace) into ``out`` from the log alone."""
    tenant, ws = name.split("/")
    contents = rpl.Contents()
    try:
        fold = await rpl.replay(
            nc.jetstream(), SUBJECTS, tenant, ws, to_version=version, contents=contents
        )
        await rpl.write_tree(fold, Blobs(nc.jetstream()), out, contents)
    finally:
        contents.close()
    return fold


async def exported(nc: NATS, name: str, path: Path) -> rpl.Moved:
    tenant, ws = name.split("/")
    with open(path, "wb") as out:
        return await rpl.export(nc.jetstream(), SUBJECTS, rpl.Fold(tenant, ws), out)


async def imported(nc: NATS, path: Path, name: str) -> rpl.Moved:
    tenant, ws = name.split("/")
    return await rpl.import_file(nc, SUBJECTS, lambda: open(path, "rb"), str(path), tenant, ws)


def entries(root: Path) -> list[tuple[str, int, int, bytes | None]]:
    """Every entry under ``root`` (itself included): path, mode, mtime (ns), content."""
    out = []
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() else None
        out.append((str(path.relative_to(root)), st.st_mode, st.st_mtime_ns, data))
    return out


def tar(root: Path) -> bytes:
    """A tar of ``root`` with its entries in name order (as ``tar --sort=name``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted([root, *root.rglob("*")]):
            archive.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buffer.getvalue()


async def as_reader_answers(ws: Workspace, version: int, root: Path) -> None:
    """The tree under ``root`` is exactly what the readers answer at ``version``."""
    listing = await ws.list("", recursive=True, version=version, limit=10_000)
    dirs = {e.path for e in listing.entries if e.kind == "directory"}
    files = {e.path for e in listing.entries if e.kind == "file"}
    on_disk = [p for p in root.rglob("*")]
    assert {str(p.relative_to(root)) for p in on_disk if p.is_dir()} == dirs
    assert {str(p.relative_to(root)) for p in on_disk if p.is_file()} == files
    for path in files:
        assert (root / path).read_bytes() == await ws.read_bytes(path, version=version), path
        info = await ws.stat(path, version=version)
        assert oct((root / path).stat().st_mode & 0o777)[2:] == info.permissions, path


async def workspace_with_everything(quill: Quill, name: str) -> Workspace:
    """Text, binary, a blob in WS_BLOBS, an executable, an empty directory, a move, a delete
    and a restore (contents named again by sha256): versions 1 to 9."""
    ws = quill.workspace(name)
    await ws.create()
    await ws.write("notes/a.md", "hello\n")
    await ws.write("data/blob.bin", BIG)
    await ws.apply(
        [
            rq.PutChange(path="bin/run.sh", content="#!/bin/sh\necho hi\n", executable=True),
            rq.PutChange(path="img.png", data=b"\x89PNG\r\n\x1a\n\x00\xff"),
        ]
    )
    await ws.mkdir("empty/dir")
    await ws.write("notes/a.md", "changed\n")
    await ws.move("notes/a.md", "notes/b.md")
    await ws.delete("data", recursive=True)
    await ws.restore(3)
    assert ws.last_version == 9
    return ws


async def test_replay_is_what_readers_answer_at_every_version_and_is_reproducible(
    services: StartReader, quill: Quill, tmp_path: Path
) -> None:
    await services("r1")
    ws = await workspace_with_everything(quill, "acme/replayed")
    for version in range(1, 10):
        fold = await replayed(quill.nc, "acme/replayed", tmp_path / f"v{version}", version)
        assert (fold.version, fold.events) == (version, version)
        await as_reader_answers(ws, version, tmp_path / f"v{version}")
    assert (tmp_path / "v9" / "data" / "blob.bin").read_bytes() == BIG  # restored, from WS_BLOBS
    assert (tmp_path / "v8" / "bin" / "run.sh").stat().st_mode & 0o777 == 0o755
    again = await replayed(quill.nc, "acme/replayed", tmp_path / "again")
    assert entries(tmp_path / "again") == entries(tmp_path / "v9")  # modes and mtimes too
    assert tar(tmp_path / "again") == tar(tmp_path / "v9")
    assert again.summary().tree_hash == (await ws.info()).tree_hash
    with pytest.raises(QuillError) as full:
        await replayed(quill.nc, "acme/replayed", tmp_path / "v9")
    assert full.value.code == ErrorCode.ALREADY_EXISTS
    with pytest.raises(QuillError) as beyond:
        await replayed(quill.nc, "acme/replayed", tmp_path / "v10", 10)
    assert beyond.value.code == ErrorCode.INVALID_ARGUMENT and not (tmp_path / "v10").exists()


async def compact(ws: Workspace) -> int:
    """Write ``hot.md`` once more; the version of the compaction that follows."""
    updates = await ws.client.nc.subscribe(SUBJECTS.updated(ws.tenant, ws.name))
    async with asyncio.timeout(20):
        await ws.write("hot.md", "the write that makes compaction due\n")
        async for msg in updates.messages:
            update = codec.decode(msg.data, WorkspaceUpdated)
            if update.op == "compact":
                await updates.unsubscribe()
                return update.version
    raise AssertionError("unreachable")


async def test_a_compacted_workspace_replays_from_its_manifest(
    services: StartReader, quill: Quill, tmp_path: Path, nats_url: str
) -> None:
    await services("r1")
    ws = quill.workspace("acme/compacted")
    await ws.create(limits=LimitsPatch(max_versions=2))
    await ws.write("cold.md", "cold\n")  # v2, below the floor, kept
    due = 2 + slack(2) + 1  # hot.md at v3..v21; v22 compacts, keeping v20 and v21
    for i in range(due - 1):
        await ws.write("hot.md", f"hot {i}\n")
    before = await replayed(quill.nc, "acme/compacted", tmp_path / "before", 20)  # whole log
    assert await compact(ws) == 22
    await ws.write("after.md", "after\n")
    after = await replayed(quill.nc, "acme/compacted", tmp_path / "after", 20)
    assert (after.compaction, after.floor, before.compaction) == (22, 20, None)
    assert entries(tmp_path / "after") == entries(tmp_path / "before")
    latest = await replayed(quill.nc, "acme/compacted", tmp_path / "latest")
    assert latest.version == 23 and latest.events == 2  # the compaction, then v23
    await as_reader_answers(ws, 23, tmp_path / "latest")
    with pytest.raises(QuillError) as below:
        await replayed(quill.nc, "acme/compacted", tmp_path / "v19", 19)
    assert below.value.code == ErrorCode.VERSION_TRIMMED and below.value.details["floor"] == 20
    v5 = str(tmp_path / "v5")
    refused = await cli(
        nats_url, "replay", "acme/compacted", "--to-version", "5", "--out", v5, check=False
    )
    assert refused.returncode == 1 and refused.stderr.startswith(
        "quill: VERSION_TRIMMED: Version 5 of acme/compacted was compacted away"
    )
    # moved under another name: the compaction still chains to its manifest's history
    await exported(quill.nc, "acme/compacted", tmp_path / "compacted.jsonl")
    moved = await imported(quill.nc, tmp_path / "compacted.jsonl", "acme/compacted2")
    assert (moved.version, moved.rehashed, moved.blobs) == (
        23,
        True,
        4,
    )  # manifest, cold.md, hot.md x2
    await replayed(quill.nc, "acme/compacted2", tmp_path / "moved", 20)
    assert entries(tmp_path / "moved") == entries(tmp_path / "before")
    fold = await rpl.replay(quill.nc.jetstream(), SUBJECTS, "acme", "compacted2")
    assert fold.compaction == 22
    assert (await rpl.check_replica(quill.nc, SUBJECTS, fold, "r1", deep=True)).ok


async def test_runs_are_listed_and_replayed_as_they_read(
    services: StartReader, quill: Quill, tmp_path: Path, nats_url: str
) -> None:
    ws = await new_workspace(services, quill, "acme/runs")
    await ws.write("plan.md", "turn 0\n")
    await ws.start_run("turn-1")  # reads version 2
    await ws.write("plan.md", "turn 1\n")
    await ws.end_run("turn-1")
    await ws.start_run("turn-2", version=1)
    fold = await replayed(quill.nc, "acme/runs", tmp_path / "latest")
    runs = fold.runs
    assert (runs["turn-1"].version, runs["turn-1"].status) == (2, "ended")
    assert (runs["turn-2"].version, runs["turn-2"].status) == (1, "running")
    assert runs["turn-1"].actor == "tester" and runs["turn-1"].ended_version == 5
    assert (await ws.run_info("turn-1")).version == runs["turn-1"].version
    await replayed(quill.nc, "acme/runs", tmp_path / "run", runs["turn-1"].version)
    assert (tmp_path / "run" / "plan.md").read_text() == "turn 0\n"
    missing = await cli(
        nats_url, "replay", "acme/runs", "--run", "nope", "--out", str(tmp_path / "x"), check=False
    )
    assert (missing.returncode, missing.stderr) == (3, "quill: FILE_NOT_FOUND: No run nope\n")


async def tamper(store: Path, sql: str, *args: Any) -> None:
    """Change a replica's projection behind its back (from a thread: it keeps serving)."""

    def change() -> None:
        with sqlite3.connect(store, timeout=10) as db:
            assert db.execute(sql, args).rowcount == 1

    await asyncio.to_thread(change)


async def test_verify_names_a_replica_that_disagrees_with_the_log(
    services: StartReader, quill: Quill, nats_url: str
) -> None:
    ra, rb = await services("ra"), await services("rb")
    ws = quill.workspace("acme/verified")
    await ws.create()
    await ws.write("a.txt", "alpha\n")
    await ws.write("never-read.txt", "beta\n")
    fold = await rpl.replay(quill.nc.jetstream(), SUBJECTS, "acme", "verified")
    # rb's rows now give a file nobody has read (none is cached) a.txt's content: the hash
    # it records still matches, the tree its answers give does not
    assert (await rpl.check_replica(quill.nc, SUBJECTS, fold, "rb", deep=False)).ok  # caught up
    other = hashlib.sha256(b"alpha\n").hexdigest()  # a.txt's content
    await tamper(rb.store.path, "UPDATE revisions SET sha256=? WHERE path='never-read.txt'", other)
    shallow = await rpl.check_replica(quill.nc, SUBJECTS, fold, "rb", deep=False)
    deep = await rpl.check_replica(quill.nc, SUBJECTS, fold, "rb", deep=True)
    assert shallow.ok and not deep.ok and deep.problems[0].startswith("tree hash: replica ")
    assert await rpl.live_readers(quill.nc, SUBJECTS) == ["ra", "rb"]
    assert (await rpl.check_replica(quill.nc, SUBJECTS, fold, "ra", deep=True)).ok
    ra_id = ra.store.workspace_id("acme", "verified")
    # what ra answers of the workspace's bytes is its row's (info reads the counters its
    # triggers keep, issue 29)
    await tamper(ra.store.path, "UPDATE workspaces SET total_bytes=total_bytes+1 WHERE id=?", ra_id)
    bad = await cli(nats_url, "verify", "acme/verified", check=False)
    assert bad.returncode == 1
    assert "reader ra: MISMATCH: bytes: replica 12, log 11" in bad.stdout
    assert bad.stderr == (
        "quill: INTERNAL: 1 of 2 reader replicas disagree with the log at version 3: ra\n"
    )


async def test_export_and_import_move_a_workspace_with_its_history(
    services: StartReader, quill: Quill, tmp_path: Path, nats_url: str
) -> None:
    await services("r1")
    ws = await workspace_with_everything(quill, "acme/src")
    await replayed(quill.nc, "acme/src", tmp_path / "src")
    export = tmp_path / "src.jsonl"
    out = await exported(quill.nc, "acme/src", export)
    assert (out.version, out.events, out.blobs) == (9, 9, 1)
    # another name on this deployment: events re-encoded and re-chained, history kept
    moved = await imported(quill.nc, export, "acme/dst")
    assert (moved.source, moved.rehashed, moved.version) == ("acme/src", True, 9)
    dst = quill.workspace("acme/dst")
    dst.last_version = moved.version  # the reader answers once it has applied the import
    source, copied = await ws.events(limit=20), await dst.events(after=0, limit=20)
    kept = ["version", "at", "op", "actor", "request_id", "tree_hash", "changes"]
    assert [[getattr(e, k) for k in kept] for e in copied.events] == [
        [getattr(e, k) for k in kept] for e in source.events
    ]
    assert source.events[-1].hash != copied.events[-1].hash
    await as_reader_answers(dst, 9, tmp_path / "src")
    fold = await replayed(quill.nc, "acme/dst", tmp_path / "dst")
    assert entries(tmp_path / "dst") == entries(tmp_path / "src")
    assert (await rpl.check_replica(quill.nc, SUBJECTS, fold, "r1", deep=True)).ok
    # the same name on another deployment: byte for byte, same hashes
    elsewhere = NatsServer(tmp_path / "nats2").start()
    try:
        nc2 = await bus.connect(elsewhere.url, "test-elsewhere")
        bare = await cli(elsewhere.url, "import", str(export), "acme/src", check=False)
        assert "has no stream WS_EVENTS: Quill has not run there" in bare.stderr
        await bus.ensure_streams(nc2, SUBJECTS)  # as Quill's services do when they start
        assert not (await imported(nc2, export, "acme/src")).rehashed
        there = await replayed(nc2, "acme/src", tmp_path / "there")
        await nc2.close()
    finally:
        elsewhere.stop()
    assert there.last_hash == source.events[-1].hash
    assert entries(tmp_path / "there") == entries(tmp_path / "src")
    # an existing target is refused, and nothing is appended to it
    again = await cli(nats_url, "import", str(export), "acme/dst", check=False)
    assert again.returncode == 1 and "ALREADY_EXISTS: Workspace acme/dst exists" in again.stderr
    assert (await dst.info()).version == 9


def _blob_altered(text: str) -> str:
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if '"record":"blob"' in line)
    record = json.loads(lines[i])
    data = record["data"]
    record["data"] = ("B" if data[0] == "A" else "A") + data[1:]  # always a different byte
    lines[i] = json.dumps(record)
    return "\n".join(lines) + "\n"


DAMAGES = [
    (lambda s: s.replace('"changed\\n"', '"chanGed\\n"'), "does not hash to the hash"),
    (lambda s: "\n".join(s.splitlines()[:-1]) + "\n", "it is truncated (no end record)"),
    (_blob_altered, "does not match its sha256"),
    (lambda s: s.replace('"record":"blob"', '"record":"nope"'), "line 3: "),
    (lambda s: s.replace('"format_version":1', '"format_version":9'), "version 9 is newer"),
]


async def test_a_damaged_export_is_refused_and_nothing_is_imported(
    services: StartReader, quill: Quill, tmp_path: Path, nats_url: str
) -> None:
    ws = quill.workspace("acme/damaged")
    await ws.create()
    await ws.write("blob.bin", BIG)
    await ws.write("notes.md", "changed\n")
    export = tmp_path / "export.jsonl"
    await exported(quill.nc, "acme/damaged", export)
    good = export.read_text()
    for damage, message in DAMAGES:
        export.write_text(damage(good))
        with pytest.raises(QuillError) as refused:
            await imported(quill.nc, export, "acme/undamaged")
        assert refused.value.code == ErrorCode.INVALID_ARGUMENT
        assert refused.value.message.startswith(f"{export} is not a valid export: ")
        assert message in refused.value.message
    assert await rpl.last_event(quill.nc.jetstream(), SUBJECTS.evt("acme", "undamaged")) is None
    refused_cli = await cli(nats_url, "import", str(export), "acme/undamaged", check=False)
    assert refused_cli.returncode == 2
    assert refused_cli.stderr == (
        f"quill: INVALID_ARGUMENT: {export} is not a valid export: format version 9 is newer\n"
    )


def doc_blocks() -> list[str]:
    text = (ROOT / "docs" / "replay.md").read_text()
    return re.findall(r"```bash\n(.*?)```", text, re.S)


async def quill_in_process(line: str, nats_url: str) -> str:
    """A ``quill ...`` line of a document, its arguments as bash gives them, run by the CLI in
    this process (in a thread: the services answer from this event loop). A new interpreter
    per line would cost more than the rest of the test together."""
    words = await asyncio.to_thread(
        subprocess.run, ["bash", "-c", f"printf '%s\\0' {line.removeprefix('quill ')}"],
        capture_output=True, check=True,
    )  # fmt: skip
    argv = [w.decode() for w in words.stdout.split(b"\0")[:-1]]
    env = {"QUILL_NATS_URL": nats_url}
    result = await asyncio.to_thread(CliRunner().invoke, main, argv, env=env)
    assert result.exit_code == 0, (line, result.output, result.exception)
    return result.stdout


async def test_docs_replay_examples_run_as_written(
    services: StartReader, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tour and the audit examples of docs/replay.md, line by line, as a user types them."""
    await services("reader-host-4242")
    monkeypatch.chdir(tmp_path)
    tour, audit, consumer = doc_blocks()
    out = []
    for line in [*tour.strip().splitlines(), audit.strip()]:
        out.append(await quill_in_process(line.split("  #")[0], nats_url))
    command = consumer.strip().replace("python examples/", f"{sys.executable} {ROOT}/examples/")
    env = {**os.environ, "QUILL_NATS_URL": nats_url}
    done = await asyncio.to_thread(
        subprocess.run, ["bash", "-c", command], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "draft-1" / "ch1.md").read_text() == "# One\n"  # what the run read
    assert (tmp_path / "book" / "ch1.md").read_text() == "# One, revised\n"
    assert out[5].splitlines()[1].split()[:3] == ["draft-1", "2", "ended"]
    assert out[6].startswith("replayed acme/book version 5 into book: 1 file, ")
    assert "reader reader-host-4242: ok (tree hash " in out[8]
    assert out[10].startswith("imported acme/book as acme/book-copy: version 5, 5 events")
    assert "cmd.create" in out[11]  # the audit records of the last 10 minutes
    assert len((tmp_path / "audit.jsonl").read_text().splitlines()) == 3


async def test_a_log_that_does_not_verify_is_refused(tmp_path: Path) -> None:
    """Events appended behind the writer's back are found out. (A server of its own: the
    readers of the other tests follow theirs.)"""
    server = NatsServer(tmp_path / "nats").start()
    try:
        nc = await bus.connect(server.url, "test-forger")
        await bus.ensure_streams(nc, SUBJECTS)
        assert await rpl.live_readers(nc, SUBJECTS) == []  # "no responders" is not a reader
        # v3 of acme/chain names v1 as the event before it; v3 of acme/payload chains right
        # but carries a hash that is not its payload's; v3 of acme/content is a whole event
        # whose text is not the sha256 it names (so the tree hash it records still matches)
        cases = {"chain": (0, None, None), "payload": (-1, "0" * 64, None),
                 "content": (-1, None, "evil\n")}  # fmt: skip
        for name, (before, carried, text) in cases.items():
            log = LogBuilder("acme", name)
            log.run(rq.CreateWorkspace(), "create")
            log.run(rq.WriteFile(path="a.txt", content="a\n"))
            items = [(codec.encode(c.event), f"{name}-{c.seq}", c.hash) for c in log.log]
            subject = SUBJECTS.evt("acme", name)
            last = await rpl.append_batch(nc, subject, 0, items, 1)
            assert (await rpl.replay(nc.jetstream(), SUBJECTS, "acme", name)).version == 2
            v2 = log.log[-1].event
            forged = msgspec.structs.replace(v2, version=3, prev_hash=log.log[before].hash)
            if text is not None:
                changes = [msgspec.structs.replace(v2.changes[0], text=text)]
                forged = msgspec.structs.replace(forged, changes=changes)
            payload = codec.encode(forged)
            digest = carried or hashlib.sha256(payload).hexdigest()
            await rpl.append_batch(nc, subject, last, [(payload, f"{name}-3", digest)], 3)
        broken = await cli(
            server.url, "replay", "acme/chain", "--out", str(tmp_path / "x"), check=False
        )
        assert (broken.returncode, broken.stderr) == (
            1,
            "quill: INTERNAL: Hash chain broken: prev_hash is not the previous event's hash "
            "(version 3)\n",
        )
        assert not (tmp_path / "x").exists()
        with pytest.raises(QuillError) as refused:
            await rpl.replay(nc.jetstream(), SUBJECTS, "acme", "payload", to_version=3)
        message = "An event does not hash to the hash recorded with it (version 3)"
        assert (refused.value.code, refused.value.message) == (ErrorCode.INTERNAL, message)
        evil = "The content of a.txt does not match its sha256 (version 3)"
        with pytest.raises(QuillError) as read:
            await replayed(nc, "acme/content", tmp_path / "evil")
        assert read.value.message == evil
        assert not (tmp_path / "evil").exists()
        await nc.close()
    finally:
        server.stop()


async def blob_consumers(nc: NATS) -> int:
    info = await nc.jetstream().stream_info("OBJ_WS_BLOBS")
    return int(info.state.consumer_count)


async def test_thousands_of_contents_in_ws_blobs_are_read_without_a_consumer(
    services: StartReader, quill: Quill, tmp_path: Path
) -> None:
    """nats-py's object store made one consumer per get, which outlived it on the server: the
    writer deciding an apply that names 1,100 blobs (an executor's capture of a big command)
    logged ``BadRequestError`` (``maximum consumers limit reached``, the server's 1,000 per
    stream) six times, and export and replay of such a workspace failed. Every get is now a
    direct get: the apply, the export and the replay read them all, no consumer is left."""
    js, items = quill.nc.jetstream(), []
    blobs = Blobs(js).of("acme", "many-blobs")
    for n in range(1_100):
        data = f"content {n}\n".encode() * 3
        sha = hashlib.sha256(data).hexdigest()
        await blobs.put(sha, data)
        items.append(rq.PutChange(path=f"d{n % 7}/f{n}.txt", blob=sha))
    ws = quill.workspace("acme/many-blobs")
    await ws.create()
    await ws.apply(items)
    assert await blob_consumers(quill.nc) == 0
    # the writer inlined them in the event: export and replay find them in WS_BLOBS only if
    # the event keeps them there, so also read every one back directly
    fresh = Blobs(js).of("acme", "many-blobs")
    for item in items:
        assert item.blob is not None
        assert hashlib.sha256(await fresh.get(item.blob)).hexdigest() == item.blob
    moved = await exported(quill.nc, "acme/many-blobs", tmp_path / "x.jsonl")
    fold = await replayed(quill.nc, "acme/many-blobs", tmp_path / "tree")
    assert moved.version == fold.version == ws.last_version
    assert len(list((tmp_path / "tree").rglob("*.txt"))) == 1_100
    assert await blob_consumers(quill.nc) == 0


async def test_a_corrupt_object_in_ws_blobs_is_refused(quill: Quill) -> None:
    """Chunks that do not hash to the digest the object's info records are refused."""
    from infra.blobs import _meta_subject, object_info

    js = quill.nc.jetstream()
    data = b"the right content\n"
    sha = hashlib.sha256(data).hexdigest()
    blobs = Blobs(js).of("acme", "corrupt")
    await blobs.put(sha, data)
    info = await object_info(js, blobs.name(sha))
    assert info is not None
    raw = await js.get_last_msg("OBJ_WS_BLOBS", _meta_subject(blobs.name(sha)))
    meta = json.loads(raw.data or b"")
    meta["digest"] = "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(b"x").digest()).decode()
    await js.publish(_meta_subject(blobs.name(sha)), json.dumps(meta).encode())
    with pytest.raises(QuillError) as bad:
        await Blobs(js).of("acme", "corrupt").get(sha)
    assert bad.value.code == ErrorCode.INTERNAL


def test_nats_errors_say_what_the_server_said() -> None:
    """A refusal is named as the server gave it, not blamed on permissions (the consumer
    limit read 'needs JetStream access'); no answer at all still points at access."""
    from nats.js.errors import BadRequestError

    with pytest.raises(QuillError) as refused, rpl.nats_errors("Reading the log of a/b"):
        raise BadRequestError(
            code=400, err_code=10026, description="maximum consumers limit reached"
        )
    assert "maximum consumers limit reached" in refused.value.message
    assert "access" not in refused.value.message
    with pytest.raises(QuillError) as silent, rpl.nats_errors("Reading the log of a/b"):
        raise TimeoutError
    assert "access" in silent.value.message
