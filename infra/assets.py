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
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import APIError, NotFoundError

log = logging.getLogger("quill.assets")

T = TypeVar("T")

STREAM_NAME_IN_USE = 10058
"""JetStream's ``JSStreamNameExistErr``: a stream of that name exists already, with another
configuration."""


def exists_already(exc: BaseException) -> bool:
    """Whether a create failed only because the stream (or bucket) exists already."""
    return isinstance(exc, APIError) and exc.err_code == STREAM_NAME_IN_USE


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
