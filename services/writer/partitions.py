"""Partition leases and epoch fencing: which writer serves which workspaces on a cluster.

The NATS servers map every command subject onto one of ``count`` partitions
(``ws.cmd.<t>.<w>.<op>`` → ``ws.cmdp.<p>.<t>.<w>.<op>``, subject mapping ``partition()``). A
writer serves a partition while it holds the partition's lease, the key ``partition.<p>`` in
the ``WS_LEASES`` bucket, written with a per-key TTL and renewed by CAS on its revision. A
lease not renewed within its TTL vanishes (the server leaves a delete marker, so every writer
sees it go at once) and the next writer takes it.

Taking a partition bumps its *epoch*: a message on ``ws.fence.<p>`` in ``WS_EVENTS``,
appended with CAS on the previous one. Every append of the partition's workspaces carries
``Nats-Expected-Last-Subject-Sequence-Subject: ws.fence.<p>`` with the sequence of the
holder's epoch message, so a writer that lost its lease (paused, partitioned away, slow to
notice) cannot append once another has taken over, even with a correct workspace sequence.
A workspace's state is loaded after its partition's epoch was bumped, from the stream leader,
so the holder of the current epoch is the only writer that can extend its chain.

Each writer keeps a membership key (``writer.<instance>``, same TTL) and aims for its fair
share, ``ceil(count / live writers)``: it takes free partitions until it has its share
(rendezvous hashing spreads the choice so writers rarely race for the same one) and hands
back the surplus when writers join (drain: stop taking commands, finish those in flight,
delete the lease so the next writer takes it without waiting for the TTL).

Size: leases, membership, epochs and hand-over are one protocol with one set of invariants
(the docstring above); keeping them in one module keeps that argument in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import nats.errors
import prometheus_client as prom
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from contracts.subjects import BUCKET_LEASES, STREAM_EVENTS, Subjects
from infra import assets
from infra.loops import Loop

log = logging.getLogger("quill.writer.partitions")

HELD = prom.Gauge("quill_writer_partitions_held", "Partitions this writer holds the lease on.")
TAKEN = prom.Counter("quill_writer_partitions_taken_total", "Partitions taken (epoch bumped).")
LOST = prom.Counter(
    "quill_writer_partitions_lost_total", "Partitions lost without handing them back.", ["why"]
)
RELEASED = prom.Counter("quill_writer_partitions_released_total", "Partitions handed back.")

CONFIG_KEY = "config"


@dataclass(frozen=True, slots=True)
class Fence:
    """What every append of a partition's workspaces is checked against."""

    subject: str
    seq: int
    """Sequence of the holder's epoch message on ``subject``."""
    epoch: int


@dataclass
class Lease:
    partition: int
    revision: int
    fence: Fence
    renewed: float
    """``monotonic()`` of the last successful renewal."""
    sub: Subscription | None = None


@dataclass
class Seen:
    """A key of the bucket as the watcher last saw it."""

    value: dict[str, object]
    revision: int
    at: float


async def leases_bucket(js: JetStreamContext, replicas: int) -> KeyValue:
    """The ``WS_LEASES`` bucket (created if missing): one revision per key, per-key TTLs,
    and a marker when a key expires so that watchers see it go. Writers (and ``quill
    cluster up``) starting together may all create it: a lost race is a success
    (``infra/assets.py``).

    Raises:
        nats.js.errors.APIError: JetStream refused the create.
    """
    about = "Quill: writer leases on command partitions"  # read from the stream leader
    return await assets.key_value(js, BUCKET_LEASES, about, replicas, limit_marker_ttl=60.0)


class Holder(Protocol):
    """What is done with a partition's workspaces as the partition comes and goes (the
    writer's actors)."""

    def forget_partition(self, partition: int) -> None:
        """The partition was just taken: whatever was known of its workspaces is stale."""

    async def drain_partition(self, partition: int, grace_s: float) -> None:
        """Let the partition's commands in flight finish (the lease still holds)."""

    async def drop_partition(self, partition: int) -> None:
        """The partition is another writer's now: answer what waits here (retriable)."""


def _rank(instance: str, partition: int) -> bytes:
    return hashlib.blake2b(f"{instance}/{partition}".encode(), digest_size=8).digest()


def _upkeep_failed(exc: Exception) -> None:
    log.exception("lease upkeep failed; retrying")


class Partitions:
    """The partitions this writer holds, their leases, epochs and subscriptions."""

    _subscribe: Callable[[int], Awaitable[Subscription]]
    """Starts serving a partition taken (given to ``start``)."""
    _holder: Holder
    """Told when a partition is taken, handed back or lost (given to ``start``)."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        instance: str,
        replicas: int,
        count: int,
        ttl_s: float,
    ) -> None:
        """``replicas`` is the ``WS_LEASES`` bucket's."""
        if count < 1:
            raise ValueError("partitions must be at least 1")
        if ttl_s < 2:
            raise ValueError("the lease TTL must be at least 2 seconds")
        self.count, self.ttl_s = count, ttl_s
        self.tick_s = ttl_s / 4
        self.instance = instance
        self.replicas = replicas
        self.js = js
        self.subjects = subjects
        self.held: dict[int, Lease] = {}
        self._seen: dict[str, Seen] = {}
        self._kv: KeyValue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._member_rev = 0
        self._member_renewed = 0.0
        self._stopping = False
        self._upkeep = Loop(
            "partition-leases",
            self._renew_and_balance,
            every=self.tick_s,
            woken=True,
            wait_first=True,
            failed=_upkeep_failed,
        )
        """Renews the leases every tick, and balances them when a writer came or went."""
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ queries
    def fence(self, partition: int) -> Fence | None:
        """The fence of ``partition`` while this writer holds it, else None."""
        lease = self.held.get(partition)
        return lease.fence if lease is not None else None

    async def still_holds(self, partition: int, fence: Fence) -> bool:
        """Whether ``fence`` is still the partition's epoch (asks the stream leader); when
        it is not, the partition is given up at once."""
        try:
            last = await self.js.get_last_msg(STREAM_EVENTS, fence.subject, direct=False)
            current = int(last.seq or 0)
        except Exception:
            return True  # cannot tell: the append path retries, the renewal loop decides
        if current == fence.seq:
            return True
        lease = self.held.get(partition)
        if lease is not None and lease.fence == fence:
            await self._lose(partition, "fenced")
        return False

    def info(self) -> dict[str, object]:
        return {
            "partitions": self.count,
            "held": sorted(self.held),
            "writers": sorted(self._live_writers()),
        }

    # ------------------------------------------------------------------ lifetime
    async def start(
        self,
        subscribe: Callable[[int], Awaitable[Subscription]],
        holder: Holder,
        timeout: float = 60.0,
    ) -> None:
        """Join the deployment's writers and take a first share of the partitions:
        ``subscribe`` starts serving a partition taken (the entry's); ``holder`` is told when
        one is taken, handed back or lost (the actors).

        Raises:
            RuntimeError: this writer's partition count is not the deployment's.
        """
        self._subscribe, self._holder = subscribe, holder
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._kv = kv = await leases_bucket(self.js, self.replicas)
                await self._check_config(kv)
                await self._renew_membership()
                break
            except (nats.errors.Error, TimeoutError) as exc:
                # a bucket just created on a cluster has no leader for a moment
                if time.monotonic() > deadline:
                    raise
                log.info("WS_LEASES not ready (%r); retrying", exc)
                await asyncio.sleep(0.5)
        watcher = await kv.watchall()
        initial = asyncio.get_running_loop().create_future()
        self._tasks.append(asyncio.create_task(self._watch(watcher, initial)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(initial, 10)
        await self._balance()
        self._upkeep.start()

    async def stop(self, grace_s: float = 10.0) -> None:
        """Hand every partition back (drained), so that others take over without waiting
        for the leases to expire: stop taking commands, let those in flight finish, delete
        the leases (briefly: if NATS is gone, the leases expire on their own)."""
        self._stopping = True
        await self._upkeep.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        leases = list(self.held.values())
        for lease in leases:
            await self._unserve(lease)
        await asyncio.gather(
            *(self._holder.drain_partition(lease.partition, grace_s) for lease in leases)
        )
        self.held.clear()
        HELD.set(0)
        await asyncio.gather(
            *(self._delete(self._lease_key(lease.partition), lease.revision) for lease in leases)
        )
        RELEASED.inc(len(leases))
        for lease in leases:
            await self._holder.drop_partition(lease.partition)
        if self._member_rev:
            await self._delete(self._member_key, None)  # only this writer writes it

    async def _delete(self, key: str, revision: int | None, timeout: float = 2.0) -> None:
        """Delete ``key`` (if it is still at ``revision``); give up after ``timeout``."""
        assert self._kv is not None
        try:
            await asyncio.wait_for(self._kv.delete(key, last=revision), timeout)
        except Exception as exc:
            log.warning("could not delete %s: %r (it expires on its own)", key, exc)

    # ------------------------------------------------------------------ internals
    @property
    def _member_key(self) -> str:
        return f"writer.{self.instance}"

    def _lease_key(self, partition: int) -> str:
        return f"partition.{partition}"

    async def _check_config(self, kv: KeyValue) -> None:
        """Every writer of a deployment must agree on the partition count (it is also in
        the NATS servers' mapping)."""
        wanted = json.dumps({"partitions": self.count}).encode()
        try:
            await kv.create(CONFIG_KEY, wanted)
            return
        except KeyWrongLastSequenceError:
            pass
        entry = await kv.get(CONFIG_KEY)
        found = json.loads(entry.value or b"{}").get("partitions")
        if found != self.count:
            raise RuntimeError(
                f"this deployment has {found} partitions (WS_LEASES key {CONFIG_KEY!r}); "
                f"this writer was started with --partitions {self.count}"
            )

    async def _publish(self, key: str, value: dict[str, object], last: int) -> int:
        """Write ``key`` with the lease TTL if its revision is still ``last`` (0: absent)."""
        assert self._kv is not None
        data = json.dumps(value).encode()
        if last == 0:
            try:
                return await self._kv.create(key, data, msg_ttl=self.ttl_s)
            except KeyWrongLastSequenceError:
                last = await self._tombstone(key)  # an expired or deleted key is free
        ack = await self.js.publish(
            f"$KV.{BUCKET_LEASES}.{key}",
            data,
            headers={"Nats-Expected-Last-Subject-Sequence": str(last)},
            msg_ttl=self.ttl_s,
        )
        return int(ack.seq)

    async def _tombstone(self, key: str) -> int:
        """The revision of ``key``'s delete or expiry marker.

        Raises:
            KeyWrongLastSequenceError: the key holds a live value.
        """
        last = await self.js.get_last_msg(f"KV_{BUCKET_LEASES}", f"$KV.{BUCKET_LEASES}.{key}")
        headers = last.headers or {}
        if last.data and "KV-Operation" not in headers and "Nats-Marker-Reason" not in headers:
            raise KeyWrongLastSequenceError()
        return int(last.seq or 0)

    async def _renew_membership(self) -> None:
        value: dict[str, object] = {"writer": self.instance, "at": time.time()}
        try:
            self._member_rev = await self._publish(self._member_key, value, self._member_rev)
        except (KeyWrongLastSequenceError, APIError):
            self._member_rev = await self._publish(self._member_key, value, 0)

    async def _watch(self, watcher: KeyValue.KeyWatcher, initial: asyncio.Future[None]) -> None:
        while True:
            entry = await watcher.updates(timeout=None)  # type: ignore[no-untyped-call]
            if entry is None:
                if not initial.done():
                    initial.set_result(None)
                continue
            before = self._seen.get(entry.key)
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                changed = self._seen.pop(entry.key, None) is not None
            else:
                try:
                    value = json.loads(entry.value)
                except ValueError:
                    continue
                self._seen[entry.key] = Seen(value, int(entry.revision or 0), time.monotonic())
                changed = before is None or before.value.get("writer") != value.get("writer")
            if changed:  # a writer came or went, a lease changed hands: not a mere renewal
                self._upkeep.wake()
            if entry.delta == 0 and not initial.done():
                initial.set_result(None)

    def _live_writers(self) -> set[str]:
        now = time.monotonic()
        live = {
            str(seen.value.get("writer"))
            for key, seen in self._seen.items()
            if key.startswith("writer.") and now - seen.at < self.ttl_s * 1.5
        }
        return live | {self.instance}

    def _free(self, partition: int) -> bool:
        """No live lease on ``partition`` as far as the watcher knows (an entry not renewed
        for a whole TTL has expired even if its marker was missed)."""
        seen = self._seen.get(self._lease_key(partition))
        return seen is None or time.monotonic() - seen.at > self.ttl_s * 1.5

    async def _renew_and_balance(self) -> None:
        await self._renew()
        await self._balance()

    async def _renew(self) -> None:
        now = time.monotonic()
        if now - self._member_renewed >= self.tick_s * 0.9:
            try:
                await self._renew_membership()
                self._member_renewed = now
            except Exception as exc:
                log.warning("cannot renew this writer's membership: %r", exc)
        for partition, lease in list(self.held.items()):
            if now - lease.renewed < self.tick_s * 0.9:
                continue
            value = self._lease_value(lease.fence)
            try:
                lease.revision = await self._publish(
                    self._lease_key(partition), value, lease.revision
                )
                lease.renewed = time.monotonic()
            except (KeyWrongLastSequenceError, APIError) as exc:
                log.warning("lease on partition %d lost: %s", partition, exc)
                await self._lose(partition, "taken")
            except Exception as exc:
                # Cannot reach JetStream: keep serving only while the lease surely holds
                # (appends are fenced anyway, this only stops accepting commands).
                if time.monotonic() - lease.renewed > self.ttl_s * 0.8:
                    log.warning("cannot renew partition %d (%s): giving it up", partition, exc)
                    await self._lose(partition, "unreachable")

    def _lease_value(self, fence: Fence) -> dict[str, object]:
        return {"writer": self.instance, "epoch": fence.epoch, "fence_seq": fence.seq}

    async def _balance(self) -> None:
        if self._stopping:
            return
        async with self._lock:
            share = math.ceil(self.count / len(self._live_writers()))
            surplus = len(self.held) - share
            if surplus > 0:
                # Hand back the partitions this writer ranks lowest (others rank them high).
                order = sorted(self.held, key=lambda p: _rank(self.instance, p))
                for partition in order[:surplus]:
                    await self._release(partition, self.ttl_s / 2)
                return
            wanted = share - len(self.held)
            if wanted <= 0:
                return
            free = [p for p in range(self.count) if p not in self.held and self._free(p)]
            free.sort(key=lambda p: _rank(self.instance, p), reverse=True)
            for partition in free[:wanted]:
                await self._take(partition)

    async def _take(self, partition: int) -> None:
        key = self._lease_key(partition)
        placeholder = Fence(self.subjects.fence(partition), 0, 0)
        try:
            revision = await self._publish(key, self._lease_value(placeholder), 0)
        except (KeyWrongLastSequenceError, APIError):
            return  # someone else has it
        try:
            fence = await self._bump_epoch(partition)
            revision = await self._publish(key, self._lease_value(fence), revision)
        except Exception as exc:
            log.warning("could not take partition %d: %s", partition, exc)
            with contextlib.suppress(Exception):
                assert self._kv is not None
                await self._kv.delete(key, last=revision)
            return
        lease = self.held[partition] = Lease(partition, revision, fence, time.monotonic())
        self._holder.forget_partition(partition)  # whatever was loaded before is stale
        lease.sub = await self._subscribe(partition)
        TAKEN.inc()
        HELD.set(len(self.held))
        log.info("took partition %d (epoch %d)", partition, fence.epoch)

    async def _bump_epoch(self, partition: int) -> Fence:
        subject = self.subjects.fence(partition)
        try:
            last = await self.js.get_last_msg(STREAM_EVENTS, subject, direct=False)
            previous = json.loads(last.data or b"{}").get("epoch", 0)
            last_seq = int(last.seq or 0)
        except NotFoundError:
            previous, last_seq = 0, 0
        epoch = int(previous) + 1
        body = {"partition": partition, "epoch": epoch, "writer": self.instance}
        ack = await self.js.publish(
            subject,
            json.dumps(body).encode(),
            stream=STREAM_EVENTS,
            headers={"Nats-Expected-Last-Subject-Sequence": str(last_seq)},
        )
        return Fence(subject, int(ack.seq), epoch)

    async def _unserve(self, lease: Lease) -> None:
        if lease.sub is not None:
            with contextlib.suppress(Exception):
                await lease.sub.unsubscribe()
            lease.sub = None

    async def _lose(self, partition: int, why: str) -> None:
        lease = self.held.pop(partition, None)
        if lease is None:
            return
        LOST.labels(why).inc()
        HELD.set(len(self.held))
        await self._unserve(lease)
        await self._holder.drop_partition(partition)

    async def _release(self, partition: int, grace_s: float = 10.0) -> None:
        lease = self.held.get(partition)
        if lease is None:
            return
        await self._unserve(lease)
        await self._holder.drain_partition(partition, grace_s)
        self.held.pop(partition, None)
        HELD.set(len(self.held))
        RELEASED.inc()
        await self._delete(self._lease_key(partition), lease.revision)
        await self._holder.drop_partition(partition)
        log.info("released partition %d", partition)
