"""The console in a real browser: headless Chromium driven by Playwright's Python package,
over a real gateway on a real nats-server (the gateway tests' fixtures).

No browser, no Playwright: the tests SKIP with the reason (``.ci/run`` installs Chromium with
apt-get when it is absent; elsewhere set ``QUILL_CHROMIUM`` to a Chromium binary)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from services.executor.app import Executor, ExecutorConfig
from tests.gateway.conftest import gateway, nats_server, start  # noqa: F401 (fixtures)
from tests.helpers import need_bwrap, start_executor

CHROMIUM = os.environ.get("QUILL_CHROMIUM", "/usr/bin/chromium")
WAIT_MS = 15_000
"""How long an expectation waits for the page (Playwright's default is 5 s)."""


def chromium_or_skip() -> str:
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        pytest.skip("Playwright is not installed: pip install -e '.[dev]'")
    found = shutil.which(CHROMIUM)
    if found is None:
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set QUILL_CHROMIUM)")
    return found


@pytest_asyncio.fixture
async def browser() -> AsyncIterator[Any]:
    executable = chromium_or_skip()
    from playwright.async_api import async_playwright, expect

    expect.set_options(timeout=WAIT_MS)

    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=executable, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest_asyncio.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    """A page 1280 px wide, in a fresh context (no cookies)."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    try:
        yield await context.new_page()
    finally:
        await context.close()


@pytest_asyncio.fixture
async def executor(nats_url: str, tmp_path: Path) -> AsyncIterator[Executor]:
    """An executor running commands in real bwrap sandboxes (skipped where bwrap cannot)."""
    need_bwrap()
    async with AsyncExitStack() as stack:
        config = ExecutorConfig(sandbox="bwrap")
        yield await start_executor(stack, nats_url, tmp_path / "executor", config)
