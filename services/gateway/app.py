"""The gateway process: wiring only. Run it with ``quill gateway --nats-url URL``.

One SDK client (``Quill``) for every request; one Starlette app served by uvicorn::

    /health  /metrics  /openapi.json          public
    /mcp                                      MCP, the workspace tool's tools and Quill's
    /mcp/wap                                  MCP, WAP's camelCase tools
    /v1/host/workspace/files[/{path}]         REST (RFC 0059 §C)
    /v1/runs[/{runId}[/cancel]]               REST runs (RFC 0059 §D)
    /.well-known/openwop                      discovery (no token needed)
    /ui/                                      the operator's console (docs/console.md)

Middleware, outermost first: ``HttpMetrics`` (counts and times every request),
``Redaction`` (no registered secret in any response's headers or body: ``redaction.py``),
``RequestIds`` (``X-Request-Id``), ``Inflight`` (at most ``max_inflight`` requests served at
once, busy past it, and server-sent event streams counted per principal instead:
``inflight.py``, ``streams.py``), the console's gate (``/ui``), ``PrincipalMiddleware`` (who
is calling; 401 otherwise), then ``BodyBounds`` (each body read whole before the app runs: at
most ``MAX_BODY_BYTES``, within ``body_timeout``). uvicorn runs
``HeaderDeadline``, its httptools protocol closing a connection whose request head is late or large
(``infra/http/bounds.py``). The process also answers ``ws.sys.ping.gateway`` like every
Quill service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from nats.aio.subscription import Subscription
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from contracts.limits import (
    GATEWAY_MAX_INFLIGHT,
    GATEWAY_RETRY_AFTER_MS,
    GATEWAY_STREAMS_PER_PRINCIPAL,
)
from contracts.subjects import Subjects
from infra import bus, tracing
from infra.http.bounds import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, BodyBounds
from infra.http.inflight import Inflight, Slots
from infra.http.metrics import HttpMetrics, metrics_endpoint
from infra.http.redaction import Redaction
from infra.http.requestids import RequestIds, TaggedIds
from infra.http.scrape import Scrape
from infra.http.server import Server, listen, serve, settle_heap
from infra.http.streams import Streams
from infra.http.workers import Workers
from quill.client import Quill
from services.gateway import VERSION, openapi
from services.gateway.access import (
    ANONYMOUS,
    Access,
    PrincipalMiddleware,
    Tokens,
    is_loopback,
)
from services.gateway.console import Console
from services.gateway.fleet import Fleet
from services.gateway.mcp import endpoints
from services.gateway.mcp.endpoints import Endpoints
from services.gateway.rest import MAX_BODY_BYTES, Rest
from services.gateway.rest_approvals import Approvals
from services.gateway.runs import Runs
from services.gateway.workspaces import WorkspacesRest

log = logging.getLogger("quill.gateway")

SERVICE = "quill-gateway"


@dataclass(frozen=True)
class GatewayConfig:
    """Settings of one gateway process."""

    nats_url: str
    host: str = "127.0.0.1"
    port: int = 8080
    """0 picks a free port (``Gateway.port`` tells which)."""
    tokens: Tokens | None = None
    """None: no tokens, loopback only, everyone is tenant ``default``."""
    root: str = "ws"
    header_timeout: float = HEADER_TIMEOUT_S
    """Seconds a connection has to send a request's head (408 and closed after)."""
    body_timeout: float = BODY_TIMEOUT_S
    """Seconds a request's body has to arrive once its head has (408 after)."""
    workers: int = 1
    """Gateway processes serving the port (``infra/http/workers.py``)."""
    reuse_port: bool = False
    """Listen with ``SO_REUSEPORT`` (a worker's: the others listen on the same port)."""
    max_inflight: int = GATEWAY_MAX_INFLIGHT
    """HTTP requests served at once; past it, answered busy (``inflight.py``)."""
    max_streams: int = GATEWAY_STREAMS_PER_PRINCIPAL
    """Server-sent event streams one principal keeps open at once; past it, ``429``
    (``streams.py``). Streams take no request slot."""
    settle_heap: bool = False
    """Freeze the startup heap (``settle_heap``): for a process that is only a gateway (the
    ``quill gateway`` command sets it), never for one that starts gateways among other work
    (a test run: what it froze would stay for the rest of the process)."""
    metrics_port: int | None = None
    """Serve the metrics on this port too (0: a free one), besides ``GET /metrics``; with
    several workers, the whole gateway's (``infra/http/scrape.py``)."""
    metrics_host: str = "127.0.0.1"
    metrics_relay: str | None = None
    """A worker n ≥ 1's: worker 0's metrics URL, which its ``GET /metrics`` answers."""
    operator_tools: tuple[str, ...] = ()
    """Operators' MCP tools ``/mcp`` offers too (``endpoints.OPERATOR_TOOLS``: by default
    none, so that no model is offered them)."""

    def check(self) -> None:
        """Raises:
        ValueError: a non-loopback host without tokens; fewer than one worker; an operator
        tool that is not one."""
        unknown = sorted(set(self.operator_tools) - set(endpoints.OPERATOR_TOOLS))
        if unknown:
            known = ", ".join(endpoints.OPERATOR_TOOLS)
            raise ValueError(f"--operator-tool {unknown[0]}: not an operator tool ({known})")
        if self.tokens is None and not is_loopback(self.host):
            raise ValueError(
                f"--host {self.host} needs --tokens: without tokens the gateway serves "
                "loopback only"
            )
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, not {self.workers}")
        if self.max_streams < 1:
            raise ValueError(f"--max-streams must be at least 1, not {self.max_streams}")


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
    mcp = Endpoints(access, tokens is not None, host, operator_tools)

    slots = Slots(max_inflight, Streams(max_streams))

    async def health(request: Request) -> Response:
        up = quill.nc.is_connected
        status = "ok" if up else "unavailable"
        body: dict[str, Any] = {"status": status, "service": SERVICE, "version": VERSION}
        full = False
        if fleet is not None:
            body |= fleet.health()
            full = fleet.storage_full
        body["http"] = slots.health()
        headers = None
        if slots.full:  # every request is refused busy now: say so, as they are told
            if up and not full:
                body["status"] = "busy"
            taken = f"{slots.serving} of {slots.max_inflight}"
            busy = f"http: every request slot is taken ({taken}): requests are refused busy"
            body["warnings"] = [*body.get("warnings", []), busy]
            headers = {"Retry-After": str(math.ceil(GATEWAY_RETRY_AFTER_MS / 1000))}
        ok = up and not full and not slots.full
        return JSONResponse(body, status_code=200 if ok else 503, headers=headers)

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(openapi.document())

    routes: list[BaseRoute] = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *mcp.routes(),
        *(rest := Rest(access)).routes(),
        *Runs(rest).routes(),
        *Approvals(rest).routes(),
        *WorkspacesRest(access).routes(),
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


@dataclass
class Gateway:
    """A running gateway; ``stop()`` undoes everything ``start_gateway`` did."""

    quill: Quill
    server: Server
    task: asyncio.Task[None]
    host: str
    port: int
    subs: list[Subscription] = field(default_factory=list)
    fleet: Fleet | None = None
    workers: Workers[GatewayConfig] | None = None
    """The other workers, when this process is worker 0 of several."""
    scrape: Scrape | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def info(self) -> dict[str, Any]:
        info = {"http_url": self.url}
        if self.scrape is not None and self.scrape.server is not None:
            info["metrics_url"] = self.scrape.server.url
        return info

    async def stop(self) -> None:
        if self.workers is not None:
            await self.workers.stop()
        if self.scrape is not None:
            self.scrape.close()
        for sub in self.subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self.fleet is not None:
            await self.fleet.stop()
        self.server.should_exit = True
        await self.task
        await self.quill.close()


async def start_gateway(config: GatewayConfig) -> Gateway:
    """Connect, create the reachable workspaces, listen, serve; ready when it returns.

    Raises:
        QuillError: ``UNAVAILABLE`` if NATS or a writer cannot be reached.
        OSError: the address cannot be listened on.
        RuntimeError: the app did not start.
    """
    config.check()
    logging.getLogger("mcp").setLevel(logging.WARNING)  # it logs every stateless request at INFO
    quill = await Quill.connect(config.nats_url, actor="gateway", root=config.root)
    quill._nuid = TaggedIds()  # commands named after the HTTP request (requestids.py)
    if tracing.setup("gateway"):  # each request it sends carries its span (traceparent)
        setattr(quill.nc, "request", tracing.traced_requests(quill.nc.request))  # noqa: B010
    try:
        access = Access(quill)
        await access.prepare(config.tokens.principals() if config.tokens else [ANONYMOUS])
        fleet = Fleet(quill.nc, Subjects(config.root))
        scrape = Scrape(config.metrics_relay)
        app = build_app(
            quill,
            access,
            config.tokens,
            config.host,
            fleet,
            config.body_timeout,
            config.max_inflight,
            scrape.endpoint,
            config.max_streams,
            config.operator_tools,
        )
        sock = listen(config.host, config.port, config.reuse_port or config.workers > 1)
        server, task = await serve(app, sock, config.header_timeout)
        gateway = Gateway(
            quill, server, task, config.host, sock.getsockname()[1], fleet=fleet, scrape=scrape
        )
        try:
            scrape.serve(config.metrics_port, config.metrics_host, config.workers)
        except BaseException:
            await gateway.stop()
            raise
        instance = bus.instance_id("gateway")
        subjects = Subjects(config.root)
        gateway.subs = await bus.serve_ping(quill.nc, subjects, "gateway", instance, gateway.info)
        fleet.start()
        if config.settle_heap:
            settle_heap()
        if config.workers > 1:
            assert scrape.server is not None  # served for them: Scrape.serve
            worker = replace(
                config,
                port=gateway.port,
                workers=1,
                reuse_port=True,
                metrics_port=None,
                metrics_relay=scrape.server.url,
            )
            gateway.workers = workers = Workers(worker, config.workers - 1, start_gateway)
            scrape.peers = lambda: dict(workers.metrics)
            try:
                await gateway.workers.start()
            except BaseException:
                await gateway.stop()
                raise
        log.info("gateway %s serving %s", instance, gateway.url)
        return gateway
    except BaseException:
        await quill.close()
        raise
