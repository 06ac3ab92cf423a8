"""``quill shell``: an interactive terminal in a workspace's sandbox, over the bus.

It is a live command run in a terminal (``exec.run`` with ``yield_ms`` and ``pty``): the local
terminal is put in raw mode (every key goes as typed, Ctrl-C as the byte 0x03, which the
remote terminal makes a SIGINT), keys go with ``exec.input``, output comes with ``exec.poll``
(each poll waiting for more: no busy loop), a resized window (SIGWINCH) with ``exec.resize``;
it exits with the remote command's status. The local terminal's mode is restored however it
ends (an error, a lost connection, SIGTERM); from something that is not a terminal it refuses
(``quill exec`` runs commands without one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator

import click

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LIVE_INPUT_MAX_BYTES
from quill.client import Workspace
from quill.command import Command
from quill_cli.common import Commands, workspace_command

commands = Commands("exec")

SHELL = "exec bash -il"
"""What ``quill shell`` runs when given no command."""
POLL_MS = 20_000
"""How long each poll waits for output."""


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """The terminal ``fd`` in raw mode until the block ends, however it ends."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


def _size() -> tuple[int, int]:
    size = os.get_terminal_size(sys.stdout.fileno())
    return max(size.lines, 1), max(size.columns, 1)


async def _keys(cmd: Command, fd: int, queue: asyncio.Queue[bytes | None]) -> None:
    """Send what is typed on ``fd`` as it comes, until end of file, and the window's size
    when it changed: each time ``queue`` gets None (a resize, put there by SIGWINCH), and
    before any keys (the loop may see the keys before the signal that came first: ``stty
    size`` typed after a resize must see the new size)."""
    loop = asyncio.get_running_loop()
    sent = _size()  # the size the command was started with

    async def resized() -> None:
        nonlocal sent
        now = _size()
        if now != sent:
            with contextlib.suppress(QuillError):  # it may just have ended
                await cmd.resize(*now)
            sent = now

    def readable() -> None:
        try:
            data = os.read(fd, LIVE_INPUT_MAX_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        queue.put_nowait(data)
        if not data:
            loop.remove_reader(fd)

    loop.add_reader(fd, readable)
    try:
        while True:
            item = await queue.get()
            await resized()
            if item is None:
                continue
            data, ended = item, not item
            while not ended and not queue.empty() and len(data) < LIVE_INPUT_MAX_BYTES // 2:
                more = queue.get_nowait()
                if more is None:  # a resize after these keys: theirs first
                    queue.put_nowait(None)  # the order of two resizes does not matter
                    break
                data, ended = data + more, not more
            if data:
                await cmd.input(data)
            if ended:
                return
    finally:
        loop.remove_reader(fd)


async def _output(cmd: Command, out: int) -> int:
    """Write the command's output to ``out`` until it ends; its exit status."""
    while True:
        status = await cmd.poll(wait_ms=POLL_MS)
        for text in (status.stdout, status.stderr):
            if text:
                data = text.encode()
                while data:
                    data = data[os.write(out, data) :]
        if not status.running and not status.more:
            return status.exit_code if status.exit_code is not None else 1


@commands.command(name="shell")
@workspace_command
@click.option("-C", "--workdir", default="", help="Working directory in the workspace.")
@click.option(
    "-t",
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1, max=600),
    default=600,
    show_default=True,
    help="Seconds before it is ended (at most the workspace's max_exec_ms).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
async def shell(
    ctx: click.Context,
    ws: Workspace,
    workdir: str,
    timeout_s: float,
    command: tuple[str, ...],
) -> None:
    """An interactive terminal in WORKSPACE's sandbox: bash (or COMMAND, after --) in a
    terminal of the local one's size, every key sent as typed (Ctrl-C interrupts what runs
    there), window resizes followed; exit with its status. What it changes is committed when
    it ends, as for quill exec. Needs a terminal (quill exec runs commands without one)."""
    fd = sys.stdin.fileno()
    if not (os.isatty(fd) and os.isatty(sys.stdout.fileno())):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            "quill shell needs a terminal on its stdin and stdout: use quill exec to run "
            "commands without one",
        )
    line = " ".join(command) if command else SHELL
    r = await ws.exec(
        line, workdir=workdir, timeout_ms=int(timeout_s * 1000), yield_ms=0, pty=_size()
    )
    cmd = ws.command(r.command_id)
    loop = asyncio.get_running_loop()
    typed: asyncio.Queue[bytes | None] = asyncio.Queue()
    loop.add_signal_handler(signal.SIGWINCH, typed.put_nowait, None)
    me = asyncio.current_task()
    assert me is not None
    for ending in (signal.SIGTERM, signal.SIGHUP):  # end here, the terminal restored
        loop.add_signal_handler(ending, me.cancel)
    tasks: list[asyncio.Task[object]] = []
    try:
        with raw_mode(fd):
            keys = asyncio.ensure_future(_keys(cmd, fd, typed))
            output = asyncio.ensure_future(_output(cmd, sys.stdout.fileno()))
            tasks = [keys, output]
            done, _ = await asyncio.wait([keys, output], return_when=asyncio.FIRST_COMPLETED)
            if output not in done:
                keys.result()  # its error, if any; else stdin ended: the command goes on
                await output
            code = output.result()
    finally:
        for handled in (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(handled)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
    sys.exit(min(code, 255))
