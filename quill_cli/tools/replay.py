"""Replay and audit tooling over the log alone (``quill replay/verify/runs/export/import``).

Why one module of ~1,100 lines: the fold, the log reading, the tree writing, the replica
checks and the export format all work on one ``Fold`` and its ``Contents``, and were moved
here whole from ``services/common`` (issue 12); it splits along its ``# ---`` sections (fold,
reading, writing, replicas, export/import) into a package of its own, which is still to do.

``Fold`` checks a workspace's log as it folds it: every payload hashes to its
``Ws-Event-Hash``, versions follow each other, each ``prev_hash`` is the previous event's
hash, and after each event the tree hash of the rebuilt tree equals the ``tree_hash`` the
event records. A log that starts at a ``history_compacted`` event (the older log was purged)
starts from its manifest: the manifest's event rows must chain into the compaction event, and
the tree as of any version from the manifest's ``floor`` on is rebuilt from its revision rows.
The log is read by a pull consumer of the replay's own (fetches of 1,024 messages, the next one
asked for while the fold takes the last; deleted when done), decoded with msgspec and folded in
memory (``core.evolve``, the fold the writer holds its state by); files are written once,
at the end, with modes 0644/0755 and each entry's mtime taken from the log, so that two
replays of a log are byte-identical trees.

Export format (``FORMAT_VERSION`` 1): UTF-8 JSON lines, gzip-compressed when the file name
ends in ``.gz``; one ``header`` record, then ``blob`` records (a content stored in WS_BLOBS,
base64, written before the first event that needs it; ``manifest`` marks a compaction's
manifest) and ``event`` records (the event message's exact payload and its hash), then one
``end`` record (counts and the last hash: a truncated file is refused).

Failures are ``QuillError``: a log that does not verify is ``INTERNAL`` (it is not what a
writer appended), an export file that does not verify ``INVALID_ARGUMENT``, a version below
a compaction's floor ``VERSION_TRIMMED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NotFoundError

from contracts import codec, hashing
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import (
    ChangesCommitted,
    CompactionManifest,
    HistoryCompacted,
    PutFile,
    WorkspaceCreated,
    WorkspaceEvent,
)
from contracts.paths import in_log
from contracts.subjects import BUCKET_BLOBS, HEADER_EVENT_HASH, STREAM_EVENTS, Subjects
from core import chain
from core.controls import run_info
from core.evolve import WorkspaceState, evolve, restore
from core.tree import FileNode, Tree
from infra import bus
from infra.blobs import Blobs
from infra.compaction import decode_manifest, trimmed
from infra.runtime import InFlight, prefetched

IDLE_S = 30.0
"""Reading the log: no message for this long is ``UNAVAILABLE``."""
BUFFER_MAX = 8192
"""Pending messages of the baseline's consumer in ``bench``."""
MEMORY_BUDGET = 64 * 1024 * 1024
"""Inline contents kept in memory during a replay; more go to a temporary SQLite file."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
T = TypeVar("T")


class RunRecord(msgspec.Struct, kw_only=True):
    """A run as the log tells it: the version it read, who started it, when it ended."""

    run: str
    version: int
    """The version the run read (``pinned_version``)."""
    status: str = "running"
    """``running`` or ``ended``."""
    actor: str | None
    parent: str | None
    started: datetime
    started_version: int
    ended: datetime | None = None
    ended_version: int | None = None


class Summary(msgspec.Struct, kw_only=True):
    """What a replay rebuilt and checked."""

    tenant: str
    workspace: str
    version: int
    at: datetime
    """Time of the event at ``version`` (the mtime of the replayed root directory)."""
    tree_hash: str
    last_hash: str
    files: int
    directories: int
    bytes: int
    events_verified: int
    """Events read from the log and checked (the compaction's manifest rows not counted)."""
    compaction: int | None
    """Version of the ``history_compacted`` event the log starts at, if it was compacted."""
    floor: int
    """The oldest version a replay can rebuild (1 unless compacted)."""
    run: str | None = None
    out: str | None = None


def corrupt(message: str, version: int | None, **details: Any) -> QuillError:
    """The log (or an export) is not what a writer appended."""
    where = f" (version {version})" if version is not None else ""
    return QuillError(ErrorCode.INTERNAL, message + where, details)


# ---------------------------------------------------------------- progress


class Progress(Protocol):
    """Where a long tool reports how far it is (``quill_cli/cli_replay.py`` draws a bar)."""

    def start(self, what: str, total: int | None) -> None:
        """A new phase: ``what`` is being done to ``total`` items (None: unknown)."""

    def update(self, completed: int) -> None:
        """``completed`` items of the current phase are done."""


class NoProgress:
    """Reports nowhere."""

    def start(self, what: str, total: int | None) -> None:
        pass

    def update(self, completed: int) -> None:
        pass


QUIET: Progress = NoProgress()


# ---------------------------------------------------------------- contents


class Contents:
    """Contents carried inline by the log, by sha256 (a move or restore names one again).
    Up to ``budget`` bytes in memory (each content counted with ``ENTRY_COST`` for its
    bookkeeping: a million small contents cost more in keys than in bytes), the rest in a
    SQLite file in a temporary directory; ``close`` removes it."""

    ENTRY_COST = 200

    def __init__(self, budget: int = MEMORY_BUDGET) -> None:
        self._mem: dict[str, str | bytes] = {}
        self._left = budget
        self._spill: Path | None = None
        self._db: sqlite3.Connection | None = None

    def add(self, put: PutFile) -> None:
        sha, value = put.sha256, _inline(put)
        if value is None or sha in self._mem:
            return
        cost = put.size + self.ENTRY_COST
        if cost <= self._left:
            self._mem[sha] = value
            self._left -= cost
            return
        self._disk().execute("INSERT OR IGNORE INTO c VALUES (?, ?)", (sha, _bytes(value)))

    def _disk(self) -> sqlite3.Connection:
        if self._db is None:
            self._spill = Path(tempfile.mkdtemp(prefix="quill-replay-"))
            self._db = sqlite3.connect(self._spill / "contents.db", check_same_thread=False)
            self._db.execute("PRAGMA journal_mode = OFF")
            self._db.execute("PRAGMA synchronous = OFF")
            self._db.execute("CREATE TABLE c (sha TEXT PRIMARY KEY, data BLOB) WITHOUT ROWID")
        return self._db

    def get(self, sha256: str) -> bytes | None:
        value = self._mem.get(sha256)
        if value is not None:
            return _bytes(value)
        if self._db is not None:
            row = self._db.execute("SELECT data FROM c WHERE sha = ?", (sha256,)).fetchone()
            if row is not None:
                return bytes(row[0])
        return None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)


def _inline(put: PutFile) -> str | bytes | None:
    return put.text if put.text is not None else put.data


def _bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value


# ---------------------------------------------------------------- the fold


class Fold:
    """One workspace's log folded in order (``core.evolve``), checked as it goes (see the
    module docstring); with ``contents``, the contents it carries inline are kept there."""

    def __init__(self, tenant: str, workspace: str, contents: Contents | None = None) -> None:
        self.tenant, self.workspace, self.contents = tenant, workspace, contents
        self.state = WorkspaceState(tenant, workspace)
        self.events = 0
        self.floor = 1
        self.compaction: int | None = None

    @property
    def tree(self) -> Tree:
        return self.state.tree

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def last_hash(self) -> str:
        return self.state.last_hash

    @property
    def at(self) -> datetime:
        """Time of the event at ``version``."""
        return self.state.updated or _EPOCH

    @property
    def runs(self) -> dict[str, RunRecord]:
        """The runs as the log tells them, in the order they started."""
        return {
            run_id: RunRecord(
                **msgspec.structs.asdict(run_info(run_id, r)),
                status="running" if r.ended_version is None else "ended",
                ended=r.ended,
            )
            for run_id, r in (self.state.controls.runs or {}).items()
        }

    def check(self, data: bytes, carried: str | None) -> tuple[WorkspaceEvent, str]:
        """Decode one message, checking its hash and whose event it is."""
        digest, broken = chain.payload(data, carried, self.version + 1)
        if broken is not None:
            raise corrupt(broken.message, broken.version)
        try:
            event = codec.decode_event(data)
        except msgspec.MsgspecError as exc:
            raise corrupt(f"Unreadable event: {exc}", self.version + 1) from None
        if (event.tenant, event.workspace) != (self.tenant, self.workspace):
            raise corrupt(
                f"An event of {event.tenant}/{event.workspace} in the log of "
                f"{self.tenant}/{self.workspace}",
                event.version,
            )
        return event, digest

    def apply(
        self, event: WorkspaceEvent, digest: str, manifest: CompactionManifest | None = None
    ) -> None:
        """Fold the next event of the log (``manifest``: a compaction's, if it is one)."""
        if self.version == 0 and not (event.version == 1 and isinstance(event, WorkspaceCreated)):
            raise corrupt(
                "The log starts neither with the creation nor a compaction", event.version
            )
        broken = chain.link(self.version, self.last_hash, event.version, event.prev_hash)
        if broken is not None:
            raise corrupt(broken.message, broken.version, **broken.details)
        match event:  # the contents it carries: checked, and kept
            case ChangesCommitted(changes=changes, version=version):
                for change in changes:
                    if isinstance(change, PutFile):
                        self._carried(change, version)
        evolve(self.state, event, digest, manifest=manifest)
        self._recorded(event.version, event.tree_hash)
        self.events += 1

    def _carried(self, change: PutFile, version: int) -> None:
        inline = _inline(change)
        if inline is not None and (
            broken := chain.content(change.path, _bytes(inline), change.sha256, version)
        ):
            raise corrupt(broken.message, broken.version)
        if self.contents is not None:
            self.contents.add(change)

    def start(
        self, event: HistoryCompacted, digest: str, manifest: CompactionManifest, at: int
    ) -> None:
        """Start from the compaction the log begins with, as of version ``at``.

        Raises:
            QuillError: ``VERSION_TRIMMED`` below the manifest's floor; ``INTERNAL`` if its
                rows do not chain into ``event`` or the tree they give does not hash right.
        """
        floor = max(manifest.floor, 1)
        rows = {int(r[0]): r for r in manifest.events if int(r[0]) >= floor}
        previous = hashing.ZERO_HASH if floor == 1 else None
        for version in range(floor, event.version):
            row = rows.get(version)
            if row is None:
                raise corrupt("The compaction's manifest lacks an event", version)
            if previous is not None and row[10] != previous:
                raise corrupt("Hash chain broken in the compaction's manifest", version)
            previous = str(row[9])
        if previous is not None and event.prev_hash != previous:
            raise corrupt("The compaction does not chain to its manifest", event.version)
        if at < floor:
            raise trimmed(f"{self.tenant}/{self.workspace}", at, floor)
        restore(self.state, event, manifest, at, digest)
        self._recorded(self.version, self.state.tree_hash)
        self.floor, self.compaction = floor, event.version
        self.events += 1

    def _recorded(self, version: int, tree_hash: str) -> None:
        rebuilt = hashing.tree_hex(self.tree.hash)
        if rebuilt != tree_hash:
            raise corrupt(
                "The rebuilt tree does not hash to the tree_hash recorded",
                version,
                rebuilt=rebuilt,
                recorded=tree_hash,
            )

    def summary(self, *, run: str | None = None, out: str | None = None) -> Summary:
        return Summary(
            tenant=self.tenant,
            workspace=self.workspace,
            version=self.version,
            at=self.at,
            tree_hash=hashing.tree_hex(self.tree.hash),
            last_hash=self.last_hash,
            files=len(self.tree.files),
            directories=len(self.tree.dirs),
            bytes=self.tree.total_bytes,
            events_verified=self.events,
            compaction=self.compaction,
            floor=self.floor,
            run=run,
            out=out,
        )


# ---------------------------------------------------------------- reading the log


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
        while not asked.done.done():
            await asyncio.wait([asked.done], timeout=max(0.0, heard + IDLE_S - loop.time()))
            if not asked.done.done() and loop.time() - heard >= IDLE_S:
                raise QuillError(ErrorCode.UNAVAILABLE, f"{subject}: no answer in {IDLE_S:.0f}s")
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


# ---------------------------------------------------------------- writing the tree


def _ns(when: datetime) -> int:
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


WRITERS = 8
"""Contents fetched and written at once by ``write_tree``."""


async def write_tree(
    fold: Fold,
    blobs: Blobs,
    out: Path,
    contents: Contents | None,
    progress: Progress = QUIET,
) -> None:
    """Write ``fold``'s tree to the directory ``out`` (absent or empty): files 0644 (0755
    when executable), directories 0755, each file's mtime the time of the event that last
    wrote it, each directory's the time it was made, ``out``'s the time of the version. Each
    content is checked against its sha256. ``out`` appears whole or not at all. At most
    ``WRITERS`` contents are in memory at once.

    Raises:
        QuillError: ``ALREADY_EXISTS`` if ``out`` holds something; ``UNAVAILABLE`` if a content
            is missing from WS_BLOBS or NATS fails; ``INTERNAL`` for a content that does not
            match or an unsafe path.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise QuillError(ErrorCode.ALREADY_EXISTS, f"{out} exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tree = fold.tree
    own = blobs.of(fold.tenant, fold.workspace)
    try:
        for path in sorted(tree.dirs):
            (tmp / _safe(path, fold.version)).mkdir(0o755)

        async def put(path: str, node: FileNode) -> None:
            data = b"" if node.size == 0 else contents.get(node.sha256) if contents else None
            if data is None:
                data = await own.get(node.sha256)
            if hashing.content_sha256(data) != node.sha256:
                raise corrupt(f"The content of {path} does not match its sha256", node.version)
            target = tmp / _safe(path, fold.version)
            target.write_bytes(data)
            os.chmod(target, 0o755 if node.executable else 0o644)
            os.utime(target, ns=(_ns(node.modified), _ns(node.modified)))

        progress.start(f"writing {out}", len(tree.files))
        with nats_errors(f"Reading the contents of {fold.tenant}/{fold.workspace}"):
            await each(tree.files.items(), lambda item: put(*item), WRITERS, progress)
        for path in sorted(tree.dirs, reverse=True):  # children before their parents
            os.chmod(tmp / path, 0o755)
            when = _ns(tree.dirs[path].created)
            os.utime(tmp / path, ns=(when, when))
        os.chmod(tmp, 0o755)
        os.utime(tmp, ns=(_ns(fold.at), _ns(fold.at)))
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


async def each(
    items: Iterable[T],
    work: Callable[[T], Awaitable[None]],
    limit: int,
    progress: Progress = QUIET,
) -> None:
    """``work(item)`` for each of ``items``, at most ``limit`` at a time; no coroutine is made
    before a worker takes its item (a hundred thousand are not held at once), and the first
    failure stops the others and is raised (no work is left behind, never awaited)."""
    source = iter(items)
    done = 0

    async def worker() -> None:
        nonlocal done
        for item in source:
            await work(item)
            done += 1
            if done % 64 == 0:
                progress.update(done)

    workers = [asyncio.create_task(worker()) for _ in range(limit)]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    progress.update(done)


def _safe(path: str, version: int) -> str:
    if not in_log(path):  # a name from before the name rule is still written
        raise corrupt(f"Unsafe path in the log: {path!r}", version)
    return path


# ---------------------------------------------------------------- reader replicas


class ReplicaCheck(msgspec.Struct, kw_only=True):
    """One reader replica's answer as of the replayed version, against the replay."""

    instance: str
    ok: bool
    tree_hash: str | None = None
    """With ``deep``: computed from the replica's listing and stats; else as it records it."""
    last_hash: str | None = None
    files: int | None = None
    directories: int | None = None
    bytes: int | None = None
    problems: list[str] = msgspec.field(default_factory=list)


async def live_readers(nc: NATS, subjects: Subjects, window_s: float = 0.5) -> list[str]:
    """Instances of the reader replicas that answer ``<root>.sys.ping.reader`` within
    ``window_s`` (every replica answers the ping, once it has caught up with the log)."""
    answers = await bus.ping_all(nc, subjects, "reader", window_s)
    return sorted({a["instance"] for a in answers if isinstance(a.get("instance"), str)})


class _Replica:
    """Queries addressed to one replica (``ws.replica.<instance>.<t>.<w>.<op>``)."""

    def __init__(self, nc: NATS, subjects: Subjects, fold: Fold, instance: str, timeout: float):
        self.nc, self.subjects, self.fold = nc, subjects, fold
        self.instance, self.timeout = instance, timeout

    async def ask(self, op: str, body: rq.Query, result: type[Any]) -> Any:
        subject = self.subjects.replica(self.instance, self.fold.tenant, self.fold.workspace, op)
        try:
            msg = await self.nc.request(subject, codec.encode(body), timeout=self.timeout)
        except nats.errors.TimeoutError:
            raise QuillError(ErrorCode.TIMEOUT, f"no answer in {self.timeout:g}s") from None
        except nats.errors.NoRespondersError:
            raise QuillError(ErrorCode.UNAVAILABLE, "it is gone") from None
        return codec.decode_reply(msg.data, result)[1]

    async def tree_hash(self, progress: Progress = QUIET) -> str:
        """The tree hash of what the replica answers as of the version: every entry listed,
        every file's sha256 and mode from ``stat``."""
        v, after, paths = self.fold.version, None, []
        total = 0
        progress.start(f"listing {self.fold.tenant}/{self.fold.workspace} on {self.instance}", None)
        while True:
            body = rq.ListDirectory(recursive=True, after=after, version=v)
            page: rp.Listing = await self.ask("list", body, rp.Listing)
            for entry in page.entries:
                if entry.kind == "directory":
                    total = hashing.tree_add(total, hashing.dir_digest(entry.path))
                else:
                    paths.append(entry.path)
            progress.update(len(paths))
            if page.next is None:
                break
            after = page.next

        async def stat(path: str) -> None:
            nonlocal total
            info: rp.FileInfo = await self.ask(
                "stat", rq.StatPath(path=path, version=v), rp.FileInfo
            )
            digest = hashing.file_digest(path, info.sha256 or "", info.permissions == "755")
            total = hashing.tree_add(total, digest)

        progress.start(f"asking {self.instance} about each file", len(paths))
        await each(paths, stat, 32, progress)
        return hashing.tree_hex(total)


async def check_replica(
    nc: NATS,
    subjects: Subjects,
    fold: Fold,
    instance: str,
    *,
    deep: bool,
    timeout: float = 10.0,
    progress: Progress = QUIET,
) -> ReplicaCheck:
    """Ask replica ``instance`` about the workspace as of ``fold.version`` (waiting for it to
    get there) and compare its answer with the replay."""
    replica, v = _Replica(nc, subjects, fold, instance, timeout), fold.version
    check = ReplicaCheck(instance=instance, ok=False)
    try:
        body = rq.WorkspaceInfoQuery(version=v, min_version=v)
        info: rp.WorkspaceInfo = await replica.ask("info", body, rp.WorkspaceInfo)
        check.tree_hash = await replica.tree_hash(progress) if deep else info.tree_hash
    except QuillError as exc:
        check.problems.append(f"{exc.code}: {exc.message}")
        return check
    check.last_hash, check.files = info.last_hash, info.files
    check.directories, check.bytes = info.directories, info.total_bytes
    tree = fold.tree
    for what, theirs, ours in [
        ("version", info.version, v),
        ("tree hash", check.tree_hash, hashing.tree_hex(tree.hash)),
        ("last event hash", info.last_hash, fold.last_hash),
        ("files", info.files, len(tree.files)),
        ("directories", info.directories, len(tree.dirs)),
        ("bytes", info.total_bytes, tree.total_bytes),
    ]:
        if theirs != ours:
            check.problems.append(f"{what}: replica {theirs}, log {ours}")
    check.ok = not check.problems
    return check


# ---------------------------------------------------------------- export and import

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
