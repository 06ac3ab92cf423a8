"""The gateway's two MCP endpoints, assembled from the tool tables and served over HTTP.

* ``/mcp``: the workspace tool's six tools (``files``), Quill's own (``quill_tools``),
  ``wait_for_approval`` (``approvals``), the reference filesystem server's (``reference``) and
  the session's (``sessions``, with ``workspaces``'s), in that order in ``tools/list``; a call
  parked for approval is put to the client's user where it can be asked (``elicitation``);
  failures in the workspace tool's words (``texts``).
* ``/mcp/wap``: the Workspace Agent Protocol's camelCase tools (``wap``).

Every tool is a row of its table, served by one engine (``table``, ``engine``). ``Endpoints``
is what the gateway's app includes: the routes (each an ``Exchange``: the MCP SDK's stateless
JSON exchange, answered in the request's task; at ``/mcp``, a session's ``DELETE`` closes its
shells, ``terminal``) and the lifespan that runs the SDK's session managers (and closes the
sessions' shells when it ends).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult
from starlette.routing import Route

from services.gateway import VERSION
from services.gateway.access import Access
from services.gateway.mcp import (
    approvals,
    elicitation,
    files,
    quill_tools,
    reference,
    sessions,
    table,
    texts,
    wap,
    workspaces,
)
from services.gateway.mcp.engine import (
    ArgumentErrors,
    Done,
    Failure,
    Tools,
    answer,
    builtins,
    error_data,
    plain_schemas,
)
from services.gateway.mcp.exchange import Exchange
from services.gateway.mcp.table import Tool

INSTRUCTIONS = """\
A persistent, shared, versioned workspace of files. Paths are relative to /workspace \
(`notes.txt`, `data/report.md`); `/workspace/notes.txt` is the same file, and any path outside \
/workspace is refused. Every tool takes an optional workspace: another workspace than yours \
(its id, tenant/id without tokens, or an attached one's URI). Every change is recorded: \
file_history and diff show what changed, restore brings back an earlier version. The file \
tools see committed files only. Errors are tool results starting with `Error:`."""


def render(failure: Failure) -> CallToolResult:
    """A failure as the workspace tool words it (``Error: ...``)."""
    error = texts.workspace_unknown(failure.error, failure.workspace)
    text = texts.error_text(failure.tool, error, failure.path, failure.workspace)
    return answer(text, error_data(error), is_error=True)


def said(text: str, result: Any) -> Done:
    """``/mcp``'s answer: the text for the model, the result as JSON for programs."""
    return Done(text, builtins(result))


MCP_TOOLS = files.TOOLS + quill_tools.TOOLS + approvals.TOOLS + reference.TOOLS + sessions.TOOLS
"""Every tool at ``/mcp``, in the order ``tools/list`` lists them."""
TOOL_OPS = table.ops_of(MCP_TOOLS)
"""The op each ``/mcp`` tool is (the session tools' included)."""
NO_TOOL: dict[str, str] = {
    "cmd.create": "a caller's workspace is created on its first call (access.Access)",
    "cmd.apply": "several changes against a base version: for syncing clients (SDK, bridge)",
    "cmd.run_start": "runs are an agent framework's (SDK, quill run)",
    "cmd.run_end": "runs are an agent framework's (SDK, quill run)",
    "qry.run": "runs are an agent framework's (SDK, quill run)",
    "cmd.lock": "a session's lock is its client's (SDK, quill lock)",
    "cmd.unlock": "a session's lock is its client's (SDK, quill lock)",
    "cmd.set_trust": "an operator's (quill trust): a model must not lift its own restriction",
    "cmd.decide": "a person's (elicitation, quill approve): a model must not approve itself",
    "qry.approvals": "an operator's (quill approvals)",
    "cmd.request_approval": "the executors' (asked before a command runs)",
    "qry.events": "the log: the SDK's and quill log (file_history is the model's view)",
    "qry.tree": "the executors' (a checkout's first build); list_files is the model's view",
    "exec.poll": "read_command_output with a cursor (one tool reads output, ended or running)",
    "exec.shell_open": "each MCP session gets its own shell for execute_command (terminal.py)",
    "exec.shell_close": "a session's shell closes with the session (terminal.py)",
    "exec.checkpoint": "a session's shell commits background work at its next command",
    "exec.resize": "a terminal's (quill shell): a model types no keys into a pty",
    "qry.forks": "an operator's overview (quill forks, REST, the console): a model knows the "
    "forks it made (fork_workspace answers each)",
    **workspaces.NO_TOOL,
}
"""The ops no ``/mcp`` tool is, and why: with ``TOOL_OPS``, every op of ``contracts.ops``."""
OPERATOR_TOOLS: dict[str, str] = {
    "archive_workspace": "archives any workspace of the tenant: an operator's decision",
}
"""Tools of ``/mcp`` for operators, not models: offered only when the gateway is told to
(``GatewayConfig.operator_tools``, ``quill gateway --operator-tool NAME``). A model picks its
tools from what ``tools/list`` offers; one it does not see it does not call."""


def offered(operator_tools: tuple[str, ...] = ()) -> tuple[Tool, ...]:
    """The tools ``/mcp`` lists: every one, but the operators' not named in
    ``operator_tools``."""
    return tuple(t for t in MCP_TOOLS if t.name not in OPERATOR_TOOLS or t.name in operator_tools)


def build_mcp(
    access: Access, operator_tools: tuple[str, ...] = (), host: sessions.Sessions | None = None
) -> MCPServer:
    """The MCP server of ``/mcp`` with its tools registered (``offered``); ``host``: the
    callers' sessions (default: new ones)."""
    server: MCPServer = MCPServer(
        "quill-workspace",
        title="Quill workspace",
        version=VERSION,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        request_state_security=elicitation.security(),
    )
    host = host or sessions.Sessions(access)
    tools = Tools(access, "mcp", render, host.target, elicit=True, told=approvals.told)
    server.middleware.append(ArgumentErrors(tools))
    table.register(server, tools, offered(operator_tools), said, host)
    plain_schemas(server)
    return server


def build_wap(access: Access) -> MCPServer:
    """The MCP server of ``/mcp/wap``."""
    server: MCPServer = MCPServer(
        "quill-wap",
        title="Quill workspace (Workspace Agent Protocol)",
        version=VERSION,
        instructions=(
            "Workspace Agent Protocol 1.0 tools over a Quill workspace. Every tool takes an "
            "optional workspace: another workspace of your tenant (its id) than yours."
        ),
        log_level="WARNING",
    )
    tools = Tools(access, "wap", wap.render)
    server.middleware.append(ArgumentErrors(tools))
    table.register(server, tools, wap.TOOLS, wap.reply)
    plain_schemas(server)
    return server


class Endpoints:
    """``/mcp`` and ``/mcp/wap`` over ``access``: what the gateway's app includes."""

    def __init__(
        self, access: Access, tokens: bool, host: str, operator_tools: tuple[str, ...] = ()
    ) -> None:
        """``tokens``: callers prove who they are (a tokens file); ``host``: the address the
        gateway listens on; ``operator_tools``: the operators' tools ``/mcp`` offers too."""
        self.sessions = sessions.Sessions(access)
        self.servers = [build_mcp(access, operator_tools, self.sessions), build_wap(access)]
        # With tokens, a caller proves who it is: the MCP library's Host/Origin checks (against
        # DNS rebinding, for servers without auth) would only stand in the way of a proxy.
        # Without tokens they stay on (and PrincipalMiddleware does the same for REST).
        security = (
            TransportSecuritySettings(enable_dns_rebinding_protection=False) if tokens else None
        )
        for server in self.servers:  # creates each one's session manager; routed to below
            server.streamable_http_app(
                json_response=True, stateless_http=True, host=host, transport_security=security
            )

    def routes(self) -> list[Route]:
        mcp, wap_server = self.servers
        return [
            Route("/mcp", Exchange(mcp.session_manager, ended=self.sessions.shells.end)),
            Route("/mcp/wap", Exchange(wap_server.session_manager)),
        ]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The app's lifespan: the SDK's session managers run while it serves."""
        async with contextlib.AsyncExitStack() as stack:
            for server in self.servers:
                await stack.enter_async_context(server.session_manager.run())
            stack.push_async_callback(self.sessions.shells.close_all)
            yield
