"""A command's own commit is taken from the writer's answer, not read back from the log (issue 31
item 5): the checkout folds its own event from the log's last message, which the next command
reads anyway, when nothing came between; otherwise it reads the log as before. Counted by the
executor's ping (``io``: ``events`` applied from the log, ``own`` commits folded from the
last message), and checked against what the files hold. A real nats-server, writer, reader and
executor, both sandboxes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from quill.client import Quill, Workspace
from services.executor.app import Executor, ExecutorConfig
from tests import helpers
from tests.executor.conftest import StartExecutor
from tests.helpers import start_executor, start_writer_and_reader

SECRET = "sk-live-0123456789abcdef"


def io(executor: Executor) -> Counter[str]:
    return Counter(executor.info()["io"])


def grown(before: Counter[str], after: Counter[str], key: str) -> int:
    return after[key] - before[key]


async def checked_out(stack: StartExecutor, quill: Quill, name: str) -> tuple[Executor, Workspace]:
    """An executor, and a workspace it has a checkout of (a command committed ``a.txt``)."""
    executor = await stack()
    ws = quill.workspace(name)
    await ws.create()
    await ws.exec("echo 0 > a.txt")
    return executor, ws


async def test_a_commands_own_commit_is_not_read_back(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    executor, ws = await checked_out(stack, quill, name)  # its own commit...
    await ws.exec("true")  # ... folded as this one starts
    before = io(executor)
    ran = await ws.exec("echo 1 > a.txt")
    answered = io(executor)
    assert ran.changes.committed and ran.changes.version == ran.changes.base_version + 1
    # nothing read from the log after the writer answered (before: the commit's own event)
    assert grown(before, answered, "events") == 0, (before, answered)
    seen = await ws.exec("cat a.txt; ls")
    after = io(executor)
    assert seen.stdout == "1\na.txt\n"
    assert seen.changes.base_version == ran.changes.version
    # folded as the next command started, from the last message it read anyway
    assert grown(answered, after, "own") == 1 and grown(answered, after, "events") == 1
    assert await ws.read_text("a.txt") == "1\n"


async def test_a_write_after_the_commit_is_read_from_the_log(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    executor, ws = await checked_out(stack, quill, name)
    ran = await ws.exec("echo 1 > a.txt")
    await ws.write("b.txt", "theirs\n")  # the last message is not the command's own any more
    before = io(executor)
    seen = await ws.exec("cat a.txt b.txt")
    after = io(executor)
    assert seen.stdout == "1\ntheirs\n"
    assert seen.changes.base_version == ran.changes.version + 1
    assert grown(before, after, "own") == 0 and grown(before, after, "events") == 2


async def test_a_write_while_the_command_runs_is_synced_at_once(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    """The writer answers the command's commit with a version past the one after its base:
    others wrote between, so the checkout reads the log then, as before."""
    executor, ws = await checked_out(stack, quill, name)
    gate, started = helpers.Gate(), asyncio.Event()

    def seen(_: str, chunk: bytes) -> None:
        if b"go" in chunk:
            started.set()

    command = f"echo 2 > a.txt; echo go; {gate.wait}"
    running = asyncio.create_task(ws.exec(command, on_output=seen))
    await asyncio.wait_for(started.wait(), 30)
    await ws.write("b.txt", "meanwhile\n")
    before = io(executor)
    await gate.open()
    ran = await running
    answered = io(executor)
    assert ran.changes.version == ran.changes.base_version + 2
    assert grown(before, answered, "events") == 2  # the write and its own commit, read now
    after = await ws.exec("cat a.txt b.txt")
    assert after.stdout == "2\nmeanwhile\n"
    assert grown(answered, io(executor), "events") == 0


async def test_what_the_writer_redacts_is_what_the_checkout_holds_next(
    nats_url: str, nc: NATS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer commits a command's file with a registered secret redacted: the checkout
    does not keep the secret the command wrote, though its own commit is not read back after
    the answer (the next command folds the event as committed)."""
    registry = tmp_path / "secrets.toml"
    registry.write_text(f'[secrets]\nopenai = "{SECRET}"\n')
    monkeypatch.setenv("QUILL_SECRETS", str(registry))
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)
        config = ExecutorConfig(sandbox="local")
        executor = await start_executor(stack, nats_url, tmp_path / "executor", config)
        quill = await Quill.connect(nats_url, actor="agent")
        stack.push_async_callback(quill.close)
        ws = quill.workspace("acme/own-redacted")
        await ws.create()
        await ws.exec("true")
        ran = await ws.exec('echo "K=$KEY" > leak.txt', env={"KEY": SECRET})
        assert ran.changes.version == ran.changes.base_version + 1
        before = io(executor)
        held = await ws.exec("grep -c REDACTED leak.txt; wc -c < leak.txt")
        assert grown(before, io(executor), "own") == 1
        assert held.stdout == f"1\n{len('K=[REDACTED:openai]') + 1}\n", held
        assert await ws.read_text("leak.txt") == "K=[REDACTED:openai]\n"
