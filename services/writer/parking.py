"""Commands of a workspace that wait, and approved requests carried out.

:class:`Parking` keeps aside the commands refused for another session's lock or waiting for
their approval, until the lock goes (or the approval is decided) or their wait runs out; the
actor then decides them again, first (``WorkspaceActor._unpark``). :class:`Carrier` carries
out what was approved: a mutation taken in again as if its client had sent it, a command
handed to the executors (``infra/approvals.py`` keeps the request and its outcome).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from contracts import codec
from contracts import ops as registry
from contracts.errors import ErrorCode, QuillError
from contracts.limits import RETRY_AFTER_MS
from contracts.ops import OpSpec
from contracts.subjects import Address, Origin
from core.evolve import WorkspaceState
from infra import approvals as kept_requests
from infra.approvals import Parked
from infra.busy import refused
from services.writer.pending import Pending, Site

log = logging.getLogger("quill.writer")


class Parking:
    """The commands of one workspace waiting for a lock to go (or an approval to come)."""

    def __init__(self, site: Site, unpark: Callable[[], None]) -> None:
        self.site = site
        self.parked: list[Pending] = []
        """Commands waiting for another session's lock to go (decided again when it does)."""
        self._wake: asyncio.TimerHandle | None = None
        self._unpark = unpark
        """Called when they are to be decided again (``take``)."""

    def __len__(self) -> int:
        return len(self.parked)

    def park(self, p: Pending, error: QuillError, state: WorkspaceState) -> bool:
        """Keep ``p`` aside until the lock that refused it goes (or its approval is decided)
        or its wait runs out."""
        waits = (ErrorCode.LOCKED, ErrorCode.APPROVAL_REQUIRED)
        if error.code not in waits or time.perf_counter() >= p.wait_until:
            return False
        if error.details.get("approval_id", p.origin.request_id) != p.origin.request_id:
            return False  # another request's approval (the same asked again): told its id
        if len(self.parked) >= self.site.deps.backlog.parked_per_workspace:
            return False
        self.parked.append(p)
        self.schedule(state)
        return True

    def no_room(self, p: Pending, error: QuillError) -> QuillError:
        """``error``, or busy when ``p`` would wait for the lock but as many commands wait
        already as may (``parked_per_workspace``): the client retries after the hint."""
        bound = self.site.deps.backlog.parked_per_workspace
        if error.code != ErrorCode.LOCKED or len(self.parked) < bound:
            return error
        if time.perf_counter() >= p.wait_until:
            return error
        what = f"Workspace {self.site.tenant}/{self.site.workspace}"
        return refused("writer", "workspace_waiting", what, RETRY_AFTER_MS, limit=bound)

    def schedule(self, state: WorkspaceState) -> None:
        """Wake the parked commands at the first deadline or when the lock expires."""
        if not self.parked:
            return
        delay = min(p.wait_until for p in self.parked) - time.perf_counter()
        now = datetime.now(UTC)
        lock = state.controls.lock
        if lock is not None:
            delay = min(delay, (lock.expires - now).total_seconds())
        for p in self.parked:  # one waiting for its approval is told when it expires
            approval = state.controls.approval(p.origin.request_id)
            if approval is not None and approval.expires is not None:
                delay = min(delay, (approval.expires - now).total_seconds())
        if self._wake is not None:
            self._wake.cancel()
        self._wake = asyncio.get_running_loop().call_later(max(delay, 0.0) + 0.001, self._unpark)

    def take(self) -> list[Pending]:
        """The parked commands (first, in the order they came), to be decided again."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        parked, self.parked = self.parked, []
        return parked

    async def abandon(self, answer: Callable[..., Awaitable[None]]) -> None:
        """Answer the parked commands (the writer is stopping): retry elsewhere."""
        if self._wake is not None:
            self._wake.cancel()
        parked, self.parked = self.parked, []
        error = QuillError(
            ErrorCode.UNAVAILABLE, "The writer is stopping or handing the workspace over; retry"
        )
        for p in parked:  # an approved request's outcome is not this: the next load resumes it
            p.carrying = False
            await answer(p, codec.error_reply(error), error=error)


class Carrier:
    """The approved requests of one workspace being carried out."""

    def __init__(
        self,
        site: Site,
        submit: Callable[[Pending], bool],
        holds: Callable[[str], bool],
        state: Callable[[], WorkspaceState | None],
    ) -> None:
        self.site = site
        self._submit = submit
        """Takes a request in, as ``WorkspaceActor.submit``."""
        self._holds = holds
        """Whether a request id is held by the actor (queued, in flight or parked)."""
        self._state = state
        self.carrying: set[asyncio.Task[None]] = set()
        """Approved requests being taken in or handed to the executors (``carry``)."""
        self._carried: set[str] = set()
        """Their approval ids."""

    def carry_out(self, state: WorkspaceState, approval_id: str) -> None:
        """Carry out the request of ``approval_id``, just approved, unless its client waits
        for it here (parked: decided again now, as the approved request it is) or it is
        being carried out already."""
        approval = state.controls.approval(approval_id)
        if approval is None or self._holds(approval_id) or approval_id in self._carried:
            return
        task = asyncio.create_task(self.carry(approval_id, approval.op, approval.digest))
        self.carrying.add(task)
        self._carried.add(approval_id)

        def done(_: asyncio.Task[None]) -> None:
            self.carrying.discard(task)
            self._carried.discard(approval_id)

        task.add_done_callback(done)

    async def resume_approved(self, state: WorkspaceState) -> None:
        """On a load: carry out the approvals decided approved whose outcome is not kept (the
        writer that committed the decision stopped before it carried it out, or before its
        outcome was kept). Once only: a mutation's request id answers a repeat with what it
        committed (and keeps that as the outcome); a command's claim runs it once."""
        tenant, workspace = self.site.tenant, self.site.workspace
        approved = [
            k for k, a in (state.controls.approvals or {}).items() if a.approved and not a.expired
        ]
        if not approved:
            return
        try:
            unfinished = await self.site.deps.approvals.unfinished(tenant, workspace)
        except Exception as exc:  # the next load looks again
            log.warning("%s/%s: approvals not looked at: %r", tenant, workspace, exc)
            return
        tokens = unfinished.get((tenant, workspace), set())
        for approval_id in approved:
            if approval_id.replace(".", "_") in tokens:
                log.info("%s/%s: carrying out approval %s (approved, not done)", tenant,
                         workspace, approval_id)  # fmt: skip
                self.carry_out(state, approval_id)

    async def carry(self, approval_id: str, op: str, body: str | None) -> None:
        """Take the kept request of ``approval_id`` in as if its client had sent it again
        (a mutation), or hand it to the executors (a command: ``dispatch``)."""
        deps = self.site.deps
        t, w, approvals = self.site.tenant, self.site.workspace, deps.approvals
        try:
            parked = await approvals.parked(t, w, approval_id, body)
            if parked is None or parked.op != op:
                error = QuillError(
                    ErrorCode.FILE_NOT_FOUND,
                    f"The request of approval {approval_id} is not kept any more: send it again",
                    {"approval_id": approval_id},
                )
                await approvals.record(t, w, approval_id, error=error)
                return
            spec = registry.OPS[parked.op]
            if spec.kind == "exec":
                await self.dispatch(approval_id, spec, parked)
                return
            request = codec.decode_request(spec, parked.body)
            origin = Origin.from_headers(parked.headers)
            subject = deps.subjects.cmd(t, w, spec.name)
            msg = Msg(deps.nc, subject=subject, data=parked.body, headers=parked.headers)
            address = Address("cmd", t, w, spec.name)
            if self._submit(Pending(address, spec, request, origin, msg, carrying=True)):
                deps.backlog.queued += 1
                deps.backlog.bytes += len(parked.body)
        except Exception as exc:
            log.exception("%s/%s: carrying out approval %s failed", t, w, approval_id)
            error = QuillError(ErrorCode.INTERNAL, f"Carrying it out failed: {exc!r}")
            await approvals.record(t, w, approval_id, error=error)

    async def dispatch(self, approval_id: str, spec: OpSpec, parked: Parked) -> None:
        """Send an approved command to the executors as its client sent it (one of them runs
        it, once: ``infra/approvals.py``'s claim, and keeps its outcome); what refuses it
        before it runs (no executor, busy, the workspace archived) is kept as its outcome."""
        deps = self.site.deps
        t, w = self.site.tenant, self.site.workspace
        subject = deps.subjects.exec(t, w, spec.name)
        state = self._state()
        limit_s = (state.limits.max_exec_ms if state is not None else 600_000) / 1000
        kept, within_s = deps.approvals, limit_s + kept_requests.CLAIM_GRACE_S
        try:
            msg = await deps.nc.request(
                subject, parked.body, timeout=within_s, headers=parked.headers
            )
        except nats.errors.NoRespondersError:
            error = QuillError(ErrorCode.UNAVAILABLE, "No executor is running to carry it out")
            await kept.record(t, w, approval_id, error=error)
            return
        except nats.errors.TimeoutError:  # no answer past its longest run
            if await kept.settled(deps.nc, t, w, approval_id, limit_s) is None:
                error = QuillError(
                    ErrorCode.UNAVAILABLE,
                    f"No executor took approved command {approval_id} in time: send it again",
                    {"approval_id": approval_id},
                )
                await kept.record(t, w, approval_id, error=error, first=True)
            return  # else its outcome is kept (or its executor was lost: kept so)
        try:
            codec.decode_reply(msg.data, dict[str, Any])
        except QuillError as error:  # refused before it ran (or taken by another already)
            if not error.details.get("claimed"):
                await deps.approvals.record(t, w, approval_id, error=error)
