"""Snapshots of a projection in the WS_SNAPSHOTS object store: made, listed, fetched, installed.

A replica that starts with no projection (or one far behind) would replay the whole log before
it serves: a minute for 60,000 events, more the longer the log. Instead it installs the newest
snapshot of a replica's projection and replays only the events after it.

A snapshot is the projection's SQLite file copied consistently (SQLite's online backup, every
page in one read transaction, so the data and its tracking position agree; run in a thread,
off the event loop), zstd-compressed, stored as the object ``<role>/<position>`` (the position
zero-padded: one object per log position, so two replicas snapshotting the same position make
one object).
Its meta record's headers say what it is: the log position it covers (``Quill-Position``,
the stream sequence of the last event applied), the projection's schema version, the
compressed bytes' sha256 and length, the database's size, the ``WS_EVENTS`` stream it was
made from (its creation time: a log deleted and made again is another log), when and by whom.

Fetching, verifying and installing one is ``infra/snapshot_install.py``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import logging
import shutil
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import zstandard
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, ObjectMeta, StorageType
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from contracts.subjects import BUCKET_SNAPSHOT_LEASES, BUCKET_SNAPSHOTS, STREAM_EVENTS
from infra import assets, direct, sql
from infra.store import SCHEMA_VERSION

log = logging.getLogger("quill.snapshots")

STREAM = f"OBJ_{BUCKET_SNAPSHOTS}"
META = f"$O.{BUCKET_SNAPSHOTS}.M."
LEASE_S = 15 * 60
"""How long a replica may take making a snapshot before another may start one."""
CHUNK_BATCH = 64
"""Chunks (128 KiB) asked for by one batched direct get."""
COMPRESS_LEVEL = 3
"""zstd level: a projection (JSON text, paths, hashes) shrinks ~3.5x. zstd, not gzip: at
1,000,000 events (853 MiB), ``zstd -d`` took 0.8 s here where ``gzip -d`` took 5.9 s, and
``zstd -3`` 4.5 s where ``gzip -1`` took 13.7 s, for a smaller file (246 against 282 MB)."""
ENCODING = "zstd"
"""``Quill-Encoding``: how the database is compressed (a reader refuses one it cannot read)."""

H_POSITION, H_SCHEMA, H_SHA256 = "Quill-Position", "Quill-Schema", "Quill-Sha256"
H_SIZE, H_STORED, H_LOG = "Quill-Size", "Quill-Stored", "Quill-Log"
H_MADE, H_BY, H_ENCODING = "Quill-Made", "Quill-By", "Quill-Encoding"
STARTED_FROM = "started_from_snapshot"
"""The projection's ``meta`` key naming the snapshot it was installed from."""


class Rejected(Exception):
    """A snapshot that does not verify (never installed)."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One snapshot, as its meta record describes it."""

    name: str
    role: str
    position: int
    """Stream sequence of the last event the projection had applied."""
    schema: str
    sha256: str
    """Of the stored (compressed) bytes."""
    size: int
    """Of the database, uncompressed."""
    stored: int
    log: str
    """Creation time of the ``WS_EVENTS`` stream it was made from."""
    made: datetime
    by: str
    nuid: str
    chunks: int
    encoding: str = ENCODING

    def headers(self) -> dict[str, list[str]]:
        return {
            H_POSITION: [str(self.position)],
            H_SCHEMA: [self.schema],
            H_SHA256: [self.sha256],
            H_SIZE: [str(self.size)],
            H_STORED: [str(self.stored)],
            H_LOG: [self.log],
            H_MADE: [self.made.isoformat()],
            H_BY: [self.by],
            H_ENCODING: [self.encoding],
        }


def object_name(role: str, position: int) -> str:
    return f"{role}/{position:020d}"


async def ensure_bucket(js: JetStreamContext, replicas: int) -> None:
    """The WS_SNAPSHOTS object store and the WS_SNAPSHOT_LEASES bucket, created if missing."""
    about = "Quill: snapshots of the projections (a replica starts from one)"
    await assets.object_store(js, BUCKET_SNAPSHOTS, about, replicas)
    await _leases(js, replicas)


async def _leases(js: JetStreamContext, replicas: int = 1) -> KeyValue:
    try:
        return await js.key_value(BUCKET_SNAPSHOT_LEASES)
    except NotFoundError:
        config = KeyValueConfig(
            bucket=BUCKET_SNAPSHOT_LEASES,
            description="Quill: which replica is making a snapshot",
            ttl=LEASE_S,
            storage=StorageType.FILE,
            replicas=replicas,
        )
        name = f"bucket {BUCKET_SNAPSHOT_LEASES}"
        made = await assets.create_once(name, lambda: js.create_key_value(config))
        return made if made is not None else await js.key_value(BUCKET_SNAPSHOT_LEASES)


# ---------------------------------------------------------------- listing


def _header(headers: dict[str, object], key: str) -> str:
    value = headers.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    if not isinstance(value, str):
        raise ValueError(f"no {key}")
    return value


def _parse(record: bytes) -> Snapshot | None:
    """The snapshot a meta record describes (None: deleted, or not a snapshot)."""
    info = json.loads(record or b"{}")
    if info.get("deleted") or not info.get("nuid"):
        return None
    headers = info.get("headers") or {}
    name = str(info["name"])
    return Snapshot(
        name=name,
        role=name.split("/", 1)[0],
        position=int(_header(headers, H_POSITION)),
        schema=_header(headers, H_SCHEMA),
        sha256=_header(headers, H_SHA256),
        size=int(_header(headers, H_SIZE)),
        stored=int(info.get("size") or 0),
        log=_header(headers, H_LOG),
        made=datetime.fromisoformat(_header(headers, H_MADE)),
        by=_header(headers, H_BY),
        nuid=str(info["nuid"]),
        chunks=int(info.get("chunks") or 0),
        encoding=_header(headers, H_ENCODING) if H_ENCODING in headers else "gzip",
    )


async def listing(js: JetStreamContext, role: str) -> list[Snapshot]:
    """The snapshots of ``role`` projections, newest (highest position) first. A meta record
    that does not parse is logged and left out."""
    found: list[Snapshot] = []
    after = 0
    while True:
        page = await direct.messages(js, STREAM, META + ">", after=after, count=256)
        if not page:
            break
        after = page[-1][0]
        for _, headers, data in page:
            try:
                snap = _parse(data)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("snapshot record %s ignored: %s", headers.get("Nats-Subject"), exc)
                continue
            if snap is not None and snap.role == role:
                found.append(snap)
    return sorted(found, key=lambda s: s.position, reverse=True)


async def log_identity(js: JetStreamContext) -> tuple[str, int]:
    """``WS_EVENTS``'s creation time (which log) and last sequence."""
    info = await js.stream_info(STREAM_EVENTS)
    created = info.created.isoformat() if info.created else ""
    return created, int(info.state.last_seq)


# ---------------------------------------------------------------- making


def tracked(db: Path, tracking: str) -> tuple[str | None, int]:
    """The schema version and tracking position of the database ``db`` ((None, 0): none)."""
    if not db.exists():
        return None, 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.Error:
        return None, 0
    try:
        schema = conn.execute(sql.SCHEMA_OF).fetchone()
        row = conn.execute(sql.POSITION, (tracking,)).fetchone()
        return (str(schema[0]) if schema else None), (int(row[0]) if row else 0)
    except sqlite3.Error:
        return None, 0
    finally:
        conn.close()


def local_position(db: Path, tracking: str) -> int:
    """How far the projection at ``db`` has applied the log (0: none, or another schema)."""
    schema, position = tracked(db, tracking)
    return position if schema == SCHEMA_VERSION else 0


class _Hashing:
    """A file that hashes what is written to it."""

    def __init__(self, out: BinaryIO, digest: Any) -> None:
        self._out, self._digest = out, digest

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        return self._out.write(data)


def _dump(db: Path, work: Path, tracking: str) -> tuple[Path, int, int, int, str]:
    """Copy ``db`` consistently and compress it into ``work``: (file, position, size, stored,
    sha256). Blocking: run in a thread."""
    copy, packed = work / "snapshot.db", work / "snapshot.db.zst"
    copy.unlink(missing_ok=True)
    src, dst = sqlite3.connect(db), sqlite3.connect(copy)
    try:
        # Page by page in one read transaction (every page at once): the data and the tracking
        # position agree, and the pages keep the room the projection left in them. ``VACUUM
        # INTO`` packed them full, so a replica starting from one split a page at the first
        # insert into each: its tail applied at half the speed (issue 17), and it took longer.
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")  # one file, whatever the projection's mode
    finally:
        dst.close()
        src.close()
    schema, position = tracked(copy, tracking)
    if schema != SCHEMA_VERSION:
        raise RuntimeError(f"the projection has schema {schema}, not {SCHEMA_VERSION}")
    digest = hashlib.sha256()
    with open(copy, "rb") as src_file, open(packed, "wb") as out:
        sink = cast(IO[bytes], _Hashing(out, digest))  # what zstandard calls on it: write
        zstandard.ZstdCompressor(level=COMPRESS_LEVEL).copy_stream(src_file, sink)
    size = copy.stat().st_size
    copy.unlink()
    return packed, position, size, packed.stat().st_size, digest.hexdigest()


async def make(
    js: JetStreamContext, db: Path, role: str, tracking: str, by: str, *, keep: int
) -> Snapshot:
    """Snapshot the projection at ``db`` into WS_SNAPSHOTS, then keep the newest ``keep``.

    Raises:
        Exception: the copy or the upload failed (nothing half-made is listed: the meta
            record, written last, names the object).
    """
    work = db.parent / "snapshot-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()
    try:
        identity, _ = await log_identity(js)
        packed, position, size, stored, sha = await asyncio.to_thread(_dump, db, work, tracking)
        name = object_name(role, position)
        snap = Snapshot(
            name=name, role=role, position=position, schema=SCHEMA_VERSION, sha256=sha,
            size=size, stored=stored, log=identity, made=datetime.now(UTC), by=by, nuid="",
            chunks=0,
        )  # fmt: skip
        obs = await js.object_store(BUCKET_SNAPSHOTS)
        with open(packed, "rb") as data:
            meta = ObjectMeta(name=name, description=f"{role} projection", headers=snap.headers())
            await obs.put(name, data, meta=meta)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info(
        "snapshot %s made: log position %d, %d bytes (%d stored) in %.1f s",
        name, position, size, stored, time.monotonic() - started,
    )  # fmt: skip
    await prune(js, role, keep)
    return snap


async def prune(js: JetStreamContext, role: str, keep: int) -> int:
    """Delete all but the newest ``keep`` snapshots of ``role``; return how many went."""
    gone = 0
    for old in (await listing(js, role))[max(keep, 1) :]:
        await js.purge_stream(STREAM, subject=f"$O.{BUCKET_SNAPSHOTS}.C.{old.nuid}")
        key = base64.urlsafe_b64encode(old.name.encode()).decode()
        await js.purge_stream(STREAM, subject=META + key)
        gone += 1
    return gone


class Lease:
    """One replica at a time makes a snapshot: a key created in WS_SNAPSHOT_LEASES (which
    fails while another holds it), deleted when done, expiring after ``LEASE_S`` should its
    holder die. A take that fails or is cancelled once the create was sent (its answer lost,
    a timeout, the replica stopping) deletes the key if the create was stored all the same:
    else no replica could make one for ``LEASE_S``."""

    def __init__(self, js: JetStreamContext, role: str, holder: str) -> None:
        self._js, self._key, self._holder = js, role, holder
        self._revision: int | None = None

    async def take(self) -> bool:
        kv = await _leases(self._js)
        try:
            self._revision = await kv.create(self._key, self._holder.encode())
        except KeyWrongLastSequenceError:
            return False
        except BaseException:
            await self._drop_if_held(kv)
            raise
        return True

    async def _drop_if_held(self, kv: KeyValue) -> None:
        """Delete the key if it names this holder (best effort: else it expires)."""
        try:
            entry = await kv.get(self._key)
            if entry.value == self._holder.encode() and entry.revision is not None:
                await kv.delete(self._key, last=entry.revision)
        except Exception as exc:  # gone, deleted, taken by another, or NATS away
            log.debug("snapshot lease %s not dropped: %s", self._key, exc)

    async def release(self) -> None:
        if self._revision is None:
            return
        kv = await _leases(self._js)
        try:
            await kv.delete(self._key, last=self._revision)
        except KeyWrongLastSequenceError:  # expired and taken by another meanwhile
            pass
        self._revision = None
