"""A file a command made that Quill did not commit (over ``max_file_bytes``, a symlink, an
invalid name): the file tools say why it is not there, through the log, on any replica.

A real nats-server, a writer, a reader and an executor of each provider (bwrap over an overlay,
local walking its checkout); the SDK and a bare nats-py client.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from contracts.subjects import HEADER_REQUEST_ID, Subjects
from quill.client import Quill, Workspace
from quill_cli.tools import replay as rpl
from services.executor.app import ExecutorConfig
from tests.helpers import start_executor, start_reader, start_writer
from tests.integration.test_compaction import KEEP, WRITES, compacted

LIMIT = 4096
"""``max_file_bytes`` of the test workspaces: a 10,000-byte file is over it."""
BIG = "head -c 10000 /dev/zero > big.bin"
BIG_REASON = "over max_file_bytes (9.8 KiB > 4 KiB)"


class Services:
    """A writer, a reader and an executor; the reader and the writer can be replaced by fresh
    ones (empty data directories: rebuilt from the log)."""

    def __init__(self, nats_url: str, tmp: Path) -> None:
        self.nats_url, self.tmp = nats_url, tmp
        self.writers, self.readers = AsyncExitStack(), AsyncExitStack()
        self.count = 0

    async def fresh_reader(self) -> None:
        await self.readers.aclose()
        self.count += 1
        self.readers = AsyncExitStack()
        await start_reader(self.readers, self.nats_url, self.tmp / f"reader{self.count}")

    async def fresh_writer(self) -> None:
        await self.writers.aclose()
        self.count += 1
        self.writers = AsyncExitStack()
        await start_writer(self.writers, self.nats_url, self.tmp / f"writer{self.count}")


@pytest_asyncio.fixture
async def services(nats_url: str, tmp_path: Path, provider: str) -> AsyncIterator[Services]:
    """Both providers (``tests/executor/conftest.py``): bwrap captures over an overlay, local
    walks the checkout."""
    async with AsyncExitStack() as es:
        s = Services(nats_url, tmp_path)
        await s.fresh_writer()
        await s.fresh_reader()
        es.push_async_callback(lambda: s.writers.aclose())  # the current ones, when done
        es.push_async_callback(lambda: s.readers.aclose())
        config = ExecutorConfig(sandbox=provider)
        await start_executor(es, nats_url, tmp_path / "executor", config)
        yield s


async def workspace(quill: Quill) -> Workspace:
    ws = quill.workspace(f"acme/unc-{uuid.uuid4().hex[:8]}")
    await ws.create(limits=LimitsPatch(max_file_bytes=LIMIT))
    await ws.write("kept.txt", "kept\n")
    return ws


async def refused(call: Any) -> QuillError:
    with pytest.raises(QuillError) as caught:
        await call
    return caught.value


def uncommitted(err: QuillError) -> dict[str, Any]:
    found = err.details.get("uncommitted")
    assert isinstance(found, dict), err.details
    return found


async def test_sdk_read_stat_edit_say_why(services: Services, quill: Quill) -> None:
    ws = await workspace(quill)
    r = await ws.exec(f"{BIG} && ln -s kept.txt link && echo hi > ok.txt")
    assert r.exit_code == 0 and [p.path for p in r.changes.paths] == ["ok.txt"]
    assert sorted((s.path, s.reason) for s in r.changes.skipped) == [
        ("big.bin", BIG_REASON),
        ("link", "symlink"),
    ]
    for call in (ws.read("big.bin"), ws.stat("big.bin"), ws.edit("big.bin", "a", "b")):
        err = await refused(call)
        assert err.code == ErrorCode.FILE_NOT_FOUND
        assert err.message.startswith("File not found: big.bin: it exists in the sandbox") or (
            err.message.startswith("Path not found: big.bin: it exists")
        ), err.message
        assert f"was not committed: {BIG_REASON}." in err.message
        found = uncommitted(err)
        assert found["reason"] == BIG_REASON and found["by_command"]
        assert not found["by_command"].endswith(":changes")  # the command's id
        assert found["version"] == r.changes.version
    link = await refused(ws.read_text("link"))
    assert link.code == ErrorCode.FILE_NOT_FOUND and "not committed: symlink" in link.message
    below = await refused(ws.read("link/x"))  # below a symlink: its parent is named
    assert "its parent link exists in the sandbox" in below.message
    plain = await refused(ws.read("never.txt"))  # nothing made it: the plain answer
    assert plain.message == "File not found: never.txt" and "uncommitted" not in plain.details
    still = await ws.exec("ls")  # the checkout keeps them, as said
    assert "big.bin" in still.stdout and "link" in still.stdout


async def test_invalid_name_says_why(services: Services, quill: Quill) -> None:
    ws = await workspace(quill)
    r = await ws.exec("echo x > $'bad\\x01name'")
    assert [s.reason.split(":")[0] for s in r.changes.skipped] == ["invalid name"]
    shown = r.changes.skipped[0].path
    err = await refused(ws.read("bad\x01name"))
    assert err.code == ErrorCode.INVALID_ARGUMENT  # the rule's answer, and why it is there
    assert f"{shown}" in err.message and "exists in the sandbox but was not committed" in (
        err.message
    )
    assert uncommitted(err)["path"] == shown
    edit = await refused(ws.edit("bad\x01name", "x", "y"))
    assert "exists in the sandbox but was not committed: invalid name" in edit.message


async def test_gone_once_removed_or_committed(services: Services, quill: Quill) -> None:
    ws = await workspace(quill)
    made = await ws.exec(f"{BIG} && ln -s kept.txt link")
    # a command that changes nothing but removes one: its set is recorded (a new version)
    gone = await ws.exec("rm link")
    assert not gone.changes.committed and gone.changes.version == made.changes.version + 1
    err = await refused(ws.read("link"))
    assert err.message == "File not found: link" and "uncommitted" not in err.details
    assert "uncommitted" in (await refused(ws.read("big.bin"))).details
    # the same set again: no new version
    again = await ws.exec("true")
    assert again.changes.version == gone.changes.version
    # made committable: committed, and the message is gone
    small = await ws.exec("head -c 100 /dev/zero > big.bin")
    assert [p.path for p in small.changes.paths] == ["big.bin"]
    assert (await ws.stat("big.bin")).size == 100
    await ws.delete("big.bin")
    err = await refused(ws.read("big.bin"))
    assert err.message == "File not found: big.bin" and "uncommitted" not in err.details


async def test_replicas_rebuilt_from_the_log(
    services: Services, quill: Quill, tmp_path: Path
) -> None:
    ws = await workspace(quill)
    await ws.exec(f"{BIG} && ln -s kept.txt link")
    before = await refused(ws.read("big.bin"))
    edit_before = await refused(ws.edit("link", "a", "b"))
    await services.fresh_reader()  # a reader built from scratch from the log
    await services.fresh_writer()
    after = await refused(ws.read("big.bin"))
    assert (after.code, after.message, after.details) == (
        before.code,
        before.message,
        before.details,
    )
    edit_after = await refused(ws.edit("link", "a", "b"))
    assert edit_after.message == edit_before.message and "symlink" in edit_after.message
    # the log with the new field replays, exports and verifies (hash chain, tree hashes)
    js = quill.nc.jetstream()
    fold = await rpl.replay(js, Subjects(), ws.tenant, ws.name)
    assert fold.version == ws.last_version
    export = tmp_path / "ws.quill"
    with open(export, "wb") as out:
        await rpl.export(js, Subjects(), rpl.Fold(ws.tenant, ws.name), out)
    _, verified, _ = rpl.verify_file(lambda: open(export, "rb"), str(export))
    assert verified.version == fold.version


async def test_bare_nats(services: Services, quill: Quill, nc: NATS) -> None:
    ws = await workspace(quill)
    command_id = f"cmd-{uuid.uuid4().hex}"
    run = await nc.request(
        f"ws.exec.{ws.tenant}.{ws.name}.run",
        json.dumps({"command": BIG}).encode(),
        timeout=60,
        headers={HEADER_REQUEST_ID: command_id},
    )
    reply = json.loads(run.data)
    assert reply["ok"], reply
    assert reply["result"]["changes"]["skipped"] == [{"path": "big.bin", "reason": BIG_REASON}]
    version = reply["version"]
    for kind, op, body in (
        ("qry", "read", {"path": "big.bin", "min_version": version}),
        ("qry", "stat", {"path": "big.bin", "min_version": version}),
        ("cmd", "edit", {"path": "big.bin", "old_string": "a", "new_string": "b"}),
    ):
        msg = await nc.request(
            f"ws.{kind}.{ws.tenant}.{ws.name}.{op}", json.dumps(body).encode(), timeout=10
        )
        answer = json.loads(msg.data)
        assert not answer["ok"] and answer["error"]["code"] == "FILE_NOT_FOUND", answer
        assert "exists in the sandbox but was not committed" in answer["error"]["message"]
        details = answer["error"]["details"]["uncommitted"]
        assert details["reason"] == BIG_REASON and details["version"] == version
        assert details["by_command"] == command_id


async def test_kept_across_compaction(services: Services, quill: Quill) -> None:
    ws = quill.workspace(f"acme/unc-{uuid.uuid4().hex[:8]}")
    await ws.create(limits=LimitsPatch(max_file_bytes=LIMIT, max_versions=KEEP))
    await ws.exec(BIG)
    before = await refused(ws.read("big.bin"))
    await compacted(ws, WRITES)  # the log before the compaction is purged
    await services.fresh_reader()  # rebuilt from the compaction's manifest
    await services.fresh_writer()
    after = await refused(ws.read("big.bin"))
    assert (after.message, after.details) == (before.message, before.details)
    edit = await refused(ws.edit("big.bin", "a", "b"))
    assert f"was not committed: {BIG_REASON}" in edit.message
    # the executor's checkout, behind the purged log, is rebuilt from the manifest: the file
    # is gone from the sandbox, and the next command records that
    ls = await ws.exec("ls")
    assert "big.bin" not in ls.stdout and ls.changes.version == ls.changes.base_version + 1
    err = await refused(ws.read("big.bin"))
    assert err.message == "File not found: big.bin" and "uncommitted" not in err.details
