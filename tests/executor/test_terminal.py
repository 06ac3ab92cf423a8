"""Live commands in a terminal (``exec.run`` with ``pty``), under both sandbox providers: typed
into, resized, interrupted with Ctrl-C, ended with their status; the terminal's CRLFs.
(The relay's control channel: ``tests/security/test_pty.py``; ``quill shell``:
``tests/cli/test_shell.py``.)"""

from __future__ import annotations

import pytest

from contracts.errors import ErrorCode, QuillError
from quill.command import Command
from quill.workspace import Workspace

SHELL = "PS1='$ ' exec bash --norc --noprofile -i"


async def read_until(cmd: Command, text: str, seen: list[str]) -> str:
    """Poll ``cmd`` (each poll waiting for output) until ``text`` has come; all output read
    so far, kept in ``seen``."""
    while text not in "".join(seen):
        status = await cmd.poll(wait_ms=20_000)
        seen.append(status.stdout)
        if text not in "".join(seen) and not status.running and not status.more:
            raise AssertionError(f"ended before {text!r}: {''.join(seen)!r}")
    return "".join(seen)


async def shell(ws: Workspace, rows: int = 24, cols: int = 80) -> tuple[Command, list[str]]:
    r = await ws.exec(SHELL, yield_ms=0, pty=(rows, cols), timeout_ms=60_000)
    assert r.running
    cmd = ws.command(r.command_id, r.cursor)
    seen = [r.stdout]
    await read_until(cmd, "$ ", seen)
    return cmd, seen


async def test_typed_lines_echo_with_crlf(ws: Workspace) -> None:
    cmd, seen = await shell(ws)
    await cmd.input("echo hi > typed.txt; echo h''i\r")
    out = await read_until(cmd, "hi\r\n", seen)
    assert "echo h''i\r\n" in out  # the terminal echoes what was typed, with its CRLF
    await cmd.input("tty; [ -t 0 ] && echo is-a-tty\r")
    assert "/dev/pts/" in await read_until(cmd, "is-a-tty\r\n", seen)
    await cmd.input("exit 3\r")
    done = await cmd.wait()
    assert (done.running, done.exit_code) == (False, 3)
    assert done.version is not None
    assert (await ws.read("typed.txt")).content == "hi\n"


async def test_resize_reaches_the_terminal(ws: Workspace) -> None:
    cmd, seen = await shell(ws, 24, 80)
    await cmd.input("stty size\r")
    await read_until(cmd, "24 80\r\n", seen)
    resized = await cmd.resize(40, 132)
    assert (resized.rows, resized.cols) == (40, 132)
    await cmd.input("trap 'echo winched' WINCH; stty size\r")
    await read_until(cmd, "40 132\r\n", seen)
    await cmd.resize(41, 133)
    await read_until(cmd, "winched", seen)  # the shell got SIGWINCH
    await cmd.input("stty size\r")
    await read_until(cmd, "41 133\r\n", seen)
    await cmd.input("exit\r")
    assert (await cmd.wait()).exit_code == 0


async def test_ctrl_c_interrupts_and_the_shell_survives(ws: Workspace) -> None:
    cmd, seen = await shell(ws)
    await cmd.input("sh -c 'echo started; exec sleep 100'; echo slept\r")
    await read_until(cmd, "started\r\n", seen)  # its job runs, the terminal's foreground
    await cmd.input(b"\x03")  # Ctrl-C: the line discipline's SIGINT to the foreground job
    await cmd.input("echo status=$?\r")
    out = await read_until(cmd, "status=130\r\n", seen)
    assert "slept" not in out.replace("echo slept", "")
    await cmd.input("exit 0\r")
    assert (await cmd.wait()).exit_code == 0


async def test_a_plain_command_in_a_terminal(ws: Workspace) -> None:
    r = await ws.exec("printf 'a\\nb\\n'; exit 7", yield_ms=10_000, pty=(24, 80))
    assert (r.running, r.exit_code) == (False, 7)
    assert r.stdout == "a\r\nb\r\n" and r.stderr == ""


async def test_pty_goes_with_a_live_command_only(ws: Workspace) -> None:
    for kwargs in ({}, {"yield_ms": 0, "stdin": b"x"}):
        with pytest.raises(QuillError) as exc:
            await ws.exec("true", pty=(24, 80), **kwargs)  # type: ignore[arg-type]
        assert exc.value.code == ErrorCode.INVALID_ARGUMENT
    r = await ws.exec("read x", yield_ms=0)
    with pytest.raises(QuillError) as exc:
        await ws.command(r.command_id).resize(10, 10)
    assert exc.value.code == ErrorCode.INVALID_ARGUMENT
    await ws.command(r.command_id).input(eof=True)
    await ws.command(r.command_id).wait()
