"""MCP at ``/mcp``: a command's output and the commands that run on past their call
(``execute_command`` with ``yield_ms``), as rows of ``TOOLS``.

``read_command_output`` reads both: by ``offset``, a page of an ended command's kept output
(``exec.output``); with a ``cursor`` (from ``execute_command``'s answer or its own last one),
the output after it, waiting up to ``wait_ms`` while the command runs (``exec.poll``).
``write_stdin`` (``exec.input``), ``send_signal`` (``exec.signal``) and ``list_commands``
(``exec.list``) are the other three. A handle is an ordinary argument (``command_id``): any
client of the tenant may use it, on any connection; an id the workspace never had (made up,
another tenant's) is ``COMMAND_NOT_FOUND`` like one whose output is no longer kept.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from pydantic import Field

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LIVE_INPUT_MAX_BYTES, LIVE_WAIT_MAX_MS
from contracts.requests import OutputStream, SignalName
from quill.client import Workspace
from services.gateway.mcp import command_texts
from services.gateway.mcp.engine import Done, builtins
from services.gateway.mcp.schemas import obj, shape
from services.gateway.mcp.table import OPEN, READ_ONLY, Arg, Args, Tool, described, workspace_arg

CommandId = Annotated[
    str,
    Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$", description="The id execute_command gave"),
]
OutputLength = Annotated[
    int, Field(ge=1, le=1024 * 1024, description="Most bytes to read (default 65536)")
]
Cursor = Annotated[
    str | None,
    Field(
        pattern=r"^([0-9]{1,16}\.[0-9]{1,16})?$",
        description='The output after it, waiting while it runs ("": from the start)',
    ),
]
WaitMs = Annotated[
    int | None,
    Field(ge=0, le=LIVE_WAIT_MAX_MS, description="With cursor (default 10000)"),
]
WAIT_MS = 10_000
"""How long a read with a cursor waits for more by default: a model's turn stays short."""
WS = workspace_arg()
ID = Arg("command_id", CommandId)


def handle(command_id: str) -> str:
    """``command_id`` as a live command's handle.

    Raises:
        QuillError: ``COMMAND_NOT_FOUND`` for an id no live command can have (as the
            executors answer one that no longer is: the same words whichever).
    """
    try:
        return msgspec.convert(command_id, rq.CommandHandle)
    except msgspec.ValidationError:
        raise QuillError(
            ErrorCode.COMMAND_NOT_FOUND,
            f"No live command {command_id} in this workspace (its output is kept an hour "
            "after it ended)",
            {"command_id": command_id},
        ) from None


def ended_said(error: QuillError, command_id: str) -> QuillError:
    """``COMMAND_ENDED`` in a model's words (the bus's names ``exec.poll``)."""
    if error.code != ErrorCode.COMMAND_ENDED or "closed" in error.message:
        return error
    return QuillError(
        error.code,
        f"Command {command_id} has ended: read_command_output with its command_id and a "
        "cursor says how",
        error.details,
    )


async def read(ws: Workspace, a: Args) -> rp.CommandOutput | rp.CommandStatus:
    """A page by offset, or (``cursor`` given) the output after the cursor."""
    if a.cursor is None:
        return await ws.command_output(
            a.command_id, stream=a.stream, offset=a.offset, length=a.length
        )
    command = ws.command(handle(a.command_id), a.cursor)
    wait = WAIT_MS if a.wait_ms is None else a.wait_ms
    return await command.poll(wait_ms=wait, max_bytes=a.length)


def read_text(a: Args, r: rp.CommandOutput | rp.CommandStatus) -> Done:
    """The page's text, or the poll's (its ``error``, why nothing was committed, renamed:
    ``structuredContent``'s ``error`` is the error form's)."""
    if isinstance(r, rp.CommandOutput):
        return Done(command_texts.command_output_text(r), builtins(r))
    data: dict[str, Any] = builtins(r)
    data["not_committed"] = data.pop("error", None)
    return Done(command_texts.poll_text(r), data)


async def write(ws: Workspace, a: Args) -> rp.InputWritten:
    data = a.text.encode()
    if len(data) > LIVE_INPUT_MAX_BYTES:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"At most {LIVE_INPUT_MAX_BYTES} bytes a call ({len(data)} given): send it in parts",
        )
    try:
        return await ws.command(handle(a.command_id)).input(data, eof=a.eof)
    except QuillError as exc:
        raise ended_said(exc, a.command_id) from None


async def signal(ws: Workspace, a: Args) -> rp.SignalSent:
    try:
        return await ws.command(handle(a.command_id)).signal(a.signal)
    except QuillError as exc:
        raise ended_said(exc, a.command_id) from None


READ_OUTPUT = obj(
    {
        **shape(rp.CommandOutput)["properties"],
        **{k: v for k, v in shape(rp.CommandStatus)["properties"].items() if k != "error"},
        "not_committed": ["string", "null"],
    }
)
"""``read_command_output``'s ``structuredContent``: a page (``CommandOutput``) or a poll
(``CommandStatus``, its ``error`` as ``not_committed``)."""


TOOLS = (
    Tool(
        "read_command_output",
        "exec.output",
        "A command's output by its id: with cursor (as an answer gave it), what came after, "
        "waiting up to wait_ms while it runs, and its exit code once ended; without, a page "
        "by offset (kept an hour after it ends).",
        (
            ID,
            Arg("cursor", Cursor, None),
            Arg("wait_ms", WaitMs, None),
            Arg("stream", OutputStream, "stdout"),
            Arg("offset", described(int, "First byte to read", ge=0), 0),
            Arg("length", OutputLength, 64 * 1024),
            WS,
        ),
        read_text,
        READ_ONLY,
        path=None,
        detail=lambda a: a.command_id,
        call=read,
        output=READ_OUTPUT,
        waits=True,
    ),
    Tool(
        "write_stdin",
        "exec.input",
        "Type text into a running command's stdin (end a line with \\n); eof closes it after.",
        (
            ID,
            Arg("text", str, ""),
            Arg("eof", bool, False),
            WS,
        ),
        lambda a, r: command_texts.input_text(a.command_id, len(a.text.encode()), r),
        OPEN,
        path=None,
        detail=lambda a: a.command_id,
        call=write,
    ),
    Tool(
        "send_signal",
        "exec.signal",
        "Signal a running command's processes: INT (Ctrl-C), TERM (KILL 5 s after), KILL, HUP.",
        (ID, Arg("signal", SignalName, "INT"), WS),
        lambda a, r: command_texts.signal_text(r),
        OPEN,
        path=None,
        detail=lambda a: f"{a.signal} to {a.command_id}",
        call=signal,
    ),
    Tool(
        "list_commands",
        "exec.list",
        "The commands still running in the workspace: id, command line, who started it, when.",
        (WS,),
        lambda a, r: command_texts.live_commands_text(r),
        READ_ONLY,
        path=None,
    ),
)
"""read_command_output, write_stdin, send_signal, list_commands."""
