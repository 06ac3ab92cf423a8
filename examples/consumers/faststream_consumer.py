"""Per-tenant activity from Quill's streams, with FastStream: two durable pull consumers, one
on the audit trail (``WS_AUDIT``), one on the workspaces' logs (``WS_EVENTS``), counted into
SQLite (``activity.py``) and acknowledged only once counted.

    QUILL_NATS_URL=nats://127.0.0.1:4222 ACTIVITY_DB=activity.db \\
        python examples/consumers/faststream_consumer.py

(or ``faststream run faststream_consumer:app`` from this directory). ``ACTIVITY_NAME``
(default ``activity``) prefixes the durable names, ``<name>-audit`` and ``<name>-events``:
the server keeps each one's position, so a consumer stopped (or killed) and started again
resumes where it was, and one running while NATS restarts carries on once it is back. The
user must be allowed to create consumers on both streams: the system user of ``quill up``.

Why ``WS_EVENTS`` and not ``workspace.updated``: ``ws.updated.<tenant>.<workspace>`` is a
core NATS subject, in no stream. Nothing keeps it for a consumer that is not listening, so no
durable consumer can follow it. ``WS_EVENTS`` holds the same facts (each event's version, op,
actor, request id, time and changes) and keeps them.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from activity import Activity, audit_id, event_id
from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import (
    ConsumerConfig,
    DeliverPolicy,
    JStream,
    NatsBroker,
    NatsMessage,
    PullSub,
)

NAME = os.environ.get("ACTIVITY_NAME", "activity")
store = Activity(os.environ.get("ACTIVITY_DB", "activity.db"))
broker = NatsBroker(
    os.environ.get("QUILL_NATS_URL", "nats://127.0.0.1:4222"),
    max_reconnect_attempts=-1,  # NATS restarted: wait for it, however long it takes
)
app = FastStream(broker)


def durable(stream: str, subject: str, suffix: str) -> Any:
    """A durable pull consumer on one of Quill's streams. ``declare=False``: the stream is
    Quill's, FastStream must not create it nor change its configuration (retention,
    subjects). ``NACK_ON_ERROR``: the ack goes after the handler returns; an exception asks
    for the message again."""
    return broker.subscriber(
        subject,
        stream=JStream(stream, declare=False),
        durable=f"{NAME}-{suffix}",
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL,  # a new consumer starts at the oldest message
            ack_wait=30,  # not acknowledged within 30 s: delivered again
            max_ack_pending=1000,
        ),
        pull_sub=PullSub(batch_size=100, timeout=5),
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )


@durable("WS_AUDIT", "ws.audit.>", "audit")
async def on_audit(record: dict[str, Any], msg: NatsMessage) -> None:
    store.audited(audit_id(msg.raw_message.metadata), record)


@durable("WS_EVENTS", "ws.evt.>", "events")  # not ws.fence.*: the writers' own, no events
async def on_event(event: dict[str, Any], msg: NatsMessage) -> None:
    store.committed(event_id(msg.headers), event)


if __name__ == "__main__":
    asyncio.run(app.run())
