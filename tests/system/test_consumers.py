"""``examples/consumers/`` against ``quill up``: the FastStream app and the bare nats-py one, each
a process with durable consumers on ``WS_AUDIT`` and ``WS_EVENTS``, keep a per-tenant activity
table that counts every audit record and every version exactly once: through changes made while
they run, while they are killed (``kill -9``) and started again, after the server lost their
consumers' state (every message delivered again), and through ``kill -9`` of the NATS server
that ``quill up`` then starts again.

Exactly once, not at least once: JetStream delivers at least once, and each consumer records
a message's identity in the same SQLite transaction as its count (``activity.py``), so a
message delivered again is acknowledged and not counted. What the table must hold is read from
the streams themselves (``expected``), never through Quill's queries (they would add audit
records of their own).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import nats
import nats.js.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from tests.helpers import describe, eventually, eventually_sync
from tests.system.test_supervisor import alive, stack_pids
from tests.up import Up

# NATS killed: started again at once
pytestmark = pytest.mark.up(env={"QUILL_RESTART_BACKOFF": "0.2,1"})

T = TypeVar("T")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "consumers"
CONSUMERS = ("faststream_consumer", "nats_consumer")
TENANTS = ("acme", "globex")
Table = dict[str, tuple[int, int, int, int]]
"""tenant → (operations, failures, versions, paths)."""


@pytest_asyncio.fixture
async def nc(up: Up) -> AsyncIterator[NATS]:
    conn = await nats.connect(up.nats_url, max_reconnect_attempts=-1)
    yield conn
    await conn.close()


class Consumer:
    """One example as a process, with its own database and durable names."""

    def __init__(self, up: Up, example: str, where: Path) -> None:
        self.up, self.example, self.db = up, example, where / f"{example}.db"
        self.log = where / f"{example}.log"
        self.name = f"{example.split('_')[0]}-{where.name}"[:40]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Consumer:
        env = {**os.environ, "QUILL_NATS_URL": self.up.nats_url, "ACTIVITY_NAME": self.name,
               "ACTIVITY_DB": str(self.db)}  # fmt: skip
        with self.log.open("ab") as log:  # its own lines, for a failure to show
            self.process = subprocess.Popen(
                [sys.executable, str(EXAMPLES / f"{self.example}.py")],
                cwd=self.db.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    def kill(self) -> None:
        """``kill -9``: wherever it was (between a count and its ack, say)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)

    def table(self) -> Table:
        if not self.db.exists():
            return {}
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True) as db:
            try:
                rows = db.execute(
                    "SELECT tenant, operations, failures, versions, paths FROM activity"
                ).fetchall()
            except sqlite3.OperationalError:  # not created yet
                return {}
        return {r[0]: tuple(r[1:]) for r in rows if r[0] in TENANTS}  # type: ignore[misc]


async def expected(nc: NATS) -> Table:
    """What the streams hold for each tenant: its audit records (and how many failed), its
    events (one a version) and the changes they made."""
    js, table = nc.jetstream(), {}
    for tenant in TENANTS:
        records = await _all(js, "WS_AUDIT", f"ws.audit.{tenant}.>")
        events = await _all(js, "WS_EVENTS", f"ws.evt.{tenant}.>")
        failures = sum(r["outcome"] != "ok" for r in records)
        paths = sum(len(e.get("changes", [])) for e in events)
        table[tenant] = (len(records), failures, len(events), paths)
    return table


async def _all(js: nats.js.JetStreamContext, stream: str, subject: str) -> list[dict[str, object]]:
    info = await js.stream_info(stream, subjects_filter=subject)
    total = sum((info.state.subjects or {}).values())
    out: list[dict[str, object]] = []
    if total:
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
        try:
            while len(out) < total:
                out.append(json.loads((await sub.next_msg(timeout=10)).data))
        finally:
            await sub.unsubscribe()
    return out


async def done(nc: NATS, consumer: Consumer) -> bool:
    """Whether both its durable consumers were handed everything and acknowledged it."""
    js = nc.jetstream()
    for stream, suffix in (("WS_AUDIT", "audit"), ("WS_EVENTS", "events")):
        try:
            info = await js.consumer_info(stream, f"{consumer.name}-{suffix}")
        except nats.js.errors.NotFoundError:
            return False
        if info.num_pending or info.num_ack_pending or not info.delivered.consumer_seq:
            return False
    return True


async def counted_once(nc: NATS, *consumers: Consumer, timeout: float = 60.0) -> Table:
    """Until every consumer has acknowledged all there is and its table is what the streams
    hold (exactly: not one more)."""
    want: Table = {}
    tables: dict[str, Table] = {}

    async def agreed() -> bool:
        nonlocal want, tables
        want = await expected(nc)
        tables = {c.example: c.table() for c in consumers}
        return all(t == want for t in tables.values()) and all(
            [await done(nc, c) for c in consumers]
        )

    try:
        await eventually(agreed, timeout, "each consumer's table is what the streams hold")
    except AssertionError as exc:
        logs = "".join(f"\n--- {c.log.name}:\n{c.log.read_text()[-3000:]}" for c in consumers)
        said = f"{exc}: streams hold {want}, consumers counted {tables}{logs}"
        raise AssertionError(said) from None
    return want


async def changes(quill: Quill, round: str) -> None:
    """A few changes in each tenant, a read, and a refused write (an audited failure)."""
    for tenant in TENANTS:
        ws = quill.workspace(f"{tenant}/activity")
        await retried(partial(ws.create, exist_ok=True))
        for i in range(3):
            await retried(partial(ws.write, f"{round}/{i}.txt", f"{round} {i}\n"))
        await retried(partial(ws.read_text, f"{round}/0.txt"))
        with pytest.raises(QuillError) as refused:
            await ws.write("missing/dir/x.txt", "x", create_parents=False)
        assert refused.value.code == ErrorCode.FILE_NOT_FOUND


async def retried(call: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    """``call()``, again while the services are not back (NATS restarted: UNAVAILABLE, a reader
    catching up with the log: UNAVAILABLE too)."""

    async def answered() -> tuple[T] | None:  # a 1-tuple: true whatever the call returned
        try:
            return (await call(),)
        except QuillError as exc:
            if exc.code not in (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT):
                raise
            return None

    (result,) = await eventually(answered, timeout, f"{describe(call)}, answered")
    return result


async def test_each_change_is_counted_once_across_kills_and_redelivery(
    up: Up, nc: NATS, tmp_path: Path
) -> None:
    quill = await Quill.connect(up.nats_url, actor="tester", timeout=15)
    consumers = [Consumer(up, name, tmp_path).start() for name in CONSUMERS]
    try:
        await changes(quill, "first")
        first = await counted_once(nc, *consumers)
        assert all(first[t][1] >= 1 and first[t][2] >= 4 for t in TENANTS)  # failures, versions
        for c in consumers:
            c.kill()
        await changes(quill, "while-down")  # kept for them by the server
        for c in consumers:
            c.start()
        await counted_once(nc, *consumers)
        for c in consumers:  # the server loses their state: every message comes again
            assert c.stop() == 0
            js = nc.jetstream()
            await js.delete_consumer("WS_AUDIT", f"{c.name}-audit")
            await js.delete_consumer("WS_EVENTS", f"{c.name}-events")
            c.start()
        await changes(quill, "after")
        await counted_once(nc, *consumers)
    finally:
        for c in consumers:
            c.kill()
        await quill.close()


async def test_the_consumers_carry_on_through_a_nats_server_killed(
    up: Up, nc: NATS, tmp_path: Path
) -> None:
    quill = await Quill.connect(up.nats_url, actor="tester", timeout=15, retries=0)
    consumers = [Consumer(up, name, tmp_path).start() for name in CONSUMERS]
    try:
        await changes(quill, "before-restart")
        await counted_once(nc, *consumers)
        old = stack_pids(up)["nats"]
        os.kill(old, signal.SIGKILL)  # their acks in flight, the server's consumer state...
        await asyncio.to_thread(
            eventually_sync,
            lambda: p if (p := stack_pids(up)["nats"]) != old and alive(p) else None,
            60,
            "quill up starting nats-server again",
        )
        await changes(quill, "after-restart")
        await counted_once(nc, *consumers)
        assert all(c.process is not None and c.process.poll() is None for c in consumers)
    finally:
        for c in consumers:
            c.kill()
        await quill.close()
