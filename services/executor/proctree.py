"""A command's processes, found in /proc, signalled through pidfds; and its output, read in chunks.

Only ``sandbox`` uses this module. Two ways to find every process of one command:

* ``in_pid_namespace``: every host process whose ``/proc/<pid>/ns/pid`` is the sandbox's PID
  namespace (bwrap). Nothing can leave a PID namespace, so this is exact.
* ``marked``: every process in the command's session, or whose environment carries the
  command's marker variable (local). A process that both leaves the session (``setsid``) and
  drops the marker from its environment (``env -i``) escapes it.

Signals go through a pidfd opened before the process is checked, so a recycled pid is never hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Literal

StreamName = Literal["stdout", "stderr"]
Finder = Callable[[], list[int]]
"""Returns pidfds of the live processes to signal (the caller closes them)."""

CHUNK = 64 * 1024


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:  # gone already
        return None


def in_pid_namespace(ns_inode: int, spare: int) -> Finder:
    """Processes in the PID namespace ``ns_inode`` but ``spare`` (its init, host pid)."""

    def find() -> list[int]:
        found = []
        for pid in _pids():
            if pid == spare or _ns_inode(pid) != ns_inode:
                continue
            fd = _open(pid)
            if fd is not None and _ns_inode(pid) == ns_inode:
                found.append(fd)
            elif fd is not None:
                os.close(fd)
        return found

    return find


def _ns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def ticks_now() -> int:
    """The clock /proc/<pid>/stat's start times count in (ticks since boot), rounded down."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def marked(session: int, marker: bytes, since: int) -> Finder:
    """Live processes started at ``since`` (``ticks_now()``) or later that are in ``session`` or
    whose initial environment holds ``marker``. Older processes cannot be the command's, and
    their environments are not read."""

    def find() -> list[int]:
        found = []
        for pid in _pids():
            start = _ours(pid, session, marker, since)
            if start is None:
                continue
            fd = _open(pid)
            if fd is not None and _start(pid) == start:  # still the same process
                found.append(fd)
            elif fd is not None:
                os.close(fd)
        return found

    return find


def _stat(pid: int) -> list[bytes] | None:
    """Fields of /proc/<pid>/stat from the state on (field 3)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _ours(pid: int, session: int, marker: bytes, since: int) -> int | None:
    """The process's start time if it is one of the command's, alive; else None."""
    fields = _stat(pid)
    if fields is None or fields[0] in (b"Z", b"X"):  # a zombie holds nothing, cannot be killed
        return None
    start = int(fields[19])
    if start < since:
        return None
    if int(fields[3]) == session:
        return start
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return start if marker in f.read().split(b"\0") else None
    except OSError:
        return None


def send(pidfds: list[int], sig: int) -> None:
    """Signal each process and close its pidfd."""
    for fd in pidfds:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, sig)
        os.close(fd)


async def wait_exited(pidfds: list[int], timeout: float) -> bool:
    """Wait until every process has exited (its pidfd is readable), at most ``timeout``.

    Does not close the pidfds. Returns whether all exited.
    """
    if not pidfds:
        return True
    loop = asyncio.get_running_loop()
    futures = []
    for fd in pidfds:
        future: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, loop, fd, future)
        futures.append(future)
    try:
        _, pending = await asyncio.wait(futures, timeout=timeout)
        return not pending
    finally:
        for fd in pidfds:
            loop.remove_reader(fd)


def _resolve(loop: asyncio.AbstractEventLoop, fd: int, future: asyncio.Future[None]) -> None:
    loop.remove_reader(fd)
    if not future.done():
        future.set_result(None)


async def kill_all(find: Finder, rounds: int = 50, timeout: float = 5.0) -> None:
    """SIGKILL every process ``find`` returns, wait for them to die, repeat until none is left
    (a process may fork between the scan and the signal)."""
    for _ in range(rounds):
        pidfds = find()
        if not pidfds:
            return
        try:
            for fd in pidfds:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            await wait_exited(pidfds, timeout)
        finally:
            for fd in pidfds:
                os.close(fd)


class Output:
    """Reads a command's stdout and stderr pipes: keeps the first ``cap`` bytes of each, counts
    every byte, and hands each chunk to ``on_output``, one call at a time.

    An exception from ``on_output`` stops the reading; ``failed`` is then set and ``error`` holds
    it, for the caller to end the command and raise it.
    """

    def __init__(
        self, cap: int, on_output: Callable[[StreamName, bytes], Awaitable[None]] | None
    ) -> None:
        self.cap = cap
        self.kept: dict[StreamName, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.counts: dict[StreamName, int] = {"stdout": 0, "stderr": 0}
        self.failed = asyncio.Event()
        self.error: BaseException | None = None
        self._on_output = on_output
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._transports: list[asyncio.BaseTransport] = []

    async def attach(self, stream: StreamName, fd: int) -> None:
        """Start reading the pipe's read end ``fd`` (this takes ownership of it)."""
        self._tasks.append(asyncio.create_task(self._pump(stream, await self.reader(fd))))

    async def reader(self, fd: int) -> asyncio.StreamReader:
        """A StreamReader over a pipe's read end (closed with this Output)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=CHUNK)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        self._transports.append(transport)
        return reader

    async def _pump(self, stream: StreamName, reader: asyncio.StreamReader) -> None:
        kept = self.kept[stream]
        while chunk := await reader.read(CHUNK):
            if len(kept) < self.cap:
                kept += chunk[: self.cap - len(kept)]
            self.counts[stream] += len(chunk)
            if self._on_output is not None:
                async with self._lock:
                    try:
                        await self._on_output(stream, chunk)
                    except Exception as e:
                        self.error = e
                        self.failed.set()
                        return

    async def finish(self, timeout: float) -> None:
        """Read what is left, at most ``timeout`` (a process that escaped may hold a pipe open),
        then close the pipes."""
        try:
            if self._tasks:
                _, pending = await asyncio.wait(self._tasks, timeout=timeout)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            self.close()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for transport in self._transports:
            transport.close()
