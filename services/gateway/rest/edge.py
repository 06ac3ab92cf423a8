"""What every REST route shares: a ``QuillError`` answered with its row of the gateway's one
error table (``services/gateway/errors.py``: ``error_response``, ``guard``), the caller's own
workspace, and a body or a count read within bounds.

An error is JSON ``{"error": name, "message": ...}`` with the row's status; a 404 says nothing
more (not even the message: nothing about anyone else), but for a file the caller's own sandbox
left uncommitted. A busy answer carries ``Retry-After``; an ``APPROVAL_REQUIRED`` is 202 with
the approval's ``Location``; a ``MERGE_CONFLICT`` carries its conflicts (``details``, camelCase).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from contracts.errors import ErrorCode, QuillError, retry_after_ms
from contracts.limits import MAX_MESSAGE_BYTES
from quill.client import Workspace
from services.gateway import errors
from services.gateway.access import Access, principal_of

log = logging.getLogger("quill.gateway")

E = ErrorCode
Handler = Callable[[Request], Awaitable[Response]]


MAX_BODY_BYTES = 2 * MAX_MESSAGE_BYTES
"""Largest PUT body read (JSON escapes may double the content); larger is 413 at once."""


def error_response(error: QuillError) -> JSONResponse:
    """The HTTP answer for ``error``. A 404 says only ``not_found``: nothing about anyone else."""
    row = errors.row(error.code)
    status, name = row.status, row.name
    body: dict[str, Any] = {"error": name}
    if status != 404 or "uncommitted" in error.details:  # the caller's own sandbox's file
        body["message"] = error.message
    if error.code == E.CONFLICT:
        body["details"] = {"currentVersion": error.details.get("current_file_version")}
    headers: dict[str, str] = {}
    if error.code == E.APPROVAL_REQUIRED:  # accepted: Quill makes it once approved
        approval_id = str(error.details.get("approval_id", ""))
        body["details"] = {"approvalId": approval_id}
        headers["Location"] = f"/v1/approvals/{approval_id}"
    if error.code == E.MERGE_CONFLICT:  # the conflicts (the writer's first 100) and how many
        body["details"] = camel(error.details)
    if error.code == E.DENIED and error.details.get("reason"):
        body["details"] = {"reason": error.details["reason"]}
    if (hint := retry_after_ms(error)) is not None:  # busy: when to come back
        body["details"] = error.details
        headers["Retry-After"] = str(math.ceil(hint / 1000))
    return JSONResponse(body, status_code=status, headers=headers or None)


def camel(value: Any) -> Any:
    """``value`` (msgspec structs, dicts, lists) as plain JSON with camelCase keys (REST's)."""
    if isinstance(value, dict):
        return {_camel(str(k)): camel(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [camel(item) for item in value]
    if isinstance(value, msgspec.Struct):
        return camel(msgspec.to_builtins(value))
    return value


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word.capitalize() for word in rest)


RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""A Quill run id (``contracts.requests.RunId``)."""


def count_param(
    request: Request, name: str, most: int, *, lowest: int = 1, unit: str = ""
) -> int | None:
    """The query parameter ``name``: an integer from ``lowest`` to ``most``, None if absent
    (``unit`` follows the range in the error, as `` (ms)``).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for anything else.
    """
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdecimal() and len(raw) <= 16) or not lowest <= int(raw) <= most:
        raise QuillError(
            E.INVALID_ARGUMENT, f"{name} must be an integer from {lowest} to {most}{unit}"
        )
    return int(raw)


class PreconditionFailed(Exception):
    """An ``If-Match`` that can never match (only weak etags): 412 ``precondition_failed``."""


async def json_body(request: Request) -> Any:
    """The request's JSON body, read up to ``MAX_BODY_BYTES``.

    Raises:
        QuillError: ``SIZE_LIMIT_EXCEEDED`` past the cap, ``INVALID_ARGUMENT`` for bad JSON.
    """
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise QuillError(E.SIZE_LIMIT_EXCEEDED, f"Body over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise QuillError(E.INVALID_ARGUMENT, f"Body is not JSON: {exc}") from None
    except RecursionError:
        raise QuillError(E.INVALID_ARGUMENT, "Body is JSON nested too deeply") from None


def guard(handler: Handler) -> Handler:
    """``handler``, a ``QuillError`` it raises answered with its row of the gateway's one error
    table (``error_response``), a precondition that can never match with 412, and anything
    else with 500 ``internal`` (logged)."""

    async def endpoint(request: Request) -> Response:
        try:
            response: Response = await handler(request)
        except QuillError as error:
            return error_response(error)
        except PreconditionFailed as failed:
            body = {"error": "precondition_failed", "message": str(failed)}
            return JSONResponse(body, status_code=412)
        except ClientDisconnect:
            log.info("%s %s: the client went away", request.method, request.url.path)
            return Response(status_code=400)  # nobody reads it
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(QuillError(E.INTERNAL, "Internal error (logged)"))
        return response

    return endpoint


async def own_workspace(access: Access, request: Request) -> Workspace:
    """The caller's own workspace (its token's)."""
    return await access.workspace(principal_of(request.scope))
