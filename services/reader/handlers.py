"""Entry point of a reader: a query message → the answer as of the version it asks for.

It is given the replica as a :class:`Replica` (what it reads of ``app.Reader``), so it never
imports the wiring module.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from typing import Any, Protocol

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_version, no_workspace
from contracts.events import WorkspacePurged
from contracts.limits import RETRY_AFTER_MS
from contracts.paths import ancestors
from contracts.subjects import STREAM_EVENTS, Address, Subjects
from contracts.uncommitted import asked_path, lookup, not_committed
from core.rows import WorkspaceRow
from infra import compaction, storage
from infra.bridges import Bridges
from infra.bus import respond
from infra.busy import refused
from infra.entry import Incoming, parse, reject, reply_headers
from infra.offload import CLIENT_DEADLINE, client_deadline
from infra.runtime import Auditor
from infra.store import Store
from services.reader.follower import Follower
from services.reader.queries import Queries


class Replica(Protocol):
    """What the entry reads of a reader replica (``app.Reader``): its projection and
    follower, its query ops, its bounds (``max_wait_s`` for a version not applied yet,
    ``max_inflight`` queries in ``tasks``), and where it audits."""

    @property
    def subjects(self) -> Subjects: ...
    @property
    def js(self) -> JetStreamContext: ...
    @property
    def store(self) -> Store: ...
    @property
    def follower(self) -> Follower: ...
    @property
    def queries(self) -> Queries: ...
    @property
    def ops(self) -> Mapping[str, Callable[..., Awaitable[Any]]]: ...
    @property
    def auditor(self) -> Auditor: ...
    @property
    def bridges(self) -> Bridges: ...
    @property
    def log(self) -> logging.Logger: ...
    @property
    def max_wait_s(self) -> float: ...
    @property
    def max_inflight(self) -> int: ...
    @property
    def tasks(self) -> set[asyncio.Task[None]]: ...


class _Version(msgspec.Struct):
    version: int
    type: str = ""


_version_decoder = msgspec.json.Decoder(_Version)


async def resolve(
    reader: Replica, address: Address, req: rq.Query, run: str | None = None
) -> tuple[WorkspaceRow, int]:
    """The workspace and the version to answer at, after waiting (bounded) for it: the
    one ``run`` (the ``Ws-Run`` header) was pinned to, else the version asked, else the
    latest. A query in a run is answered at the run's version or not at all.

    Raises:
        QuillError: ``WORKSPACE_NOT_FOUND``, ``INVALID_ARGUMENT`` for a version that does not
            exist (or, in a run, is not the run's), ``RUN_NOT_FOUND`` for a run the log does
            not hold, ``UNAVAILABLE`` when this replica has not applied it in time.
    """
    tenant, workspace = address.tenant, address.workspace
    store = reader.store
    want = max(req.version or 0, req.min_version or 0)
    current = store.version_of(tenant, workspace)
    # A replica still catching up answers at the latest version only (never an old one).
    if want > current or current == 0 or not reader.follower.caught_up:
        latest = await _latest(reader, tenant, workspace, fresh=False)
        if want > latest:  # a direct get may come from a stream replica behind the leader
            latest = await _latest(reader, tenant, workspace, fresh=True)
        if latest == 0:
            raise no_workspace(tenant, workspace)
        if want > latest:
            raise no_version(want, latest)
        target = want or latest
        if not await reader.follower.wait_for(tenant, workspace, target, reader.max_wait_s):
            full = reader.follower.disk.reason  # retriable still: another replica may answer
            why = f" (its disk is full: {full})" if full else ""
            raise QuillError(
                ErrorCode.UNAVAILABLE,
                f"This replica has applied version {store.version_of(tenant, workspace)}, "
                f"not yet {target}{why}; retry",
                {"applied_version": store.version_of(tenant, workspace), "wanted": target},
            )
    row = store.workspace(tenant, workspace)
    if row is None:
        raise QuillError(ErrorCode.UNAVAILABLE, "Workspace not yet applied by this replica")
    if run is None:
        return row, req.version or row.version
    row, pinned = await _run_version(reader, address, row, run)
    if req.version is not None and req.version != pinned:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Run {run} reads version {pinned}, not {req.version}: ask outside the run "
            "(without Ws-Run) for another version",
            {"run": run, "version": req.version, "run_version": pinned},
        )
    return row, pinned


async def _run_version(
    reader: Replica, address: Address, row: WorkspaceRow, run: str
) -> tuple[WorkspaceRow, int]:
    """The version ``run`` reads (a run reads one version throughout, RFC 0059 §D). A run
    this replica has not applied yet is waited for: until the replica has every event the
    log held when asked (bounded, like ``min_version``).

    Raises:
        QuillError: ``RUN_NOT_FOUND`` when the log holds no such run;
            ``UNAVAILABLE`` when this replica has not caught up in time to tell.
    """
    tenant, workspace = address.tenant, address.workspace
    store, model = reader.store, reader.queries.model
    pinned = await model.pinned(row.id, run)
    if pinned is not None:
        return row, pinned
    latest = await _latest(reader, tenant, workspace, fresh=True)
    if latest > store.version_of(tenant, workspace):
        if not await reader.follower.wait_for(tenant, workspace, latest, reader.max_wait_s):
            applied = store.version_of(tenant, workspace)
            raise QuillError(
                ErrorCode.UNAVAILABLE,
                f"This replica has applied version {applied}, not yet {latest}, and cannot "
                f"tell run {run} yet; retry",
                {"applied_version": applied, "wanted": latest, "run": run},
            )
        row = store.workspace(tenant, workspace) or row
        pinned = await model.pinned(row.id, run)
        if pinned is not None:
            return row, pinned
    raise QuillError(
        ErrorCode.RUN_NOT_FOUND,
        f"No run {run} in {tenant}/{workspace}",
        {"run": run},
    )


async def caught_up(reader: Replica) -> None:
    """Wait (bounded) until the replica has caught up with the log: what only the whole log
    answers (the workspace listing) is not answered from part of it.

    Raises:
        QuillError: ``UNAVAILABLE`` (retriable) when it has not in time.
    """
    follower = reader.follower
    if not await follower.wait_caught_up(reader.max_wait_s):
        raise QuillError(
            ErrorCode.UNAVAILABLE,
            f"This replica is catching up with the log ({follower.lag_versions()} events "
            "behind); retry",
            {"behind": follower.lag_versions(), "retry_after_ms": RETRY_AFTER_MS},
        )


async def _latest(reader: Replica, tenant: str, workspace: str, *, fresh: bool) -> int:
    """The workspace's last version in the log (0: none); ``fresh``: from the leader.

    Raises:
        QuillError: ``UNAVAILABLE`` when the log does not answer.
    """
    try:
        raw = await reader.js.get_last_msg(
            STREAM_EVENTS, reader.subjects.evt(tenant, workspace), direct=not fresh
        )
    except NotFoundError:
        return 0
    except Exception as exc:
        raise QuillError(ErrorCode.UNAVAILABLE, f"The log is not reachable: {exc}") from None
    last = _version_decoder.decode(raw.data or b"{}")
    return 0 if last.type == PURGED else last.version


PURGED = WorkspacePurged.__struct_config__.tag
"""A log that ends with a purge holds no workspace."""

TREE_QUERIES = frozenset({"list", "glob", "grep", "explore", "diff", "tree"})
"""Queries over the whole tree (or a subtree) as of a version: refused below the floor."""


async def answer_at(reader: Replica, op: str, ws: WorkspaceRow, version: int, req: rq.Query) -> Any:
    """The answer of ``op`` as of ``version``. Below the workspace's floor (history a
    compaction dropped) only a path whose revision at that version was kept is answered.

    Raises:
        QuillError: ``VERSION_TRIMMED`` for what compaction dropped; the op's own errors.
    """
    mine = getattr(req, "from_workspace", None) in (None, ws.name)  # else another's version
    oldest = min(
        version,
        (getattr(req, "from_version", None) if mine else None) or version,
        getattr(req, "to_version", None) or version,
        getattr(req, "changed_from", None) or version,
    )
    if oldest >= ws.floor:
        try:
            return await reader.ops[op](ws, version, req)
        except QuillError as exc:
            raise await explained(reader, ws, version, exc) from None
    if op in TREE_QUERIES:
        raise compaction.trimmed(f"{ws.tenant}/{ws.name}", oldest, ws.floor)
    try:
        return await reader.ops[op](ws, version, req)
    except QuillError as exc:
        if exc.code != ErrorCode.FILE_NOT_FOUND:
            raise
        what = getattr(req, "path", None) or f"{ws.tenant}/{ws.name}"
        raise compaction.trimmed(what, oldest, ws.floor) from None


async def explained(
    reader: Replica, ws: WorkspaceRow, version: int, error: QuillError
) -> QuillError:
    """``error``, a path not found or a name refused, saying why when a command left that
    path (or a parent of it) in its sandbox uncommitted, as recorded by ``version`` or
    before (``contracts.uncommitted``)."""
    path = asked_path(error)
    if path is None:
        return error
    recorded = await reader.store.uncommitted(ws.id, [path, *ancestors(path)])
    found = lookup(recorded, path)
    if found is None or found[1].version > version:
        return error
    return not_committed(error, path, *found)


def query_handler(reader: Replica) -> Callable[[Msg], Awaitable[None]]:
    tasks: set[asyncio.Task[None]] = reader.tasks

    async def answer(incoming: Incoming) -> None:
        try:
            address, spec, origin, request = parse(incoming, reader.subjects, "qry")
            # Expensive work for it stops when its client stops waiting. Set for every query:
            # the start of an answer runs in the subscription's own context (``eagerly``).
            CLIENT_DEADLINE.set(client_deadline(incoming.received, origin.timeout_ms))
            if reader.bridges.claims(address.tenant, address.workspace):
                return  # a local workspace: its bridge answers
            if isinstance(request, rq.ListWorkspaces):  # the tenant's: no workspace to resolve
                await caught_up(reader)
                version, result = None, await reader.queries.workspaces(address.tenant, request)
            else:
                assert isinstance(request, rq.Query)
                ws, version = await resolve(reader, address, request, origin.run)
                result = await answer_at(reader, spec.name, ws, version, request)
        except QuillError as exc:
            await reject(incoming, exc, reader.auditor)
            return
        except (TimeoutError, nats.errors.Error) as exc:  # NATS failing over: retriable
            reader.log.warning("query %s: NATS: %r", incoming.msg.subject, exc)
            error = QuillError(ErrorCode.UNAVAILABLE, f"NATS did not answer: {exc!r}")
            await reject(incoming, error, reader.auditor)
            return
        except Exception as exc:
            if storage.is_disk_full(exc):  # e.g. a content fetched that reader.db cannot keep
                reader.log.error("query %s: disk full: %s", incoming.msg.subject, exc)
                reader.follower.disk.mark(f"cannot store in the projection: {exc}")
                await reject(incoming, storage.disk_full("reader", str(exc)), reader.auditor)
                return
            reader.log.exception("query %s failed", incoming.msg.subject)
            error = QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
            await reject(incoming, error, reader.auditor)
            return
        await respond(incoming.msg, codec.ok_reply(version, result), reply_headers(origin))
        path = getattr(request, "path", None)
        await reader.auditor.record(
            address, origin, incoming.started, version=version, paths=[path] if path else []
        )

    async def on_query(msg: Msg) -> None:
        incoming = Incoming(msg)
        if len(tasks) >= reader.max_inflight:
            limit = reader.max_inflight
            error = refused("reader", "queries", "The reader", RETRY_AFTER_MS, limit=limit)
            await reject(incoming, error, reader.auditor)
            return
        task = eagerly(answer(incoming))
        if task is not None:
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    return on_query


def eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` now, up to its first suspension; None if it finished without one, else
    the task that carries it on (Python 3.12's eager tasks). A read answered from memory
    never suspends: it is answered without the cost of a task (creating, scheduling and
    stepping one took ~10% of the reader's CPU under load), and its reply is in the same
    write to the server as the others the loop answered in that pass.
    """
    try:
        first = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_Resumed(coro, first).run())


class _Resumed:
    """A started coroutine, driven on by a task exactly as ``yield from`` would: what it
    yields (a future it waits for) goes to the task, what the task sends or throws (a
    cancellation) goes to it."""

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro, self._first = coro, first

    def __await__(self) -> Generator[Any, Any, None]:
        yielded = self._first
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:  # noqa: BLE001 - handed to the coroutine, as await does
                step = functools.partial(self._coro.throw, exc)
            else:
                step = functools.partial(self._coro.send, sent)
            try:
                yielded = step()
            except StopIteration:
                return

    async def run(self) -> None:
        await self
