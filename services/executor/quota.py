"""A checkout's disk quota (``max_checkout_bytes``): what it holds, and a command stopped when it
holds more.

What counts is what ``du`` counts: the blocks of every entry under the checkout's home (files,
directories, symlinks themselves; never what a symlink points at), hard links once. Ignored
directories (``node_modules``), files over ``max_file_bytes`` and everything else left
uncommitted count like the rest: they are on the executor's disk all the same.

``guard`` runs a command while measuring its checkout every ``WATCH_S`` (a ``scandir`` walk in
a thread: no file is read; ~25 ms for 10,000 files here, and for a bigger tree, every twice
the time a walk takes) and once more when it ends; over the limit it cancels the command,
which makes the provider kill the whole sandbox, and raises ``OverQuota``. The quota is sampled,
not a filesystem quota: a command may get past it by what it writes between two samples (with
``fallocate``, quickly), bounded per file by RLIMIT_FSIZE, which the executor sets no higher
than the quota. The data disk's reserve (``services/executor/disk.py``) is the backstop.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from contracts.errors import ErrorCode, QuillError
from infra import safefs

T = TypeVar("T")

WATCH_S = 0.25
"""How often a running command's checkout is measured."""


class Stopped(QuillError):
    """A command stopped (or ended) over its checkout's quota: nothing of it is kept."""


class OverQuota(Exception):
    """A checkout holds more than its quota."""

    def __init__(self, used: int, limit: int) -> None:
        super().__init__(f"{used} bytes over max_checkout_bytes={limit}")
        self.used, self.limit = used, limit

    def stopped(self) -> Stopped:
        """The error a command stopped for it answers (its changes were discarded)."""
        return Stopped(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"The command was stopped: the workspace's checkout reached {self.used} bytes on "
            f"disk, over max_checkout_bytes ({self.limit}); its changes were discarded and "
            "the checkout rebuilt from the log",
            {"limit": "max_checkout_bytes", "max_checkout_bytes": self.limit, "used": self.used},
        )

    def refused(self) -> QuillError:
        """The error a command refused before it starts answers (the log alone is over)."""
        return QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"The workspace's files take {self.used} bytes on the executor's disk, over "
            f"max_checkout_bytes ({self.limit}): no command can run until some are deleted",
            {"limit": "max_checkout_bytes", "max_checkout_bytes": self.limit, "used": self.used},
        )


def usage(root: Path) -> int:
    """Bytes on disk under ``root``, ``root`` included (0 if it does not exist). Blocking:
    run it in a thread. Entries vanishing during the walk are skipped. The walk runs while the
    command does, so it goes through ``safefs``: a directory the command swaps for a link is
    never followed (it would walk the host)."""
    try:
        top = safefs.Dir.open(root)
    except OSError:
        return 0
    with top:
        total = os.fstat(top.fd).st_blocks * 512
        seen: set[tuple[int, int]] = set()
        for _, _, _, st in safefs.walk(top, prune=lambda _: False):
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


async def measure(root: Path) -> int:
    return await asyncio.to_thread(usage, root)


async def guard(
    root: Path, limit: int, work: Awaitable[T], every: float = WATCH_S
) -> tuple[T, int]:
    """Run ``work`` while ``root`` holds at most ``limit`` bytes; return its result and the
    bytes ``root`` held when it ended.

    Raises:
        OverQuota: ``root`` went over ``limit`` (``work`` was cancelled, and waited for) or
            was over it when ``work`` ended.
        Exception: what ``work`` raised.
    """
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    wait = every
    try:
        while not (await asyncio.wait({task}, timeout=wait))[0]:
            began = loop.time()
            used = await measure(root)
            wait = max(every, 2 * (loop.time() - began))  # a big tree: a third of a core at most
            if used > limit and not task.done():
                await _stop(task)
                raise OverQuota(used, limit)
        result = task.result()
    finally:
        if not task.done():  # we were cancelled: so is the command, and it ends first
            await _stop(task)
    used = await measure(root)
    if used > limit:
        raise OverQuota(used, limit)
    return result, used


async def _stop(task: asyncio.Future[T]) -> None:
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: its failure while being stopped is not news
