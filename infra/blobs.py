"""File contents by sha256: inline in the local projection, large ones in WS_BLOBS.

Contents larger than ``INLINE_MAX`` are stored once per workspace in the WS_BLOBS object store,
as ``<tenant>/<workspace>/<sha256>``, before the event that references them is appended.
Readers fetch a blob on first use and keep it in their SQLite projection: the object store is
slow to read (~18 MB/s from nats-py), the local copy is not.

Each workspace has its own namespace (``Blobs.of``): a content two workspaces hold is stored
twice, so that purging one deletes its objects (``purge``: every object under its prefix) and
nobody learns from a skipped upload, or from an ``apply`` naming a sha256 (``has``), whether
another workspace holds a content. Objects an earlier version stored under the bare sha256
are still read (``LEGACY``), never deleted by a purge (others may need them) and never
resolve a request's ``blob``.

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
from collections.abc import Callable, Iterable

from nats.js import JetStreamContext
from nats.js.api import ObjectInfo
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from contracts import hashing
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import BUCKET_BLOBS, check_id
from infra import direct
from infra.store import Store

log = logging.getLogger("quill.blobs")

INLINE_MAX = 64 * 1024
"""Largest content carried inside an event; larger goes to WS_BLOBS."""
INLINE_BUDGET = 4 * 1024 * 1024
"""Most content bytes one event carries inline (the rest goes to WS_BLOBS, largest first)."""


def prefix(tenant: str, workspace: str) -> str:
    """The start of the name of every object of workspace ``tenant/workspace``."""
    return f"{check_id('tenant', tenant)}/{check_id('workspace', workspace)}/"


LEGACY = "the bare sha256"
"""How objects were named before workspaces had their own (still read, see ``get``)."""


class Blobs:
    """WS_BLOBS as a service shares it between workspaces: the bucket, the contents being
    fetched, and ``store`` (a projection) that caches what is fetched, when given. Contents
    are read and written through one workspace's namespace, ``of(tenant, workspace)``."""

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

    def of(
        self, tenant: str, workspace: str, lineage: tuple[tuple[str, int], ...] = ()
    ) -> WorkspaceBlobs:
        """The contents of workspace ``tenant/workspace``; a fork's (``lineage``) reads
        what it inherited from its layers' namespaces too."""
        blobs = WorkspaceBlobs(self, prefix(tenant, workspace))
        blobs.behind = [prefix(tenant, name) for name, _ in lineage]
        return blobs

    async def _obs(self) -> ObjectStore:
        if self._bucket is None:
            self._bucket = await self._js.object_store(BUCKET_BLOBS)
        return self._bucket


class WorkspaceBlobs:
    """One workspace's contents in WS_BLOBS, by sha256 (``Blobs.of``)."""

    def __init__(self, blobs: Blobs, prefix: str) -> None:
        self._blobs, self.prefix = blobs, prefix
        self.behind: list[str] = []
        """A fork's layers' namespaces, nearest first: what it inherited is read from
        there (``get``), never resolved as a request's ``blob`` (``has``, ``own``)."""

    def name(self, sha256: str) -> str:
        return self.prefix + sha256

    async def put(self, sha256: str, data: bytes) -> None:
        """Store ``data`` in the workspace's namespace unless it is there already (durable when
        this returns)."""
        obs = await self._blobs._obs()
        name = self.name(sha256)
        try:
            info = await obs.get_info(name)
            if info.size == len(data) and not info.deleted:
                return
        except NotFoundError:
            pass
        await obs.put(name, data)

    async def remove(self, shas: Iterable[str | None]) -> None:
        """Delete the workspace's objects of ``shas`` (what an upload stored for a workspace
        that turned out to be purged meanwhile)."""
        for sha in dict.fromkeys(s for s in shas if s):
            await remove(self._blobs._js, self.name(sha))

    async def has(self, sha256: str) -> bool:
        """Whether the workspace's own namespace holds ``sha256`` (what a request's ``blob``
        may name: never another workspace's content, nor a legacy object)."""
        return await object_info(self._blobs._js, self.name(sha256)) is not None

    async def get(self, sha256: str, *, keep: bool = True) -> bytes:
        """Content by sha256: from the local projection, else fetched once from the
        workspace's namespace (else from its legacy name, the bare sha256), and kept in the
        projection unless ``keep`` is False (a reader's indexer: it keeps only the index).

        Raises:
            QuillError: ``UNAVAILABLE`` if the content cannot be found anywhere.
        """
        blobs = self._blobs
        data = await blobs._store.blob(sha256) if blobs._store is not None else None
        if data is not None:
            return data
        name = self.name(sha256)
        pending = blobs._fetching.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        blobs._fetching[name] = future
        try:
            data = await self._fetch(sha256, keep)
            future.set_result(data)
            return data
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            del blobs._fetching[name]

    async def own(self, sha256: str) -> bytes | None:
        """Content by sha256 if the workspace's own namespace holds it (None otherwise, held
        elsewhere or not): what a request's ``blob`` resolves to. The local projection's copy
        serves once the namespace is known to hold it.

        Raises:
            QuillError: ``INTERNAL`` if the object does not hash to ``sha256``.
        """
        blobs = self._blobs
        data = await blobs._store.blob(sha256) if blobs._store is not None else None
        if data is not None:
            return data if await self.has(sha256) else None
        data = await read_object(blobs._js, self.name(sha256))
        return None if data is None else await self._fetched(sha256, data)

    async def _fetch(self, sha256: str, keep: bool = True) -> bytes:
        blobs = self._blobs
        data = await read_object(blobs._js, self.name(sha256))
        for layer in self.behind:  # a fork's inherited contents
            if data is not None:
                break
            data = await read_object(blobs._js, layer + sha256)
        if data is None:
            data = await read_object(blobs._js, sha256)  # LEGACY
        if data is None:
            raise QuillError(
                ErrorCode.UNAVAILABLE, f"Content {sha256[:12]}… is missing from {BUCKET_BLOBS}"
            )
        return await self._fetched(sha256, data, keep)

    async def _fetched(self, sha256: str, data: bytes, keep: bool = True) -> bytes:
        blobs = self._blobs
        if hashing.content_sha256(data) != sha256:
            raise QuillError(ErrorCode.INTERNAL, f"Content {sha256[:12]}… is corrupt")
        if blobs._store is not None and keep:
            await blobs._store.put_blob(sha256, data)
            blobs._on_fetched()
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


async def purge(js: JetStreamContext, tenant: str, workspace: str) -> int:
    """Delete every object of workspace ``tenant/workspace`` from WS_BLOBS, and its meta
    record (no tombstone names it); return how many. Idempotent.

    The object store cannot list one prefix: every meta record is read (a page of
    ``SWEEP_PAGE`` at a time, without a consumer) and its name decoded from its subject. A rare
    admin operation; its memory is one page.
    """
    start = prefix(tenant, workspace)
    meta = f"$O.{BUCKET_BLOBS}.M."
    after, deleted = 0, 0
    while True:
        page = await direct.messages(js, STREAM_BLOBS, meta + ">", after=after, count=SWEEP_PAGE)
        if not page:
            return deleted
        after = page[-1][0]
        for _, headers, data in page:
            subject = headers.get("Nats-Subject", "")
            token = subject.removeprefix(meta)
            try:
                name = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
            except (ValueError, UnicodeDecodeError):
                continue
            if not name.startswith(start):
                continue
            await _remove(js, subject, data)
            deleted += 1


async def remove(js: JetStreamContext, name: str) -> bool:
    """Delete object ``name`` from WS_BLOBS, its meta record included (False: none)."""
    subject = _meta_subject(name)
    try:
        raw = await js.get_last_msg(STREAM_BLOBS, subject)
    except NotFoundError:
        return False
    await _remove(js, subject, raw.data or b"")
    return True


async def _remove(js: JetStreamContext, meta_subject: str, meta: bytes) -> None:
    nuid = ObjectInfo.from_response(json.loads(meta or b"{}")).nuid
    if nuid:  # the chunks first: a meta record left names what to finish
        await js.purge_stream(STREAM_BLOBS, subject=f"$O.{BUCKET_BLOBS}.C.{nuid}")
    await js.purge_stream(STREAM_BLOBS, subject=meta_subject)


SWEEP_PAGE = 512
"""Meta records read by one request of a purge's sweep."""
