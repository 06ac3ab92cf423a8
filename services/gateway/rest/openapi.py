"""``GET /openapi.json``: an OpenAPI 3.1 description of the gateway's HTTP endpoints.

Over 400 lines because it is one document, mostly data: the schemas and paths of the file
store, the runs and discovery, written out once so that what the gateway serves and what it
describes can be compared in one place (``tests/gateway/test_openwop_conformance.py``). The
commands' are ``commands.paths``, the shells' ``shells.paths``, the forks' ``workspaces.paths``,
the merge's ``merges.paths``.
"""

from __future__ import annotations

from typing import Any

from services.gateway import VERSION
from services.gateway.rest import commands, merges, shells, workspaces
from services.gateway.rest.approvals import WAIT_MAX_MS
from services.gateway.rest.edge import MAX_BODY_BYTES
from services.gateway.rest.files import LIST_MAX
from services.gateway.rest.runs import SNAPSHOT_FILES


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


APPROVAL_REQUIRED = {
    **_error(
        "approval_required: the workspace is restricted; Quill makes the change once someone "
        "approves it (details.approvalId; Location: /v1/approvals/{approvalId})"
    ),
    "headers": {"Location": {"schema": {"type": "string"}}},
}


ERRORS = {
    "400": _error("invalid_argument: a malformed path, body or version"),
    "401": _error("unauthorized: missing or unknown bearer token"),
    "403": _error("access_denied: the path leaves the workspace"),
    "404": _error(
        "not_found: no such file (or version), and nothing else is said; but for a file a "
        "command left in the workspace's sandbox uncommitted, message says why"
    ),
    "503": _error("unavailable: Quill cannot answer now; retry"),
    "507": _error(
        "storage_full: a disk is full (details.service: log, reader, executor); nothing was "
        "stored; not retriable until an operator frees space (docs/operations.md, Disk full)"
    ),
}
PATH_PARAM = {
    "name": "path",
    "in": "path",
    "required": True,
    "description": "Workspace-relative, normalised file path (slashes allowed), e.g. notes/a.md",
    "schema": {"type": "string"},
}
IF_MATCH = {
    "name": "If-Match",
    "in": "header",
    "required": False,
    "description": 'Only if the file\'s current etag is this one ("v3" or v3; * = exists) or '
    'one of a list ("v2", "v3"); compared strongly: a weak etag (W/"v3") never matches',
    "schema": {"type": "string"},
}
ETAG_HEADER = {"ETag": {"description": 'The etag, quoted ("v3")', "schema": {"type": "string"}}}
RUN_PARAM = {
    "name": "runId",
    "in": "query",
    "required": False,
    "description": "Read the workspace as of this run's start (POST /v1/runs), RFC 0059 §D",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
}
RUN_ID_PATH = {
    "name": "runId",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 128},
}

FAMILY = {
    "type": "object",
    "required": ["supported"],
    "additionalProperties": False,
    "properties": {
        "supported": {"type": "boolean"},
        "versioned": {"type": "boolean"},
        "maxFileBytes": {"type": "integer", "minimum": 1},
        "maxFiles": {"type": "integer", "minimum": 1},
        "maxVersions": {"type": "integer", "minimum": 1},
    },
}
"""openwop's ``workspace`` capability family (capabilities.schema.json)."""

SCHEMAS: dict[str, Any] = {
    "WorkspaceFile": {
        "type": "object",
        "required": ["path", "content", "version", "updatedAt"],
        "additionalProperties": False,
        "properties": {
            "path": {"type": "string"},
            "content": {"type": "string", "description": "UTF-8 file body"},
            "contentType": {"type": "string", "description": "From the file name"},
            "version": {"type": "integer", "minimum": 1, "description": "The file's version"},
            "etag": {"type": "string", "description": "v<version>, for If-Match"},
            "updatedAt": {"type": "string", "format": "date-time"},
        },
    },
    "WorkspaceFileMeta": {
        "description": "A WorkspaceFile without content (the list returns no bodies)",
        "type": "object",
        "required": ["path", "version", "etag", "updatedAt"],
        "additionalProperties": False,
        "properties": {
            "path": {"type": "string"},
            "contentType": {"type": "string"},
            "version": {"type": "integer", "minimum": 1},
            "etag": {"type": "string"},
            "updatedAt": {"type": "string", "format": "date-time"},
        },
    },
    "FileList": {
        "type": "object",
        "required": ["files"],
        "additionalProperties": False,
        "properties": {"files": {"type": "array", "items": _ref("WorkspaceFileMeta")}},
    },
    "RunCreate": {
        "type": "object",
        "required": ["workflowId"],
        "additionalProperties": False,
        "properties": {
            "workflowId": {
                "type": "string",
                "pattern": "^[A-Za-z0-9._-]{1,100}$",
                "description": "Names the run (runId is <workflowId>:<random>); Quill runs no "
                "workflow",
            },
            "tenantId": {"type": "string", "description": "If given, the caller's tenant"},
            "inputs": {"type": "object", "description": "Accepted, not kept"},
            "tags": {"type": "array", "description": "Accepted, not kept"},
            "metadata": {"type": "object", "description": "Accepted, not kept"},
            "configurable": {"type": "object", "description": "Accepted, not kept"},
            "scopeId": {"type": "string", "description": "Accepted, not kept"},
        },
    },
    "RunCreated": {
        "type": "object",
        "required": ["runId", "status", "eventsUrl"],
        "properties": {
            "runId": {"type": "string"},
            "status": {"type": "string", "enum": ["running"]},
            "eventsUrl": {
                "type": "string",
                "format": "uri",
                "description": "Given because the schema requires it; not served (404): a "
                "Quill run emits no run events",
            },
            "statusUrl": {"type": "string", "format": "uri"},
        },
    },
    "RunSnapshot": {
        "type": "object",
        "required": ["runId", "workflowId", "status"],
        "properties": {
            "runId": {"type": "string"},
            "workflowId": {"type": "string"},
            "status": {"type": "string", "enum": ["running", "completed"]},
            "owner": {
                "type": "object",
                "properties": {"tenant": {"type": "string"}, "workspace": {"type": "string"}},
            },
            "startedAt": {"type": "string", "format": "date-time"},
            "workspaceVersion": {
                "type": "integer",
                "description": "The workspace version the run reads (its start)",
            },
            "workspace": {
                "type": "array",
                "items": _ref("WorkspaceFileMeta"),
                "description": f"The files as of the run's start, by path (at most "
                f"{SNAPSHOT_FILES})",
            },
            "workspaceTruncated": {
                "type": "boolean",
                "description": "More files than workspace lists: page them with "
                "GET /v1/host/workspace/files?runId=&limit=",
            },
        },
    },
    "WorkspaceFileWrite": {
        "type": "object",
        "required": ["content"],
        "additionalProperties": False,
        "properties": {
            "content": {"type": "string"},
            "contentType": {"type": "string", "description": "Accepted; not stored"},
        },
    },
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {"type": "string"},
            "message": {"type": "string"},
            "details": {"type": "object"},
        },
    },
    "Discovery": {
        "description": "Capability families at the document root (openwop RFC 0073)",
        "type": "object",
        "required": ["protocolVersion", "supportedEnvelopes", "schemaVersions", "limits"],
        "properties": {
            "protocolVersion": {"type": "string"},
            "supportedEnvelopes": {"type": "array", "items": {"type": "string"}},
            "schemaVersions": {"type": "object"},
            "limits": {
                "type": "object",
                "properties": {
                    "clarificationRounds": {"type": "integer"},
                    "schemaRounds": {"type": "integer"},
                    "envelopesPerTurn": {"type": "integer"},
                    "maxRequestBodyBytes": {"type": "integer", "const": MAX_BODY_BYTES},
                },
            },
            "workspace": FAMILY,
            "capabilities": {
                "description": "Deprecated mirror (RFC 0073) for clients that still read "
                "capabilities.workspace",
                "type": "object",
                "properties": {"workspace": FAMILY},
            },
        },
    },
    "Health": {
        "type": "object",
        "properties": {
            "status": {"type": "string"},
            "service": {"type": "string"},
            "version": {"type": "string"},
        },
    },
}

MCP_POST = {
    "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}},
    "responses": {"200": _json({"type": "object"}, "A JSON-RPC response")},
}


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document."""
    file_ops = {
        "parameters": [PATH_PARAM],
        "get": {
            "summary": "Read one file (as of file version N, or of a run's start)",
            "parameters": [
                {"name": "version", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                RUN_PARAM,
            ],
            "responses": {
                "200": {**_json(_ref("WorkspaceFile"), "The file"), "headers": ETAG_HEADER},
                "422": _error("invalid_encoding: a binary file"),
                **ERRORS,
            },
        },
        "put": {
            "summary": "Create or replace a file atomically",
            "parameters": [IF_MATCH],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("WorkspaceFileWrite")}},
            },
            "responses": {
                "200": {
                    **_json(_ref("WorkspaceFile"), "File created or replaced"),
                    "headers": ETAG_HEADER,
                },
                "409": _error("workspace_conflict (details.currentVersion), or path_conflict"),
                "412": _error("precondition_failed: If-Match has only weak etags (W/...)"),
                "413": _error(
                    "workspace_too_large: over maxFileBytes; payload_too_large: a body over 16 MiB"
                ),
                **ERRORS,
            },
        },
        "delete": {
            "summary": "Delete a file (its history stays)",
            "parameters": [IF_MATCH],
            "responses": {
                "204": {"description": "Deleted"},
                "202": APPROVAL_REQUIRED,
                "409": _error("workspace_conflict"),
                "412": _error("precondition_failed: If-Match has only weak etags (W/...)"),
                **ERRORS,
            },
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Quill gateway",
            "version": VERSION,
            "description": "RFC 0059 workspace files, MCP (/mcp) and WAP (/mcp/wap) over Quill.",
        },
        "components": {
            "schemas": {**SCHEMAS, **commands.SCHEMAS, **shells.SCHEMAS},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/host/workspace/files": {
                "get": {
                    "summary": "List file metadata (no bodies), by path: every file, or with "
                    "limit a page (Link rel=next names the next)",
                    "parameters": [
                        {
                            "name": "prefix",
                            "in": "query",
                            "description": "Only paths starting with this text",
                            "schema": {"type": "string"},
                        },
                        {
                            "name": "limit",
                            "in": "query",
                            "description": "Page: at most this many files (absent: all)",
                            "schema": {"type": "integer", "minimum": 1, "maximum": LIST_MAX},
                        },
                        {
                            "name": "after",
                            "in": "query",
                            "description": "Only the files after this path (as Link gives it)",
                            "schema": {"type": "string"},
                        },
                        RUN_PARAM,
                    ],
                    "responses": {
                        "200": {
                            **_json(_ref("FileList"), "The files"),
                            "headers": {
                                "Link": {
                                    "description": '<...>; rel="next" when limit cut the '
                                    "list: the next page",
                                    "schema": {"type": "string"},
                                }
                            },
                        },
                        **ERRORS,
                    },
                }
            },
            "/v1/host/workspace/files/{path}": file_ops,
            **commands.paths(_json, ERRORS, _error),
            **shells.paths(_json, ERRORS, _error),
            **workspaces.paths(_json, ERRORS, _error),
            **merges.paths(_json, ERRORS, _error, APPROVAL_REQUIRED),
            "/v1/runs": {
                "post": {
                    "summary": "Start a run: reads under it see the workspace as of now",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("RunCreate")}},
                    },
                    "responses": {"201": _json(_ref("RunCreated"), "Started"), **ERRORS},
                }
            },
            "/v1/runs/{runId}": {
                "parameters": [RUN_ID_PATH],
                "get": {
                    "summary": "The run, and the workspace's files as of its start",
                    "responses": {"200": _json(_ref("RunSnapshot"), "The run"), **ERRORS},
                },
            },
            "/v1/runs/{runId}/cancel": {
                "parameters": [RUN_ID_PATH],
                "post": {
                    "summary": "End the run (reads under it stay as of its start)",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "runId": {"type": "string"},
                                    "status": {"type": "string", "enum": ["cancelled"]},
                                },
                            },
                            "Ended",
                        ),
                        **ERRORS,
                    },
                },
            },
            "/v1/approvals/{approvalId}": {
                "parameters": [
                    {
                        "name": "approvalId",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
                    }
                ],
                "get": {
                    "summary": "A change parked for approval (a PUT or DELETE answered 202 "
                    "approval_required, Location: here): pending, approved (with what carrying "
                    "it out gave, once done), denied or expired (qry.approval's ApprovalStatus)",
                    "parameters": [
                        {
                            "name": "wait_ms",
                            "in": "query",
                            "description": "Wait up to this long for it to be done",
                            "schema": {"type": "integer", "minimum": 0, "maximum": WAIT_MAX_MS},
                        }
                    ],
                    "responses": {"200": _json({"type": "object"}, "The approval"), **ERRORS},
                },
            },
            "/.well-known/openwop": {
                "get": {
                    "summary": "Capabilities: the workspace family at the root (and in the "
                    "deprecated capabilities mirror); no token needed",
                    "security": [],
                    "responses": {
                        "200": {
                            **_json(_ref("Discovery"), "Discovery"),
                            "headers": {"Cache-Control": {"schema": {"type": "string"}}},
                        },
                        "503": ERRORS["503"],
                    },
                }
            },
            "/health": {
                "get": {
                    "summary": "Liveness",
                    "security": [],
                    "responses": {"200": _json(_ref("Health"), "Up")},
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "security": [],
                    "responses": {"200": {"description": "Exposition text"}},
                }
            },
            "/mcp": {"post": {"summary": "MCP (streamable HTTP, JSON responses)", **MCP_POST}},
            "/mcp/wap": {"post": {"summary": "MCP with WAP's tools", **MCP_POST}},
        },
    }
