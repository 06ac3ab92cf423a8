"""Creating a JetStream stream or bucket when several processes may create it at once.

Every service creates what it needs at start (``bus.ensure_streams``, the ``WS_BRIDGES`` and
``WS_LEASES`` buckets): look, create if missing, then bring the configuration to what Quill
needs. Services starting together all see an asset missing and all create it. JetStream
accepts a create of an existing stream with the very same configuration, but not one whose
configuration differs (``10058``, "stream name already in use with a different
configuration"): the case of a service whose create arrives after another has created the
asset *and* changed it (``WS_BRIDGES`` turns rollups off after creating the bucket). So a
create that finds the asset there is a success: the caller then reads the configuration
again and corrects it, as it would have for an asset it had found.

A service may also start before JetStream can answer at all: a cluster still electing its
meta leader, servers busy starting on a loaded machine. Its setup is then tried again
(``patiently``) rather than the service exiting with a traceback at the first timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType, StreamConfig
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    NotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue

log = logging.getLogger("quill.assets")

T = TypeVar("T")

STREAM_NAME_IN_USE = 10058
"""JetStream's ``JSStreamNameExistErr``: a stream of that name exists already, with another
configuration."""


SETUP_WAIT_S = 60.0
"""How long a starting service tries its JetStream setup again while JetStream does not answer
(``$QUILL_SETUP_WAIT_S``)."""
SETUP_PAUSE_S = (0.2, 2.0)
"""The first pause between tries, and the longest (doubling)."""


def setup_wait_s() -> float:
    """``$QUILL_SETUP_WAIT_S``, else ``SETUP_WAIT_S``.

    Raises:
        RuntimeError: it is not a number of seconds >= 0 (one line, as a start refused).
    """
    text = os.environ.get("QUILL_SETUP_WAIT_S", "")
    if not text:
        return SETUP_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise RuntimeError(f"QUILL_SETUP_WAIT_S={text!r}: expected a number of seconds >= 0")
    return value


def unanswered(exc: BaseException) -> str | None:
    """Why JetStream did not answer, when ``exc`` says only that (a timeout, no responders,
    "temporarily unavailable", the connection reconnecting): worth trying again. None for any
    other error."""
    if isinstance(exc, nats.errors.TimeoutError | TimeoutError):
        return "no answer in time"
    if isinstance(exc, nats.errors.ConnectionReconnectingError | nats.errors.StaleConnectionError):
        return "the connection to NATS is down, reconnecting"
    if isinstance(exc, nats.errors.NoRespondersError):
        return "no JetStream responded"
    if isinstance(exc, ServiceUnavailableError):
        return exc.description or "no JetStream responded"
    return None


async def patiently(what: str, setup: Callable[[], Awaitable[T]], within: float | None = None) -> T:
    """``await setup()``, tried again while JetStream does not answer it (``unanswered``),
    for up to ``within`` seconds (default ``setup_wait_s()``), a warning each time.

    Raises:
        RuntimeError: JetStream still had not answered after ``within`` seconds.
        Exception: whatever else ``setup`` raised (a refusal is not retried).
    """
    wait = setup_wait_s() if within is None else within
    deadline = time.monotonic() + wait
    pause, longest = SETUP_PAUSE_S
    while True:
        try:
            return await setup()
        except Exception as exc:
            why = unanswered(exc)
            if why is None:
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"{what}: JetStream did not answer within {wait:g} s ({why}): is JetStream "
                    "enabled on the server, and has the cluster elected its leader?"
                ) from None
            log.warning("%s: JetStream did not answer (%s); trying again", what, why)
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, longest)


def exists_already(exc: BaseException) -> bool:
    """Whether a create failed only because the stream (or bucket) exists already."""
    return isinstance(exc, APIError) and exc.err_code == STREAM_NAME_IN_USE


async def key_value(
    js: JetStreamContext, name: str, description: str, replicas: int, **extra: Any
) -> KeyValue:
    """Bucket ``name``, created if missing with one revision a key, on file, read from the
    stream leader (``direct=False``: a read before a compare-and-set must see the last
    write), and ``extra`` (``KeyValueConfig``'s); services starting together may all create
    it: a lost race is a success (``create_once``).

    Raises:
        nats.js.errors.APIError: JetStream refused the create.
    """
    try:
        return await js.key_value(name)
    except (NotFoundError, BucketNotFoundError):
        pass
    config = KeyValueConfig(
        bucket=name,
        description=description,
        history=1,
        replicas=replicas,
        storage=StorageType.FILE,
        direct=False,
        **extra,
    )
    made = await create_once(f"bucket {name}", lambda: js.create_key_value(config))
    return made if made is not None else await js.key_value(name)


async def create_once(name: str, create: Callable[[], Awaitable[T]]) -> T | None:
    """``await create()``; None if ``name`` was created meanwhile by someone else (the caller
    reads it and checks its configuration).

    Raises:
        APIError: any other refusal of the create.
    """
    try:
        made = await create()
    except APIError as exc:
        if not exists_already(exc):
            raise
        log.info("%s was created meanwhile by another process", name)
        return None
    log.info("created %s", name)
    return made


async def object_store(js: JetStreamContext, bucket: str, description: str, replicas: int) -> None:
    """The object store ``bucket`` (file storage, ``replicas``), created if missing (a lost
    race is a success)."""
    try:
        await js.object_store(bucket)
    except NotFoundError:
        config = ObjectStoreConfig(
            description=description, storage=StorageType.FILE, replicas=replicas
        )
        await create_once(f"object store {bucket}", lambda: js.create_object_store(bucket, config))


def file_stream(
    name: str, description: str, subjects: list[str], replicas: int, **more: Any
) -> StreamConfig:
    """The configuration of a Quill stream: file storage on ``replicas`` servers, direct
    gets allowed, and ``more`` (limits, discard, persistence)."""
    return StreamConfig(
        name=name,
        description=description,
        subjects=subjects,
        storage=StorageType.FILE,
        num_replicas=replicas,
        allow_direct=True,
        **more,
    )


async def stream(js: JetStreamContext, wanted: StreamConfig, kept: tuple[str, ...]) -> None:
    """The stream ``wanted``, created if missing (a create lost to another service is a
    success); where the fields ``kept`` of the one found differ from ``wanted``'s (lists in
    any order, flags unset as false), they are brought to them."""
    assert wanted.name is not None
    try:
        info = await js.stream_info(wanted.name)
    except NotFoundError:
        if await create_once(f"stream {wanted.name}", lambda: js.add_stream(wanted)):
            return
        info = await js.stream_info(wanted.name)
    current = info.config
    if any(not _same(getattr(current, f), getattr(wanted, f)) for f in kept):
        await js.update_stream(
            dataclasses.replace(current, **{f: getattr(wanted, f) for f in kept})
        )
        log.info("updated stream %s", wanted.name)


def _same(found: Any, wanted: Any) -> bool:
    if isinstance(wanted, list):
        return sorted(found or []) == sorted(wanted)
    if isinstance(wanted, bool):
        return bool(found) == wanted
    return bool(found == wanted)
