"""Fixtures of the executor's end-to-end tests: both sandbox providers, a writer and a reader,
and a function that starts executors; a workspace name of each test's own."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio

from infra.exec.sandbox import probe_bwrap
from quill.client import Quill
from quill.workspace import Workspace
from services.executor.app import Executor, ExecutorConfig
from tests.helpers import start_executor, start_writer_and_reader

PROVIDERS = ["bwrap", "local"]

StartExecutor = Callable[..., Awaitable[Executor]]


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    if request.param == "bwrap" and (why := probe_bwrap()) is not None:
        print(f"skipped: bwrap cannot run here: {why}")
        pytest.skip(f"bwrap cannot run here: {why}")
    return str(request.param)


@pytest_asyncio.fixture
async def stack(nats_url: str, tmp_path: Path, provider: str) -> AsyncIterator[StartExecutor]:
    """A writer, a reader, and a function that starts executors with ``provider``."""
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        count = 0

        async def executor(**config: object) -> Executor:
            nonlocal count
            count += 1
            cfg = ExecutorConfig(sandbox=provider, **config)  # type: ignore[arg-type]
            return await start_executor(es, nats_url, tmp_path / f"executor{count}", cfg)

        yield executor


@pytest_asyncio.fixture
async def executor(stack: StartExecutor) -> Executor:
    """One executor for this test's commands (its state, for tests that look inside)."""
    return await stack()


@pytest_asyncio.fixture
async def ws(executor: Executor, quill: Quill, name: str) -> Workspace:
    """This test's own workspace, made, with one executor to run its commands."""
    workspace = quill.workspace(name)
    await workspace.create()
    return workspace


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A workspace name of this test's own (the server is shared by the module)."""
    base = request.node.name.removeprefix("test_").replace("[", "-").rstrip("]")
    base = base.replace("_", "-")
    if len(base) > 60:  # cut, but told apart: two parameters of one long test differ
        base = f"{base[:51]}-{hashlib.sha256(base.encode()).hexdigest()[:8]}"
    return "acme/" + base
