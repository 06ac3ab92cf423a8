"""``POST /v1/workspaces/{name}/merge``: another workspace of the tenant merged into ``{name}``
(issue 33), the REST door of the op every door uses (``reach.merge``: both names reached, so
a workspace-scoped token never merges; a merge stays within its tenant).

Body ``{"from": "<workspace>", "strategy": "fail"|"ours"|"theirs"|"markers", "dryRun":
bool}`` (strategy default ``fail``, dryRun default false), nothing else. Answers: 200 with
the merge (or the dry run: ``committed`` false) in camelCase, the target's ``version`` after
it; 409 ``merge_conflict`` with ``details.conflicts`` (the first 100, each with its
three-way hunks: bounded by the writer) and ``details.conflictsTotal``, nothing committed
(``edge.error_response``); 409 ``no_merge_base``; 202 ``approval_required`` for a restricted
target (``Location: /v1/approvals/{id}``), as every parked REST call.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from services.gateway.access import Access, principal_of
from services.gateway.reach import STRATEGIES, merge
from services.gateway.rest.edge import camel, json_body
from services.gateway.rest.schema import BOOL, INT, STR, WORKSPACE_NAME, arr, body, obj, path_param

MERGE_BODY = (
    'The body is {"from": "<workspace>", "strategy": "fail"|"ours"|"theirs"|"markers", '
    '"dryRun": true|false} (strategy and dryRun optional)'
)


class Merges:
    """``POST /v1/workspaces/{name}/merge``."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def merge(self, request: Request) -> Response:
        body = await json_body(request)
        if not isinstance(body, dict) or set(body) - {"from", "strategy", "dryRun"}:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, MERGE_BODY)
        source = body.get("from")
        strategy = body.get("strategy", "fail")
        dry_run = body.get("dryRun", False)
        if not isinstance(source, str) or strategy not in STRATEGIES or type(dry_run) is not bool:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, MERGE_BODY)
        principal = principal_of(request.scope)
        target = request.path_params["name"]
        done, version = await merge(self.access, principal, target, source, strategy, dry_run)
        return JSONResponse(merged_json(done, version))


def merged_json(m: rp.Merged, version: int) -> dict[str, Any]:
    """A merge as REST answers it: camelCase, names without their tenant."""
    fields = camel(m)
    del fields["workspace"], fields["source"]
    return {
        "name": m.workspace.split("/", 1)[1],
        "from": m.source.split("/", 1)[1],
        "version": version,
        **fields,
    }


def paths(json: Any, errors: dict[str, Any], error: Any, parked: Any) -> dict[str, Any]:
    """The OpenAPI path of the merge (``json(schema, description)``, ``errors``,
    ``error(description)`` and the 202 of a parked call, as ``openapi.document`` writes
    them)."""
    name = path_param("name")
    ints = dict.fromkeys
    hunk = obj(
        **ints(("baseLine", "oursLine", "theirsLine"), INT),
        **dict.fromkeys(("base", "ours", "theirs"), STR),
        cut=BOOL,
    )
    entry = {"type": ["object", "null"]}
    conflicts = arr(
        obj(
            path=STR, kind=STR, base=entry, ours=entry, theirs=entry, hunks=arr(hunk),
            hunksTotal=INT, paths={"type": "array"}, pathsTotal=INT, resolution=STR,
        )
    )  # fmt: skip
    change = obj(
        path=STR,
        kind={"enum": ["put", "mkdir", "delete"]},
        source={"enum": ["ours", "theirs", "merged"]},
        size=INT,
    )
    merged = obj(
        name=STR, **{"from": STR}, version=INT,
        **ints(("fromVersion", "baseVersion", "fromBase"), INT),
        strategy=STR, dryRun=BOOL, committed=BOOL, changes=arr(change), changesTotal=INT,
        conflicts=conflicts, conflictsTotal=INT, marked={"type": "array"},
        merged={"type": "array"}, refused={"type": ["string", "null"]},
    )  # fmt: skip
    refused = obj(
        required=("error",),
        error={"enum": ["merge_conflict", "no_merge_base"]},
        message=STR,
        details=obj(
            conflicts=conflicts, **ints(("conflictsTotal", "baseVersion", "fromVersion"), INT)
        ),
    )
    request = obj(
        required=("from",),
        closed=True,
        **{"from": WORKSPACE_NAME},
        strategy={"enum": list(STRATEGIES), "default": "fail"},
        dryRun={"type": "boolean", "default": False},
    )
    return {
        "/v1/workspaces/{name}/merge": {
            "parameters": [name],
            "post": {
                "summary": "Merge another workspace of the tenant (a fork, its source, a "
                "sibling fork) into this one: three-way per path against the merge base, "
                "one change; or a dry run (nothing committed)",
                "requestBody": body(request),
                "responses": {
                    "200": json(merged, "Merged, or what it would do (committed: false)"),
                    "202": parked,
                    **errors,
                    "400": error("invalid_argument: a bad body or name, another tenant's"),
                    "403": error("access_denied: a workspace-scoped token does not merge"),
                    "404": error("not_found: no such workspace to merge"),
                    "409": json(
                        refused,
                        "merge_conflict: conflicts the strategy leaves, nothing committed "
                        "(details.conflicts: the first 100, each with its three-way hunks; "
                        "details.conflictsTotal); no_merge_base: no shared history (no details)",
                    ),
                },
            },
        },
    }
