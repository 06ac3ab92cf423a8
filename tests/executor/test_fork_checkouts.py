"""A fork's first checkout on an executor that holds its source's (issue 33, item 3): made of
hard links to the source's files (``infra.exec.links``), then the fork's own events: what it
reads and writes is the files changed since the fork point, not the tree, counted
(``infra.safefs.COUNTS``, ``infra.exec.checkout.COUNTS``, the executor's ping), not timed.

A real nats-server, writer, reader and a bwrap executor running commands over an overlay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts.requests import PutChange
from infra.exec.links import LINKED
from quill.client import Quill, Workspace
from services.executor.app import Executor
from services.executor.config import ExecutorConfig
from tests.executor.test_costs import cost, files
from tests.helpers import start_executor, start_overlay_stack, start_writer_and_reader

FILES = 4_000


@pytest_asyncio.fixture
async def executor(nats_url: str, tmp_path: Path) -> AsyncIterator[Executor]:
    async with AsyncExitStack() as es:
        yield await start_overlay_stack(es, nats_url, tmp_path)


async def _source(quill: Quill, name: str, count: int) -> Workspace:
    ws = await files(quill, name, count)
    await ws.exec("true")  # its checkout is built, and held by the executor
    return ws


async def test_a_forks_first_checkout_costs_the_files_changed_since_the_fork_point(
    executor: Executor, nc: NATS, quill: Quill, tmp_path: Path
) -> None:
    """4,000 files in the source, 3 paths changed in the fork since: the fork's first command
    writes 3 files and reads none (links, not contents), where the same first checkout
    built from a reader writes 4,000; what it sees is the fork's tree."""
    name = f"src-{tmp_path.name[-12:]}"
    await _source(quill, f"acme/{name}", FILES)
    await quill.fork(f"acme/{name}", f"{name}-f")
    fork = quill.workspace(f"acme/{name}-f")
    await fork.apply(
        [
            PutChange(path="pkg07/m000007.py", content="changed\n"),
            PutChange(path="new/one.txt", content="new\n"),
        ]
    )
    await fork.delete("pkg08/m000008.py")
    await fork.apply([PutChange(path="pkg09/m000009.py", content="again\n", executable=True)])
    first = await cost(executor, lambda: fork.exec("true"))
    assert first["linked"] == 1 and first["seeded"] == 0 and first["unlinked"] == 0, first
    assert first["write"] <= 3 + 2, first  # the fork's 3 files (a little slack)
    assert first["read"] <= 2, first
    assert FILES - 1 <= first["link"] <= FILES + 1, first  # one link a file, no content
    assert first["events"] <= 4, first  # the fork's own, not the source's history
    seen = await fork.exec(
        "find . -type f | wc -l; cat pkg07/m000007.py new/one.txt; "
        "test -e pkg08/m000008.py || echo gone; test -x pkg09/m000009.py && echo x; "
        "cat pkg01/m000001.py"
    )
    assert seen.stdout.split("\n")[:6] == [str(FILES), "changed", "new", "gone", "x", "v = 1"]

    # the same first checkout of a fork whose source this executor does not hold: a reader's
    # tree, every file written
    await quill.fork(f"acme/{name}", f"{name}-g")
    home = executor.checkouts.data_dir / "checkouts" / "acme" / name
    await executor.checkouts.drop(("acme", name))
    assert not home.exists()
    other = quill.workspace(f"acme/{name}-g")
    seeded = await cost(executor, lambda: other.exec("true"))
    assert seeded["seeded"] == 1 and seeded["linked"] == 0, seeded
    assert seeded["write"] >= FILES, seeded
    print(f"fork's first checkout: linked {dict(first)}; from a reader {dict(seeded)}")


async def test_a_fork_of_a_fork_links_from_the_fork_and_a_moved_source_is_not_linked(
    executor: Executor, quill: Quill, tmp_path: Path
) -> None:
    """A fork of a fork links from its source (the first fork's checkout); a source whose
    checkout moved past the fork point (its tree no longer the fork's at N) is not linked
    from: the fork's first checkout comes from a reader, still right."""
    name = f"lin-{tmp_path.name[-12:]}"
    src = await _source(quill, f"acme/{name}", 200)
    await quill.fork(f"acme/{name}", f"{name}-1")
    one = quill.workspace(f"acme/{name}-1")
    await one.write("one.txt", "1\n")
    await one.exec("true")
    await quill.fork(f"acme/{name}-1", f"{name}-2")
    two = quill.workspace(f"acme/{name}-2")
    linked = await cost(executor, lambda: two.exec("cat one.txt"))
    assert linked["linked"] == 1 and linked["write"] <= 1, linked
    home = executor.checkouts.data_dir / "checkouts" / "acme"
    assert (home / f"{name}-1" / LINKED).exists() and (home / f"{name}-2" / LINKED).exists()

    await quill.fork(f"acme/{name}", f"{name}-3")
    three = quill.workspace(f"acme/{name}-3")
    await src.write("pkg01/m000001.py", "moved on\n")
    await src.exec("true")  # the source's checkout is past the fork point now
    moved = await cost(executor, lambda: three.exec("true"))
    assert moved["linked"] == 0 and moved["seeded"] == 1, moved
    assert (await three.exec("cat pkg01/m000001.py")).stdout == "v = 1\n"


async def test_a_linked_checkout_is_rebuilt_by_an_executor_that_runs_commands_in_place(
    nats_url: str, quill: Quill, tmp_path: Path
) -> None:
    """Hard links are safe only over overlays: an executor started on the same data without
    them (the local provider) wipes both checkouts before running a command in either."""

    name = f"mode-{tmp_path.name[-12:]}"
    async with AsyncExitStack() as es:
        executor = await start_overlay_stack(es, nats_url, tmp_path)
        await _source(quill, f"acme/{name}", 50)
        await quill.fork(f"acme/{name}", f"{name}-f")
        fork = quill.workspace(f"acme/{name}-f")
        assert (await cost(executor, lambda: fork.exec("true")))["linked"] == 1
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        local = await start_executor(
            es, nats_url, tmp_path / "executor", ExecutorConfig(sandbox="local")
        )
        done = await cost(local, lambda: fork.exec("echo x >> pkg01/m000001.py"))
        assert done["seeded"] == 1, done  # rebuilt, not written through a shared inode
        src = quill.workspace(f"acme/{name}")
        assert (await src.exec("cat pkg01/m000001.py")).stdout == "v = 1\n"
        assert await src.read_text("pkg01/m000001.py") == "v = 1\n"
        assert await fork.read_text("pkg01/m000001.py") == "v = 1\nx\n"
