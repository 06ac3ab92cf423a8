"""REST (openwop RFC 0059 §C): the caller's workspace as a versioned file store.

``GET /v1/host/workspace/files[?prefix=]`` lists the metadata of every file, by path, as the
schema's ``{"files": [...]}`` and nothing else; a client that asks with ``?limit=N`` (and
``&after=PATH``) gets a page, and a ``Link: <...>; rel="next"`` header when more follow.
``GET|PUT|DELETE /v1/host/workspace/files/{path}`` reads (``?version=N``: as of file version
N), writes (``If-Match``; ``200`` whether created or replaced) and deletes one file;
``?runId=`` reads the workspace as of a run's start (``runs.py``).
``GET /.well-known/openwop`` (no token needed) advertises the ``workspace`` family at the
document root (RFC 0073) and, for clients that still read it, in a ``capabilities`` mirror.
A file is the RFC's WorkspaceFile: ``version`` is the file's own version and ``etag`` is
``v<version>``, also sent quoted as the ``ETag`` header. A ``QuillError`` is answered with its
row of the gateway's one table (``services/gateway/errors.py``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from contracts.errors import ErrorCode, QuillError
from contracts.limits import DEFAULT_LIMITS, GATEWAY_WORKSPACES, Limits
from contracts.paths import normalize
from core.lru import LRU
from infra.secret_registry import secrets_from_env
from quill.client import Workspace
from services.gateway.access import Access, Principal
from services.gateway.rest.edge import (
    MAX_BODY_BYTES,
    RUN_ID,
    PreconditionFailed,
    count_param,
    json_body,
    own_workspace,
)
from services.gateway.rest.reading import (
    Snapshot,
    content_type,
    entries,
    listing,
    read_whole,
    version_of,
)

log = logging.getLogger("quill.gateway")

E = ErrorCode


class FilePathConvertor(Convertor[str]):
    """Like Starlette's ``path``, but matching control characters too (``%0a`` included), so
    that ``file_path`` refuses them with a 400 rather than the router with a bare 404."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("filepath", FilePathConvertor())

PUT_FIELDS = {"content", "contentType"}


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


LIST_MAX = 10_000
"""Most files one page of ``GET /files?limit=`` holds; without ``limit``, every file."""
PROTOCOL_VERSION = "1.1"
"""The openwop version whose RFC 0059 surface the gateway serves (discovery's
``protocolVersion``)."""


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


STREAM_CHUNK = 64 * 1024
"""Bytes of a whole listing sent at a time."""


async def whole_listing(files: AsyncIterator[dict[str, Any]]) -> Response:
    """``{"files": [...]}`` with every file, streamed a chunk at a time as the pages come (a
    workspace may hold up to a million files: the gateway never holds them all). The first
    page is fetched before the answer starts, so a failure there is still an error status;
    a failure later cuts the body short (the client sees invalid JSON, never a short list
    that looks whole)."""
    first = await anext(files, None)

    async def body() -> AsyncIterator[bytes]:
        chunk = bytearray(b'{"files":[')
        if first is not None:
            chunk += json.dumps(first, separators=(",", ":")).encode()
            async for file in files:
                chunk += b"," + json.dumps(file, separators=(",", ":")).encode()
                if len(chunk) >= STREAM_CHUNK:
                    yield bytes(chunk)
                    chunk.clear()
        chunk += b"]}"
        yield bytes(chunk)

    return StreamingResponse(body(), media_type="application/json")


class Files:
    """The file routes and discovery, over the caller's own workspace."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self._limits: LRU[str, Limits] = LRU(GATEWAY_WORKSPACES)

    async def limits(self, ws: Workspace) -> Limits:
        """A workspace's limits (fixed when it was created, so asked once while it is among
        the ``GATEWAY_WORKSPACES`` most recently asked)."""
        key = f"{ws.tenant}/{ws.name}"
        limits = self._limits.get(key)
        if limits is None:
            limits = (await ws.info()).limits
            self._limits.put(key, limits)
        return limits

    async def workspace(self, request: Request) -> Workspace:
        return await own_workspace(self.access, request)

    async def run_version(self, ws: Workspace, request: Request) -> int | None:
        """The workspace version ``?runId=`` reads (the run's start, RFC 0059 §D), or None.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` for a malformed id, ``RUN_NOT_FOUND`` for a run
                this workspace never had.
        """
        run = request.query_params.get("runId")
        if run is None:
            return None
        if not RUN_ID.fullmatch(run):
            raise QuillError(E.INVALID_ARGUMENT, "runId must be a run id (A-Z a-z 0-9 . _ : -)")
        return (await ws.run_info(run)).version

    async def list_files(self, request: Request) -> Response:
        ws = await self.workspace(request)
        prefix = request.query_params.get("prefix", "")
        after = request.query_params.get("after")
        after = None if after is None else file_path(after)
        limit = count_param(request, "limit", LIST_MAX)
        version = await self.run_version(ws, request)
        if limit is None:
            return await whole_listing(entries(ws, prefix, after=after, version=version))
        files, more = await listing(ws, prefix, after=after, limit=limit, version=version)
        headers = {}
        if more:  # only with ?limit=: the client asked for pages
            query = {**request.query_params, "after": files[-1]["path"]}
            headers["Link"] = f'<{request.url.path}?{urlencode(query)}>; rel="next"'
        return JSONResponse({"files": files}, headers=headers)

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
        run_version = await self.run_version(ws, request)
        if run_version is not None:
            if version is not None:
                raise QuillError(E.INVALID_ARGUMENT, "Ask for a version or a runId, not both")
            version = run_version
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
        return snapshot.response()  # 200, created or replaced: the only success listed

    async def delete_file(self, request: Request) -> Response:
        path = file_path(request.path_params["path"])
        tags = if_match(request)
        ws = await self.workspace(request)
        if (await ws.stat(path)).kind != "file":
            raise QuillError(E.NOT_A_FILE, f"Not a file: {path}", {"path": path})
        await ws.delete(path, if_match=await precondition(ws, path, tags))
        return Response(status_code=204)

    async def discovery(self, request: Request) -> Response:
        """Anyone may ask (``security: []``). A caller known by its token is told its own
        workspace's limits; anyone else the limits a new workspace gets, and nothing else."""
        principal = request.scope.get("state", {}).get("principal")
        if isinstance(principal, Principal):
            limits = await self.limits(await self.access.workspace(principal))
            cache = "private, max-age=60"
        else:
            limits, cache = DEFAULT_LIMITS, "public, max-age=300"
        block: dict[str, Any] = {
            "supported": True,
            "versioned": True,
            "maxFileBytes": limits.max_file_bytes,
            "maxFiles": limits.max_files,
        }
        if limits.max_versions is not None:  # absent: every version is kept
            block["maxVersions"] = limits.max_versions
        document = {
            "protocolVersion": PROTOCOL_VERSION,
            "supportedEnvelopes": [],  # Quill runs no model: it recognises no envelopes
            "schemaVersions": {},
            "limits": {
                "clarificationRounds": 0,
                "schemaRounds": 0,
                "envelopesPerTurn": 0,
                "maxRequestBodyBytes": MAX_BODY_BYTES,
            },
            "workspace": block,
            "capabilities": {"workspace": block},  # RFC 0073's deprecated mirror, for old readers
        }
        headers = {"Cache-Control": cache, "Vary": "Authorization"}
        return JSONResponse(document, headers=headers)
