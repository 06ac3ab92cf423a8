"""Batched direct gets: a subject's messages from a stream without a consumer.

A consumer per read lingers on the server after the read (nats-py deletes none), and the
server refuses the 1,001st (``maximum consumers limit reached``): log reads and blob gets
reached that within seconds. A batched direct get (``$JS.API.DIRECT.GET.<stream>`` with
``{"seq", "next_by_subj", "batch", "max_bytes"}``, nats-server 2.11+) answers with the
messages, then a ``Status: 204`` end-of-batch message; ``404`` when nothing is left from
``seq``. The stream must allow direct gets. A replica behind the leader may answer: callers
that know what must exist check what they got and ask the leader for the rest.
"""

from __future__ import annotations

import json

from nats.js import JetStreamContext

BATCH = 256
BATCH_BYTES = 16 * 1024 * 1024
"""One request returns at most this many messages and (about) this many bytes."""


async def messages(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    after: int = 0,
    upto: int | None = None,
    count: int | None = None,
    batch: int = BATCH,
    max_bytes: int = BATCH_BYTES,
    idle: float = 30.0,
) -> list[tuple[int, dict[str, str], bytes]]:
    """``(seq, headers, data)`` of the messages on ``subject`` after stream sequence
    ``after``, up to ``upto`` and at most ``count`` of them, in order; fewer when the server
    has no more (or the replica answering is behind).

    Raises:
        TimeoutError: the server did not answer within ``idle`` seconds.
    """
    nc = js._nc
    api = f"{js._prefix}.DIRECT.GET.{stream}"
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    out: list[tuple[int, dict[str, str], bytes]] = []
    seq = after + 1
    try:
        while (upto is None or seq <= upto) and (count is None or len(out) < count):
            size = batch
            if upto is not None:
                size = min(size, upto - seq + 1)
            if count is not None:
                size = min(size, count - len(out))
            request = {"seq": seq, "next_by_subj": subject, "batch": size, "max_bytes": max_bytes}
            await nc.publish(api, json.dumps(request).encode(), reply=inbox)
            got = 0
            while True:
                msg = await sub.next_msg(timeout=idle)
                headers = msg.headers or {}
                status = headers.get("Status")
                if status == "204":  # the end of this batch
                    break
                if status is not None:  # 404: nothing left from seq on
                    return out
                at = int(headers["Nats-Sequence"])
                seq = at + 1
                if (upto is None or at <= upto) and (count is None or len(out) < count):
                    out.append((at, headers, msg.data))
                    got += 1
            if not got:
                return out
    finally:
        await sub.unsubscribe()
    return out
