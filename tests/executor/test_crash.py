"""An executor killed (SIGKILL) in the middle of a command: its caller gets an error within
seconds, nothing of the command is committed, the sandbox dies with it, and the next
executor on the same data directory rebuilds the checkout from the log."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import nats.errors
import pytest

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from services.executor.sandbox import probe_bwrap
from tests.helpers import start_reader, start_writer


async def executor_process(quill: Quill, data: Path) -> asyncio.subprocess.Process:
    """``quill executor`` as its own process, once it answers."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "quill", "executor", "--nats-url", quill.nc.connected_url.geturl(),
        "--data", str(data), "--sandbox", "bwrap", start_new_session=True,
    )  # fmt: skip
    async with asyncio.timeout(30):
        while True:
            assert process.returncode is None, "the executor exited"
            try:
                await quill.nc.request("ws.sys.ping.executor", b"", timeout=0.5)
                return process
            except nats.errors.Error:
                continue


async def test_an_executor_killed_mid_command(nats_url: str, tmp_path: Path) -> None:
    if (why := probe_bwrap()) is not None:
        pytest.skip(f"bwrap cannot run here: {why}")
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "writer")
        await start_reader(stack, nats_url, tmp_path / "reader")
        quill = await Quill.connect(nats_url, exec_silence_s=3, retries=0)
        stack.push_async_callback(quill.close)
        ws = quill.workspace("acme/crash")
        await ws.create()
        await ws.write("kept.txt", "kept\n")
        version = ws.last_version

        first = await executor_process(quill, tmp_path / "executor")
        try:
            writing = asyncio.Event()
            run = asyncio.create_task(
                ws.exec(
                    "for i in $(seq 1000); do echo $i > f$i; echo $i; sleep 0.02; done",
                    timeout_ms=60_000,
                    on_output=lambda *_: writing.set(),
                )
            )
            await asyncio.wait_for(writing.wait(), 30)
            os.killpg(first.pid, signal.SIGKILL)
            with pytest.raises(QuillError) as info:
                await asyncio.wait_for(run, 30)
            assert info.value.code == ErrorCode.UNAVAILABLE
            assert "stopped answering" in info.value.message
        finally:
            if first.returncode is None:
                os.killpg(first.pid, signal.SIGKILL)
            await first.wait()

        # No half change set: the workspace is as it was.
        info_ = await ws.info()
        assert info_.version == version and info_.files == 1

        second = await executor_process(quill, tmp_path / "executor")
        try:
            listing = await ws.exec("ls")
            assert listing.stdout == "kept.txt\n"  # the dirty checkout was rebuilt
            assert not listing.changes.committed
        finally:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 30) == 0
