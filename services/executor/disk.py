"""The executor's data disk: a reserve of free space it will not eat into, and a byte budget
for the checkouts it keeps between commands.

* ``Reserve``: below ``reserve`` free bytes on the data directory's filesystem (default
  max(1 GiB, 5% of it)), the executor refuses new commands with ``UNAVAILABLE`` (another
  executor may take them) rather than fill the disk it may share with JetStream.
* ``Budget``: the checkouts on disk, least recently used first, with the size each had when
  last used. Past the budget (bytes, or ``MOST_CHECKOUTS`` checkouts), idle checkouts are
  evicted whole, oldest first; one in use never is. An evicted checkout is rebuilt from the
  log the next time its workspace runs a command: only what the log does not hold is lost
  (ignored directories such as ``node_modules``, files left uncommitted).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from contracts.errors import ErrorCode, QuillError

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

    def space(self) -> tuple[int, int]:
        """(free bytes for the executor, the reserve in bytes)."""
        st = os.statvfs(self.path)
        size = st.f_blocks * st.f_frsize
        reserve = self.reserve if self.reserve is not None else max(GIB, size // 20)
        return st.f_bavail * st.f_frsize, reserve

    def inodes(self) -> tuple[int, int]:
        """(free inodes for the executor, the reserve: 5% of them); (0, 0) on a filesystem
        that has no fixed number of inodes (btrfs, some network filesystems report none).
        Blocks are not the only thing a command can exhaust: a million empty files take no
        blocks, and a filesystem out of inodes stops JetStream as surely as a full one."""
        st = os.statvfs(self.path)
        return (st.f_favail, st.f_files // 20) if st.f_files else (0, 0)

    def short(self) -> bool:
        free, reserve = self.space()
        inodes, inode_reserve = self.inodes()
        return free < reserve or inodes < inode_reserve

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
            try:
                when = (home / "manifest.bin").stat().st_mtime
            except OSError:
                when = 0.0
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
