"""Which forks stand on a workspace, cluster-wide, and whether it is being purged or scrubbed
(issue 33): the record every writer and ``quill scrub`` consult before a fork, a purge or a
scrub.

A fork's history up to its fork point *is* its source's (its rows, its blobs, its log): a
purge or a scrub of the source would break it. A writer's projection cannot say which forks
a source has on a cluster (each writer serves a partition of the workspaces: a fork made
through another writer is not in it), and ``quill scrub`` asked once, before reading the log.
So the forks of a source are kept in the ``WS_FORKS`` bucket, one key per source
``<tenant>.<workspace>`` (a ``Record``: its forks, and its mark ``purging`` or ``scrubbing``),
and every change is a compare-and-set on the key's revision (``kv.update(last=...)``): a fork
and a purge (or scrub) of its source racing on two writers cannot both win.

* A fork registers itself on its source's key *before* its ``workspace_forked`` is appended,
  refused while the source is marked (``CONFLICT``, retriable); then the writer checks the
  source's log still holds what it forked (``services/writer/forks.py``). It removes itself
  when its append fails for good.
* A purge (a scrub) marks the key by CAS only when no fork stands on it, else it is refused
  naming the forks (``CONFLICT``). Each fork listed is checked against the log first
  (``_stands``): one whose log is empty past ``FORK_APPEND_TTL_S`` (its append failed, its
  writer crashed), was purged, or is no fork of this source any more is dropped.
* The purge of a fork removes it from its source's key once committed; a purge of a source
  clears its mark once committed (or once it failed for good); a scrub clears its mark when
  it ends, and renews it every ``SCRUB_RENEW_S`` while it runs.

A compaction of a source marks it ``compacting`` the same way (it trims the history forks
read up to their fork points): held while a fork stands, a fork refused while it runs.

A mark names its owner and its time. One left by a purge or a scrub that crashed does not
block forever: a mark older than its TTL (``MARK_TTL_S``: a purge's far longer than a writer
takes to append; a running scrub renews its own) is cleared by the next fork,
and the log decides what happened: a fork then checks the source's log, and one whose source
was purged meanwhile is refused (``WORKSPACE_NOT_FOUND``). Times are wall-clock seconds, so
servers' clocks are assumed to agree to well within the TTLs.

Only the services' user reaches the bucket: a tenant may use no ``$KV`` subject
(``quill_cli/tenants.py``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from contracts import codec
from contracts.errors import ErrorCode, QuillError
from contracts.events import WorkspaceForked, WorkspacePurged
from contracts.limits import MAX_FORKS_PER_SOURCE, RETRY_AFTER_MS
from contracts.subjects import BUCKET_FORKS, Subjects
from infra import assets
from infra import log as eventlog
from infra.concurrent import bounded_gather

Kind = Literal["purging", "scrubbing", "compacting"]

MARK_TTL_S: dict[str, float] = {"purging": 120.0, "compacting": 120.0, "scrubbing": 300.0}
"""A mark older than this is one whose owner crashed (a writer appends or gives up within
seconds; a running scrub renews its mark every ``SCRUB_RENEW_S``): the next fork clears it."""
SCRUB_RENEW_S = 60.0
"""How often a running scrub renews its mark."""
FORK_APPEND_TTL_S = 120.0
"""A fork registered this long ago whose log is still empty never got its event appended."""
TRIES = 32
"""Compare-and-set attempts on one key before giving up (``UNAVAILABLE``, retriable)."""


class Mark(msgspec.Struct, frozen=True, kw_only=True):
    """A purge or a scrub of the source under way."""

    kind: Kind
    owner: str
    """Who marked it: ``writer:<instance>``, ``scrub@<host>:<pid>``."""
    at: float
    """When it was marked or last renewed (seconds since the epoch)."""


class Record(msgspec.Struct, kw_only=True):
    """The value of a source's key."""

    forks: dict[str, float] = msgspec.field(default_factory=dict)
    """The forks standing on it (workspace names) and when each registered."""
    mark: Mark | None = None


def key(tenant: str, workspace: str) -> str:
    return f"{tenant}.{workspace}"


async def bucket(js: JetStreamContext, replicas: int) -> KeyValue:
    """The WS_FORKS bucket, created if missing (services starting together may all create it:
    a lost race is a success, ``infra/assets.py``). Reads come from the stream leader."""
    # a read before a compare-and-set asks the stream leader (the bucket's default)
    about = "Quill: the forks standing on each workspace, and its purge or scrub"
    return await assets.key_value(js, BUCKET_FORKS, about, replicas)


def unreachable(exc: BaseException) -> QuillError:
    return QuillError(ErrorCode.UNAVAILABLE, f"The fork registry is not reachable: {exc!r}")


class Registry:
    """The forks of each workspace, for one owner (a writer, a scrub)."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        owner: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: the time marks and registrations are stamped with and aged by (every
        owner's the same wall clock; a test's may run ahead)."""
        self.js, self.subjects, self.owner, self.clock = js, subjects, owner, clock
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(BUCKET_FORKS)
            except nats.js.errors.BucketNotFoundError:
                raise QuillError(
                    ErrorCode.UNAVAILABLE,
                    f"The {BUCKET_FORKS} bucket is missing: start Quill's services first",
                ) from None
        return self._kv

    async def record(self, tenant: str, workspace: str) -> Record:
        """The record as it is now (empty when there is none)."""
        return (await self._read(tenant, workspace))[1]

    async def _read(self, tenant: str, workspace: str) -> tuple[int, Record]:
        kv = await self._bucket()
        try:
            entry = await kv.get(key(tenant, workspace))
        except nats.js.errors.KeyNotFoundError:
            return 0, Record()
        if not entry.value:
            return int(entry.revision or 0), Record()
        return int(entry.revision or 0), msgspec.json.decode(entry.value, type=Record)

    async def _change(
        self, tenant: str, workspace: str, step: Callable[[Record], Awaitable[Record | None]]
    ) -> Record:
        """Apply ``step`` to the record by compare-and-set, again on the new record each time
        another got in first; ``step`` returns None to leave it as it is. Returns the record
        as written (or left).

        Raises:
            QuillError: what ``step`` raised; ``UNAVAILABLE`` when NATS fails or the key stays
                contended.
        """
        try:
            kv = await self._bucket()
            for _ in range(TRIES):
                revision, current = await self._read(tenant, workspace)
                new = await step(current)
                if new is None:
                    return current
                value = msgspec.json.encode(new)
                try:
                    if revision:
                        await kv.update(key(tenant, workspace), value, last=revision)
                    else:
                        await kv.create(key(tenant, workspace), value)
                except nats.js.errors.KeyWrongLastSequenceError:
                    continue  # another got in first: decide again on what it wrote
                return new
        except (TimeoutError, nats.errors.Error) as exc:
            raise unreachable(exc) from None
        raise QuillError(
            ErrorCode.UNAVAILABLE,
            f"The fork record of {tenant}/{workspace} is contended; retry",
            {"retry_after_ms": RETRY_AFTER_MS},
        )

    # ---------------------------------------------------------------- forks
    async def add_fork(self, tenant: str, source: str, fork: str) -> None:
        """Register ``fork`` as standing on ``source`` (before its event is appended).

        Raises:
            QuillError: ``CONFLICT`` while ``source`` is being purged or scrubbed (retry);
                ``SIZE_LIMIT_EXCEEDED`` past ``MAX_FORKS_PER_SOURCE`` forks.
        """

        async def step(record: Record) -> Record:
            mark = record.mark
            if mark is not None and self._live(mark):
                raise QuillError(
                    ErrorCode.CONFLICT,
                    f"{tenant}/{source} is being {_doing(mark)} ({mark.owner}): it cannot be "
                    "forked now; retry once that is done",
                    {"source": source, "mark": mark.kind, "owner": mark.owner,
                     "retry_after_ms": RETRY_AFTER_MS},
                )  # fmt: skip
            if fork not in record.forks and len(record.forks) >= MAX_FORKS_PER_SOURCE:
                record.forks = await self._standing(tenant, source, record.forks)
                if len(record.forks) >= MAX_FORKS_PER_SOURCE:
                    raise QuillError(
                        ErrorCode.SIZE_LIMIT_EXCEEDED,
                        f"{tenant}/{source} has {len(record.forks)} forks, the most one "
                        "workspace may have: purge some first",
                        {"limit": MAX_FORKS_PER_SOURCE},
                    )
            forks = {**record.forks, fork: self.clock()}
            return Record(forks=forks, mark=None)  # a mark past its TTL goes (module doc)

        await self._change(tenant, source, step)

    async def drop_fork(self, tenant: str, source: str, fork: str) -> None:
        """``fork`` no longer stands on ``source`` (purged, or its event never appended)."""

        async def step(record: Record) -> Record | None:
            if fork not in record.forks:
                return None
            return Record(forks={n: t for n, t in record.forks.items() if n != fork},
                          mark=record.mark)  # fmt: skip

        await self._change(tenant, source, step)

    async def standing(self, tenant: str, source: str) -> list[str]:
        """The forks that stand on ``source`` now (each checked against the log)."""
        record = await self.record(tenant, source)
        return sorted(await self._standing(tenant, source, record.forks))

    # ---------------------------------------------------------------- marks
    async def mark(self, tenant: str, workspace: str, kind: Kind) -> None:
        """Mark ``workspace`` as being purged or scrubbed, when no fork stands on it.

        Raises:
            QuillError: ``CONFLICT`` naming the forks that stand on it (``details.forks``),
                or when another purge or scrub holds a live mark.
        """
        name = f"{tenant}/{workspace}"
        standing: list[str] = []

        async def step(record: Record) -> Record | None:
            nonlocal standing
            mark = record.mark
            # another's live mark: a purge takes over a purge's (its writer decides again;
            # appends are fenced), never a scrub's, and a scrub no one's
            if (
                mark is not None
                and self._live(mark)
                and mark.owner != self.owner
                and (mark.kind != kind or kind == "scrubbing")
            ):
                raise QuillError(
                    ErrorCode.CONFLICT,
                    f"{name} is being {_doing(mark)} ({mark.owner}); retry once that is done",
                    {"mark": mark.kind, "owner": mark.owner, "retry_after_ms": RETRY_AFTER_MS},
                )
            forks = await self._standing(tenant, workspace, record.forks)
            standing = sorted(forks)
            if standing:
                if forks == record.forks:
                    return None
                return Record(forks=forks, mark=record.mark)  # the stale ones dropped
            return Record(forks={}, mark=Mark(kind=kind, owner=self.owner, at=self.clock()))

        await self._change(tenant, workspace, step)
        if standing:
            shown = ", ".join(standing[:10]) + (", ..." if len(standing) > 10 else "")
            raise QuillError(
                ErrorCode.CONFLICT,
                f"{name} has forks, whose history is partly its own: purge them first ({shown})",
                {"forks": standing[:100]},
            )

    async def renew(self, tenant: str, workspace: str, kind: Kind) -> None:
        """Renew this owner's mark.

        Raises:
            QuillError: ``CONFLICT`` when the mark is not this owner's any more (it ran out).
        """

        async def step(record: Record) -> Record:
            mark = record.mark
            if mark is None or mark.kind != kind or mark.owner != self.owner:
                raise QuillError(
                    ErrorCode.CONFLICT,
                    f"{tenant}/{workspace}: the {kind} mark ran out (a fork may have been "
                    "made meanwhile); run it again",
                )
            return Record(forks=record.forks, mark=Mark(kind=kind, owner=self.owner,
                                                        at=self.clock()))  # fmt: skip

        await self._change(tenant, workspace, step)

    async def release(self, tenant: str, workspace: str, kind: Kind) -> None:
        """Clear this owner's mark (the purge or scrub is over, done or not)."""

        async def step(record: Record) -> Record | None:
            mark = record.mark
            if mark is None or mark.kind != kind or mark.owner != self.owner:
                return None
            return Record(forks=record.forks, mark=None)

        await self._change(tenant, workspace, step)

    def _live(self, mark: Mark) -> bool:
        """Whether ``mark`` is younger than its TTL (older: its owner crashed)."""
        return self.clock() - mark.at < MARK_TTL_S[mark.kind]

    # ---------------------------------------------------------------- the log
    async def _standing(
        self, tenant: str, source: str, forks: dict[str, float]
    ) -> dict[str, float]:
        checked = await bounded_gather(
            [self._stands(tenant, source, f, t) for f, t in forks.items()], 32
        )
        return {f: t for (f, t), ok in zip(forks.items(), checked, strict=True) if ok}

    async def _stands(self, tenant: str, source: str, fork: str, since: float) -> bool:
        """Whether ``fork`` stands on ``source``: its log begins with a ``workspace_forked``
        of ``source`` and does not end with a purge; or it is empty (or ends with the purge of
        an earlier life) and it registered less than ``FORK_APPEND_TTL_S`` ago (its event may
        be on its way)."""
        subject = self.subjects.evt(tenant, fork)
        raw = await eventlog.last_message(self.js, subject, fresh=True)
        if raw is None or isinstance(codec.decode_event(raw.data or b""), WorkspacePurged):
            return self.clock() - since < FORK_APPEND_TTL_S
        first = await eventlog.first(self.js, subject, int(raw.seq or 0))
        event = first.event if first is not None else None
        return isinstance(event, WorkspaceForked) and event.source == source


def _doing(mark: Mark) -> str:
    return {"purging": "purged", "compacting": "compacted"}.get(mark.kind, "scrubbed")
