"""What every service process shares: settings, structured logs, metrics, audit, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

import msgspec
import prometheus_client as prom
from nats.aio.client import Client as NATS

from contracts import codec, ops
from contracts.errors import QuillError
from contracts.events import AuditRecord
from contracts.subjects import Address, Origin, Subjects
from infra import logfields, metrics, private, tracing
from infra.secret_registry import LogFilter, secrets_from_env
from infra.store import Store

log = logging.getLogger("quill")

T = TypeVar("T")
K = TypeVar("K")


@dataclass(frozen=True)
class Settings:
    """Settings of one service process (from the command line or the environment)."""

    nats_url: str
    data_dir: Path
    root: str = "ws"
    replicas: int = 1
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (0: a free one; None: not at all)."""
    metrics_host: str = "127.0.0.1"
    """The address the metrics listen on (``0.0.0.0`` in a container)."""
    instance: str = ""
    projection_rows: int | None = None
    """Workspace rows the projection holds in memory (``--projection-rows``; None: the
    store's default, ``$QUILL_PROJECTION_ROWS`` or ``PROJECTION_ROWS``). What else a service
    takes is its own typed config (``WriterConfig``, ``SnapshotConfig``, ``ExecutorConfig``,
    ``GatewayConfig``, ``BridgeConfig``)."""

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.root)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **logfields.fields_of(record),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc"] = record.exc_text
        return json.dumps(line)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logfields.TextFormatter())
    handler.addFilter(logfields.RequestFields())  # the request a line was written for
    handler.addFilter(LogFilter())  # no registered secret in a service log (its fields too)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("nats").setLevel(logging.WARNING)


# ---------------------------------------------------------------- metrics


METRICS_HOST = "127.0.0.1"


@dataclass
class MetricsServer:
    """``GET /metrics`` served from a thread (``serve_metrics``)."""

    server: Any
    thread: Any
    host: str

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    @property
    def url(self) -> str:
        """Where this machine reaches it (loopback when it listens on every address)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve_metrics(
    port: int | None, host: str = METRICS_HOST, registry: Any = prom.REGISTRY
) -> MetricsServer | None:
    """Serve ``registry`` (this process's metrics) at ``http://host:port/metrics`` (``port``
    0: a free one); None when ``port`` is None.

    Raises:
        RuntimeError: it cannot listen there (one line naming the address and why).
    """
    if port is None:
        return None
    try:
        server, thread = prom.start_http_server(port, addr=host, registry=registry)
    except (OSError, ValueError) as exc:  # ValueError: a host that is no address
        reason = getattr(exc, "strerror", None) or str(exc)
        raise RuntimeError(f"cannot serve metrics on {host}:{port}: {reason}") from None
    return MetricsServer(server, thread, host)


# ---------------------------------------------------------------- audit


_KINDS = frozenset(("cmd", "qry", "exec"))


class Auditor:
    """Publishes one audit record per operation and counts it in the metrics
    (``quill_requests_total``, ``quill_request_seconds``; ``quill_publish_failures_total``
    when the record could not be published)."""

    def __init__(self, nc: NATS, subjects: Subjects, service: str, instance: str) -> None:
        self._nc, self._subjects = nc, subjects
        self.service, self.instance = service, instance
        self.requests = metrics.Requests(service)
        self._templates: dict[tuple[Address, Origin | None], tuple[AuditRecord, str]] = {}

    def unaddressed(self, subject: str, error: QuillError, started: float) -> None:
        """Count a request refused without an audit record (a bad subject, a name holding a
        secret): ``op="unknown"``, never the subject's own words (label values a hostile
        client would choose)."""
        kind = subject.split(".", 2)[1:2]
        known = kind[0] if kind and kind[0] in _KINDS else "unknown"
        elapsed = time.perf_counter() - started
        self.requests.observe(known, "unknown", str(error.code), elapsed)

    async def record(
        self,
        address: Address,
        origin: Origin | None,
        started: float,
        *,
        error: QuillError | None = None,
        version: int | None = None,
        paths: list[str] | None = None,
        summary: str | None = None,
        details: dict[str, Any] | None = None,
        counted: bool = True,
    ) -> None:
        """Publish the audit record of an operation (``counted``: and count it as a request;
        False for what is no request, as an egress connection)."""
        if error is not None:  # the one log line of a failed request
            logfields.failed(address, origin, error)
        elapsed = time.perf_counter() - started
        if not counted:
            pass
        elif error is None:
            self.requests.observe(address.kind, address.op, "ok", elapsed)
        else:  # an op the registry lacks is counted as unknown: bounded label values
            op = address.op if ops.find(address.kind, address.op) is not None else "unknown"
            self.requests.observe(address.kind, op, str(error.code), elapsed)
        at, duration_ms, paths = datetime.now(UTC), round(elapsed * 1000, 3), (paths or [])[:100]
        if error is None and summary is None and details is None:
            # The common record (a success with nothing op-specific): what its address and
            # origin fix is built once per them; replacing the rest costs a third of building.
            key = (address, origin)
            cached = self._templates.get(key)
            if cached is None:
                if len(self._templates) >= 4096:
                    self._templates.clear()
                cached = self._templates[key] = (
                    self._build(address, origin, at, None, None, None, [], None, None),
                    self._subjects.audit(address.tenant, address.workspace),
                )
            template, subject = cached
            record = msgspec.structs.replace(
                template, at=at, duration_ms=duration_ms, version=version, paths=paths
            )
        else:
            record = self._build(
                address, origin, at, error, duration_ms, version, paths, summary, details
            )
            subject = self._subjects.audit(address.tenant, address.workspace)
        payload = codec.encode(record)
        secrets = secrets_from_env()
        if secrets:  # the last net: no audit record carries a registered secret
            payload = secrets.redact_bytes(payload)[0]
        try:
            await self._nc.publish(subject, payload)
        except Exception as exc:  # never fail an operation because auditing failed
            metrics.publish_failed(self.service, "audit")
            log.warning("audit publish failed: %s", exc)

    def _build(
        self,
        address: Address,
        origin: Origin | None,
        at: datetime,
        error: QuillError | None,
        duration_ms: float | None,
        version: int | None,
        paths: list[str],
        summary: str | None,
        details: dict[str, Any] | None,
    ) -> AuditRecord:
        return AuditRecord(
            at=at,
            tenant=address.tenant,
            workspace=address.workspace,
            kind=address.kind,
            op=address.op,
            actor=origin.actor if origin else None,
            session=origin.session if origin else None,
            run=origin.run if origin else None,
            request_id=(origin.request_id or None) if origin else None,
            outcome="ok" if error is None else "error",
            error_code=None if error is None else str(error.code),
            duration_ms=duration_ms or 0.0,
            version=version,
            paths=paths,
            summary=summary,
            details=details,
            service=self.service,
            instance=self.instance,
        )


# ---------------------------------------------------------------- process lifetime


def lock_directory(directory: Path, holder: str) -> IO[str]:
    """Take ``directory`` for this process: an flock on ``<directory>/lock``, held while the
    returned file is open (and released by the kernel however the process dies).

    Raises:
        RuntimeError: another process holds it (``<directory> is in use by <holder>``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "lock", os.O_WRONLY | os.O_CREAT, 0o600)  # owner-only, any umask
    handle = os.fdopen(fd, "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"{directory} is in use by {holder}") from None
    return handle


class Service(Protocol):
    instance: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Service)


@dataclass
class Running(Generic[S]):
    service: S
    stop: Callable[[], Awaitable[None]]


async def connect_service(settings: Settings, name: str) -> NATS:
    """Serve the metrics, connect as ``quill-<name>``, create the streams (idempotently; while
    JetStream does not answer, again: ``assets.patiently``)."""
    from infra import assets, bus
    from infra.busy import Dropped

    tracing.setup(name)
    serve_metrics(settings.metrics_port, settings.metrics_host)
    refused = metrics.refused_publishes(name, settings.subjects)
    nc = await bus.connect(
        settings.nats_url,
        name=f"quill-{name}",
        on_dropped=Dropped(name),
        on_server_error=refused,
    )
    try:
        await assets.patiently(
            "creating the streams",
            lambda: bus.ensure_streams(nc, settings.subjects, settings.replicas),
        )
    except BaseException:
        await nc.close()
        raise
    return nc


Prepare = Callable[[Settings, NATS, Path], Awaitable[None]]
"""What a service does to its projection's file before it opens (a reader installs a snapshot)."""


async def start_service(
    settings: Settings,
    name: str,
    factory: Callable[[Settings, NATS, Store], S],
    prepare: Prepare | None = None,
) -> Running[S]:
    """Connect, create the streams, ``prepare`` the service's projection (``<data>/<name>.db``),
    open it, start the service; the returned ``stop`` undoes all of it."""
    private.tighten_logged(settings.data_dir, name)  # what an earlier version left readable
    nc = await connect_service(settings, name)
    try:
        path = settings.data_dir / f"{name}.db"
        if prepare is not None:
            await prepare(settings, nc, path)
        store = await Store.open(path, role=name, max_rows=settings.projection_rows)
    except BaseException:
        await nc.close()
        raise
    return await started(factory(settings, nc, store), nc, store.close)


async def started(
    service: S, nc: NATS, close: Callable[[], Awaitable[None]] | None = None
) -> Running[S]:
    """Start ``service`` (connected on ``nc``; ``close``: what else it holds, closed after it);
    the returned ``stop`` undoes all of it, as a failed start does."""
    try:
        await service.start()
    except BaseException:  # e.g. a writer refused by the deployment: exit, not hang
        with contextlib.suppress(Exception):
            await service.stop()
        if close is not None:
            await close()
        await nc.close()
        raise

    async def stopping() -> None:
        await service.stop()
        if close is not None:
            await close()
        await nc.drain()

    once: asyncio.Future[None] | None = None

    async def stop() -> None:
        """Once: a second call (a test's own, then its exit stack's) waits for the first."""
        nonlocal once
        if once is None:
            once = asyncio.ensure_future(stopping())
        await asyncio.shield(once)

    return Running(service, stop)


async def run_until_stopped(
    start: Callable[[], Awaitable[Callable[[], Awaitable[None]]]],
) -> None:
    """Run ``start()`` (which returns its ``stop``), then wait for SIGINT/SIGTERM and stop."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    stop = await start()
    try:
        await stopping.wait()
    finally:
        await stop()
