"""REST shells: ``/v1/host/workspace/shells``, a shell of the caller's workspace
(``exec.shell_open``) where commands run one at a time and what one leaves (cwd, exported
variables, functions, ``/tmp``, background processes) the next finds.

``POST`` ``{"workdir"?, "env"?, "idleTimeoutMs"?}`` opens one (``201``, ``Location``: the shell);
``GET`` lists the open ones (``exec.list``). By its id: ``POST …/{shellId}/commands``
``{"command", "timeoutMs"?, "yieldMs"?, "queue"?, "stdin"?}`` runs a command in it (the
answer is a command's, as ``POST /v1/host/workspace/commands`` gives: with ``yieldMs`` it may
run on, and its id goes on under ``…/commands/{commandId}``); ``POST …/{shellId}/checkpoint``
commits what its background processes changed; ``DELETE …/{shellId}`` closes it, its processes
with it (what they changed is committed first). A shell runs one command at a time: a second
is ``409 busy`` naming the one running, unless ``queue`` is true.

``pty`` (``{"rows", "cols"}``, with ``yieldMs``) runs a command in a terminal on
``…/commands`` (a terminal is a live command of its own, not a shell's);
``POST /v1/host/workspace/commands/{commandId}/resize`` gives it a new size.
An id of another workspace or tenant is ``404`` like one that never was (``SHELL_NOT_FOUND``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode as E
from contracts.errors import QuillError
from services.gateway.access import Access
from services.gateway.rest.commands import (
    COMMAND_ID,
    COMMANDS,
    ENV,
    FAILURES,
    PTY,
    TIMEOUT,
    YIELD,
    command_request,
    fields_of,
    handle_param,
    id_param,
    int_schema,
    ran,
    str_schema,
    typed,
    with_failures,
)
from services.gateway.rest.edge import json_body, own_workspace
from services.gateway.rest.schema import body, obj

SHELLS = "/v1/host/workspace/shells"
OPEN_FIELDS = frozenset({"workdir", "env", "idleTimeoutMs"})
RUN_FIELDS = frozenset({"command", "timeoutMs", "yieldMs", "queue", "stdin"})


def shell_param(request: Request) -> str:
    """The path's shell id.

    Raises:
        QuillError: ``SHELL_NOT_FOUND`` (404) for one no shell can have.
    """
    shell_id: str = request.path_params["shell_id"]
    try:
        return msgspec.convert(shell_id, rq.ShellHandle)
    except msgspec.ValidationError:
        raise QuillError(E.SHELL_NOT_FOUND, "No such shell") from None


def _stamp(moment: Any) -> str:
    text: str = moment.isoformat().replace("+00:00", "Z")
    return text


def _changes(changes: rp.CapturedChanges | None) -> dict[str, Any]:
    """What a shell's background processes changed, in the door's words."""
    if changes is None:
        return {"changed": 0, "version": None}
    return {
        "changed": changes.total,
        "version": changes.version if changes.committed else None,
        "conflicts": [c.path for c in changes.conflicts],
    }


class Shells:
    """The shell endpoints, over the caller's own workspace."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def open(self, request: Request) -> Response:
        body = fields_of(await json_body(request), OPEN_FIELDS, '{"workdir": "..."}')
        asked = {"idle_timeout_ms" if k == "idleTimeoutMs" else k: v for k, v in body.items()}
        req: rq.ShellOpen = typed(asked, rq.ShellOpen, "body")  # the contract's bounds
        ws = await own_workspace(self.access, request)
        shell = await ws.shell(
            workdir=req.workdir, env=req.env, idle_timeout_ms=req.idle_timeout_ms
        )
        opened = shell.opened
        assert opened is not None  # this handle opened it
        answer = {
            "shellId": opened.shell,
            "version": opened.version,
            "idleTimeoutMs": opened.idle_timeout_ms,
            "expiresAt": _stamp(opened.expires),
        }
        location = f"{SHELLS}/{quote(opened.shell)}"
        return JSONResponse(answer, status_code=201, headers={"Location": location})

    async def list(self, request: Request) -> Response:
        ws = await own_workspace(self.access, request)
        listed = await ws.running()
        shells = [
            {
                "shellId": s.shell,
                "actor": s.actor,
                "startedAt": _stamp(s.started),
                "lastUsedAt": _stamp(s.last_used),
                "version": s.version,
                "running": s.running,
            }
            for s in listed.shells
        ]
        return JSONResponse({"shells": shells})

    async def run(self, request: Request) -> Response:
        shell_id = shell_param(request)
        body = fields_of(await json_body(request), RUN_FIELDS, '{"command": "..."}')
        req = command_request(body, shell=shell_id)
        ws = await own_workspace(self.access, request)
        result = await ws.exec(
            req.command,
            timeout_ms=req.timeout_ms,
            yield_ms=req.yield_ms,
            stdin=req.stdin,
            shell=shell_id,
            queue=req.queue,
        )
        headers = None
        if result.running:
            headers = {"Location": f"{COMMANDS}/{quote(result.command_id)}/output"}
        return JSONResponse(ran(result), headers=headers)

    async def checkpoint(self, request: Request) -> Response:
        shell_id = shell_param(request)
        ws = await own_workspace(self.access, request)
        done = await ws.shell_of(shell_id).checkpoint()
        return JSONResponse(
            {"shellId": done.shell, **_changes(done.background), "kept": done.kept_conflicts}
        )

    async def close(self, request: Request) -> Response:
        shell_id = shell_param(request)
        ws = await own_workspace(self.access, request)
        closed = await ws.shell_of(shell_id).close()
        return JSONResponse(
            {"shellId": closed.shell, "killed": closed.killed, **_changes(closed.background)}
        )

    async def resize(self, request: Request) -> Response:
        handle = handle_param(request)
        body = fields_of(await json_body(request), frozenset({"rows", "cols"}), '{"rows": 24}')
        size: rq.TerminalSize = typed(body, rq.TerminalSize, "size")
        ws = await own_workspace(self.access, request)
        resized = await ws.command(handle).resize(size.rows, size.cols)
        return JSONResponse({"commandId": resized.command_id, "rows": size.rows, "cols": size.cols})


SHELL_ID = id_param("shellId", rq.ShellHandle)
SHELL_FAILURES = {
    "404": "not_found: no such shell in this workspace (made up, another's, or closed)",
    "409": "busy: it runs a command already (queue: true waits for it)",
    "410": "shell_lost: the executor holding it is gone, and the shell with it",
}
SCHEMAS: dict[str, Any] = {
    "ShellOpen": obj(
        closed=True,
        workdir=str_schema("Its first working directory, workspace-relative"),
        env=ENV,
        idleTimeoutMs=int_schema("Closed after this long without a command (30 min)"),
    ),
    "ShellRun": obj(
        required=("command",),
        closed=True,
        command=str_schema("The command line, eval'd by the shell's bash"),
        timeoutMs=TIMEOUT,
        yieldMs=YIELD,
        queue={"type": "boolean", "description": "Wait for a running command: no 409"},
        stdin=str_schema("Its standard input, whole (text)"),
    ),
}


def paths(json: Any, errors: dict[str, Any], error: Any) -> dict[str, Any]:
    """The OpenAPI paths of the shells (as ``commands.paths`` takes them)."""
    failures = with_failures(errors, error, SHELL_FAILURES)
    obj = {"type": "object"}
    return {
        SHELLS: {
            "post": {
                "summary": "Open a shell: commands in it keep cwd, exports and processes",
                "requestBody": body({"$ref": "#/components/schemas/ShellOpen"}),
                "responses": {
                    "201": json(obj, "{shellId, version, idleTimeoutMs, expiresAt}"),
                    **errors,
                },
            },
            "get": {
                "summary": "The open shells of the workspace, on every executor",
                "responses": {"200": json(obj, "{shells: [...]}"), **errors},
            },
        },
        SHELLS + "/{shellId}": {
            "parameters": [SHELL_ID],
            "delete": {
                "summary": "Close it: its processes are killed, their changes committed",
                "responses": {"200": json(obj, "{shellId, killed, changed, version}"), **failures},
            },
        },
        SHELLS + "/{shellId}/commands": {
            "parameters": [SHELL_ID],
            "post": {
                "summary": "Run a command in it (one at a time)",
                "requestBody": body({"$ref": "#/components/schemas/ShellRun"}),
                "responses": {
                    "200": json({"$ref": "#/components/schemas/CommandRan"}, "Ran, or runs on"),
                    **failures,
                },
            },
        },
        SHELLS + "/{shellId}/checkpoint": {
            "parameters": [SHELL_ID],
            "post": {
                "summary": "Commit what its background processes changed",
                "responses": {"200": json(obj, "{shellId, changed, version, kept}"), **failures},
            },
        },
        COMMANDS + "/{commandId}/resize": {
            "parameters": [COMMAND_ID],
            "post": {
                "summary": "A new size for its terminal (pty)",
                "requestBody": body({**PTY, "description": "The terminal's new size"}),
                "responses": {
                    "200": json(obj, "{commandId, rows, cols}"),
                    **with_failures(errors, error, FAILURES),
                },
            },
        },
    }
