"""An executor's slots, shared fairly between tenants, with a bounded queue.

An executor runs at most ``total`` requests at once (``--max-runs``). The rule:

* A tenant holds at most its **share**: ``max(1, min(per_tenant, total // n))`` slots, ``n``
  being the tenants holding or waiting for a slot now. ``per_tenant`` defaults to
  ``total - 1``: a tenant alone never takes the last slot, so another tenant's request finds
  one free at once. A tenant over its share (it took them while alone) keeps what runs, and
  gets no more until it is under its share again: running commands are never preempted.
* A request that cannot start waits in its tenant's FIFO queue, at most ``queue`` requests per
  tenant, ``max_waiting`` of all tenants together, and at most ``wait_s`` seconds (the
  executor keeps announcing it alive meanwhile). Past any: the busy answer (``UNAVAILABLE``,
  ``details.reason == "busy"``, queue ``tenant_runs``, ``runs`` or ``slot_wait``, with
  ``retry_after_ms``), which the SDK retries, perhaps elsewhere.
* A free slot goes to the waiting tenant holding the fewest slots (ties: the request waiting
  longest), among those under their share.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal

from contracts.errors import QuillError
from contracts.limits import EXECUTOR_MAX_WAITING, EXECUTOR_RETRY_AFTER_MS
from infra.busy import refused


@dataclass(eq=False)
class Ticket:
    """One request's place: waiting for a slot, holding one, or done."""

    tenant: str
    seq: int
    state: Literal["waiting", "running", "done"] = "waiting"
    granted: asyncio.Event = field(default_factory=asyncio.Event)


class Slots:
    def __init__(
        self,
        total: int,
        per_tenant: int | None,
        queue: int,
        wait_s: float,
        max_waiting: int = EXECUTOR_MAX_WAITING,
    ) -> None:
        self.max_waiting = max_waiting
        self.total = max(1, total)
        self.per_tenant = max(1, per_tenant if per_tenant is not None else self.total - 1)
        self.queue, self.wait_s = queue, wait_s
        self.held: Counter[str] = Counter()
        self.queues: dict[str, deque[Ticket]] = {}
        self._seq = itertools.count()

    @property
    def running(self) -> int:
        return sum(self.held.values())

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def share(self) -> int:
        """The most slots one tenant may take now."""
        active = {t for t, n in self.held.items() if n} | set(self.queues)
        return max(1, min(self.per_tenant, self.total // max(1, len(active))))

    def join(self, tenant: str) -> Ticket:
        """A request of ``tenant`` arrives: its ticket, granted a slot at once if it may.

        Raises:
            QuillError: ``UNAVAILABLE`` when its tenant's queue is full.
        """
        ticket = Ticket(tenant, next(self._seq))
        queue = self.queues.setdefault(tenant, deque())
        queue.append(ticket)
        self._dispatch()
        if ticket.state == "waiting" and (
            len(queue) > self.queue or self.waiting > self.max_waiting
        ):
            over = len(queue) > self.queue
            self._drop(ticket)
            self._dispatch()  # without it, the others' share may have grown
            if over:
                raise self._busy(
                    tenant, "tenant_runs", f"{len(queue)} of tenant {tenant!r} waiting"
                )
            raise self._busy(tenant, "runs", f"{self.waiting} waiting")
        return ticket

    async def wait(self, ticket: Ticket) -> None:
        """Until ``ticket`` holds a slot.

        Raises:
            QuillError: ``UNAVAILABLE`` after ``wait_s`` without one (``leave`` still to call).
        """
        try:
            await asyncio.wait_for(ticket.granted.wait(), self.wait_s)
        except TimeoutError:
            if ticket.state != "running":
                why = f"no slot in {self.wait_s:g} s"
                raise self._busy(ticket.tenant, "slot_wait", why) from None

    def leave(self, ticket: Ticket) -> None:
        """The request is answered (or gave up): its slot, or its place, goes to the next."""
        if ticket.state == "running":
            self.held[ticket.tenant] -= 1
            if self.held[ticket.tenant] <= 0:
                del self.held[ticket.tenant]
        elif ticket.state == "waiting":
            self._drop(ticket)
        ticket.state = "done"
        self._dispatch()

    def _dispatch(self) -> None:
        while self.running < self.total:
            share = self.share()
            ready = [q[0] for t, q in self.queues.items() if self.held[t] < share]
            if not ready:
                return
            first = min(ready, key=lambda t: (self.held[t.tenant], t.seq))
            self._drop(first)
            self.held[first.tenant] += 1
            first.state = "running"
            first.granted.set()

    def _drop(self, ticket: Ticket) -> None:
        queue = self.queues.get(ticket.tenant)
        if queue is not None and ticket in queue:
            queue.remove(ticket)
            if not queue:
                del self.queues[ticket.tenant]

    def _busy(self, tenant: str, queue: str, why: str) -> QuillError:
        return refused(
            "executor",
            queue,
            f"The executor ({self.running} requests running, {why})",
            EXECUTOR_RETRY_AFTER_MS,
            running=self.running,
            waiting=self.waiting,
            tenant=tenant,
        )
