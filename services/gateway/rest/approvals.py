"""REST approvals: ``GET /v1/approvals/{approvalId}`` on the caller's own workspace.

A ``PUT`` or ``DELETE`` on a restricted workspace is answered ``202`` ``approval_required``
with the approval's id and ``Location: /v1/approvals/{id}`` (``edge.error_response``): Quill
carries it out once someone approves it (``infra/approvals.py``), and this endpoint answers
what came of it, ``qry.approval``'s ``ApprovalStatus``: ``pending``, ``approved`` (with
``outcome`` once ``done``), ``denied`` or ``expired``. ``?wait_ms=N`` (at most
``WAIT_MAX_MS``) waits that long for it to be done. An id of another workspace (or tenant) is
``404`` like one that never was.
"""

from __future__ import annotations

import re

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contracts.errors import ErrorCode as E
from contracts.errors import QuillError
from services.gateway.access import Access
from services.gateway.rest.edge import own_workspace

APPROVAL_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
WAIT_MAX_MS = 60_000
"""The longest ``?wait_ms`` (an HTTP request held that long at most)."""


class Approvals:
    """The approval endpoint, over the caller's own workspace."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def get(self, request: Request) -> Response:
        """Raises: QuillError: ``INVALID_ARGUMENT`` for a malformed ``wait_ms``;
        ``FILE_NOT_FOUND`` (404) for an id that is not an approval of this workspace."""
        approval_id: str = request.path_params["approval_id"]
        if not APPROVAL_ID.fullmatch(approval_id):
            raise QuillError(E.FILE_NOT_FOUND, "No such approval")  # nothing said about the id
        asked = request.query_params.get("wait_ms", "0")
        if not (asked.isascii() and asked.isdecimal() and int(asked) <= WAIT_MAX_MS):
            raise QuillError(E.INVALID_ARGUMENT, f"wait_ms must be 0-{WAIT_MAX_MS} (ms)")
        ws = await own_workspace(self.access, request)
        wait_ms = int(asked)
        status = (
            await ws.wait_approval(approval_id, wait_ms / 1000)
            if wait_ms
            else await ws.approval(approval_id)
        )
        return JSONResponse(msgspec.to_builtins(status))
