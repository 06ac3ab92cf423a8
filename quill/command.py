"""A command that runs on past its answer (``Workspace.exec`` with ``yield_ms``): its handle.

``Command`` keeps the cursor of what it has read; ``poll`` reads on from it, ``wait`` polls
until the command ends. A handle is its id only: ``Workspace.command(id)`` makes one again from
any client of the tenant (another process, after a reconnect), for as long as the command
runs and its output is kept (an hour after it ended, by default).
"""

from __future__ import annotations

import inspect

import msgspec

from contracts import replies as rp
from contracts import requests as rq
from contracts.limits import LIVE_WAIT_MAX_MS
from quill._protocols import Handle
from quill._transport import OnOutput

WAIT_MS = 20_000
"""How long each ``poll`` of ``wait`` waits for more (well under ``LIVE_WAIT_MAX_MS``)."""


class Command:
    """A live command of ``workspace`` (see the module docstring)."""

    def __init__(self, workspace: Handle, command_id: str, cursor: str = "") -> None:
        self.workspace, self.id, self.cursor = workspace, command_id, cursor
        self.status: rp.CommandStatus | None = None
        """The last ``poll``'s answer."""

    def __repr__(self) -> str:
        return f"Command({self.id!r}, cursor={self.cursor!r})"

    async def poll(self, wait_ms: int = 0, max_bytes: int = 64 * 1024) -> rp.CommandStatus:
        """Its output after ``cursor`` (then moved past it), waiting up to ``wait_ms`` for some
        when there is none yet; whether it runs, and once ended how (``exit_code``,
        ``version``).

        Raises:
            QuillError: ``COMMAND_NOT_FOUND``, ``COMMAND_LOST`` (its executor is gone).
        """
        wait_ms = min(wait_ms, LIVE_WAIT_MAX_MS)
        body = rq.CommandPoll(
            command_id=self.id, cursor=self.cursor, wait_ms=wait_ms, max_bytes=max_bytes
        )
        ws = self.workspace
        status: rp.CommandStatus = (
            await ws.client.send(ws.tenant, ws.name, body, wait_ms=wait_ms)
        )[1]
        self.cursor, self.status = status.cursor, status
        if status.version is not None:
            ws.last_version = max(ws.last_version, status.version)
        return status

    async def input(self, data: bytes | str = b"", *, eof: bool = False) -> rp.InputWritten:
        """Write ``data`` to its standard input (at most ``limits.LIVE_INPUT_MAX_BYTES`` a
        call); ``eof`` closes it after.

        Raises:
            QuillError: ``COMMAND_ENDED`` once it ended (or its stdin is closed).
        """
        raw = data.encode() if isinstance(data, str) else data
        body = rq.CommandInput(command_id=self.id, data=raw, eof=eof)
        ws = self.workspace
        written: rp.InputWritten = (await ws.client.send(ws.tenant, ws.name, body))[1]
        return written

    async def signal(self, name: rq.SignalName = "TERM") -> rp.SignalSent:
        """Send ``INT``, ``TERM`` (``KILL`` follows after 5 s if it still runs), ``KILL`` or
        ``HUP`` to every process of it."""
        body = rq.CommandSignal(command_id=self.id, signal=name)
        ws = self.workspace
        sent: rp.SignalSent = (await ws.client.send(ws.tenant, ws.name, body))[1]
        return sent

    async def resize(self, rows: int, cols: int) -> rp.TerminalResized:
        """Give its terminal (``Workspace.exec`` with ``pty``) a new size: its processes get
        SIGWINCH."""
        body = rq.CommandResize(command_id=self.id, rows=rows, cols=cols)
        ws = self.workspace
        resized: rp.TerminalResized = (await ws.client.send(ws.tenant, ws.name, body))[1]
        return resized

    async def wait(self, on_output: OnOutput | None = None) -> rp.CommandStatus:
        """Poll until it ends; ``on_output`` gets each piece of output as it comes. Returns
        the last answer, with all the output read meanwhile."""
        out: list[str] = []
        err: list[str] = []
        while True:
            status = await self.poll(wait_ms=WAIT_MS)
            for stream, text, into in (
                ("stdout", status.stdout, out),
                ("stderr", status.stderr, err),
            ):
                if text:
                    into.append(text)
                    if on_output is not None:
                        called = on_output(stream, text.encode())
                        if inspect.isawaitable(called):
                            await called
            if not status.running and not status.more:
                break
        return msgspec.structs.replace(status, stdout="".join(out), stderr="".join(err))
