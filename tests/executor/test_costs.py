"""What an executor's work costs as a workspace grows, counted, not timed (issue 29): the
entries it stats, the files it reads and writes (``infra.safefs.COUNTS``) and the events it
applies from the log (``infra.exec.checkout.COUNTS``), as its ping shows them.

* A first checkout costs the files at that version, not the history: the same 500 paths
  after 1,000 and after 4,000 (``-m slow``: 20,000) events.
* A command costs what it changed, not the tree: a second ``exec true`` and a command changing
  one file, in a checkout of 1,000 and of 4,000 (``-m slow``: 20,000) files.
* A shell (issue 32) opens on the files, not the history, and a command in it costs the
  events since its last command and what it changed, on 1,000 and 4,000 (20,000) events.
* A shell's checkout is watched (``infra.exec.watch``): a command in it changing one file
  stats the same few entries in a checkout of 1,000 and of 4,000 (20,000) files, and its
  quota guard, sampling an idle shell of 4,000 files, stats nothing.

A real nats-server, writer, reader and executor (bwrap, commands over an overlay).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from bench import size
from contracts.limits import LimitsPatch
from contracts.requests import PutChange
from quill.client import Quill, Workspace
from quill.shell import Shell
from services.executor import quota
from services.executor.app import Executor
from services.executor.shell_state import Shell as ShellState
from tests.helpers import eventually, start_overlay_stack

PATHS = 500
SIZES = [
    pytest.param((1_000, 4_000), id="1k-4k"),
    pytest.param((1_000, 20_000), id="1k-20k", marks=pytest.mark.slow),
]


@pytest_asyncio.fixture
async def executor(nats_url: str, tmp_path: Path) -> AsyncIterator[Executor]:
    async with AsyncExitStack() as es:
        yield await start_overlay_stack(es, nats_url, tmp_path)


def io(executor: Executor) -> Counter[str]:
    return Counter(executor.info()["io"])


async def cost(executor: Executor, op: Callable[[], Awaitable[object]]) -> Counter[str]:
    """What ``op`` made the executor do (what grew of its counts)."""
    before = io(executor)
    await op()
    after = io(executor)
    return Counter({key: after[key] - before[key] for key in after})


def flat(small: Counter[str], big: Counter[str], keys: tuple[str, ...], more: int = 0) -> None:
    """Fail when what should not grow with the workspace grew (a little slack, and ``more``:
    what one run may do that the other did not, of what changed)."""
    for key in keys:
        assert big[key] <= small[key] * 1.1 + 10 + more, (key, dict(small), dict(big))


async def history(nc: NATS, quill: Quill, name: str, events: int) -> Workspace:
    """``PATHS`` paths written round robin up to ``events`` events (appended to the log
    directly, as ``bench depth --fast`` does), the reader caught up."""
    await size.build(nc, PATHS, events, name=name, max_versions=None)
    await size.applied(quill, name, events)
    return quill.workspace(name)


async def files(quill: Quill, name: str, count: int) -> Workspace:
    """A workspace of ``count`` files, 1,000 an event."""
    ws = quill.workspace(name)
    await ws.create(limits=LimitsPatch(max_files=2 * count + 100))
    for start in range(0, count, 1000):
        puts = [
            PutChange(path=f"pkg{n % 100:02}/m{n:06}.py", content=f"v = {n}\n")
            for n in range(start, min(count, start + 1000))
        ]
        await ws.apply(puts)
    return ws


@pytest.mark.parametrize("sizes", SIZES)
async def test_a_first_checkout_costs_the_files_not_the_history(
    executor: Executor, nc: NATS, quill: Quill, sizes: tuple[int, int], tmp_path: Path
) -> None:
    costs = []
    for events in sizes:
        ws = await history(nc, quill, f"acme/history-{tmp_path.name[-12:]}-{events}", events)
        costs.append(await cost(executor, lambda ws=ws: ws.exec("true")))  # type: ignore[misc]
        listing = await ws.exec("find . -type f | wc -l")
        assert listing.stdout.strip() == str(PATHS)
    small, big = costs
    flat(small, big, ("write", "read", "stat", "events"))
    assert small["seeded"] == big["seeded"] == 1 and small["replayed"] == big["replayed"] == 0


@pytest.mark.parametrize("sizes", SIZES)
async def test_a_command_costs_what_it_changed_not_the_tree(
    executor: Executor, quill: Quill, sizes: tuple[int, int], tmp_path: Path
) -> None:
    seconds, changes = [], []
    for count in sizes:
        ws = await files(quill, f"acme/tree-{tmp_path.name[-12:]}-{count}", count)
        await ws.exec("true")  # the checkout is built
        seconds.append(await cost(executor, lambda ws=ws: ws.exec("true")))  # type: ignore[misc]
        change = await cost(executor, lambda ws=ws: ws.exec("echo x > pkg07/new.txt"))  # type: ignore[misc]
        changes.append(change)
        assert await ws.read_text("pkg07/new.txt") == "x\n"
    flat(*seconds, ("stat", "read", "write", "events"))
    flat(*changes, ("stat", "read", "write", "events"))


@pytest.mark.parametrize("sizes", SIZES)
async def test_gitignore_files_cost_the_paths_changed_not_the_tree(
    executor: Executor, quill: Quill, sizes: tuple[int, int], tmp_path: Path
) -> None:
    """A ``.gitignore`` in the root and in each of 100 directories: a command changing two
    paths of one directory reads the two on its paths (once: cached while unchanged)."""
    changes, reads = [], []
    for count in sizes:
        name = f"acme/ignores-{tmp_path.name[-12:]}-{count}"
        ws = await files(quill, name, count)
        puts = [PutChange(path=f"pkg{n:02}/.gitignore", content="*.tmp\n") for n in range(100)]
        await ws.apply([*puts, PutChange(path=".gitignore", content="build/\n")])
        await ws.exec("true")  # the checkout is built
        checkout = executor.checkouts.live["acme", name.split("/")[1]]
        before = checkout.gitignores.reads
        change = await cost(
            executor, lambda ws=ws: ws.exec("echo x > pkg07/a.tmp && echo y > pkg07/b.txt")
        )  # type: ignore[misc]
        changes.append(change)
        first = checkout.gitignores.reads - before
        again = await ws.exec("echo x > pkg07/c.tmp && echo y > pkg07/d.txt")
        reads.append((first, checkout.gitignores.reads - before - first))
        assert again.changes.ignored == ["pkg07/c.tmp"]
        assert [p.path for p in again.changes.paths] == ["pkg07/d.txt"]
    flat(*changes, ("stat", "read", "write", "events"))
    assert reads == [(2, 0), (2, 0)]


@pytest.mark.parametrize("sizes", SIZES)
async def test_a_shell_opens_on_the_files_and_its_commands_cost_what_changed(
    executor: Executor, nc: NATS, quill: Quill, sizes: tuple[int, int], tmp_path: Path
) -> None:
    """Issue 32 on a long-lived workspace: a shell opened on a long history costs its files,
    not the history; a command in it, with 50 writes from elsewhere since its last, costs
    those 50 events and what it changed, the same on a short and a long history."""
    opens, commands = [], []
    for events in sizes:
        ws = await history(nc, quill, f"acme/shell-{tmp_path.name[-12:]}-{events}", events)
        shells: list[Shell] = []

        async def open_one(ws: Workspace = ws, shells: list[Shell] = shells) -> None:
            shells.append(await ws.shell())

        opens.append(await cost(executor, open_one))
        async with shells[0] as sh:
            first = await sh.run("find . -type f | wc -l")
            assert first.stdout.strip() == str(PATHS)
            for n in range(50):
                await ws.write(f"elsewhere/{n}.txt", "x\n")

            async def change(sh: Shell = sh) -> None:
                result = await sh.run("cat elsewhere/49.txt && echo y > mine.txt")
                assert result.stdout == "x\n" and result.changes.total == 1

            commands.append(await cost(executor, change))
        assert await ws.read_text("mine.txt") == "y\n"
    flat(*opens, ("write", "read", "stat", "events"))
    # the shell's watch may or may not have seen the sync's own writes of the 50 files by the
    # capture (each then looked at once more): up to 50 stats either way
    flat(*commands, ("write", "read", "stat", "events"), more=50)
    assert [c["events"] for c in commands] == [51, 51]  # the 50 writes, and its own commit


async def shell_on(executor: Executor, ws: Workspace) -> tuple[Shell, ShellState]:
    shell = await ws.shell()
    return shell, executor.shells.held[shell.id]


@pytest.mark.parametrize("sizes", SIZES)
async def test_a_shell_command_costs_what_it_changed_not_the_tree(
    executor: Executor, quill: Quill, sizes: tuple[int, int], tmp_path: Path
) -> None:
    """Issue 32 in depth: a shell's checkout is watched (``infra.exec.watch``), so a command
    in it changing one file, and the background capture before it, stat what changed (and
    the directories on its way), not the 1,000 or 4,000 (20,000) files: the same few."""
    changes = []
    for count in sizes:
        ws = await files(quill, f"acme/shtree-{tmp_path.name[-12:]}-{count}", count)
        sh, _ = await shell_on(executor, ws)
        async with sh:
            await sh.run("true")

            async def change(sh: Shell = sh) -> None:
                result = await sh.run("echo x >> pkg07/m000007.py")
                assert result.changes.total == 1

            changes.append(await cost(executor, change))
        assert await ws.read_text("pkg07/m000007.py") == "v = 7\nx\n"
    print("shell command costs", [dict(c) for c in changes])
    flat(*changes, ("stat", "read", "write", "events"))
    assert changes[1]["stat"] < 50, dict(changes[1])  # a walk would stat the 4,000 (20,000)
    assert changes[1]["watch_rearmed"] == 0 and changes[1]["watch_overflows"] == 0


async def test_an_idle_shell_s_quota_costs_nothing(
    executor: Executor, quill: Quill, tmp_path: Path
) -> None:
    """The quota guard of an idle shell of 4,000 files samples its checkout every quarter
    second for the shell's whole life: from its watch's running total, it stats nothing (it
    walked the 4,000 at each sample)."""
    ws = await files(quill, f"acme/idle-{tmp_path.name[-12:]}", 4_000)
    sh, state = await shell_on(executor, ws)
    async with sh:
        await sh.run("echo x > one.txt")
        watch = state.checkout.watch
        assert watch is not None
        samples = [0]
        held = watch.held

        def counted() -> tuple[int, int] | None:
            samples[0] += 1
            return held()

        watch.held = counted  # type: ignore[method-assign]
        before = io(executor)
        await eventually(lambda: samples[0] >= 8, what="eight quota samples", timeout=30)
        after = io(executor)
        print("idle shell: stats over", samples[0], "samples:", after["stat"] - before["stat"])
        assert after["stat"] - before["stat"] <= 2, (before["stat"], after["stat"])
        used = held()
        assert used is not None
        walked = quota.held(state.checkout.tree)
        assert used == walked  # the running total is what a walk finds
