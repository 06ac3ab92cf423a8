"""The gateway's app: wiring only. The routes of each room, included by one Starlette app under
the middleware every request goes through::

    /health  /metrics                         public (health.py; infra/http/metrics.py)
    /openapi.json                             public (rest/openapi.py)
    /mcp                                      MCP, the workspace tool's tools and Quill's (mcp/)
    /mcp/wap                                  MCP, WAP's camelCase tools (mcp/)
    /v1/host/workspace/files[/{path}]         REST (RFC 0059 §C; rest/)
    /v1/runs[/{runId}[/cancel]]               REST runs (RFC 0059 §D; rest/)
    /v1/approvals/{id}  /v1/workspaces[/...]  REST, Quill's own (rest/)
    /.well-known/openwop                      discovery (no token needed; rest/)
    /ui/                                      the operator's console (console/, docs/console.md)

Middleware, outermost first (``infra/http/`` but the console's gate and ``access.py``'s):
``HttpMetrics`` (counts and times every request), ``Redaction`` (no registered secret in any
response's headers or body), ``RequestIds`` (``X-Request-Id``), ``Inflight`` (at most
``max_inflight`` requests served at once, busy past it, and server-sent event streams counted
per principal instead: ``inflight.py``, ``streams.py``), the console's gate (``/ui``),
``PrincipalMiddleware`` (who is calling; 401 otherwise), then ``BodyBounds`` (each body read
whole before the app runs: at most ``MAX_BODY_BYTES``, within ``body_timeout``). Every error a
room answers goes through the one table of ``errors.py``. The process around the app (connect,
listen, serve, workers) is ``server.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from contracts.limits import GATEWAY_MAX_INFLIGHT, GATEWAY_STREAMS_PER_PRINCIPAL
from infra.http.bounds import BODY_TIMEOUT_S, BodyBounds
from infra.http.inflight import Inflight, Slots
from infra.http.metrics import HttpMetrics, metrics_endpoint
from infra.http.redaction import Redaction
from infra.http.requestids import RequestIds
from infra.http.streams import Streams
from quill.client import Quill
from services.gateway.access import Access, PrincipalMiddleware, Tokens
from services.gateway.console import Console
from services.gateway.health import Fleet, Health
from services.gateway.mcp.endpoints import Endpoints
from services.gateway.rest import router as rest
from services.gateway.rest.edge import MAX_BODY_BYTES


def build_app(
    quill: Quill,
    access: Access,
    tokens: Tokens | None,
    host: str,
    fleet: Fleet | None = None,
    body_timeout: float = BODY_TIMEOUT_S,
    max_inflight: int = GATEWAY_MAX_INFLIGHT,
    metrics: Any = metrics_endpoint,
    max_streams: int = GATEWAY_STREAMS_PER_PRINCIPAL,
    operator_tools: tuple[str, ...] = (),
) -> Starlette:
    """The gateway's ASGI app over ``access`` (the MCP session managers run in its lifespan);
    ``fleet``: what ``/health`` tells of the executors; ``body_timeout``: seconds a body has
    to arrive; ``max_inflight``: requests served at once (busy past it); ``metrics``: what
    answers ``GET /metrics`` (this process's registry); ``max_streams``: streams open at once
    per principal (``429`` past it); ``operator_tools``: the operators' MCP tools offered too."""
    slots = Slots(max_inflight, Streams(max_streams))
    mcp = Endpoints(access, tokens is not None, host, operator_tools)
    routes: list[BaseRoute] = [
        Route("/health", Health(quill.nc, slots, fleet).endpoint, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *mcp.routes(),
        *rest.routes(access),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with mcp.running():
            yield

    middleware = [
        Middleware(HttpMetrics, routes=routes),
        Middleware(Redaction),  # outside everything that may echo what a client sent
        Middleware(RequestIds),  # X-Request-Id, on the log lines and the commands it sends
        Middleware(Inflight, slots=slots),
        Middleware(Console(access, tokens, body_timeout).gate),  # /ui/: the console
        Middleware(PrincipalMiddleware, tokens=tokens),
        Middleware(BodyBounds, max_body=MAX_BODY_BYTES, body_timeout=body_timeout),
    ]
    handlers = {404: not_found, 405: not_allowed}
    return Starlette(
        routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=handlers
    )


async def not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": "not_found"}, status_code=404)


async def not_allowed(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": "method_not_allowed"}, status_code=405)
