"""The processes page: what runs on in a workspace now (issue 32, item 7), from ``exec.list``
(every executor's answer): its live commands (``exec.run`` with ``yield_ms``, and each command
running in a shell) and its open shells, each with a Kill button. Kill sends ``KILL`` to a
command's process group (``exec.signal``) and closes a shell (``exec.shell_close``: its
processes with it, what they changed committed). The forms carry the console's CSRF token as
its other forms do (``Csrf.checked_form``); a command line is shown as text (the templates
escape everything), whatever markup an agent typed into it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import msgspec
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from services.gateway.console.gate import PREFIX

if TYPE_CHECKING:
    from services.gateway.console import Console


async def page(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    listed = await ws.running()
    context: dict[str, Any] = {
        "commands": listed.commands,
        "shells": listed.shells,
        "executors": listed.executors,
        "killed": request.query_params.get("killed", "")[:500],
    }
    return c.page(request, "processes.html", context)


def _handle(kind: Any, value: Any, what: str) -> str:
    try:
        handle: str = msgspec.convert(value, kind)
    except msgspec.ValidationError:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Not a {what} id") from None
    return handle


async def kill(c: Console, request: Request) -> Response:
    """Kill a live command (``command``: ``KILL`` to its processes) or close a shell
    (``shell``), as the logged-in principal."""
    form = await c.csrf.checked_form(request)
    ws = await c.workspace(request)
    command, shell = form.get("command"), form.get("shell")
    try:
        if command is not None:
            handle = _handle(rq.CommandHandle, command, "command")
            await ws.command(handle).signal("KILL")
            done = f"Killed command {handle}"
        elif shell is not None:
            handle = _handle(rq.ShellHandle, shell, "shell")
            closed = await ws.shell_of(handle).close()
            done = f"Closed shell {handle} ({closed.killed} processes killed)"
        else:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, "Name a command or a shell to kill")
    except QuillError as exc:
        gone = (ErrorCode.COMMAND_NOT_FOUND, ErrorCode.COMMAND_ENDED, ErrorCode.SHELL_NOT_FOUND)
        if exc.code not in (*gone, ErrorCode.SHELL_LOST, ErrorCode.COMMAND_LOST):
            raise
        done = exc.message
    where = f"{PREFIX}/w/{request.path_params['ws']}/processes"
    return RedirectResponse(f"{where}?{urlencode({'killed': done})}", status_code=303)
