"""``infra.loops.Loop``: a background loop ends when stopped even when its step turns the
cancellation into another error (as nats-py may), reports failed steps and goes on, and
turns at once when woken."""

from __future__ import annotations

import asyncio

import pytest

from infra.loops import Loop


async def test_a_step_that_swallows_its_cancellation_still_ends_the_loop() -> None:
    entered = asyncio.Event()
    failures: list[Exception] = []

    async def step() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise TimeoutError("nats: timeout") from None  # what nats-py may do

    loop = Loop("swallowing", step, woken=True, failed=failures.append)
    loop.start()
    await asyncio.wait_for(entered.wait(), 5)
    await loop.stop(timeout=30)
    assert loop._task is not None and loop._task.done()
    assert failures == []  # not taken for a failed turn


async def test_a_failed_step_is_reported_and_the_next_turn_comes() -> None:
    turns: list[int] = []
    failures: list[Exception] = []
    second = asyncio.Event()

    async def step() -> None:
        turns.append(len(turns))
        if len(turns) == 1:
            raise RuntimeError("first turn fails")
        second.set()

    loop = Loop("failing", step, every=0.01, failed=failures.append)
    loop.start()
    await asyncio.wait_for(second.wait(), 5)
    await loop.stop()
    assert [str(f) for f in failures] == ["first turn fails"]
    assert turns[:2] == [0, 1]


async def test_a_woken_loop_turns_at_once_and_an_unwoken_one_waits() -> None:
    turned = asyncio.Queue[None]()

    async def step() -> None:
        turned.put_nowait(None)

    loop = Loop("woken", step, every=3600, woken=True, wait_first=True, failed=print)
    loop.start()
    await asyncio.sleep(0)
    assert turned.empty()  # waits first, and an hour between turns
    loop.wake()
    await asyncio.wait_for(turned.get(), 5)
    await loop.stop()


def test_a_loop_with_neither_period_nor_wake_up_is_refused() -> None:
    async def step() -> None: ...

    with pytest.raises(ValueError, match="neither a period nor a wake-up"):
        Loop("idle", step, failed=print)
