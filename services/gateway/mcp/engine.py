"""Running one MCP tool call: find the caller's workspace, call the SDK, answer or fail softly.

Every tool answers a ``CallToolResult`` with text for the model and ``structuredContent`` for
programs. Failures are tool results with ``isError: true`` (never protocol errors): the text
comes from the endpoint's error table, the structured content is WAP's error form
``{"error": message, "code": code, "details": {...}}``.

A call that may wait long (a command, output still to come: ``Tool.waits``) sends the client
progress notifications while it waits, every ``PROGRESS_EVERY_S``, when the client asked for
them with a progress token (``with_progress``): clients such as Claude Code time a tool call
out unless they hear from it (``exchange`` streams them before the answer).

Where a call goes is the endpoint's ``Route`` (``/mcp``: the caller's session, see ``sessions``;
otherwise the caller's workspace or the one of its tenant it names). On an endpoint that
elicits, a call parked for approval is put to the client's user (``elicitation``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ContentBlock, InputRequiredResult, TextContent

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from infra.http.metrics import observe
from quill.client import Quill, Workspace
from services.gateway.access import Access, Principal, principal_of
from services.gateway.mcp import clients, elicitation
from services.gateway.mcp.schemas import no_titles

log = logging.getLogger("quill.gateway")

Ctx = Context[Any, Any]
Answer = CallToolResult | InputRequiredResult
"""A tool's answer: its result, or (2026-07-28) a question for the client's user first."""
Route = Callable[[Principal, str | None, str | None], Awaitable[Workspace]]
"""``(principal, op, workspace named or None)`` → the workspace a call of ``op`` goes to."""


PROGRESS_EVERY_S = 2.0
"""How often a waiting call tells a client that asked for progress that it still waits."""


def progress_token(ctx: Ctx) -> Any:
    """The progress token the call's client gave (``_meta.progressToken``), or None."""
    meta: Any = ctx.request_context.meta or {}
    return meta.get("progress_token", meta.get("progressToken"))


async def with_progress(ctx: Ctx, tool: str, call: Coroutine[Any, Any, Answer]) -> Answer:
    """``call``'s answer; meanwhile, if the client asked for progress, a notification every
    ``PROGRESS_EVERY_S``: the seconds waited so far (no total: a command's end is unknown)."""
    if progress_token(ctx) is None:
        return await call
    started = time.monotonic()

    async def tell() -> None:
        while True:
            await anyio.sleep(PROGRESS_EVERY_S)
            waited = time.monotonic() - started
            with anyio.CancelScope(shield=True):  # a notification is sent whole or not at all
                await ctx.report_progress(waited, None, f"{tool}: still waiting ({waited:.0f} s)")

    async with anyio.create_task_group() as group:
        group.start_soon(tell)
        try:
            answered = await call
        finally:
            group.cancel_scope.cancel()
    return answered


@dataclass(frozen=True)
class Done:
    """A tool's success: ``text`` for the model, ``data`` (JSON-able) for programs;
    ``blocks``: content (an image, audio) the model gets instead of the text."""

    text: str
    data: Any
    blocks: tuple[ContentBlock, ...] = ()


def builtins(value: Any) -> Any:
    """A result (msgspec structs, datetimes, bytes) as plain JSON-able values."""
    return msgspec.to_builtins(value)


def error_data(error: QuillError) -> dict[str, Any]:
    """WAP's error form."""
    return {"error": error.message, "code": str(error.code), "details": builtins(error.details)}


def answer(
    text: str, data: Any, *, is_error: bool = False, blocks: tuple[ContentBlock, ...] = ()
) -> CallToolResult:
    content = list(blocks) or [TextContent(type="text", text=text)]
    return CallToolResult(content=content, structured_content=data, is_error=is_error)


def text_read(result: rp.FileContent, path: str) -> rp.FileContent:
    """A read that has text: the tools read files only as text.

    Raises:
        QuillError: ``NOT_A_FILE`` for a directory, ``INVALID_ENCODING`` for a binary file.
    """
    if result.kind == "directory":
        raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {path}", {"path": path})
    if result.content is None:
        raise QuillError(ErrorCode.INVALID_ENCODING, "File contains invalid UTF-8 encoding")
    return result


def converted(value: Any, kind: Any, what: str) -> Any:
    """``value`` as the contract type ``kind`` (strictly, as the bus would check it).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` naming the problem.
    """
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid {what}: {exc}") from None


@dataclass(frozen=True)
class Failure:
    """A tool call that failed: which tool, why, on which path and workspace (as asked)."""

    tool: str
    error: QuillError
    path: str | None
    workspace: str


Renderer = Callable[[Failure], CallToolResult]
"""How an endpoint turns a failure into its tool result."""


class Tools:
    """Runs tool bodies for one MCP endpoint (``kind`` ``mcp`` or ``wap``)."""

    def __init__(
        self,
        access: Access,
        kind: str,
        render: Renderer,
        route: Route | None = None,
        *,
        elicit: bool = False,
        told: Callable[[QuillError], QuillError] | None = None,
    ) -> None:
        self.access, self.kind, self.render = access, kind, render
        self.route = route or (lambda principal, op, name: access.workspace(principal, name))
        self.elicit = elicit
        """Ask the client's user about calls parked for approval (where it can be asked)."""
        self.told = told or (lambda error: error)
        """``APPROVAL_REQUIRED`` as a client that cannot ask its user is told it (what to
        call to wait for the outcome)."""

    async def run(
        self,
        ctx: Ctx,
        tool: str,
        body: Callable[[Principal], Awaitable[Done | InputRequiredResult]],
        *,
        path: str | None = None,
        workspace: str | None = None,
    ) -> Answer:
        """Run ``body`` for the caller, counting the call; any failure becomes an ``isError``
        result."""
        started = time.perf_counter()
        request = ctx.request_context.request  # the HTTP request (None over stdio: no caller)
        principal = principal_of(request.scope if request is not None else {})
        principal = clients.caller(principal, ctx, getattr(request, "headers", None))
        try:
            done = await body(principal)
        except QuillError as exc:
            error = exc
        except UnicodeEncodeError:  # a lone surrogate in a JSON string: not encodable text
            error = QuillError(ErrorCode.INVALID_ENCODING, "Text is not valid UTF-8")
        except Exception:
            log.exception("tool %s failed", tool)
            error = QuillError(ErrorCode.INTERNAL, "Internal error in the gateway (logged)")
        else:
            if isinstance(done, InputRequiredResult):
                observe(self.kind, tool, "input_required", started)
                return done
            observe(self.kind, tool, "ok", started)
            return answer(done.text, done.data, blocks=done.blocks)
        observe(self.kind, tool, str(error.code), started)
        return self.render(Failure(tool, error, path, workspace or principal.workspace))

    async def call(
        self,
        ctx: Ctx,
        tool: str,
        body: Callable[[Workspace, Principal], Awaitable[Done]],
        *,
        op: str | None = None,
        path: str | None = None,
        workspace: str | None = None,
        detail: str | None = None,
    ) -> Answer:
        """Run ``body`` (with the caller) on the workspace a call of ``op`` goes to
        (``route``); on an endpoint that elicits, a call parked for approval is put to the
        client's user first (``detail``: what else the user should see, such as the command
        line)."""

        async def go(principal: Principal) -> Done | InputRequiredResult:
            parked = elicitation.resumed(ctx) if self.elicit else None
            if parked is not None:  # the second round: the user has answered
                accepted, reason = elicitation.reply(ctx)
                ws = Quill.of(await self.access.workspace(principal)).workspace(parked.workspace)
                await elicitation.decide(principal, ws, parked, accepted, reason)
                return await body(elicitation.again(ws, parked.approval_id), principal)
            ws = await self.route(principal, op, workspace)
            try:
                return await body(ws, principal)
            except QuillError as exc:
                if exc.code != ErrorCode.APPROVAL_REQUIRED:
                    raise
                if not self.elicit:
                    raise self.told(exc) from None
                what = elicitation.Asked(tool, op, path, detail)
                asked = await elicitation.ask(ctx, principal, ws, what, exc)
                if asked is None:
                    raise self.told(exc) from None
                if isinstance(asked, InputRequiredResult):
                    return asked
                return await body(elicitation.again(ws, asked.approval_id), principal)

        return await self.run(ctx, tool, go, path=path, workspace=workspace)


DROPPED = ("discriminator", "description", "title", "additionalProperties", "maximum", "maxLength")
"""What a contract type's schema says that a tool's parameter does not: docstrings are not for
a model, and the bus checks unknown fields and sizes (the last two, on numbers and strings)."""


def inline_schema(kind: Any) -> dict[str, Any]:
    """The JSON Schema of a contract type with its ``$defs`` inlined (a tool argument's schema
    cannot point into a document root it does not own), without the types' docstrings (the
    tool's parameter says what a model needs)."""
    schema = msgspec.json.schema(kind)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            dropped = DROPPED if node.get("type") in ("integer", "string") else DROPPED[:4]
            return {k: inline(v) for k, v in node.items() if k not in dropped}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    result: dict[str, Any] = inline(schema)
    return result


SDK_PREFIX = "Error executing tool "


def validation_summary(text: str) -> str:
    """Pydantic's multi-line validation report as one line: ``path: Field required; ...``."""
    problems: list[str] = []
    location: str | None = None
    for line in text.splitlines()[1:]:
        if not line.startswith(" "):
            location = line.strip()
        elif not line.startswith("   ") and location is not None:
            problems.append(f"{location}: {line.strip().split(' [type=')[0]}")
            location = None
    return "; ".join(problems) or text


class ArgumentErrors:
    """MCP server middleware: a tool call whose arguments failed validation (answered by the
    MCP library before any tool runs) gets the endpoint's error form and is counted like any
    other failure."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        started = time.perf_counter()
        result = await call_next(ctx)
        if ctx.method != "tools/call" or not isinstance(result, dict) or not result.get("isError"):
            return result
        blocks = result.get("content") or [{}]
        text = blocks[0].get("text", "") if isinstance(blocks[0], dict) else ""
        params = ctx.params or {}
        tool = str(params.get("name", "?"))
        if not text.startswith(f"{SDK_PREFIX}{tool}: "):
            return result  # our own tool results are already in the endpoint's form
        summary = validation_summary(text.removeprefix(f"{SDK_PREFIX}{tool}: "))
        error = QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid arguments: {summary}")
        observe(self.tools.kind, tool, str(error.code), started)
        arguments = params.get("arguments")
        arguments = arguments if isinstance(arguments, dict) else {}
        path, workspace = arguments.get("path"), arguments.get("workspace")
        failure = Failure(
            tool, error, path if isinstance(path, str) else None, str(workspace or "")
        )
        rendered = self.tools.render(failure).model_dump(by_alias=True, mode="json")
        return {
            **result,
            "content": rendered["content"],
            "structuredContent": rendered["structuredContent"],
        }


NULL = {"type": "null"}


def plain(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional parameter's schema without its null: pydantic writes ``int | None = None``
    as ``{"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null}``, which
    function-calling models handle worse than ``{"type": "integer"}``. The parameter stays
    optional (not in ``required``); a null a client sends is still taken as "not given" (the
    tool's arguments are validated against its Python signature, which keeps ``None``)."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or NULL not in options:  # a schema of its own: no null
        return {k: v for k, v in schema.items() if not (k == "default" and v is None)}
    rest = [option for option in options if option != NULL]
    out = {key: value for key, value in schema.items() if key != "anyOf"}
    if "default" in out and out["default"] is None:
        del out["default"]
    if len(rest) == 1 and isinstance(rest[0], dict):
        return {**rest[0], **out}
    return {**out, "anyOf": rest}


def plain_schemas(server: MCPServer) -> None:
    """Every tool of ``server`` with plain optional parameters (``plain``): done once, after
    the tools are registered, for every endpoint."""
    for tool in server._tool_manager.list_tools():  # the registered tools (no public handle)
        tool.parameters = no_titles(tool.parameters)
        properties = tool.parameters.get("properties", {})
        for name, schema in properties.items():
            if isinstance(schema, dict):
                properties[name] = plain(schema)
