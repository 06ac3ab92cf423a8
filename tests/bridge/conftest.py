"""A bridge under test: ``quill attach`` as a subprocess whose standard input and output are
pipes (the scripted terminal), next to a writer, a reader and an executor in process, so that
their silence on the bridge's workspace is real."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio

from quill.client import Quill

LINE_TIMEOUT_S = 20.0


class Attached:
    """A running ``quill attach``: its terminal is read line by line and answered."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc, self.log = proc, log
        self.lines: list[str] = []
        """Every line it printed, in order."""

    async def line(self, timeout: float = LINE_TIMEOUT_S) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            raise EOFError(f"quill attach ended:\n{self.log.read_text()}")
        text = raw.decode().rstrip("\n")
        self.lines.append(text)
        return text

    async def until(self, marker: str, timeout: float = LINE_TIMEOUT_S) -> str:
        """The next line containing ``marker`` (lines before it are kept in ``lines``)."""
        async with asyncio.timeout(timeout):
            while True:
                text = await self.line()
                if marker in text:
                    return text

    async def prompt(self) -> str:
        """The next question it asks."""
        return await self.until("allow? [y/N]")

    async def answer(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    async def stop(self) -> int:
        """SIGTERM, as Ctrl-C would; the exit status."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), 30)

    async def exit_code(self) -> int:
        return await asyncio.wait_for(self.proc.wait(), 30)


Attach = Callable[..., Awaitable[Attached]]


@pytest.fixture
def servers(local_exec: AsyncExitStack) -> None:
    """A writer, a reader and an executor (local provider), in process."""


def folder_with(tmp_path: Path, files: Mapping[str, str]) -> Path:
    """``tmp_path/folder`` holding ``files`` (path: text), for a bridge to attach."""
    folder = tmp_path / "folder"
    folder.mkdir()
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return folder


@pytest_asyncio.fixture
async def attach(nats_url: str, tmp_path: Path) -> AsyncIterator[Attach]:
    """Start ``quill attach DIR --as NAME ...``; ``ready=False`` returns before the ready line
    (for a start that must fail). Every bridge still running at the end is stopped."""
    started: list[Attached] = []

    async def start(
        directory: Path, name: str, *args: str, tenant: str = "acme", ready: bool = True
    ) -> Attached:
        log = tmp_path / f"attach-{name}-{len(started)}.log"
        argv = [sys.executable, "-m", "quill", "attach", str(directory), "--as", name]
        argv += ["--tenant", tenant, "--nats-url", nats_url, "--client", "laptop", *args]
        with log.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        attached = Attached(proc, log)
        started.append(attached)
        if ready:
            await attached.until("quill attach ready")
        return attached

    yield start
    for attached in started:
        if attached.proc.returncode is None:
            await attached.stop()


@pytest_asyncio.fixture
async def client(nats_url: str) -> AsyncIterator[Quill]:
    quill = await Quill.connect(nats_url, actor="tester", timeout=10)
    yield quill
    await quill.close()
