"""A fork's first checkout on an executor that holds its source's (issue 33, item 3): made of
hard links to the source's files (``infra.exec.links``), then the fork's own events: what it
reads and writes is the files changed since the fork point, not the tree, counted
(``infra.safefs.COUNTS``, ``infra.exec.checkout.COUNTS``, the executor's ping), not timed.

A real nats-server, writer, reader and a bwrap executor running commands over an overlay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts.limits import TREE_CHANGED_MOST
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


async def test_a_fork_of_a_fork_links_from_the_fork(
    executor: Executor, quill: Quill, tmp_path: Path
) -> None:
    """A fork of a fork links from its source (the first fork's checkout)."""
    name = f"lin-{tmp_path.name[-12:]}"
    await _source(quill, f"acme/{name}", 200)
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


SEEN = (
    "find . -mindepth 1 \\( -type d -printf 'd %P\\n' \\) -o \\( -type f -printf 'f %P %m\\n' \\)"
    " -o -printf 'o %P\\n' | sort | sha256sum; "
    "find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum; find . | wc -l"
)
"""What a command in the checkout sees: its entries with their modes, its files' hashes."""
SOURCE_MOVES = 8
"""The source's paths changed after the fork point (``_move_on``), each a file written."""


async def _moved_source(quill: Quill, name: str, count: int) -> Workspace:
    """A source of ``count`` files and a directory ``gone/`` of 3 (deleted later)."""
    src = await files(quill, name, count)
    await src.apply(
        [PutChange(path=p, content=f"{p}\n") for p in ("gone/a.txt", "gone/b.txt", "gone/s/c.txt")]
    )
    return src


async def _move_on(src: Workspace) -> None:
    """The source after the fork point: files written, a mode changed, a directory of 3 files
    deleted, a new directory, a move (8 paths as of the fork point differ)."""
    await src.write("pkg01/m000001.py", "moved on\n")
    await src.apply([PutChange(path="pkg02/m000002.py", content="v = 2\n", executable=True)])
    await src.delete("gone", recursive=True)
    await src.apply(
        [
            PutChange(path="added/x.txt", content="x\n"),
            PutChange(path="added/y/z.txt", content="z\n"),
        ]
    )
    await src.move("pkg04/m000004.py", "moved/m4.py")
    await src.write("pkg05/m000005.py", "again\n")


async def _fork_changes(fork: Workspace) -> None:
    """The fork's own changes since the fork point: 2 files written, one deleted."""
    await fork.apply(
        [
            PutChange(path="pkg07/m000007.py", content="changed\n"),
            PutChange(path="new/one.txt", content="new\n"),
        ]
    )
    await fork.delete("pkg08/m000008.py")


async def _as_a_reader_builds_it(executor: Executor, keys: list[str], fork: Workspace) -> str:
    """What a command sees in ``fork`` when its checkout is built from a reader's tree (its
    and its source's checkouts dropped first)."""
    for name in keys:
        await executor.checkouts.drop(("acme", name))
    seeded = await cost(executor, lambda: fork.exec(SEEN))
    assert seeded["seeded"] == 1 and seeded["linked"] == 0, seeded
    return (await fork.exec(SEEN)).stdout


async def _moved(executor: Executor, quill: Quill, name: str, count: int) -> Counter[str]:
    """The first checkout of a fork whose source moved on by ``SOURCE_MOVES`` paths after the
    fork point (its checkout held at the newer version), checked against a reader's."""
    src = await _moved_source(quill, f"acme/{name}", count)
    await quill.fork(f"acme/{name}", f"{name}-f")
    await _move_on(src)
    await src.exec("true")  # the source's checkout is past the fork point
    fork = quill.workspace(f"acme/{name}-f")
    await _fork_changes(fork)
    first = await cost(executor, lambda: fork.exec("true"))
    seen = (await fork.exec(SEEN)).stdout
    tail = await fork.exec(
        "cat pkg01/m000001.py gone/s/c.txt pkg04/m000004.py pkg07/m000007.py; "
        "test -e added || echo no-added; test -e moved || echo no-moved; "
        "test -x pkg02/m000002.py || echo not-x; test -e pkg08/m000008.py || echo gone"
    )
    assert tail.stdout.split("\n")[:9] == [
        "v = 1", "gone/s/c.txt", "v = 4", "changed", "no-added", "no-moved", "not-x", "gone", ""
    ], tail.stdout  # fmt: skip
    assert seen == await _as_a_reader_builds_it(executor, [name, f"{name}-f"], fork)
    assert seen.strip().endswith(str(count + 3 + 103 + 1))  # files, directories, .
    return first


async def test_a_fork_of_a_moved_source_links_all_but_what_changed_since_the_fork_point(
    executor: Executor, quill: Quill, tmp_path: Path
) -> None:
    """The source's checkout moved on after the fork point (an agent keeps working on it): the
    fork's first checkout links what did not change in between and takes what did as of the
    fork point from a reader, writing ~ the source's changed paths plus the fork's own, the
    same at 1,000 and 4,000 files; reading none of them; and what a command sees is exactly
    what it sees in a checkout built from a reader's tree."""
    costs = []
    for count in (1_000, FILES):
        name = f"mv{count}-{tmp_path.name[-12:]}"
        first = await _moved(executor, quill, name, count)
        assert first["linked"] == 1 and first["seeded"] == 0 and first["unlinked"] == 0, first
        assert first["write"] <= SOURCE_MOVES + 3, first
        assert first["read"] <= 2, first
        assert count - 10 <= first["link"] <= count + 3, first
        costs.append(first)
        print(f"moved source, {count} files: {dict(first)}")
    small, big = costs
    for key in ("write", "read", "events"):
        assert big[key] <= small[key] + 2, (key, dict(small), dict(big))


async def test_a_fork_of_a_source_whose_checkout_is_behind_the_fork_point_is_linked(
    executor: Executor, quill: Quill, tmp_path: Path
) -> None:
    """The executor's checkout of the source is older than the fork point (the source was
    written without commands since): what changed up to the fork point is taken from a
    reader, the rest linked."""
    name = f"bh-{tmp_path.name[-12:]}"
    src = await _moved_source(quill, f"acme/{name}", 1_000)
    await src.exec("true")  # the source's checkout, then the source moves on without it
    await _move_on(src)
    await quill.fork(f"acme/{name}", f"{name}-f")  # at the latest version
    fork = quill.workspace(f"acme/{name}-f")
    await _fork_changes(fork)
    first = await cost(executor, lambda: fork.exec("true"))
    assert first["linked"] == 1 and first["seeded"] == 0 and first["unlinked"] == 0, first
    assert first["write"] <= SOURCE_MOVES + 3 and first["read"] <= 2, first
    seen = (await fork.exec(SEEN)).stdout
    tail = await fork.exec(
        "cat pkg01/m000001.py added/y/z.txt moved/m4.py; test -x pkg02/m000002.py && echo x"
    )
    assert tail.stdout == "moved on\nz\nv = 4\nx\n", tail.stdout
    assert seen == await _as_a_reader_builds_it(executor, [name, f"{name}-f"], fork)


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


async def test_a_source_moved_on_by_more_than_a_reader_tells_is_not_linked(
    executor: Executor, quill: Quill, tmp_path: Path
) -> None:
    """Past ``TREE_CHANGED_MOST`` paths changed since the fork point, the reader cannot tell
    them: the fork's first checkout is built from its tree as before, right."""
    name = f"cap-{tmp_path.name[-12:]}"
    src = await files(quill, f"acme/{name}", 1_000)  # room for 2,100 files
    await quill.fork(f"acme/{name}", f"{name}-f")
    more = TREE_CHANGED_MOST + 1
    await src.apply([PutChange(path=f"more/f{n}.txt", content=f"{n}\n") for n in range(more)])
    await src.exec("true")
    fork = quill.workspace(f"acme/{name}-f")
    first = await cost(executor, lambda: fork.exec("true"))
    assert first["seeded"] == 1 and first["linked"] == 0 and first["unlinked"] == 0, first
    seen = await fork.exec("find . -type f | wc -l; test -e more || echo no-more")
    assert seen.stdout == "1000\nno-more\n", seen.stdout
