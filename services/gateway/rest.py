"""REST (RFC 0059 §C): the caller's workspace as a versioned file store.

``GET /v1/host/workspace/files[?prefix=][&limit=][&after=]`` lists file metadata, by path, a
page at a time; ``GET|PUT|DELETE
/v1/host/workspace/files/{path}`` reads (``?version=N``: as of file version N), writes
(``If-Match``) and deletes one file; ``GET /.well-known/openwop`` advertises the capability.
A file is the RFC's WorkspaceFile: ``version`` is the file's own version and ``etag`` is
``v<version>``, also sent quoted as the ``ETag`` header. ``ERRORS`` is the one table from a
``QuillError`` to an HTTP status and error name.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from contracts.errors import ErrorCode, QuillError
from contracts.limits import MAX_MESSAGE_BYTES, Limits
from contracts.paths import normalize
from infra.secret_registry import secrets_from_env
from quill.client import Workspace
from services.gateway.files import Snapshot, content_type, iso, read_whole, version_of
from services.gateway.principals import Access, principal_of

log = logging.getLogger("quill.gateway")

E = ErrorCode
ERRORS: dict[str, tuple[int, str]] = {
    E.INVALID_ARGUMENT: (400, "invalid_argument"),
    E.ACCESS_DENIED: (403, "access_denied"),
    E.DENIED: (403, "access_denied"),
    E.FILE_NOT_FOUND: (404, "not_found"),
    E.WORKSPACE_NOT_FOUND: (404, "not_found"),
    E.RUN_NOT_FOUND: (404, "not_found"),
    E.NOT_A_FILE: (404, "not_found"),  # a directory: there is no file at that path
    E.CONFLICT: (409, "workspace_conflict"),
    E.VERSION_TRIMMED: (410, "version_trimmed"),
    E.NOT_A_DIRECTORY: (409, "path_conflict"),  # a parent of the path is a file
    E.ALREADY_EXISTS: (409, "path_conflict"),
    E.SIZE_LIMIT_EXCEEDED: (413, "workspace_too_large"),
    E.INVALID_ENCODING: (422, "invalid_encoding"),  # a binary file has no UTF-8 content
    E.LOCKED: (423, "locked"),
    E.WORKSPACE_ARCHIVED: (409, "workspace_archived"),
    E.UNAVAILABLE: (503, "unavailable"),
    E.TIMEOUT: (503, "unavailable"),
}
"""QuillError code → (HTTP status, error name); anything else is 500 ``internal``."""


class FilePathConvertor(Convertor[str]):
    """Like Starlette's ``path``, but matching control characters too (``%0a`` included), so
    that ``file_path`` refuses them with a 400 rather than the router with a bare 404."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("filepath", FilePathConvertor())

MAX_BODY_BYTES = 2 * MAX_MESSAGE_BYTES
"""Largest PUT body read (JSON escapes may double the content); larger is 413 at once."""
PUT_FIELDS = {"content", "contentType"}


def error_response(error: QuillError) -> JSONResponse:
    """The HTTP answer for ``error``. A 404 says only ``not_found``: nothing about anyone else."""
    status, name = ERRORS.get(str(error.code), (500, "internal"))
    body: dict[str, Any] = {"error": name}
    if status != 404 or "uncommitted" in error.details:  # the caller's own sandbox's file
        body["message"] = error.message
    if error.code == E.CONFLICT:
        body["details"] = {"currentVersion": error.details.get("current_file_version")}
    return JSONResponse(body, status_code=status)


def file_path(raw: str) -> str:
    """A REST file path, which must already be in Quill's normal form.

    Raises:
        QuillError: ``ACCESS_DENIED`` for an escape (``../x``, ``/etc/x``), ``INVALID_ARGUMENT``
            for anything not canonical (``a/../b``, ``/workspace/x``, ``./x``), and what
            ``contracts.paths`` refuses everywhere (control or invisible characters, not NFC,
            over-long names).
    """
    path = normalize(raw)
    if not path:
        raise QuillError(E.INVALID_ARGUMENT, "A file path is required")
    if path != raw:
        raise QuillError(
            E.INVALID_ARGUMENT,
            f"Path must be workspace-relative and normalised (no '.', '..', empty segments, "
            f"leading '/' or /workspace prefix; Unicode NFC): use {path!r}",
            {"path": path},
        )
    return path


LIST_DEFAULT, LIST_MAX = 1000, 10_000
"""Files one ``GET /files`` returns by default and at most (``?limit=``); ``next`` pages on."""


def count_param(request: Request, name: str, default: int, most: int) -> int:
    """The query parameter ``name``: an integer from 1 to ``most``, ``default`` if absent.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for anything else.
    """
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdecimal() and len(raw) <= 16) or not 1 <= int(raw) <= most:
        raise QuillError(E.INVALID_ARGUMENT, f"{name} must be an integer from 1 to {most}")
    return int(raw)


class PreconditionFailed(Exception):
    """An ``If-Match`` that can never match (only weak etags): 412 ``precondition_failed``."""


_ETAG = re.compile(r'\s*(W/)?("[^"]*"|[^",\s]+)\s*(?:,|$)')


def if_match(request: Request) -> list[str] | None:
    """The strong etags of ``If-Match`` (``*``, ``"v3"``, bare ``v3``, or a list), unquoted.

    RFC 9110 §13.1.1: If-Match compares strongly, so a weak etag (``W/"v3"``) never matches.

    Raises:
        PreconditionFailed: only weak etags.
        QuillError: ``INVALID_ARGUMENT`` for a malformed header.
    """
    value = request.headers.get("if-match", "").strip()
    if not value:
        return None
    if value == "*":
        return ["*"]
    tags: list[tuple[bool, str]] = []
    at = 0
    while at < len(value):
        match = _ETAG.match(value, at)
        if match is None or match.end() == at:
            raise QuillError(E.INVALID_ARGUMENT, f"Malformed If-Match: {value[:100]!r}")
        tags.append((match.group(1) is not None, match.group(2).strip('"')))
        at = match.end()
    strong = [tag for weak, tag in tags if not weak]
    if not strong:
        raise PreconditionFailed(
            "If-Match compares etags strongly: a weak etag (W/...) never matches"
        )
    return strong


async def precondition(ws: Workspace, path: str, tags: list[str] | None) -> str | None:
    """The ``if_match`` to send for ``tags``: the one etag, or of a list the file's current
    etag if listed (the writer checks it again, atomically), else the first (a conflict)."""
    if tags is None or len(tags) == 1:
        return None if tags is None else tags[0]
    try:
        current = (await ws.stat(path)).etag
    except QuillError as error:
        if error.code != E.FILE_NOT_FOUND:
            raise
        current = None
    return current if current in tags else tags[0]


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


def put_content(body: Any) -> str:
    """The ``content`` of a PUT body ``{"content": "...", "contentType": "..."}``.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for any other shape.
    """
    if not isinstance(body, dict) or not isinstance(body.get("content"), str):
        raise QuillError(E.INVALID_ARGUMENT, 'Body must be {"content": "<UTF-8 text>"}')
    unknown = sorted(set(body) - PUT_FIELDS)
    if unknown:
        raise QuillError(E.INVALID_ARGUMENT, f"Unknown field(s): {', '.join(unknown)}")
    if not isinstance(body.get("contentType", ""), str):
        raise QuillError(E.INVALID_ARGUMENT, "contentType must be a string")
    content: str = body["content"]
    try:
        content.encode("utf-8")
    except UnicodeEncodeError:
        raise QuillError(E.INVALID_ARGUMENT, "content is not valid UTF-8 text") from None
    return content


class Rest:
    """The REST endpoints, over the caller's own workspace."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self._limits: dict[str, Limits] = {}

    async def limits(self, ws: Workspace) -> Limits:
        """A workspace's limits (fixed when it was created, so asked once)."""
        key = f"{ws.tenant}/{ws.name}"
        if key not in self._limits:
            self._limits[key] = (await ws.info()).limits
        return self._limits[key]

    def routes(self) -> list[Route]:
        files = "/v1/host/workspace/files"
        return [
            Route(files, self.guard(self.list_files), methods=["GET"]),
            Route(files + "/{path:filepath}", self.guard(self.get_file), methods=["GET"]),
            Route(files + "/{path:filepath}", self.guard(self.put_file), methods=["PUT"]),
            Route(files + "/{path:filepath}", self.guard(self.delete_file), methods=["DELETE"]),
            Route("/.well-known/openwop", self.guard(self.discovery), methods=["GET"]),
        ]

    @staticmethod
    def guard(handler: Any) -> Any:
        """Answer a ``QuillError`` from ``handler`` with its row of ``ERRORS``."""

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

    async def workspace(self, request: Request) -> Workspace:
        return await self.access.workspace(principal_of(request.scope))

    async def list_files(self, request: Request) -> Response:
        ws = await self.workspace(request)
        prefix = request.query_params.get("prefix", "")
        after = request.query_params.get("after")
        limit = count_param(request, "limit", LIST_DEFAULT, LIST_MAX)
        directory, _, rest = prefix.rpartition("/")
        files: list[dict[str, Any]] = []
        try:
            async for e in ws.list_all(
                directory or ".",
                recursive=True,
                kind="file",
                prefix=rest,
                after=None if after is None else f"f:{file_path(after)}",
            ):
                files.append(
                    {
                        "path": e.path,
                        "contentType": content_type(e.path),
                        "version": e.file_version,
                        "etag": e.etag,
                        "updatedAt": iso(e.modified),
                        "size": e.size,
                    }
                )
                if len(files) > limit:
                    break
        except QuillError as error:
            if error.code in (E.FILE_NOT_FOUND, E.NOT_A_DIRECTORY):
                return JSONResponse({"files": [], "truncated": False, "next": None})
            raise
        more = len(files) > limit
        files = files[:limit]
        return JSONResponse(
            {"files": files, "truncated": more, "next": files[-1]["path"] if more else None}
        )

    async def get_file(self, request: Request) -> Response:
        path = file_path(request.path_params["path"])
        ws = await self.workspace(request)
        asked = request.query_params.get("version")
        version: int | None = None
        if asked is not None:
            if not (asked.isascii() and asked.isdecimal() and len(asked) <= 16) or not (
                1 <= int(asked) <= 2**53
            ):
                raise QuillError(E.INVALID_ARGUMENT, "version must be a file version (1, 2...)")
            version = await version_of(ws, path, int(asked))
        return (await read_whole(ws, path, version)).response()

    async def put_file(self, request: Request) -> Response:
        path = file_path(request.path_params["path"])
        tags = if_match(request)
        content = put_content(await json_body(request))
        ws = await self.workspace(request)
        written = await ws.write(path, content, if_match=await precondition(ws, path, tags))
        stored = secrets_from_env().redact(content)[0]  # as the writer committed it
        snapshot = Snapshot(
            path, stored, content_type(path), written.file_version, written.etag, written.modified
        )
        return snapshot.response(201 if written.created else 200)

    async def delete_file(self, request: Request) -> Response:
        path = file_path(request.path_params["path"])
        tags = if_match(request)
        ws = await self.workspace(request)
        if (await ws.stat(path)).kind != "file":
            raise QuillError(E.NOT_A_FILE, f"Not a file: {path}", {"path": path})
        await ws.delete(path, if_match=await precondition(ws, path, tags))
        return Response(status_code=204)

    async def discovery(self, request: Request) -> Response:
        limits = await self.limits(await self.workspace(request))
        block: dict[str, Any] = {
            "supported": True,
            "versioned": True,
            "maxFileBytes": limits.max_file_bytes,
            "maxFiles": limits.max_files,
        }
        if limits.max_versions is not None:  # absent: every version is kept
            block["maxVersions"] = limits.max_versions
        return JSONResponse({"capabilities": {"workspace": block}})
