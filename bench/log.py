"""What the log itself can take, without Quill: JetStream atomic batches (the writer's way of
appending) against the core figure's baseline, 64 closed-loop publishers with per-subject CAS,
on one nats-server with ``sync_interval: always``. Shows whether the log or the processes
around it bound Quill's writes on this machine (docs/performance.md, "What bounds a write")."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from nats.js.api import StorageType, StreamConfig

from bench.harness import row
from quill_cli.natsserver import NatsServer

BODY = b"x" * 300
PUBLISHERS = 64
SHAPES = ((40, 1, 1), (40, 1, 2), (40, 2, 2), (40, 4, 4), (128, 1, 1))
"""(messages per batch, streams, concurrent senders)."""


async def cas_publishers(nc: NATS, seconds: float) -> float:
    """64 closed-loop publishers, each on its own subject with CAS: messages per second."""
    last: dict[str, int] = {}
    stop = time.perf_counter() + seconds
    done = 0

    async def publisher(n: int) -> None:
        nonlocal done
        subject = f"s0.cas.{n}"
        while time.perf_counter() < stop:
            headers = {"Nats-Expected-Last-Subject-Sequence": str(last.get(subject, 0))}
            ack = json.loads((await nc.request(subject, BODY, timeout=10, headers=headers)).data)
            if "error" in ack:
                raise RuntimeError(ack)
            last[subject] = ack["seq"]
            done += 1

    await asyncio.gather(*[publisher(n) for n in range(PUBLISHERS)])
    return done / seconds


async def batches(nc: NATS, seconds: float, size: int, streams: int, senders: int) -> float:
    """``senders`` loops each committing ``size``-message atomic batches back to back, spread
    over ``streams`` streams: messages per second."""
    stop = time.perf_counter() + seconds
    done = 0

    async def sender(n: int) -> None:
        nonlocal done
        stream = n % streams
        while time.perf_counter() < stop:
            batch = uuid.uuid4().hex
            for k in range(1, size + 1):
                subject = f"s{stream}.b.{n}.{k}"
                headers = {"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(k)}
                if k < size:
                    await nc.publish(subject, BODY, headers=headers)
                    continue
                headers["Nats-Batch-Commit"] = "1"
                ack = json.loads((await nc.request(subject, BODY, headers=headers)).data)
                if "error" in ack:
                    raise RuntimeError(ack)
            done += size

    await asyncio.gather(*[sender(n) for n in range(senders)])
    return done / seconds


async def main(seconds: float = 3.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        try:
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            for n in range(4):
                config = StreamConfig(
                    name=f"LOG{n}",
                    subjects=[f"s{n}.>"],
                    storage=StorageType.FILE,
                    allow_atomic=True,
                )
                await js.add_stream(config)
            print(
                "The log alone: JetStream atomic batches vs 64 closed-loop CAS publishers "
                f"(300-byte messages, sync_interval: always), {seconds:.0f} s each"
            )
            print()
            print(f"{'figure':<44} {'batches':>16} {'CAS':>16} {'ratio':>8}  note")
            base = await cas_publishers(nc, seconds)
            for size, streams, senders in SHAPES:
                rate = await batches(nc, seconds, size, streams, senders)
                label = f"batches of {size}, {streams} stream(s), {senders} sender(s)"
                note = "messages/s; Quill's writer sends batches of ~40 under load"
                print(row(label, f"{rate:,.0f}/s", f"{base:,.0f}/s", rate / base, note))
            await nc.close()
        finally:
            server.stop()
