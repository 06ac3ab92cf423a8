"""Appending to the log: group commit of many workspaces' events as one atomic batch.

Workspaces hand in *groups* (the events one workspace decided while its previous append was
in flight) and wait. The appender sends everything that has queued as one JetStream atomic
batch (ADR-50): core-NATS publishes carrying ``Nats-Batch-Id``/``Nats-Batch-Sequence``, the
last one with ``Nats-Batch-Commit`` as a request whose reply is the only ack. Each subject's
first message carries ``Nats-Expected-Last-Subject-Sequence`` (per-workspace CAS, the fencing
against a stale writer) and every message a ``Nats-Msg-Id`` (idempotent retries). nats-py has
no batch API, and its ``publish_async`` never resolves on an error ack (nats.py #985), so
this is written against the raw protocol.

If a multi-workspace batch fails, each group is retried alone so one stale workspace cannot
fail the others. A group that still fails gets ``AppendError``; its workspace reloads from the
log and decides again.

A workspace's group decided while its previous group is in flight is *chained* to it
(``Group.after``): the server assigns stream sequences, so its CAS (the previous group's last
sequence) is known only at that group's acknowledgement; it waits in the queue until then,
and fails unsent (certainly not in the log) if the previous group fails. One group of a
workspace is in flight at a time, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import prometheus_client as prom
from nats.aio.client import Client as NATS

from contracts.subjects import HEADER_EVENT_HASH
from infra import storage
from infra.metrics import WRITER_APPENDS
from services.writer.partitions import Fence

log = logging.getLogger("quill.writer.append")

BATCH_EVENTS = prom.Histogram(
    "quill_writer_batch_events",
    "Events per atomic batch sent to the log.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
APPEND_SECONDS = prom.Histogram(
    "quill_writer_append_seconds",
    "Time for the log to acknowledge a batch.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code when an expected last (subject) sequence does not hold."""
_APPENDS = {
    outcome: WRITER_APPENDS.labels(outcome)
    for outcome in ("ok", "conflict", "refused", "uncertain", "storage_full")
}


APPLY_LINGER_S = 0.05
MAX_BATCH_EVENTS = 512
MAX_BATCH_BYTES = 6 * 1024 * 1024
"""The most events and bytes of one send, whatever groups it holds (a group larger than
these goes alone)."""


class AppendError(Exception):
    """The group was not committed, or its fate is unknown (``uncertain``)."""

    def __init__(self, message: str, *, uncertain: bool, code: int | None = None) -> None:
        super().__init__(message)
        self.uncertain = uncertain
        self.code = code

    @property
    def outcome(self) -> str:
        """Its ``quill_writer_appends_total`` outcome: ``uncertain`` (fate unknown),
        ``conflict`` (the workspace's or the partition's sequence moved on), ``storage_full``
        (the log at its storage limit), ``refused``."""
        if self.uncertain:
            return "uncertain"
        if storage.is_log_full(self):
            return "storage_full"
        return "conflict" if self.code == WRONG_LAST_SEQUENCE else "refused"


@dataclass
class Group:
    """One workspace's events, appended together after sequence ``expected_seq``."""

    subject: str
    expected_seq: int
    payloads: list[bytes]
    msg_ids: list[str]
    hashes: list[str]
    """Each payload's sha256, sent as ``Ws-Event-Hash``."""
    context: Any = None
    """Whatever the submitter wants back in ``on_commit`` (the decoded events)."""
    fence: Fence | None = None
    """On a cluster: the partition epoch the append is fenced on (``partitions.py``)."""
    after: Group | None = None
    """The same workspace's group this one was decided after, while that one was in flight:
    this one is sent once that one is acknowledged, its ``expected_seq`` that one's last
    sequence (the workspace's CAS, chained); never if that one fails."""
    future: asyncio.Future[list[int]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.payloads)


OnCommit = Callable[[list[tuple["Group", list[int]]]], Awaitable[None]]


class Appender:
    """Sends queued groups to the log, several sends in flight, and applies what committed.

    A lone event goes out as a plain CAS publish (an atomic batch costs ~4 ms even for one
    message on nats-server 2.15, a publish ~0.5 ms); two or more go as one atomic batch. A
    workspace has at most one group in flight, so sends in flight never share a workspace
    and can overlap. Groups are answered as soon as the log acknowledges them (the durable
    point); ``on_commit`` (the projection update, the writer's ``Applier.apply``, given to
    ``start``) runs afterwards, in commit order, batching whatever has committed meanwhile
    into one call.
    """

    def __init__(
        self,
        nc: NATS,
        *,
        max_events: int = MAX_BATCH_EVENTS,
        max_bytes: int = MAX_BATCH_BYTES,
        max_inflight: int = 64,
        timeout: float = 10.0,
    ) -> None:
        self._nc = nc
        self._max_events, self._max_bytes, self._timeout = max_events, max_bytes, timeout
        self._max_inflight = max_inflight
        self._inflight = 0
        self._fences_busy: set[str] = set()
        """Fence subjects (partitions) with a send in flight."""
        self._queue: list[Group] = []
        self._wakeup = asyncio.Event()
        self._committed: list[tuple[Group, list[int]]] = []
        self._commit_wakeup = asyncio.Event()
        self._applied = asyncio.Event()
        self._applied.set()
        self._unapplied: Counter[str] = Counter()
        """Subjects (workspaces) with committed groups not yet through ``on_commit``."""
        self._progress = asyncio.Event()
        """Set (and replaced) after each ``on_commit``."""
        self._hurry = asyncio.Event()
        """Someone waits on the projection: apply now rather than linger."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.sends = 0
        """Appends sent to the log (a publish or an atomic batch each), since the start."""
        self.events = 0
        """Events they carried."""
        self.chained = 0
        """Groups decided while their workspace's previous group was in flight, sent
        chained to it."""

    def start(self, on_commit: OnCommit) -> None:
        """Send what is submitted; hand what committed to ``on_commit``."""
        for coro in (self._run(), self._apply_loop(on_commit)):
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        await self.applied()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for group in self._queue:
            if not group.future.done():
                group.future.set_exception(AppendError("writer stopping", uncertain=False))

    def submit(self, group: Group) -> asyncio.Future[list[int]]:
        self._queue.append(group)
        self._wakeup.set()
        return group.future

    async def applied(self, subject: str | None = None) -> None:
        """Wait until everything acknowledged so far (of ``subject`` alone, when given) has
        been through ``on_commit``; the applier stops lingering for whoever waits.

        A workspace loaded cold (its actor was evicted) waits only for its own commits, which
        it rarely has: before, it waited for the whole applier's linger (~50 ms), the cost of
        every cold load (issue 17)."""
        if subject is not None:
            while self._unapplied[subject]:
                progress = self._progress
                self._hurry.set()
                await progress.wait()
            return
        while not self._applied.is_set():
            self._hurry.set()
            await self._applied.wait()

    def _take(self) -> list[Group]:
        """The next batch: queued groups in order, within the size limits, skipping those of
        a partition that has a send in flight (on a replicated stream the server refuses a
        second check of a fence subject while one is pending)."""
        batch: list[Group] = []
        kept: list[Group] = []
        events = size = 0
        full = False
        for group in self._queue:
            if group.after is not None and not self._chain(group):
                if not group.future.done():  # waits for the group before it
                    kept.append(group)
                continue
            fence = group.fence.subject if group.fence is not None else None
            n = len(group.payloads)
            if batch and (events + n > self._max_events or size + group.size > self._max_bytes):
                full = True
            if full or (fence is not None and fence in self._fences_busy):
                kept.append(group)
                continue
            batch.append(group)
            events, size = events + n, size + group.size
        self._queue = kept
        self._fences_busy |= {g.fence.subject for g in batch if g.fence is not None}
        return batch

    def _chain(self, group: Group) -> bool:
        """Whether ``group``, chained to an earlier one, may go: that one is acknowledged
        (``expected_seq`` becomes its last sequence). If that one failed, ``group`` fails
        unsent (its decisions assumed that one's changes)."""
        after = group.after
        assert after is not None
        if not after.future.done():
            return False
        if after.future.cancelled() or after.future.exception() is not None:
            group.future.set_exception(
                AppendError("not sent: the group before it was not appended", uncertain=False)
            )
            return False
        group.expected_seq, group.after = after.future.result()[-1], None
        self.chained += 1
        return True

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue and self._inflight < self._max_inflight:
                batch = self._take()
                if not batch:  # every queued group waits for its partition's send
                    break
                self._inflight += 1
                task = asyncio.create_task(self._commit(batch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _commit(self, groups: list[Group]) -> None:
        """Send ``groups`` as one batch; if it fails, each group alone (one stale workspace
        does not fail the others): a group that still fails gets its ``AppendError``."""
        try:
            sends = [groups]
            while sends:
                sending = sends.pop(0)
                try:
                    seqs = await self._send(sending)
                except AppendError as exc:
                    if len(sending) > 1:
                        log.info(
                            "batch of %d groups failed (%s); retrying each alone", len(sending), exc
                        )
                        sends = [[group] for group in sending]
                    else:
                        _APPENDS[exc.outcome].inc()
                        sending[0].future.set_exception(exc)
                    continue
                _APPENDS["ok"].inc(len(sending))
                committed = list(zip(sending, seqs, strict=True))
                self._committed.extend(committed)
                self._unapplied.update(group.subject for group in sending)
                self._applied.clear()
                self._commit_wakeup.set()
                for group, group_seqs in committed:
                    if not group.future.done():
                        group.future.set_result(group_seqs)
        finally:
            self._inflight -= 1
            self._fences_busy -= {g.fence.subject for g in groups if g.fence is not None}
            self._wakeup.set()

    async def _apply_loop(self, on_commit: OnCommit) -> None:
        while True:
            await self._commit_wakeup.wait()
            # Replies went out at the ack, so unless someone waits on the projection (a load,
            # a content read), gather a few milliseconds of commits into one transaction.
            if not self._hurry.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), APPLY_LINGER_S)
            self._hurry.clear()
            self._commit_wakeup.clear()
            while self._committed:
                batch, self._committed = self._committed, []
                try:
                    await on_commit(batch)
                except Exception:  # the actors concerned reload from the log
                    log.exception("projection update failed; the log has the events")
                finally:
                    for group, _ in batch:  # no zeros kept: bounded by what is unapplied
                        if self._unapplied[group.subject] > 1:
                            self._unapplied[group.subject] -= 1
                        else:
                            del self._unapplied[group.subject]
                    self._progress.set()
                    self._progress = asyncio.Event()
            self._applied.set()

    @staticmethod
    def _fence(groups: list[Group], msgs: list[tuple[str, bytes, dict[str, str]]]) -> None:
        """Put one check of each partition's fence in the batch (the batch is atomic: one
        check covers all of it). A message carries one sequence check: the fence goes on a
        group's second message where there is one (its first keeps the workspace CAS); else
        a lone event trades its workspace CAS for the fence, which implies it (only the
        holder of the current epoch appends to the partition, and it loaded the workspace
        from the stream leader after taking it)."""
        chosen: dict[str, tuple[Fence, int, bool]] = {}
        first = 0
        for group in groups:
            if group.fence is not None:
                trades = len(group.payloads) == 1
                current = chosen.get(group.fence.subject)
                if current is None or (current[2] and not trades):
                    index = first if trades else first + 1
                    chosen[group.fence.subject] = (group.fence, index, trades)
            first += len(group.payloads)
        for fence, index, _ in chosen.values():
            headers = msgs[index][2]
            headers["Nats-Expected-Last-Subject-Sequence"] = str(fence.seq)
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = fence.subject

    async def _send(self, groups: list[Group]) -> list[list[int]]:
        """Publish ``groups`` as one atomic batch; return each group's sequences.

        Raises:
            AppendError: the batch was refused or its acknowledgement did not arrive.
        """
        msgs: list[tuple[str, bytes, dict[str, str]]] = []
        for group in groups:
            rows = zip(group.payloads, group.msg_ids, group.hashes, strict=True)
            for i, (payload, msg_id, digest) in enumerate(rows):
                headers = {"Nats-Msg-Id": msg_id, HEADER_EVENT_HASH: digest}
                if i == 0:
                    headers["Nats-Expected-Last-Subject-Sequence"] = str(group.expected_seq)
                msgs.append((group.subject, payload, headers))
        self._fence(groups, msgs)
        started = time.perf_counter()
        self.sends += 1
        self.events += len(msgs)
        if len(msgs) > 1:  # else a plain publish: same CAS and dedup, no batch overhead
            batch_id = uuid.uuid4().hex
            for n, (_, _, headers) in enumerate(msgs, 1):
                headers["Nats-Batch-Id"] = batch_id
                headers["Nats-Batch-Sequence"] = str(n)
            msgs[-1][2]["Nats-Batch-Commit"] = "1"
        try:
            for subject, payload, headers in msgs[:-1]:
                await self._nc.publish(subject, payload, headers=headers)
            subject, payload, headers = msgs[-1]
            reply = await self._nc.request(subject, payload, headers=headers, timeout=self._timeout)
        except nats.errors.TimeoutError:
            raise AppendError("the log did not acknowledge in time", uncertain=True) from None
        except nats.errors.NoRespondersError:
            raise AppendError("JetStream is not available", uncertain=False) from None
        except nats.errors.Error as exc:
            raise AppendError(f"append failed: {exc}", uncertain=True) from None
        try:
            ack = json.loads(reply.data)
        except ValueError:
            raise AppendError(f"unreadable ack: {reply.data[:200]!r}", uncertain=True) from None
        if "error" in ack:
            err = ack["error"]
            # 10201: a message id in the batch was already stored: it may be ours, from an
            # attempt whose ack we lost. Either way the workspace must re-read the log.
            raise AppendError(
                str(err.get("description")),
                uncertain=err.get("err_code") == 10201,
                code=err.get("err_code"),
            )
        if ack.get("duplicate"):
            raise AppendError("message id already in the log", uncertain=True, code=10201)
        APPEND_SECONDS.observe(time.perf_counter() - started)
        BATCH_EVENTS.observe(len(msgs))
        last = int(ack["seq"])
        first = last - len(msgs) + 1
        out, n = [], first
        for group in groups:
            out.append(list(range(n, n + len(group.payloads))))
            n += len(group.payloads)
        return out
