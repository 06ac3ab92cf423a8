"""An executor killed (SIGKILL) in the middle of a command: its caller gets an error within
seconds, nothing of the command is committed, the sandbox dies with it, and the next
executor on the same data directory rebuilds the checkout from the log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import nats.errors
import pytest

from contracts.errors import ErrorCode, QuillError
from infra.exec.sandbox import bwrap_path
from quill.client import Quill
from tests.helpers import (
    eventually,
    need_bwrap,
    start_writer_and_reader,
)


async def executor_process(quill: Quill, data: Path) -> asyncio.subprocess.Process:
    """``quill executor`` as its own process, once it answers."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "quill", "executor", "--nats-url", quill.nc.connected_url.geturl(),
        "--data", str(data), "--sandbox", "bwrap", start_new_session=True,
    )  # fmt: skip

    async def answers() -> bool:
        assert process.returncode is None, "the executor exited"
        await quill.nc.request("ws.sys.ping.executor", b"", timeout=0.5)
        return True

    await eventually(answers, 30, "the executor answering", ignoring=(nats.errors.Error,))
    return process


async def test_an_executor_killed_mid_command(nats_url: str, tmp_path: Path) -> None:
    need_bwrap()
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)
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


async def _sandbox(over: Path, *, blocked: bool) -> asyncio.subprocess.Process:
    """A real bwrap sandbox over ``over`` as a killed executor leaves one: waiting for the
    user-namespace map no one will write (``blocked``), or running a command with no parent
    death signal armed."""
    over.mkdir(parents=True)
    wait_r, wait_w = os.pipe()
    info = os.open(os.devnull, os.O_WRONLY)
    argv = [str(bwrap_path()), "--unshare-all", "--unshare-user", "--ro-bind", "/", "/"]
    argv += ["--bind", str(over), "/tmp", "--new-session"]
    argv += ["--info-fd", str(info), "--userns-block-fd", str(wait_r)] if blocked else []
    command = ["sh", "-c", "echo up; exec sleep 600"]
    process = await asyncio.create_subprocess_exec(
        *argv, "--", *command, pass_fds=(wait_r, info), stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    os.close(wait_r)
    os.close(info)
    _held.append(wait_w)  # never written, never closed before the test ends
    return process


_held: list[int] = []


def _in_namespace_of(pid: int) -> list[int]:
    """Processes (but ``pid``) in the PID namespace of ``pid``'s child: the sandbox's."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:  # exited
        return []
    if not children:
        return []
    ns = os.stat(f"/proc/{children[0]}/ns/pid").st_ino
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != pid:
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}/ns/pid").st_ino == ns:
                    out.append(int(name))
    return out


async def test_an_executor_kills_the_sandboxes_an_earlier_one_left(
    nats_url: str, tmp_path: Path
) -> None:
    """What an executor SIGKILLed while starting commands left behind (bwrap waiting for its
    user namespace forever, or a sandbox whose parent-death signal was not armed) is killed
    when an executor starts on the same data directory; sandboxes over anything else are not
    touched, and a second executor on a directory in use is refused."""
    need_bwrap()
    data = tmp_path / "executor"
    blocked = await _sandbox(data / "checkouts" / "acme" / "a" / "tree", blocked=True)
    running = await _sandbox(data / "checkouts" / "acme" / "b" / "tree", blocked=False)
    other = await _sandbox(tmp_path / "elsewhere" / "tree", blocked=False)
    quill = await Quill.connect(nats_url)
    executor = None
    try:
        assert running.stdout is not None
        assert await asyncio.wait_for(running.stdout.readline(), 30) == b"up\n"
        inside = _in_namespace_of(running.pid)  # the sandbox's init and its command
        assert inside
        executor = await executor_process(quill, data)
        assert await asyncio.wait_for(blocked.wait(), 30) == -signal.SIGKILL
        assert await asyncio.wait_for(running.wait(), 30) == -signal.SIGKILL
        for pid in inside:  # the command in the sandbox went with it
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
        assert other.returncode is None  # not this executor's

        # The sweep's premise: no other live executor uses the directory.
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "quill", "executor", "--nats-url", nats_url, "--data", str(data),
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(second.communicate(), 60)
        assert second.returncode == 1
        assert err.decode().endswith(f"quill: {data} is in use by another executor\n")
        assert executor.returncode is None
    finally:
        for process in (blocked, running, other):
            if process.returncode is None:
                for pid in _in_namespace_of(process.pid):  # bwrap's kill would spare them
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                process.kill()
                await process.wait()
        if executor is not None:
            executor.send_signal(signal.SIGTERM)
            await executor.wait()
        await quill.close()
        while _held:
            os.close(_held.pop())


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return True
