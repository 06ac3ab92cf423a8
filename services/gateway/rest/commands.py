"""REST commands: ``/v1/host/workspace/commands``, a command run in the caller's workspace, and
the commands that run on past their request (``exec.run`` with ``yield_ms``).

``POST`` ``{"command", "workdir"?, "timeoutMs"?, "env"?, "yieldMs"?, "stdin"?, "pty"?}`` runs
one: without ``yieldMs`` the answer waits for its end; with it, a command still running then
is answered ``running: true`` with its ``commandId`` and a ``cursor`` (and ``Location``: its
output). Then,
by the id: ``GET …/{commandId}/output?cursor=&waitMs=&maxBytes=`` (``exec.poll``: the output
after the cursor, waiting up to ``waitMs`` while it runs; once ended its ``exitCode`` and the
``version`` its changes were committed as), ``POST …/{commandId}/input``
``{"data": "...", "eof"?}`` (``exec.input``) and ``POST …/{commandId}/signal``
``{"signal": "INT"}`` (``exec.signal``). ``GET`` (``?running=1`` accepted: only running
commands are listed) is ``exec.list``. Bodies and answers are camelCase, as the file store's.

An id of another workspace or tenant is ``404`` like one that never was (``COMMAND_NOT_FOUND``,
nothing said); an ended command refuses input or a signal (``409 command_ended``); one whose
executor died is ``410 command_lost``. Openwop's ``/v1/runs`` are workflow runs (``runs``), not
commands: hence a path of its own, beside the files.
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
from contracts.limits import (
    LIVE_INPUT_MAX_BYTES,
    LIVE_POLL_MAX_BYTES,
    LIVE_WAIT_MAX_MS,
    LIVE_YIELD_MAX_MS,
    PTY_MAX_SIDE,
    check_stdin,
)
from services.gateway.access import Access
from services.gateway.rest.edge import camel, count_param, json_body, own_workspace
from services.gateway.rest.schema import BOOL, INT, STR, body, obj

COMMANDS = "/v1/host/workspace/commands"
RUN_FIELDS = frozenset({"command", "workdir", "timeoutMs", "env", "yieldMs", "stdin", "pty"})


def fields_of(body: Any, allowed: frozenset[str], shape: str) -> dict[str, Any]:
    """``body`` as an object of ``allowed`` fields.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for anything else.
    """
    if not isinstance(body, dict):
        raise QuillError(E.INVALID_ARGUMENT, f"Body must be {shape}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise QuillError(E.INVALID_ARGUMENT, f"Not supported: {', '.join(unknown)}")
    return body


def typed(value: Any, kind: Any, name: str) -> Any:
    """``value`` as ``kind`` (strictly, with the contract's bounds).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` naming ``name``.
    """
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise QuillError(E.INVALID_ARGUMENT, f"Invalid {name}: {exc}") from None


def command_request(body: dict[str, Any], shell: str | None = None) -> rq.RunCommand:
    """A REST command body (camelCase; ``stdin`` as text) as ``exec.run``'s request.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a missing command or a value out of bounds.
    """
    command = body.get("command")
    if not isinstance(command, str) or not command:
        raise QuillError(E.INVALID_ARGUMENT, "command must be a non-empty string")
    fields = {"timeoutMs": "timeout_ms", "yieldMs": "yield_ms"}
    asked = {fields.get(k, k): v for k, v in body.items()}
    if "stdin" in asked:
        asked["stdin"] = typed(asked["stdin"], str, "stdin").encode()
        check_stdin(asked["stdin"])
    if shell is not None:
        asked["shell"] = shell
    req: rq.RunCommand = typed(asked, rq.RunCommand, "body")  # the contract's bounds
    return req


def handle_param(request: Request) -> str:
    """The path's command id.

    Raises:
        QuillError: ``COMMAND_NOT_FOUND`` (404) for one no live command can have.
    """
    command_id: str = request.path_params["command_id"]
    try:
        return msgspec.convert(command_id, rq.CommandHandle)
    except msgspec.ValidationError:
        raise QuillError(E.COMMAND_NOT_FOUND, "No such command") from None


def ran(r: rp.CommandResult) -> dict[str, Any]:
    """A command's answer: how it ended, or that it runs on (its id and cursor)."""
    body: dict[str, Any] = {
        "commandId": r.command_id,
        "running": r.running,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "durationMs": r.duration_ms,
    }
    if r.running:
        return {**body, "cursor": r.cursor, "more": r.stdout_truncated}
    changes = r.changes
    return {
        **body,
        "exitCode": r.exit_code,
        "timedOut": r.timed_out,
        "stdoutOmittedBytes": r.stdout_omitted_bytes,
        "stdoutTail": r.stdout_tail,
        "stderrOmittedBytes": r.stderr_omitted_bytes,
        "stderrTail": r.stderr_tail,
        "version": changes.version if changes is not None and changes.committed else None,
        "changed": changes.total if changes is not None else 0,
    }


def polled(r: rp.CommandStatus) -> dict[str, Any]:
    """``exec.poll``'s answer in the door's words (camelCase; its commit's error as
    ``commitError``: a 200's body names no ``error``)."""
    body: dict[str, Any] = camel(r)
    body["commitError"] = body.pop("error")
    return body


class Commands:
    """The command endpoints, over the caller's own workspace."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def run(self, request: Request) -> Response:
        body = fields_of(await json_body(request), RUN_FIELDS, '{"command": "..."}')
        req = command_request(body)
        ws = await own_workspace(self.access, request)
        result = await ws.exec(
            req.command,
            workdir=req.workdir,
            timeout_ms=req.timeout_ms,
            env=req.env,
            yield_ms=req.yield_ms,
            stdin=req.stdin,
            pty=(req.pty.rows, req.pty.cols) if req.pty is not None else None,
        )
        headers = None
        if result.running:
            headers = {"Location": f"{COMMANDS}/{quote(result.command_id)}/output"}
        return JSONResponse(ran(result), headers=headers)

    async def list(self, request: Request) -> Response:
        if request.query_params.get("running", "1") not in ("1", "true"):
            raise QuillError(E.INVALID_ARGUMENT, "Only running commands are listed (running=1)")
        ws = await own_workspace(self.access, request)
        listed = await ws.running()
        commands = [
            {
                "commandId": c.command_id,
                "command": c.command,
                "workdir": c.workdir,
                "actor": c.actor,
                "startedAt": c.started.isoformat().replace("+00:00", "Z"),
                "stdinOpen": c.stdin_open,
            }
            for c in listed.commands
        ]
        return JSONResponse({"commands": commands})

    async def output(self, request: Request) -> Response:
        handle = handle_param(request)
        asked = {"command_id": handle, "cursor": request.query_params.get("cursor", "")}
        poll: rq.CommandPoll = typed(asked, rq.CommandPoll, "cursor")
        wait_ms = count_param(request, "waitMs", LIVE_WAIT_MAX_MS, lowest=0, unit=" (ms)") or 0
        max_bytes = count_param(request, "maxBytes", LIVE_POLL_MAX_BYTES) or 64 * 1024
        ws = await own_workspace(self.access, request)
        status = await ws.command(handle, poll.cursor).poll(wait_ms=wait_ms, max_bytes=max_bytes)
        return JSONResponse(polled(status))

    async def input(self, request: Request) -> Response:
        handle = handle_param(request)
        body = fields_of(await json_body(request), frozenset({"data", "eof"}), '{"data": "..."}')
        data = typed(body.get("data", ""), str, "data").encode()
        if len(data) > LIVE_INPUT_MAX_BYTES:
            raise QuillError(E.SIZE_LIMIT_EXCEEDED, f"data over {LIVE_INPUT_MAX_BYTES} bytes")
        eof = typed(body.get("eof", False), bool, "eof")
        ws = await own_workspace(self.access, request)
        written = await ws.command(handle).input(data, eof=eof)
        return JSONResponse(
            {"commandId": written.command_id, "written": written.written, "closed": written.closed}
        )

    async def signal(self, request: Request) -> Response:
        handle = handle_param(request)
        body = fields_of(await json_body(request), frozenset({"signal"}), '{"signal": "INT"}')
        name = typed(body.get("signal", "TERM"), rq.SignalName, "signal")
        ws = await own_workspace(self.access, request)
        sent = await ws.command(handle).signal(name)
        return JSONResponse(
            {"commandId": sent.command_id, "signal": sent.signal, "processes": sent.processes}
        )


def str_schema(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def int_schema(description: str, most: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": 0, "description": description}
    return {**schema, "maximum": most} if most is not None else schema


PTY = obj(
    required=("rows", "cols"),
    closed=True,
    about="Run it in a terminal of this size (with yieldMs)",
    rows=int_schema("Rows", PTY_MAX_SIDE),
    cols=int_schema("Columns", PTY_MAX_SIDE),
)
ENV = {"type": "object", "additionalProperties": STR}
TIMEOUT = int_schema("Stop it after this long (default 30000)")
YIELD = int_schema("Answer then if it still runs; it runs on", LIVE_YIELD_MAX_MS)
INT_OR_NULL = {"type": ["integer", "null"]}
SCHEMAS: dict[str, Any] = {
    "CommandRun": obj(
        required=("command",),
        closed=True,
        command=str_schema("The shell command line (bash -c)"),
        workdir=str_schema("Working directory, workspace-relative (default: the root)"),
        timeoutMs=TIMEOUT,
        env=ENV,
        yieldMs=YIELD,
        stdin=str_schema("Its standard input, whole (text; default: closed)"),
        pty=PTY,
    ),
    "CommandRan": obj(
        about="How it ended, or (running) its id and cursor: it runs on",
        commandId=STR,
        running=BOOL,
        stdout=str_schema("Its output (running: so far; ended: the head of a long one)"),
        stderr=STR,
        cursor=str_schema("running: for GET …/output"),
        exitCode=INT,
        timedOut=BOOL,
        version={**INT_OR_NULL, "description": "Its changes' version"},
        changed=INT,
    ),
    "CommandOutput": obj(
        about="The output after the cursor; once ended, how it ended",
        commandId=STR,
        running=BOOL,
        stdout=STR,
        stderr=STR,
        cursor=str_schema("For the next GET …/output"),
        more={"type": "boolean", "description": "More is kept past cursor already"},
        dropped=int_schema("Bytes past what is kept, before the cursor: not shown"),
        exitCode=INT_OR_NULL,
        timedOut=BOOL,
        version=INT_OR_NULL,
        changed=INT,
        commitError={"type": ["string", "null"]},
    ),
}


def id_param(name: str, kind: Any) -> dict[str, Any]:
    """An OpenAPI path parameter of an id, its schema the contract's (``kind``)."""
    return {"name": name, "in": "path", "required": True, "schema": msgspec.json.schema(kind)}


COMMAND_ID = id_param("commandId", rq.CommandHandle)
FAILURES = {
    "404": "not_found: no such command in this workspace (made up, another's, or too old)",
    "409": "command_ended: it takes no input or signal any more",
    "410": "command_lost: the executor holding it is gone, and the command with it",
}


def with_failures(errors: dict[str, Any], error: Any, failures: dict[str, str]) -> dict[str, Any]:
    """``errors`` and the responses of ``failures`` (status to description)."""
    return {**errors, **{code: error(text) for code, text in failures.items()}}


def paths(json: Any, errors: dict[str, Any], error: Any) -> dict[str, Any]:
    """The OpenAPI paths of the commands (``json(schema, description)``, ``errors``, and
    ``error(description)`` as the document writes them)."""
    failures = with_failures(errors, error, FAILURES)
    obj = {"type": "object"}
    return {
        COMMANDS: {
            "post": {
                "summary": "Run a command; with yieldMs, one still running then runs on",
                "requestBody": body({"$ref": "#/components/schemas/CommandRun"}),
                "responses": {
                    "200": json({"$ref": "#/components/schemas/CommandRan"}, "Ran, or runs on"),
                    **errors,
                },
            },
            "get": {
                "summary": "The commands still running in the workspace, on every executor",
                "parameters": [
                    {"name": "running", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": json(obj, "{commands: [...]}"), **errors},
            },
        },
        COMMANDS + "/{commandId}/output": {
            "parameters": [COMMAND_ID],
            "get": {
                "summary": "Its output after cursor, waiting up to waitMs while it runs",
                "parameters": [
                    {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    {"name": "waitMs", "in": "query", "schema": int_schema("", LIVE_WAIT_MAX_MS)},
                    {
                        "name": "maxBytes",
                        "in": "query",
                        "schema": int_schema("", LIVE_POLL_MAX_BYTES),
                    },
                ],
                "responses": {
                    "200": json({"$ref": "#/components/schemas/CommandOutput"}, "Its output"),
                    **failures,
                },
            },
        },
        COMMANDS + "/{commandId}/input": {
            "parameters": [COMMAND_ID],
            "post": {
                "summary": "Text to its standard input; eof closes it",
                "requestBody": body(
                    {
                        "type": "object",
                        "properties": {"data": {"type": "string"}, "eof": {"type": "boolean"}},
                    }
                ),
                "responses": {"200": json(obj, "{commandId, written, closed}"), **failures},
            },
        },
        COMMANDS + "/{commandId}/signal": {
            "parameters": [COMMAND_ID],
            "post": {
                "summary": "INT, TERM (KILL 5 s after), KILL or HUP to its processes",
                "requestBody": body(
                    {
                        "type": "object",
                        "properties": {
                            "signal": {"type": "string", "enum": ["INT", "TERM", "KILL", "HUP"]}
                        },
                    }
                ),
                "responses": {"200": json(obj, "{commandId, signal, processes}"), **failures},
            },
        },
    }
