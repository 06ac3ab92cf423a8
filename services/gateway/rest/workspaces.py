"""The caller's tenant's workspaces at the gateway: listing, archiving and purging them.

REST (Quill's own routes, beside RFC 0059's file routes):

* ``GET /v1/workspaces?after=&limit=&prefix=``: a page of the tenant's workspaces by name
  (``next``: pass as ``after``);
* ``POST /v1/workspaces/{name}/archive`` (body ``{"reason": ...}``, optional) and
  ``POST /v1/workspaces/{name}/unarchive``;
* ``DELETE /v1/workspaces/{name}?confirm=<tenant>/<name>``: purge.

MCP's tools on them are ``services/gateway/mcp/workspaces.py``'s.

Who may: a principal acts in its own tenant only (another tenant's names are never reached).
A pinned token (``scope = "workspace"``) sees its own workspace in the listing and nothing
else, and may not archive, unarchive or purge (``ACCESS_DENIED``); a ``scope = "tenant"``
token (or, without tokens, the loopback caller) may, but not purge its own workspace (its
sessions' primary) through the gateway.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from services.gateway.access import PAGE, Access, listing, principal_of, summary_json, target
from services.gateway.rest.edge import count_param, json_body

MOST = 1000
"""The most workspaces one page holds (``?limit=``)."""


class Workspaces:
    """``/v1/workspaces``: the REST routes of the module docstring."""

    def __init__(self, access: Access) -> None:
        self.access = access

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
