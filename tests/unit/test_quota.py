"""services/executor/quota.py: what a checkout holds (like ``du``), and ``guard`` stopping work
that makes it hold more than its quota. Small files in tmp_path; no sandbox."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from contracts.errors import ErrorCode
from infra.exec.sandbox.interface import SandboxError
from services.executor import disk
from services.executor.quota import Allowed, DiskShort, OverQuota, guard, usage

KIB = 1024


def test_usage_counts_blocks_of_everything_never_through_a_link(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    (root / "node_modules" / "deep").mkdir(parents=True)
    (root / "node_modules" / "deep" / "big").write_bytes(b"x" * 200 * KIB)
    empty = usage(root)
    outside = tmp_path / "outside"
    outside.write_bytes(b"y" * 500 * KIB)
    (root / "link").symlink_to(outside)  # counted as a link, not as what it points at
    (root / "hard").write_bytes(b"z" * 100 * KIB)
    os.link(root / "hard", root / "hard2")  # one file, two names: counted once
    used = usage(root)
    assert 200 * KIB < empty < 300 * KIB
    assert 100 * KIB <= used - empty < 150 * KIB
    assert usage(tmp_path / "missing") == 0


def test_a_sparse_file_counts_its_apparent_size_and_fallocate_its_blocks(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    root.mkdir()
    empty = usage(root)
    with open(root / "sparse", "wb") as f:  # 1 GiB apparent, no blocks: as big as it says
        f.truncate(1024**3)
    assert (root / "sparse").stat().st_blocks == 0
    assert usage(root) - empty == 1024**3
    (root / "sparse").unlink()
    with open(root / "allocated", "wb") as f:  # allocated, never written: its blocks count
        os.posix_fallocate(f.fileno(), 0, 4 * 1024 * KIB)
    assert usage(root) - empty >= 4 * 1024 * KIB


async def test_guard_stops_work_that_goes_over_and_waits_for_it(tmp_path: Path) -> None:
    stopped = asyncio.Event()

    async def fill() -> None:
        try:
            for i in range(10_000):
                (tmp_path / f"f{i}").write_bytes(b"x" * 64 * KIB)
                await asyncio.sleep(0.001)
        finally:
            stopped.set()

    with pytest.raises(OverQuota) as info:
        await guard(tmp_path, 1024 * KIB, fill(), every=0.01)
    assert stopped.is_set() and info.value.used > info.value.limit == 1024 * KIB
    error = info.value.stopped()
    assert error.code == "SIZE_LIMIT_EXCEEDED" and error.details["limit"] == "max_checkout_bytes"


async def test_guard_checks_once_more_when_work_ends(tmp_path: Path) -> None:
    async def burst() -> str:
        (tmp_path / "big").write_bytes(b"x" * 300 * KIB)
        return "done"

    with pytest.raises(OverQuota):  # never sampled while it ran: caught at its end
        await guard(tmp_path, 100 * KIB, burst(), every=60)
    assert (await guard(tmp_path, 1024 * KIB, burst(), every=60))[0] == "done"


async def test_guard_returns_the_result_and_what_is_held(tmp_path: Path) -> None:
    async def small() -> int:
        (tmp_path / "a").write_bytes(b"x" * 10 * KIB)
        return 7

    result, (used, entries) = await guard(tmp_path, 1024 * KIB, small())
    assert result == 7 and used == usage(tmp_path) and entries == 2


async def test_guard_cancelled_cancels_its_work_first(tmp_path: Path) -> None:
    cancelled = asyncio.Event()
    running = asyncio.Event()

    async def forever() -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    outer = asyncio.create_task(guard(tmp_path, 1024 * KIB, forever(), every=0.01))
    await asyncio.wait_for(running.wait(), 5)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert cancelled.is_set()


async def test_guard_asks_its_allowance_at_each_sample(tmp_path: Path) -> None:
    """What it may hold can shrink while it runs (the budget others take): stopped when it
    is over what it is allowed then, and told which limit it was."""
    asked: list[int] = []
    room = 1024 * KIB

    async def allowance(used: int) -> Allowed:
        asked.append(used)
        return Allowed(room, "checkouts_budget", asked=64 * 1024 * KIB)

    async def fill() -> None:
        nonlocal room
        (tmp_path / "a").write_bytes(b"x" * 200 * KIB)
        room = 100 * KIB  # another checkout took the rest
        await asyncio.Event().wait()

    with pytest.raises(OverQuota) as info:
        await guard(tmp_path, allowance, fill(), every=0.01)
    error = info.value.stopped()
    assert error.details["limit"] == "checkouts_budget" and error.details["used"] > 100 * KIB
    assert "checkouts budget" in error.message and asked


class FakeReserve:
    """A disk under its reserve once ``short`` is set."""

    def __init__(self) -> None:
        self.short = False

    def shortage(self) -> tuple[str, int, int] | None:
        return ("bytes", 10, 100) if self.short else None

    def level(self) -> tuple[tuple[str, int, int] | None, float]:
        return self.shortage(), 0.0


async def test_the_disk_watch_stops_the_command_that_grew_most_and_only_it(
    tmp_path: Path,
) -> None:
    reserve = FakeReserve()
    watch = disk.Watch(reserve, every=0.005)  # type: ignore[arg-type]
    quiet, busy = tmp_path / "quiet", tmp_path / "busy"
    quiet.mkdir()
    busy.mkdir()
    (quiet / "old").write_bytes(b"q" * 500 * KIB)  # big, but it was so before it started
    wrote, over = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        (busy / "new").write_bytes(b"b" * 100 * KIB)
        wrote.set()
        await asyncio.Event().wait()

    async def idle() -> str:
        await wrote.wait()
        reserve.short = True  # the disk falls under its reserve
        await over.wait()  # the watch trips one command meanwhile; this one runs on
        return "untouched"

    stopped = asyncio.create_task(guard(busy, 1024**3, writer(), every=60, watch=watch))
    spared = asyncio.create_task(guard(quiet, 1024**3, idle(), every=60, watch=watch))
    with pytest.raises(DiskShort) as info:
        await stopped
    assert info.value.short.grown >= 100 * KIB
    error = info.value.stopped()
    assert error.code == "SIZE_LIMIT_EXCEEDED" and error.details["limit"] == "disk_reserve"
    info.value.release()
    reserve.short = False
    over.set()
    assert (await spared)[0] == "untouched"
    assert watch.stops == 1 and not watch.entries


def test_a_sandbox_that_found_the_disk_full_is_unavailable_not_failed(tmp_path: Path) -> None:
    """Room is checked as a request comes; an overlay mounted after it may still find no
    inode (taken since, or an eviction freed too few): that is the executor's disk, to retry
    elsewhere, not the command failing."""
    full = SandboxError("cannot mount the checkout's overlay: no space")
    full.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    roomy = disk.Reserve(tmp_path, reserve=0)
    answer = roomy.sandbox_failed(full, "run the command")
    assert answer.code == ErrorCode.UNAVAILABLE and answer.retriable
    assert answer.details["reason"] == "disk_reserve" and "full" in answer.message
    short = disk.Reserve(tmp_path, reserve=2**62).sandbox_failed(full, "run the command")
    assert short.code == ErrorCode.UNAVAILABLE and "under its reserve" in short.message
    broken = SandboxError("bwrap: setting up uid map: Permission denied")
    failed = roomy.sandbox_failed(broken, "start the shell")
    assert failed.code == ErrorCode.EXECUTION_FAILED
    assert failed.message == f"The sandbox could not start the shell: {broken}"
