"""A live command in a terminal (``exec.run`` with ``pty``): the relay that gives it one.

The command runs under ``RELAY`` (the host's ``python3``, shown at /usr/bin in every sandbox,
as the egress ``forwarder``), started in its place inside the sandbox: it opens a
pseudo-terminal there (``pty.fork``: bwrap's ``--dev /dev`` mounts a devpts instance of the
sandbox's own, so its terminals are not the host's), makes it the command's controlling
terminal in a session of its own, and relays: its stdin (the live command's pipe,
``Spawn.live_stdin``) to the terminal's master, the master to its stdout (the command's output,
recorded as any). Ctrl-C is the byte 0x03 typed: the terminal's line discipline makes it a
SIGINT to the foreground process group, as on any terminal. The relay exits as the command did
(its status, or the same signal), after relaying what it wrote.

Control channel. The pipe carries frames, never raw bytes (``frames``, ``resize_frame``): a
kind byte, a 2-byte length, then that many bytes; ``D`` is typed input, ``W`` a new size
(rows, cols: 2 bytes each; the relay sets it on the master, the command gets SIGWINCH). Every
byte a client sends with ``exec.input`` travels inside a ``D`` frame, so no input is ever read
as a resize. A frame is at most ``PIPE_BUF`` bytes and the pipe's write end is non-blocking,
so each is written whole or not at all (``write_frames``): a write that times out leaves no
half frame behind, and frames written concurrently never interleave. A malformed frame ends
the relay's reading of its input (the command goes on; its end is as usual).

The command cannot reach the channel: the relay makes itself non-dumpable (``PR_SET_DUMPABLE``
0) before it reads anything, so a process of the same user without ``CAP_SYS_PTRACE`` (the
sandbox's) can neither open ``/proc/<relay>/fd/0`` nor ptrace it; its own descriptors 0-2 are
the terminal's slave, none of the relay's (Python's descriptors are not inherited). The relay
has nothing the command lacks: it runs in the same sandbox as the same user. It ignores
SIGINT, SIGTERM, SIGHUP and SIGQUIT, as the forwarder does (``exec.signal`` and a timeout reach
the command, and the relay ends with it).

Back-pressure: the relay holds at most one frame of input the terminal has not taken, and
reads no more until it has; ``exec.input`` then waits (``INPUT_WAIT_S``) and says how much was
written, as for a pipe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import struct
from collections.abc import Awaitable, Callable

from infra.exec.sandbox import common
from infra.exec.sandbox.interface import SandboxError, Spawn

FRAME_MAX = 4096
"""The most bytes of one frame, header included: ``PIPE_BUF`` (written atomically to a pipe)."""
_HEADER = struct.Struct(">cH")
DATA, SIZE = b"D", b"W"

RELAY = r"""
import ctypes, errno, fcntl, os, pty, select, signal, struct, sys, termios
rows, cols, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4:]
def winsize(fd, r, c):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", r, c, 0, 0))
pid, master = pty.fork()
if pid == 0:
    try:
        winsize(0, rows, cols)
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, ("%s: %s\r\n" % (argv[0], e.strerror)).encode())
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)
ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(sig, signal.SIG_IGN)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
os.set_blocking(wake_r, False)
signal.signal(signal.SIGCHLD, lambda *a: None)
signal.set_wakeup_fd(wake_w)
os.set_blocking(master, False)
inbox, pending, reading, status = b"", b"", True, None
def out(data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(1, view):]
        except InterruptedError:
            pass
        except OSError:
            return
def drain():
    while True:
        try:
            data = os.read(master, 65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        out(data)
open_master = True
while status is None:
    r = [wake_r]
    if open_master:
        r.append(master)
    if reading and not pending:
        r.append(0)
    w = [master] if pending and open_master else []
    try:
        readable, writable, _ = select.select(r, w, [])
    except InterruptedError:
        continue
    if wake_r in readable:
        try:
            os.read(wake_r, 512)
        except OSError:
            pass
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
    if master in readable:
        open_master = drain()
    if master in writable:
        try:
            pending = pending[os.write(master, pending):]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pending = b""
    if 0 in readable:
        try:
            data = os.read(0, 65536)
        except InterruptedError:
            data = None
        except OSError:
            data = b""
        if data == b"":
            reading = False
        elif data:
            inbox += data
    while not pending and len(inbox) >= 3:
        kind, size = inbox[:1], struct.unpack(">H", inbox[1:3])[0]
        if 3 + size > 4096 or kind not in (b"D", b"W") or (kind == b"W" and size != 4):
            reading, inbox = False, b""
            break
        if len(inbox) < 3 + size:
            break
        body, inbox = inbox[3:3 + size], inbox[3 + size:]
        if kind == b"D":
            pending = body
        else:
            r2, c2 = struct.unpack(">HH", body)
            if r2 and c2:
                try:
                    winsize(master, r2, c2)
                except OSError:
                    pass
    if not open_master and status is None:
        status = os.waitpid(pid, 0)[1]
if open_master:
    drain()
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
os._exit(os.waitstatus_to_exitcode(status))
"""
"""``python3 -I -S -c RELAY ROWS COLS -- ARGV...`` (see the module docstring)."""


def in_terminal(spawn: Spawn, rows: int, cols: int) -> Spawn:
    """``spawn`` run under the relay in a terminal of ``rows`` x ``cols`` (``live_stdin``: its
    pipe carries frames).

    Raises:
        SandboxError: the host has no ``python3`` to run the relay with.
    """
    python3 = shutil.which("python3", path=common.PATH)
    if python3 is None:
        raise SandboxError("a terminal needs a python3 on the host's PATH (the relay)")
    argv = [python3, "-I", "-S", "-c", RELAY, str(rows), str(cols), "--", *spawn.argv]
    env = {"TERM": "xterm-256color"} | dict(spawn.env)
    return dataclasses.replace(spawn, argv=argv, env=env, live_stdin=True, watch_stdin=False)


def frames(data: bytes) -> list[bytes]:
    """``data`` as ``D`` frames of at most ``FRAME_MAX`` bytes each."""
    step = FRAME_MAX - _HEADER.size
    return [
        _HEADER.pack(DATA, len(data[i : i + step])) + data[i : i + step]
        for i in range(0, len(data), step)
    ]


def resize_frame(rows: int, cols: int) -> bytes:
    """The ``W`` frame setting the terminal to ``rows`` x ``cols``."""
    return _HEADER.pack(SIZE, 4) + struct.pack(">HH", rows, cols)


async def write_frames(
    write: Callable[[bytes, float], Awaitable[int]], chunks: list[bytes], timeout_s: float
) -> int:
    """Write ``chunks`` (frames) one by one with ``write`` (``Live.write``) until one is not
    taken whole within what is left of ``timeout_s``; the payload bytes of those written."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    done = 0
    for chunk in chunks:
        room = max(0.0, deadline - loop.time())
        if await write(chunk, room) < len(chunk):
            break  # nothing of it was (a write of at most PIPE_BUF is whole or nothing)
        done += len(chunk) - _HEADER.size
    return done
