"""The commands page: each command run in a workspace (``exec.run`` and ``exec.git``, from its
audit records: the command line, exit code, duration, whether it timed out, the change set it
committed and a link to its diff), the running ones as they start, and one command's output,
streamed live while it runs.

A command's output is read as ``quill exec`` and ``quill output`` read it: live from its
``execout`` subject (``Subjects.execout``: the chunks the executor sends as the command writes
them), and once it has ended, whole from its kept output (``exec.output``, by its id). Both are
the workspace's own: the subject is built from the workspace the caller reaches
(``Console.workspace``), and ``exec.output`` answers only for a command of that workspace, so
another tenant's (or workspace's) command id shows nothing. A running command shows from the
moment the page listens (what it wrote before is in its kept output once it ends).
"""

from __future__ import annotations

import html
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg
from starlette.requests import Request
from starlette.responses import Response

from contracts import codec
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import AuditRecord
from contracts.subjects import HEADER_STREAM
from quill.client import Workspace
from services.gateway.console.gate import PREFIX
from services.gateway.console.history import number
from services.gateway.console.live import (
    FAILED,
    KEEPALIVE,
    READY,
    Heard,
    follow,
    listening,
    message,
    sse,
)

if TYPE_CHECKING:
    from services.gateway.console import Console

SCAN = 50_000
"""Audit records the page reads at most."""
SHOWN = 100
OUTPUT_SHOWN = 1024 * 1024
"""Bytes of each stream a command's page shows at most (the rest: ``quill output``)."""
COMMAND_ID = re.compile(r"^[A-Za-z0-9_:-]{1,128}$")
"""A command id the page accepts (``exec.output``'s, without ``.``: one subject token)."""
EXEC_OPS = ("run", "git")
STREAMS: tuple[rq.OutputStream, ...] = ("stdout", "stderr")
SEEN_MAX = 10_000


@dataclass
class Done:
    """A command that ended, as its audit record tells."""

    r: AuditRecord

    @property
    def id(self) -> str:
        return self.r.request_id or ""

    def detail(self, name: str) -> Any:
        return (self.r.details or {}).get(name)

    @property
    def line(self) -> str:
        return str(self.detail("command") or self.r.summary or self.r.op)

    @property
    def committed(self) -> bool:
        return bool(self.detail("committed")) and self.r.version is not None


def is_command(r: AuditRecord) -> bool:
    return r.kind == "exec" and r.op in EXEC_OPS


async def commands(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    minutes = min(number(request, "minutes", 24 * 60) or 24 * 60, 60 * 24 * 366)
    shown: deque[Done] = deque(maxlen=SHOWN)
    read = 0
    async for record in ws.audit(since=datetime.now(UTC) - timedelta(minutes=minutes)):
        read += 1
        if is_command(record):
            shown.append(Done(record))
        if read >= SCAN:
            break
    context = {"done": list(reversed(shown)), "minutes": minutes, "capped": read >= SCAN}
    return c.page(request, "commands.html", context)


def _command_id(request: Request) -> str:
    command = request.path_params["command"]
    if not COMMAND_ID.match(command):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Not a command id", {"command": command})
    return str(command)


async def kept(ws: Workspace, command: str) -> dict[str, rp.CommandOutput] | None:
    """The command's kept output (``OUTPUT_SHOWN`` of each stream at most), None when nothing
    is kept under its id in this workspace yet (running, too old, or not its command)."""
    pages: dict[str, rp.CommandOutput] = {}
    try:
        for stream in STREAMS:
            pages[stream] = await ws.command_output(command, stream=stream, length=OUTPUT_SHOWN)
    except QuillError as exc:
        if exc.code != ErrorCode.FILE_NOT_FOUND:
            raise
        return None
    return pages


async def command(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    command_id = _command_id(request)
    pages = await kept(ws, command_id)
    running = pages is None or not pages["stdout"].complete
    context = {"command": command_id, "pages": pages, "running": running}
    return c.page(request, "command.html", context)


def _text(chunk: bytes) -> str:
    """A chunk of output as one line of HTML (newlines as character references)."""
    return html.escape(chunk.decode("utf-8", "replace")).replace("\n", "&#10;")


async def output_live(c: Console, request: Request) -> Response:
    """SSE: the command's output chunks (``stdout``/``stderr``) as it writes them, then
    ``end`` (its kept output, whole) when it ends."""
    ws = await c.workspace(request)
    command_id = _command_id(request)
    nc = ws.client.nc
    subject = ws.client.subjects.execout(ws.tenant, ws.name, command_id)
    template = c.templates.get_template("command_output.html")
    ws_name = request.path_params["ws"]

    async def ended() -> str:
        pages = await kept(ws, command_id)
        html = template.render(pages=pages, running=False, prefix=PREFIX, ws=ws_name)
        return message("end", html)

    async def stream() -> AsyncIterator[str]:
        async with listening(nc, subject) as heard:
            if heard is None:
                yield FAILED
                return
            pages = await kept(ws, command_id)
            if pages is not None and pages["stdout"].complete:
                yield await ended()
                return
            yield message("ready", READY)
            async for msg in heard:
                if msg is None:
                    yield KEEPALIVE
                    continue
                which = (msg.headers or {}).get(HEADER_STREAM)
                if which == "eof":
                    yield await ended()
                    return
                if which in ("stdout", "stderr"):
                    yield message(which, _text(msg.data))

    return sse(stream())


async def commands_live(c: Console, request: Request) -> Response:
    """SSE: a row for each command that starts writing output (``running``) and for each
    that ends (``done``, its audit record), in this workspace."""
    ws = await c.workspace(request)
    nc = ws.client.nc
    subjects = ws.client.subjects
    outputs = subjects.execout(ws.tenant, ws.name, "*")
    audits = subjects.audit(ws.tenant, ws.name)
    rows = c.templates.get_template("commands_rows.html")
    ws_name = request.path_params["ws"]

    def render(**context: Any) -> str:
        return rows.render(prefix=PREFIX, ws=ws_name, **({"done": [], "running": []} | context))

    seen: set[str] = set()

    async def each(msg: Msg, _: Heard) -> AsyncIterator[str]:
        if msg.subject != audits:
            command_id = msg.subject.rsplit(".", 1)[-1]
            if command_id not in seen and len(seen) < SEEN_MAX:
                seen.add(command_id)
                yield message("running", render(running=[command_id]))
        elif is_command(record := codec.decode(msg.data, AuditRecord)):
            yield message("done", render(done=[Done(record)]))

    return sse(follow(nc, [outputs, audits], each))
