"""A command's closed standard input, and noticing when the command reads it.

A command has no input to read: its stdin is closed (a ``read -p`` prompt gets end of file and
exits 1, ``input()`` raises ``EOFError``). With /dev/null as stdin nothing shows that it
happened, so a model sees a command fail without a word. Instead, with ``Spawn.watch_stdin``,
stdin is a pipe whose write end the provider holds open and never writes: a process that reads
it blocks. ``StdinWatch`` looks (every ``_FIRST_S``, backing off to ``_EVERY_S``) for a process
of the host whose fd 0 is that pipe and which is blocked waiting for it:

* in ``read``/``readv``/``pread64``/``preadv``/``preadv2`` on a descriptor of the pipe;
* in ``poll``/``ppoll`` with the pipe among its ``pollfd`` array (read from ``/proc/<pid>/mem``);
* in ``select``/``pselect6`` with the pipe's descriptor in its read set (same);
* in ``epoll_wait``/``epoll_pwait``/``epoll_pwait2`` on an epoll instance watching the pipe
  (its ``/proc/<pid>/fdinfo`` names each watched file's inode).

Then it closes the write end: every reader gets end of file at once, as with /dev/null, and
``seen`` is true. The blocked system call and its arguments come from ``/proc/<pid>/syscall``
(x86_64 and aarch64 numbers; on another architecture stdin stays /dev/null: ``available``). Where
it cannot be read (no ptrace access to the process), a process holding the pipe as fd 0 that
sleeps in a wait (``/proc/<pid>/wchan``: a pipe read, poll, select or epoll) gets end of file
all the same, unreported: the command never waits for input that cannot come. What it costs: a
scan of /proc (a ``readlink`` of each process's fd 0) at each look; a reader waits at most
``_EVERY_S`` for its end of file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform

_FIRST_S = 0.005
_EVERY_S = 0.1

_ARCH = platform.machine()
_CALLS: dict[str, dict[str, frozenset[int]]] = {
    "x86_64": {
        "read": frozenset({0, 17, 19, 295, 327}),
        "poll": frozenset({7, 271}),
        "select": frozenset({23, 270}),
        "epoll": frozenset({232, 281, 441}),
    },
    "aarch64": {
        "read": frozenset({63, 65, 67, 69, 286}),
        "poll": frozenset({73}),
        "select": frozenset({72}),
        "epoll": frozenset({22, 441}),
    },
}
_NUMBERS = _CALLS.get(_ARCH, {})
_POLLIN = 0x1
_WAITS = ("pipe_read", "poll", "select", "epoll")
"""What ``/proc/<pid>/wchan`` names when a process may be waiting for its stdin."""


def available() -> bool:
    """Whether reads of stdin can be told here (the system call numbers are known)."""
    return bool(_NUMBERS)


class _HeldPipe:
    """A pipe for a command's stdin: the provider holds the write end; the read end is the
    command's (``read_end`` until the provider closes its copy)."""

    def __init__(self) -> None:
        read, self._write = os.pipe()
        self.read_end: int | None = read
        """For the command (the provider closes it once the process has it)."""

    def _close_write(self) -> None:
        if self._write >= 0:
            os.close(self._write)
            self._write = -1

    def close_read(self) -> None:
        """Close our copy of the read end (once the command's process holds it)."""
        if self.read_end is not None:
            os.close(self.read_end)
            self.read_end = None


class StdinWatch(_HeldPipe):
    """Holds the write end of a command's stdin pipe; closes it when a process of the command
    waits to read it (``seen``), or at ``close``."""

    def __init__(self) -> None:
        super().__init__()
        self._link = f"pipe:[{os.fstat(self._write).st_ino}]"
        self._ino = os.fstat(self._write).st_ino
        self._task: asyncio.Task[None] | None = None
        self.seen = False
        """A process of the command waited to read its stdin (and got end of file)."""

    def start(self) -> None:
        """Look for readers until one is found or ``close``."""
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        wait = _FIRST_S
        while self._write >= 0:
            await asyncio.sleep(wait)
            wait = min(wait * 1.5, _EVERY_S)
            waiting = await asyncio.to_thread(self._waiting)
            if waiting is not False:
                self.seen = waiting is True
                self._close_write()
                return

    def _waiting(self) -> bool | None:
        """True: a process waits for the pipe; None: one may (unknown); False: none does."""
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{name}/fd/0") != self._link:
                    continue
            except OSError:
                continue
            waiting = self._blocked_on_pipe(int(name))
            if waiting is not False:
                return waiting
        return False

    def _blocked_on_pipe(self, pid: int) -> bool | None:
        try:
            with open(f"/proc/{pid}/syscall") as f:
                fields = f.read().split()
        except OSError:  # no ptrace access: what it sleeps in
            try:
                with open(f"/proc/{pid}/wchan") as f:
                    wchan = f.read()
            except OSError:
                return False
            return None if any(w in wchan for w in _WAITS) else False
        if len(fields) < 4 or not fields[0].isdigit():
            return False  # running, or not in a system call
        call, args = int(fields[0]), [int(a, 16) for a in fields[1:7]]
        try:
            if call in _NUMBERS.get("read", ()):
                return self._is_pipe(pid, args[0])
            if call in _NUMBERS.get("poll", ()):
                return self._polls_pipe(pid, args[0], args[1])
            if call in _NUMBERS.get("select", ()):
                return self._selects_pipe(pid, args[0], args[1])
            if call in _NUMBERS.get("epoll", ()):
                return self._epoll_watches_pipe(pid, args[0])
        except (OSError, ValueError, OverflowError):
            return False
        return False

    def _is_pipe(self, pid: int, fd: int) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/fd/{fd}") == self._link
        except OSError:
            return False

    def _polls_pipe(self, pid: int, address: int, count: int) -> bool:
        count = min(count, 1024)
        data = _memory(pid, address, 8 * count)
        for i in range(len(data) // 8):
            fd = int.from_bytes(data[8 * i : 8 * i + 4], "little", signed=True)
            events = int.from_bytes(data[8 * i + 4 : 8 * i + 6], "little")
            if fd >= 0 and events & _POLLIN and self._is_pipe(pid, fd):
                return True
        return False

    def _selects_pipe(self, pid: int, count: int, address: int) -> bool:
        if not address:
            return False
        data = _memory(pid, address, (min(count, 1024) + 7) // 8)
        for fd in range(len(data) * 8):
            if data[fd // 8] >> (fd % 8) & 1 and self._is_pipe(pid, fd):
                return True
        return False

    def _epoll_watches_pipe(self, pid: int, epfd: int) -> bool:
        with open(f"/proc/{pid}/fdinfo/{epfd}") as f:
            for line in f:
                if line.startswith("tfd:") and f" ino:{self._ino:x} " in line + " ":
                    return True
        return False

    async def close(self) -> None:
        """Stop looking and close both ends: whoever still reads gets end of file."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._close_write()
        self.close_read()


class StdinPipe(_HeldPipe):
    """A live command's stdin (``Spawn.live_stdin``): a pipe whose write end the provider holds,
    written as input comes (never blocking the event loop: the end is non-blocking, and a full
    pipe is waited on for at most the caller's timeout) and closed on ``eof`` or at the end."""

    def __init__(self) -> None:
        super().__init__()
        os.set_blocking(self._write, False)

    @property
    def closed(self) -> bool:
        return self._write < 0

    async def write(self, data: bytes, timeout_s: float) -> int:
        """Write ``data``; the bytes written (fewer when the pipe stays full for ``timeout_s``,
        when it is closed, or when no process holds its read end any more)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        view, done = memoryview(data), 0
        while done < len(view) and self._write >= 0:
            try:
                done += os.write(self._write, view[done:])
                continue
            except BlockingIOError:
                pass
            except (BrokenPipeError, OSError):
                break
            room = deadline - loop.time()
            if room <= 0:
                break
            writable: asyncio.Future[None] = loop.create_future()
            fd = self._write
            loop.add_writer(fd, _ready, writable)
            try:
                await asyncio.wait_for(writable, room)
            except TimeoutError:
                break
            finally:
                loop.remove_writer(fd)
        return done

    def close(self) -> None:
        """Close the write end: readers get end of file once they have read what is in it."""
        self._close_write()


def _ready(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _memory(pid: int, address: int, size: int) -> bytes:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        return os.pread(fd, size, address)
    finally:
        os.close(fd)
