"""A full disk as a named state: JetStream's storage limit, what "full" looks like, the gauges.

nats-server refuses a write to a stream once its JetStream storage use is over the server's
``max_file_store`` (``insufficient resources``, err_code 10023; an account's limit gives
10047 or 10002). That refusal is clean: nothing is stored, and writes go on as soon as the
limit is above the use again. A real ``ENOSPC`` is not: the stream keeps a sticky write error
and answers nothing more until the server restarts (nats-server ``stream.go``
``setWriteErrLocked``; on a cluster ``handleOutOfSpace`` shuts JetStream down). So Quill sets
``max_file_store`` itself, below the disk by a reserve (``jetstream_limit``), and raises it
while the server runs when the disk grows or space is freed (``quill_cli.natsserver``); it can
only raise it: nats-server refuses to lower it on a reload.

``FullState`` is one service's state (``log`` for JetStream, or the service whose own disk is
full); ``STORAGE_FULL`` shows it as ``quill_storage_full{service}``. Commands refused because
of it get ``ErrorCode.STORAGE_FULL`` (``log_full``, ``disk_full``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import prometheus_client as prom
from nats.js import JetStreamContext

from contracts.errors import ErrorCode, QuillError

log = logging.getLogger("quill.storage")

STORAGE_BYTES = prom.Gauge(
    "quill_jetstream_storage_bytes", "Bytes JetStream stores for Quill's account (all streams)."
)
STORAGE_LIMIT = prom.Gauge(
    "quill_jetstream_storage_limit_bytes",
    "JetStream's storage limit (max_file_store) as last learnt; 0 while unknown.",
)
STORAGE_FULL = prom.Gauge(
    "quill_storage_full",
    "1 while a disk is full: the log's (service=log) or a service's own.",
    ["service"],
)

LOG_FULL_CODES = frozenset({10023, 10047, 10002, 10028})
"""JetStream's err_codes for "over a storage limit": insufficient resources (the server's
``max_file_store``), insufficient storage resources, the account's limits, memory."""

POLL_S = 5.0
"""How often the writer reads JetStream's account info (one small request)."""
MIB = 1024 * 1024
MIN_RESERVE = 32 * MIB
RESERVE_SHARE = 0.05
"""The default reserve: 5% of the filesystem, at least ``MIN_RESERVE``."""


def log_full(reason: str = "") -> QuillError:
    """The error of a command refused because the log (JetStream) is at its storage limit."""
    detail = f" ({reason})" if reason else ""
    return QuillError(
        ErrorCode.STORAGE_FULL,
        "The log is full: JetStream reached its storage limit"
        f"{detail}. Free space or grow the disk of the NATS server (the limit then rises "
        "by itself), or raise --log-max-bytes; see docs/operations.md, Disk full.",
        {"service": "log"},
    )


def disk_full(service: str, what: str) -> QuillError:
    """The error of a request refused because ``service``'s own disk is full."""
    return QuillError(
        ErrorCode.STORAGE_FULL,
        f"The {service}'s disk is full ({what}). Free space or grow it: the {service} "
        "recovers by itself; see docs/operations.md, Disk full.",
        {"service": service},
    )


def is_log_full(exc: BaseException) -> bool:
    """Whether ``exc`` is JetStream refusing a write over a storage limit (an append's error,
    or nats-py's ``APIError`` from an object-store put)."""
    code = getattr(exc, "err_code", None) or getattr(exc, "code", None)
    if isinstance(code, int) and code in LOG_FULL_CODES:
        return True
    text = str(getattr(exc, "description", "") or exc).lower()
    return "insufficient resources" in text or "insufficient storage" in text


_T = TypeVar("_T")

MIN_STREAM_BYTES = 8 * 1024**2
"""The least a stream of Quill's own (``WS_OUTPUT``, ``WS_APPROVALS``) is given when
JetStream's storage limit cannot reserve the size it asks."""


async def fitted(
    name: str, size: int, ensure: Callable[[int], Awaitable[_T]], least: int = MIN_STREAM_BYTES
) -> _T:
    """``ensure(size)`` (create or update a stream of ``size`` bytes), the size halved while
    JetStream cannot reserve it (a stream reserves its ``max_bytes`` from the storage limit:
    on a small disk, ``quill up`` sets one), down to ``least``: a smaller stream, rather than a
    service that exits at every start.

    Raises:
        nats.js.errors.APIError: JetStream refused it at ``least`` too, or for another reason.
    """
    while True:
        try:
            return await ensure(size)
        except Exception as exc:
            if not is_log_full(exc) or size <= least:
                raise
            size = max(least, size // 2)
            log.warning(
                "%s: JetStream's storage limit cannot hold its size (%s): trying %d bytes",
                name,
                exc,
                size,
            )


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is this machine's disk being full (``ENOSPC``, a quota, SQLite's)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, sqlite3.OperationalError | sqlite3.DatabaseError):
        return "disk is full" in str(exc)
    return False


class FullState:
    """One service's "disk full" state, and its gauge."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.reason: str | None = None
        STORAGE_FULL.labels(service).set(0)

    @property
    def full(self) -> bool:
        return self.reason is not None

    def mark(self, reason: str) -> None:
        if self.reason is None:
            log.error("%s: storage full: %s", self.service, reason)
        self.reason = reason
        STORAGE_FULL.labels(self.service).set(1)

    def clear(self) -> None:
        if self.reason is None:  # the common case, on every write: nothing to do
            return
        log.warning("%s: storage no longer full", self.service)
        self.reason = None
        STORAGE_FULL.labels(self.service).set(0)

    def info(self) -> dict[str, Any]:
        """What a ping answer says of it (the gateway's ``/health`` reads it)."""
        return {"storage_full": self.reason} if self.reason is not None else {}


async def poll_log_usage(js: JetStreamContext, every: float = POLL_S) -> None:
    """Keep ``quill_jetstream_storage_bytes`` (and the account's limit, when it has one) up to
    date from JetStream's account info, every ``every`` seconds; runs until cancelled."""
    while True:
        try:
            info = await js.account_info()
            STORAGE_BYTES.set(info.storage)
            if info.limits.max_storage and info.limits.max_storage > 0:
                STORAGE_LIMIT.set(info.limits.max_storage)
        except Exception as exc:  # NATS failing over: the next round tries again
            log.debug("JetStream account info: %r", exc)
        await asyncio.sleep(every)


_STATES: dict[str, FullState] = {}


def state(service: str) -> FullState:
    """This process's ``FullState`` of ``service`` (one per service name)."""
    if service not in _STATES:
        _STATES[service] = FullState(service)
    return _STATES[service]


# ---------------------------------------------------------------- the limit (launcher side)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2}
_UNITS |= {"mib": MIB, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4}
_UNITS |= {"tib": 1024**4}


def parse_size(text: str) -> int:
    """``"512MiB"``, ``"20GB"``, ``"1048576"`` → bytes.

    Raises:
        ValueError: not a size.
    """
    number = text.strip().rstrip("bBiIkKmMgGtT")
    unit = text.strip()[len(number) :].lower()
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 512MiB, 20GB)") from None
    if unit not in _UNITS or not 0 <= value < 2**63:
        raise ValueError(f"not a size: {text!r} (e.g. 512MiB, 20GB)")
    return int(value * _UNITS[unit])


def tree_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (0 when it does not exist)."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def worth_raising(current: int, target: int) -> bool:
    """Whether ``target`` is enough above ``current`` to reload a server for (1 MiB or 1%)."""
    return target > current + max(MIB, current // 100)


def default_reserve(total_bytes: int) -> int:
    """What stays free on the store's filesystem: 5% of it, at least 32 MiB."""
    return max(MIN_RESERVE, int(total_bytes * RESERVE_SHARE))


def measure(store_dir: Path) -> tuple[int, int, int]:
    """(bytes the store holds, free bytes, the filesystem's size) for a store at
    ``store_dir`` (measured on its nearest existing parent while it does not exist)."""
    probe = store_dir
    while not probe.exists():
        probe = probe.parent
    st = os.statvfs(probe)
    return tree_bytes(store_dir), st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def shares_disk(store_dir: Path, other: Path) -> bool:
    """Whether the store is on the same filesystem as ``other`` (the services' data)."""
    probe = store_dir
    while not probe.exists():
        probe = probe.parent
    try:
        return probe.stat().st_dev == other.stat().st_dev
    except OSError:
        return True


@dataclass
class Limit:
    """JetStream's ``max_file_store`` for one store, and when it may grow.

    At start: what the store holds plus ``fraction`` of the free space beyond the reserve
    (``reserve``; None: ``default_reserve``), at most ``cap``, at least 1 MiB. ``fraction``
    is 1 for a store on a disk of its own; less when the disk is shared: with the services'
    data (their SQLite projections grow with the log: a reader keeps a copy of every content
    it served), or with other servers (``quill cluster up`` on one machine). Then, while it
    runs, it grows by ``fraction`` of what the room (the store plus the free space) gained:
    the disk grew, or something else freed space, never the log's own growth (which leaves
    the room as it is). It never shrinks (nats-server refuses to lower it on a reload);
    ``danger`` says when the disk is filling under it anyway.
    """

    store_dir: Path
    reserve: int | None = None
    cap: int | None = None
    fraction: float = 1.0
    limit: int = 0
    _uncapped: int = 0
    _room: int = 0

    def start(self) -> int:
        used, free, total = measure(self.store_dir)
        keep = default_reserve(total) if self.reserve is None else self.reserve
        self._room = used + free
        self._uncapped = used + int((free - keep) * self.fraction)
        self.limit = self._capped(self._uncapped)
        return self.limit

    def _capped(self, limit: int) -> int:
        return max(MIB, min(limit, self.cap) if self.cap is not None else limit)

    def grown(self) -> int | None:
        """The new limit, when the room (or ``cap``) has grown enough to raise it; else None."""
        used, free, _ = measure(self.store_dir)
        room = used + free
        uncapped = self._uncapped + int(max(0, room - self._room) * self.fraction)
        target = self._capped(uncapped)
        if not worth_raising(self.limit, target):
            return None
        self._room, self._uncapped, self.limit = max(room, self._room), uncapped, target
        return target

    def danger(self) -> bool:
        """Whether the disk may fill before the limit: free space under half the reserve
        while the limit is above what the store holds plus that free space."""
        used, free, total = measure(self.store_dir)
        keep = default_reserve(total) if self.reserve is None else self.reserve
        return free < keep // 2 and self.limit > used + free


def jetstream_limit(
    store_dir: Path, reserve: int | None = None, cap: int | None = None, fraction: float = 1.0
) -> int:
    """``Limit(...).start()``: the limit for a store at ``store_dir`` now."""
    return Limit(store_dir, reserve, cap, fraction).start()


EXECUTOR_BUDGET = 16 * 1024**3
"""The most ``executor_share`` gives one executor's checkouts (the executor's own default)."""


def executor_share(limits: list[Limit], executors: int = 1) -> tuple[int, int]:
    """(disk reserve, checkouts budget) for each of ``executors`` executors whose data shares
    the disk of the stores ``limits`` bound (each started). The reserve is the room the log was
    promised (each store's limit beyond what it holds now) plus the stores' own reserve: an
    executor refuses commands, and stops the one that grew most, before the free space falls
    under it, so no command takes the log's room. The budget is half of the free space beyond
    that reserve (the other half is the other services' data, a reader's copies), shared
    between the executors, at most ``EXECUTOR_BUDGET`` each.

    The reserve is fixed when the stack starts: as the log fills its room, the executor's room
    shrinks by as much (it keeps free what the log may still need, and some more), and the
    budget bounds the checkouts whatever the disk gains later.
    """
    room = keep = free = 0
    for limit in limits:
        used, free, total = measure(limit.store_dir)
        room += max(0, limit.limit - used)
        keep = max(keep, default_reserve(total) if limit.reserve is None else limit.reserve)
    reserve = keep + room
    budget = min(EXECUTOR_BUDGET, max(0, free - reserve) // 2 // max(1, executors))
    return reserve, budget
