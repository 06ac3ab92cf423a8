"""The executor's slots (services/executor/slots.py): each tenant's share, the order waiting
requests get slots in, the queue's bound and wait."""

from __future__ import annotations

import pytest

from contracts.errors import ErrorCode, QuillError
from services.executor.slots import Slots, Ticket


def running(tickets: list[Ticket]) -> list[bool]:
    return [t.state == "running" for t in tickets]


async def test_a_tenant_alone_leaves_one_slot_for_the_others() -> None:
    slots = Slots(4, None, queue=8, wait_s=1)
    a = [slots.join("a") for _ in range(5)]
    assert running(a) == [True, True, True, False, False]
    b = slots.join("b")  # the slot a could not take
    assert b.state == "running" and slots.running == 4
    # with b active, a's share is 4 // 2 = 2: a slot a frees stays free for b
    slots.leave(a[0])
    assert running(a)[3:] == [False, False] and slots.running == 3
    slots.leave(b)  # a alone again: its share is 3
    assert running(a)[3:] == [True, False]


async def test_a_free_slot_goes_to_the_waiting_tenant_holding_fewest() -> None:
    slots = Slots(3, 3, queue=8, wait_s=1)
    a = [slots.join("a") for _ in range(3)]  # all three (per_tenant=3), while alone
    b1, c1, b2 = slots.join("b"), slots.join("c"), slots.join("b")
    assert running([b1, c1, b2]) == [False, False, False]
    slots.leave(a[0])  # b and c hold none; b waited longest
    assert running([b1, c1, b2]) == [True, False, False]
    slots.leave(a[1])  # c holds none, b one
    assert running([b1, c1, b2]) == [True, True, False]
    slots.leave(a[2])  # share 1 each: b's second waits though a slot is free
    assert running([b1, c1, b2]) == [True, True, False] and slots.running == 2
    slots.leave(c1)  # b alone: its share is 3
    assert b2.state == "running"


async def test_past_its_queue_a_tenant_is_refused_others_are_not() -> None:
    slots = Slots(1, None, queue=1, wait_s=1)
    first, waiting = slots.join("a"), slots.join("a")
    with pytest.raises(QuillError) as info:
        slots.join("a")
    assert info.value.code == ErrorCode.UNAVAILABLE and "busy" in info.value.message
    assert slots.join("b").state == "waiting"  # b's own queue has room
    assert (first.state, waiting.state, slots.waiting) == ("running", "waiting", 2)


async def test_a_request_waits_at_most_wait_s() -> None:
    slots = Slots(1, None, queue=4, wait_s=0.05)
    slots.join("a")
    late = slots.join("b")
    with pytest.raises(QuillError) as info:
        await slots.wait(late)
    assert info.value.code == ErrorCode.UNAVAILABLE and "no slot in 0.05 s" in info.value.message
    slots.leave(late)
    assert slots.waiting == 0 and slots.running == 1


async def test_a_granted_ticket_returns_at_once() -> None:
    slots = Slots(2, None, queue=4, wait_s=0.05)
    ticket = slots.join("a")
    await slots.wait(ticket)
    slots.leave(ticket)
    assert slots.running == 0 and slots.held == {}


async def test_waiting_requests_of_all_tenants_together_are_bounded_and_answered_busy() -> None:
    """Without ``--tenants`` a tenant is any name: one per request would make each tenant's
    queue short and their sum unbounded."""
    slots = Slots(1, 1, queue=8, wait_s=1, max_waiting=3)
    first = slots.join("t0")
    waiting = [slots.join(f"t{i}") for i in range(1, 4)]
    assert first.state == "running" and slots.waiting == 3
    with pytest.raises(QuillError) as refused:
        slots.join("t4")
    details = refused.value.details
    assert refused.value.code == ErrorCode.UNAVAILABLE and refused.value.retriable
    assert (details["reason"], details["queue"], details["retry_after_ms"]) == (
        "busy",
        "runs",
        1000,
    )
    assert slots.waiting == 3 and "t4" not in slots.queues
    slots.leave(first)
    assert waiting[0].state == "running"
