"""Export and import of a workspace with its whole log (``quill export``/``import``).

Export format (``FORMAT_VERSION`` 1): UTF-8 JSON lines, gzip-compressed when the file name
ends in ``.gz``; one ``header`` record, then ``blob`` records (a content stored in WS_BLOBS,
base64, written before the first event that needs it; ``manifest`` marks a compaction's
manifest) and ``event`` records (the event message's exact payload and its hash), then one
``end`` record (counts and the last hash: a truncated file is refused). An export file that
does not verify is ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from contracts import codec, hashing
from contracts.errors import ErrorCode, QuillError
from contracts.events import ChangesCommitted, HistoryCompacted, PutFile, WorkspaceEvent
from contracts.subjects import HEADER_EVENT_HASH, Subjects
from infra.blobs import Blobs
from infra.compaction import decode_manifest
from infra.concurrent import InFlight, prefetched
from quill_cli.tools.replay.fold import QUIET, Fold, Progress, corrupt
from quill_cli.tools.replay.read import drive, last_event, nats_errors, replay

FORMAT = "quill-workspace-export"
FORMAT_VERSION = 1
PARALLEL = 16
"""Contents fetched (export) or stored (import) at once."""
GROUP_EVENTS = 256
GROUP_BYTES = 4 * 1024 * 1024
"""An import appends at most this many events (bytes) per atomic batch."""


class Record(msgspec.Struct, kw_only=True, tag_field="record"):
    pass


class Header(Record, kw_only=True, tag="header"):
    format: str
    format_version: int
    tenant: str
    workspace: str
    exported_at: datetime


class BlobRecord(Record, kw_only=True, tag="blob"):
    sha256: str
    size: int
    data: bytes
    manifest: bool = False


class EventRecord(Record, kw_only=True, tag="event"):
    hash: str
    event: msgspec.Raw


class End(Record, kw_only=True, tag="end"):
    events: int
    blobs: int
    version: int
    last_hash: str
    tree_hash: str


AnyRecord = Header | BlobRecord | EventRecord | End
_records = msgspec.json.Decoder(AnyRecord)
_encode = msgspec.json.Encoder().encode


class Moved(msgspec.Struct, kw_only=True):
    """What an export wrote, or an import appended."""

    tenant: str
    workspace: str
    version: int
    events: int
    blobs: int
    tree_hash: str
    last_hash: str
    source: str | None = None
    """Import: the exported workspace, ``tenant/workspace``."""
    rehashed: bool = False
    """Import under another name: events were re-encoded, so their hashes changed."""


async def export(
    js: JetStreamContext, subjects: Subjects, fold: Fold, out: Any, progress: Progress = QUIET
) -> Moved:
    """Write ``fold``'s workspace, its whole log and every WS_BLOBS content the log needs, to
    the binary stream ``out``, checking the log as it goes (memory: one content at a time)."""
    blobs, sent = Blobs(js).of(fold.tenant, fold.workspace), set()
    head = Header(
        format=FORMAT,
        format_version=FORMAT_VERSION,
        tenant=fold.tenant,
        workspace=fold.workspace,
        exported_at=datetime.now(UTC),
    )
    out.write(_encode(head) + b"\n")

    async def blob(sha: str, data: bytes | None = None, manifest: bool = False) -> None:
        if sha not in sent:
            data = await blobs.get(sha) if data is None else data
            out.write(_encode(BlobRecord(sha256=sha, size=len(data), data=data, manifest=manifest)))
            out.write(b"\n")
            sent.add(sha)

    async def on_event(event: WorkspaceEvent, data: bytes, digest: str, kept: bytes | None) -> None:
        if isinstance(event, HistoryCompacted) and kept is not None:
            await blob(event.manifest, kept, manifest=True)
            shas = {str(r[5]) for r in decode_manifest(kept).revisions if r[4] == "f"}
            # fetched PARALLEL at a time (one after the other, 20,000 took 13 s of 17 here)
            async for sha, content in prefetched(sorted(shas - sent), blobs.get, PARALLEL):
                await blob(sha, content)
        elif isinstance(event, ChangesCommitted):
            for change in event.changes:
                if isinstance(change, PutFile) and change.blob:
                    await blob(change.sha256)
        out.write(b'{"record":"event","hash":"%s","event":%s}\n' % (digest.encode(), data))

    await drive(js, subjects, fold, on_event=on_event, progress=progress)
    summary = _moved(fold, len(sent))
    out.write(
        _encode(
            End(
                events=fold.events,
                blobs=len(sent),
                version=fold.version,
                last_hash=fold.last_hash,
                tree_hash=summary.tree_hash,
            )
        )
        + b"\n"
    )
    return summary


def _moved(fold: Fold, blobs: int, **more: Any) -> Moved:
    return Moved(
        tenant=fold.tenant,
        workspace=fold.workspace,
        version=fold.version,
        events=fold.events,
        blobs=blobs,
        tree_hash=hashing.tree_hex(fold.tree.hash),
        last_hash=fold.last_hash,
        **more,
    )


def _invalid(name: str, message: str) -> QuillError:
    return QuillError(ErrorCode.INVALID_ARGUMENT, f"{name} is not a valid export: {message}")


def read_records(open_file: Callable[[], Any], name: str) -> Iterator[AnyRecord]:
    """The records of an export file (``open_file()`` opens it for binary reading).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a line that is not a record.
    """
    with open_file() as lines:
        for n, line in enumerate(lines, 1):
            try:
                yield _records.decode(line)
            except msgspec.MsgspecError as exc:
                raise _invalid(name, f"line {n}: {exc}") from None


def verify_file(
    open_file: Callable[[], Any],
    name: str,
    progress: Progress = QUIET,
    named: set[str] | None = None,
) -> tuple[Header, Fold, int]:
    """Check an export without writing anything: its format, every blob against its sha256,
    the hash chain and tree hashes of its events, that each content an event needs from
    WS_BLOBS is in it, and its end record. Returns the header, the fold and the blob count.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` naming the first problem.
    """
    header, fold, end = None, None, None
    blobs: dict[str, bytes | None] = {}  # sha → manifest JSON (None for other contents)
    progress.start(f"checking {name}", None)
    for n, record in enumerate(read_records(open_file, name)):
        if n % 256 == 0:
            progress.update(n)
        if header is None or fold is None:
            if not isinstance(record, Header) or record.format != FORMAT:
                raise _invalid(name, "it does not start with a Quill export header")
            if record.format_version > FORMAT_VERSION:
                raise _invalid(name, f"format version {record.format_version} is newer")
            header, fold = record, Fold(record.tenant, record.workspace)
        elif end is not None:
            raise _invalid(name, "records follow the end record")
        elif isinstance(record, BlobRecord):
            if len(record.data) != record.size or hashing.content_sha256(record.data) != (
                record.sha256
            ):
                raise _invalid(name, f"content {record.sha256[:12]}… does not match its sha256")
            blobs[record.sha256] = record.data if record.manifest else None
        elif isinstance(record, EventRecord):
            try:
                _fold_record(fold, record, blobs, named)
            except QuillError as exc:
                raise _invalid(name, exc.message) from None
        elif isinstance(record, End):
            end = record
    if header is None or fold is None or end is None:
        raise _invalid(name, "it is truncated (no end record)")
    if (end.events, end.blobs, end.last_hash) != (fold.events, len(blobs), fold.last_hash):
        raise _invalid(name, "its end record does not match its events and contents")
    return header, fold, len(blobs)


def _fold_record(
    fold: Fold, record: EventRecord, blobs: dict[str, bytes | None], named: set[str] | None
) -> None:
    """Fold one event record; add to ``named`` the hashes of earlier events that a
    compaction's manifest names (an import under another name maps those, not all)."""
    event, digest = fold.check(bytes(record.event), record.hash)
    needed: set[str] = set()
    kept = None
    if isinstance(event, HistoryCompacted):
        manifest = blobs.get(event.manifest)
        if manifest is None:
            raise corrupt("The compaction's manifest is missing", event.version)
        kept = decode_manifest(manifest)
        needed = {str(r[5]) for r in kept.revisions if r[4] == "f"}
        if fold.version == 0:
            fold.start(event, digest, kept, event.version)
        elif named is not None:
            named.update(str(h) for r in kept.events for h in (r[9], r[10]))
            named.update(codec.decode_event(b.encode()).prev_hash for _, _, b in kept.controls)
    elif isinstance(event, ChangesCommitted):
        needed = {c.sha256 for c in event.changes if isinstance(c, PutFile) and c.blob}
    if fold.compaction != event.version:
        fold.apply(event, digest, kept)
    if missing := needed - blobs.keys():
        raise corrupt(f"Content {min(missing)[:12]}… is missing", event.version)


async def import_file(
    nc: NATS,
    subjects: Subjects,
    open_file: Callable[[], Any],
    name: str,
    tenant: str,
    ws: str,
    progress: Progress = QUIET,
) -> Moved:
    """Import the export ``name`` as ``tenant/ws``, which must have no events: check the whole
    file first (``verify_file``), then store its contents in WS_BLOBS and append its events in
    atomic batches, then replay the new log to check it. Under another name each event is
    re-encoded with the new ids (and the ``prev_hash`` of the new chain), so hashes change;
    under the same name the events are appended byte for byte.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a file that does not verify, ``ALREADY_EXISTS``
            for a target with events, ``CONFLICT`` if the target was written meanwhile.
    """
    named: set[str] = set()  # old hashes a compaction's manifest names
    header, source, blob_count = await asyncio.to_thread(
        verify_file, open_file, name, progress, named
    )
    js, subject = nc.jetstream(), subjects.evt(tenant, ws)
    with nats_errors(f"Importing into {tenant}/{ws}"):
        existing = await last_event(js, subject)
        if existing is not None:
            raise QuillError(
                ErrorCode.ALREADY_EXISTS,
                f"Workspace {tenant}/{ws} exists (version {existing.version}): import into a "
                "new workspace",
            )
        rename = (header.tenant, header.workspace) != (tenant, ws)
        blobs, manifests, hashes = Blobs(js).of(tenant, ws), dict[str, bytes](), dict[str, str]()
        batch: list[tuple[bytes, str, str]] = []
        last_seq = size = 0
        last_old: str | None = None
        progress.start(f"importing {name} into {tenant}/{ws}", source.version)
        storing = InFlight(PARALLEL)  # one after the other, 20,000 took 30 s here
        for record in read_records(open_file, name):
            if isinstance(record, BlobRecord):
                if record.manifest:
                    manifests[record.sha256] = record.data
                if not (record.manifest and rename):
                    await storing.add(blobs.put(record.sha256, record.data))
            elif isinstance(record, EventRecord):
                payload, digest = bytes(record.event), record.hash
                event = codec.decode_event(payload)
                if rename:
                    payload, manifest = _renamed(event, tenant, ws, hashes, manifests)
                    if manifest is not None:
                        await blobs.put(hashing.content_sha256(manifest), manifest)
                    if last_old is not None and last_old not in named:
                        del hashes[last_old]  # memory: only the hashes still to be named
                    hashes[digest], last_old = hashing.event_hash(payload), digest
                    digest = hashes[digest]
                batch.append((payload, subjects.msg_id(tenant, ws, event.request_id), digest))
                size += len(payload)
                if len(batch) >= GROUP_EVENTS or size >= GROUP_BYTES:
                    first = event.version - len(batch) + 1
                    await storing.drain()  # the contents its events name are stored first
                    last_seq = await append_batch(nc, subject, last_seq, batch, first)
                    batch, size = [], 0
                    progress.update(event.version)
        await storing.drain()
        if batch:
            first = source.version - len(batch) + 1
            last_seq = await append_batch(nc, subject, last_seq, batch, first)
        imported = await replay(js, subjects, tenant, ws, progress=progress)
    if (imported.version, imported.tree.hash) != (source.version, source.tree.hash):
        raise corrupt(f"{tenant}/{ws} does not replay to the exported tree", imported.version)
    return _moved(
        imported, blob_count, source=f"{header.tenant}/{header.workspace}", rehashed=rename
    )


def _renamed(
    event: WorkspaceEvent, tenant: str, ws: str, hashes: dict[str, str], manifests: dict[str, bytes]
) -> tuple[bytes, bytes | None]:
    """``event`` for workspace ``tenant/ws``, chained to the re-encoded events before it
    (``hashes``: old hash → new); a compaction gets a manifest to match (returned too)."""
    changes: dict[str, Any] = {"tenant": tenant, "workspace": ws}
    changes["prev_hash"] = hashes.get(event.prev_hash, event.prev_hash)
    manifest = None
    if isinstance(event, HistoryCompacted):
        kept = decode_manifest(manifests[event.manifest])
        controls = []
        for version, kind, body in kept.controls:
            control = codec.decode_event(body.encode())
            prev = hashes.get(control.prev_hash, control.prev_hash)
            moved = msgspec.structs.replace(control, tenant=tenant, workspace=ws, prev_hash=prev)
            controls.append((version, kind, codec.encode(moved).decode()))
        rows = [
            (*r[:9], hashes.get(str(r[9]), r[9]), hashes.get(str(r[10]), r[10]), *r[11:])
            for r in kept.events
        ]
        manifest = _encode(msgspec.structs.replace(kept, controls=controls, events=rows))
        changes.update(manifest=hashing.content_sha256(manifest), manifest_size=len(manifest))
    return codec.encode(msgspec.structs.replace(event, **changes)), manifest


async def append_batch(
    nc: NATS, subject: str, after: int, batch: list[tuple[bytes, str, str]], version: int
) -> int:
    """Append ``batch`` (payload, ``Nats-Msg-Id``, hash) to ``subject`` as one atomic batch on
    the condition that its last sequence is ``after`` (the protocol of
    ``services/writer/append.py``, one workspace at a time); return the new last sequence.

    Raises:
        QuillError: ``CONFLICT`` if the log refused it (someone else wrote there).
    """
    batch_id = os.urandom(12).hex()
    reply = None
    for n, (payload, msg_id, digest) in enumerate(batch, 1):
        headers = {
            "Nats-Msg-Id": msg_id,
            HEADER_EVENT_HASH: digest,
            "Nats-Batch-Id": batch_id,
            "Nats-Batch-Sequence": str(n),
        }
        if n == 1:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(after)
        if n < len(batch):
            await nc.publish(subject, payload, headers=headers)
        else:
            headers["Nats-Batch-Commit"] = "1"
            reply = await nc.request(subject, payload, headers=headers, timeout=30)
    assert reply is not None
    ack = msgspec.json.decode(reply.data)
    if "error" in ack:
        raise QuillError(
            ErrorCode.CONFLICT,
            f"The log refused the import at version {version}: "
            f"{ack['error'].get('description')} (was {subject} written meanwhile?)",
        )
    return int(ack["seq"])
