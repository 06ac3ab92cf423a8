"""An executor's metrics, with each sandbox: slots busy and requests queued per tenant while a
command runs and another waits, a command killed at its timeout counted ``why="timeout"``,
the checkouts' bytes, and the requests of kind ``exec``."""

from __future__ import annotations

import asyncio

from quill.client import Quill
from tests.executor.conftest import StartExecutor
from tests.metrics_scrape import scrape, scraped


async def test_slots_queue_kills_and_checkout_bytes(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    await stack(max_runs=1)  # one slot: a second command of the tenant waits for it
    tenant = name.split("/")[0]
    first, second = quill.workspace(name), quill.workspace(f"{name}-2")
    for ws in (first, second):
        await ws.create()
        await ws.write("data.txt", "x" * 10_000)
    before = scrape()
    started = asyncio.Event()

    def on_output(stream: str, chunk: bytes) -> None:
        if b"started" in chunk:
            started.set()

    running = asyncio.create_task(
        first.exec("echo started; sleep 60", timeout_ms=5000, on_output=on_output)
    )
    await asyncio.wait_for(started.wait(), 30)
    busy = scrape()
    assert busy.value("quill_executor_slots_busy", tenant=tenant) == 1
    assert busy.value("quill_executor_checkout_bytes") >= 10_000
    waiting = asyncio.create_task(second.exec("echo second"))
    await scraped(lambda s: s.value("quill_executor_queued", tenant=tenant) == 1)
    result = await running
    assert result.timed_out
    assert (await waiting).stdout == "second\n"
    after = await scraped(lambda s: s.value("quill_executor_slots_busy", tenant=tenant) == 0)
    assert after.value("quill_executor_queued", tenant=tenant) == 0
    assert after.grew(before, "quill_executor_sandbox_kills_total", why="timeout") == 1
    ran = after.grew(
        before, "quill_requests_total", service="executor", kind="exec", op="run", outcome="ok"
    )
    assert ran == 2
    assert after.grew(before, "quill_request_seconds_count", service="executor", op="run") == 2


async def test_live_commands_and_shells_per_tenant(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    """Issue 32, item 7: every background process and shell is in the metrics."""
    await stack()
    tenant = name.split("/")[0]
    ws = quill.workspace(name)
    await ws.create()
    live = await ws.exec("sleep 60", yield_ms=0, timeout_ms=120_000)
    assert live.running
    shell = await ws.shell()
    both = await scraped(
        lambda s: (
            s.value("quill_executor_live_commands", tenant=tenant) == 1
            and s.value("quill_executor_shells", tenant=tenant) == 1
        )
    )
    assert both.value("quill_executor_shells", tenant=tenant) == 1
    await ws.command(live.command_id).signal("KILL")
    await shell.close()
    await scraped(
        lambda s: (
            s.value("quill_executor_live_commands", tenant=tenant) == 0
            and s.value("quill_executor_shells", tenant=tenant) == 0
        )
    )
