"""MCP tools from a table: one ``Tool`` row per tool, one generic path that serves them all.

A row names the tool, the op it is (a key of ``contracts.ops.OPS``), what a model reads about it
(description, parameters), how its arguments become the op's request and how the op's result
reads. The generic path resolves the workspace the call goes to (``Tools.call``), calls the SDK
method of the op with the request and renders the result; ``files``, ``quill_tools``,
``reference``, ``approvals``, ``sessions``, ``workspaces`` and ``wap`` are their tables. The few
tools that are not one op on one workspace say so in their row: ``call`` (WAP's ``searchFiles``
greps several paths; its ``readFile`` turns a line range into a read) or ``run`` (the session
tools, on the caller's session rather than a workspace).

The input schema a client lists is the one MCP derives from a Python signature: the row's
``Arg`` s make that signature (same annotations, same defaults), so a tool's schema is what a
hand-written ``async def`` with those parameters would publish. The output schema is the
row's ``output``, else the shape of the op's result (``schemas``), admitting the error form.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from contracts.ops import OPS
from quill.client import Workspace
from services.gateway.access import Principal
from services.gateway.mcp.engine import Answer, Ctx, Done, Tools, with_progress
from services.gateway.mcp.schemas import Schema, shape, with_errors

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
"""Changes nothing (MCP: ``readOnlyHint``); reaches only the workspace (``openWorldHint``
false)."""
ADDS = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
"""Only adds (nothing is overwritten or removed), and again with the same arguments changes
nothing more (``idempotentHint``)."""
REPLACES = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)
"""May overwrite or remove (``destructiveHint``), but again with the same arguments changes
nothing more (a write of the same content, a restore, a delete)."""
CHANGES = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)
"""May overwrite or remove, and each call may change again (an edit, an insert, a move)."""
OPEN = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=True
)
"""Anything a program may do, beyond the workspace as well: a command (an executor may run
without a sandbox's network fence), git's push, pull and clone."""
REQUIRED: Any = inspect.Parameter.empty
"""An ``Arg`` default: the argument is required."""
WORKSPACE = "workspace"
"""The argument every tool takes for where it goes (``Tools.call``): never part of a request."""
WORKSPACE_SAYS = "Omit for yours; else a workspace id (tenant/id if no tokens) or attached URI"
"""What ``workspace`` is, in each tool's input schema: clients that hand a model the tools
but not the server's instructions (LangChain, pydantic-ai) give it nothing else."""
SDK_METHODS: dict[str, str] = {
    "exec.run": "exec",
    "exec.output": "command_output",
    "exec.list": "running",
}
"""The ``quill.Workspace`` method of an op where it is not named as the op (``cmd.write`` is
``Workspace.write``). ``contracts.ops`` names no SDK method, so the gateway keeps these."""


def sdk_method(op: str) -> str:
    """The name of the ``quill.Workspace`` method that sends ``op``."""
    return SDK_METHODS.get(op, OPS[op].name)


def described(kind: Any, description: str, **rules: Any) -> Any:
    """``kind`` as a parameter's schema shows it: with its description (and ``rules``, such as
    ``ge=1``)."""
    return Annotated[kind, Field(description=description, **rules)]


def workspace_arg(says: str = WORKSPACE_SAYS) -> Arg:
    """The optional ``workspace`` argument of a tool, described in its schema."""
    return Arg(WORKSPACE, described(str | None, says), None)


class Args(dict[str, Any]):
    """A tool call's arguments by name; ``a.path`` reads ``a["path"]``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class Arg:
    """A tool parameter: its name and annotated type (its schema), its default, and the field
    of the op's request it fills (``to``, default its own name), as ``send`` makes it."""

    name: str
    kind: Any
    default: Any = REQUIRED
    to: str | None = None
    send: Callable[[Any], Any] | None = None

    @property
    def field(self) -> str:
        return self.to or self.name


@dataclass(frozen=True)
class Tool:
    """One MCP tool. ``render(args, result)`` is what the endpoint's answer is made of (the text
    at ``/mcp``, the response object at ``/mcp/wap``); ``path`` names the argument failures and
    approvals speak of; ``detail`` is what else a user asked to approve the call sees. A
    ``render`` that returns a ``Done`` is the answer as it is (content blocks of its own)."""

    name: str
    op: str
    description: str
    args: tuple[Arg, ...]
    render: Callable[[Args, Any], Any]
    annotations: ToolAnnotations | None = None
    path: str | None = "path"
    detail: Callable[[Args], str] | None = None
    call: Callable[[Workspace, Args], Awaitable[Any]] | None = None
    """Instead of the op's SDK method with the request the ``args`` make."""
    run: Callable[[Any, Principal, Args], Awaitable[Any]] | None = None
    """On the caller (``(host, principal, args)``) rather than on a workspace."""
    session_call: Callable[[Any, Principal, Workspace, Args], Awaitable[Any]] | None = None
    """On a workspace for the caller's MCP session (``(host, principal, ws, args)``: a
    command in the session's shell, ``terminal``); where the endpoint has no host, the op's
    SDK method as without it."""
    output: Schema | None = None
    """The success shape of ``structuredContent`` where it is not the op's result's."""
    waits: bool = False
    """A call may wait long (a command, output to come): the client is sent progress while
    it does, if it asked for progress (``engine.with_progress``)."""

    @property
    def output_schema(self) -> Schema:
        """The declared ``outputSchema``: success or the error form."""
        return with_errors(self.output or shape(OPS[self.op].result))

    def request(self, args: Args) -> dict[str, Any]:
        """The op's request fields (the SDK method's keyword arguments) for ``args``."""
        return {
            a.field: a.send(args[a.name]) if a.send else args[a.name]
            for a in self.args
            if a.name != WORKSPACE
        }

    def signature(self) -> inspect.Signature:
        """The Python signature MCP derives the input schema from (after ``ctx``)."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter("ctx", kind, annotation=Ctx)]
        params += [
            inspect.Parameter(a.name, kind, default=a.default, annotation=a.kind) for a in self.args
        ]
        return inspect.Signature(params, return_annotation=Answer)


Answerer = Callable[[Any, Any], Done]
"""An endpoint's answer from ``(rendered, result)``."""


async def sdk_call(ws: Workspace, tool: Tool, args: Args) -> Any:
    """The op of ``tool`` on ``ws``, through its SDK method."""
    return await getattr(ws, sdk_method(tool.op))(**tool.request(args))


def handler(tool: Tool, tools: Tools, answer: Answerer, host: Any = None) -> Any:
    """The function MCP calls for ``tool`` (its signature made from the row)."""

    def answered(rendered: Any, result: Any) -> Done:
        return rendered if isinstance(rendered, Done) else answer(rendered, result)

    async def serve(ctx: Ctx, **given: Any) -> Answer:
        if tool.waits:
            return await with_progress(ctx, tool.name, served(ctx, **given))
        return await served(ctx, **given)

    async def served(ctx: Ctx, **given: Any) -> Answer:
        args = Args(given)
        path = (args.get(tool.path) or None) if tool.path else None
        workspace = args.get(WORKSPACE)
        if tool.run is not None:
            run = tool.run

            async def on_caller(principal: Principal) -> Done:
                result = await run(host, principal, args)
                return answer(tool.render(args, result), result)

            return await tools.run(ctx, tool.name, on_caller, path=path, workspace=workspace)

        async def go(ws: Workspace, principal: Principal) -> Done:
            if tool.session_call is not None and host is not None:
                result = await tool.session_call(host, principal, ws, args)
            elif tool.call is not None:
                result = await tool.call(ws, args)
            else:
                result = await sdk_call(ws, tool, args)
            return answered(tool.render(args, result), result)

        detail = tool.detail(args) if tool.detail else None
        return await tools.call(
            ctx, tool.name, go, op=tool.op, path=path, workspace=workspace, detail=detail
        )

    serve.__name__ = re.sub(r"(?<!^)([A-Z])", r"_\1", tool.name).lower()  # schema's title
    serve.__signature__ = tool.signature()  # type: ignore[attr-defined]
    serve.__annotations__ = {
        "ctx": Ctx,
        **{a.name: a.kind for a in tool.args},
        "return": Answer,
    }
    return serve


def register(
    server: MCPServer, tools: Tools, table: tuple[Tool, ...], answer: Answerer, host: Any = None
) -> None:
    """Every tool of ``table`` on ``server``, in the table's order (``host``: what ``run``
    rows act through)."""
    for tool in table:
        server.add_tool(
            handler(tool, tools, answer, host),
            name=tool.name,
            description=tool.description,
            annotations=tool.annotations,
        )
        registered = server._tool_manager.get_tool(tool.name)  # no public handle
        assert registered is not None
        registered.fn_metadata.output_schema = tool.output_schema


def ops_of(table: tuple[Tool, ...]) -> dict[str, str]:
    """Each tool of ``table`` and the op it is."""
    return {tool.name: tool.op for tool in table}
