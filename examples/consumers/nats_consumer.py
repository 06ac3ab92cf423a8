"""Per-tenant activity from Quill's streams, with nats-py alone: what
``faststream_consumer.py`` does, written out. Two durable pull consumers, one on the audit
trail (``WS_AUDIT``), one on the workspaces' logs (``WS_EVENTS``), counted into SQLite
(``activity.py``) and acknowledged only once counted.

    QUILL_NATS_URL=nats://127.0.0.1:4222 ACTIVITY_DB=activity.db \\
        python examples/consumers/nats_consumer.py

The same environment as ``faststream_consumer.py`` (``ACTIVITY_NAME``: the durable names'
prefix), the same table, the same guarantees; see its docstring for why ``WS_EVENTS`` and not
``workspace.updated``. What FastStream did for us is here by hand: the fetch loop, acking
after the work, asking again for a message whose handling failed, carrying on through a NATS
restart, stopping cleanly on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable

import nats
import nats.errors
from activity import Activity, audit_id, event_id
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

log = logging.getLogger("activity")


async def follow(
    js: JetStreamContext, stream: str, subject: str, durable: str, handle: Callable[[Msg], None]
) -> None:
    """Fetch from the durable consumer ``durable`` on ``stream`` and ``handle`` each message,
    acknowledging it once handled (at least once: see activity.py for counting it once)."""
    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,  # a new consumer starts at the oldest message
        ack_wait=30,  # not acknowledged within 30 s: delivered again
        max_ack_pending=1000,
    )
    sub = await js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
    while True:
        try:
            batch = await sub.fetch(100, timeout=5)
        except TimeoutError:  # nothing new, or NATS away (the client reconnects meanwhile)
            continue  # nats-py raises its own TimeoutError, or asyncio's (nats.py#1008)
        except nats.errors.Error as exc:  # NATS restarting: no responders, closed, ...
            log.warning("%s: %s; fetching again", durable, exc)
            await asyncio.sleep(1)
            continue
        for msg in batch:
            try:
                handle(msg)
            except Exception:
                log.exception("%s: message %s not counted", durable, msg.metadata.sequence)
                await msg.nak(delay=5)  # delivered again in 5 s
                continue
            await msg.ack()


async def main() -> None:
    name = os.environ.get("ACTIVITY_NAME", "activity")
    store = Activity(os.environ.get("ACTIVITY_DB", "activity.db"))
    nc = await nats.connect(
        os.environ.get("QUILL_NATS_URL", "nats://127.0.0.1:4222"),
        max_reconnect_attempts=-1,  # NATS restarted: wait for it, however long it takes
    )
    js = nc.jetstream()

    def audited(msg: Msg) -> None:
        store.audited(audit_id(msg.metadata), json.loads(msg.data))

    def committed(msg: Msg) -> None:
        store.committed(event_id(msg.headers), json.loads(msg.data))

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with asyncio.TaskGroup() as group:  # one follower failing stops the other
        followers = [
            group.create_task(follow(js, "WS_AUDIT", "ws.audit.>", f"{name}-audit", audited)),
            group.create_task(follow(js, "WS_EVENTS", "ws.evt.>", f"{name}-events", committed)),
        ]
        await stop.wait()
        for task in followers:
            task.cancel()
    await nc.drain()  # the last acks reach the server before we go


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
