"""A downstream audit pipeline: a JetStream durable pull consumer on Quill's WS_AUDIT stream.

    python examples/audit_consumer.py --durable audit-sink --out audit.jsonl

(``--nats-url``, default ``$QUILL_NATS_URL`` or ``nats://127.0.0.1:4222``: a user that may
read WS_AUDIT and create consumers on it, such as the system user.)

Each audit record (one JSON object per operation, see docs/contract.md) is appended to
``--out`` as one line with its stream sequence (``seq``), flushed to disk, and only then
acknowledged: at least once. After a crash, a record whose ack was lost is delivered again;
its ``seq`` is already in the file, so it is acknowledged and skipped, and the file holds
every record exactly once. The consumer's position is kept by the server under the durable
name: stop this script (or kill it), start it again with the same ``--durable``, and it
resumes where it was, with the records published meanwhile. Only nats-py is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy


def written(out: Path) -> set[int]:
    """The stream sequences already in ``out``; a last line cut short by a crash is dropped
    (its record was not acknowledged: it comes again)."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        out.write_bytes(data)
    return {json.loads(line)["seq"] for line in data.splitlines()}


async def consume(args: argparse.Namespace) -> None:
    nc = await nats.connect(args.nats_url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        args.subject,
        durable=args.durable,
        stream="WS_AUDIT",
        config=ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=args.ack_wait,  # unacknowledged this long (a crash): delivered again
            deliver_policy=DeliverPolicy.ALL,  # a new durable starts at the oldest record
            max_ack_pending=1000,
        ),
    )
    out = Path(args.out)
    seen = written(out)
    new = 0
    with out.open("ab") as sink:
        while args.max is None or new < args.max:
            batch = args.batch if args.max is None else min(args.batch, args.max - new)
            try:
                msgs = await sub.fetch(batch=batch, timeout=5)
            except TimeoutError:  # nats-py's own or asyncio's, as it happens (nats.py#1008)
                continue  # nothing new: ask again
            for msg in msgs:
                seq = msg.metadata.sequence.stream
                if seq not in seen:
                    record = json.loads(msg.data)
                    sink.write(json.dumps({"seq": seq, **record}).encode() + b"\n")
                    sink.flush()
                    os.fsync(sink.fileno())  # on disk before the ack: at least once
                    seen.add(seq)
                    new += 1
                    where = f"{record['tenant']}/{record['workspace']}"
                    what = f"{record['kind']}.{record['op']} {record['outcome']}"
                    print(f"{seq} {where} {what}", flush=True)
                await msg.ack()
    await nc.drain()  # the last acks reach the server before we go


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nats-url", default=os.environ.get("QUILL_NATS_URL", "nats://127.0.0.1:4222")
    )
    parser.add_argument("--durable", default="audit-sink", help="The consumer's durable name.")
    parser.add_argument(
        "--subject", default="ws.audit.>", help="Which records: ws.audit.<tenant>.<workspace>."
    )
    parser.add_argument("--out", default="audit.jsonl", help="File the records are added to.")
    parser.add_argument("--batch", type=int, default=100, help="Records per fetch.")
    parser.add_argument("--ack-wait", type=float, default=30.0, help="Seconds before redelivery.")
    parser.add_argument("--max", type=int, help="Stop after this many new records.")
    asyncio.run(consume(parser.parse_args()))


if __name__ == "__main__":
    main()
