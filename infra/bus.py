"""NATS wiring shared by every service: connect, create streams and buckets, serve requests.

This is the one module where services touch the transport. It uses nats-py directly rather
than FastStream: on this project's 2-core machine a FastStream request handler answered
5.4k req/s where a bare nats-py one answered 23k (0.23×), below the read goal of 0.4× the bare
echo; FastStream also sends no reply when its own validation fails, and its stream declaration
turns ``allow_atomic`` off (DESIGN.md). Streams and buckets are created here, idempotently.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import PersistMode, StreamConfig

from contracts import codec
from contracts.errors import QuillError
from contracts.limits import (
    MAX_MESSAGE_BYTES,
    SUBSCRIPTION_PENDING_BYTES,
    SUBSCRIPTION_PENDING_MSGS,
)
from contracts.subjects import BUCKET_BLOBS, STREAM_AUDIT, STREAM_EVENTS, Subjects
from infra import assets, bridges, fork_registry, snapshots
from infra.secret_registry import secrets_from_env
from quill import connection
from quill.credentials import DEFAULT_INBOX
from quill.inboxes import SYSTEM_INBOX, own_inbox

log = logging.getLogger("quill.bus")

DUPLICATE_WINDOW_S = 15 * 60
"""JetStream's Nats-Msg-Id window: a retried command within it is never appended twice."""
AUDIT_MAX_AGE_S = 90 * 24 * 3600

refused, servers, connect = connection.refused, connection.servers, connection.connect
"""Re-exported for the services: the SDK's own connection (``quill/connection.py``)."""


def instance_id(service: str) -> str:
    """A short id for this process, unique enough to address one replica."""
    return f"{service}-{socket.gethostname()[:20]}-{os.getpid()}".lower().replace(".", "-")


def _events_stream(subjects: Subjects, replicas: int) -> StreamConfig:
    return assets.file_stream(
        STREAM_EVENTS,
        "Quill: the log of every workspace (one subject per workspace)",
        [subjects.all_evt, subjects.all_fence],
        replicas,
        max_msg_size=MAX_MESSAGE_BYTES,
        duplicate_window=DUPLICATE_WINDOW_S,
        allow_atomic=True,
        deny_delete=True,
        deny_purge=False,
    )


def _audit_stream(subjects: Subjects, replicas: int) -> StreamConfig:
    return assets.file_stream(
        STREAM_AUDIT,
        "Quill: one audit record per operation",
        [subjects.all_audit],
        replicas,
        max_age=AUDIT_MAX_AGE_S,
        # A single server fsyncs every stored message with sync_interval: always; audit
        # records do not need that (replicas do it on a cluster), the event log does.
        persist_mode=PersistMode.ASYNC if replicas == 1 else None,
    )


async def _ensure_stream(js: JetStreamContext, wanted: StreamConfig) -> None:
    """Create ``wanted`` if missing, else bring the configuration Quill relies on (subjects,
    atomic batches, direct gets) to it; a create that loses a race to another service is a
    success, and the configuration is checked then as well (``assets``)."""
    await assets.stream(js, wanted, ("subjects", "allow_atomic", "allow_direct"))


async def _ensure_blobs(js: JetStreamContext, replicas: int) -> None:
    """The WS_BLOBS object store, created if missing (a lost race is a success)."""
    await assets.object_store(js, BUCKET_BLOBS, "Quill: large file contents by sha256", replicas)


async def ensure_streams(nc: NATS, subjects: Subjects, replicas: int = 1) -> None:
    """Create WS_EVENTS, WS_AUDIT, the WS_BLOBS and WS_SNAPSHOTS object stores and the
    WS_BRIDGES, WS_SNAPSHOT_LEASES and WS_FORKS buckets if missing, and correct their
    configuration if needed (idempotent, and safe when several processes do it at once).

    Raises:
        nats.js.errors.APIError: JetStream refused a create or an update (not for a stream
            that exists already).
    """
    js = nc.jetstream()
    await _ensure_stream(js, _events_stream(subjects, replicas))
    await _ensure_stream(js, _audit_stream(subjects, replicas))
    await _ensure_blobs(js, replicas)
    await snapshots.ensure_bucket(js, replicas)
    await bridges.bucket(js, replicas)
    await fork_registry.bucket(js, replicas)


def reply_allowed(subject: str, reply: str, own_inbox: str | None = None) -> bool:
    """Whether a service may answer a request on ``subject`` at ``reply``.

    A requester chooses its reply subject freely, and a service publishes with every right:
    a reply to ``$JS.API.STREAM.DELETE.WS_EVENTS`` would delete the log, one to
    ``ws.evt.<other tenant>...`` would write into another tenant's log. So replies never go
    to a ``$`` subject (JetStream, KV, object store, system) nor under the request's own
    root (``ws.``).

    Under ``--tenants`` (the service runs as the services' user: ``own_inbox`` is
    ``_INBOX_quill-system``), a request on a subject a tenant may publish (its ``cmd``,
    ``qry``, ``exec`` and ``bridge`` subjects) is answered only into that tenant's inbox,
    ``_INBOX_<tenant>.``: the only one it may subscribe to, and the one the services' user's
    own requests for the tenant are answered on (``quill/inboxes.py``, the gateway's among
    them). So no tenant makes a service answer into another tenant's inbox, nor into the
    services' own, where the replies to other tenants' requests once were. A subject no
    tenant may publish (a ping, a replica's query) is the services' own: any inbox.

    Without tenants (an open server; a tenant's own process such as a bridge, which the
    server confines), a tenant's inbox (``_INBOX_<tenant>.``) is answered only for a request
    on that tenant's subjects, or when it is the service's own (``own_inbox``) or the
    services' user's; other inboxes (``_INBOX.``, an application's own prefix) are fine.
    """
    root = subject.split(".", 1)[0]
    head = reply.split(".", 1)[0]
    if reply.startswith("$") or head == root:
        return False
    tenant = request_tenant(subject)
    if own_inbox == SYSTEM_INBOX and tenant is not None and not _replica(subject):
        return head == INBOX_TENANT_PREFIX + tenant and "." in reply
    if not head.startswith(INBOX_TENANT_PREFIX) or head in (own_inbox, SYSTEM_INBOX):
        return True
    return tenant is None or head == INBOX_TENANT_PREFIX + tenant


INBOX_TENANT_PREFIX = DEFAULT_INBOX + "_"
"""``_INBOX_<tenant>``: a tenant's inbox prefix (``quill_cli/tenants.py``)."""


def request_tenant(subject: str) -> str | None:
    """The tenant a request subject names (None for one naming no tenant, e.g. a ping)."""
    subjects = Subjects(root=subject.split(".", 1)[0])
    bridge = subjects.parse_bridge(subject)
    if bridge is not None:
        return bridge
    try:
        return subjects.parse_request(subject).tenant
    except QuillError:
        return None


def _replica(subject: str) -> bool:
    """A query addressed to one replica (``ws.replica.…``): the services' subject only."""
    return subject.split(".", 2)[1:2] == ["replica"]


async def respond(msg: Msg, data: bytes, headers: dict[str, str] | None = None) -> None:
    """Answer a request; a request without a reply subject (a plain publish) gets nothing,
    nor does one whose reply subject is not an inbox (``reply_allowed``)."""
    if not msg.reply:
        return
    if not reply_allowed(msg.subject, msg.reply, own_inbox(msg._client)):
        log.warning("not replying to %s on %s: not the requester's inbox", msg.subject, msg.reply)
        return
    secrets = secrets_from_env()
    if secrets:  # the last net: no reply carries a registered secret (services/common/secrets)
        data = secrets.redact_bytes(data)[0]
    try:
        await msg._client.publish(msg.reply, data, headers=headers)
    except Exception as exc:  # the caller is gone or the connection dropped: nothing to do
        log.warning("could not reply on %s: %s", msg.reply, exc)


Handler = Callable[[Msg], Awaitable[None]]


async def serve(
    nc: NATS,
    subject: str,
    queue: str | None,
    handler: Handler,
    *,
    pending: int = SUBSCRIPTION_PENDING_MSGS,
    pending_bytes: int = SUBSCRIPTION_PENDING_BYTES,
) -> Subscription:
    """Subscribe ``handler`` to ``subject``. The handler runs in the subscription's own task,
    one message at a time, so it must hand long work off (a queue, a task) and return.
    At most ``pending`` messages (``pending_bytes``) wait for it; nats-py drops what comes
    past them, and a service's connection answers each dropped request busy
    (``infra/busy.py``)."""
    return await nc.subscribe(
        subject,
        queue=queue or "",
        cb=handler,
        pending_msgs_limit=pending,
        pending_bytes_limit=pending_bytes,
    )


async def serve_ping(
    nc: NATS, subjects: Subjects, service: str, instance: str, info: Callable[[], dict[str, Any]]
) -> list[Subscription]:
    """Answer ``<root>.sys.ping`` and ``<root>.sys.ping.<service>`` with this instance's info
    (fan-out: every instance answers; use a request with several replies to list them)."""

    async def pong(msg: Msg) -> None:
        body = {"service": service, "instance": instance, "pid": os.getpid(), **info()}
        await respond(msg, codec.encode(body))

    return [
        await nc.subscribe(f"{subjects.root}.sys.ping", cb=pong),
        await nc.subscribe(f"{subjects.root}.sys.ping.{service}", cb=pong),
    ]


async def ping_all(
    nc: NATS,
    subjects: Subjects,
    service: str | None = None,
    wait_s: float = 0.5,
    *,
    expect: int | None = None,
) -> list[dict[str, Any]]:
    """Every live instance's ping answer (of ``service``, or of every service), gathered for
    ``wait_s`` seconds, or until ``expect`` have answered."""
    subject = f"{subjects.root}.sys.ping" + (f".{service}" if service else "")
    return await gather(nc, subject, wait_s, expect=expect)


async def gather(
    nc: NATS, subject: str, wait_s: float, *, expect: int | None = None
) -> list[dict[str, Any]]:
    """The JSON answers to one request on ``subject`` that every instance answers (a ping),
    gathered for ``wait_s`` seconds, or until ``expect`` have answered."""
    inbox = nc.new_inbox()
    answers: list[dict[str, Any]] = []
    enough = asyncio.Event()

    async def collect(msg: Msg) -> None:
        if not msg.data:  # the server's "no responders" status: nobody is up
            return
        with contextlib.suppress(ValueError):
            answers.append(json.loads(msg.data))
        if expect is not None and len(answers) >= expect:
            enough.set()

    sub = await nc.subscribe(inbox, cb=collect)
    try:
        await nc.publish(subject, b"", reply=inbox)
        await nc.flush()
        # answers come from an unknown number of instances: wait the window out (or enough)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(enough.wait(), wait_s)
    finally:
        await sub.unsubscribe()
    return list(answers)
