"""The caller's tenant's workspaces at the gateway: listing, archiving and purging them.

REST (Quill's own routes, beside RFC 0059's file routes):

* ``GET /v1/workspaces?after=&limit=&prefix=``: a page of the tenant's workspaces by name
  (``next``: pass as ``after``);
* ``POST /v1/workspaces/{name}/archive`` (body ``{"reason": ...}``, optional) and
  ``POST /v1/workspaces/{name}/unarchive``;
* ``DELETE /v1/workspaces/{name}?confirm=<tenant>/<name>``: purge;
* ``POST /v1/workspaces/{name}/fork`` (body ``{"name": "<new>", "version": N}``, version
  optional: the latest): 201 ``{"name", "from", "version", "trust"}``, the fork (issue 33);
* ``GET /v1/workspaces/{name}/forks?limit=``: its forks, each with the version it was forked
  at and how many versions each side has made since (``ahead``, ``behind``).

MCP's tools on them are ``services/gateway/mcp/workspaces.py``'s.

Who may: a principal acts in its own tenant only (another tenant's names are never reached).
A pinned token (``scope = "workspace"``) sees its own workspace in the listing and nothing
else, and may not archive, unarchive or purge (``ACCESS_DENIED``); a ``scope = "tenant"``
token (or, without tokens, the loopback caller) may, but not purge its own workspace (its
sessions' primary) through the gateway. Forking needs both names reached (``reach.fork``):
a pinned token neither forks nor lists forks (``ACCESS_DENIED``); a fork stays in the tenant.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from services.gateway.access import Access, principal_of
from services.gateway.reach import PAGE, fork, forks, listing, summary_json, target
from services.gateway.rest.edge import count_param, json_body
from services.gateway.rest.schema import BOOL, INT, STR, WORKSPACE_NAME, arr, body, obj, path_param

MOST = 1000
"""The most workspaces one page holds (``?limit=``), and the most forks a listing holds."""
FORK_BODY = 'The body is {"name": "<new workspace>", "version": N} (version optional)'
VERSION_MAX = 2**53
"""The largest version (``contracts.requests.Version``)."""


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

    async def fork(self, request: Request) -> Response:
        body = await json_body(request)
        if not isinstance(body, dict) or set(body) - {"name", "version"}:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, FORK_BODY)
        name, version = body.get("name"), body.get("version")
        if not isinstance(name, str) or not (
            version is None or (type(version) is int and 1 <= version <= VERSION_MAX)
        ):
            raise QuillError(ErrorCode.INVALID_ARGUMENT, FORK_BODY)
        principal = principal_of(request.scope)
        done = await fork(self.access, principal, request.path_params["name"], name, version)
        return JSONResponse(forked_json(done), status_code=201)

    async def forks(self, request: Request) -> Response:
        limit = count_param(request, "limit", MOST) or PAGE
        found = await forks(self.access, principal_of(request.scope),
                            request.path_params["name"], limit)  # fmt: skip
        return JSONResponse(
            {
                "name": found.workspace.split("/", 1)[1],
                "forks": [fork_json(f) for f in found.forks],
                "truncated": found.truncated,
            }
        )


def fork_json(f: rp.ForkSummary) -> dict[str, Any]:
    """A fork of a listing as REST answers it."""
    return {"name": f.workspace, "version": f.version, "ahead": f.ahead, "behind": f.behind}


def forked_json(done: rp.Forked) -> dict[str, Any]:
    """A fork as REST answers it (``rp.Forked``, names without their tenant)."""
    return {
        "name": done.workspace.split("/", 1)[1],
        "from": done.source.split("/", 1)[1],
        "version": done.version,
        "trust": done.trust,
    }


def paths(json: Any, errors: dict[str, Any], error: Any) -> dict[str, Any]:
    """The OpenAPI paths of the forks (``json(schema, description)``, ``errors``, and
    ``error(description)`` as ``openapi.document`` writes them)."""
    name = path_param("name")
    denied = error("access_denied: a workspace-scoped token neither forks nor lists forks")
    forked = obj(name=STR, **{"from": STR}, version=INT, trust=STR)
    listed = obj(
        name=STR,
        forks=arr(obj(name=STR, version=INT, ahead=INT, behind=INT)),
        truncated=BOOL,
    )
    request = obj(
        required=("name",),
        closed=True,
        name=WORKSPACE_NAME,
        version={"type": "integer", "minimum": 1},
    )
    return {
        "/v1/workspaces/{name}/fork": {
            "parameters": [name],
            "post": {
                "summary": "Fork the workspace at a version (default: its latest) as a new "
                "workspace of the tenant: nothing is copied; its history up to there is the "
                "source's",
                "requestBody": body(request),
                "responses": {
                    "201": json(forked, "Forked: the fork's next change is version + 1"),
                    **errors,
                    "400": error("invalid_argument: a bad name or body, no such version"),
                    "403": denied,
                    "404": error("not_found: no such workspace to fork"),
                    "409": error("path_conflict: a workspace of that name exists (or is this)"),
                    "410": error("version_trimmed: the version was compacted away"),
                },
            },
        },
        "/v1/workspaces/{name}/forks": {
            "parameters": [name],
            "get": {
                "summary": "The workspace's forks: the version each was forked at, and the "
                "versions each side has made since (ahead: the fork, behind: this one)",
                "parameters": [
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": MOST},
                    }
                ],
                "responses": {"200": json(listed, "The forks"), **errors, "403": denied},
            },
        },
    }
