"""Gateway metrics, in the families every service uses (``infra/metrics.py``).

``quill_requests_total{service="gateway", kind, op, outcome}`` and ``quill_request_seconds``:

* ``kind="http"``: every HTTP request, ``op`` = method and route template
  (``GET /v1/host/workspace/files/{path}``), ``outcome`` = ``ok`` or the status code;
* ``kind="mcp"`` / ``kind="wap"``: every tool call, ``op`` = the tool, ``outcome`` = ``ok`` or
  the error code.
"""

from __future__ import annotations

import re
import time
from typing import Any

import prometheus_client as prom
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infra.metrics import Requests

SERVICE = "gateway"
_REQUESTS = Requests(SERVICE)


def observe(kind: str, op: str, outcome: str, started: float) -> None:
    """Count one request of ``kind``/``op`` and its latency since ``started``."""
    _REQUESTS.observe(kind, op, outcome, time.perf_counter() - started)


METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
"""HTTP methods named in the ``op`` label; any other a client sends is ``OTHER`` (a label
value per invented method would grow the series without bound)."""


def route_name(routes: list[BaseRoute], scope: Scope) -> str:
    """``METHOD /template`` of the route that serves ``scope`` (``unmatched`` for none)."""
    method = scope["method"] if scope["method"] in METHODS else "OTHER"
    for route in routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            template = re.sub(r":\w+}", "}", getattr(route, "path", "?"))
            return f"{method} {template}"
    return f"{method} unmatched"


class HttpMetrics:
    """Outermost middleware: time every HTTP request and count it by route and status."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app, self.routes = app, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: dict[str, Any] = {"code": 500}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            code = status["code"]
            observe(
                "http", route_name(self.routes, scope), "ok" if code < 400 else str(code), started
            )


async def metrics_endpoint(request: Request) -> Response:
    """``GET /metrics``: the Prometheus exposition of this process."""
    return Response(prom.generate_latest(), media_type=prom.CONTENT_TYPE_LATEST)
