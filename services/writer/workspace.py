"""One workspace inside the writer: its queue of commands, its decisions, its commits.

Commands for a workspace are decided strictly in arrival order by a single task, each against
the state the ones before it leave (so commands that do not depend on each other, appends to
one file or edits of different parts of it, all commit: no ``CONFLICT``, no client retry).
What queues is decided as one group (each command still gets its own event, version and
reply) and handed to the appender, which commits it together with other workspaces' groups.
While a group of changes is in flight, what arrives is decided at once into the next group,
chained to it (``Group.after``: sent the moment the first is acknowledged, with its last
sequence as the CAS), so a hot workspace's log never waits for the decisions or the answers
(issue 29). An answer decided on changes not yet acknowledged (a refusal, a no-op after them)
waits for them. The state is loaded lazily from the projection and caught up from the log, so
a writer that crashed, or one taking over a workspace, starts from the truth. Any failed or
uncertain append drops the state, and the group and those chained to it are decided again
from the log; requests whose events turn out to be committed get their first reply back.

This module is the state machine (queue → decide → append → answer, and the reload that
undoes a failed append). Its helpers are given the workspace (``pending.Site``), never the
actor, and own their part of its state: the recent results for idempotent retries
(``results.py``), the commands waiting for a lock or an approval and the approved requests
carried out (``parking.py``), asking for approval (``approvals.py``), what a decision reads
(``context.py``), compaction (``compaction.py``), loading and purging (``lifecycle.py``).
Decisions are ``core``'s, the fold ``core/evolve.py``, the append ``append.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable
from functools import partial
from typing import TypeVar

import nats.errors

from contracts import codec, hashing
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import (
    ApprovalDecided,
    ApprovalRequested,
    LockReleased,
    WorkspaceEvent,
    WorkspaceForked,
    WorkspacePurged,
)
from contracts.limits import MAX_MESSAGE_BYTES, RETRY_AFTER_MS, WRITER_MAX_RETRIES_WAITING
from core.decide import decide
from core.decision import Context, Decision, to_event
from core.evolve import WorkspaceState, evolve
from infra import blobs, logfields, storage, tracing
from infra.bus import respond
from infra.busy import refused
from infra.entry import reply_headers
from services.writer import approvals, context, forks, lifecycle
from services.writer.append import AppendError, Group
from services.writer.approvals import awaiting
from services.writer.compaction import Compaction
from services.writer.deps import Deps
from services.writer.parking import Carrier, Parking
from services.writer.partitions import Fence
from services.writer.pending import (
    MAX_GROUP,
    Flight,
    Held,
    Pending,
    Site,
    Staged,
    named_paths,
    traced,
    unexpected,
)
from services.writer.results import Results, notify, record

log = logging.getLogger("quill.writer")
_T = TypeVar("_T")

__all__ = ["Pending", "WorkspaceActor"]

ATTEMPTS = 3
EVENT_HEADROOM = 64 * 1024


class WorkspaceActor:
    """One workspace's state and queue; everything else it uses comes in ``deps``."""

    def __init__(
        self, deps: Deps, tenant: str, workspace: str, partition: int | None = None
    ) -> None:
        self.deps = deps
        self.tenant, self.workspace = tenant, workspace
        self.partition = partition
        """On a cluster: the command partition the workspace maps to."""
        self.fence: Fence | None = None
        """The partition epoch the state was loaded under; every append is fenced on it."""
        self.subject = deps.subjects.evt(tenant, workspace)
        self.blobs = deps.blobs.of(tenant, workspace)
        """The workspace's own contents in WS_BLOBS (backed by the projection)."""
        self.site = Site(deps, tenant, workspace, self.subject, self.blobs)
        self.state: WorkspaceState | None = None
        self._queue: list[Pending] = []
        self._inflight: dict[str, Pending] = {}
        self.results = Results(deps.store, tenant, workspace)
        """Its recent results by request id (idempotent retries)."""
        self._task: asyncio.Task[None] | None = None
        self.parking = Parking(self.site, self._unpark)
        """Commands waiting for another session's lock to go (decided again when it does)."""
        self.carrier = Carrier(self.site, self.submit, self._inflight.__contains__, self._state)
        """Approved requests being carried out."""
        self.compaction = Compaction(self.site)
        self._arrival: asyncio.Future[None] | None = None
        """Set while the actor waits for its group in flight or a command, whichever first."""
        self._resuming = False
        """``resume`` asked for a load."""
        self._fork_of: str | None = None
        """While its purge is decided and appended: the workspace's source, if it is a fork."""

    @property
    def waiting(self) -> int:
        """Commands parked until a lock goes (or an approval comes)."""
        return len(self.parking)

    @property
    def depth(self) -> int:
        """Commands accepted and not yet answered (its queue, in flight, parked)."""
        return len(self._inflight)

    @property
    def idle(self) -> bool:
        return (
            self._task is None
            and not self._queue
            and not self.parking.parked
            and not self.carrier.carrying
        )

    @property
    def queued(self) -> int:
        """Commands held: queued, being decided or appended, or parked."""
        return len(self._inflight)

    def _state(self) -> WorkspaceState | None:
        return self.state

    def submit(self, pending: Pending) -> bool:
        """Queue ``pending``; False when it joined an identical request already queued.

        Raises:
            QuillError: busy (``UNAVAILABLE``) when that request has ``WRITER_MAX_RETRIES_WAITING``
                copies waiting already.
        """
        first = self._inflight.get(pending.origin.request_id)
        if first is not None:
            if len(first.retries) >= WRITER_MAX_RETRIES_WAITING:
                raise refused(
                    "writer",
                    "request_retries",
                    f"Request {pending.origin.request_id}",
                    RETRY_AFTER_MS,
                    limit=WRITER_MAX_RETRIES_WAITING,
                )
            first.retries.append(pending.msg)
            return False
        self._inflight[pending.origin.request_id] = pending
        self._queue.append(pending)
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)
        self._start()
        return True

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"ws-{self.tenant}-{self.workspace}")

    # ------------------------------------------------------------------ waiting
    def _carry_out(self, state: WorkspaceState, approval_id: str) -> None:
        """Carry out the request of ``approval_id``, just approved (``parking.Carrier``)."""
        self.carrier.carry_out(state, approval_id)

    async def _resume_approved(self, state: WorkspaceState) -> None:
        """On a load: carry out what was approved and not done (``parking.Carrier``)."""
        await self.carrier.resume_approved(state)

    async def abandon(self) -> None:
        """Answer the parked commands (the writer is stopping): retry elsewhere."""
        await self.parking.abandon(self._answer)

    def _unpark(self) -> None:
        """Decide the parked commands again (first, in the order they came)."""
        self._queue[:0] = self.parking.take()
        if self._queue:
            self._start()

    async def wait_idle(self) -> None:
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        """Decide and append the queued commands, a group at a time. While a group of plain
        changes is being appended, what arrives is decided against the state it leaves, into
        one group handed to the appender chained to it (``Group.after``), which grows with
        what arrives until it is sent: as soon as the group before it is acknowledged, never
        if that one is not. Groups are answered in order as they are acknowledged; a failed
        append drops the state, and its commands and those chained to it are decided again
        from the log."""
        flights: deque[Flight] = deque()
        try:
            if self._resuming:  # asked to load (``resume``), maybe with nothing queued
                self._resuming = False
                await self._guarded([], self._load())
            while self._queue or flights:
                head = flights[0] if flights else None
                last = flights[-1] if flights else None
                if head is not None and head.settled:
                    await self._land_head(flights)
                elif self._queue and (last is None or self._overlaps(last)):
                    batch, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
                    first = batch[0]  # what is logged while deciding names the command (or one)
                    logfields.bind(first.address, first.origin if len(batch) == 1 else None)
                    flight = await self._guarded(batch, self._stage(batch, 1, last))
                    if flight is not None and flight is not last:
                        flights.append(flight)
                elif head is not None and last is not None and self._overlaps(last):
                    await self._arrival_or(head)  # its acknowledgement, or more to decide
                else:
                    await self._land_head(flights)
                if not flights and self.compaction.due:
                    self.compaction.due = False
                    await self._guarded([], self._compaction())
        finally:
            self._task = None

    async def _land_head(self, flights: deque[Flight]) -> None:
        """Answer the first group in flight once its append is answered; if it failed, drop
        the groups chained to it and decide all of them again from the log."""
        head = flights.popleft()
        landed = await self._guarded(head.batch, self._land(head, 1))
        if landed is False:
            redo = head.batch
            for chained in flights:
                await chained.dropped()
                redo = redo + chained.batch
            flights.clear()
            await self._guarded(redo, self._process(redo, 2))

    async def _arrival_or(self, head: Flight) -> None:
        """Wait until ``head``'s append is answered or a command arrives (to be decided
        while ``head`` is in flight): a future either resolves (cheaper than
        ``asyncio.wait``, on every command of a workspace written one command at a time)."""
        assert head.group is not None
        done = head.group.future
        arrival = self._arrival = asyncio.get_running_loop().create_future()

        def wake(_: object) -> None:
            if not arrival.done():
                arrival.set_result(None)

        done.add_done_callback(wake)
        try:
            await arrival
        finally:
            self._arrival = None
            done.remove_done_callback(wake)

    async def _guarded(self, batch: list[Pending], step: Awaitable[_T]) -> _T | None:
        """``step``; if it fails unexpectedly, the state is dropped and the commands of
        ``batch`` not answered yet get the failure (None)."""
        try:
            return await step
        except Exception as exc:
            self.state = None
            if storage.is_log_full(exc):  # a blob refused by the object store
                self.deps.log_storage.mark(str(exc))
                error = storage.log_full(str(exc))
            elif isinstance(exc, TimeoutError | nats.errors.Error):  # NATS failing over
                log.warning("%s/%s: NATS: %r", self.tenant, self.workspace, exc)
                error = QuillError(ErrorCode.UNAVAILABLE, f"NATS did not answer: {exc!r}")
            else:
                log.exception("workspace %s/%s: unexpected failure", self.tenant, self.workspace)
                error = QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
            for p in batch:
                await self._answer(p, codec.error_reply(error), error=error)
            return None

    def _overlaps(self, ahead: Flight) -> bool:
        """Whether the next group may be decided while ``ahead`` is being appended: ``ahead``
        holds changes only (no lifecycle, control or approval event, whose effects follow
        its commit), no compaction is due, and the state is still the one it was decided
        on (not dropped, same partition epoch)."""
        if ahead.group is None or not ahead.plain or self.compaction.due:
            return False
        if self.state is not ahead.state:
            return False
        try:
            return lifecycle.current_fence(self.site, self.partition) == self.fence
        except QuillError:
            return False

    # ------------------------------------------------------------------ state
    async def _load(self, trust: bool = True) -> WorkspaceState:
        """The state, loaded from the projection and caught up from the log if needed
        (``lifecycle.load``). ``trust``: unless False (after an append refused on a stale
        state), a projection that holds the whole log (``deps.Completeness``) is not checked
        against it."""
        fence = lifecycle.current_fence(self.site, self.partition)
        if self.state is not None and fence == self.fence:
            return self.state
        self.state = None
        state, recent, finished = await lifecycle.load(self.site, fence, trust)
        self.blobs.behind = [blobs.prefix(self.tenant, name) for name, _ in state.lineage]
        self.compaction.counts = None
        self.results.reload(recent, state.version)
        self.state, self.fence = (state if finished else None), fence
        if finished:
            await self._resume_approved(state)
        return state

    def resume(self) -> None:
        """Load the workspace now (on its own task) if it is not loaded: a load carries out
        what was approved and not done (``_resume_approved``)."""
        if self.state is None:
            self._resuming = True
            self._start()

    def forget(self) -> None:
        """Let the state go (the projection missed its events, or its partition moved): the
        next command loads it again from the projection and the log."""
        self.state = None

    # ------------------------------------------------------------------ deciding
    async def _process(self, batch: list[Pending], first: int = 1) -> None:
        """Decide ``batch`` and append it, again from the log (up to ``ATTEMPTS``) while the
        append fails."""
        for attempt in range(first, ATTEMPTS + 1):
            flight = await self._stage(batch, attempt, None)
            if flight is None or await self._land(flight, attempt):
                return

    async def _stage(
        self, batch: list[Pending], attempt: int, after: Flight | None
    ) -> Flight | None:
        """Decide ``batch`` (against the state ``after`` leaves, when given) and hand its
        events to the appender; None when there is nothing to append (every command
        answered, refused or parked). Answers that depend on changes not acknowledged yet
        (a refusal or a no-op after them) wait for them (``Flight.held``)."""
        try:
            state = await self._load(trust=attempt == 1)
        except QuillError as exc:
            for p in batch:
                await self._answer(p, codec.error_reply(exc), error=exc)
            return None
        staged: list[Staged] = []
        held: list[Held] = []
        parked = {id(p) for p in self.parking.parked} if attempt > 1 else set()
        batch = [p for p in batch if not p.answered and id(p) not in parked]
        results = self.results.committed(
            [p.origin for p in batch], look=attempt > 1, loaded=self.state is not None
        )

        async def answer(p: Pending, reply: bytes, error: QuillError | None = None,
                         paths: list[str] | None = None) -> None:  # fmt: skip
            version = None if error is not None else state.version
            if staged or after is not None:  # decided on changes not acknowledged yet
                held.append(Held(p, reply, error, version, paths))
            else:
                await self._answer(p, reply, error=error, version=version, paths=paths)

        for i, p in enumerate(batch):
            if staged and isinstance(staged[-1].event, WorkspaceForked):
                # the fork's tree is loaded once it is committed: the rest waits for it
                self._queue[:0] = batch[i:]
                batch = batch[:i]
                break
            stored = results.get(p.origin.request_id)
            if stored is not None:
                await self._answer(p, codec.ok_reply_raw(*stored), version=stored[0])
                continue
            try:
                if state.restricted and approvals.needs_approval(self.site, state, p):
                    decision, event, payload = await approvals.ask(self.site, state, p)
                else:
                    decision, event, payload = await context.with_work(
                        self.site, state, p, partial(self._decide, state, p)
                    )
            except QuillError as exc:
                if not self.parking.park(p, exc, state):
                    error = self.parking.no_room(p, exc)
                    await answer(p, codec.error_reply(error), error)
                continue
            except Exception as exc:  # this command's failure alone: the group goes on
                error = unexpected(self.site, p, exc)
                await self._answer(p, codec.error_reply(error), error=error)
                continue
            if event is None:
                await answer(
                    p, codec.ok_reply(state.version, decision.result), None, decision.paths
                )
                continue
            digest = hashing.event_hash(payload)
            # the decider applied its changes to the tree: the rest of the event is folded
            # here (a purge leaves no workspace for what follows in the group)
            evolve(state, event, digest, tree=False)
            staged.append(Staged(p, decision, event, digest, payload))
        if after is not None and after.open_for(staged):  # not sent yet: it takes these too
            after.merge(batch, staged, held, self._msg_ids(staged))
            return after
        if not staged:
            if held:  # after ``after``'s changes: answered once they are acknowledged
                assert after is not None
                return Flight(batch, [], None, state, after, held)
            return None
        group = Group(
            subject=self.subject,
            expected_seq=state.last_seq if after is None else 0,
            payloads=[s.payload for s in staged],
            msg_ids=self._msg_ids(staged),
            hashes=[s.digest for s in staged],
            context=[(s.event, s.digest) for s in staged],
            fence=self.fence,
            after=after.group if after is not None else None,
        )
        flight = Flight(batch, staged, group, state, after, held)
        self.deps.appender.submit(group)
        return flight

    def _msg_ids(self, staged: list[Staged]) -> list[str]:
        subjects = self.deps.subjects
        return [subjects.msg_id(self.tenant, self.workspace, s.event.request_id) for s in staged]

    async def _land(self, flight: Flight, attempt: int) -> bool:
        """Wait for ``flight``'s append and answer its commands: True when they are answered
        (committed, or refused for good), False when they must be decided again from the
        log (the state is dropped)."""
        state, staged, group = flight.state, flight.staged, flight.group
        if group is None:  # answers only, after the group before them
            assert flight.after is not None
            if not await flight.after.acknowledged():
                return False
            await flight.release(self._answer)
            return True
        began = time.perf_counter() if tracing.ON else 0.0
        try:
            seqs = await group.future
        except AppendError as exc:
            log.warning(
                "%s/%s: append failed (%s, attempt %d): reloading from the log",
                self.tenant,
                self.workspace,
                exc,
                attempt,
            )
            self.state = None
            await forks.not_appended(self.site, [s.event for s in staged])
            if storage.is_log_full(exc):  # retrying cannot help: the operator must act
                self.deps.log_storage.mark(str(exc))
                err = storage.log_full(str(exc))
            elif await lifecycle.fenced_out(self.site, self.partition, self.fence):
                # the workspace is another writer's now
                err = QuillError(
                    ErrorCode.UNAVAILABLE,
                    "The workspace moved to another writer; retry",
                    {"partition": self.partition},
                )
            elif attempt == ATTEMPTS:
                err = QuillError(ErrorCode.UNAVAILABLE, f"Could not append to the log: {exc}")
            else:
                return False
            for p in flight.batch:
                if not p.answered:
                    await self._answer(p, codec.error_reply(err), error=err)
            return True
        self.deps.log_storage.clear()
        state.last_seq = seqs[-1]
        if tracing.ON:  # the append span of each command it carried
            for s in staged:
                tracing.appended(s.pending.msg, began)
        if not flight.plain:  # a purge or a re-creation is acted on once committed
            events = [(s.event, seq) for s, seq in zip(staged, seqs, strict=True)]
            had_log = flight.after is not None or group.expected_seq > 0
            finished = await lifecycle.after_lifecycle(
                self.site, events, had_log=had_log, purged=self._purged
            )
            if not finished:  # a purge not finished: the next load finishes it
                self.state = None
            await forks.landed(self.site, [s.event for s in staged], self._fork_of)
        await self.compaction.count(state, [s.event for s in staged])
        for s, seq in zip(staged, seqs, strict=True):
            p, decision, event = s.pending, s.decision, s.event
            if isinstance(event, ApprovalRequested):  # p waits for the decision
                await notify(self.deps, event, [], seq)
                if not self.parking.park(p, awaiting(p, event.approval_id, event.version), state):
                    error = awaiting(p, event.approval_id, event.version)
                    await self._answer(p, codec.error_reply(error), error=error)
                continue
            result = bytes(event.result)
            self.results.remember(p.origin.request_id, event.version, result)
            await self._answer(
                p,
                codec.ok_reply_raw(event.version, result),
                version=event.version,
                paths=decision.paths,
                redacted=decision.redacted,
            )
            await notify(self.deps, event, decision.changes, seq)
        if flight.held:
            await flight.release(self._answer)
        if any(isinstance(s.event, WorkspaceForked) for s in staged):
            self.state = None  # its tree (the source's at the fork point) is loaded next
        for s in staged:
            if isinstance(s.event, ApprovalDecided) and s.event.approved:
                self._carry_out(state, s.event.approval_id)
        frees = (LockReleased, ApprovalDecided)
        if self.parking.parked and any(isinstance(s.event, frees) for s in staged):
            self._unpark()
        return True

    def _purged(self) -> None:
        """A purge is in the log: what was known of the workspace goes."""
        self.results.clear()  # an old request id is not answered from a purged log
        self.compaction.counts = None

    async def _compaction(self) -> None:
        """Compact the workspace (``compaction.py``), on the state loaded now."""
        state = await self._load()
        if not await self.compaction.run(state, self.fence):
            self.state = None

    async def _decide(
        self, state: WorkspaceState, p: Pending, ctx: Context
    ) -> tuple[Decision, WorkspaceEvent | None, bytes]:
        """``p`` decided against ``state`` with ``ctx`` (``context.with_work`` gathers it and
        calls this again after each expensive step), its event and the event's payload; no
        event when it commits nothing."""
        deps = self.deps
        with state.tree.savepoint():
            decision = decide(state, p.request, ctx)
            decision.redacted = sorted(ctx.redacted)
            if not decision.commits:
                return decision, None, b""
            decision.changes = await context.externalize(self.site, decision.changes)
            event = to_event(state, decision, ctx, p.address.op, p.origin)
            payload = codec.encode(event)
            if isinstance(event, WorkspaceForked | WorkspacePurged):  # the fork record first
                self._fork_of = await forks.recorded(self.site, event, state.lineage)
            if deps.secrets:  # the last net: contents are redacted, names refused at the edge
                leaked = deps.secrets.redact_bytes(payload)[1]
                if leaked:
                    raise QuillError(
                        ErrorCode.INVALID_ARGUMENT,
                        f"Refused: the event would hold a registered secret ({', '.join(leaked)})",
                        {"secrets": leaked},
                    )
            if len(payload) > MAX_MESSAGE_BYTES - EVENT_HEADROOM:
                raise QuillError(
                    ErrorCode.SIZE_LIMIT_EXCEEDED,
                    f"Change set too large for one event ({len(payload)} bytes)",
                    {"event_bytes": len(payload)},
                )
        return decision, event, payload

    # ------------------------------------------------------------------ answering
    async def _answer(
        self,
        p: Pending,
        reply: bytes,
        *,
        error: QuillError | None = None,
        version: int | None = None,
        paths: list[str] | None = None,
        redacted: list[str] | None = None,
    ) -> None:
        if p.answered:
            return
        p.answered = True
        if error is not None and self.deps.secrets:  # errors echo what was asked
            error = self.deps.secrets.redact_error(error)
            reply = codec.error_reply(error)
        self.deps.backlog.queued -= 1
        self.deps.backlog.bytes -= len(p.msg.data)
        if self._inflight.get(p.origin.request_id) is p:
            del self._inflight[p.origin.request_id]
        for msg in [p.msg, *p.retries]:
            await respond(msg, reply, reply_headers(p.origin))
        if p.carrying and not isinstance(p.request, rq.RequestApproval):  # an executor's: its
            # outcome is the command's
            await record(self.deps, self.tenant, self.workspace, p, reply, error, version)
        if tracing.ON:
            code = None if error is None else str(error.code)
            tracing.served(p.msg, p.spec.key, p.started, traced(p), code)
        await self.deps.auditor.record(
            p.address,
            p.origin,
            p.started,
            error=error,
            version=version,
            paths=paths if paths is not None else named_paths(p.request),
            details={"redacted": redacted} if redacted else None,
        )
