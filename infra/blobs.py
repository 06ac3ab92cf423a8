"""File contents by sha256: inline in the local projection, large ones in WS_BLOBS.

Contents larger than ``INLINE_MAX`` are stored once in the WS_BLOBS object store (object name:
the sha256) before the event that references them is appended. Readers fetch a blob on first
use and keep it in their SQLite projection: the object store is slow to read (~18 MB/s from
nats-py), the local copy is not.

A get uses no consumer: nats-py's ``ObjectStore.get`` subscribes an ordered consumer per
object, which outlives the get on the server (its unsubscribe does not delete it), so a few
thousand gets (``quill export``/``replay`` of a 3,000-file workspace) reached the server's
limit, ``maximum consumers limit reached``. Here an object's info (``$O.<bucket>.M.<name>``)
is read by a direct get of the subject's last message, and its chunks (``$O.<bucket>.C.<nuid>``)
by batched direct gets, each chunk counted and the whole checked against the info's digest
and the sha256 it is named by. A direct get may be answered by a replica a little behind the
stream leader: what it misses is asked of the leader (``STREAM.MSG.GET``, no consumer either).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.api import ObjectInfo
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from contracts import hashing
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import BUCKET_BLOBS
from infra import direct
from infra.store import Store

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
        data = await read_object(self._js, sha256)
        if data is None:
            raise QuillError(
                ErrorCode.UNAVAILABLE, f"Content {sha256[:12]}… is missing from {BUCKET_BLOBS}"
            )
        if hashing.content_sha256(data) != sha256:
            raise QuillError(ErrorCode.INTERNAL, f"Content {sha256[:12]}… is corrupt")
        if self._store is not None:
            await self._store.put_blob(sha256, data)
        self._on_fetched()
        return data


STREAM_BLOBS = f"OBJ_{BUCKET_BLOBS}"
CHUNK_BATCH = 64
"""Chunks (128 KiB each as nats-py writes them) asked for by one batched direct get."""
BATCH_BYTES = 8 * 1024 * 1024


def _meta_subject(name: str) -> str:
    key = base64.urlsafe_b64encode(name.encode()).decode()
    return f"$O.{BUCKET_BLOBS}.M.{key}"


async def object_info(js: JetStreamContext, name: str) -> ObjectInfo | None:
    """The info of object ``name`` in WS_BLOBS (None if absent or deleted): a direct get of
    its meta subject's last message, asked of the stream leader when the replica answering
    has none."""
    subject = _meta_subject(name)
    for from_replica in (True, False):
        try:
            raw = await js.get_last_msg(STREAM_BLOBS, subject, direct=from_replica)
        except NotFoundError:
            continue
        info = ObjectInfo.from_response(json.loads(raw.data or b"{}"))
        return None if info.deleted else info
    return None


async def read_object(js: JetStreamContext, name: str) -> bytes | None:
    """The content of object ``name`` in WS_BLOBS without a consumer (None if absent).

    Raises:
        QuillError: ``INTERNAL`` if its chunks do not add up to its recorded size and digest.
    """
    info = await object_info(js, name)
    if info is None:
        return None
    if not info.size:
        return b""
    if not info.nuid or info.chunks is None:
        raise QuillError(ErrorCode.INTERNAL, f"Object {name[:12]}… has a bad meta record")
    subject = f"$O.{BUCKET_BLOBS}.C.{info.nuid}"
    found = await direct.messages(
        js, STREAM_BLOBS, subject, count=info.chunks, batch=CHUNK_BATCH, max_bytes=BATCH_BYTES
    )
    chunks = [(seq, data) for seq, _, data in found]
    while len(chunks) < info.chunks:  # a replica behind the leader: the rest from the leader
        after = chunks[-1][0] if chunks else 0
        try:
            raw = await js.get_msg(STREAM_BLOBS, seq=after + 1, next=True, subject=subject)
        except NotFoundError:
            break
        chunks.append((int(raw.seq or 0), raw.data or b""))
    data = b"".join(chunk for _, chunk in chunks)
    recorded = (info.digest or "").split("=", 1)[-1]
    try:
        expected = base64.urlsafe_b64decode(recorded + "=" * (-len(recorded) % 4))
    except ValueError:
        expected = b""
    if len(data) != info.size or hashlib.sha256(data).digest() != expected:
        raise QuillError(
            ErrorCode.INTERNAL,
            f"Object {name[:12]}… in {BUCKET_BLOBS} is incomplete or corrupt "
            f"({len(chunks)} of {info.chunks} chunks, {len(data)} of {info.size} bytes)",
        )
    return data
