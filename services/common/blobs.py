"""File contents by sha256: inline in the local projection, large ones in WS_BLOBS.

Contents larger than ``INLINE_MAX`` are stored once in the WS_BLOBS object store (object name:
the sha256) before the event that references them is appended. Readers fetch a blob on first
use and keep it in their SQLite projection: the object store is slow to read (~18 MB/s from
nats-py), the local copy is not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from contracts import hashing
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import BUCKET_BLOBS
from services.common.store import Store

log = logging.getLogger("quill.blobs")

INLINE_MAX = 64 * 1024
"""Largest content carried inside an event; larger goes to WS_BLOBS."""
INLINE_BUDGET = 4 * 1024 * 1024
"""Most content bytes one event carries inline (the rest goes to WS_BLOBS, largest first)."""


class Blobs:
    """Contents in the object store WS_BLOBS, by sha256; ``store`` (a projection) caches what
    is fetched, when given."""

    def __init__(
        self,
        js: JetStreamContext,
        store: Store | None = None,
        on_fetched: Callable[[], None] = lambda: None,
    ) -> None:
        self._js = js
        self._store = store
        self._on_fetched = on_fetched
        self._bucket: ObjectStore | None = None
        self._fetching: dict[str, asyncio.Future[bytes]] = {}

    async def _obs(self) -> ObjectStore:
        if self._bucket is None:
            self._bucket = await self._js.object_store(BUCKET_BLOBS)
        return self._bucket

    async def put(self, sha256: str, data: bytes) -> None:
        """Store ``data`` in WS_BLOBS unless it is there already (durable when this returns)."""
        obs = await self._obs()
        try:
            info = await obs.get_info(sha256)
            if info.size == len(data) and not info.deleted:
                return
        except NotFoundError:
            pass
        await obs.put(sha256, data)

    async def get(self, sha256: str) -> bytes:
        """Content by sha256: from the local projection, else fetched once from WS_BLOBS.

        Raises:
            QuillError: ``UNAVAILABLE`` if the content cannot be found anywhere.
        """
        data = await self._store.blob(sha256) if self._store is not None else None
        if data is not None:
            return data
        pending = self._fetching.get(sha256)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._fetching[sha256] = future
        try:
            data = await self._fetch(sha256)
            future.set_result(data)
            return data
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._fetching[sha256]

    async def _fetch(self, sha256: str) -> bytes:
        try:
            result = await (await self._obs()).get(sha256)
        except NotFoundError:
            raise QuillError(
                ErrorCode.UNAVAILABLE, f"Content {sha256[:12]}… is missing from {BUCKET_BLOBS}"
            ) from None
        data = result.data or b""
        if hashing.content_sha256(data) != sha256:
            raise QuillError(ErrorCode.INTERNAL, f"Content {sha256[:12]}… is corrupt")
        if self._store is not None:
            await self._store.put_blob(sha256, data)
        self._on_fetched()
        return data
