"""A command's processes, found in /proc, signalled through pidfds; and its output, read in chunks.

Only the providers (``bwrap``, ``local``) use this module. Two ways to find every process of one
command:

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
from collections.abc import Callable
from typing import NamedTuple

from infra.exec.sandbox.interface import OnOutput, StreamName


class Found(NamedTuple):
    """A live process: ``key`` (pid, start time) names it for good; ``fd`` is a pidfd on it."""

    key: tuple[int, int]
    fd: int


Finder = Callable[[], list[Found]]
"""Returns the live processes to signal (the caller closes their pidfds)."""

CHUNK = 64 * 1024


def in_pid_namespace(ns_inode: int, spare: int) -> Finder:
    """Processes in the PID namespace ``ns_inode`` but ``spare`` (its init, host pid)."""

    def belongs(pid: int, stat: list[bytes]) -> bool:
        return pid != spare and _ns_inode(pid) == ns_inode

    return lambda: _find(belongs)


def ticks_now() -> int:
    """The clock /proc/<pid>/stat's start times count in (ticks since boot), rounded down."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


class Marked:
    """Live processes started at ``since`` (``ticks_now()``) or later that are in ``session`` or
    whose initial environment holds ``marker``. Older processes cannot be the command's, and
    their environments are not read.

    ``sure``: whether the last scan that found none proves none is left: no process it looked
    at read with an empty environment (one in the middle of ``execve`` does), and none listed
    in /proc was gone before it was read (one of the command's could have forked a child after
    the listing, then ended). Otherwise only more scans in a row can tell (``kill_all``)."""

    def __init__(self, session: int, marker: bytes, since: int) -> None:
        self.session, self.marker, self.since = session, marker, since
        self.sure = False

    def __call__(self) -> list[Found]:
        self.sure = True
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            if (stat := _stat(int(name))) is None:
                self.sure = False
            elif (process := _claim(int(name), self._belongs, stat)) is not None:
                found.append(process)
        return found

    def _belongs(self, pid: int, stat: list[bytes]) -> bool:
        if int(stat[19]) < self.since:
            return False
        if int(stat[3]) == self.session:
            return True
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            return False
        if not environ and not int(stat[6]) & _KERNEL_THREAD:
            self.sure = False
        return self.marker in environ.split(b"\0")


_KERNEL_THREAD = 0x00200000
"""PF_KTHREAD in /proc/<pid>/stat's flags: a kernel thread, whose environment is always empty."""


def marked(session: int, marker: bytes, since: int) -> Marked:
    """The processes of a command (``Marked``)."""
    return Marked(session, marker, since)


def sandboxes_under(binary: str, root: str) -> Finder:
    """What sandboxes over a directory under ``root`` left behind: the ``binary`` (bwrap)
    processes whose working directory is under ``root`` (the provider starts bwrap there; its
    options come from a file) or whose arguments name such a directory, and every process in
    the PID namespaces they made. An executor SIGKILLed while bwrap still waited for its user
    namespace's map leaves bwrap blocked for good (``--die-with-parent`` is not armed yet);
    only an earlier executor on the same data directory can have started these."""
    binary = os.path.realpath(binary)
    prefix = os.fsencode(root.rstrip("/")) + b"/"
    host = _ns_inode(os.getpid())

    def find() -> list[Found]:
        namespaces: set[int] = set()

        def is_sandbox(pid: int, stat: list[bytes]) -> bool:
            try:
                if os.readlink(f"/proc/{pid}/exe") != binary:
                    return False
                cwd = os.fsencode(os.readlink(f"/proc/{pid}/cwd")) + b"/"
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                return False
            if not any(arg.startswith(prefix) for arg in (cwd, *argv)):
                return False
            for member in (pid, *children(pid)):  # bwrap's monitor and the sandbox's init
                ns = _ns_inode(member)
                if ns is not None and ns != host:
                    namespaces.add(ns)
            return True

        found = _find(is_sandbox)
        seen = {process.key[0] for process in found}
        if namespaces:
            found += _find(lambda pid, _: pid not in seen and _ns_inode(pid) in namespaces)
        return found

    return find


def _find(belongs: Callable[[int, list[bytes]], bool]) -> list[Found]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (process := _claim(int(name), belongs)) is not None:
            found.append(process)
    return found


def _claim(
    pid: int, belongs: Callable[[int, list[bytes]], bool], stat: list[bytes] | None = None
) -> Found | None:
    """A pidfd on ``pid`` if it is alive (no zombie) and ``belongs``; checked again once the
    pidfd is open, so that it is the process that was checked and not a successor (``stat``:
    its fields, read already)."""
    stat = stat if stat is not None else _stat(pid)
    if stat is None or stat[0] in (b"Z", b"X") or not belongs(pid, stat):
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already
        return None
    again = _stat(pid)
    if again is None or again[19] != stat[19]:
        os.close(fd)
        return None
    return Found((pid, int(stat[19])), fd)


def _stat(pid: int) -> list[bytes] | None:
    """Fields of /proc/<pid>/stat from the state on (``[0]`` state, ``[3]`` session, ``[19]``
    start time)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def children(pid: int) -> list[int]:
    """The live children of ``pid`` (from /proc/<pid>/task/<pid>/children, else a scan of
    /proc for processes whose parent it is)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(child) for child in f.read().split()]
    except FileNotFoundError:
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit() and (stat := _stat(int(name))) is not None and int(stat[1]) == pid:
                found.append(int(name))
        return found
    except (OSError, ValueError):
        return []


def _ns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


class Terminator:
    """Sends SIGTERM once to each process ``find`` returns, however often it is called."""

    def __init__(self, find: Finder) -> None:
        self._find = find
        self._done: set[tuple[int, int]] = set()

    def __call__(self) -> None:
        for process in self._find():
            if process.key not in self._done:
                self._done.add(process.key)
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(process.fd, signal.SIGTERM)
            os.close(process.fd)


def send(find: Finder, signum: int, but: int | None = None) -> int:
    """Send ``signum`` once to each process ``find`` returns (but the host pid ``but``); how
    many it found, each alive when found.

    Oldest first (parents before the children they made), as a terminal's signal to a
    process group reaches a shell before it can see its child die: bash waiting for a
    foreground child acts on SIGINT (its trap, or its own end) only when it got SIGINT itself
    and the child then died of it; a child signalled first dies, bash goes on to its next
    command, and the INT that reaches it while that one runs is taken as handled by the
    child when it exits normally ("wait and cooperative exit"): a trapped INT was lost (newest
    first, a full run: every INT test failed).

    Counted as found, not as the signal took: killing a process can end others before their
    turn (a parent's death signal to its child, a PID namespace whose init ended), which then
    refuse it as gone although they were there: a shell's close counted 0 to 2 of its 2
    background jobs."""
    found = sorted(find(), key=lambda p: p.key[1])
    sent = 0
    for process in found:
        try:
            if process.key[0] != but:
                sent += 1
                signal.pidfd_send_signal(process.fd, signum)
        except ProcessLookupError:
            pass
        finally:
            os.close(process.fd)
    return sent


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


async def kill_all(
    find: Finder, rounds: int = 50, timeout: float = 5.0, quiet_scans: int = 1
) -> int:
    """SIGKILL every process ``find`` returns, wait for them to die, repeat until none is left
    (a process may fork between the scan and the signal) in ``quiet_scans`` scans in a row,
    ``QUIET_GAP_S`` apart (a process in the middle of ``execve`` can read as unmarked), or in
    one scan that a ``Marked`` finder is ``sure`` of.
    Returns how many processes it signalled."""
    quiet = killed = 0
    for _ in range(rounds):
        pidfds = [process.fd for process in find()]
        if not pidfds:
            quiet += 1
            if quiet >= quiet_scans or getattr(find, "sure", False):
                return killed
            await asyncio.sleep(QUIET_GAP_S)
            continue
        quiet, killed = 0, killed + len(pidfds)
        try:
            for fd in pidfds:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            await wait_exited(pidfds, timeout)
        finally:
            for fd in pidfds:
                os.close(fd)
    return killed


QUIET_GAP_S = 0.003


class Output:
    """Reads a command's stdout and stderr pipes: keeps the first ``cap`` bytes of each, counts
    every byte, and hands each chunk to ``on_output``, one call at a time.

    An exception from ``on_output`` stops the reading; ``failed`` is then set and ``error`` holds
    it, for the caller to end the command and raise it.
    """

    def __init__(self, cap: int, on_output: OnOutput | None) -> None:
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
