"""Reader bootstrap (``python -m bench bootstrap``): how long a reader replica with no data takes
to serve, replaying the whole log, and starting from a snapshot of the projection (issue 17).

The log is made here, on a bare nats-server: ``--workspaces`` workspaces, each created then
written (one small file, rewritten) until the log holds ``--events`` events, each a
writer-shaped event with its hash chain and tree hash, appended in atomic batches over many
workspaces at once (groups of ``GROUP`` interleaved). Then, as processes (``quill reader``):

1. a reader with no data replays the whole log (``--snapshot-behind 0``): the time from its
   start until it answers the last workspace at its last version (the baseline: what every
   new replica paid before snapshots);
2. that reader makes a snapshot (``ws.sys.snapshot.reader``, what ``quill snapshot`` sends):
   its time and size;
3. ``--tail`` more events are appended (the events a snapshot does not cover: up to
   ``--snapshot-events``, 20,000 by default, 10,000 on average);
4. a reader with no data starts from the snapshot and replays the tail: the same time.

``--keep DIR`` keeps the server's data in ``DIR``; run again with the same ``--keep``, it
measures step 4 alone on the log and snapshot kept (the log takes minutes to make at 1,000,000).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import nats

from bench.synthetic import BATCH, SUBJECTS, T0
from contracts import codec, hashing
from contracts.events import AuditRecord, ChangesCommitted, PutFile, WorkspaceCreated
from contracts.limits import DEFAULT_LIMITS
from contracts.subjects import HEADER_EVENT_HASH, STREAM_EVENTS
from core.plan import Committed
from core.tree import Tree, apply_change
from infra import bus
from infra.store import Store
from quill.client import Quill
from quill_cli.natsserver import NatsServer
from services.reader.follower import TRACKING

EVENTS = 100_000
WORKSPACES = 20_000
TAIL = 10_000
GROUP = 256
"""Workspaces whose events are interleaved in the log."""


def name_of(n: int) -> str:
    return f"w{n:07d}"


def synthesise(
    first: int, workspaces: int, events: int, start_version: int = 0
) -> Iterator[tuple[str, bytes, str, str]]:
    """``(subject, payload, Nats-Msg-Id, hash)`` of ``events`` events over workspaces
    ``first..first+workspaces``: each created (unless ``start_version``), then ``f.txt``
    rewritten, a group of ``GROUP`` at a time, round robin."""
    per = max(events // workspaces, 1)
    made = 0
    for base in range(first, first + workspaces, GROUP):
        group = range(base, min(base + GROUP, first + workspaces))
        trees = {n: Tree() for n in group}
        prev = {n: hashing.ZERO_HASH for n in group}
        last = {n: start_version for n in group}
        for step in range(per):
            for n in group:
                if made >= events:
                    return
                version = last[n] + 1
                at = T0 + timedelta(seconds=version, microseconds=n)
                common = dict(
                    tenant="bench",
                    workspace=name_of(n),
                    version=version,
                    at=at,
                    actor="bench",
                    request_id=f"r{n}-{version}",
                    prev_hash=prev[n],
                )
                if version == 1:
                    event: WorkspaceCreated | ChangesCommitted = WorkspaceCreated(
                        **common, op="create", tree_hash=prev[n], trust="full",
                        limits=DEFAULT_LIMITS,
                    )  # fmt: skip
                else:
                    tree = trees[n]
                    text = f"workspace {n} at version {version}: some words to search\n"
                    data = text.encode()
                    put = PutFile(
                        path="f.txt",
                        sha256=hashing.content_sha256(data),
                        size=len(data),
                        file_version=tree.last_fv.get("f.txt", 0) + 1,
                        created=tree.files["f.txt"].created if "f.txt" in tree.files else at,
                        text=text,
                    )
                    apply_change(tree, put, version, at)
                    event = ChangesCommitted(
                        **common, op="write", tree_hash=hashing.tree_hex(tree.hash), changes=[put]
                    )
                payload = codec.encode(event)
                prev[n], last[n] = hashing.event_hash(payload), version
                subject = SUBJECTS.evt("bench", name_of(n))
                yield subject, payload, SUBJECTS.msg_id("bench", name_of(n), f"r{version}"), prev[n]
                made += 1
            del step


async def append(nc: nats.NATS, events: Iterator[tuple[str, bytes, str, str]]) -> int:
    """Append ``events`` in atomic batches of ``BATCH`` (no CAS: the log is new); return how
    many."""
    count = 0
    batch: list[tuple[str, bytes, str, str]] = []

    async def commit() -> None:
        batch_id = os.urandom(12).hex()
        for k, (subject, payload, msg_id, digest) in enumerate(batch, 1):
            headers = {
                "Nats-Msg-Id": msg_id,
                HEADER_EVENT_HASH: digest,
                "Nats-Batch-Id": batch_id,
                "Nats-Batch-Sequence": str(k),
            }
            if k < len(batch):
                await nc.publish(subject, payload, headers=headers)
                continue
            headers["Nats-Batch-Commit"] = "1"
            ack = json.loads((await nc.request(subject, payload, headers=headers, timeout=60)).data)
            if "error" in ack:
                raise RuntimeError(ack)

    for item in events:
        batch.append(item)
        count += 1
        if len(batch) == BATCH:
            await commit()
            batch = []
    if batch:
        await commit()
    return count


async def project(
    stores: list[tuple[Store, str | None]], events: list[tuple[str, bytes, str, str]], seq: int
) -> None:
    """Apply ``events`` (synthesised; the first at log sequence ``seq + 1``) to each
    ``(store, tracking)`` with the store's own batch apply, at once."""
    batch = [
        Committed(codec.decode_event(data), digest, seq + k)
        for k, (_, data, _, digest) in enumerate(events, 1)
    ]
    await asyncio.gather(*(store.apply(batch, tracking) for store, tracking in stores))


async def audit(nc: nats.NATS, events: list[tuple[str, bytes, str, str]]) -> None:
    """The audit record the writer publishes for each of ``events`` (``WS_AUDIT``)."""
    for _, data, _, _ in events:
        event = codec.decode_event(data)
        record = AuditRecord(
            at=event.at, tenant=event.tenant, workspace=event.workspace, kind="cmd",
            op=event.op, actor=event.actor, session=None, run=None,
            request_id=event.request_id, outcome="ok", error_code=None, duration_ms=1.0,
            version=event.version, paths=["f.txt"] if event.version > 1 else [],
            summary=None, service="writer", instance="bench-grow",
        )  # fmt: skip
        await nc.publish(SUBJECTS.audit(event.tenant, event.workspace), codec.encode(record))
    await nc.flush()


async def grow(url: str, data: Path, first: int, count: int, chunk: int = 4_000) -> None:
    """Workspaces ``first..count-1`` of tenant ``bench``, each created then written once, made
    at the speed of batches while the services are stopped: appended to the log in atomic
    batches, their audit records to ``WS_AUDIT``, and applied to the writer's and the
    reader's projections of ``quill up --data data`` (the store's batch apply, with the
    reader's tracking position), whose contents the reader's trigram index then takes in.
    What the services would have made through commands (but the reads' audit records), some
    hundred times faster: a million workspaces in minutes."""
    nc = await bus.connect(url, "bench-grow")
    writer = await Store.open(data / "writer" / "writer.db", role="writer")
    reader = await Store.open(data / "reader" / "reader.db", role="reader")
    try:
        await bus.ensure_streams(nc, SUBJECTS)
        seq = (await nc.jetstream().stream_info(STREAM_EVENTS)).state.last_seq
        stores: list[tuple[Store, str | None]] = [(writer, None), (reader, TRACKING)]
        pending: list[tuple[str, bytes, str, str]] = []
        made, t0 = 0, time.perf_counter()
        for item in synthesise(first, count - first, 2 * (count - first)):
            pending.append(item)
            if len(pending) == chunk:
                await asyncio.gather(
                    append(nc, iter(pending)), audit(nc, pending), project(stores, pending, seq)
                )
                seq, made, pending = seq + len(pending), made + len(pending), []
                if made % 200_000 == 0:
                    rate = made / (time.perf_counter() - t0)
                    print(f"  ... {made:,} events ({rate:,.0f}/s)", flush=True)
        if pending:
            await asyncio.gather(
                append(nc, iter(pending)), audit(nc, pending), project(stores, pending, seq)
            )
            seq += len(pending)
        last = (await nc.jetstream().stream_info(STREAM_EVENTS)).state.last_seq
        assert last == seq, f"the log ends at {last}, the projections at {seq}"
        while await reader.index_pending(4 * 2**20):
            pass
    finally:
        await reader.close()
        await writer.close()
        await nc.close()


def reader(url: str, data: Path, *more: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "quill", "reader", "--nats-url", url, "--data", str(data)]
    log = open(data.with_suffix(".log"), "wb")  # noqa: SIM115 (the process holds it)
    return subprocess.Popen([*argv, *more], stdout=log, stderr=subprocess.STDOUT)


async def serving(quill: Quill, name: str, version: int, since: float) -> float:
    """Seconds from ``since`` until a reader answers ``name`` at ``version``."""
    ws = quill.workspace(name)
    ws.last_version = version
    async with asyncio.timeout(7200):
        while True:
            try:
                info = await ws.info()
                if info.version >= version:
                    return time.perf_counter() - since
            except Exception:  # no replica in the queue group yet
                await asyncio.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait()


def line(label: str, seconds: float, note: str = "") -> None:
    print(f"{label:<52} {seconds:>9.1f} s   {note}")


class Boot(NamedTuple):
    """How long a reader with no data took, from its start: to answer the latest write (it
    serves once the snapshot is installed, applying a workspace the tail changed first), and
    to have applied the whole tail."""

    served: float
    caught_up: float


async def caught_up(quill: Quill, since: float) -> float:
    """Seconds from ``since`` until the (only) reader says it has caught up with the log."""
    async with asyncio.timeout(7200):
        while True:
            pong = json.loads((await quill.nc.request("ws.sys.ping.reader", b"", timeout=10)).data)
            if pong["caught_up"]:
                return time.perf_counter() - since
            await asyncio.sleep(0.05)


async def from_snapshot(url: str, data: Path, name: str, version: int, tail: int) -> Boot:
    """Start a reader with no data (``data``); seconds until it answers ``name`` at
    ``version``, and until it has caught up, printed with what its log says of the
    snapshot."""
    quill = await Quill.connect(url, actor="bench", timeout=10)
    t0 = time.perf_counter()
    proc = reader(url, data)
    try:
        took = Boot(await serving(quill, name, version, t0), await caught_up(quill, t0))
    finally:
        stop(proc)
        await quill.close()
    line(f"no data, from the snapshot + a tail of {tail:,} (after)", took.served)
    line("  ... until it had applied the whole tail", took.caught_up)
    for text in data.with_suffix(".log").read_text().splitlines():
        if "snapshot" in text or "caught up" in text:
            print(f"  {text.strip()}")
    return took


async def main(
    events: int = EVENTS, workspaces: int = WORKSPACES, tail: int = TAIL, keep: Path | None = None
) -> dict[str, float]:
    """The run; with ``keep``, the server's data stays there, and a later run with the same
    ``keep`` measures only the start from the snapshot again (on the log and snapshot kept)."""
    tmp = keep or Path(tempfile.mkdtemp(prefix="quill-bench-bootstrap-"))
    kept = tmp / "bench.json"
    if kept.exists():
        server = NatsServer(tmp / "nats").start()
        try:
            again = json.loads(kept.read_text())
            print(f"Reader bootstrap, again on the log kept in {tmp}: {again['about']}\n")
            runs = len(list(tmp.glob("again-*.log")))
            took = await from_snapshot(
                server.url, tmp / f"again-{runs}", again["name"], again["version"], again["tail"]
            )
            return {"from_snapshot": took.served, "caught_up": took.caught_up}
        finally:
            server.stop()
    server = NatsServer(tmp / "nats").start()
    procs: list[subprocess.Popen[bytes]] = []
    out: dict[str, float] = {}
    try:
        nc = await bus.connect(server.url, "bench-bootstrap")
        await bus.ensure_streams(nc, SUBJECTS)
        url = server.url
        t0 = time.perf_counter()
        await append(nc, synthesise(0, workspaces, events))
        about = f"{events:,} events over {workspaces:,} workspaces, then a tail of {tail:,}"
        print(f"Reader bootstrap: {about} (log made in {time.perf_counter() - t0:.0f} s)\n")
        per = max(events // workspaces, 1)
        last_ws, last_v = name_of(workspaces - 1), min(per, events)
        quill = await Quill.connect(url, actor="bench", timeout=10)

        t0 = time.perf_counter()
        full = reader(url, tmp / "full", "--snapshot-behind", "0", "--snapshot-events", "0")
        procs.append(full)
        out["replay"] = await serving(quill, f"bench/{last_ws}", last_v, t0)
        line("no data, replaying the whole log (before)", out["replay"],
             f"{events / out['replay']:,.0f} events/s")  # fmt: skip

        t0 = time.perf_counter()
        reply = await nc.request(SUBJECTS.snapshot("reader"), b"", timeout=3600)
        made = json.loads(reply.data)
        assert made["ok"], made
        out["snapshot"] = time.perf_counter() - t0
        out["snapshot_mb"] = made["bytes"] / 2**20
        out["snapshot_stored_mb"] = made["stored_bytes"] / 2**20
        sizes = f"{out['snapshot_mb']:,.0f} MiB, {out['snapshot_stored_mb']:,.0f} MiB stored"
        line("making a snapshot (backup, zstd, upload)", out["snapshot"], sizes)
        stop(full)
        procs.remove(full)
        shutil.rmtree(tmp / "full", ignore_errors=True)

        # the tail: more writes to the first workspaces, after the snapshot
        tail_ws = max(tail // 4, 1)
        await append(nc, synthesise(0, tail_ws, tail, start_version=per))
        name, version = f"bench/{name_of(tail_ws - 1)}", per + max(tail // tail_ws, 1)
        await quill.close()
        await nc.close()
        boot = await from_snapshot(url, tmp / "snap", name, version, tail)
        out["from_snapshot"], out["caught_up"] = boot.served, boot.caught_up
        print(f"  {out['replay'] / out['from_snapshot']:.1f}x faster than replaying the log")
        if keep is not None:
            record = {"about": about, "name": name, "version": version, "tail": tail}
            kept.write_text(json.dumps(record))
    finally:
        for proc in procs:
            stop(proc)
        server.stop()
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    asyncio.run(main())
