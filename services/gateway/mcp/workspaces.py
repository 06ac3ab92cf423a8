"""MCP at ``/mcp``: the caller's tenant's workspaces, ``list_workspaces`` (the session's
workspaces, then a page of the tenant's, the session's marked: ``sessions.py`` serves it) and
``archive_workspace`` (an operator's tool, offered only when the gateway is told to:
``endpoints.OPERATOR_TOOLS``). Unarchive and purge are not tools: a model must not undo an
operator's archive, nor destroy a workspace. Who may see and change which workspace is
``access.py``'s (``listing``, ``target``); REST's routes are ``rest/workspaces.py``.
"""

from __future__ import annotations

from typing import Any

from mcp.types import ToolAnnotations

from contracts import replies as rp
from services.gateway.access import PAGE, Principal, listing, summary_json, target
from services.gateway.mcp.schemas import obj
from services.gateway.mcp.table import Arg, Args, Tool, described

After = described(str | None, "The previous page's next: list the workspaces after it")
Name = described(str, "A workspace of your tenant, e.g. notes")
Session = described(
    str | None,
    "Optional: mark the workspaces of another session of your tenant, by its primary "
    "workspace's id. Omit for your own session.",
)
Reason = described(str | None, "Why (recorded in its log)")
LISTING = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ARCHIVES = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)


async def tenant_listing(sessions: Any, principal: Principal, a: Args) -> dict[str, Any]:
    """``list_workspaces``: the session's workspaces (primary, then attached, by URI) and a
    page of the tenant's, the session's marked."""
    attached = await sessions.workspaces(principal, a.workspace)
    page = await listing(sessions.access, principal, a.after, PAGE, None)
    return {
        "primary": attached.primary,
        "attached": [{"uri": w.uri, "target": w.target, "kind": w.kind} for w in attached.attached],
        "tenant": page.tenant,
        "workspaces": [summary_json(w) for w in page.workspaces],
        "next": page.next,
    }


LISTING_OUTPUT = obj(
    {
        "primary": "string",
        "attached": "array",
        "tenant": "string",
        "workspaces": "array",
        "next": ["string", "null"],
    }
)


def listing_text(found: dict[str, Any]) -> str:
    """The tenant's page, one line a workspace: ``* name`` (``*`` this session's primary,
    ``+`` attached)."""
    tenant = found["tenant"]
    primary = found["primary"]
    attached = {a["target"] for a in found["attached"]}
    if not found["workspaces"]:
        return f"No workspaces in tenant {tenant}"
    lines = [f"Workspaces of tenant {tenant} (* this session's primary, + attached):"]
    for w in found["workspaces"]:
        key = f"{tenant}/{w['name']}"
        mark = "*" if key == primary else "+" if key in attached else " "
        state = ["archived"] if w["archived"] else []
        if w["lockHolder"]:
            state.append(f"locked by {w['lockHolder']}")
        if w["trust"] != "full":
            state.append(w["trust"])
        files = f"{w['files']} file{'s' if w['files'] != 1 else ''}"
        extra = f" ({', '.join(state)})" if state else ""
        lines.append(
            f"{mark} {w['name']}: v{w['version']}, {files}, {w['size']} bytes, last "
            f"{w['lastOp']} {w['updatedAt']} by {w['updatedBy'] or 'unknown'}{extra}"
        )
    if found["next"]:
        lines.append(f"More: call again with after={found['next']}")
    return "\n".join(lines)


async def _archive(sessions: Any, principal: Principal, a: Args) -> rp.ArchiveInfo:
    ws = target(sessions.access, principal, a.workspace, "archive")
    done = await ws.archive(a.reason)
    await ws.info()  # the replica has it (min_version): the next list_workspaces shows it
    return done


TOOLS = (
    Tool(
        "archive_workspace",
        "cmd.archive",
        "Archive a workspace of your tenant: it then refuses every change and command (reads "
        "still work) until an operator unarchives it.",
        (Arg("workspace", Name), Arg("reason", Reason, None)),
        lambda a, done: (
            f"Archived {a.workspace}" if done.changed else f"{a.workspace} was archived already"
        ),
        ARCHIVES,
        path=None,
        run=_archive,
    ),
)
"""archive_workspace: on the caller's tenant (``run``)."""
NO_TOOL = {
    "qry.attached": "list_workspaces answers it first, then the tenant's workspaces",
    "cmd.unarchive": "an operator's (quill unarchive): a model must not undo an archive",
    "cmd.purge": "destroys a workspace for good: an operator's (quill purge), never a model's",
}
