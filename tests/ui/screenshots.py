"""The screenshots of docs/console.md: ``python -m tests.ui.screenshots [DIR]`` (default
``docs/console``) starts a nats-server, a writer, a reader, an executor and a gateway, makes a
small history (files written and edited, a command run, a request waiting for approval), and
takes each main page in headless Chromium at 1100 x 700."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

from playwright.async_api import async_playwright

from quill_cli.natsserver import NatsServer
from services.executor.app import ExecutorConfig
from services.gateway.server import GatewayConfig, start_gateway
from tests.helpers import approvals_pending, start_executor, start_reader, start_writer
from tests.ui.conftest import CHROMIUM

APP = '''"""A tiny service."""


def answer(question: str) -> int:
    """The answer to {q}."""
    return {n}
'''


async def history(url: str) -> asyncio.Task[object]:
    from quill.client import Quill

    quill = await Quill.connect(url, actor="ann")
    ws = quill.workspace("default/default")
    await ws.create(exist_ok=True)
    await ws.write("README.md", "# Demo\n\nA workspace an agent works in.\n")
    await ws.write("src/app.py", APP.format(q="everything", n=41))
    await ws.write("src/util.py", "def double(x):\n    return 2 * x\n")
    agent = quill.as_actor("agent-7").workspace("default/default")
    await agent.write("src/app.py", APP.format(q="life, the universe and everything", n=42))
    await agent.exec("python3 -c 'print(6 * 7)' > out.txt; echo built")
    await agent.exec("exit 2")
    for name in ("notes", "scratch"):
        other = quill.workspace(f"default/{name}")
        await other.create()
        await other.write("todo.md", f"- {name}\n")
    held = quill.workspace("default/reviewed")
    await held.create()
    await held.write("plan.md", "# Plan\n\n- write the tests\n- ship it on Friday\n")
    await held.set_trust("restricted")
    parked = asyncio.create_task(
        quill.as_actor("agent-9")
        .workspace("default/reviewed")
        .edit("plan.md", "- ship it on Friday\n", "- ship it today\n- skip the review\n")
    )
    await approvals_pending(held)
    return parked


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        try:
            async with AsyncExitStack() as stack:
                await start_writer(stack, server.url, Path(tmp) / "writer")
                await start_reader(stack, server.url, Path(tmp) / "reader")
                config = ExecutorConfig(sandbox="bwrap")
                await start_executor(stack, server.url, Path(tmp) / "executor", config)
                gateway = await start_gateway(GatewayConfig(server.url, port=0))
                stack.push_async_callback(gateway.stop)
                parked = await history(server.url)
                await shoot(gateway.url, out)
                parked.cancel()
                with contextlib.suppress(BaseException):
                    await parked
        finally:
            with contextlib.suppress(Exception):
                server.stop()


async def shoot(base: str, out: Path) -> None:
    shots = {
        "workspaces": "/ui/",
        "timeline": "/ui/w/default/",
        "file": "/ui/w/default/file?path=src/app.py&v=3",
        "diff": "/ui/w/default/diff?from=3&to=5&mode=split",
        "commands": "/ui/w/default/commands",
        "approvals": "/ui/w/reviewed/approvals",
        "cluster": "/ui/cluster",
    }
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = await browser.new_page(viewport={"width": 1100, "height": 700})
        for name, path in shots.items():
            await page.goto(base + path)
            with contextlib.suppress(Exception):  # a live page: once it says so
                await page.get_by_text("on", exact=True).first.wait_for(timeout=3000)
            await page.screenshot(path=out / f"{name}.png")
            print(out / f"{name}.png")
        await browser.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/console")))
