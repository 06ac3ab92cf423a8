"""A checkout against a real log: materialised from events, changes captured and committed as
one ``apply``, and kept in step afterwards. The tests change ``tree/`` directly, as a command
in the sandbox would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from contracts import replies as rp
from contracts import requests as rq
from contracts.subjects import Origin, Subjects
from infra.blobs import Blobs
from infra.exec.checkout import Checkout
from infra.exec.commit import commit
from quill.client import Quill
from tests.conftest import StartReader
from tests.helpers import need_bwrap, new_workspace, start_writer_and_reader


def open_checkout(nc: NATS, home: Path, workspace: str, quill: Quill | None = None) -> Checkout:
    js = nc.jetstream()

    async def fetch(path: str, version: int) -> bytes:
        assert quill is not None, "this test needs no reader"
        return await quill.workspace(f"acme/{workspace}").read_bytes(path, version=version)

    co = Checkout(home, "acme", workspace, js, Subjects(), Blobs(js), fetch)
    co.open()
    return co


@pytest.fixture
def checkout(nc: NATS, tmp_path: Path, request: pytest.FixtureRequest) -> Checkout:
    """A checkout of the workspace ``acme/<this test's name>``."""
    name = request.node.name.removeprefix("test_")[:40].replace("_", "-")
    return open_checkout(nc, tmp_path / "co", name)


async def run_commit(quill: Quill, co: Checkout, nc: NATS) -> rp.CapturedChanges:
    base = co.version
    captured = co.capture()
    origin = Origin("req-1", actor="agent-7")
    blobs = Blobs(nc.jetstream())
    changes = await commit(quill, origin, "acme", co.workspace, co, captured, base, "$ test", blobs)
    co.save()
    await co.sync()
    return changes


async def test_materialise_capture_commit(
    services: StartReader, quill: Quill, nc: NATS, checkout: Checkout
) -> None:
    ws = await new_workspace(services, quill, f"acme/{checkout.workspace}")
    big = os.urandom(100_000)  # over the inline size: goes by blob
    await ws.apply(
        [
            rq.PutChange(path="src/app.py", content="print('hi')\n"),
            rq.PutChange(path="run.sh", content="#!/bin/sh\n", executable=True),
            rq.PutChange(path="data/big.bin", data=big),
            rq.MkdirChange(path="empty"),
        ]
    )
    await checkout.sync()
    tree = checkout.tree
    assert (tree / "src/app.py").read_text() == "print('hi')\n"
    assert (tree / "data/big.bin").read_bytes() == big
    assert os.access(tree / "run.sh", os.X_OK) and (tree / "empty").is_dir()
    assert checkout.capture().changes == []  # nothing changed since

    (tree / "src/app.py").write_text("print('bye')\n")  # modified
    (tree / "src/new.py").write_text("x = 1\n")  # created
    (tree / "run.sh").unlink()  # deleted
    (tree / "empty").rmdir()
    (tree / "node_modules/dep").mkdir(parents=True)  # ignored by default
    (tree / "node_modules/dep/index.js").write_text("ignored\n")
    (tree / "link").symlink_to("/etc/passwd")  # never followed
    (tree / "out").mkdir()  # a new empty directory
    changes = await run_commit(quill, checkout, nc)
    assert changes.committed and changes.base_version == 2
    got = {(p.path, p.change, p.kind) for p in changes.paths}
    assert got == {
        ("src/app.py", "modified", "file"),
        ("src/new.py", "created", "file"),
        ("run.sh", "deleted", "file"),
        ("empty", "deleted", "directory"),
        ("out", "created", "directory"),
    }
    assert [(s.path, s.reason) for s in changes.skipped] == [("link", "symlink")]
    assert changes.ignored == ["node_modules"]
    ws.last_version = changes.version
    assert await ws.read_text("src/app.py") == "print('bye')\n"
    assert (await ws.history(limit=1)).revisions[0].actor == "agent-7"
    assert checkout.version == changes.version

    # Nothing changed: nothing committed, nothing re-reported.
    again = await run_commit(quill, checkout, nc)
    assert not again.committed and again.skipped == [] and again.ignored == []


async def test_conflicts_leave_the_other_change_in_place(
    services: StartReader, quill: Quill, nc: NATS, checkout: Checkout
) -> None:
    ws = await new_workspace(services, quill, f"acme/{checkout.workspace}")
    await ws.write("shared.txt", "v1\n")
    await checkout.sync()
    base = checkout.version
    await ws.write("shared.txt", "someone else\n")  # meanwhile, after base
    (checkout.tree / "shared.txt").write_text("the command's\n")
    (checkout.tree / "mine.txt").write_text("mine\n")
    changes = await run_commit(quill, checkout, nc)
    assert changes.committed and changes.base_version == base
    assert [c.path for c in changes.conflicts] == ["shared.txt"]
    assert [p.path for p in changes.paths] == ["mine.txt"]
    assert (checkout.tree / "shared.txt").read_text() == "someone else\n"  # synced back
    ws.last_version = changes.version
    assert await ws.read_text("shared.txt") == "someone else\n"


async def test_many_files_are_one_event_and_a_reopened_checkout_resumes(
    services: StartReader, quill: Quill, nc: NATS, checkout: Checkout, tmp_path: Path
) -> None:
    ws = await new_workspace(services, quill, f"acme/{checkout.workspace}")
    await checkout.sync()
    gen = checkout.tree / "gen"
    gen.mkdir()
    for i in range(2000):
        (gen / f"{i:04}.txt").write_text(f"{i}\n" * 100)
    changes = await run_commit(quill, checkout, nc)
    assert changes.committed and changes.total == 2000
    assert changes.version == 2  # one event
    ws.last_version = changes.version  # as the client of the command learns it
    assert await ws.read_text("gen/1999.txt") == "1999\n" * 100

    reopened = open_checkout(nc, tmp_path / "co", checkout.workspace)
    assert reopened.version == 2 and reopened.capture().changes == []
    (reopened.tree / "dirty").touch()  # as a crash mid-command would leave it
    (reopened.home / "dirty").touch()
    crashed = open_checkout(nc, tmp_path / "co", checkout.workspace)
    assert crashed.version == 0  # rebuilt from the log
    await crashed.sync()
    assert crashed.version == 2 and not (crashed.tree / "dirty").exists()
    assert (crashed.tree / "gen/0007.txt").read_text() == "7\n" * 100


async def test_setuid_bits_are_stripped_not_kept(
    services: StartReader, quill: Quill, nc: NATS, checkout: Checkout
) -> None:
    ws = await new_workspace(services, quill, f"acme/{checkout.workspace}")
    await checkout.sync()
    tool = checkout.tree / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o6755)
    changes = await run_commit(quill, checkout, nc)
    assert [p.path for p in changes.paths] == ["tool"]
    assert tool.stat().st_mode & 0o7777 == 0o755
    ws.last_version = changes.version
    assert (await ws.stat("tool")).permissions == "755"


async def test_moves_and_restores_bring_their_content(
    services: StartReader, quill: Quill, nc: NATS, tmp_path: Path
) -> None:
    """A move or a restore names content the log carried before (by sha256, no bytes)."""
    ws = await new_workspace(services, quill, "acme/refs")
    await ws.write("a.txt", "first\n")
    await ws.write("b.txt", "bee\n")
    v = ws.last_version
    await ws.write("a.txt", "second\n")
    await ws.move("b.txt", "moved/b.txt")
    await ws.restore(v, "a.txt")  # back to "first", content by reference
    fresh = open_checkout(nc, tmp_path / "fresh", "refs", quill)  # from nothing: by a reader
    await fresh.sync()
    assert (fresh.tree / "a.txt").read_text() == "first\n"
    assert (fresh.tree / "moved/b.txt").read_text() == "bee\n"
    assert not (fresh.tree / "b.txt").exists() and fresh.capture().changes == []

    # A move of a file the checkout holds needs no reader: the bytes are on its disk.
    own = open_checkout(nc, tmp_path / "fresh", "refs")  # reopened, without a reader
    await ws.move("a.txt", "c.txt")
    await own.sync()
    assert (own.tree / "c.txt").read_text() == "first\n" and not (own.tree / "a.txt").exists()


async def test_sync_replaces_links_and_never_follows_them(
    services: StartReader, quill: Quill, nc: NATS, checkout: Checkout, tmp_path: Path
) -> None:
    """As a command could leave the tree: a link at the old temporary name, a tracked
    directory swapped for a link to a host directory, a hard link to a tracked file."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "file").write_text("host\n")
    ws = await new_workspace(services, quill, f"acme/{checkout.workspace}")
    await ws.write("d/x.txt", "x\n")
    await ws.write("a.txt", "a\n")
    await checkout.sync()
    tree = checkout.tree
    (tree / ".a.txt.quill-tmp").symlink_to(host / "file")
    (tree / "d/x.txt").unlink()
    (tree / "d").rmdir()
    (tree / "d").symlink_to(host)
    os.link(tree / "a.txt", tree / "hard")
    await ws.write("a.txt", "a2\n")
    await ws.write("d/new.txt", "new\n")
    await ws.apply([rq.PutChange(path="a.txt", content="a2\n", executable=True)])
    await checkout.sync()
    assert sorted(p.name for p in host.iterdir()) == ["file"]
    assert (host / "file").read_text() == "host\n"
    assert (tree / "d").is_dir() and not (tree / "d").is_symlink()
    assert (tree / "d/new.txt").read_text() == "new\n"
    assert (tree / "a.txt").read_text() == "a2\n" and os.access(tree / "a.txt", os.X_OK)
    assert (tree / "hard").read_text() == "a\n" and not os.access(tree / "hard", os.X_OK)


async def test_capture_reads_nothing_through_a_link(
    services: StartReader, quill: Quill, nc: NATS, checkout: Checkout, tmp_path: Path
) -> None:
    host = tmp_path / "host-ignore"
    host.write_text("*.txt\n")
    await new_workspace(services, quill, f"acme/{checkout.workspace}")
    await checkout.sync()
    (checkout.tree / ".quillignore").symlink_to(host)
    (checkout.tree / "key").symlink_to(host)
    (checkout.tree / "kept.txt").write_text("kept\n")
    assert not checkout.ignore_patterns().match("kept.txt")
    changes = await run_commit(quill, checkout, nc)
    assert [p.path for p in changes.paths] == ["kept.txt"]  # .quillignore was not read
    assert sorted(s.path for s in changes.skipped) == [".quillignore", "key"]


BAD_NAMES = (
    # (how bash makes it, how `skipped` shows it, the start of the reason)
    ("$'bad\\xff.txt'", "bad\\xff.txt", "not valid UTF-8 (byte 0xFF)"),
    ("$'new\\nline.txt'", "new\\nline.txt", "U+000A is a control character"),
    ("$'evil\\xe2\\x80\\xaetxt.md'", "evil\\u202etxt.md", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("$'zero\\xe2\\x80\\x8bwidth'", "zero\\u200bwidth", "U+200B ZERO WIDTH SPACE"),
    ("$'cafe\\xcc\\x81.txt'", "cafe\u0301.txt", "not in Unicode NFC"),
)


async def test_names_a_command_makes_that_break_the_rule_are_skipped_the_rest_commits(
    nats_url: str, tmp_path: Path, quill: Quill
) -> None:
    """Through a real bwrap executor: a command makes files whose names are not valid
    workspace names (not UTF-8, a newline, bidi, zero-width, not NFC; a directory with such a
    name and a file in it) beside normal ones. The normal ones commit; each bad one is in
    ``skipped``, shown escaped, with the reason; the next command works and says nothing
    more of them."""
    from contextlib import AsyncExitStack

    from services.executor.app import ExecutorConfig
    from tests.helpers import start_executor

    need_bwrap()
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        await start_executor(es, nats_url, tmp_path / "ex", ExecutorConfig(sandbox="bwrap"))
        ws = quill.workspace("acme/bad-names")
        await ws.create()
        makes = "; ".join(f"printf x > {bash}" for bash, _, _ in BAD_NAMES)
        command = (
            f"{makes}; mkdir $'dir\\xff' && printf y > $'dir\\xff/inner.txt'; "
            "printf ok > ok.txt; mkdir sub && printf ok > sub/ok.txt"
        )
        result = await ws.exec(command)
        assert result.exit_code == 0, result.stderr
        changes = result.changes
        assert changes.error is None and changes.committed
        assert sorted(p.path for p in changes.paths) == ["ok.txt", "sub/ok.txt"]
        skipped = {s.path: s.reason for s in changes.skipped}
        expected = {shown: reason for _, shown, reason in BAD_NAMES}
        expected["dir\\xff"] = "not valid UTF-8 (byte 0xFF)"
        assert sorted(skipped) == sorted(expected)
        for shown, reason in expected.items():
            assert skipped[shown].startswith(f"invalid name: {reason}"), skipped[shown]
        ws.last_version = changes.version
        assert await ws.read_text("sub/ok.txt") == "ok"
        listed = {f.path for f in (await ws.list("", recursive=True)).entries}
        assert listed == {"ok.txt", "sub", "sub/ok.txt"}

        later = await ws.exec("printf later > later.txt; find . -mindepth 1 -maxdepth 1 -printf x")
        assert later.exit_code == 0 and later.changes.error is None
        assert [p.path for p in later.changes.paths] == ["later.txt"]
        assert later.changes.skipped == []  # reported once, while unchanged
        assert len(later.stdout) == 9  # the bad names stay in the checkout
        ws.last_version = later.changes.version
        assert await ws.read_text("later.txt") == "later"
