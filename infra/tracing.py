"""Optional OpenTelemetry traces: gateway → writer → append, one trace per HTTP request.

Off by default, and then nothing of OpenTelemetry is imported: the hot path reads ``ON`` (a
module attribute) and goes on. On when ``$QUILL_OTEL`` is ``1`` (or ``console``: spans printed
to the service's log) or when ``$OTEL_EXPORTER_OTLP_ENDPOINT`` is set (spans sent there over
OTLP/HTTP), with ``pip install 'quill[otel]'``; each service calls ``setup`` as it starts.

- The gateway opens a server span per HTTP request and a client span per NATS request it sends
  for it, whose context travels in the request's ``traceparent`` header (W3C Trace Context).
- The writer records a server span per command (from receiving it to answering it, a child of
  the ``traceparent`` it came with) and, for a command that was appended, an ``append`` child
  (the JetStream batch that carried it). These are made when the command is answered
  (``served``), from the times noted while it was handled (``appended``): nothing of a span
  lives in the writer's queues.

A process that set its own tracer provider first (a test, an application embedding the
services) keeps it: ``setup`` only adds one when there is none.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("quill.tracing")

ON = False
"""Whether spans are made (``setup``)."""
ENV = "QUILL_OTEL"
TRACEPARENT = "traceparent"

_tracer: Any = None
_noted: dict[int, list[tuple[str, int, int]]] = {}
"""Child spans noted for a message not yet answered (by ``id(msg)``): name, start, end (ns)."""


def wanted() -> bool:
    """Whether the environment asks for traces."""
    return os.environ.get(ENV, "") not in ("", "0") or bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def setup(service: str) -> bool:
    """Turn traces on for this process if the environment asks (``wanted``) and OpenTelemetry
    is installed; say why not otherwise. Returns ``ON``."""
    global ON, _tracer
    if not wanted():
        ON = False
        return ON
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        log.warning("tracing asked for, but OpenTelemetry is missing: pip install 'quill[otel]'")
        ON = False
        return ON
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # none set yet
        provider = TracerProvider(resource=Resource.create({"service.name": f"quill-{service}"}))
        exporter: SpanExporter
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            try:  # by name: the extra's exporter need not be installed to type-check this
                otlp = importlib.import_module(
                    "opentelemetry.exporter.otlp.proto.http.trace_exporter"
                )
            except ImportError:
                log.warning("OTLP exporter missing: pip install 'quill[otel]'; spans to the log")
                exporter = ConsoleSpanExporter()
            else:
                exporter = otlp.OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("quill")
    ON = True
    log.info("tracing on (service %s)", service)
    return ON


def off() -> None:
    """Traces off (tests)."""
    global ON
    ON = False


# ---------------------------------------------------------------- the gateway's side


def http_span(method: str, path: str) -> Any:
    """A context manager: the gateway's server span of one HTTP request (current within)."""
    from opentelemetry.trace import SpanKind

    return _tracer.start_as_current_span(
        f"HTTP {method}", kind=SpanKind.SERVER, attributes={"http.method": method, "url.path": path}
    )


Request = Callable[..., Awaitable[Any]]


def traced_requests(request: Request) -> Request:
    """``request`` (a NATS connection's), with a client span around each call whose context
    goes in the ``traceparent`` header."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    async def traced(subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        name = ".".join(subject.split(".")[1:2] + subject.split(".")[-1:])  # cmd.write
        with _tracer.start_as_current_span(
            f"nats {name}", kind=SpanKind.CLIENT, attributes={"messaging.destination": subject}
        ):
            headers = dict(kwargs.pop("headers", None) or {})
            propagate.inject(headers)
            return await request(subject, payload, headers=headers, **kwargs)

    return traced


# ---------------------------------------------------------------- a service's side


def _ns(perf: float) -> int:
    """A ``time.perf_counter()`` reading as the epoch nanoseconds a span wants."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


def appended(msg: object, began: float) -> None:
    """Note that ``msg``'s command was appended, from ``began`` (perf_counter) to now."""
    _noted.setdefault(id(msg), []).append(("append", _ns(began), time.time_ns()))


def served(
    msg: Any, name: str, started: float, attributes: dict[str, str], error: str | None
) -> None:
    """The server span of a request answered now (received at ``started``), a child of the
    ``traceparent`` it came with, and the children noted for it (``appended``)."""
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    parent = propagate.extract(msg.headers or {})
    span = _tracer.start_span(
        name, context=parent, kind=SpanKind.SERVER, attributes=attributes, start_time=_ns(started)
    )
    if error is not None:
        span.set_attribute("quill.error_code", error)
        span.set_status(Status(StatusCode.ERROR, error))
    within = trace.set_span_in_context(span)
    for child, start, end in _noted.pop(id(msg), []):
        _tracer.start_span(child, context=within, start_time=start).end(end_time=end)
    span.end()
