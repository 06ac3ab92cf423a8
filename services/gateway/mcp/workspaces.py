"""MCP at ``/mcp``: the caller's tenant's workspaces, ``list_workspaces`` (the session's
workspaces, then a page of the tenant's, the session's marked: ``sessions.py`` serves it),
``fork_workspace`` (issue 33: the session's workspace, or one it names, forked as a new
workspace of the tenant), ``merge_workspace`` (issue 33: another workspace of the tenant
merged into the session's, or the one it names: conflicts told with their three-way hunks,
``core.merge_words``; a restricted target parks it for approval as any call there) and
``archive_workspace`` (an operator's tool, offered only when the
gateway is told to: ``endpoints.OPERATOR_TOOLS``). Unarchive and purge are not tools: a model
must not undo an operator's archive, nor destroy a workspace. Who may see and change which
workspace is ``access.py``'s (``listing``, ``target``, ``fork``, ``merge_into``: a pinned
token may neither fork nor merge);
REST's routes are ``rest/workspaces.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.types import ToolAnnotations
from pydantic import Field

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from core.merge_words import MODEL, merged_text, refused_text
from quill.client import Workspace
from services.gateway.access import Principal
from services.gateway.mcp.engine import Done, builtins
from services.gateway.mcp.schemas import obj
from services.gateway.mcp.table import ADDS, CHANGES, Arg, Args, Tool, described, workspace_arg
from services.gateway.reach import PAGE, fork, listing, merge_into, summary_json, target

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
From = Annotated[str, Field(alias="from", description="The workspace to merge in, e.g. try-a")]
"""``from`` (a Python keyword: the parameter is ``source``, its name on the wire ``from``)."""
How = described(
    Literal["fail", "ours", "theirs", "markers"],
    "On conflict: fail (commit nothing), ours/theirs (that side wins), markers",
)
DryRun = described(bool, "Only show the changes and conflicts")
STRATEGY_ARG = "strategy="
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
    the caller's own, forked as ``a.name`` (``reach.fork``: a pinned token may not)."""
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


async def _merge(sessions: Any, principal: Principal, ws: Workspace, a: Args) -> Any:
    """``merge_workspace``: ``a["from"]`` merged into the workspace the call reached (the
    session's, or the one ``workspace`` names); a ``MERGE_CONFLICT`` told with its conflicts
    and how to go on (its details, the first 100 conflicts, stay the structured content)."""
    source = a["from"]
    try:
        done, version = await merge_into(principal, ws, source, a.strategy, a.dry_run)
    except QuillError as exc:
        if exc.code != ErrorCode.MERGE_CONFLICT:
            raise
        ours, theirs = f"{ws.tenant}/{ws.name}", f"{ws.tenant}/{source.rpartition('/')[2]}"
        text = refused_text(exc.message, exc.details, ours, theirs, MODEL, STRATEGY_ARG)
        raise QuillError(exc.code, text, exc.details) from None
    return _Merge(done, version)


class _Merge:
    """A merge's reply and the target's version after it (what its text says)."""

    def __init__(self, done: rp.Merged, version: int) -> None:
        self.done, self.version = done, version


def merge_text(a: Args, m: _Merge) -> Done:
    """The merge in words (``core.merge_words``); its structured content, the op's reply."""
    return Done(merged_text(m.done, m.version, MODEL, STRATEGY_ARG), builtins(m.done))


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
        "merge_workspace",
        "cmd.merge",
        "Merge a workspace of your tenant (a fork, its source) into yours: three-way per "
        "file, one change; conflicts shown with their hunks.",
        (
            Arg("source", From),
            Arg("strategy", How, "fail"),
            Arg("dry_run", DryRun, False),
            workspace_arg(),
        ),
        merge_text,
        CHANGES,
        path=None,
        detail=lambda a: f"merge {a['from']} (strategy {a.strategy})",
        session_call=_merge,
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
"""fork_workspace, archive_workspace: on the caller's tenant (``run``); merge_workspace: on
the workspace the call reaches (``session_call``), so a restricted one parks it."""
NO_TOOL = {
    "qry.attached": "list_workspaces answers it first, then the tenant's workspaces",
    "cmd.unarchive": "an operator's (quill unarchive): a model must not undo an archive",
    "cmd.purge": "destroys a workspace for good: an operator's (quill purge), never a model's",
}
