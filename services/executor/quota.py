"""A checkout's disk quota: what it holds, and a command stopped when it holds more than it may.

What a checkout may hold (``Allowed``) is the least of its workspace's ``max_checkout_bytes``,
the executor's ceiling for any one checkout (``--max-checkout-mb``) and what the executor's
checkouts budget leaves it beside the others (``services/executor/checkouts.py`` says which);
a workspace asking for 64 GiB gets what the operator allows, never more.

What counts is what ``du`` counts, with one difference: the blocks of every entry under the
checkout's home (files, directories, symlinks themselves; never what a symlink points at), hard
links once, and a regular file at least its apparent size. So ``fallocate``'s blocks count
(they are allocated, written or not), and a sparse file counts as big as it says: it takes
little now, but any program that copies it (an archive, a ``cp``) writes it whole, and it is
how a command would hide bytes from a blocks-only count. Ignored directories
(``node_modules``), files over ``max_file_bytes`` and everything else left uncommitted count
like the rest: they are on the executor's disk all the same.

``guard`` runs a command while measuring its checkout every ``WATCH_S`` (a ``scandir`` walk in
a thread: no file is read; ~25 ms for 10,000 files here, and for a bigger tree, every twice the
time a walk takes; a shell's checkout, written in place for the shell's whole life, is not
walked: its watch keeps a running total, ``watched``) and once more when it ends; over what it
may hold it cancels the command, which makes the provider kill the whole sandbox, and raises
``OverQuota``. The walk is sampled; what bounds a command between two walks is the disk watch
(``disk.Watch``: free space every 20 ms, stopping the command that grew most when the disk
reaches its reserve, raising ``DiskShort``), the command's RLIMIT_FSIZE (no one file larger
than it may hold, ``fallocate`` included) and, under bwrap, the sandbox's seccomp filter, which
refuses ``fallocate`` (but to punch holes): a command allocates only as fast as it writes.
"""

from __future__ import annotations

import asyncio
import functools
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from contracts.errors import ErrorCode, QuillError
from infra import safefs
from infra.exec.watch import TreeWatch
from services.executor import disk

T = TypeVar("T")

TREE = "tree"
"""A checkout's files, under its home (``infra.exec.checkout``)."""
WATCH_S = 0.25
"""How often a running command's checkout is measured."""


@dataclass(frozen=True)
class Allowed:
    """What a checkout may hold now, and which limit says so."""

    bytes: int
    limit: str = "max_checkout_bytes"
    """``max_checkout_bytes`` (the workspace's, or the executor's ceiling below it) or
    ``checkouts_budget`` (what the executor's budget leaves beside its other checkouts)."""
    asked: int | None = None
    """The workspace's own ``max_checkout_bytes``, when a lower limit applies."""

    def details(self, used: int) -> dict[str, object]:
        out: dict[str, object] = {"limit": self.limit, self.limit: self.bytes, "used": used}
        if self.limit == "max_checkout_bytes" and self.asked is not None:
            out["workspace_max_checkout_bytes"] = self.asked
        elif self.limit == "checkouts_budget":
            out["max_checkout_bytes"] = self.asked
        return out

    def named(self) -> str:
        """``max_checkout_bytes (N)``, with why when it is not the workspace's own value."""
        if self.limit == "checkouts_budget":
            return (
                f"what the executor's checkouts budget leaves it beside its other checkouts "
                f"({self.bytes})"
            )
        if self.asked is not None:
            return (
                f"max_checkout_bytes ({self.bytes}: the executor's ceiling; the workspace "
                f"asked for {self.asked})"
            )
        return f"max_checkout_bytes ({self.bytes})"


Allowance = Callable[[int], Awaitable[Allowed]]
"""Given what the checkout holds now, what it may hold (it may evict idle checkouts first)."""


class Stopped(QuillError):
    """A command stopped (or ended) over its checkout's quota: nothing of it is kept."""


class OverQuota(Exception):
    """A checkout holds more than it may."""

    def __init__(self, used: int, limit: int | Allowed) -> None:
        allowed = limit if isinstance(limit, Allowed) else Allowed(limit)
        super().__init__(f"{used} bytes over {allowed.limit}={allowed.bytes}")
        self.used, self.limit, self.allowed = used, allowed.bytes, allowed

    def stopped(self) -> Stopped:
        """The error a command stopped for it answers (its changes were discarded)."""
        return Stopped(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"The command was stopped: the workspace's checkout reached {self.used} bytes on "
            f"disk, over {self.allowed.named()}; its changes were discarded and "
            "the checkout rebuilt from the log",
            self.allowed.details(self.used),
        )

    def refused(self) -> QuillError:
        """The error a command refused before it starts answers (the log alone is over)."""
        return QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"The workspace's files take {self.used} bytes on the executor's disk, over "
            f"{self.allowed.named()}: no command can run until some are deleted",
            self.allowed.details(self.used),
        )


class DiskShort(Exception):
    """The data disk fell under its reserve while the command ran, and it grew the most. The
    watch stops no other command until ``release`` (call it once the checkout is rebuilt: then
    the space it took is free again)."""

    def __init__(self, short: disk.Short, release: Callable[[], None] = lambda: None) -> None:
        super().__init__(f"{short.free} {short.unit} free, under the reserve of {short.reserve}")
        self.short, self.release = short, release

    def stopped(self) -> Stopped:
        s = self.short
        return Stopped(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"The command was stopped: the executor's data disk fell to {s.free} {s.unit} "
            f"free, under its reserve of {s.reserve} (kept for the log), while this command "
            f"grew its checkout by {s.grown} {s.unit}, more than any other; its changes were "
            "discarded and the checkout rebuilt from the log",
            {
                "limit": "disk_reserve",
                f"free_{s.unit}": s.free,
                f"reserve_{s.unit}": s.reserve,
                "grown": s.grown,
            },
        )


def file_bytes(st: os.stat_result) -> int:
    """What one entry counts: its blocks, and a regular file at least its apparent size."""
    blocks = st.st_blocks * 512
    return max(blocks, st.st_size) if stat.S_ISREG(st.st_mode) else blocks


def usage(root: Path) -> int:
    """Bytes under ``root``, ``root`` included (0 if it does not exist), as the module's
    docstring counts them. Blocking: run it in a thread. Entries vanishing during the walk are
    skipped. The walk runs while the command does, so it goes through ``safefs``: a directory
    the command swaps for a link is never followed (it would walk the host)."""
    return held(root)[0]


def held(root: Path, skip: str | None = None) -> tuple[int, int]:
    """(bytes, entries) under ``root``: ``usage`` and the inodes it takes (``skip``: a
    directory directly under it left out, itself and all below it)."""
    try:
        top = safefs.Dir.open(root)
    except OSError:
        return 0, 0
    with top:
        total, entries = file_bytes(os.fstat(top.fd)), 1
        seen: set[tuple[int, int]] = set()
        for _, _, _, st in safefs.walk(top, prune=lambda rel: rel == skip):
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            total += file_bytes(st)
            entries += 1
    return total, entries


def watched(home: Path, watch: TreeWatch) -> Callable[[], tuple[int, int]]:
    """What a shell's checkout (``home``) holds, as ``held`` counts it, without walking its
    ``tree/``: what is beside the tree (walked now, once: only the executor writes there) plus
    the tree's running total, kept by its watch (``infra.exec.watch``); a walk of the tree
    when the watch cannot say (past the watches it may hold). Blocking: call both in a
    thread."""
    beside = held(home, skip=TREE)

    def measure() -> tuple[int, int]:
        tree = watch.held()
        if tree is None:
            tree = held(home / TREE)
        return beside[0] + tree[0], beside[1] + tree[1]

    return measure


async def measure(root: Path) -> int:
    return await asyncio.to_thread(usage, root)


async def measure_held(root: Path) -> tuple[int, int]:
    return await asyncio.to_thread(held, root)


async def guard(
    root: Path,
    limit: int | Allowance,
    work: Awaitable[T],
    every: float = WATCH_S,
    *,
    watch: disk.Watch | None = None,
    started: tuple[int, int] | None = None,
    also: tuple[Path, ...] = (),
    measure: Callable[[], tuple[int, int]] | None = None,
    then: Callable[[T], Awaitable[None]] | None = None,
) -> tuple[T, tuple[int, int]]:
    """Run ``work`` while ``root`` holds at most what ``limit`` allows (bytes, or an
    ``Allowance`` asked at each sample); return its result and what ``root`` held when it
    ended (bytes, entries). With ``watch``, the command is also stopped when the disk falls
    under its reserve and it grew the most since it started (``started``: what ``root`` held
    then, when the caller knows, else measured here first; ``also``: other directories it
    writes to, counted in its growth, measured here first). ``measure``: what ``root`` holds
    (bytes, entries), blocking, in place of a walk of it (a command over an overlay: what it
    held, plus its layer). ``then``: what follows ``work`` once it ended well, before what
    ``root`` holds is measured the last time, outside the disk watch (the merge of its layer:
    the command has ended, nothing of it is to be stopped any more).

    Raises:
        OverQuota: ``root`` went over what it may hold (``work`` was cancelled, and waited
            for) or was over it when ``work`` ended.
        DiskShort: the disk watch stopped it.
        Exception: what ``work`` raised.
    """
    allowance = _fixed(limit) if isinstance(limit, int) else limit
    entry: disk.Entry | None = None
    if watch is not None:  # what it starts from, measured before it can write
        mine = started if started is not None else await asyncio.to_thread(held, root)
        more = await _held(None, also)
        entry = watch.enter(lambda: _held(root, also), (mine[0] + more[0], mine[1] + more[1]))
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    wait = every
    try:
        tripped = entry.tripped if entry is not None else asyncio.Event()
        while True:
            tripper = asyncio.ensure_future(tripped.wait())
            try:
                await asyncio.wait({task, tripper}, timeout=wait, return_when="FIRST_COMPLETED")
            finally:
                tripper.cancel()
            if task.done():
                break
            if entry is not None and watch is not None and entry.short is not None:
                await _stop(task)
                short, leave = entry.short, functools.partial(watch.leave, entry)
                entry = None  # left by the caller, through release
                raise DiskShort(short, leave)
            began = loop.time()
            if measure is None:
                used = await asyncio.to_thread(usage, root)
            else:
                used = (await asyncio.to_thread(measure))[0]
            wait = max(every, 2 * (loop.time() - began))  # a big tree: a third of a core at most
            allowed = await allowance(used)
            if used > allowed.bytes and not task.done():
                await _stop(task)
                raise OverQuota(used, allowed)
        result = task.result()
    finally:
        if not task.done():  # we were cancelled: so is the command, and it ends first
            await _stop(task)
        if entry is not None and watch is not None:
            watch.leave(entry)
    if then is not None:
        await then(result)
    ended = await asyncio.to_thread(measure or functools.partial(held, root))
    allowed = await allowance(ended[0])
    if ended[0] > allowed.bytes:
        raise OverQuota(ended[0], allowed)
    return result, ended


def _fixed(limit: int) -> Allowance:
    async def allowance(_: int) -> Allowed:
        return Allowed(limit)

    return allowance


async def _held(root: Path | None, also: tuple[Path, ...]) -> tuple[int, int]:
    def walk() -> tuple[int, int]:
        total = held(root) if root is not None else (0, 0)
        for path in also:
            more = held(path)
            total = (total[0] + more[0], total[1] + more[1])
        return total

    return await asyncio.to_thread(walk)


async def _stop(task: asyncio.Future[T]) -> None:
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: its failure while being stopped is not news
