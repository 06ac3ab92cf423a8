"""Optional traces (``infra/tracing.py``): one REST write through the gateway is one trace,
HTTP request → NATS request → the writer's command → its append, each span the child of the
one before; with traces off, nothing of OpenTelemetry is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infra import tracing
from services.gateway.server import Gateway, GatewayConfig, start_gateway
from tests.helpers import start_writer_and_reader

FILES = "/v1/host/workspace/files"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Traces on, into memory (this process's tracer provider: set once, kept)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setenv(tracing.ENV, "1")
    yield exporter
    tracing.off()
    exporter.shutdown()


@pytest_asyncio.fixture
async def gateway(
    nats_url: str, tmp_path: Path, spans: InMemorySpanExporter
) -> AsyncIterator[Gateway]:
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)
        running = await start_gateway(GatewayConfig(nats_url, port=0, workers=1))
        stack.push_async_callback(running.stop)
        yield running


async def traced_put(gateway: Gateway, spans: InMemorySpanExporter, path: str) -> httpx.Response:
    """A PUT of ``path`` once the workspace has ``a.md``: its spans alone are in ``spans``."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        await http.put(f"{FILES}/a.md", json={"content": "creates the workspace first"})
        spans.clear()
        return await http.put(f"{FILES}/{path}", json={"content": "traced"})


async def test_a_rest_write_is_one_trace_from_gateway_to_append(
    gateway: Gateway, spans: InMemorySpanExporter
) -> None:
    answer = await traced_put(gateway, spans, "notes.md")
    assert answer.status_code == 200, answer.text
    rid = answer.headers["x-request-id"]
    finished = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in finished if s.context is not None}

    def one(name: str) -> ReadableSpan:
        found = [s for s in finished if s.name == name]
        assert len(found) == 1, [s.name for s in finished]
        return found[0]

    def parent_of(span: ReadableSpan) -> ReadableSpan:
        assert span.parent is not None, span.name
        return by_id[span.parent.span_id]

    append = one("append")
    command = parent_of(append)
    assert command.name == "cmd.write" and command.kind == trace.SpanKind.SERVER
    assert command.attributes is not None
    assert str(command.attributes["quill.request_id"]).startswith(f"{rid}_")  # requestids.py
    sent = parent_of(command)
    assert sent.name == "nats cmd.write" and sent.kind == trace.SpanKind.CLIENT
    http_span = parent_of(sent)
    assert http_span.name == "HTTP PUT" and http_span.parent is None
    assert http_span.attributes is not None and http_span.attributes["quill.request_id"] == rid
    assert len({s.context.trace_id for s in (append, command, sent, http_span) if s.context}) == 1


async def test_a_refused_command_s_span_says_why(
    gateway: Gateway, spans: InMemorySpanExporter
) -> None:
    under_a_file = await traced_put(gateway, spans, "a.md/b.md")  # a.md is a file
    assert under_a_file.status_code >= 400, under_a_file.text
    refused = [s for s in spans.get_finished_spans() if s.name == "cmd.write"]
    assert refused, [s.name for s in spans.get_finished_spans()]
    assert all(s.status.status_code == trace.StatusCode.ERROR for s in refused)
    assert not [s for s in spans.get_finished_spans() if s.name == "append"]


def test_with_traces_off_nothing_of_opentelemetry_is_loaded(tmp_path: Path) -> None:
    """The services import none of it (the gateway's MCP library imports the API itself, but
    nothing of the SDK is loaded)."""
    code = (
        "import sys\n"
        "from infra import tracing\n"
        "import services.writer.app, services.reader.app, services.executor.app\n"
        "assert not tracing.setup('writer')\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not loaded, loaded\n"
        "import services.gateway.server\n"
        "assert not tracing.setup('gateway')\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry.sdk')]\n"
        "assert not loaded, loaded\n"
    )
    env = {k: v for k, v in os.environ.items() if "OTEL" not in k}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path)
