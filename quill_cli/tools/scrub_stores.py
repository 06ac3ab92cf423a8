"""The stores beside a workspace's log that ``quill scrub`` cleans (``scrub.py``): its
audit records in WS_AUDIT, its commands' kept output in WS_OUTPUT, its requests parked for
approval and their outcomes in WS_APPROVALS and the entries of every KV bucket; and the other
workspaces' logs, which the scrub must not break (``referrers``: the WS_BLOBS objects they
still name).

An audit record that carries a secret is re-published redacted (its fields, its original
``at`` kept) and the original deleted (``STREAM.MSG.DELETE`` erases it). A KV key with an
entry (any revision kept) that carries one is purged, its history with it, and its latest
value put back redacted, unless the key itself carries one (then it is gone). A command
whose kept output carries one has its output purged whole. A parked request (WS_APPROVALS)
that carries one is deleted: what is approved is its body's sha256, so a redacted body would
not be carried out anyway (once approved, its outcome says it is not kept: send it again); an
outcome or claim that carries one is re-published redacted and the original deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from contracts import codec
from contracts.errors import ErrorCode, QuillError
from contracts.events import ChangesCommitted, HistoryCompacted, PutFile
from contracts.subjects import (
    STREAM_APPROVALS,
    STREAM_AUDIT,
    STREAM_EVENTS,
    STREAM_OUTPUT,
    Subjects,
)
from core.secrets import Secrets
from infra import compaction, log
from infra.blobs import Blobs
from quill_cli.tools.replay import IDLE_S


async def messages(js: JetStreamContext, stream: str, subject: str) -> list[tuple[int, bytes]]:
    """Every message on ``subject`` of ``stream``: ``(seq, payload)``, oldest first."""
    return [(seq, data) for seq, _, data in await subject_messages(js, stream, subject)]


async def subject_messages(
    js: JetStreamContext, stream: str, subject: str
) -> list[tuple[int, str, bytes]]:
    """Every message on ``subject`` (wildcards allowed) of ``stream``: ``(seq, subject,
    payload)``, oldest first; none when the stream does not exist."""
    try:
        last = (await js.get_last_msg(stream, subject)).seq or 0
    except NotFoundError:
        return []
    out: list[tuple[int, str, bytes]] = []
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= last:
            out.append((seq, msg.subject, msg.data))
        if seq >= last and not done.done():
            done.set_result(None)

    sub = await log.ordered(js, subject, on_msg, stream=stream)
    try:
        await asyncio.wait_for(done, IDLE_S)
    finally:
        await sub.unsubscribe()
    return out


def carries(secrets: Secrets, data: bytes) -> bool:
    return bool(secrets.redact_bytes(data)[1])


async def output_hits(js: JetStreamContext, secrets: Secrets, subject: str) -> dict[str, set[str]]:
    """The commands whose kept output (WS_OUTPUT, ``subject``: a workspace's ``cmdout``
    wildcard) carries a secret: each command's subject prefix (``...<id>``), with the ids
    of the secrets found. A chunk of output is cut at a byte count, so a secret may straddle
    two chunks: a command's parts are joined before they are searched."""
    prefix = subject.removesuffix(".>")
    joined: dict[tuple[str, str], list[bytes]] = {}
    for _, name, data in await subject_messages(js, STREAM_OUTPUT, subject):
        command, _, rest = name[len(prefix) + 1 :].partition(".")  # <id>, stdout.<n> | end
        joined.setdefault((command, rest.partition(".")[0]), []).append(data)
    hits: dict[str, set[str]] = {}
    for (command, _), parts in joined.items():
        found = secrets.redact_bytes(b"".join(parts))[1]
        if found:
            hits.setdefault(f"{prefix}.{command}", set()).update(found)
    return hits


async def scrub_output(js: JetStreamContext, commands: list[str]) -> None:
    """Purge the kept output of each command (its every part): output is kept for a while
    only, and cut in chunks that redaction would change, so it goes whole."""
    for command in commands:
        with contextlib.suppress(NotFoundError):
            await js.purge_stream(STREAM_OUTPUT, subject=f"{command}.>")


async def scrub_audit(
    js: JetStreamContext, secrets: Secrets, subject: str, hits: list[tuple[int, bytes]]
) -> None:
    """Re-publish each audit record that carries a secret, redacted, and delete it."""
    for seq, data in hits:
        await js.publish(subject, _redacted(secrets, data), stream=STREAM_AUDIT)
        await js.delete_msg(STREAM_AUDIT, seq)


ApprovalHit = tuple[int, str, bytes]
"""``(seq, subject, payload)`` of a WS_APPROVALS message carrying a secret."""


async def approval_hits(js: JetStreamContext, secrets: Secrets, subject: str) -> list[ApprovalHit]:
    """The messages of WS_APPROVALS on ``subject`` (a workspace's wildcard) that carry a
    secret: parked requests (their body, their headers), claims, outcomes."""
    return [
        (seq, name, data)
        for seq, name, data in await subject_messages(js, STREAM_APPROVALS, subject)
        if carries(secrets, data)
    ]


async def scrub_approvals(js: JetStreamContext, secrets: Secrets, hits: list[ApprovalHit]) -> None:
    """Delete each parked request that carries a secret; re-publish each outcome or claim
    that carries one redacted, then delete it (module docstring)."""
    for seq, subject, data in hits:
        if not subject.endswith(".request"):
            await js.publish(subject, _redacted(secrets, data), stream=STREAM_APPROVALS)
        await js.delete_msg(STREAM_APPROVALS, seq)


def _redacted(secrets: Secrets, data: bytes) -> bytes:
    """A message redacted: each string of its JSON (keys too), or its bytes if not JSON."""
    try:
        return msgspec.json.encode(_redact_json(secrets, msgspec.json.decode(data)))
    except msgspec.DecodeError:
        return secrets.redact_bytes(data)[0]


def _redact_json(secrets: Secrets, value: Any) -> Any:
    if isinstance(value, str):
        return secrets.redact(value)[0]
    if isinstance(value, list):
        return [_redact_json(secrets, v) for v in value]
    if isinstance(value, dict):
        return {secrets.redact(k)[0]: _redact_json(secrets, v) for k, v in value.items()}
    return value


KvHit = tuple[str, str, bytes]
"""``(bucket, key, value)`` of a KV entry (any revision) carrying a secret."""


async def kv_hits(js: JetStreamContext, secrets: Secrets, buckets: list[str] | None) -> list[KvHit]:
    """Entries of the KV buckets (every revision kept) whose key or value carries a secret."""
    if buckets is None:
        buckets = [
            str(s.config.name)[3:]
            for s in await js.streams_info()
            if s.config.name and str(s.config.name).startswith("KV_")
        ]
    hits: list[KvHit] = []
    for bucket in buckets:
        prefix = f"$KV.{bucket}."
        for _, subject, data in await _raw_stream(js, f"KV_{bucket}", prefix + ">"):
            key = subject[len(prefix) :]
            if carries(secrets, key.encode()) or carries(secrets, data):
                hits.append((bucket, key, data))
    return hits


async def _raw_stream(
    js: JetStreamContext, stream: str, subject: str
) -> list[tuple[int, str, bytes]]:
    """Every message of ``stream`` on ``subject`` (a small stream: a KV bucket), in order."""
    out: list[tuple[int, str, bytes]] = []
    seq = 1
    while True:
        try:
            msg = await js.get_msg(stream, seq, subject=subject, next=True)
        except NotFoundError:
            return out
        assert msg.seq is not None
        out.append((msg.seq, str(msg.subject), msg.data or b""))
        seq = msg.seq + 1


async def scrub_kv(js: JetStreamContext, secrets: Secrets, hits: list[KvHit]) -> None:
    """Purge each key with an entry carrying a secret; put back its latest value, redacted,
    unless the key itself carries one."""
    for bucket, key in sorted({(b, k) for b, k, _ in hits}):
        kv = await js.key_value(bucket)
        try:
            latest = await kv.get(key)
            value = latest.value if latest.operation is None else None
        except NotFoundError:
            value = None
        await kv.purge(key)
        await js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.{key}")
        if value is not None and not carries(secrets, key.encode()):
            await kv.put(key, secrets.redact_bytes(value)[0])


_COMPACTED = b'"history_compacted"'


async def referrers(
    js: JetStreamContext,
    subjects: Subjects,
    own: str,
    shas: set[str],
    *,
    start: int = 1,
) -> tuple[dict[str, set[str]], int]:
    """Which OTHER workspaces (every tenant's; not the one on subject ``own``) name one of
    ``shas`` as a WS_BLOBS object: ``({sha: {"tenant/workspace", ...}}, last seq read)``.

    WS_BLOBS is addressed by sha256 and shared by every workspace: a content two workspaces
    hold is stored once, and deleting it breaks the other's reads. A workspace names it when
    a ``put`` of its log carries it by sha256 without the content inline (``blob``, or a move
    or restore of it), when the manifest of a ``history_compacted`` event of its log has a
    file revision of it, or when that manifest is it.

    One pass over WS_EVENTS from ``start`` (an ordered consumer on every workspace's log
    subject): an event is decoded only when its payload spells one of ``shas`` or is a
    compaction (whose manifest is then read from WS_BLOBS); the others are skipped unread.
    """
    found: dict[str, set[str]] = {}
    if not shas:
        return found, start - 1
    every = subjects.evt("*", "*")
    try:
        last = (await js.stream_info(STREAM_EVENTS)).state.last_seq
        first = await js.get_msg(STREAM_EVENTS, start, subject=every, next=True)
    except NotFoundError:
        return found, start - 1
    assert first.seq is not None
    needles = [sha.encode() for sha in shas]
    manifests: list[tuple[str, str]] = []
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen = start - 1

    def name(subject: str) -> str:
        tenant, workspace = subject.rsplit(".", 2)[-2:]
        return f"{tenant}/{workspace}"

    def look(subject: str, data: bytes) -> None:
        compacted = _COMPACTED in data
        if not compacted and not any(n in data for n in needles):
            return
        try:
            event = codec.decode_event(data)
        except Exception:  # not an event of ours: nothing it names is read through the log
            return
        if isinstance(event, HistoryCompacted):
            manifests.append((name(subject), event.manifest))
        elif isinstance(event, ChangesCommitted):
            for change in event.changes:
                if (
                    isinstance(change, PutFile)
                    and change.sha256 in shas
                    and change.text is None
                    and change.data is None
                ):
                    found.setdefault(change.sha256, set()).add(name(subject))

    async def on_msg(msg: Msg) -> None:
        nonlocal seen
        meta = msg.metadata
        seen = meta.sequence.stream
        if msg.subject != own:
            look(msg.subject, msg.data)
        if (seen >= last or meta.num_pending == 0) and not done.done():
            done.set_result(None)

    sub = await log.ordered(js, every, on_msg, first.seq, stream=STREAM_EVENTS)
    try:
        while not done.done():  # a long stream takes long: give up only when it stalls
            before = seen
            await asyncio.wait({done}, timeout=IDLE_S)
            if not done.done() and seen == before:
                raise QuillError(
                    ErrorCode.UNAVAILABLE,
                    f"Reading {STREAM_EVENTS} stalled at sequence {seen} (of {last})",
                )
    finally:
        await sub.unsubscribe()
    blobs = Blobs(js)
    for workspace, digest in manifests:
        if digest in shas:
            found.setdefault(digest, set()).add(workspace)
        try:
            owner_tenant, owner_name = workspace.split("/", 1)
            owner = blobs.of(owner_tenant, owner_name)
            manifest = compaction.decode_manifest(await owner.get(digest))
        except Exception:  # a manifest already missing: nothing more of it can be read
            continue
        for r in manifest.revisions:
            if r[4] == "f" and str(r[5]) in shas:
                found.setdefault(str(r[5]), set()).add(workspace)
    return found, seen
