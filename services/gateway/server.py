"""The gateway process: connect to NATS, create the workspaces its principals reach, build the
app (``app.py``), listen and serve (``infra/http/server.py``), answer pings, start the other
workers. Run it with ``quill gateway --nats-url URL``; ``start_gateway`` is ready when it
returns, and ``Gateway.stop`` undoes it.

The process also answers ``ws.sys.ping.gateway`` like every Quill service, and with several
workers (``--workers``) serves their metrics as one scrape (``infra/http/scrape.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from nats.aio.subscription import Subscription

from contracts.limits import GATEWAY_MAX_INFLIGHT, GATEWAY_STREAMS_PER_PRINCIPAL
from contracts.subjects import Subjects
from infra import bus, tracing
from infra.http.bounds import BODY_TIMEOUT_S, HEADER_TIMEOUT_S
from infra.http.requestids import TaggedIds
from infra.http.scrape import Scrape
from infra.http.server import Server, listen, serve, settle_heap
from infra.http.workers import Workers
from quill.client import Quill
from services.gateway.access import ANONYMOUS, Access, Tokens, is_loopback
from services.gateway.app import build_app
from services.gateway.health import Fleet
from services.gateway.mcp import endpoints

log = logging.getLogger("quill.gateway")


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
    """HTTP requests served at once; past it, answered busy (``infra/http/inflight.py``)."""
    max_streams: int = GATEWAY_STREAMS_PER_PRINCIPAL
    """Server-sent event streams one principal keeps open at once; past it, ``429``
    (``infra/http/streams.py``). Streams take no request slot."""
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
    quill._nuid = TaggedIds()  # commands named after the HTTP request (infra/http/requestids.py)
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
