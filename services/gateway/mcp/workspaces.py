"""MCP at ``/mcp``: the caller's tenant's workspaces, ``list_workspaces`` (the session's
workspaces, then a page of the tenant's, the session's marked: ``sessions.py`` serves it),
``fork_workspace`` (issue 33: the session's workspace, or one it names, forked as a new
workspace of the tenant) and ``archive_workspace`` (an operator's tool, offered only when the
gateway is told to: ``endpoints.OPERATOR_TOOLS``). Unarchive and purge are not tools: a model
must not undo an operator's archive, nor destroy a workspace. Who may see and change which
workspace is ``access.py``'s (``listing``, ``target``, ``fork``: a pinned token may not fork);
REST's routes are ``rest/workspaces.py``.
"""

from __future__ import annotations

from typing import Any

from mcp.types import ToolAnnotations

from contracts import replies as rp
from services.gateway.access import PAGE, Principal, fork, listing, summary_json, target
from services.gateway.mcp.schemas import obj
from services.gateway.mcp.table import ADDS, Arg, Args, Tool, described, workspace_arg

After = described(str | None, "The previous page's next: list the workspaces after it")
Name = described(str, "A workspace of your tenant, e.g. notes")
Session = described(
    str | None,
    "Optional: mark the workspaces of another session of your tenant, by its primary "
    "workspace's id. Omit for your own session.",
)
Reason = described(str | None, "Why (recorded in its log)")
NewName = described(str, "The fork's id, e.g. try-a")
At = described(int | None, "Default: the latest")
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


async def _fork(sessions: Any, principal: Principal, a: Args) -> rp.Forked:
    """``fork_workspace``: the workspace named (an attached one's URI: where it points), or
    the caller's own, forked as ``a.name`` (``access.fork``: a pinned token may not)."""
    source = a.workspace
    if source and ":" in source and not principal.pinned:
        ws = await sessions.target(principal, "cmd.fork", source)
        source = ws.name if ws.tenant == principal.tenant else f"{ws.tenant}/{ws.name}"
    return await fork(sessions.access, principal, source, a.name, a.version)


def forked_text(a: Args, done: rp.Forked) -> str:
    """``Forked acme/notes at version 12 as acme/try-a``, and how to work in the fork."""
    name = done.workspace.split("/", 1)[1]
    return (
        f"Forked {done.source} at version {done.version} as {done.workspace} (its next change "
        f'is version {done.version + 1}): pass workspace="{name}" to work in it'
    )


TOOLS = (
    Tool(
        "fork_workspace",
        "cmd.fork",
        "Fork a workspace at a version as a new workspace of your tenant: nothing is copied, "
        "the fork's history up to there is the source's and it goes on alone.",
        (Arg("name", NewName), Arg("version", At, None), workspace_arg()),
        forked_text,
        ADDS,
        path=None,
        run=_fork,
    ),
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
"""fork_workspace, archive_workspace: on the caller's tenant (``run``)."""
NO_TOOL = {
    "qry.attached": "list_workspaces answers it first, then the tenant's workspaces",
    "cmd.unarchive": "an operator's (quill unarchive): a model must not undo an archive",
    "cmd.purge": "destroys a workspace for good: an operator's (quill purge), never a model's",
}
