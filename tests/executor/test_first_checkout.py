"""A new checkout built from a reader's tree (``infra.exec.seed``) holds the workspace as the
log does, not its files only: a lock held by another session, an archive and the files left
uncommitted are what they would be had the log been replayed. Each case runs on an executor
that has never seen the workspace (both providers)."""

from __future__ import annotations

import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from infra.exec import checkout as checkouts
from quill.client import Quill
from services.executor.app import ExecutorConfig
from tests.executor.conftest import StartExecutor
from tests.helpers import start_executor


async def test_a_lock_of_another_session_refuses_the_first_command(
    stack: StartExecutor, nats_url: str, name: str
) -> None:
    alice = await Quill.connect(nats_url, actor="alice", session="s-alice")
    bob = await Quill.connect(nats_url, actor="bob", session="s-bob", retries=0)
    try:
        wa = alice.workspace(name)
        await wa.create()
        await wa.write("a.txt", "a\n")
        await wa.lock(ttl_ms=60_000)
        await wa.write("b.txt", "b\n")
        seeded = checkouts.COUNTS["seeded"]
        await stack()
        with pytest.raises(QuillError) as refused:
            await bob.workspace(name).exec("true")
        assert refused.value.code == ErrorCode.LOCKED
        assert checkouts.COUNTS["seeded"] == seeded + 1  # built from the reader's tree
        assert (await wa.exec("cat a.txt b.txt")).stdout == "a\nb\n"
    finally:
        await alice.close()
        await bob.close()


async def test_an_archive_refuses_the_first_command(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    ws = quill.workspace(name)
    await ws.create()
    await ws.write("a.txt", "a\n")
    await ws.archive("done")
    await stack()
    with pytest.raises(QuillError) as refused:
        await ws.exec("true")
    assert refused.value.code == ErrorCode.WORKSPACE_ARCHIVED


async def test_what_was_left_uncommitted_is_known_to_the_next_executor(
    stack: StartExecutor, quill: Quill, nats_url: str, tmp_path: Path, provider: str
) -> None:
    ws = quill.workspace(f"acme/left-{uuid.uuid4().hex[:8]}")
    await ws.create(limits=LimitsPatch(max_file_bytes=4096))
    config = ExecutorConfig(sandbox=provider)
    async with AsyncExitStack() as es:
        await start_executor(es, nats_url, tmp_path / "first", config)
        first = await ws.exec("head -c 10000 /dev/zero > big.bin && ln -s a.txt link")
    assert sorted(s.path for s in first.changes.skipped) == ["big.bin", "link"]
    with pytest.raises(QuillError) as why:
        await ws.read_text("big.bin")
    assert "uncommitted" in why.value.details
    before = (await ws.info()).version
    async with AsyncExitStack() as es:  # a new executor: a checkout built from the reader
        await start_executor(es, nats_url, tmp_path / "second", config)
        second = await ws.exec("true")
        # it holds neither file: one apply records that, once
        assert second.changes.version == before + 1 and not second.changes.committed
        with pytest.raises(QuillError) as gone:
            await ws.read_text("big.bin")
        assert "uncommitted" not in gone.value.details
        third = await ws.exec("true")
        assert third.changes.version == before + 1
