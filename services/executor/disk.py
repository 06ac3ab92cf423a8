"""The executor's data disk: a reserve of free space it will not eat into, and a byte budget
for its checkouts.

* ``Reserve``: below ``reserve`` free bytes on the data directory's filesystem (default
  max(1 GiB, 5% of it); under ``quill up``, what the log was promised plus its own reserve,
  ``infra.storage.executor_share``), the executor refuses new commands with ``UNAVAILABLE``
  (another executor may take them) rather than fill the disk it may share with JetStream.
* ``Watch``: while commands run, the free space every ``WATCH_S`` near the reserve (up to
  ``WATCH_MAX_S`` far from it: no sooner than the disk could fill); under the reserve, the
  running command whose checkout grew the most since it started is stopped (one at a time,
  each once the last one stopped is gone; if none grew, their checkouts are walked again
  ``CALM_S`` later). A ``statvfs`` is a few microseconds, so this is what bounds a command
  between two walks of its checkout (``quota``): it can take past the reserve only what it
  writes in ``WATCH_S``, filling no faster than ``FILL_BYTES_S``.
* ``Budget``: the checkouts on disk, least recently used first, with the size each had when
  last measured (a running one's every walk). The checkouts together may hold the budget
  (``quota.Allowed``): a running command may take what the others leave, after idle ones are
  evicted. Past the budget (bytes, or ``MOST_CHECKOUTS`` checkouts), idle checkouts are
  evicted whole, oldest first; one in use never is. An evicted checkout is rebuilt from the
  log the next time its workspace runs a command: only what the log does not hold is lost
  (ignored directories such as ``node_modules``, files left uncommitted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from contracts.errors import ErrorCode, QuillError
from infra import storage

log = logging.getLogger("quill.executor")

Key = tuple[str, str]
"""(tenant, workspace)"""

GIB = 1024**3
MOST_CHECKOUTS = 10_000
"""Checkouts kept on disk at most, however small (each is a row here, and inodes there)."""


@dataclass(frozen=True)
class Reserve:
    """Free space on the data disk that commands may not take."""

    path: Path
    reserve: int | None = None
    """Bytes; None: max(1 GiB, 5% of the filesystem)."""

    def space(self, st: os.statvfs_result | None = None) -> tuple[int, int]:
        """(free bytes for the executor, the reserve in bytes)."""
        st = os.statvfs(self.path) if st is None else st
        size = st.f_blocks * st.f_frsize
        reserve = self.reserve if self.reserve is not None else max(GIB, size // 20)
        return st.f_bavail * st.f_frsize, reserve

    def inodes(self, st: os.statvfs_result | None = None) -> tuple[int, int]:
        """(free inodes for the executor, the reserve: 5% of them); (0, 0) on a filesystem
        that has no fixed number of inodes (btrfs, some network filesystems report none).
        Blocks are not the only thing a command can exhaust: a million empty files take no
        blocks, and a filesystem out of inodes stops JetStream as surely as a full one."""
        st = os.statvfs(self.path) if st is None else st
        return (st.f_favail, st.f_files // 20) if st.f_files else (0, 0)

    def short(self) -> bool:
        return self.shortage() is not None

    def shortage(self) -> tuple[str, int, int] | None:
        """(unit, free, reserve) of what is under the reserve (bytes first), or None."""
        return self.level()[0]

    def level(self) -> tuple[tuple[str, int, int] | None, float]:
        """``shortage``, and how soon the disk could fall under its reserve, filling as fast
        as ``FILL_BYTES_S`` and ``FILL_INODES_S`` (seconds; 0 when it is under): one
        ``statvfs``."""
        st = os.statvfs(self.path)
        soon = float("inf")
        levels = (
            ("bytes", self.space(st), FILL_BYTES_S),
            ("inodes", self.inodes(st), FILL_INODES_S),
        )
        for unit, (free, reserve), rate in levels:
            if free < reserve:
                return (unit, free, reserve), 0.0
            if reserve:
                soon = min(soon, (free - reserve) / rate)
        return None, soon

    def sandbox_failed(self, exc: BaseException, doing: str) -> QuillError:
        """The error for a sandbox that could not ``doing`` (e.g. "run the command"):
        ``UNAVAILABLE`` (``disk_reserve``, retriable: another executor may take it) when the
        data disk was full for it (the room was checked as the request came: taken since, or
        what an eviction freed was too little for an overlay's inodes), else
        ``EXECUTION_FAILED``."""
        cause = exc.__cause__ or exc
        if not storage.is_disk_full(cause):
            return QuillError(ErrorCode.EXECUTION_FAILED, f"The sandbox could not {doing}: {exc}")
        try:
            self.check()
        except QuillError as short:
            return short
        return QuillError(
            ErrorCode.UNAVAILABLE,
            f"Executor refusing the command: its data disk was full for it ({cause}); retry, "
            "another executor may take it",
            {"reason": "disk_reserve"},
        )

    def check(self) -> None:
        """Raises:
        QuillError: ``UNAVAILABLE`` when free space (or free inodes) is below the reserve."""
        for unit, (free, reserve) in (("inodes", self.inodes()), ("bytes", self.space())):
            if free < reserve:
                raise QuillError(
                    ErrorCode.UNAVAILABLE,
                    f"Executor refusing new commands: its data disk has {free} {unit} free, "
                    f"under its reserve of {reserve} {unit} (disk_reserve); retry, another "
                    "executor may take it",
                    {"reason": "disk_reserve", f"free_{unit}": free, f"reserve_{unit}": reserve},
                )


WATCH_S = 0.02
"""How often the disk watch reads the free space while commands run (a ``statvfs``), near
the reserve; further from it, as seldom as the disk could reach it (``FILL_BYTES_S``), at
most every ``WATCH_MAX_S``."""
WATCH_MAX_S = 1.0
FILL_BYTES_S = 4 * GIB
"""The fastest the watch assumes a disk fills (bytes a second: beyond what NVMe drives
write); with more room than this over the reserve, it looks again up to a second later."""
FILL_INODES_S = 1_000_000
"""The fastest it assumes inodes are taken (files made a second, by all commands)."""
CALM_S = 1.0
"""Under the reserve with no running command grown, how long before their checkouts are
walked again (at least twice the time the walks took)."""


@dataclass(frozen=True)
class Short:
    """The disk under its reserve, and what the command stopped for it had grown by."""

    unit: str
    """``bytes`` or ``inodes``."""
    free: int
    reserve: int
    grown: int


Held = Callable[[], Awaitable[tuple[int, int]]]
"""What a running command's directories hold now: (bytes, entries)."""


@dataclass(eq=False)
class Entry:
    """One running command the watch may stop."""

    held: Held
    started: tuple[int, int]
    """(bytes, entries) when it started."""
    tripped: asyncio.Event = field(default_factory=asyncio.Event)
    short: Short | None = None
    """Set with ``tripped``: why it is to stop."""


class Watch:
    """Free space while commands run; the command that grew most stopped under the reserve."""

    def __init__(self, reserve: Reserve, every: float = WATCH_S) -> None:
        self.reserve, self.every = reserve, every
        self.entries: list[Entry] = []
        self.stops = 0
        """Commands stopped so far (for the executor's info)."""
        self._task: asyncio.Task[None] | None = None

    def enter(self, held: Held, started: tuple[int, int]) -> Entry:
        """Watch a command from now (its directories held ``started``) until ``leave``."""
        entry = Entry(held, started)
        self.entries.append(entry)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="disk-watch")
        return entry

    def leave(self, entry: Entry) -> None:
        with contextlib.suppress(ValueError):
            self.entries.remove(entry)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        calm_until = 0.0
        wait = self.every
        while self.entries:
            await asyncio.sleep(wait)
            wait = self.every
            if any(e.tripped.is_set() for e in self.entries):
                continue  # one is being stopped: its checkout is rebuilt, then look again
            try:
                shortage, soon = self.reserve.level()
            except OSError as exc:  # the data directory's filesystem is gone: next round
                log.warning("disk watch: %s", exc)
                continue
            wait = min(max(self.every, soon), WATCH_MAX_S)
            if shortage is None or loop.time() < calm_until:
                continue
            began = loop.time()
            if not await self._stop_one(*shortage):  # none grew: walk again later, not at once
                calm_until = loop.time() + max(CALM_S, 2 * (loop.time() - began))

    async def _stop_one(self, unit: str, free: int, reserve: int) -> bool:
        """Trip the command that grew most (in ``unit``) since it started; whether one
        had."""
        index = 0 if unit == "bytes" else 1
        best: tuple[int, Entry] | None = None
        for entry in list(self.entries):
            try:
                grown = (await entry.held())[index] - entry.started[index]
            except OSError:
                continue
            if grown > 0 and (best is None or grown > best[0]):
                best = (grown, entry)
        if best is None:
            return False  # the disk fills from elsewhere: new commands are refused
        grown, entry = best
        log.warning(
            "data disk under its reserve (%d %s free, reserve %d): stopping the command that "
            "grew most (%d %s)",
            free,
            unit,
            reserve,
            grown,
            unit,
        )
        entry.short = Short(unit, free, reserve, grown)
        entry.tripped.set()
        self.stops += 1
        return True


@dataclass
class Budget:
    """The checkouts on disk by last use, and which idle ones to evict."""

    budget: int
    sizes: dict[Key, int] = field(default_factory=dict)
    """Least recently used first."""
    most: int = MOST_CHECKOUTS
    """Checkouts at most, whatever their bytes."""

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    def others(self, key: Key | None) -> int:
        """What the checkouts but ``key`` hold."""
        return self.total - (self.sizes.get(key, 0) if key is not None else 0)

    def used(self, key: Key, size: int) -> None:
        """``key`` was just used and holds ``size`` bytes."""
        self.sizes.pop(key, None)
        self.sizes[key] = size

    def forget(self, key: Key) -> None:
        self.sizes.pop(key, None)

    def over(self, busy: Callable[[Key], bool]) -> list[Key]:
        """Idle checkouts to evict, least recently used first, to get within the budget (its
        bytes and ``most``)."""
        excess, extra, out = self.total - self.budget, len(self.sizes) - self.most, []
        for key, size in self.sizes.items():
            if excess <= 0 and extra <= 0:
                break
            if not busy(key):
                out.append(key)
                excess, extra = excess - size, extra - 1
        return out

    def idle(self, busy: Callable[[Key], bool]) -> Iterator[Key]:
        """Every idle checkout, least recently used first."""
        return iter([key for key in self.sizes if not busy(key)])


def found(checkouts: Path) -> list[tuple[Key, Path]]:
    """The checkouts under ``checkouts`` (``<tenant>/<workspace>``), least recently used first
    (by their manifest's time), as an earlier executor left them."""
    homes: list[tuple[float, Key, Path]] = []
    for tenant in _dirs(checkouts):
        for home in _dirs(tenant):
            when = 0.0
            for name in ("manifest.bin", "manifest.log"):  # infra.exec.manifest: the newest
                with contextlib.suppress(OSError):
                    when = max(when, (home / name).stat().st_mtime)
            homes.append((when, (tenant.name, home.name), home))
    return [(key, home) for _, key, home in sorted(homes)]


def _dirs(path: Path) -> list[Path]:
    try:
        entries = list(os.scandir(path))
    except OSError:
        return []
    return [
        Path(e.path)
        for e in entries
        if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
    ]
