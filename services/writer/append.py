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
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import prometheus_client as prom
from nats.aio.client import Client as NATS

from contracts.subjects import HEADER_EVENT_HASH
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
APPEND_FAILURES = prom.Counter(
    "quill_writer_append_failures_total", "Groups the log refused or did not acknowledge.", ["why"]
)


APPLY_LINGER_S = 0.05


class AppendError(Exception):
    """The group was not committed, or its fate is unknown (``uncertain``)."""

    def __init__(self, message: str, *, uncertain: bool, code: int | None = None) -> None:
        super().__init__(message)
        self.uncertain = uncertain
        self.code = code


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
    point); ``on_commit`` (the projection update) runs afterwards, in commit order, batching
    whatever has committed meanwhile into one call.
    """

    def __init__(
        self,
        nc: NATS,
        on_commit: OnCommit,
        *,
        max_events: int = 512,
        max_bytes: int = 6 * 1024 * 1024,
        max_inflight: int = 64,
        timeout: float = 10.0,
    ) -> None:
        self._nc = nc
        self._on_commit = on_commit
        self._max_events, self._max_bytes, self._timeout = max_events, max_bytes, timeout
        self._max_inflight = max_inflight
        self._inflight = 0
        self._queue: list[Group] = []
        self._wakeup = asyncio.Event()
        self._committed: list[tuple[Group, list[int]]] = []
        self._commit_wakeup = asyncio.Event()
        self._applied = asyncio.Event()
        self._applied.set()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        for coro in (self._run(), self._apply_loop()):
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

    async def applied(self) -> None:
        """Wait until everything acknowledged so far has been through ``on_commit``."""
        while not self._applied.is_set():
            await self._applied.wait()

    def _take(self) -> list[Group]:
        batch: list[Group] = []
        events = size = 0
        while self._queue:
            group = self._queue[0]
            n = len(group.payloads)
            if batch and (events + n > self._max_events or size + group.size > self._max_bytes):
                break
            batch.append(self._queue.pop(0))
            events, size = events + n, size + group.size
        return batch

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue and self._inflight < self._max_inflight:
                self._inflight += 1
                task = asyncio.create_task(self._commit(self._take()))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _commit(self, groups: list[Group]) -> None:
        try:
            await self._commit_groups(groups)
        finally:
            self._inflight -= 1
            self._wakeup.set()

    async def _commit_groups(self, groups: list[Group]) -> None:
        try:
            seqs = await self._send(groups)
        except AppendError as exc:
            if len(groups) == 1:
                APPEND_FAILURES.labels("uncertain" if exc.uncertain else "refused").inc()
                groups[0].future.set_exception(exc)
                return
            log.info("batch of %d groups failed (%s); retrying each alone", len(groups), exc)
            for group in groups:
                await self._commit_groups([group])
            return
        committed = list(zip(groups, seqs, strict=True))
        self._committed.extend(committed)
        self._applied.clear()
        self._commit_wakeup.set()
        for group, group_seqs in committed:
            if not group.future.done():
                group.future.set_result(group_seqs)

    async def _apply_loop(self) -> None:
        while True:
            await self._commit_wakeup.wait()
            # Nobody waits on the projection (replies went out at the ack), so gather a few
            # milliseconds of commits into one transaction.
            await asyncio.sleep(APPLY_LINGER_S)
            self._commit_wakeup.clear()
            while self._committed:
                batch, self._committed = self._committed, []
                try:
                    await self._on_commit(batch)
                except Exception:
                    log.exception("projection update failed; the log has the events")
            self._applied.set()

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
            if group.fence is not None:
                # The fence check rides on the group's last message. A message carries one
                # sequence check: a lone event trades its workspace CAS for the fence, which
                # implies it (only the holder of the current epoch appends to the partition,
                # and it loaded the workspace after taking it).
                fenced = msgs[-1][2]
                fenced["Nats-Expected-Last-Subject-Sequence"] = str(group.fence.seq)
                fenced["Nats-Expected-Last-Subject-Sequence-Subject"] = group.fence.subject
        started = time.perf_counter()
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
