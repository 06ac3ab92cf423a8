"""A flood refused, not absorbed: the busy answer, its counter, and requests NATS dropped.

Every queue a client can fill is bounded (``contracts/limits.py``); past its bound the request
is answered at once with ``contracts.errors.busy`` (``UNAVAILABLE``, retriable, with
``details.retry_after_ms``) and counted here in ``quill_busy_rejections_total{service,queue}``.

The last queue is nats-py's own: a subscription holds at most ``SUBSCRIPTION_PENDING_MSGS``
messages (``SUBSCRIPTION_PENDING_BYTES``) received and not yet handled. Past it nats-py drops
the message and reports a ``SlowConsumerError`` carrying the message's subject and reply
subject; ``Dropped`` answers that reply busy, so a request dropped there still gets its one
answer (what it cannot answer: a reply subject ``bus.reply_allowed`` refuses, or a reply the
connection cannot send; then the caller times out, and retries).
"""

from __future__ import annotations

import logging
import time

import prometheus_client as prom
from nats.errors import SlowConsumerError

from contracts import codec
from contracts.errors import QuillError, busy
from contracts.limits import RETRY_AFTER_MS
from infra.bus import reply_allowed
from quill.inboxes import own_inbox

log = logging.getLogger("quill.busy")

REJECTIONS = prom.Counter(
    "quill_busy_rejections_total",
    "Requests refused busy because a bounded queue was full, by service and queue.",
    ["service", "queue"],
)

LOG_EVERY_S = 10.0
"""A flood logs one line per service and queue this often, not one per request."""

_logged: dict[tuple[str, str], float] = {}


def refused(
    service: str, queue: str, what: str, retry_after_ms: int, **details: object
) -> QuillError:
    """The busy answer of ``service``'s full ``queue`` (counted, and logged at most every
    ``LOG_EVERY_S``); ``what``: the subject of the message (``The writer``)."""
    REJECTIONS.labels(service, queue).inc()
    now = time.monotonic()
    if now - _logged.get((service, queue), -LOG_EVERY_S) >= LOG_EVERY_S:
        _logged[(service, queue)] = now
        log.warning("%s: queue %s full (%s): refusing busy", service, queue, details)
    return busy(what, queue, retry_after_ms, **details)


class Dropped:
    """Answers the requests nats-py dropped as a slow consumer (the ``on_dropped`` of a
    service's connection)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.count = 0

    async def __call__(self, exc: SlowConsumerError) -> None:
        self.count += 1
        sub = exc.sub
        if not exc.reply or sub is None:
            return
        nc = sub._conn
        if not reply_allowed(exc.subject, exc.reply, own_inbox(nc)):
            return  # a JetStream delivery ($JS.ACK...) or a reply the services never send
        error = refused(
            self.service,
            "subscription",
            f"The {self.service}",
            RETRY_AFTER_MS,
            limit=sub._pending_msgs_limit,
        )
        try:
            await nc.publish(exc.reply, codec.error_reply(error))
        except Exception as publish_error:  # the connection is going: the caller times out
            log.debug("could not answer a dropped request: %s", publish_error)
