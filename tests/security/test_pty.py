"""A live command's terminal (``exec.run`` with ``pty``): its relay's control channel is the
executor's alone, and its input is bounded.

* Typed input cannot forge a resize: bytes shaped as the relay's resize frame, sent with
  ``exec.input``, reach the command as typed bytes (read back in raw mode), and the size stays.
* The command cannot write to the relay's control channel: ``/proc/<relay>/fd/0`` (the pipe of
  frames) cannot be opened by the command (the relay is non-dumpable), so a frame written
  there never resizes the terminal (bwrap: the local provider runs commands as the executor's
  own user, with no isolation to speak of).
* Bad sizes and oversized input are refused (``INVALID_ARGUMENT``) before anything is sent.
"""

from __future__ import annotations

import struct

import pytest
import pytest_asyncio

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LIVE_INPUT_MAX_BYTES, PTY_MAX_SIDE
from quill.client import Quill
from quill.workspace import Workspace
from tests.executor.conftest import StartExecutor, name, provider, stack  # noqa: F401
from tests.executor.test_terminal import read_until

FORGED = b"W" + struct.pack(">HHH", 4, 5, 7)
"""The relay's frame setting a 5 x 7 terminal, as a client or the command could shape it."""


@pytest_asyncio.fixture
async def ws(stack: StartExecutor, quill: Quill, name: str) -> Workspace:  # noqa: F811
    await stack()
    workspace = quill.workspace(name)
    await workspace.create()
    return workspace


async def test_typed_bytes_never_resize(ws: Workspace) -> None:
    script = "stty raw -echo; echo ready; head -c 7 | od -An -tx1; stty sane; stty size"
    r = await ws.exec(script, yield_ms=0, pty=(24, 80), timeout_ms=30_000)
    cmd = ws.command(r.command_id, r.cursor)
    seen = [r.stdout]
    await read_until(cmd, "ready", seen)  # raw: no line discipline between the bytes and it
    await cmd.input(FORGED)
    out = await read_until(cmd, "24 80", seen)
    assert "57 00 04 00 05 00 07" in out  # the command read them, as typed
    assert "5 7" not in out.replace("57 00", "")
    assert (await cmd.wait()).exit_code == 0


async def test_the_command_cannot_write_to_the_relay(ws: Workspace, provider: str) -> None:  # noqa: F811
    if provider != "bwrap":
        print(f"skipped under {provider}: it runs commands as the executor's own user")
        pytest.skip(f"{provider}: no isolation from the executor's user")
    forged = "".join(f"\\x{b:02x}" for b in FORGED)
    script = (
        f"printf '{forged}' > /proc/$PPID/fd/0 && echo forged || echo refused; "
        "read -r go; stty size"
    )
    r = await ws.exec(script, yield_ms=0, pty=(24, 80), timeout_ms=30_000)
    cmd = ws.command(r.command_id, r.cursor)
    seen = [r.stdout]
    out = await read_until(cmd, "ed\r\n", seen)
    assert "refused" in out and "forged\r\n" not in out
    await cmd.input("go\r")
    out = await read_until(cmd, "\r\n24 80\r\n", seen)
    assert (await cmd.wait()).exit_code == 0


async def test_bounds(ws: Workspace) -> None:
    for rows, cols in ((0, 80), (24, PTY_MAX_SIDE + 1)):
        with pytest.raises(QuillError) as exc:
            await ws.exec("true", yield_ms=0, pty=(rows, cols))
        assert exc.value.code == ErrorCode.INVALID_ARGUMENT
    r = await ws.exec("exec bash --norc -i", yield_ms=0, pty=(24, 80), timeout_ms=30_000)
    cmd = ws.command(r.command_id, r.cursor)
    with pytest.raises(QuillError) as exc:
        await cmd.input(b"x" * (LIVE_INPUT_MAX_BYTES + 1))
    assert exc.value.code in (ErrorCode.INVALID_ARGUMENT, ErrorCode.SIZE_LIMIT_EXCEEDED)
    with pytest.raises(QuillError) as exc:
        await cmd.resize(PTY_MAX_SIDE + 1, 80)
    assert exc.value.code == ErrorCode.INVALID_ARGUMENT
    await cmd.input("exit 4\r")
    assert (await cmd.wait()).exit_code == 4
