"""REST runs (openwop ``POST /v1/runs``; RFC 0059 §D): a run reads the workspace as of its
start, whatever is written meanwhile.

Quill executes no workflow: an openwop run here is a Quill run (``RunStart``/``RunEnd``, the
bus's ``Ws-Run``) of the caller's workspace, a name under which reads are answered as of the
version the run started at. ``POST /v1/runs`` ``{"workflowId": ...}`` starts one (``201``,
``runId`` = ``<workflowId>:<random>``); ``GET /v1/runs/{runId}`` is its RunSnapshot, whose
``workspace`` lists the files as of its start; ``GET /v1/host/workspace/files[/{path}]?runId=``
reads under it (``files.py``); ``POST /v1/runs/{runId}/cancel`` ends it. A run
id of another workspace is ``404`` like one that never was.
"""

from __future__ import annotations

import re
import secrets
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contracts.errors import ErrorCode as E
from contracts.errors import QuillError
from services.gateway.access import Access
from services.gateway.rest.edge import RUN_ID, json_body, own_workspace
from services.gateway.rest.reading import iso, listing

WORKFLOW_ID = re.compile(r"[A-Za-z0-9._-]{1,100}")
"""A workflowId Quill takes: it becomes the front of the run id."""
RUN_FIELDS = frozenset(
    {"workflowId", "inputs", "tags", "metadata", "configurable", "tenantId", "scopeId"}
)
"""The fields of a ``POST /v1/runs`` body Quill accepts; all but ``workflowId`` and
``tenantId`` (which must be the caller's) are accepted and not kept: Quill executes nothing."""
SNAPSHOT_FILES = 1000
"""Most files a RunSnapshot's ``workspace`` lists (then ``workspaceTruncated``: page the rest
with ``GET /v1/host/workspace/files?runId=...&limit=``)."""


def run_param(request: Request) -> str:
    run: str = request.path_params["run_id"]
    if not RUN_ID.fullmatch(run):
        raise QuillError(E.RUN_NOT_FOUND, "No such run")  # nothing said about the id
    return run


def workflow_of(run: str) -> str:
    """The workflowId a run was started for: its id up to the last ``:`` (a run started
    through the SDK or CLI, whose id has none, is its own workflow)."""
    head, colon, _ = run.rpartition(":")
    return head if colon and head else run


class Runs:
    """The run endpoints, over the caller's own workspace."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def create(self, request: Request) -> Response:
        body = await json_body(request)
        if not isinstance(body, dict):
            raise QuillError(E.INVALID_ARGUMENT, 'Body must be {"workflowId": "..."}')
        unknown = sorted(set(body) - RUN_FIELDS)
        if unknown:
            raise QuillError(E.INVALID_ARGUMENT, f"Not supported: {', '.join(unknown)}")
        workflow = body.get("workflowId")
        if not isinstance(workflow, str) or not WORKFLOW_ID.fullmatch(workflow):
            raise QuillError(
                E.INVALID_ARGUMENT, "workflowId must be 1-100 of A-Z a-z 0-9 . _ - (names the run)"
            )
        ws = await own_workspace(self.access, request)
        if "tenantId" in body and body["tenantId"] != ws.tenant:
            raise QuillError(E.ACCESS_DENIED, "tenantId is not the caller's tenant")
        info = await ws.start_run(f"{workflow}:{secrets.token_hex(8)}")
        status_url = f"{str(request.base_url).rstrip('/')}/v1/runs/{quote(info.run, safe=':')}"
        reply = {
            "runId": info.run,
            "status": "running",
            "eventsUrl": f"{status_url}/events",
            "statusUrl": status_url,
        }
        return JSONResponse(reply, status_code=201, headers={"Location": status_url})

    async def snapshot(self, request: Request) -> Response:
        run = run_param(request)
        ws = await own_workspace(self.access, request)
        info = await ws.run_info(run)
        files, more = await listing(ws, limit=SNAPSHOT_FILES, version=info.version)
        body: dict[str, Any] = {
            "runId": info.run,
            "workflowId": workflow_of(info.run),
            "status": "running" if info.ended_version is None else "completed",
            "owner": {"tenant": ws.tenant, "workspace": ws.name},
            "startedAt": iso(info.started),
            "workspaceVersion": info.version,
            "workspace": files,
        }
        if more:
            body["workspaceTruncated"] = True
        return JSONResponse(body)

    async def cancel(self, request: Request) -> Response:
        run = run_param(request)
        ws = await own_workspace(self.access, request)
        await ws.run_info(run)  # RUN_NOT_FOUND (404) first: ending an unknown run is a 400
        await ws.end_run(run)
        return JSONResponse({"runId": run, "status": "cancelled"})
