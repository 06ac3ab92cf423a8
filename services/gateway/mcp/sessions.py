"""Sessions at ``/mcp`` (seed 003): each caller's primary workspace, the workspaces attached to
it, and where a tool call goes.

A caller's session is ``quill.session.Session`` over its principal's workspace (a token's
own; ``default/default`` without tokens): attachments are events in that workspace's log, so
they outlast the stateless MCP exchange and every gateway sees the same ones. Resolution, for a
tool that names no ``workspace``: the primary if it offers the tool's op, else the first
attached workspace that does, else ``Tool not found``. A ``workspace`` naming an attached
workspace's URI goes there; a plain id goes to that workspace of the caller's tenant, as
before. A pinned token reaches its own workspace only: it attaches nothing.

Each MCP session's shell for ``execute_command`` is ``Sessions.shells`` (``terminal``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.types import ToolAnnotations
from pydantic import Field

from contracts import replies as rp
from contracts import uris
from contracts.errors import ErrorCode, QuillError
from contracts.limits import GATEWAY_SESSIONS
from core.lru import LRU
from quill.client import Quill, Workspace
from quill.session import Session
from services.gateway.access import Access, Principal
from services.gateway.mcp import workspaces
from services.gateway.mcp.table import Arg, Tool
from services.gateway.mcp.terminal import SessionShells

AS_ATTACHED = Annotated[str, Field(min_length=1, description="The URI it was attached as")]
URI = Annotated[
    str,
    Field(
        min_length=1,
        description=(
            "server:/<tenant>/<workspace>, git:<url> (cloned into a new restricted "
            "workspace) or <client>:<path> (a folder quill attach serves on that machine)"
        ),
    ),
]
Primary = Annotated[
    str | None,
    Field(
        description=(
            "Another session of your tenant, by its primary workspace's id (default: yours)"
        )
    ),
]
ATTACH = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=True
)
"""Changes only the session, the same again; reaches beyond Quill (a git URL, a user's
folder)."""
DETACH = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
LISTING = ToolAnnotations(read_only_hint=True, open_world_hint=False)


class Sessions:
    """One ``Session`` per principal (it remembers what workspaces offer, for 30 s), and per
    other primary workspace named: at most ``GATEWAY_SESSIONS``, least recently used
    forgotten first (opened again when next used: what a session holds is in its log)."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self._open: LRU[tuple[Principal, str], Session] = LRU(GATEWAY_SESSIONS)
        self.shells = SessionShells()
        """Each MCP session's shell for ``execute_command`` (``terminal``)."""

    async def session(self, principal: Principal, primary: str | None = None) -> Session:
        """The principal's session, or (``primary``: a workspace id) the session of that
        workspace of its tenant.

        Raises:
            QuillError: ``WORKSPACE_NOT_FOUND`` for a workspace the principal may not reach.
        """
        key = (principal, primary or principal.workspace)
        session = self._open.get(key)
        if session is None:
            ws = await self.access.workspace(principal, primary)
            session = Session(Quill.of(ws), ws)
            self._open.put(key, session)
        return session

    async def target(
        self, principal: Principal, op: str | None, workspace: str | None
    ) -> Workspace:
        """The workspace a call of ``op`` goes to (no op: the primary).

        Raises:
            QuillError: ``INVALID_ARGUMENT`` "Tool not found" when no workspace of the session
                offers the op; ``WORKSPACE_NOT_FOUND``/``FILE_NOT_FOUND`` for a workspace the
                caller may not reach or has not attached.
        """
        if workspace in (f"server:/{principal.name}", f"quill:/{principal.name}"):
            workspace = None  # its own, by URI
        if workspace and (principal.pinned or ":" not in workspace):
            return await self.access.workspace(principal, workspace)
        session = await self.session(principal)
        if op is None:
            return session.primary
        ws = await session.resolve(op, workspace)
        if principal.pinned and ws is not session.primary:  # attached by an operator: not ours
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Tool not found: no workspace of session {session.id} offers {op}",
                {"op": op, "session": session.id},
            )
        return ws

    async def attach(
        self, principal: Principal, uri: str, primary: str | None = None
    ) -> rp.Attached:
        """Attach ``uri`` to the principal's session.

        Raises:
            QuillError: ``ACCESS_DENIED`` for a pinned token; ``WORKSPACE_NOT_FOUND`` for
                another tenant's workspace (said as for one that does not exist);
                ``INVALID_ARGUMENT`` for a malformed URI; what attaching itself raises.
        """
        parsed = uris.parse(uri)
        if principal.pinned:
            raise QuillError(
                ErrorCode.ACCESS_DENIED,
                f"Access denied: this token reaches only its own workspace ({principal.name}) "
                "and cannot attach others",
                {"uri": uri},
            )
        unknown = QuillError(
            ErrorCode.WORKSPACE_NOT_FOUND, f"Workspace not found: {uri}", {"uri": uri}
        )
        if parsed.kind == "server":
            tenant, name = parsed.path.split("/")
            if tenant != principal.tenant:
                raise unknown
            await self.access.workspace(principal, name)  # created on first use, as named
        session = await self.session(principal, primary)
        try:
            listing = await session.attach(uri)
        except QuillError as exc:
            if exc.code == ErrorCode.ACCESS_DENIED:  # a bridge of another tenant's: say nothing
                raise unknown from None
            raise
        session.refresh()
        return listing

    async def detach(
        self, principal: Principal, uri: str, primary: str | None = None
    ) -> rp.Attached:
        """Raises:
        QuillError: ``FILE_NOT_FOUND`` when ``uri`` is not attached."""
        session = await self.session(principal, primary)
        listing = await session.detach(uri)
        session.refresh()
        return listing

    async def workspaces(self, principal: Principal, primary: str | None = None) -> rp.Attached:
        return await (await self.session(principal, primary)).workspaces()


def workspaces_text(found: dict[str, Any]) -> str:
    """``list_workspaces``: the session's workspaces, then the tenant's page."""
    session = rp.Attached(
        primary=found["primary"],
        attached=[rp.AttachedWorkspace(**w) for w in found["attached"]],
    )
    return f"{listing_text(session)}\n\n{workspaces.listing_text(found)}"


def listing_text(listing: rp.Attached, change: str | None = None) -> str:
    """``Attached server:/acme/notes.`` then the session's workspaces, in resolution order."""
    lines = [change] if change else []
    lines.append(f"Primary workspace: server:/{listing.primary}")
    if not listing.attached:
        lines.append("No workspaces attached")
    else:
        lines.append("Attached (tools that name no workspace try them in this order):")
        lines += [f"  {a.uri} -> {a.target} ({a.kind})" for a in listing.attached]
    return "\n".join(lines)


SESSION = Arg("workspace", Primary, None)
Change = Callable[[Sessions, Principal, str, str | None], Awaitable[rp.Attached]]


def by_uri(
    name: str,
    op: str,
    description: str,
    done: str,
    change: Change,
    hints: ToolAnnotations,
    uri: Any = URI,
) -> Tool:
    """A tool that changes the session by a workspace's URI and answers its workspaces."""
    return Tool(
        name,
        op,
        description,
        (Arg("uri", uri), SESSION),
        lambda a, listing: listing_text(listing, f"{done} {a.uri}"),
        hints,
        path="uri",
        run=lambda sessions, principal, a: change(sessions, principal, a.uri, a.workspace),
    )


TOOLS: tuple[Tool, ...] = (
    by_uri(
        "attach_workspace",
        "cmd.attach",
        "Attach a workspace to this session by URI: tools that name no workspace try yours, "
        "then the attached ones in order; a workspace argument may name one by its URI.",
        "Attached",
        Sessions.attach,
        ATTACH,
    ),
    by_uri(
        "detach_workspace",
        "cmd.detach",
        "Detach an attached workspace from this session; its files stay in the workspace.",
        "Detached",
        Sessions.detach,
        DETACH,
        AS_ATTACHED,
    ),
    Tool(
        "list_workspaces",
        "qry.workspaces",
        "This session's workspaces (yours, then the attached ones in the order tools that "
        "name no workspace try them), then your tenant's, a page at a time.",
        (Arg("after", workspaces.After, None), SESSION),
        lambda a, found: workspaces_text(found),
        LISTING,
        output=workspaces.LISTING_OUTPUT,
        path=None,
        run=workspaces.tenant_listing,
    ),
)
"""attach_workspace, detach_workspace, list_workspaces: on the caller's session (``run``)."""
TOOLS = TOOLS + workspaces.TOOLS  # fork_workspace, archive_workspace: the tenant's
