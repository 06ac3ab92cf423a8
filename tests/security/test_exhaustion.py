"""Items 2 and 4 of the adversarial suite: an agent cannot fill the executor's disk, and one
tenant cannot take every executor slot.

Disk: a command writing past its workspace's ``max_checkout_bytes`` (in an ignored directory,
or as a file over ``max_file_bytes``, neither of which is committed) is stopped and told why,
and nothing of it stays on disk; a workspace whose files alone exceed the quota runs no command;
idle checkouts are evicted past the executor's budget, least recently used first, never one in
use, and rebuilt from the log; an executor short of free disk refuses new commands with
``UNAVAILABLE``. Slots: tenant a saturating its share, tenant b's command runs and finishes.

Real bwrap sandboxes and a real nats-server, with the writer, a reader and executors in this
process (their knobs set per test); tiny quotas, and a "disk short" made by a reserve larger
than the disk (nothing is filled for real).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from quill.client import Quill, Workspace
from services.executor.app import Executor, ExecutorConfig
from services.executor.quota import usage
from tests import helpers
from tests.helpers import (
    eventually,
    start_executor,
    start_reader,
    start_writer,
    start_writer_and_reader,
)
from tests.security.conftest import Canaries, verify
from tests.security.conftest import per_provider as nats_server  # noqa: F401 (a fixture: each provider's own nats-server)
from tests.up import PASSWORDS, TENANTS, Up, running

MIB = 1024 * 1024
QUOTA = LimitsPatch(max_checkout_bytes=2 * MIB, max_file_bytes=64 * 1024)

StartExecutor = Callable[..., Awaitable[Executor]]


@pytest_asyncio.fixture
async def services(
    nats_url: str, tmp_path: Path, provider: str
) -> AsyncIterator[tuple[StartExecutor, Path]]:
    """A writer, a reader, and a function starting an executor of ``provider`` on ``data``
    (default: its own directory) with the given config; all stopped at the end."""
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)

        async def executor(es: AsyncExitStack = es, **config: object) -> Executor:
            cfg = ExecutorConfig(sandbox=provider, **config)  # type: ignore[arg-type]
            return await start_executor(es, nats_url, tmp_path / "executor", cfg)

        yield executor, tmp_path / "executor"


def home(executor: Executor, ws: Workspace) -> Path:
    return executor.settings.data_dir / "checkouts" / ws.tenant / ws.name


class Gate:
    """Commands that print ``go`` and then wait until the test releases them
    (``tests.helpers.Gate``: a file the test made in their checkout would not be seen by a
    command over an overlay)."""

    def __init__(self) -> None:
        self.started: dict[str, asyncio.Event] = {}
        self.gates: dict[str, helpers.Gate] = {}

    def run(self, ws: Workspace) -> asyncio.Task[object]:
        key = f"{ws.tenant}/{ws.name}"
        started = self.started[key] = asyncio.Event()
        gate = self.gates[key] = helpers.Gate()

        def seen(stream: str, chunk: bytes) -> None:
            if b"go" in chunk:
                started.set()

        command = f"echo go; {gate.wait}; echo done"
        return asyncio.create_task(ws.exec(command, timeout_ms=120_000, on_output=seen))

    async def release(self, ws: Workspace) -> None:
        """Let ``ws``'s command go on (once it waits); a second time, nothing."""
        gate = self.gates.pop(f"{ws.tenant}/{ws.name}", None)
        if gate is not None:
            await gate.open()


async def created(quill: Quill, name: str, limits: LimitsPatch | None = QUOTA) -> Workspace:
    ws = quill.workspace(name)
    await ws.create(limits=limits)
    await ws.write("a.txt", "kept\n")
    return ws


# ------------------------------------------------------------------ item 2: the disk

FILLERS = {  # 3 MB each, against a quota of 2 MiB (no one file may be larger than the quota)
    "ignored-then-waits": "mkdir -p node_modules; head -c 1500K /dev/zero > node_modules/a; "
    "head -c 1500K /dev/zero > node_modules/b; echo wrote; sleep 60",
    "over-max-file-bytes-then-waits": "head -c 1500K /dev/zero > a.bin; "
    "head -c 1500K /dev/zero > b.bin; echo wrote; sleep 60",
    # fallocate(2) itself is refused in the sandbox (test_disk_reserve.py); glibc's
    # posix_fallocate then writes the blocks, which count all the same
    "posix-fallocate-then-waits": 'python3 -c \'import os\nfor n in ("a", "b"):\n'
    "    fd = os.open(n, os.O_CREAT | os.O_WRONLY)\n    os.posix_fallocate(fd, 0, 1500 * 1024)'"
    "; sleep 60",
    "many-small-files-and-exits": "mkdir -p node_modules; for i in $(seq 30); do "
    "head -c 100K /dev/urandom > node_modules/f$i; done",
}


@pytest.mark.parametrize("filler", FILLERS)
async def test_a_command_over_its_checkout_quota_is_stopped_and_leaves_nothing(
    services: tuple[StartExecutor, Path], client: Quill, canaries: Canaries, filler: str
) -> None:
    start, _ = services
    executor = await start()
    ws = await created(client, f"acme/fill-{filler}")
    version = (await ws.info()).version
    assert (await ws.info()).limits.max_checkout_bytes == 2 * MIB
    with pytest.raises(QuillError) as info:
        await ws.exec(FILLERS[filler], timeout_ms=60_000)
    error = info.value
    assert error.code == ErrorCode.SIZE_LIMIT_EXCEEDED, error
    assert "max_checkout_bytes" in error.message and error.details["limit"] == "max_checkout_bytes"
    assert error.details["used"] > 2 * MIB
    # nothing of it was committed, nothing of it stays on the executor's disk
    assert (await ws.info()).version == version
    assert usage(home(executor, ws)) < 2 * MIB
    after = await ws.exec("cat a.txt; ls")
    assert after.exit_code == 0 and after.stdout == "kept\na.txt\n"


async def test_a_workspace_whose_files_exceed_the_quota_runs_no_command(
    services: tuple[StartExecutor, Path], client: Quill, canaries: Canaries
) -> None:
    start, _ = services
    executor = await start()
    ws = await created(client, "acme/log-over", LimitsPatch(max_checkout_bytes=MIB))
    for name in ("one", "two", "three"):
        await ws.write(f"{name}.bin", b"x" * 400_000)
    tree = home(executor, ws) / "tree"
    for attempt in range(2):
        with pytest.raises(QuillError) as info:
            await ws.exec("echo never > ran.txt")
        assert info.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
        assert "max_checkout_bytes" in info.value.message
        if attempt == 0:
            rebuilt = tree.stat().st_ino
    assert tree.stat().st_ino == rebuilt  # rebuilt from the log once, not at every refusal
    await ws.delete("three.bin")
    assert (await ws.exec("echo ran")).stdout == "ran\n"


async def test_idle_checkouts_are_evicted_oldest_first_never_one_in_use(
    services: tuple[StartExecutor, Path], client: Quill, canaries: Canaries
) -> None:
    start, _ = services
    executor = await start()
    one, two, three = [await created(client, f"acme/evict-{n}", None) for n in (1, 2, 3)]
    await one.exec("mkdir -p node_modules && echo cached > node_modules/x")
    size = usage(home(executor, one))
    # room for one checkout and a half: the next one pushes the oldest idle one out
    executor.checkouts.budget.budget = size + size // 2
    await two.exec("true")
    assert not home(executor, one).exists() and home(executor, two).exists()
    # rebuilt from the log on next use: what the log holds is back, the ignored cache is not
    back = await one.exec("cat a.txt; ls node_modules 2>&1 | wc -l; echo x > new.txt")
    assert back.stdout.startswith("kept\n") and back.changes.committed
    assert await one.read_text("new.txt") == "x\n"
    # a checkout in use is never evicted, however far over the budget
    executor.checkouts.budget.budget = 1
    gate = Gate()
    running = gate.run(three)
    await asyncio.wait_for(gate.started["acme/evict-3"].wait(), 30)
    await two.exec("true")
    assert home(executor, three).exists() and not home(executor, two).exists()
    await gate.release(three)
    await running
    assert not home(executor, three).exists()


async def test_an_executor_short_of_disk_refuses_new_commands(
    services: tuple[StartExecutor, Path], client: Quill, canaries: Canaries
) -> None:
    start, data = services
    async with AsyncExitStack() as first:
        executor = await start(first)
        before = await created(client, "acme/short-1", None)
        await before.exec("echo hi > hi.txt")
        assert home(executor, before).exists()
    # the same data directory, with a reserve no disk has: as good as a full disk
    executor = await start(disk_reserve=2**62)
    assert executor.info()["refusing"] == "disk_reserve"
    ws = await created(client, "acme/short-2", None)
    with pytest.raises(QuillError) as info:
        await ws.exec("echo never > never.txt")
    assert info.value.code == ErrorCode.UNAVAILABLE and info.value.retriable
    assert "reserve" in info.value.message and info.value.details["reason"] == "disk_reserve"
    # the idle checkout the earlier executor left was evicted first, to make room
    assert not (data / "checkouts" / "acme" / "short-1").exists()


@pytest.fixture
def small_inode_disk(tmp_path: Path) -> Iterator[Path]:
    """A real filesystem of 256 inodes (a tmpfs; mounting one needs root)."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs with few inodes needs root")
    disk = tmp_path / "small-inode-disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=256", "tmpfs", str(disk)])
    if not os.path.ismount(disk):
        pytest.skip("this host lets root mount no tmpfs")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


async def test_empty_files_that_exhaust_the_inodes_make_the_executor_refuse(
    nats_url: str, client: Quill, small_inode_disk: Path, canaries: Canaries, provider: str
) -> None:
    """Empty files take no blocks, so no byte quota sees them; the inodes run out all the
    same, and the executor refuses new commands before its data disk has none left."""
    async with AsyncExitStack() as es:
        await start_writer(es, nats_url, small_inode_disk.parent / "writer")
        await start_reader(es, nats_url, small_inode_disk.parent / "reader")
        config = ExecutorConfig(sandbox=provider, disk_reserve=0)
        executor = await start_executor(es, nats_url, small_inode_disk / "executor", config)
        ws = await created(client, "acme/inodes", None)
        # empty files up to a few inodes above the reserve (no command is stopped for them),
        # then a few more in its checkout, as a command that ended between two looks of the
        # disk watch would leave them
        reserve = executor.info()["disk_reserve_inodes"]
        fill = f"touch $(seq 1 $(( $(stat -f -c %d .) - {reserve} - 8 )))"
        await ws.exec(f"mkdir -p node_modules && cd node_modules && {fill}")
        assert executor.info()["refusing"] is None
        cache = home(executor, ws) / "tree" / "node_modules"
        for i in range(os.statvfs(small_inode_disk).f_favail - reserve + 1):
            (cache / f"more-{i}").touch()
        assert executor.info()["refusing"] == "disk_reserve"
        # the next command makes room first: the idle checkout holding them is evicted
        other = await created(client, "acme/inodes-2", None)
        await other.exec("echo fine > fine.txt")
        assert not home(executor, ws).exists() and executor.info()["refusing"] is None
        # inodes taken by something no eviction frees: new commands are refused
        outside = small_inode_disk / "outside"
        outside.mkdir()
        with contextlib.suppress(OSError):  # every inode left
            for i in range(10_000):
                (outside / str(i)).touch()
        with pytest.raises(QuillError) as info:
            await other.exec("echo never > never.txt")
        assert info.value.code == ErrorCode.UNAVAILABLE
        assert info.value.details["reason"] == "disk_reserve" and "inodes" in info.value.message


# ------------------------------------------------------------------ item 4: slots


async def test_a_tenant_saturating_its_share_leaves_a_slot_for_another(
    services: tuple[StartExecutor, Path], client: Quill, canaries: Canaries
) -> None:
    start, _ = services
    executor = await start(max_runs=2)
    a = [await created(client, f"tenant-a/busy-{n}", None) for n in (1, 2)]
    b = await created(client, "tenant-b/work", None)
    gate = Gate()
    held = [gate.run(ws) for ws in a]  # max_runs long commands of tenant a
    await asyncio.wait_for(gate.started["tenant-a/busy-1"].wait(), 30)
    await eventually(lambda: len(executor.tasks) == 2)  # both of a's are in the executor's hands
    result = await b.exec("echo b ran")  # no retry: b is served at once
    assert result.exit_code == 0 and result.stdout == "b ran\n"
    assert not any(task.done() for task in held)
    assert executor.info()["waiting"] == 1  # a's second still waits, over its share
    await gate.release(a[0])
    await asyncio.wait_for(gate.started["tenant-a/busy-2"].wait(), 30)  # then a's second runs
    await gate.release(a[1])
    for task in held:
        assert (await task).exit_code == 0  # type: ignore[attr-defined]


@pytest.fixture
def tenants_up(tmp_path: Path, provider: str) -> Iterator[Up]:
    """``quill up --tenants`` (tenants a and b), its executor with the default 4 slots."""
    with running(tmp_path / ".quill", "--sandbox", provider, tenants=TENANTS) as stack:
        yield stack


async def test_with_tenants_one_saturating_the_executor_leaves_a_slot_for_the_other(
    tenants_up: Up, canaries: Canaries, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = tenants_up
    clients = {
        t: await Quill.connect(up.nats_url, user=t, password=PASSWORDS[t], actor=t, retries=0)
        for t in ("a", "b")
    }
    try:
        a = [await created(clients["a"], f"a/busy-{n}", None) for n in range(4)]  # --max-runs
        b = await created(clients["b"], "b/work", None)
        gate = Gate()
        held = [gate.run(ws) for ws in a]
        started = [gate.started[f"a/{ws.name}"] for ws in a]
        await eventually(lambda: sum(e.is_set() for e in started) >= 3, 60)  # a's share: 3 of 4
        result = await b.exec("echo b ran > b.txt; cat b.txt")  # no retry: b runs at once
        assert (result.exit_code, result.stdout) == (0, "b ran\n") and result.changes.committed
        assert not any(task.done() for task in held)
        assert sum(e.is_set() for e in started) == 3  # a's fourth still waits
        for ws, event in zip(a, started, strict=True):
            if event.is_set():
                await gate.release(ws)
        await eventually(lambda: all(e.is_set() for e in started), 60)
        for ws in a:
            await gate.release(ws)
        for task in held:
            assert (await task).exit_code == 0  # type: ignore[attr-defined]
    finally:
        for quill in clients.values():
            await quill.close()
    conf = (up.data / "nats" / "nats-server.conf").read_text()
    system = re.search(r'user: "quill-system", password: "([^"]+)"', conf)
    assert system is not None
    monkeypatch.setenv("QUILL_NATS_USER", "quill-system")
    monkeypatch.setenv("QUILL_NATS_PASSWORD", system.group(1))
    verify(up, "b/work")
    verify(up, "a/busy-0")
