"""``infra/offload.py`` with real worker processes: a budget per job, turns per tenant (then
busy), a free worker for another tenant, and no work for a client that has stopped waiting."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from core.diffs import unified_many
from core.finding import grep_texts
from infra.offload import CLIENT_DEADLINE, Offload
from tests.helpers import eventually

EVIL = [("evil.txt", ("a" * 40 + "!\n") * 10)]
SLOW = rq.GrepQuery(pattern="(a|aa)+(?=#)")
"""Exponential on a backtracking engine, and no RE2 form: it runs its whole budget."""
QUICK = rq.GrepQuery(pattern="a!")


@pytest.fixture
async def offload() -> AsyncIterator[Offload]:
    pool = Offload("test", workers=4, per_tenant=1, queued_per_tenant=1)
    try:
        yield pool
    finally:
        await pool.close()


async def grep(pool: Offload, tenant: str, query: rq.GrepQuery, budget_s: float) -> object:
    return await pool.run(tenant, grep_texts, query, 10, EVIL, budget_s=budget_s, overtime="slow")


async def test_a_job_runs_in_a_worker_process_that_idles_on_half_the_cpus(
    offload: Offload, monkeypatch: pytest.MonkeyPatch
) -> None:
    """... without the service's credentials."""
    monkeypatch.setenv("QUILL_NATS_PASSWORD", "service-secret")
    part = await grep(offload, "a", QUICK, 10)
    assert part.total == 10  # type: ignore[attr-defined]
    (worker,) = offload._idle
    assert worker.proc.pid != os.getpid()
    assert os.sched_getscheduler(worker.proc.pid) == os.SCHED_IDLE
    cpus = sorted(os.sched_getaffinity(0))
    assert sorted(os.sched_getaffinity(worker.proc.pid)) == cpus[len(cpus) // 2 :]
    environ = Path(f"/proc/{worker.proc.pid}/environ").read_bytes()
    assert b"service-secret" not in environ and b"QUILL_" not in environ


async def test_a_job_past_its_budget_ends_with_its_own_error(offload: Offload) -> None:
    with pytest.raises(QuillError) as info:
        await grep(offload, "a", SLOW, 1)
    assert info.value.code == ErrorCode.TIMEOUT
    assert info.value.message == "Search took too long: narrow the pattern or path"
    with pytest.raises(QuillError) as diff:  # difflib, stopped inside by the worker's alarm
        vocabulary = [f"line {i} " * 3 + "\n" for i in range(150)]
        texts = ["".join(vocabulary[(i * k) % 150] for i in range(20_000)) for k in (7, 11)]
        await offload.run("a", unified_many, [("big", *texts)], 3, budget_s=1, overtime="x")
    assert diff.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    assert diff.value.details["path"] == "big" and diff.value.details["from_lines"] == 20_000


async def test_a_tenant_past_its_turn_and_queue_is_busy_and_another_goes_on(
    offload: Offload,
) -> None:
    running = asyncio.create_task(grep(offload, "b", SLOW, 3))
    queued = asyncio.create_task(grep(offload, "b", SLOW, 3))
    state = offload.info
    await eventually(lambda: (state()["running"], state()["waiting"]) == (1, 1))  # one waits
    with pytest.raises(QuillError) as info:
        await grep(offload, "b", QUICK, 3)
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert info.value.details["queue"] == "tenant_work" and info.value.details["reason"] == "busy"
    mine = await grep(offload, "a", QUICK, 3)  # a's own turn: not behind b's
    assert mine.total == 10 and not running.done()  # type: ignore[attr-defined]
    for task in (running, queued):
        with pytest.raises(QuillError):
            await task


async def test_work_whose_client_has_stopped_waiting_never_starts(offload: Offload) -> None:
    running = asyncio.create_task(grep(offload, "b", SLOW, 3))
    await eventually(lambda: offload.info()["running"] == 1)  # b's one turn is taken
    CLIENT_DEADLINE.set(time.monotonic() + 0.2)
    with pytest.raises(QuillError) as info:
        await grep(offload, "b", QUICK, 3)
    assert not running.done()
    assert info.value.code == ErrorCode.TIMEOUT
    assert info.value.message.endswith("not started")
    # and a running one stops at its client's deadline: before another, without one, that
    # runs its whole (shorter) budget
    CLIENT_DEADLINE.set(None)
    whole = asyncio.create_task(grep(offload, "c", SLOW, 3))
    CLIENT_DEADLINE.set(time.monotonic() + 0.5)
    stopped = asyncio.create_task(grep(offload, "a", SLOW, 10))
    CLIENT_DEADLINE.set(None)
    first, _ = await asyncio.wait({whole, stopped}, return_when=asyncio.FIRST_COMPLETED)
    assert first == {stopped}
    for task in (running, whole, stopped):
        with pytest.raises(QuillError):
            await task
