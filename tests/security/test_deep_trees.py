"""Issue 28, item 3: a directory tree as deep as a command likes breaks no service, for good or
for a while.

Before, ``shutil.rmtree`` recursed once per level and raised ``RecursionError`` past ~1,000:
a 3,000-level tree in a checkout over its quota made every later command of the workspace
answer ``INTERNAL``; deleting such a directory through the log made every later command answer
``UNAVAILABLE``; a command at an older version answered ``INTERNAL`` and left its tree in
``checkouts/.at/``; and a tree left in ``.at/`` or in a workspace purged while no executor ran
stopped the executor at every start. Now checkouts are removed through the trash
(``infra/exec/trash.py``: renamed, then removed without recursion, a bounded number of
descriptors open), and what cannot be removed is left there with a warning.

Real bwrap sandboxes, a real nats-server, the writer, a reader and executors in this process
(restarted on the same data directory). The trees are made by commands; each test removes
what is left of them with ``rm -rf`` (iterative) whatever happens: a tree this deep left in
pytest's temporary directory would break pytest's own clean-up of it later.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from quill.client import Quill, Workspace
from services.executor.app import Executor, ExecutorConfig
from tests.helpers import (
    eventually,
    start_executor,
    start_writer_and_reader,
)
from tests.security.conftest import Canaries
from tests.security.conftest import per_provider as nats_server  # noqa: F401 (a fixture: each provider's own nats-server)

AT, TRASH = ".at", ".trash"
"""Under the executor's ``checkouts``: pinned-version checkouts, and what is being removed."""
LEVELS = 3000
DEEP = (
    "import os\n"
    "os.makedirs(os.environ['TOP'], exist_ok=True)\n"
    "os.chdir(os.environ['TOP'])\n"
    f"for _ in range({LEVELS}):\n"
    "    os.mkdir('d')\n"
    "    os.chdir('d')\n"
    "open('leaf', 'w').write('deep\\n')\n"
    "print('made')\n"
)
MAKE = 'python3 -c "$DEEP"'

StartExecutor = Callable[[AsyncExitStack], Awaitable[Executor]]


def deep(top: str) -> dict[str, str]:
    """The environment of ``MAKE`` making the tree under ``top``."""
    return {"DEEP": DEEP, "TOP": top}


def depth(path: Path) -> int:
    """How many levels of ``d`` are under ``path`` (walked by descriptors, no recursion)."""
    levels = 0
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            try:
                child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                return levels
            os.close(fd)
            fd, levels = child, levels + 1
    finally:
        os.close(fd)


@pytest_asyncio.fixture
async def services(
    nats_url: str, tmp_path: Path, provider: str
) -> AsyncIterator[tuple[StartExecutor, Path]]:
    """A writer, a reader, and a function starting an executor of ``provider`` on ``data``
    (the same directory each time) until the given stack closes."""
    data = tmp_path / "executor"
    try:
        async with AsyncExitStack() as es:
            await start_writer_and_reader(es, nats_url, tmp_path)

            async def executor(stack: AsyncExitStack) -> Executor:
                return await start_executor(stack, nats_url, data, ExecutorConfig(provider))

            yield executor, data
    finally:  # rm is iterative: whatever the executor left, however deep
        done = subprocess.run(["rm", "-rf", "--one-file-system", str(data)], capture_output=True)
        assert done.returncode == 0, done.stderr.decode()[-2000:]


async def workspace(client: Quill, name: str, limits: LimitsPatch | None = None) -> Workspace:
    ws = client.workspace(name)
    await ws.create(limits=limits)
    await ws.write("a.txt", "kept\n")
    return ws


async def answers(ws: Workspace) -> None:
    """The workspace's commands run and say what they did."""
    for _ in range(2):
        result = await ws.exec("cat a.txt")
        assert (result.exit_code, result.stdout) == (0, "kept\n")


async def emptied(executor: Executor) -> None:
    """Wait until the executor's trash holds nothing (its background removal is done)."""
    trash = executor.settings.data_dir / "checkouts" / TRASH
    trash_of = executor.checkouts.trash
    await eventually(lambda: not trash_of.pending() and trash_of.idle(), 60)
    assert not trash.exists() or os.listdir(trash) == []


def home(data: Path, ws: Workspace) -> Path:
    return data / "checkouts" / ws.tenant / ws.name


async def test_a_deep_tree_over_the_quota_is_removed_and_the_workspace_answers(
    services: tuple[StartExecutor, Path], client: Quill, canaries: Canaries
) -> None:
    start, data = services
    async with AsyncExitStack() as es:
        executor = await start(es)
        ws = await workspace(client, "acme/deep-quota", LimitsPatch(max_checkout_bytes=8 << 20))
        command = f"{MAKE} && head -c 9M /dev/zero > node_modules/big"
        with pytest.raises(QuillError) as stopped:  # before: INTERNAL (RecursionError)
            await ws.exec(command, env=deep("node_modules"), timeout_ms=60_000)
        assert stopped.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED, stopped.value
        await answers(ws)  # before: INTERNAL, for every command, for good
        assert not (home(data, ws) / "tree" / "node_modules").exists()
        await emptied(executor)


async def test_a_deep_directory_deleted_through_the_log_leaves_the_checkout_working(
    services: tuple[StartExecutor, Path], client: Quill, canaries: Canaries
) -> None:
    start, data = services
    async with AsyncExitStack() as es:
        await start(es)
        ws = await workspace(client, "acme/deep-delete")
        made = await ws.exec(MAKE, env=deep("deep"), timeout_ms=60_000)
        assert (made.exit_code, made.stdout) == (0, "made\n"), made.stderr
        assert depth(home(data, ws) / "tree" / "deep") == LEVELS
        await ws.delete("deep", recursive=True)
        await answers(ws)  # before: UNAVAILABLE ("the log is not reachable"), for good
        assert not (home(data, ws) / "tree" / "deep").exists()


async def test_a_deep_tree_at_an_older_version_and_left_over_a_restart(
    services: tuple[StartExecutor, Path], client: Quill, canaries: Canaries
) -> None:
    start, data = services
    async with AsyncExitStack() as es:
        executor = await start(es)
        ws = await workspace(client, "acme/deep-pinned")
        old = (await ws.info()).version
        await ws.write("b.txt", "later\n")
        # a command at an older version runs in a checkout of its own, removed after it
        pinned = await ws.exec(MAKE, env=deep("node_modules"), version=old, timeout_ms=60_000)
        assert (pinned.exit_code, pinned.stdout) == (0, "made\n")  # before: INTERNAL
        await emptied(executor)
        assert os.listdir(data / "checkouts" / AT) == []
        # what an executor stopped mid-command leaves: a pinned checkout holding such a tree
        made = await ws.exec(MAKE, env=deep("node_modules"), timeout_ms=60_000)
        assert made.exit_code == 0, made.stderr
    left = data / "checkouts" / AT / "left-by-a-crash"
    left.mkdir(parents=True)
    home(data, ws).rename(left)  # the same tree (one rename: no recursion needed to move it)
    assert depth(left / "tree" / "node_modules") == LEVELS
    async with AsyncExitStack() as es:
        executor = await start(es)  # before: RecursionError, the executor never started
        await answers(ws)
        await emptied(executor)
        assert not left.exists()


async def test_a_deep_tree_of_a_workspace_purged_while_no_executor_ran(
    services: tuple[StartExecutor, Path], client: Quill, canaries: Canaries
) -> None:
    start, data = services
    ws = await workspace(client, "acme/deep-purged")
    other = await workspace(client, "acme/deep-purged-other")
    async with AsyncExitStack() as es:
        await start(es)
        made = await ws.exec(MAKE, env=deep("node_modules"), timeout_ms=60_000)
        assert made.exit_code == 0, made.stderr
        await answers(other)
    assert depth(home(data, ws) / "tree" / "node_modules") == LEVELS
    await ws.purge()
    async with AsyncExitStack() as es:
        executor = await start(es)  # before: RecursionError, at every start
        await answers(other)
        await emptied(executor)
        assert not home(data, ws).exists()
    # and purged while it runs: removed at once, not left (before: a RecursionError logged)
    again = await workspace(client, "acme/deep-purged")
    async with AsyncExitStack() as es:
        executor = await start(es)
        made = await again.exec(MAKE, env=deep("node_modules"), timeout_ms=60_000)
        assert made.exit_code == 0, made.stderr
        await again.purge()
        await eventually(lambda: not home(data, again).exists(), 60)
        await emptied(executor)


@pytest.mark.skipif(shutil.which("chattr") is None, reason="no chattr here")
async def test_a_tree_that_cannot_be_removed_is_left_in_the_trash_and_the_executor_starts(
    services: tuple[StartExecutor, Path],
    client: Quill,
    canaries: Canaries,
    caplog: pytest.LogCaptureFixture,
) -> None:
    start, data = services
    ws = await workspace(client, "acme/deep-stuck")
    async with AsyncExitStack() as es:
        await start(es)
        made = await ws.exec(MAKE, env=deep("node_modules"), timeout_ms=60_000)
        assert made.exit_code == 0, made.stderr
    stuck = data / "checkouts" / AT / "stuck"
    stuck.mkdir(parents=True)
    home(data, ws).rename(stuck)
    pinned = stuck / "tree" / "pinned"  # immutable: even root cannot unlink it
    pinned.write_text("x")
    if subprocess.run(["chattr", "+i", str(pinned)], capture_output=True).returncode != 0:
        print("this filesystem has no immutable attribute (chattr +i)")
        pytest.skip("this filesystem has no immutable attribute (chattr +i)")
    try:
        with caplog.at_level(logging.WARNING, logger="quill.executor"):
            async with AsyncExitStack() as es:
                executor = await start(es)
                await answers(ws)
                await eventually(lambda: executor.checkouts.trash.failed, 60)
        assert "cannot remove" in caplog.text and "remove it by hand" in caplog.text
        (quarantined,) = executor.checkouts.trash.failed  # the whole of .at/, moved there
        assert (data / "checkouts" / TRASH / quarantined / "stuck/tree/pinned").exists()
        assert not stuck.exists()
    finally:
        for path in [pinned, *(data / "checkouts" / TRASH).glob("*/stuck/tree/pinned")]:
            if path.exists():
                subprocess.run(["chattr", "-i", str(path)], check=True)
