"""``GET /openapi.json``: an OpenAPI 3.1 description of the gateway's HTTP endpoints."""

from __future__ import annotations

from typing import Any

from services.gateway import VERSION
from services.gateway.rest import LIST_DEFAULT, LIST_MAX


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


ERRORS = {
    "400": _error("invalid_argument: a malformed path, body or version"),
    "401": _error("unauthorized: missing or unknown bearer token"),
    "403": _error("access_denied: the path leaves the workspace"),
    "404": _error(
        "not_found: no such file (or version), and nothing else is said; but for a file a "
        "command left in the workspace's sandbox uncommitted, message says why"
    ),
    "503": _error("unavailable: Quill cannot answer now; retry"),
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

SCHEMAS: dict[str, Any] = {
    "WorkspaceFile": {
        "type": "object",
        "required": ["path", "content", "version", "updatedAt"],
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
        "type": "object",
        "required": ["path", "version", "etag", "updatedAt", "size"],
        "properties": {
            "path": {"type": "string"},
            "contentType": {"type": "string"},
            "version": {"type": "integer", "minimum": 1},
            "etag": {"type": "string"},
            "updatedAt": {"type": "string", "format": "date-time"},
            "size": {"type": "integer", "minimum": 0},
        },
    },
    "FileList": {
        "type": "object",
        "required": ["files", "truncated"],
        "properties": {
            "files": {"type": "array", "items": _ref("WorkspaceFileMeta")},
            "truncated": {"type": "boolean", "description": "More files follow this page"},
            "next": {
                "type": ["string", "null"],
                "description": "Pass as after for the next page (the last path listed); null "
                "on the last page",
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
        "type": "object",
        "properties": {
            "capabilities": {
                "type": "object",
                "properties": {
                    "workspace": {
                        "type": "object",
                        "required": ["supported"],
                        "properties": {
                            "supported": {"type": "boolean"},
                            "versioned": {"type": "boolean"},
                            "maxFileBytes": {"type": "integer", "minimum": 1},
                            "maxFiles": {"type": "integer", "minimum": 1},
                            "maxVersions": {"type": "integer", "minimum": 1},
                        },
                    }
                },
            }
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
            "summary": "Read one file (optionally as of file version N)",
            "parameters": [
                {"name": "version", "in": "query", "schema": {"type": "integer", "minimum": 1}}
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
                "200": {**_json(_ref("WorkspaceFile"), "Replaced"), "headers": ETAG_HEADER},
                "201": {**_json(_ref("WorkspaceFile"), "Created"), "headers": ETAG_HEADER},
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
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/host/workspace/files": {
                "get": {
                    "summary": "List file metadata (no bodies), by path, a page at a time",
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
                            "description": "Files per page",
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": LIST_MAX,
                                "default": LIST_DEFAULT,
                            },
                        },
                        {
                            "name": "after",
                            "in": "query",
                            "description": "The previous page's next: list the files after it",
                            "schema": {"type": "string"},
                        },
                    ],
                    "responses": {"200": _json(_ref("FileList"), "The files"), **ERRORS},
                }
            },
            "/v1/host/workspace/files/{path}": file_ops,
            "/.well-known/openwop": {
                "get": {
                    "summary": "Capabilities (capabilities.workspace)",
                    "responses": {"200": _json(_ref("Discovery"), "Discovery"), **ERRORS},
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
