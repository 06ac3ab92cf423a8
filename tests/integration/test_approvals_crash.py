"""Approvals survive the death of the process carrying them out (docs/operations.md,
"Approvals and crashes"): a writer killed between committing ``approval_decided`` and carrying
the request out leaves it to the next writer, which carries it out once at its start, without
a command to the workspace; an executor killed after claiming an approved command leaves the
outcome ``EXECUTION_FAILED`` (executor lost), not "approved, not done" forever.

The writer is a real process (``python -m quill writer``) killed by ``SIGKILL``. Its window is
made deterministic from the test's side, not by a hook in Quill: the process is started through
a launcher that replaces ``WorkspaceActor._carry_out`` with "flush the reply, then SIGKILL
this process" (and its start-up resume with nothing, as the writer was before it had one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import nats.errors
import pytest
from nats.js.errors import NotFoundError

from contracts.limits import LimitsPatch
from contracts.subjects import STREAM_APPROVALS, Subjects
from infra import approvals, bus
from quill.client import Quill
from services.executor.app import ExecutorConfig
from tests.helpers import (
    eventually,
    parked,
    restricted_for_commands,
    start_executor,
    start_reader,
    start_writer,
    start_writer_and_reader,
)
from tests.system.test_tenants import descendants

CRASHING_WRITER = """
import asyncio, os, signal, sys
from services.writer.workspace import WorkspaceActor

async def die(nc):
    await nc.flush()  # the approver's answer is out: then the process dies
    os.kill(os.getpid(), signal.SIGKILL)

def crash(self, state, approval_id):
    asyncio.ensure_future(die(self.deps.nc))

async def nothing(self, state):
    return None

WorkspaceActor._carry_out = crash
WorkspaceActor._resume_approved = nothing
sys.argv = ["quill", *sys.argv[1:]]
from quill_cli.cli import main
main()
"""


@contextlib.contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` as a process of its own (its output in ``log``), killed with its children
    when the block ends if it is still running."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        for pid in [*descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(30)


async def serving(nats_url: str, service: str, timeout: float = 60.0) -> None:
    """Wait until some ``service`` answers a ping."""
    nc = await bus.connect(nats_url, "test-readiness")

    async def answers() -> bool:
        msg = await nc.request(f"ws.sys.ping.{service}", b"", timeout=0.5)
        return bool(msg.data and json.loads(msg.data).get("instance"))

    try:
        no_answer = (nats.errors.TimeoutError, nats.errors.NoRespondersError)
        await eventually(answers, timeout, f"a {service} answers a ping", ignoring=no_answer)
    finally:
        await nc.close()


async def test_a_writer_killed_after_the_decision_leaves_it_to_the_next(
    nats_url: str, tmp_path: Path
) -> None:
    crashing = [sys.executable, "-c", CRASHING_WRITER, "writer", "--nats-url", nats_url]
    async with AsyncExitStack() as stack:
        await start_reader(stack, nats_url, tmp_path / "reader")
        await start_executor(stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
        agent = await Quill.connect(nats_url, actor="agent-7", session="s-1", retries=0)
        human = await Quill.connect(nats_url, actor="alice", timeout=30)
        stack.push_async_callback(agent.close)
        stack.push_async_callback(human.close)
        ws, desk = agent.workspace("acme/crash"), human.workspace("acme/crash")
        decided: list[str] = []
        for n, kind in enumerate(("change", "command")):
            argv = [*crashing, "--data", str(tmp_path / f"w{n}")]
            with process(argv, tmp_path / f"w{n}.log") as writer:
                await serving(nats_url, "writer")
                if n == 0:
                    await ws.create(trust="restricted")
                    await ws.set_trust("restricted", commands=True)
                    change = await parked(ws.write("plan.md", "the plan\n"))
                    command = await parked(ws.exec("echo ran >> ran.txt; echo done"))
                await desk.approve(change if kind == "change" else command)
                decided.append(kind)
                assert await asyncio.to_thread(writer.wait, 60) == -signal.SIGKILL
            for approval_id in (change, command)[: len(decided)]:
                status = await desk.approval(approval_id)
                assert (status.state, status.done) == ("approved", False), status

        await start_writer(stack, nats_url, tmp_path / "w-next")  # no command to acme/crash
        done = await ws.wait_approval(change, timeout=30)
        assert done.done and done.outcome is not None and done.outcome.error is None, done
        assert done.outcome.version is not None
        ran = await ws.wait_approval(command, timeout=60)
        assert ran.done and ran.outcome is not None and ran.outcome.result is not None, ran
        assert (ran.outcome.result["exit_code"], ran.outcome.result["stdout"]) == (0, "done\n")
        assert await desk.read_text("plan.md") == "the plan\n"
        assert await desk.read_text("ran.txt") == "ran\n"  # once

        # another writer after it: nothing is carried out twice
        await start_writer(stack, nats_url, tmp_path / "w-after")
        again = await ws.approval(command)
        assert again.outcome == ran.outcome
        assert len((await desk.history("plan.md")).revisions) == 1
        assert await desk.read_text("ran.txt") == "ran\n"


async def test_an_executor_killed_after_its_claim_is_told_lost(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor that took an approved command dies while it runs: past the command's
    longest run (and ``CLAIM_GRACE_S``, shortened here) its outcome is ``EXECUTION_FAILED``
    (lost), what it did is not committed, and it can be asked again."""
    monkeypatch.setattr(approvals, "CLAIM_GRACE_S", 1.0, raising=False)
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)
        ws, desk = await restricted_for_commands(
            stack, nats_url, "acme/lost", limits=LimitsPatch(max_exec_ms=8000), human_timeout=30
        )
        argv = [sys.executable, "-m", "quill", "executor", "--nats-url", nats_url]
        argv += ["--data", str(tmp_path / "x1"), "--sandbox", "local"]
        with process(argv, tmp_path / "x1.log") as executor:
            await serving(nats_url, "executor")
            approval_id = await parked(ws.exec("echo half > half.txt; sleep 30"))
            await desk.approve(approval_id)
            js, claim = (
                desk.client.nc.jetstream(),
                Subjects().approval("acme", "lost", approval_id, "claim"),
            )
            await eventually(  # the executor took it, and runs it
                lambda: js.get_last_msg(STREAM_APPROVALS, claim, direct=True),
                30,
                "the executor's claim of the approval",
                ignoring=(NotFoundError,),
            )
            for pid in [*descendants(executor.pid), executor.pid]:
                os.kill(pid, signal.SIGKILL)
        lost = await ws.wait_approval(approval_id, timeout=60)
        assert lost.done and lost.outcome is not None and lost.outcome.error is not None, lost
        assert lost.outcome.error.code == "EXECUTION_FAILED"
        assert lost.outcome.error.details["lost"] is True
        assert "executor lost" in lost.outcome.error.message
        assert (await desk.list(".")).entries == []  # nothing of it was committed
        await start_executor(stack, nats_url, tmp_path / "x2", ExecutorConfig(sandbox="local"))
        again = await parked(ws.exec("echo half > half.txt; sleep 30"))
        assert again != approval_id  # asked again: a new approval
