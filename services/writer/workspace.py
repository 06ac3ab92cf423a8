"""One workspace inside the writer: its state, its queue of commands, its commits.

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

Size: the actor is one state machine (queue → decide → append → answer, and the reload that
undoes a failed append); its steps share the actor's state, and splitting them across modules
would bring back the back-references ``deps.py`` removed. What it calls is elsewhere: decisions
in ``core``, the append in ``append.py``, collaborators in ``deps.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from contracts import codec, hashing
from contracts import ops as registry
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import (
    AnyChange,
    ApprovalDecided,
    ApprovalRequested,
    ChangesCommitted,
    HistoryCompacted,
    LockReleased,
    PutFile,
    Remove,
    WorkspaceCreated,
    WorkspaceEvent,
    WorkspacePurged,
    WorkspaceUpdated,
)
from contracts.limits import (
    MAX_MESSAGE_BYTES,
    MAX_PENDING_APPROVALS,
    RETRY_AFTER_MS,
    WRITER_MAX_RETRIES_WAITING,
    WRITER_RECENT_RESULTS,
)
from contracts.ops import OpSpec
from contracts.subjects import (
    CHANGES_SUFFIX,
    HEADER_TIMEOUT,
    HEADER_WAIT,
    STREAM_EVENTS,
    STREAM_OUTPUT,
    Address,
    Origin,
)
from core.decide import decide, needs
from core.decide_control import CONTROL_COMMANDS
from core.decision import Context, Decision, Expensive, Needs, to_event
from core.diffs import Pair, unified_many
from core.evolve import WorkspaceState, evolve
from core.secrets import Secrets
from core.tree import Tree, place
from infra import approvals as parking
from infra import blobs, compaction, logfields, storage, tracing
from infra import log as eventlog
from infra.approvals import Parked, digest
from infra.approvals import summary as approval_summary
from infra.blobs import INLINE_BUDGET, INLINE_MAX
from infra.bus import respond
from infra.busy import refused
from infra.compaction import with_manifests
from infra.entry import reply_headers
from infra.metrics import publish_failed
from infra.offload import CLIENT_DEADLINE, client_deadline
from infra.runtime import bounded_gather
from services.writer.append import MAX_BATCH_BYTES, AppendError, Group
from services.writer.deps import Deps
from services.writer.partitions import Fence
from services.writer.preview import PREVIEW_BUDGET_S, preview

log = logging.getLogger("quill.writer")
_T = TypeVar("_T")

MAX_GROUP = 256
ATTEMPTS = 3
EVENT_HEADROOM = 64 * 1024
MAX_STEPS = 8
"""Expensive steps one decision may ask for (``_with_work``; an edit or a modify asks one)."""


@dataclass
class Pending:
    """A command waiting for its reply."""

    address: Address
    spec: OpSpec
    request: rq.Request
    origin: Origin
    msg: Msg
    started: float = field(default_factory=time.perf_counter)
    received: float = field(default_factory=time.monotonic)
    """When it was taken in, on ``time.monotonic`` (its client's deadline: ``Ws-Timeout``)."""
    retries: list[Msg] = field(default_factory=list)
    """Messages of the same request id that arrived while this one was pending."""
    answered: bool = False
    carrying: bool = False
    """It is an approved request being carried out: its answer is kept as the approval's
    outcome (``infra/approvals.py``)."""

    @property
    def wait_until(self) -> float:
        """``perf_counter`` time until which it may wait for a lock (or an approval)."""
        return self.started + self.origin.wait_ms / 1000


class Staged(NamedTuple):
    """A command decided into an event, waiting for its append."""

    pending: Pending
    decision: Decision
    event: WorkspaceEvent
    digest: str
    payload: bytes


class Held(NamedTuple):
    """An answer that waits for the changes it was decided after to be acknowledged (a
    refusal or a no-op that follows them): sent if they are, decided again if not."""

    pending: Pending
    reply: bytes
    error: QuillError | None
    version: int | None
    paths: list[str] | None


@dataclass
class _Flight:
    """A group decided and handed to the appender (``group``; None: only answers held until
    the group before it is acknowledged), with what answering it needs."""

    batch: list[Pending]
    staged: list[Staged]
    group: Group | None
    state: WorkspaceState
    """The state it was decided against (and leaves)."""
    after: _Flight | None
    """The group it was decided after and is chained to, while that one was in flight."""
    held: list[Held]

    @property
    def plain(self) -> bool:
        """Changes only: nothing that must be acted on after it commits."""
        return all(isinstance(s.event, ChangesCommitted) for s in self.staged)

    @property
    def settled(self) -> bool:
        """Its append is answered (or it has none): it can be answered without waiting."""
        return self.group is None or self.group.future.done()

    def open_for(self, staged: list[Staged]) -> bool:
        """Whether ``staged`` (decided after it) may join its group: the appender has not
        taken the group yet (it waits for the one before it), and it stays within
        ``MAX_GROUP`` events and the appender's ``MAX_BATCH_BYTES``."""
        group = self.group
        if group is None or group.after is None or group.future.done():
            return False
        size = group.size + sum(len(s.payload) for s in staged)
        return len(group.payloads) + len(staged) <= MAX_GROUP and size <= MAX_BATCH_BYTES

    def merge(
        self, batch: list[Pending], staged: list[Staged], held: list[Held], msg_ids: list[str]
    ) -> None:
        """Take ``batch``'s events (``staged``) and held answers into its group (``open_for``)."""
        group = self.group
        assert group is not None
        self.batch, self.staged, self.held = (
            self.batch + batch,
            self.staged + staged,
            self.held + held,
        )
        group.payloads += [s.payload for s in staged]
        group.msg_ids += msg_ids
        group.hashes += [s.digest for s in staged]
        group.context += [(s.event, s.digest) for s in staged]

    async def acknowledged(self) -> bool:
        """Whether its group was committed (waiting for the appender to say)."""
        assert self.group is not None
        await asyncio.wait([self.group.future])
        return self.group.future.exception() is None

    async def dropped(self) -> None:
        """Wait until the appender has dropped its group unsent (the group before it
        failed)."""
        if self.group is not None:
            await asyncio.wait([self.group.future])
            self.group.future.exception()  # retrieved: it was never sent

    async def release(self, answer: Callable[..., Awaitable[None]]) -> None:
        """Send the answers held for its changes (they are acknowledged)."""
        held, self.held = self.held, []
        for h in held:
            await answer(h.pending, h.reply, error=h.error, version=h.version, paths=h.paths)


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
        self.state: WorkspaceState | None = None
        self._queue: list[Pending] = []
        self._inflight: dict[str, Pending] = {}
        self._recent: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        """The last ``WRITER_RECENT_RESULTS`` results by request id (idempotent retries)."""
        self._recent_all = True
        """``_recent`` holds every result the projection has of the workspace (else a
        request id not in it is looked up in the projection)."""
        self._unprojected: dict[str, tuple[int, bytes]] = {}
        """Results dropped from ``_recent`` whose events the projection does not have yet
        (bounded by what commits in one linger of the applier)."""
        self._task: asyncio.Task[None] | None = None
        self._parked: list[Pending] = []
        """Commands waiting for another session's lock to go (decided again when it does)."""
        self._wake: asyncio.TimerHandle | None = None
        self._counts: dict[str, int] | None = None
        """Revisions kept per path, when the workspace has ``max_versions``."""
        self._compact = False
        self._arrival: asyncio.Future[None] | None = None
        """Set while the actor waits for its group in flight or a command, whichever first."""
        self._carrying: set[asyncio.Task[None]] = set()
        """Approved requests being taken in or handed to the executors (``_carry``)."""
        self._carried: set[str] = set()
        """Their approval ids."""
        self._resuming = False
        """``resume`` asked for a load."""

    @property
    def waiting(self) -> int:
        """Commands parked until a lock goes (or an approval comes)."""
        return len(self._parked)

    @property
    def depth(self) -> int:
        """Commands accepted and not yet answered (its queue, in flight, parked)."""
        return len(self._inflight)

    @property
    def idle(self) -> bool:
        return self._task is None and not self._queue and not self._parked and not self._carrying

    @property
    def queued(self) -> int:
        """Commands held: queued, being decided or appended, or parked."""
        return len(self._inflight)

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

    # ------------------------------------------------------------------ approvals
    def _needs_approval(self, state: WorkspaceState, p: Pending) -> bool:
        """Whether ``p`` must be approved first, and is not yet. A request from the same
        session as one still waiting (same op, same body) is that one: answered with its
        approval id, never parked again.

        Raises:
            QuillError: ``DENIED`` when it was (or it expired); ``APPROVAL_REQUIRED`` while it
                waits; ``CONFLICT`` for another body under an approved request's id; busy
                when ``MAX_PENDING_APPROVALS`` wait already.
        """
        if not state.exists or state.trust != "restricted":
            return False
        if isinstance(p.request, (rq.CreateWorkspace, *CONTROL_COMMANDS)):
            return False
        now = datetime.now(UTC)
        request_id = p.origin.request_id
        op, body = asked(p, self.deps.secrets)
        approval = state.controls.approval(request_id)
        if approval is None:
            if self._covered(state, p):
                return False
            pending = state.controls.pending(now)
            for other_id, other in pending:
                if other.same(op, p.origin.actor, p.origin.session, body):
                    raise awaiting(p, other_id, other.version)
            if len(pending) >= MAX_PENDING_APPROVALS:
                what = f"Workspace {self.tenant}/{self.workspace}"
                raise refused(
                    "writer", "approvals", what, RETRY_AFTER_MS, limit=MAX_PENDING_APPROVALS
                )
            return True
        if approval.digest is not None and approval.digest != body:
            raise QuillError(
                ErrorCode.CONFLICT,
                f"Request {request_id} was parked for approval with another body: a request "
                "id names one request (send this one with a new id)",
                {"approval_id": request_id},
            )
        if approval.approved is None and not approval.past(now):
            raise awaiting(p, request_id, approval.version)
        if approval.expired or approval.past(now):
            raise QuillError(
                ErrorCode.DENIED,
                f"Approval {request_id} expired undecided (at "
                f"{approval.expires.isoformat() if approval.expires else '?'})",
                {"approval_id": request_id, "reason": "expired"},
            )
        if not approval.approved:
            reason = f": {approval.reason}" if approval.reason else ""
            raise QuillError(
                ErrorCode.DENIED,
                f"Denied by {approval.decided_by or 'an approver'}{reason}",
                {"approval_id": request_id, "reason": approval.reason},
            )
        p.carrying = True
        return False

    def _covered(self, state: WorkspaceState, p: Pending) -> bool:
        """An executor's ``apply`` of what an approved command changed (request id
        ``<command's id>:changes``, same actor) needs no approval of its own."""
        command_id, suffix, _ = p.origin.request_id.rpartition(CHANGES_SUFFIX)
        if suffix != CHANGES_SUFFIX or not isinstance(p.request, rq.ApplyChanges):
            return False
        approval = state.controls.approval(command_id)
        return (
            approval is not None
            and approval.approved is True
            and approval.op.startswith("exec.")
            and approval.requested_by == p.origin.actor
        )

    async def _ask(
        self, state: WorkspaceState, p: Pending
    ) -> tuple[Decision, WorkspaceEvent | None, bytes]:
        """The ``approval_requested`` event that parks ``p`` (under its own request id: the
        command itself keeps its id for when it is approved and committed), with a diff of
        what it would change if decided now."""
        summary, paths = describe(p)
        origin = Origin(
            f"{p.origin.request_id}:approval", p.origin.actor, p.origin.session, p.origin.run
        )
        request = p.request
        op, body = asked(p, self.deps.secrets)
        if isinstance(request, rq.RequestApproval):  # shown: what was kept, what will run
            summary = await self._kept_summary(p, request)
        shown = None if isinstance(request, rq.RequestApproval) else await self._preview(state, p)
        if not isinstance(request, rq.RequestApproval):  # kept to be carried out once approved
            kept = dict(p.origin.headers())
            kept.pop(HEADER_WAIT, None)
            kept.pop(HEADER_TIMEOUT, None)
            parked = Parked.of(op, kept, kept_body(p, self.deps.secrets))
            await self.deps.approvals.keep(self.tenant, self.workspace, p.origin.request_id, parked)
        at = datetime.now(UTC)
        expires = at + timedelta(seconds=state.limits.approval_ttl_s)

        def make(common: dict[str, Any]) -> ApprovalRequested:
            return ApprovalRequested(
                approval_id=p.origin.request_id,
                request_op=op,
                summary=summary,
                requested_by=p.origin.actor,
                preview=shown,
                digest=body,
                expires=expires,
                **common,
            )

        ctx = Context(version=state.version + 1, at=at, content=lambda _: None)
        decision = Decision(result=rp.ApprovalList(pending=[]), make=make, paths=paths)
        event = to_event(state, decision, ctx, "approval_requested", origin)
        return decision, event, codec.encode(event)

    async def _kept_summary(self, p: Pending, request: rq.RequestApproval) -> str:
        """What an approver is shown of the command an executor asks for: derived from the
        request it kept under the same id and digest (``infra/approvals.py``), never from the
        summary it sent (a client that could send one could show "ls" for another command).

        Raises:
            QuillError: ``INVALID_ARGUMENT`` when no such request is kept.
        """
        rid, t, w = p.origin.request_id, self.tenant, self.workspace
        kept = None
        if request.digest is not None:
            kept = await self.deps.approvals.parked(t, w, rid, request.digest)
        if kept is None or kept.op != request.op:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"No {request.op} request is kept for approval {rid} with this digest: the "
                "executors ask for the approval of the commands they keep, no one else",
                {"approval_id": rid},
            )
        shown = approval_summary(kept)
        return self.deps.secrets.redact(shown)[0] if self.deps.secrets else shown

    async def _preview(self, state: WorkspaceState, p: Pending) -> str:
        """``p`` decided against ``state`` and undone: the diff of its changes, or why it
        would be refused (as it stands; it is decided again once approved)."""
        try:
            ctx = await self._context(state, p)

            async def undone() -> None:
                with state.tree.savepoint():
                    raise _Undo(decide(state, p.request, ctx).changes)

            await self._with_work(p, ctx, undone)
        except _Undo as undo:
            changes = undo.changes
        except QuillError as exc:
            return f"As it stands it would be refused: {exc.code}: {exc.message}\n"
        shown = await preview(
            changes, state.tree, self._content, self.deps.secrets, self._diff_for(p)
        )
        return shown or "No change to the files.\n"

    def _diff_for(self, p: Pending) -> Callable[[list[Pair]], Awaitable[list[str]]]:
        """How the preview of ``p`` diffs files: in a worker, as ``p``'s tenant's
        (``infra/offload.py``)."""

        async def diff(pairs: list[Pair]) -> list[str]:
            token = CLIENT_DEADLINE.set(client_deadline(p.received, p.origin.timeout_ms))
            try:
                return await self.deps.offload.run(
                    p.address.tenant,
                    unified_many,
                    pairs,
                    3,
                    budget_s=PREVIEW_BUDGET_S,
                    overtime="The preview's diff took too long",
                )
            finally:
                CLIENT_DEADLINE.reset(token)

        return diff

    async def _with_work(
        self, p: Pending, ctx: Context, attempt: Callable[[], Awaitable[_T]]
    ) -> _T:
        """``attempt()`` (which decides ``p`` with ``ctx``), again after each expensive step it
        asks for (``core.decision.Expensive``) is computed in a worker, as ``p``'s tenant's,
        until the client's deadline at most; a step's failure (its error, busy, its budget
        run out) is its result, which the decision then raises."""
        assert ctx.computed is not None
        for _ in range(MAX_STEPS):
            try:
                return await attempt()
            except Expensive as step:
                token = CLIENT_DEADLINE.set(client_deadline(p.received, p.origin.timeout_ms))
                try:
                    result: Any = await self.deps.offload.run(
                        p.address.tenant,
                        step.fn,
                        *step.args,
                        budget_s=step.budget_s,
                        overtime=f"{p.spec.key} took too long",
                    )
                except QuillError as exc:
                    result = exc
                finally:
                    CLIENT_DEADLINE.reset(token)
                ctx.computed.append((step.fn, step.args, result))
        raise QuillError(ErrorCode.INTERNAL, f"Internal error: {p.spec.key} asked too many steps")

    async def _content(self, sha256: str) -> bytes | None:
        data = self.deps.contents.get(sha256)
        if data is None:
            try:
                data = await self.blobs.get(sha256)
            except QuillError:
                return None
        return data

    # ------------------------------------------------------------------ carrying out
    def _carry_out(self, state: WorkspaceState, approval_id: str) -> None:
        """Carry out the request of ``approval_id``, just approved, unless its client waits
        for it here (parked: decided again now, as the approved request it is) or it is
        being carried out already."""
        approval = state.controls.approval(approval_id)
        if approval is None or approval_id in self._inflight or approval_id in self._carried:
            return
        task = asyncio.create_task(self._carry(approval_id, approval.op, approval.digest))
        self._carrying.add(task)
        self._carried.add(approval_id)

        def done(_: asyncio.Task[None]) -> None:
            self._carrying.discard(task)
            self._carried.discard(approval_id)

        task.add_done_callback(done)

    async def _resume_approved(self, state: WorkspaceState) -> None:
        """On a load: carry out the approvals decided approved whose outcome is not kept (the
        writer that committed the decision stopped before it carried it out, or before its
        outcome was kept). Once only: a mutation's request id answers a repeat with what it
        committed (and keeps that as the outcome); a command's claim runs it once."""
        approved = [
            k for k, a in (state.controls.approvals or {}).items() if a.approved and not a.expired
        ]
        if not approved:
            return
        try:
            unfinished = await self.deps.approvals.unfinished(self.tenant, self.workspace)
        except Exception as exc:  # the next load looks again
            log.warning("%s/%s: approvals not looked at: %r", self.tenant, self.workspace, exc)
            return
        tokens = unfinished.get((self.tenant, self.workspace), set())
        for approval_id in approved:
            if approval_id.replace(".", "_") in tokens:
                log.info("%s/%s: carrying out approval %s (approved, not done)", self.tenant,
                         self.workspace, approval_id)  # fmt: skip
                self._carry_out(state, approval_id)

    async def _carry(self, approval_id: str, op: str, body: str | None) -> None:
        """Take the kept request of ``approval_id`` in as if its client had sent it again
        (a mutation), or hand it to the executors (a command: ``_dispatch``)."""
        t, w, approvals = self.tenant, self.workspace, self.deps.approvals
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
                await self._dispatch(approval_id, spec, parked)
                return
            request = codec.decode_request(spec, parked.body)
            origin = Origin.from_headers(parked.headers)
            subject = self.deps.subjects.cmd(t, w, spec.name)
            msg = Msg(self.deps.nc, subject=subject, data=parked.body, headers=parked.headers)
            address = Address("cmd", t, w, spec.name)
            if self.submit(Pending(address, spec, request, origin, msg, carrying=True)):
                self.deps.backlog.queued += 1
                self.deps.backlog.bytes += len(parked.body)
        except Exception as exc:
            log.exception("%s/%s: carrying out approval %s failed", t, w, approval_id)
            error = QuillError(ErrorCode.INTERNAL, f"Carrying it out failed: {exc!r}")
            await approvals.record(t, w, approval_id, error=error)

    async def _dispatch(self, approval_id: str, spec: OpSpec, parked: Parked) -> None:
        """Send an approved command to the executors as its client sent it (one of them runs
        it, once: ``infra/approvals.py``'s claim, and keeps its outcome); what refuses it
        before it runs (no executor, busy, the workspace archived) is kept as its outcome."""
        t, w = self.tenant, self.workspace
        subject = self.deps.subjects.exec(t, w, spec.name)
        state = self.state
        limit_s = (state.limits.max_exec_ms if state is not None else 600_000) / 1000
        kept, within_s = self.deps.approvals, limit_s + parking.CLAIM_GRACE_S
        try:
            msg = await self.deps.nc.request(
                subject, parked.body, timeout=within_s, headers=parked.headers
            )
        except nats.errors.NoRespondersError:
            error = QuillError(ErrorCode.UNAVAILABLE, "No executor is running to carry it out")
            await kept.record(t, w, approval_id, error=error)
            return
        except nats.errors.TimeoutError:  # no answer past its longest run
            if await kept.settled(self.deps.nc, t, w, approval_id, limit_s) is None:
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
                await self.deps.approvals.record(t, w, approval_id, error=error)

    # ------------------------------------------------------------------ waiting
    def _park(self, p: Pending, error: QuillError, state: WorkspaceState) -> bool:
        """Keep ``p`` aside until the lock that refused it goes (or its approval is decided)
        or its wait runs out."""
        waits = (ErrorCode.LOCKED, ErrorCode.APPROVAL_REQUIRED)
        if error.code not in waits or time.perf_counter() >= p.wait_until:
            return False
        if error.details.get("approval_id", p.origin.request_id) != p.origin.request_id:
            return False  # another request's approval (the same asked again): told its id
        if len(self._parked) >= self.deps.backlog.parked_per_workspace:
            return False
        self._parked.append(p)
        self._schedule(state)
        return True

    def _no_room(self, p: Pending, error: QuillError) -> QuillError:
        """``error``, or busy when ``p`` would wait for the lock but as many commands wait
        already as may (``parked_per_workspace``): the client retries after the hint."""
        bound = self.deps.backlog.parked_per_workspace
        if error.code != ErrorCode.LOCKED or len(self._parked) < bound:
            return error
        if time.perf_counter() >= p.wait_until:
            return error
        what = f"Workspace {self.tenant}/{self.workspace}"
        return refused("writer", "workspace_waiting", what, RETRY_AFTER_MS, limit=bound)

    def _schedule(self, state: WorkspaceState) -> None:
        """Wake the parked commands at the first deadline or when the lock expires."""
        if not self._parked:
            return
        delay = min(p.wait_until for p in self._parked) - time.perf_counter()
        now = datetime.now(UTC)
        lock = state.controls.lock
        if lock is not None:
            delay = min(delay, (lock.expires - now).total_seconds())
        for p in self._parked:  # one waiting for its approval is told when it expires
            approval = state.controls.approval(p.origin.request_id)
            if approval is not None and approval.expires is not None:
                delay = min(delay, (approval.expires - now).total_seconds())
        if self._wake is not None:
            self._wake.cancel()
        self._wake = asyncio.get_running_loop().call_later(max(delay, 0.0) + 0.001, self._unpark)

    async def abandon(self) -> None:
        """Answer the parked commands (the writer is stopping): retry elsewhere."""
        if self._wake is not None:
            self._wake.cancel()
        parked, self._parked = self._parked, []
        error = QuillError(
            ErrorCode.UNAVAILABLE, "The writer is stopping or handing the workspace over; retry"
        )
        for p in parked:  # an approved request's outcome is not this: the next load resumes it
            p.carrying = False
            await self._answer(p, codec.error_reply(error), error=error)

    def _unpark(self) -> None:
        """Decide the parked commands again (first, in the order they came)."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        self._queue[:0], self._parked = self._parked, []
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
        flights: deque[_Flight] = deque()
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
                if not flights and self._compact:
                    self._compact = False
                    await self._guarded([], self._compaction())
        finally:
            self._task = None

    async def _land_head(self, flights: deque[_Flight]) -> None:
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

    async def _arrival_or(self, head: _Flight) -> None:
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

    def _overlaps(self, ahead: _Flight) -> bool:
        """Whether the next group may be decided while ``ahead`` is being appended: ``ahead``
        holds changes only (no lifecycle, control or approval event, whose effects follow
        its commit), no compaction is due, and the state is still the one it was decided
        on (not dropped, same partition epoch)."""
        if ahead.group is None or not ahead.plain or self._compact:
            return False
        if self.state is not ahead.state:
            return False
        try:
            return self._current_fence() == self.fence
        except QuillError:
            return False

    # ------------------------------------------------------------------ state
    async def _load(self, trust: bool = True) -> WorkspaceState:
        """The state, loaded from the projection and caught up from the log if needed.
        ``trust``: unless False (after an append refused on a stale state), a projection
        that holds the whole log (``deps.Completeness``) is not checked against it."""
        fence = self._current_fence()
        if self.state is not None and fence == self.fence:
            return self.state
        self.state = None
        await self.deps.appender.applied(self.subject)  # the projection holds all we committed
        store, js = self.deps.store, self.deps.js
        if (
            trust
            and self.deps.projection.complete
            and fence is None
            and store.workspace(self.tenant, self.workspace) is not None
        ):  # the projection has all of it (deps.Completeness): the log is not asked
            state, recent = await store.load(self.tenant, self.workspace, WRITER_RECENT_RESULTS)
            last = state.last_seq
        else:  # the projection's state and results and the log's last sequence, at once
            (state, recent), last = await asyncio.gather(
                store.load(self.tenant, self.workspace, WRITER_RECENT_RESULTS),
                self._unavailable_if_failing(
                    eventlog.last_seq(js, self.subject, fresh=fence is not None)
                ),
            )
        if last > state.last_seq:
            state = await self._unavailable_if_failing(self._catch_up(state, last))
            recent = await store.recent_results(self.tenant, self.workspace, WRITER_RECENT_RESULTS)
        self._counts = None
        finished = True
        if not state.exists and state.last_seq and await self._unfinished_purge(state.last_seq):
            log.info("%s/%s: finishing its purge", self.tenant, self.workspace)
            finished = await self._finish_purge(state.last_seq)
        self._recent.clear()
        self._unprojected = {}
        for request_id, version, result in recent:
            self._remember(request_id, version, result)
        self._recent_all = state.version <= WRITER_RECENT_RESULTS
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

    @staticmethod
    async def _unavailable_if_failing(reading: Awaitable[_T]) -> _T:
        """``reading`` (of the log), its failure as ``UNAVAILABLE``."""
        try:
            return await reading
        except QuillError:
            raise
        except (TimeoutError, nats.errors.Error, eventlog.CorruptEvent) as exc:
            raise QuillError(ErrorCode.UNAVAILABLE, f"The log is not reachable: {exc!r}") from None

    async def _catch_up(self, state: WorkspaceState, last: int) -> WorkspaceState:
        """``state`` with the log's events after it up to ``last``, applied to the projection
        and folded a chunk at a time (a workspace of a million events loads in bounded
        memory; a compaction's manifest, when it rebuilds the state, is in its item)."""
        store, js = self.deps.store, self.deps.js
        caught = 0
        async for chunk in eventlog.chunks(js, self.subject, state.last_seq, last):
            chunk = await with_manifests(chunk, self.deps.manifest_blobs)
            await store.apply(chunk)
            caught += len(chunk)
            for item in chunk:
                evolve(state, item.event, item.hash, item.seq, manifest=item.manifest)
        if caught:
            log.info("%s/%s: caught up %d events", self.tenant, self.workspace, caught)
        return state

    def _current_fence(self) -> Fence | None:
        """The epoch of this workspace's partition while this writer holds it.

        Raises:
            QuillError: ``UNAVAILABLE`` when the partition is (now) another writer's.
        """
        partitions = self.deps.partitions
        if partitions is None or self.partition is None:
            return None
        fence = partitions.fence(self.partition)
        if fence is None:
            raise QuillError(
                ErrorCode.UNAVAILABLE,
                f"Partition {self.partition} moved to another writer; retry",
                {"partition": self.partition},
            )
        return fence

    async def _fenced_out(self) -> bool:
        """After a refused append: whether the partition's epoch moved on (lost to another
        writer, which now owns the workspace)."""
        partitions = self.deps.partitions
        if partitions is None or self.partition is None or self.fence is None:
            return False
        return not await partitions.still_holds(self.partition, self.fence)

    def _remember(self, request_id: str, version: int, result: bytes) -> None:
        self._recent[request_id] = (version, result)
        self._recent.move_to_end(request_id)
        projected = self.deps.store.version_of(self.tenant, self.workspace)
        if len(self._recent) > WRITER_RECENT_RESULTS:
            old_id, (old_version, old_result) = self._recent.popitem(last=False)
            self._recent_all = False
            if old_version > projected:  # kept until the projection has it
                self._unprojected[old_id] = (old_version, old_result)
        if self._unprojected:
            self._unprojected = {k: v for k, v in self._unprojected.items() if v[0] > projected}

    def _committed_results(
        self, batch: list[Pending], *, look: bool
    ) -> dict[str, tuple[int, bytes]]:
        """The version and result each command of ``batch`` was answered with, if it
        committed, by request id: from memory, else (``look``: an append of it may have
        committed; or when memory does not hold every result and a client named the request,
        so it may be a retry) the projection, every such id of the group in one statement
        (``Store.results_of``). An id the writer made is no client's retry: the projection is
        not asked for it."""
        found: dict[str, tuple[int, bytes]] = {}
        asked: list[str] = []
        for p in batch:
            request_id = p.origin.request_id
            held = self._recent.get(request_id) or self._unprojected.get(request_id)
            if held is not None:
                found[request_id] = held
            elif look or not (self._recent_all or p.origin.generated):
                asked.append(request_id)
        if asked and self.state is not None:
            ws = self.deps.store.workspace_id(self.tenant, self.workspace)
            if ws is not None:
                found.update(self.deps.store.results_of(ws, asked))
        return found

    # ------------------------------------------------------------------ deciding
    async def _process(self, batch: list[Pending], first: int = 1) -> None:
        """Decide ``batch`` and append it, again from the log (up to ``ATTEMPTS``) while the
        append fails."""
        for attempt in range(first, ATTEMPTS + 1):
            flight = await self._stage(batch, attempt, None)
            if flight is None or await self._land(flight, attempt):
                return

    async def _stage(
        self, batch: list[Pending], attempt: int, after: _Flight | None
    ) -> _Flight | None:
        """Decide ``batch`` (against the state ``after`` leaves, when given) and hand its
        events to the appender; None when there is nothing to append (every command
        answered, refused or parked). Answers that depend on changes not acknowledged yet
        (a refusal or a no-op after them) wait for them (``_Flight.held``)."""
        try:
            state = await self._load(trust=attempt == 1)
        except QuillError as exc:
            for p in batch:
                await self._answer(p, codec.error_reply(exc), error=exc)
            return None
        staged: list[Staged] = []
        held: list[Held] = []
        parked = {id(p) for p in self._parked} if attempt > 1 else set()
        batch = [p for p in batch if not p.answered and id(p) not in parked]
        results = self._committed_results(batch, look=attempt > 1)

        async def answer(p: Pending, reply: bytes, error: QuillError | None = None,
                         paths: list[str] | None = None) -> None:  # fmt: skip
            version = None if error is not None else state.version
            if staged or after is not None:  # decided on changes not acknowledged yet
                held.append(Held(p, reply, error, version, paths))
            else:
                await self._answer(p, reply, error=error, version=version, paths=paths)

        for p in batch:
            stored = results.get(p.origin.request_id)
            if stored is not None:
                await self._answer(p, codec.ok_reply_raw(*stored), version=stored[0])
                continue
            asks = False
            try:
                asks = self._needs_approval(state, p)
                if asks:
                    decision, event, payload = await self._ask(state, p)
                else:
                    decision, event, payload = await self._decide(state, p)
            except QuillError as exc:
                if not self._park(p, exc, state):
                    error = self._no_room(p, exc)
                    await answer(p, codec.error_reply(error), error)
                continue
            except Exception as exc:  # this command's failure alone: the group goes on
                error = self._unexpected(p, exc)
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
                return _Flight(batch, [], None, state, after, held)
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
        flight = _Flight(batch, staged, group, state, after, held)
        self.deps.appender.submit(group)
        return flight

    def _msg_ids(self, staged: list[Staged]) -> list[str]:
        subjects = self.deps.subjects
        return [subjects.msg_id(self.tenant, self.workspace, s.event.request_id) for s in staged]

    async def _land(self, flight: _Flight, attempt: int) -> bool:
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
            if storage.is_log_full(exc):  # retrying cannot help: the operator must act
                self.deps.log_storage.mark(str(exc))
                err = storage.log_full(str(exc))
            elif await self._fenced_out():  # the workspace is another writer's now
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
        events = [(s.event, seq) for s, seq in zip(staged, seqs, strict=True)]
        had_log = flight.after is not None or group.expected_seq > 0
        await self._after_lifecycle(events, had_log=had_log)
        await self._count(state, [s.event for s in staged])
        for s, seq in zip(staged, seqs, strict=True):
            p, decision, event = s.pending, s.decision, s.event
            if isinstance(event, ApprovalRequested):  # p waits for the decision
                await self._notify(event, [], seq)
                if not self._park(p, awaiting(p, event.approval_id, event.version), state):
                    error = awaiting(p, event.approval_id, event.version)
                    await self._answer(p, codec.error_reply(error), error=error)
                continue
            result = bytes(event.result)
            self._remember(p.origin.request_id, event.version, result)
            await self._answer(
                p,
                codec.ok_reply_raw(event.version, result),
                version=event.version,
                paths=decision.paths,
                redacted=decision.redacted,
            )
            await self._notify(event, decision.changes, seq)
        await flight.release(self._answer)
        for s in staged:
            if isinstance(s.event, ApprovalDecided) and s.event.approved:
                self._carry_out(state, s.event.approval_id)
        frees = (LockReleased, ApprovalDecided)
        if self._parked and any(isinstance(s.event, frees) for s in staged):
            self._unpark()
        return True

    async def _after_lifecycle(
        self, committed: list[tuple[WorkspaceEvent, int]], *, had_log: bool
    ) -> None:
        """After a purge is in the log: delete the workspace's contents from WS_BLOBS, then
        its events before the purge (which stays, to tell every replica and executor), and its
        kept command output; say so on ``ws.purged``. After a workspace is created again: purge
        the purge event before it. Both idempotent: the events before a purge say it is not
        finished, and a writer that fails here (or crashed) finishes it when it next loads the
        workspace (``_load``)."""
        for event, seq in committed:
            if isinstance(event, WorkspacePurged):
                self._recent.clear()  # an old request id is not answered from a purged log
                self._recent_all, self._unprojected = True, {}
                self._counts = None
                if await self._finish_purge(seq):
                    log.info("%s/%s purged (was at v%d)", self.tenant, self.workspace,
                             event.version - 1)  # fmt: skip
            elif isinstance(event, WorkspaceCreated) and had_log:
                try:
                    await self.deps.js.purge_stream(STREAM_EVENTS, subject=self.subject, seq=seq)
                except Exception as exc:
                    log.warning("%s/%s: purging the log failed: %s", self.tenant,
                                self.workspace, exc)  # fmt: skip

    async def _finish_purge(self, seq: int) -> bool:
        """Carry out the purge at log sequence ``seq``; False if something failed (the next
        load of the workspace tries again)."""
        deps = self.deps
        try:
            gone = await blobs.purge(deps.js, self.tenant, self.workspace)
            await deps.js.purge_stream(STREAM_EVENTS, subject=self.subject, seq=seq)
            await self._purge_output()
            await deps.approvals.purge(self.tenant, self.workspace)
            await deps.nc.publish(deps.subjects.purged(self.tenant, self.workspace))
        except Exception as exc:
            log.warning("%s/%s: purging failed: %s", self.tenant, self.workspace, exc)
            self.state = None  # the next command loads it again, and finishes the purge
            return False
        if gone:
            log.info("%s/%s: %d contents deleted from WS_BLOBS", self.tenant, self.workspace,
                     gone)  # fmt: skip
        return True

    async def _unfinished_purge(self, last_seq: int) -> bool:
        """Whether the log still holds events before the purge at ``last_seq`` (the last
        event of a workspace that does not exist is its purge): a purge not finished."""
        try:
            first = await self.deps.js.get_msg(
                STREAM_EVENTS, seq=1, next=True, subject=self.subject
            )
        except (TimeoutError, nats.errors.Error) as exc:  # NotFoundError: an empty log
            if not isinstance(exc, nats.js.errors.NotFoundError):
                log.warning("%s/%s: reading the log: %r", self.tenant, self.workspace, exc)
            return False
        return int(first.seq or last_seq) < last_seq

    async def _purge_output(self) -> None:
        subject = self.deps.subjects.workspace_cmdout(self.tenant, self.workspace)
        try:
            await self.deps.js.purge_stream(STREAM_OUTPUT, subject=subject)
        except nats.js.errors.NotFoundError:
            pass  # no executor ever kept output here

    def _unexpected(self, p: Pending, exc: Exception) -> QuillError:
        """The answer to a command whose decision raised something unexpected (its changes
        were undone by the tree's savepoint), logged with its request id."""
        if storage.is_log_full(exc):  # a blob refused by the object store
            self.deps.log_storage.mark(str(exc))
            return storage.log_full(str(exc))
        if isinstance(exc, TimeoutError | nats.errors.Error):  # NATS failing over
            log.warning(
                "%s/%s: request %s: NATS: %r",
                self.tenant,
                self.workspace,
                p.origin.request_id,
                exc,
            )
            return QuillError(ErrorCode.UNAVAILABLE, f"NATS did not answer: {exc!r}")
        log.error(
            "%s/%s: request %s (%s): unexpected failure",
            self.tenant,
            self.workspace,
            p.origin.request_id,
            p.address.op,
            exc_info=exc,
        )
        return QuillError(
            ErrorCode.INTERNAL,
            f"Internal error: {type(exc).__name__} (request {p.origin.request_id})",
            {"request_id": p.origin.request_id},
        )

    async def _decide(
        self, state: WorkspaceState, p: Pending
    ) -> tuple[Decision, WorkspaceEvent | None, bytes]:
        ctx = await self._context(state, p)
        return await self._with_work(p, ctx, lambda: self._decide_once(state, p, ctx))

    async def _decide_once(
        self, state: WorkspaceState, p: Pending, ctx: Context
    ) -> tuple[Decision, WorkspaceEvent | None, bytes]:
        deps = self.deps
        with state.tree.savepoint():
            decision = decide(state, p.request, ctx)
            decision.redacted = sorted(ctx.redacted)
            if not decision.commits:
                return decision, None, b""
            decision.changes = await self._externalize(decision.changes)
            event = to_event(state, decision, ctx, p.address.op, p.origin)
            payload = codec.encode(event)
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

    async def _context(self, state: WorkspaceState, p: Pending) -> Context:
        """What deciding ``p`` needs: the contents it reads, the past it restores from."""
        deps = self.deps
        wanted = needs(state, p.request)
        await self._history(state, wanted)
        foreign = await self._resolve_blobs(p.request, wanted.contents)
        for sha in wanted.contents if foreign is None else []:
            if sha not in deps.contents:
                await deps.appender.applied()  # inline contents reach the store on apply
                try:
                    deps.contents.put(sha, await self.blobs.get(sha))
                except QuillError as exc:
                    if exc.code != ErrorCode.UNAVAILABLE:
                        raise
                    # decide says what is missing (a blob an apply names, a file's content)
        past = await self._past(*wanted.past) if wanted.past is not None else None
        if past is not None:  # the history of the files it brings back
            await self._history(state, needs(state, p.request, past))
        return Context(
            version=state.version + 1,
            at=datetime.now(UTC),
            content=_without(deps.contents.get, foreign) if foreign else deps.contents.get,
            past=past,
            origin=p.origin,
            locate=deps.bridges.find,
            secrets=deps.secrets,
            computed=[],
        )

    async def _history(self, state: WorkspaceState, wanted: Needs) -> None:
        """The history ``wanted`` names, from the projection (``Store.look_up``)."""
        if wanted.history or wanted.changes_below:
            ws = self.deps.store.workspace_id(self.tenant, self.workspace)
            await self.deps.store.look_up(state.tree, ws, wanted)

    async def _resolve_blobs(self, request: rq.Request, wanted: list[str]) -> set[str] | None:
        """Bring the contents an ``apply`` names by sha256 (``blob``) into ``deps.contents``
        from this workspace's own namespace of WS_BLOBS (32 at once); return those it does
        not hold: they resolve to nothing, whoever else holds them (what the writer has
        cached or projected of other workspaces included). None: not an ``apply``."""
        if not isinstance(request, rq.ApplyChanges):
            return None
        contents, shas = self.deps.contents, list(dict.fromkeys(wanted))
        if any(sha not in contents for sha in shas):
            await self.deps.appender.applied()  # inline contents reach the store on apply

        async def held(sha: str) -> bool:
            if sha in contents:
                return await self.blobs.has(sha)
            data = await self.blobs.own(sha)
            if data is not None:
                contents.put(sha, data)
            return data is not None

        found = await bounded_gather([held(sha) for sha in shas], 32)
        return {sha for sha, ok in zip(shas, found, strict=True) if not ok}

    # ------------------------------------------------------------------ compaction
    async def _count(self, state: WorkspaceState, events: list[WorkspaceEvent]) -> None:
        """Count the revisions the committed ``events`` add; flag compaction when a path has
        gathered too many (``compaction.due``)."""
        limit = state.limits.max_versions
        if limit is None:
            return
        if self._counts is None:
            await self.deps.appender.applied()
            ws = self.deps.store.workspace_id(self.tenant, self.workspace)
            self._counts = await self.deps.store.revision_counts(ws) if ws is not None else {}
            self._compact = any(compaction.due(n, limit) for n in self._counts.values())
            return  # the store counted these events already
        counts = self._counts
        for event in events:
            if not isinstance(event, ChangesCommitted):
                continue
            for change in event.changes:
                if not isinstance(change, Remove):
                    counts[change.path] = n = counts.get(change.path, 0) + 1
                    self._compact = self._compact or compaction.due(n, limit)

    async def _compaction(self) -> None:
        """Snapshot and trim (``infra/compaction.py``): keep the last
        ``max_versions`` revisions of each path, purge the log before the snapshot."""
        state = await self._load()
        limit = state.limits.max_versions
        if limit is None:
            return
        deps = self.deps
        await deps.appender.applied()
        ws = deps.store.workspace_id(self.tenant, self.workspace)
        assert ws is not None
        started = time.perf_counter()
        manifest, dropped, events_dropped = await deps.store.compaction(ws, limit)
        contents = {r[5] for r in manifest.revisions if r[4] == "f"}

        async def keep(sha: str) -> None:
            data = await deps.store.blob(sha)
            if data is not None:  # None: stored in WS_BLOBS when it was written
                await self.blobs.put(sha, data)

        await bounded_gather([keep(sha) for sha in contents], 32)
        body = compaction.encode_manifest(manifest)
        digest_m = hashing.content_sha256(body)
        await self.blobs.put(digest_m, body)
        event = HistoryCompacted(
            tenant=self.tenant,
            workspace=self.workspace,
            version=state.version + 1,
            at=datetime.now(UTC),
            op="compact",
            request_id=f"compact-{state.version + 1}-{digest_m[:16]}",
            actor="quill",
            prev_hash=state.last_hash,
            tree_hash=hashing.tree_hex(state.tree.hash),
            manifest=digest_m,
            manifest_size=len(body),
            floor=manifest.floor,
            max_versions=limit,
            revisions_kept=len(manifest.revisions),
            revisions_dropped=dropped,
            events_dropped=events_dropped,
        )
        payload = codec.encode(event)
        digest = hashing.event_hash(payload)
        deps.manifests[digest_m] = manifest
        group = Group(
            subject=self.subject,
            expected_seq=state.last_seq,
            payloads=[payload],
            msg_ids=[deps.subjects.msg_id(self.tenant, self.workspace, event.request_id)],
            hashes=[digest],
            context=[(event, digest)],
            fence=self.fence,
        )
        try:
            (seq,) = await deps.appender.submit(group)
        except AppendError as exc:
            deps.manifests.pop(digest_m, None)
            log.warning("%s/%s: compaction not appended (%s)", self.tenant, self.workspace, exc)
            self.state = None
            return
        evolve(state, event, digest, seq)
        await deps.appender.applied()
        try:
            await deps.js.purge_stream(STREAM_EVENTS, subject=self.subject, seq=seq)
        except Exception as exc:  # the next compaction purges what this one could not
            log.warning("%s/%s: purging the log failed: %s", self.tenant, self.workspace, exc)
        self._counts = {path: min(n, limit) for path, n in (self._counts or {}).items()}
        log.info(
            "%s/%s: compacted at v%d: %d revisions kept, %d dropped, floor v%d (%.0f ms)",
            self.tenant,
            self.workspace,
            event.version,
            len(manifest.revisions),
            dropped,
            manifest.floor,
            (time.perf_counter() - started) * 1000,
        )
        await self._notify(event, [], seq)

    async def _past(self, version: int, scope: str) -> Tree:
        """The workspace (``scope`` and below) as it was at ``version``, from the projection."""
        await self.deps.appender.applied()
        tree = Tree()
        ws = self.deps.store.workspace_id(self.tenant, self.workspace)
        if ws is None:
            return tree
        nodes = await self.deps.store.entries_at(ws, version, scope, with_scope=True)
        row = self.deps.store.workspace(self.tenant, self.workspace)
        floor = row.floor if row is not None else 0
        if version < floor and not (scope and [n.kind for n in nodes] == ["f"]):
            # below the floor only a file whose revision was kept is known
            raise compaction.trimmed(scope or f"{self.tenant}/{self.workspace}", version, floor)
        for node in nodes:
            place(tree, node)
        return tree

    async def _externalize(self, changes: list[AnyChange]) -> list[AnyChange]:
        """Move contents out of the event into WS_BLOBS (stored before the append): every one
        over ``INLINE_MAX``, then the largest others until the event's inline contents fit in
        ``INLINE_BUDGET``."""
        contents: dict[int, bytes] = {}
        for i, change in enumerate(changes):
            if isinstance(change, PutFile) and (change.text is not None or change.data):
                data = change.text.encode() if change.text is not None else change.data or b""
                self.deps.contents.put(change.sha256, data)
                contents[i] = data
        inline = sum(len(d) for d in contents.values())
        out = list(changes)
        moved: list[tuple[str, bytes]] = []
        for i in sorted(contents, key=lambda i: len(contents[i]), reverse=True):
            data = contents[i]
            if len(data) <= INLINE_MAX and inline <= INLINE_BUDGET:
                break
            change = out[i]
            assert isinstance(change, PutFile)
            out[i] = msgspec.structs.replace(change, text=None, data=None, blob=True)
            moved.append((change.sha256, data))
            inline -= len(data)
        await bounded_gather([self.blobs.put(sha, data) for sha, data in moved], 32)
        return out

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
            await self._record(p, reply, error, version)  # outcome is the command's
        if tracing.ON:
            code = None if error is None else str(error.code)
            tracing.served(p.msg, p.spec.key, p.started, _traced(p), code)
        await self.deps.auditor.record(
            p.address,
            p.origin,
            p.started,
            error=error,
            version=version,
            paths=paths if paths is not None else _named_paths(p.request),
            details={"redacted": redacted} if redacted else None,
        )

    async def _record(
        self, p: Pending, reply: bytes, error: QuillError | None, version: int | None
    ) -> None:
        """Keep what an approved request gave, under its approval id (``WS_APPROVALS``)."""
        result: dict[str, Any] | None = None
        if error is None:
            result = codec.decode_reply(reply, dict[str, Any])[1]
        await self.deps.approvals.record(
            self.tenant, self.workspace, p.origin.request_id,
            version=version, result=result, error=error,
        )  # fmt: skip

    async def _notify(self, event: WorkspaceEvent, changes: Iterable[AnyChange], seq: int) -> None:
        paths = list(dict.fromkeys(c.path for c in changes))
        update = WorkspaceUpdated(
            tenant=event.tenant,
            workspace=event.workspace,
            version=event.version,
            op=event.op,
            actor=event.actor,
            request_id=event.request_id,
            at=event.at,
            paths=paths[:100],
            paths_total=len(paths),
            tree_hash=event.tree_hash,
        )
        try:
            await self.deps.nc.publish(
                self.deps.subjects.updated(event.tenant, event.workspace), codec.encode(update)
            )
        except Exception as exc:
            publish_failed("writer", "updated")
            log.warning("could not publish workspace.updated: %s", exc)


def _without(
    content: Callable[[str], bytes | None], foreign: set[str]
) -> Callable[[str], bytes | None]:
    """``content`` that knows nothing of the ``foreign`` contents."""
    return lambda sha: None if sha in foreign else content(sha)


def _named_paths(request: rq.Request) -> list[str]:
    return [v for k in ("path", "to") if isinstance(v := getattr(request, k, None), str)]


class _Undo(Exception):
    """Raised inside a savepoint to undo a decision made only to be shown."""

    def __init__(self, changes: list[AnyChange]) -> None:
        self.changes = changes


def awaiting(p: Pending, approval_id: str, version: int) -> QuillError:
    """The answer to a request left waiting for its approval (``version``: of its
    ``approval_requested`` event, for a client's read-your-writes)."""
    return QuillError(
        ErrorCode.APPROVAL_REQUIRED,
        f"Waiting for approval {approval_id} (restricted workspace {p.address.tenant}/"
        f"{p.address.workspace}): once approved, Quill carries it out; its outcome is kept "
        "under the approval id (qry.approval)",
        {"approval_id": approval_id, "version": version},
    )


def asked(p: Pending, secrets: Secrets) -> tuple[str, str]:
    """What ``p`` asks to have approved: its op and the sha256 of its body as kept (an
    executor's ``request_approval``: of the command it asks for)."""
    request = p.request
    if isinstance(request, rq.RequestApproval):
        return request.op, request.digest or digest(request.summary.encode())
    return p.spec.key, digest(kept_body(p, secrets))


def kept_body(p: Pending, secrets: Secrets) -> bytes:
    """``p``'s body as ``WS_APPROVALS`` keeps it: registered secrets redacted (no secret is
    kept at rest; what the writer commits of the request is redacted the same way)."""
    return secrets.redact_bytes(bytes(p.msg.data))[0] if secrets else bytes(p.msg.data)


def describe(p: Pending) -> tuple[str, list[str]]:
    """What a command would do, for an approver: its op and paths (never contents)."""
    request = p.request
    if isinstance(request, rq.RequestApproval):
        return request.summary, []
    paths: list[str] = []
    for name in ("path", "to"):
        value = getattr(request, name, None)
        if isinstance(value, str):
            paths.append(value)
    if isinstance(request, rq.ApplyChanges):
        paths += [c.path for c in request.changes[:20]]
        more = len(request.changes) - 20
        if more > 0:
            paths.append(f"... and {more} more")
    return f"{p.address.op} {' '.join(paths)}".strip(), paths


def _traced(p: Pending) -> dict[str, str]:
    """The attributes of a command's span (``infra.tracing``)."""
    address = p.address
    return {
        "quill.tenant": address.tenant,
        "quill.workspace": address.workspace,
        "quill.request_id": p.origin.request_id,
    }
