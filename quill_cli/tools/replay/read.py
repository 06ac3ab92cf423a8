"""Reading a workspace's log and folding it (``drive``, ``replay``, ``find_run``).

The log is read by a pull consumer of the replay's own (fetches of ``BATCH`` messages, the
next one asked for while the fold takes the last; deleted when done), decoded with msgspec
and folded in memory by a ``Fold`` (``fold.py``). NATS failures are ``UNAVAILABLE`` naming
what was being done (``nats_errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NotFoundError

from contracts import codec
from contracts.errors import ErrorCode, QuillError
from contracts.events import HistoryCompacted, WorkspaceEvent, WorkspaceForked
from contracts.subjects import BUCKET_BLOBS, HEADER_EVENT_HASH, STREAM_EVENTS, Subjects
from infra.blobs import Blobs
from infra.compaction import decode_manifest
from quill_cli.tools.replay.fold import QUIET, Contents, Fold, Progress, RunRecord, corrupt

IDLE_S = 30.0
"""Reading the log: no message for this long is ``UNAVAILABLE``."""
BUFFER_MAX = 8192
"""Pending messages of the baseline's consumer in ``bench``."""


@contextlib.contextmanager
def nats_errors(what: str) -> Iterator[None]:
    """NATS failures as ``UNAVAILABLE`` naming ``what`` was being done, and why: the server's
    own words when it refused a request (a limit, a missing stream), a word on access only
    when no answer came (a user without JetStream rights gets none)."""
    try:
        yield
    except APIError as exc:
        why = exc.description or type(exc).__name__
        code = f" (JetStream error {exc.err_code})" if exc.err_code else ""
        raise QuillError(
            ErrorCode.UNAVAILABLE, f"{what}: the server refused: {why}{code}"
        ) from None
    except (TimeoutError, nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
        why = str(exc) or type(exc).__name__
        raise QuillError(
            ErrorCode.UNAVAILABLE,
            f"{what}: no answer from JetStream ({why}); reading {STREAM_EVENTS} and "
            f"{BUCKET_BLOBS} needs JetStream access to them: see docs/replay.md",
        ) from None
    except nats.errors.Error as exc:
        why = str(exc) or type(exc).__name__
        raise QuillError(ErrorCode.UNAVAILABLE, f"{what}: {why}") from None


async def last_event(js: JetStreamContext, subject: str) -> WorkspaceEvent | None:
    """The last event on ``subject`` (None when the log holds none).

    Raises:
        QuillError: ``UNAVAILABLE`` if the server has no WS_EVENTS (Quill never ran there).
    """
    try:
        await js.stream_info(STREAM_EVENTS, subjects_filter=subject)
    except NotFoundError:
        raise QuillError(
            ErrorCode.UNAVAILABLE,
            f"This NATS server has no stream {STREAM_EVENTS}: Quill has not run there",
        ) from None
    try:
        raw = await js.get_last_msg(STREAM_EVENTS, subject, direct=True)
    except NotFoundError:
        return None
    try:
        return codec.decode_event(raw.data or b"")
    except msgspec.MsgspecError as exc:
        raise corrupt(f"Unreadable last event: {exc}", None) from None


Raw = tuple[bytes, str | None]
"""An event message: its payload and the ``Ws-Event-Hash`` it carries."""


BATCH = 1024
"""Messages asked for by one fetch (and at most ``BATCH_BYTES``: more than one event can be)."""
BATCH_BYTES = 16 * 1024 * 1024
INACTIVE_S = 600.0
"""The server deletes a reading consumer left unused this long (its reader died); a reader
that was only slow makes another from where it was."""


PROBE_S = 3.0
"""A fetch unanswered this long: is its consumer still there? One deleted as the fetch came
(its server dropped the request, seen under load: no 409, no 503) is made again, not waited
for until ``IDLE_S``."""


async def _consumer_gone(js: JetStreamContext, name: str) -> bool:
    """Whether the server says consumer ``name`` no longer exists (no answer: cannot tell)."""
    try:
        await js.consumer_info(STREAM_EVENTS, name, timeout=PROBE_S)
    except NotFoundError:
        return True
    except (TimeoutError, nats.errors.Error, APIError):
        return False
    return False


class _Asked:
    """The answer to one fetch, as its messages arrive."""

    def __init__(self, wanted: int, inbox: str = "") -> None:
        self.wanted = wanted
        self.inbox = inbox
        """Where this fetch's answers come (each fetch its own: a late status of the one
        before, say a 409 for the bytes it used up, is not taken for this one's)."""
        self.raws: list[Raw] = []
        self.reply = ""
        """The ``$JS.ACK...`` subject of the last message (its stream sequence and what is
        left are in it)."""
        self.status: str | None = None
        """The status that ended it early: 404 nothing left, 409 the bytes are used up."""
        self.why = ""
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


async def messages(js: JetStreamContext, subject: str) -> AsyncGenerator[list[Raw], None]:
    """The messages on ``subject``, oldest first, in batches, by a pull consumer of its own
    (ephemeral, in memory, no acks; deleted when done) fetching ``BATCH`` messages at a time.
    The next batch is fetched while the caller folds the one before, and no more: a slow
    caller, an export fetching contents, never makes the client drop messages (a pushed
    consumer did, at a million events: ``slow consumer, messages dropped``, then a gap). The
    answers are taken by a callback, not by ``next_msg``, which costs a task and a timer per
    message. A consumer, not batched direct gets: a direct get's answer carries six more
    headers, and nats-py parsing them cost more than all the rest of reading the message
    (14 µs against 8 µs a message; docs/performance.md). A consumer is served by the stream's
    leader: what a replica has not got yet is not missed. Close it (``aclosing``) to stop early.

    Raises:
        QuillError: ``UNAVAILABLE`` when no message comes for ``IDLE_S``; ``INTERNAL`` when
            the server's answers skip a message.
    """
    nc = js._nc
    loop = asyncio.get_running_loop()
    asked = _Asked(0)
    heard = loop.time()

    async def on_message(msg: Msg) -> None:
        nonlocal heard
        if not msg.reply and msg.subject != asked.inbox:
            return  # the status of a fetch that is over (messages come under their own subject)
        heard = loop.time()
        if not msg.reply:  # a status: 404 nothing left, 409 bytes used up or consumer gone
            headers = msg.headers or {}
            asked.status, asked.why = headers.get("Status", "?"), headers.get("Description", "")
        else:
            asked.raws.append((msg.data, (msg.headers or {}).get(HEADER_EVENT_HASH)))
            asked.reply = msg.reply
            if len(asked.raws) < asked.wanted:
                return
        if not asked.done.done():
            asked.done.set_result(None)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(f"{inbox}.*", cb=on_message)
    name, next_seq, dseq, fetches = "", 1, 0, 0

    async def consume(start: int) -> str:
        config = ConsumerConfig(
            filter_subject=subject,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start,
            ack_policy=AckPolicy.NONE,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=INACTIVE_S,
        )
        return str((await js.add_consumer(STREAM_EVENTS, config)).name)

    async def fetch() -> None:
        nonlocal asked, heard, fetches
        fetches += 1
        asked, heard = _Asked(BATCH, f"{inbox}.{fetches}"), loop.time()
        request = {"batch": BATCH, "max_bytes": BATCH_BYTES, "no_wait": True}
        api = f"{js._prefix}.CONSUMER.MSG.NEXT.{STREAM_EVENTS}.{name}"
        await nc.publish(api, msgspec.json.encode(request), reply=asked.inbox)

    async def answer() -> _Asked:
        probe = loop.time() + PROBE_S
        while not asked.done.done():
            until = min(heard + IDLE_S, probe)
            await asyncio.wait([asked.done], timeout=max(0.0, until - loop.time()))
            if asked.done.done():
                break
            if loop.time() - heard >= IDLE_S:
                raise QuillError(ErrorCode.UNAVAILABLE, f"{subject}: no answer in {IDLE_S:.0f}s")
            if loop.time() >= probe:
                probe = loop.time() + PROBE_S
                if await _consumer_gone(js, name):
                    asked.status, asked.why = "503", "the consumer is gone"
                    break
        return asked

    try:
        name = await consume(next_seq)
        await fetch()
        while True:
            got = await answer()
            if got.raws:
                # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<left>
                tokens = got.reply.split(".")
                last_dseq, left = int(tokens[-3]), int(tokens[-1])
                if last_dseq != dseq + len(got.raws):
                    raise corrupt(f"{subject}: the server's answers skipped a message", None)
                dseq, next_seq = last_dseq, int(tokens[-4]) + 1
            gone = got.status == "503" or (got.status == "409" and "Consumer Deleted" in got.why)
            if gone:  # left unused too long (the caller was slow): again from where it was
                name, dseq = await consume(next_seq), 0
            elif got.status not in (None, "404", "409"):
                raise QuillError(ErrorCode.UNAVAILABLE, f"{subject}: {got.status} {got.why}")
            elif got.status == "409" and not got.raws:
                raise corrupt(f"{subject}: a message larger than {BATCH_BYTES} bytes", None)
            elif got.status == "404" or (got.raws and left == 0):
                if got.raws:
                    yield got.raws
                return
            await fetch()  # answered while the caller folds this batch
            if got.raws:
                yield got.raws
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if name:
            with contextlib.suppress(Exception):
                await js.delete_consumer(STREAM_EVENTS, name)


OnEvent = Callable[[WorkspaceEvent, bytes, str, bytes | None], Awaitable[None]]
"""Called after each event is folded: ``(event, payload, hash, manifest JSON or None)``."""


async def drive(
    js: JetStreamContext,
    subjects: Subjects,
    fold: Fold,
    to_version: int | None = None,
    on_event: OnEvent | None = None,
    progress: Progress = QUIET,
) -> Fold:
    """Fold the log of ``fold``'s workspace up to ``to_version`` (default: the last),
    reporting the versions folded to ``progress``.

    Raises:
        QuillError: ``WORKSPACE_NOT_FOUND`` for an empty log, ``INVALID_ARGUMENT`` for a
            version it does not have, and what ``Fold`` raises.
    """
    subject = subjects.evt(fold.tenant, fold.workspace)
    name = f"{fold.tenant}/{fold.workspace}"
    blobs = Blobs(js).of(fold.tenant, fold.workspace)
    with nats_errors(f"Reading the log of {name}"):
        last = await last_event(js, subject)
        if last is None:
            raise QuillError(ErrorCode.WORKSPACE_NOT_FOUND, f"Workspace {name} has no events")
        target = last.version if to_version is None else to_version
        if not 1 <= target <= last.version:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"{name} is at version {last.version}: no version {target}",
                {"version": target, "latest": last.version},
            )
        progress.start(f"reading the log of {name}", target)
        async with contextlib.aclosing(messages(js, subject)) as batches:
            async for batch in batches:
                progress.update(fold.version)
                for data, carried in batch:
                    event, digest = fold.check(data, carried)
                    if fold.version == 0 and isinstance(event, WorkspaceForked):
                        # a fork: its source's log up to the fork point, then its own
                        base = Fold(fold.tenant, event.source, fold.contents)
                        upto = min(target, event.version)
                        await drive(js, subjects, base, upto, progress=progress)
                        fold.graft(base, event if target >= event.version else None, digest)
                        fold.lineage = tuple((b.workspace, b.version) for b in event.lineage)
                        if on_event is not None:
                            await on_event(event, data, digest, None)
                        if fold.version >= target:
                            return fold
                        continue
                    manifest, kept = None, None
                    if isinstance(event, HistoryCompacted):  # it names a manifest: read it
                        manifest = await blobs.get(event.manifest)
                        kept = decode_manifest(manifest)
                        if fold.version == 0:  # the log before it was purged
                            fold.start(event, digest, kept, target)
                    if fold.compaction is None or fold.compaction != event.version:
                        fold.apply(event, digest, kept)
                    if on_event is not None:
                        await on_event(event, data, digest, manifest)
                    if fold.version >= target:
                        progress.update(fold.version)
                        return fold
    return fold


async def replay(
    js: JetStreamContext,
    subjects: Subjects,
    tenant: str,
    workspace: str,
    *,
    to_version: int | None = None,
    contents: Contents | None = None,
    progress: Progress = QUIET,
) -> Fold:
    """The workspace rebuilt from its log as of ``to_version`` (default: the last), checked."""
    fold = Fold(tenant, workspace, contents)
    return await drive(js, subjects, fold, to_version, progress=progress)


async def find_run(
    js: JetStreamContext, subjects: Subjects, tenant: str, workspace: str, run: str
) -> RunRecord:
    """The run ``run`` as the log tells it.

    Raises:
        QuillError: ``FILE_NOT_FOUND`` if the log has no such run.
    """
    found = (await replay(js, subjects, tenant, workspace)).runs.get(run)
    if found is None:
        raise QuillError(ErrorCode.FILE_NOT_FOUND, f"No run {run}", {"run": run})
    return found
