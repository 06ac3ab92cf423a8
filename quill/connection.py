"""The SDK's connection to NATS: which server (``discover_url``: the environment or the
``quill up`` running here), connect (with credentials, a cluster's URLs, bounded first
connect then reconnecting forever, inboxes nobody can guess: ``quill/inboxes.py``), and which
subjects the server refused this client.

The services connect the same way (``infra/bus.py`` re-exports these)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import nats
import nats.errors
from nats.aio.client import Client as NATS

from quill import inboxes
from quill.credentials import NatsAuth

log = logging.getLogger("quill.bus")

STACK_FILE = "stack.json"
"""What ``quill up`` records in its data directory: its pid, the NATS URL, its processes."""

DEFAULT_DATA = Path(".quill")
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def discover_url() -> str:
    """``QUILL_NATS_URL``, else the ``quill up`` (or ``quill cluster up``) running for this
    directory, else the default. A cluster's is its servers' URLs, comma-separated."""
    env = os.environ.get("QUILL_NATS_URL")
    if env:
        return env
    record = Path(os.environ.get("QUILL_DATA", DEFAULT_DATA)) / STACK_FILE
    try:
        info = json.loads(record.read_text())
        os.kill(int(info["pid"]), 0)
        return str(info["nats_url"])
    except (OSError, ValueError, KeyError):
        return DEFAULT_NATS_URL


_REFUSED = re.compile(r'permissions violation for (?:publish|subscription) to "([^"]+)"')
_refusals: weakref.WeakKeyDictionary[NATS, set[str]] = weakref.WeakKeyDictionary()


def refused(nc: NATS, subject: str) -> bool:
    """Whether the server refused ``nc`` a publish or subscription on ``subject`` (a
    permissions violation: the credentials may not use it; nothing answers such a request)."""
    return subject.lower() in _refusals.get(nc, ())


def servers(url: str | Sequence[str]) -> list[str]:
    """The server URLs in ``url``: one URL, a comma-separated list of them (a cluster, as in
    ``--nats-url nats://a:4222,nats://b:4222``), or a sequence of URLs."""
    parts = url.split(",") if isinstance(url, str) else list(url)
    return [part.strip() for part in parts if part.strip()]


async def connect(
    url: str | Sequence[str],
    name: str,
    *,
    wait_s: float = 10.0,
    auth: NatsAuth | None = None,
    on_dropped: Callable[[nats.errors.SlowConsumerError], Awaitable[None]] | None = None,
    on_server_error: Callable[[Exception], None] | None = None,
) -> NATS:
    """Connect to NATS, retrying for up to ``wait_s`` seconds, then reconnecting forever.
    ``url``: one server or several of a cluster (``servers``): the client picks one, fails
    over to the others and learns the rest of the cluster from the server.
    ``auth``: the credentials (default: from the environment, ``QUILL_NATS_*``).
    ``on_dropped``: called for each message a subscription dropped as a slow consumer (its
    pending limit reached) instead of logging it (a service answers such a request busy).
    ``on_server_error``: also told each error the server reports once connected (a service counts
    the publishes it was refused).

    Raises:
        ConnectionError: no server answered within ``wait_s``, or the credentials are
            incomplete.
    """
    pool = servers(url)
    where = ",".join(pool)
    if not pool:
        raise ConnectionError("Cannot connect to NATS: no server URL given")
    try:
        credentials = (auth or NatsAuth.from_env()).options()
    except ValueError as exc:
        raise ConnectionError(f"Cannot connect to NATS at {where}: {exc}") from None

    holder: list[NATS] = []
    first_error: list[Exception] = []

    def closing() -> bool:
        return bool(holder) and (holder[0].is_closed or holder[0].is_draining)

    async def on_error(exc: Exception) -> None:
        if not holder:  # before the first connection, the caller reports (the server's
            if not first_error or "Authorization" not in str(first_error[0]):  # word first)
                first_error[:] = [exc]
            return
        if on_dropped is not None and isinstance(exc, nats.errors.SlowConsumerError):
            await on_dropped(exc)
            return
        if (match := _REFUSED.search(str(exc))) is not None:
            seen = _refusals.setdefault(holder[0], set())
            if len(seen) > 1024:
                seen.clear()
            seen.add(match.group(1))  # nats-py reports it in lower case
        if on_server_error is not None:
            on_server_error(exc)
        if not closing():
            log.warning("nats error: %s", exc)

    async def on_disconnect() -> None:
        if not closing():
            log.warning("disconnected from NATS")

    async def on_reconnect() -> None:
        log.info("reconnected to NATS")

    deadline = time.monotonic() + wait_s
    while True:
        try:
            nc = await nats.connect(
                pool,
                name=name,
                connect_timeout=2,
                allow_reconnect=True,
                # nats-py retries the *first* connect forever when this is negative; bound
                # it here and switch to reconnecting forever once connected.
                max_reconnect_attempts=1,
                reconnect_time_wait=0.5,
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                **credentials,
            )
            nc.options["max_reconnect_attempts"] = -1
            holder.append(nc)
            return inboxes.harden(nc)  # every inbox it names: 128 unguessable bits
        except Exception as exc:  # nats raises several unrelated types here
            if time.monotonic() >= deadline:
                why = first_error[0] if first_error else exc  # "Authorization Violation"
                raise ConnectionError(f"Cannot connect to NATS at {where}: {why}") from None
            await asyncio.sleep(0.2)
