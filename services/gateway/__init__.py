"""The gateway: Quill's HTTP front door (MCP at ``/mcp``, WAP at ``/mcp/wap``, REST at ``/v1``,
the operator's console at ``/ui``).

A stateless client of the bus: every operation goes through the SDK (``quill.client``). Its
rooms, each a package or module the app includes (import-linter keeps them apart: none imports
another, and each imports only ``access`` and ``errors`` below it)::

    server.py   the process: connect, listen, serve, ping, workers (``start_gateway``)
    app.py      wiring only: the rooms' routes under one app and its middleware
    rest/       REST: files, runs, approvals, workspaces, discovery, OpenAPI
    mcp/        MCP and WAP: tool tables served by one engine
    console/    the operator's console, mounted at ``/ui``
    health.py   ``GET /health`` and what it tells of the other services
    access.py   who is calling and what they reach: tokens, principals, cookies, CSRF
    errors.py   one table from an error code to each door's status, name, WAP code and text

The HTTP plumbing every request goes through (bounds, in-flight, streams, request ids,
redaction, metrics, workers) is ``infra/http/``. See ``docs/gateway.md``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("quill")
    """The gateway's version: the package's (``/health``, MCP ``serverInfo``, OpenAPI)."""
except PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0"
