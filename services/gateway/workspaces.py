"""The caller's tenant's workspaces at the gateway: listing, archiving and purging them.

REST (Quill's own routes, beside RFC 0059's file routes):

* ``GET /v1/workspaces?after=&limit=&prefix=``: a page of the tenant's workspaces by name
  (``next``: pass as ``after``);
* ``POST /v1/workspaces/{name}/archive`` (body ``{"reason": ...}``, optional) and
  ``POST /v1/workspaces/{name}/unarchive``;
* ``DELETE /v1/workspaces/{name}?confirm=<tenant>/<name>``: purge.

MCP (``/mcp``): ``list_workspaces`` (``services/gateway/mcp_sessions.py``: the session's
workspaces, then the tenant's, the session's marked) and ``archive_workspace``. Unarchive
and purge are not tools: a model must not undo an operator's archive, nor destroy a
workspace.

Who may: a principal acts in its own tenant only (another tenant's names are never reached).
A pinned token (``scope = "workspace"``) sees its own workspace in the listing and nothing
else, and may not archive, unarchive or purge (``ACCESS_DENIED``); a ``scope = "tenant"``
token (or, without tokens, the loopback caller) may, but not purge its own workspace (its
sessions' primary) through the gateway.
"""

from __future__ import annotations

from typing import Any

from mcp.types import ToolAnnotations
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from services.gateway.access import Access, Principal, listing, principal_of, summary_json, target
from services.gateway.optable import Arg, Args, Tool, described
from services.gateway.rest import Rest, count_param, json_body
from services.gateway.schemas import obj

PAGE, MOST = 100, 1000


class WorkspacesRest:
    """``/v1/workspaces``: the REST routes of the module docstring."""

    def __init__(self, access: Access) -> None:
        self.access = access

    def routes(self) -> list[Route]:
        base = "/v1/workspaces"
        guard = Rest.guard
        return [
            Route(base, guard(self.list), methods=["GET"]),
            Route(base + "/{name}/archive", guard(self.archive), methods=["POST"]),
            Route(base + "/{name}/unarchive", guard(self.unarchive), methods=["POST"]),
            Route(base + "/{name}", guard(self.purge), methods=["DELETE"]),
        ]

    async def list(self, request: Request) -> Response:
        params = request.query_params
        page = await listing(
            self.access,
            principal_of(request.scope),
            params.get("after"),
            count_param(request, "limit", MOST) or PAGE,
            params.get("prefix"),
        )
        body = {
            "tenant": page.tenant,
            "workspaces": [summary_json(w) for w in page.workspaces],
            "next": page.next,
        }
        return JSONResponse(body)

    async def archive(self, request: Request) -> Response:
        ws = target(self.access, principal_of(request.scope), request.path_params["name"],
                    "archive")  # fmt: skip
        body = await json_body(request) if await request.body() else {}
        reason = body.get("reason") if isinstance(body, dict) else None
        if not (reason is None or isinstance(reason, str)) or set(body) - {"reason"}:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, 'The body is {"reason": "..."} or empty')
        done = await ws.archive(reason)
        await ws.info()  # the replica has it (min_version): the next listing shows it
        return JSONResponse({"archived": done.archived, "changed": done.changed})

    async def unarchive(self, request: Request) -> Response:
        ws = target(self.access, principal_of(request.scope), request.path_params["name"],
                    "unarchive")  # fmt: skip
        done = await ws.unarchive()
        await ws.info()  # the replica has it (min_version): the next listing shows it
        return JSONResponse({"archived": done.archived, "changed": done.changed})

    async def purge(self, request: Request) -> Response:
        principal = principal_of(request.scope)
        name = request.path_params["name"]
        ws = target(self.access, principal, name, "purge")
        if name == principal.workspace:
            raise QuillError(
                ErrorCode.ACCESS_DENIED,
                f"{principal.name} is this token's own workspace: purge it with another "
                "token or `quill purge`",
            )
        confirm = request.query_params.get("confirm", "")
        done = await ws.call(rq.PurgeWorkspace(confirm=confirm))
        self.access.forget(f"{principal.tenant}/{name}")
        return JSONResponse({"purged": done.workspace, "version": done.version})


# ---------------------------------------------------------------- MCP

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
